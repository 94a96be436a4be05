"""infra/cpu.py: the C allocator keeps freed memory for the next large tensor."""
import ctypes
import ctypes.util

import pytest
import torch

from infra import cpu


class MallInfo2(ctypes.Structure):  # glibc >= 2.33's struct mallinfo2, every field a size_t
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def mapped_bytes():
    """Bytes glibc holds in blocks mapped one by one from the system (mallinfo2's hblkhd); None without glibc."""
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c")).mallinfo2
    except (OSError, AttributeError, TypeError):
        return None
    fn.restype = MallInfo2
    return fn().hblkhd


def test_a_large_tensor_comes_from_the_kept_heap_not_from_its_own_mapping():
    # glibc's default mmap threshold (128 KB) maps a 64 MB tensor on its own and unmaps it on free, so the next one
    # is mapped (and faulted in) again; after keep_freed_memory() it comes from the heap, which keeps it
    if mapped_bytes() is None:
        pytest.skip("not glibc: its allocator is left alone")
    size = 64 << 20
    try:
        assert cpu.keep_freed_memory(128 * 1024)  # glibc's default threshold, as a process starts
        before = mapped_bytes()
        x = torch.empty(size // 4)
        assert mapped_bytes() - before >= size
        del x
        assert cpu.keep_freed_memory()
        before = mapped_bytes()
        x = torch.empty(size // 4)
        assert mapped_bytes() - before < size // 64
    finally:
        cpu.keep_freed_memory()  # what every entry point sets (conftest too)


def test_setup_sets_the_threads():
    saved = torch.get_num_threads()
    try:
        cpu.setup(1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(saved)
