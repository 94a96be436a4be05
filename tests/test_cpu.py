"""infra/cpu.py: large CPU tensors on huge pages; freed memory kept for the next; the threads."""
import os
import platform
import subprocess
import sys

import pytest
import torch

from infra import cpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THP = "/sys/kernel/mm/transparent_hugepage/enabled"

# A fresh process (torch reads THP_MEM_ALLOC_ENABLE once, at its first large allocation; this one's was made long
# ago): after cpu.setup() or not, a 64 MB tensor is written, and the process's anonymous memory on huge pages read
PROBE = """
import sys, torch
from infra import cpu
if sys.argv[1] == "setup":
    cpu.setup()
x = torch.ones(16 << 20)
print(next(int(line.split()[1]) for line in open("/proc/self/smaps_rollup") if line.startswith("AnonHugePages:")))
"""


def huge_kib(how: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    out = subprocess.run([sys.executable, "-c", PROBE, how], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


def test_a_large_tensor_lies_on_huge_pages_after_setup():
    if not os.path.exists(THP) or "[never]" in open(THP).read() or not os.path.exists("/proc/self/smaps_rollup"):
        pytest.skip("no transparent huge pages here: torch allocates as before")
    assert huge_kib("setup") >= 60 * 1024  # of the 64 MB tensor, all but the unaligned ends
    if "[madvise]" in open(THP).read():  # where the kernel does not give them unasked, torch did not ask without it
        assert huge_kib("none") < 8 * 1024


# A fresh process: after cpu.setup() or not, a 64 MB tensor is written and freed; what the process's resident memory
# lost at the free is printed (glibc maps a block that large on its own and unmaps it on free, unless told to keep it)
FREED = """
import os, sys, torch
from infra import cpu
if sys.argv[1] == "setup":
    cpu.setup()
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
x = torch.ones(16 << 20)
before = rss()
del x
print(before - rss(), cpu.keep_freed_memory())  # asked only after the measurement: whether mallopt takes it here
"""


def test_freed_memory_stays_in_the_process_after_setup():
    if not os.path.exists("/proc/self/statm"):
        pytest.skip("no /proc: the resident size cannot be read here")
    got = {}
    # glibc's own settings of the thresholds would make the run without setup keep the memory too
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    for how in ("setup", "none"):
        out = subprocess.run([sys.executable, "-c", FREED, how], cwd=ROOT, env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        handed_back, takes = out.stdout.split()
        got[how] = int(handed_back)
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("not glibc: its allocator is left alone")
    assert takes == "True"  # glibc takes both thresholds
    assert got["none"] >= 56 << 20  # the 64 MB went back to the system on free
    assert got["setup"] < 8 << 20  # kept for the next tensor: setup() asked for it


def test_setup_sets_the_threads():
    saved = torch.get_num_threads()
    want = 1 if saved != 1 else 2
    try:
        cpu.setup(want)
        assert torch.get_num_threads() == want
    finally:
        torch.set_num_threads(saved)
