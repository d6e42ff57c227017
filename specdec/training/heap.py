"""Keep a long CPU training run's heap from fragmenting (glibc).

glibc serves a large ``malloc`` from ``mmap`` only above a threshold that it raises, by default, to the size of
every large block freed (up to 32 MiB). A training step allocates and frees hundreds of activation and gradient
buffers of 1-30 MiB in a shifting order, so after the first steps they all come from the arenas, whose free space
fragments and is not returned: the issue 24 run (4,096-token batches, 16k draft vocabulary, 5 training-time
steps) grew to 16.5 GB of anonymous memory and was OOM-killed beside a test run on a 24 GB machine, while the
same batches held 4-5 GB with the threshold pinned at 1 MiB (``MALLOC_MMAP_THRESHOLD_=1048576``).
:func:`pin_mmap_threshold` pins it from inside the process, as that variable does at start-up.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_MMAP_THRESHOLD = -3  # mallopt parameter (malloc.h)
THRESHOLD = 1 << 20


def pin_mmap_threshold(threshold: int = THRESHOLD) -> bool:
    """Serve allocations of ``threshold`` bytes and more from ``mmap`` from now on (a fixed threshold: glibc
    stops raising it). Returns whether it did: not off glibc, nor when ``MALLOC_MMAP_THRESHOLD_`` is set (the
    user's choice stands)."""
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, threshold))
