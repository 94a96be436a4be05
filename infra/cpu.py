"""What a process sets before its first large tensor, on any device: torch's CPU threads (--threads), and large
CPU tensors on huge pages (speed only: no number changes).

Why huge pages: glibc serves a block above 32 MB straight from the system and returns it on free, so each new
tensor of that size is mapped and zeroed again, a 4 KB page fault at a time. A [64, 151,936] float32 tensor of
next-token scores is 39 MB; a 0.5B's embedding gradient 544 MB, made again at every backward. torch can instead
ask the kernel for 2 MB pages for every CPU tensor of 2 MB or more (THP_MEM_ALLOC_ENABLE, read at its first such
allocation; the kernel's transparent huge pages in "madvise" or "always" mode): 512 times fewer faults. On this
project's 2-core machine (one thread, docs/LOG.md, 2026-11-26): a division over 39 MB 19.5 -> 5.1 ms, an embedding's
backward 243 -> 62 ms. Memory is still handed back on free, as before. (Keeping freed memory in the process instead,
with glibc's mallopt, was as fast, but then the process never hands memory back: its resident size can only stay
at its high-water mark or grow, and the memory plan's phases (infra/memory.py) would no longer be what it holds.)
"""
import os

import torch


def setup(threads: int = None):
    """torch's CPU threads (None: torch's choice) and huge_pages()."""
    if threads:
        torch.set_num_threads(threads)
    huge_pages()


def huge_pages():
    """torch's CPU tensors of 2 MB or more on transparent huge pages, unless THP_MEM_ALLOC_ENABLE says otherwise.
    torch reads the variable at its first allocation that large: call this before a model loads. Where the kernel
    has no transparent huge pages (or they are "never"), torch's allocations are as before."""
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
