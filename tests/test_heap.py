"""train-head pins glibc's mmap threshold so that a long CPU run's heap does not fragment (specdec.training.heap).

Checked in a fresh interpreter (mallopt changes the whole process): after a 16 MiB block is freed, glibc's
dynamic threshold has risen to 16 MiB, so a 2 MiB block comes from the heap; pinned, it is mapped. The same
script without the pin is the negative control."""

import subprocess
import sys

import pytest

SCRIPT = r"""
import ctypes, sys
sys.path.insert(0, {root!r})
libc = ctypes.CDLL("libc.so.6")
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                 "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
if {pin}:
    from specdec.training.heap import pin_mmap_threshold
    assert pin_mmap_threshold()
libc.free(libc.malloc(16 << 20))  # raises glibc's dynamic threshold to 16 MiB unless it is pinned
before = libc.mallinfo2().hblkhd
block = libc.malloc(2 << 20)
print(libc.mallinfo2().hblkhd - before >= 2 << 20)
libc.free(block)
"""


def _mapped(pin: bool) -> bool:
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(root=root, pin=pin)], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip() == "True"


def _glibc_with_mallinfo2() -> bool:
    import ctypes

    try:
        return hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2")  # glibc 2.33+
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux") or not _glibc_with_mallinfo2(), reason="glibc 2.33+'s malloc")
def test_pinned_threshold_maps_blocks_that_the_dynamic_one_keeps_in_the_heap():
    assert _mapped(pin=True)
    assert not _mapped(pin=False)  # negative control: glibc's default after a large free


def test_the_users_variable_stands(monkeypatch):
    from specdec.training.heap import pin_mmap_threshold

    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert pin_mmap_threshold() is False
