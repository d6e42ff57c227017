"""Sizes: dtypes and their bytes, memory strings, readable sizes, free memory, count checks."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

GiB = 1 << 30

_DTYPE_ALIASES: dict[str, tuple[str, int]] = {
    "float64": ("float64", 8), "fp64": ("float64", 8), "double": ("float64", 8),
    "float32": ("float32", 4), "fp32": ("float32", 4), "float": ("float32", 4), "f32": ("float32", 4),
    "float16": ("float16", 2), "fp16": ("float16", 2), "half": ("float16", 2), "f16": ("float16", 2),
    "bfloat16": ("bfloat16", 2), "bf16": ("bfloat16", 2),
    "float8": ("float8", 1), "fp8": ("float8", 1), "float8_e4m3fn": ("float8", 1),
    "float8_e5m2": ("float8", 1), "float8_e4m3fnuz": ("float8", 1), "float8_e5m2fnuz": ("float8", 1),
    "int8": ("int8", 1), "uint8": ("int8", 1), "qint8": ("int8", 1),
}


def _dtype_key(dtype: Any) -> str:
    text = str(dtype).strip().lower()
    return text[len("torch."):] if text.startswith("torch.") else text


def dtype_name(dtype: Any) -> str:
    """Canonical name (``float32``, ``bfloat16``, ...) of a dtype given as string or ``torch.dtype``."""
    key = _dtype_key(dtype)
    if key not in _DTYPE_ALIASES:
        raise ValueError(
            f"unknown dtype {dtype!r}; use one of float32, float16, bfloat16, float8, int8 (or torch dtypes)"
        )
    return _DTYPE_ALIASES[key][0]


def dtype_bytes(dtype: Any) -> int:
    """Bytes per element of a dtype given as a string (``"bf16"``, ``"float32"``) or ``torch.dtype``."""
    dtype_name(dtype)  # validates with a helpful message
    return _DTYPE_ALIASES[_dtype_key(dtype)][1]


def smaller_dtype(dtype: Any) -> str | None:
    """The next smaller float dtype worth suggesting (float32 -> bfloat16), or None."""
    return {"float64": "float32", "float32": "bfloat16"}.get(dtype_name(dtype))


_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_memory(value: int | float | str) -> int:
    """Bytes from a size: ``"80GiB"``, ``"24GB"`` (SI, 10^9), ``"512MiB"``, ``"1.5TiB"``, or a plain int.

    Binary units (KiB/MiB/GiB/TiB, or Ki/Mi/Gi/Ti) are powers of 1024, SI units (KB/MB/GB/TB)
    powers of 1000. Bare ``K/M/G/T`` are refused as ambiguous.

    Raises:
        ValueError: for an empty, negative, non-numeric or unit-less-but-fractional value, or an
            unknown unit.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a memory size: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"memory size must not be negative: {value}")
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0 or value != int(value):
            raise ValueError(f"not a whole, non-negative number of bytes: {value!r}")
        return int(value)
    if not isinstance(value, str):
        raise ValueError(f"not a memory size: {value!r}")
    match = _SIZE_RE.match(value)
    if not match:
        raise ValueError(f"cannot parse memory size {value!r}; write e.g. 80GiB, 24GB, 512MiB or 1073741824")
    number, unit = match.group(1), match.group(2).lower()
    if unit in ("k", "m", "g", "t"):
        raise ValueError(f"ambiguous unit in {value!r}: write {number}{unit.upper()}iB (binary) or {number}{unit.upper()}B (SI)")
    if unit not in _UNITS:
        raise ValueError(f"unknown unit {match.group(2)!r} in {value!r}; use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB")
    amount = float(number) * _UNITS[unit]
    if not math.isfinite(amount):
        raise ValueError(f"memory size out of range: {value!r}")
    return int(round(amount))


def format_bytes(n: int | float | None) -> str:
    """Human-readable binary size (``"14.96 GiB"``)."""
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{sign}{n / scale:.2f} {unit}"
    return f"{sign}{int(n)} B"


def available_memory(device: Any = None) -> int:
    """Free memory in bytes on ``device``: ``torch.cuda.mem_get_info`` for CUDA, otherwise
    available system RAM (psutil when installed, else ``/proc/meminfo``), also bounded by a
    cgroup memory limit when the process runs under one."""
    dev = "cpu" if device is None else str(device)
    if dev.startswith("cuda"):
        import torch  # only for a CUDA device: the CPU path stays torch-free

        free, _total = torch.cuda.mem_get_info(torch.device(dev))
        return int(free)
    try:
        import psutil

        avail = int(psutil.virtual_memory().available)
    except ImportError:
        avail = _meminfo_available()
    limit = _cgroup_free()
    return min(avail, limit) if limit is not None else avail


def _meminfo_available() -> int:
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    for key in ("MemAvailable", "MemFree"):
        if key in fields:
            return int(fields[key].split()[0]) * 1024  # kB
    raise OSError("cannot read available memory from /proc/meminfo")


def _cgroup_free() -> int | None:
    # Containers often see the host's MemAvailable; the cgroup limit is the real ceiling.
    for limit_path, usage_path in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            limit_text = Path(limit_path).read_text().strip()
            usage = int(Path(usage_path).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit_text == "max" or int(limit_text) >= 1 << 60:
            return None
        return max(0, int(limit_text) - usage)
    return None


def check_count(name: str, value: int, allow_zero: bool = False) -> None:
    """Raise ValueError unless ``value`` is a positive (or, with ``allow_zero``, non-negative) int."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'non-negative' if allow_zero else 'positive'}, got {value}")
