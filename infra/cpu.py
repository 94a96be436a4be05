"""What a process sets before its first tensor, on any device: torch's CPU threads (--threads), and the C
allocator's thresholds (speed only: no number changes).

Why the allocator: torch takes the memory of a CPU tensor from the C library's malloc and gives it back when the
tensor dies. glibc serves a block above its mmap threshold (at most 32 MB by default) straight from the system
and returns it on free, so the next tensor of that size is zeroed and mapped again page by page. A [64, 151,936]
float32 tensor of next-token scores is 39 MB; a 0.5B's embedding gradient 544 MB. On this project's 2-core machine
a division over 39 MB took 24 ms, 11 ms with the memory kept; an embedding's backward 325 ms against 77 ms; a
0.5B's training pass 7.5 s against 4.8 s (docs/LOG.md, 2026-11-26). Here freed memory stays in the process for
the next tensor. Its resident size then stays near its peak, which the memory plan (infra/memory.py) counts
anyway; memory.release_freed_memory still hands it back where a phase's peak is measured.
"""
import ctypes

import torch

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4  # glibc's malloc.h
KEEP = 1 << 30  # bytes: freed memory up to this much stays in the heap; blocks up to it are not mapped apart


def setup(threads: int = None):
    """torch's CPU threads (None: torch's choice) and keep_freed_memory()."""
    if threads:
        torch.set_num_threads(threads)
    keep_freed_memory()


def keep_freed_memory(size: int = KEEP) -> bool:
    """Ask glibc to serve blocks up to `size` bytes from its heap instead of mapping each apart, and not to hand
    freed memory below `size` back to the system. glibc before 2.35 refuses an mmap threshold above 32 MB: it is
    then told to map no block apart at all (M_MMAP_MAX 0). True where glibc took it; False elsewhere (macOS, musl:
    their allocators are left alone). (In glibc's main arena, where torch's calls from Python allocate.)"""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library the process runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    mapped_apart = mallopt(M_MMAP_THRESHOLD, size) or mallopt(M_MMAP_MAX, 0)
    return bool(mapped_apart and mallopt(M_TRIM_THRESHOLD, size))
