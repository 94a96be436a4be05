"""infra/cpu.py: the C allocator keeps freed memory for the next large tensor."""
import os
import subprocess
import sys

import pytest
import torch

from infra import cpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A fresh process (this one's allocator was set by conftest, and earlier tests' freed blocks would serve a request
# whatever the threshold): the bytes glibc holds in blocks mapped one by one (mallinfo2's hblkhd, glibc >= 2.33),
# around a 64 MB tensor made before keep_freed_memory() and one made after.
PROBE = """
import ctypes, torch
from infra import cpu
class MallInfo2(ctypes.Structure):
    _fields_ = [(f, ctypes.c_size_t) for f in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                              "uordblks", "fordblks", "keepcost")]
try:
    info = ctypes.CDLL(None).mallinfo2
except AttributeError:
    raise SystemExit("no mallinfo2")
info.restype = MallInfo2
before = info().hblkhd
x = torch.empty(16 << 20)
grew = info().hblkhd - before
del x
kept = cpu.keep_freed_memory()
before = info().hblkhd
x = torch.empty(16 << 20)
print(kept, grew, info().hblkhd - before)
"""


def test_a_large_tensor_comes_from_the_kept_heap_not_from_its_own_mapping():
    # glibc's defaults map a 64 MB block on its own and unmap it on free, so the next one is mapped (and faulted
    # in) again; after keep_freed_memory() it comes from the heap, which keeps it
    if os.environ.get("LD_PRELOAD"):
        pytest.skip("another allocator is preloaded: mallopt may not be glibc's")
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True)
    if "no mallinfo2" in out.stderr:
        pytest.skip("not glibc >= 2.33: the probe cannot see the mappings (the allocator is set where glibc takes it)")
    assert out.returncode == 0, out.stderr
    kept, before, after = out.stdout.split()
    size = 64 << 20
    assert kept == "True" and int(before) >= size and int(after) < size // 64, out.stdout


def test_setup_sets_the_threads():
    saved = torch.get_num_threads()
    want = 1 if saved != 1 else 2
    try:
        cpu.setup(want)
        assert torch.get_num_threads() == want
    finally:
        torch.set_num_threads(saved)
