"""What a process sets before its first large tensor, on any device: torch's CPU threads (--threads), and how large
CPU tensors get their memory (speed only: no number changes).

Why: glibc serves a block above 32 MB straight from the system and returns it on free, so each new tensor of that
size is mapped and zeroed again, a page fault at a time. A [64, 151,936] float32 tensor of next-token scores is
39 MB; a 0.5B's embedding gradient 544 MB, made again at every backward. Two remedies, both taken:
- huge_pages(): torch asks the kernel for 2 MB pages for every CPU tensor of 2 MB or more (THP_MEM_ALLOC_ENABLE;
  the kernel's transparent huge pages in "madvise" or "always" mode): 512 times fewer faults. On this project's
  2-core machine (one thread, docs/LOG.md, 2026-11-26): a division over 39 MB 19.5 -> 5.1 ms, an embedding's
  backward 243 -> 62 ms.
- keep_freed_memory(): glibc serves blocks up to 2 GB from the process's heap and keeps what is freed there for the
  next tensor, which reuses it without new page faults. On top of huge pages, train.py with the bench's
  Qwen2.5-Coder-0.5B setting (docs/LOG.md, 2026-11-27, twelfth session; steps 3-6 of 3 runs each way, in turns): the
  training phase 26.5 -> 21.5 s a step (medians), sampling 7.7 -> 7.2 s, the run's peak 15.2-15.5 GiB either way. The
  cost: between phases the process holds up to its peak (train.py's memory.Peaks hands memory back in the first step
  only, to read each phase's own figure). Tried before: 2026-11-26 (1.55x on an 8-row pass; dropped because the
  process holds its peak) and one bench step on 2026-11-27 (inside the spread); the step-by-step A/B was the first to
  show it.
"""
import os

import torch


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
KEEP = 2**31 - 1  # bytes (mallopt takes an int): blocks up to this size from the heap, and freed memory kept there


def setup(threads: int = None):
    """torch's CPU threads (None: torch's choice), huge_pages() and keep_freed_memory()."""
    if threads:
        torch.set_num_threads(threads)
    huge_pages()
    keep_freed_memory()


def huge_pages():
    """torch's CPU tensors of 2 MB or more on transparent huge pages, unless THP_MEM_ALLOC_ENABLE says otherwise.
    torch reads the variable at its first allocation that large: call this before a model loads. Where the kernel
    has no transparent huge pages (or they are "never"), torch's allocations are as before."""
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


def glibc():
    """The C library where it is glibc (its malloc's settings: mallopt, malloc_trim), else None (macOS, musl)."""
    import ctypes
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def keep_freed_memory(size: int = KEEP) -> bool:
    """glibc's malloc serves blocks up to `size` bytes from the heap and keeps freed memory up to `size` in the
    process (its mmap and trim thresholds, each set on its own). True where it took both; False where mallopt
    refused either (the other may still be set) or the C library is not glibc (left alone).
    memory.release_freed_memory() still hands memory back when asked."""
    import ctypes
    libc = glibc()
    if libc is None:
        return False
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    took = [mallopt(M_MMAP_THRESHOLD, size), mallopt(M_TRIM_THRESHOLD, size)]
    return all(took)
