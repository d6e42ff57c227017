"""train-head hands the heap's free pages back every few steps on a CPU (specdec.training.heap): without it a long
run's anonymous memory grew 3-4x (16.5 GB, OOM-killed).

Checked in a fresh interpreter (allocator state is process-wide): 1 MiB blocks served from the heap (glibc's
dynamic threshold raised by a freed 16 MiB block, as a training step's buffers raise it), touched, then freed
below a block that stays, so glibc keeps their pages; :func:`release_free_memory` returns them. The same script
without the call is the negative control."""

import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import ctypes, os, sys
sys.path.insert(0, {root!r})
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
from specdec.training.heap import release_free_memory  # imported first: its imports take memory too
libc.free(libc.malloc(16 << 20))  # raises glibc's dynamic mmap threshold: 1 MiB blocks come from the heap
blocks = [libc.malloc(1 << 20) for _ in range(300)]
for b in blocks:
    ctypes.memset(b, 1, 1 << 20)
for b in blocks[:-1]:  # the last one stays: the free space is not at the heap's top, so free() keeps it
    libc.free(b)
before = rss()
if {release}:
    assert release_free_memory()
print(before - rss() >= 200 << 20)
"""


def _released(release: bool) -> bool:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(root=root, release=release)], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip() == "True"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_release_returns_the_heaps_free_pages():
    assert _released(True)
    assert not _released(False)  # negative control: glibc keeps them
