"""A converted copy of a GGUF model in the user's cache, so that only its first load pays for the conversion.

transformers reads a GGUF file by rebuilding its tokenizer from the vocabulary and merges (about 25 s for the
embedded SmolLM2 on a 2-core machine) and dequantizing every tensor. The first load writes what it built
(``save_pretrained``: config, generation config, safetensors weights, ``tokenizer.json``) to a directory keyed by
the file's SHA-256, the dtype and the transformers version; later loads read that directory in seconds.

The directory appears atomically (written under a temporary name, then renamed), so a load interrupted or run
twice at once never leaves a half-written copy that a later load would read. A copy that cannot be written (no
space, a read-only home) costs nothing but the note that says so.

``SPECDEC_CACHE_DIR`` moves the cache (default ``$XDG_CACHE_HOME/specdec``, else ``~/.cache/specdec``);
``SPECDEC_MODEL_CACHE=0`` turns the copies off.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable

CACHE_DIR_ENV = "SPECDEC_CACHE_DIR"
SWITCH_ENV = "SPECDEC_MODEL_CACHE"
#: bumped when what a copy holds changes, so older copies are not read
FORMAT = 1
#: the file whose presence marks a finished copy
DONE = "specdec-converted.txt"


def cache_root() -> Path:
    """Where specdec keeps its files: ``$SPECDEC_CACHE_DIR``, else ``$XDG_CACHE_HOME/specdec``, else ``~/.cache/specdec``."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "specdec"


def enabled() -> bool:
    """False when ``SPECDEC_MODEL_CACHE`` is ``0``, ``false``, ``no`` or ``off``."""
    return os.environ.get(SWITCH_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def file_digest(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """SHA-256 of a file's bytes (hex): the copy follows the file's content, not its name or date."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def copy_dir(gguf_path: str | os.PathLike, dtype: Any) -> Path:
    """The directory a converted copy of ``gguf_path`` in ``dtype`` lives in (it may not exist yet)."""
    import transformers

    dtype_name = str(dtype).removeprefix("torch.")
    key = f"{Path(gguf_path).stem}-{file_digest(gguf_path)[:20]}-{dtype_name}-tf{transformers.__version__}-v{FORMAT}"
    return cache_root() / "models" / key


def is_complete(directory: Path) -> bool:
    return (directory / DONE).is_file()


def _save_plain(model: Any, directory: Path) -> None:
    """Config, generation config and safetensors weights of a model loaded from GGUF, as a plain checkpoint.

    ``save_pretrained`` refuses a model transformers marks as GGUF-quantized, although its weights are already
    dequantized: the copy drops that mark, so reading it back builds an ordinary model with the same tensors."""
    import copy

    from safetensors.torch import save_model

    directory.mkdir(parents=True)
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(directory)
    model.generation_config.save_pretrained(directory)
    save_model(model, str(directory / "model.safetensors"), metadata={"format": "pt"})


def write_copy(directory: Path, model: Any, tokenizer: Any, source: str, note: Callable[[str], None]) -> bool:
    """Save ``model`` and ``tokenizer`` to ``directory`` atomically; True when the copy is there afterwards.

    Any OS error (no space, no permission) is reported through ``note`` and leaves nothing behind."""
    parent = directory.parent
    tmp = parent / f".tmp-{directory.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        parent.mkdir(parents=True, exist_ok=True)
        need = sum(p.numel() * p.element_size() for p in model.parameters())
        free = shutil.disk_usage(parent).free
        if free < 2 * need:
            note(f"not keeping a converted copy in {parent}: {free / 2**20:.0f} MiB free, it needs {need / 2**20:.0f} MiB")
            return False
        _save_plain(model, tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / DONE).write_text(f"converted from {source}\n")
        try:
            os.rename(tmp, directory)
        except OSError:
            if not is_complete(directory):  # not another process finishing first: a real failure
                raise
        return True
    except OSError as e:
        note(f"could not keep a converted copy in {parent} ({e}); the next load converts again")
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
