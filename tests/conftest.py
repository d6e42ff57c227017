import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

# Under pytest-xdist each worker gets one core; more threads than cores makes OpenMP spin and crawl.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def smollm2():
    """The real embedded model and its tokenizer (loaded once per test session)."""
    from specdec.models import load_model

    return load_model("smollm2")


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama and the character tokenizer saved as a local model directory (``--model DIR``)."""
    from tiny_models import char_tokenizer, make_model

    root = tmp_path_factory.mktemp("tiny")
    make_model("llama").save_pretrained(root)
    char_tokenizer().save_pretrained(root)
    return str(root)
