import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))


@pytest.fixture(scope="session")
def smollm2():
    """The real embedded model and its tokenizer (loaded once per test session)."""
    from specdec.models import load_model

    return load_model("smollm2")
