"""Keep a long CPU training run's heap from growing (glibc).

A training step allocates and frees hundreds of activation and gradient buffers of 1-30 MiB in a shifting order.
glibc serves them from its arenas once its dynamic mmap threshold has risen (to 32 MiB at most), and the freed
space stays in the process: the issue 24 run (4,096-token batches, 16k draft vocabulary, 5 training-time steps)
grew to 16.5 GB of anonymous memory and was OOM-killed beside a test run on a 24 GB machine.

Measured remedies, on six real batches (``benchmarks/head_train_step.py``, training paused): pinning the mmap
threshold at 1 MiB (``MALLOC_MMAP_THRESHOLD_=1048576``) holds memory but makes a step 75% slower (22.9 s -> 39.9 s:
every buffer is a fresh, zero-filled mapping); at 8 MiB it is 6% slower and the heap still grew 1 GB a minute in
the real run. ``malloc_trim(0)``, which hands the arenas' free pages back to the kernel, took the running
process from 5.9 to 3.1 GB at once. So :func:`release_free_memory` is called every :data:`TRIM_EVERY` steps
(1% of a step's time; 9% if every step): the same run now saw-tooths between 3.0 and 7.7 GB at 4.0 s a step.
"""

from __future__ import annotations

import ctypes
import sys

TRIM_EVERY = 10  # training steps between trims


def release_free_memory() -> bool:
    """Return the heap's free pages to the kernel (glibc's ``malloc_trim(0)``). Returns whether any were
    released; ``False`` off glibc (where there is nothing to call)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))
