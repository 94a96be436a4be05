"""What a process sets before its first tensor, on any device: torch's CPU threads (--threads), and the C
allocator's thresholds (speed only: no number changes).

Why the allocator: torch takes the memory of a CPU tensor from the C library's malloc and gives it back when the
tensor dies. glibc serves a block above its mmap threshold (at most 32 MB by default) straight from the system
and returns it on free, so the next tensor of that size is zeroed and mapped again page by page. A [64, 151,936]
float32 tensor of next-token scores is 39 MB; a 0.5B's embedding gradient 544 MB. On this project's 2-core machine
a division of 39 MB took 24 ms so against 11 ms with the memory kept, an embedding's backward 325 ms against 77 ms
(docs/LOG.md, 2026-11-26). Raising both thresholds keeps freed memory in the process for the next tensor: the
process's resident size then stays at its peak, which the memory plan (infra/memory.py) counts anyway.
"""
import ctypes
import ctypes.util

import torch

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
KEEP = 1 << 30  # bytes: blocks up to this size come from the process's heap, and freed memory stays in it


def setup(threads: int = None):
    """torch's CPU threads (None: torch's choice) and keep_freed_memory()."""
    if threads:
        torch.set_num_threads(threads)
    keep_freed_memory()


def keep_freed_memory(size: int = KEEP) -> bool:
    """Ask glibc to serve blocks up to `size` bytes from the heap and not to return freed memory below `size`
    to the system. True where it took both; False elsewhere (macOS, musl: their allocators are left alone). A
    glibc that refuses so high an mmap threshold gets its largest, 32 MB."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    mmap = mallopt(M_MMAP_THRESHOLD, size) or mallopt(M_MMAP_THRESHOLD, 32 << 20)
    return bool(mmap and mallopt(M_TRIM_THRESHOLD, size))
