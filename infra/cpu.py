"""What a process sets before its first large tensor, on any device: torch's CPU threads (--threads), and how large
CPU tensors get their memory (speed only: no number changes). And the machine a run ran on (machine(): its CPU's
kernels and instruction sets, its GPU), which run.json records.

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
import hashlib
import os
import platform

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


# ---- the machine a run ran on (train.py records it in run.json; tools.compare pairs only runs of one machine)

def machine() -> str:
    """What decides a run's floats beyond its flags: the CPU (cpu_record) and the GPU, where there is one. Another CPU
    sums in another order, and the same seed makes another run."""
    cpuinfo = ""
    if os.path.isfile("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            cpuinfo = f.read()
    gpu = f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    return cpu_record(cpuinfo, platform.processor() or platform.machine(),
                      torch.backends.cpu.get_cpu_capability()) + gpu


# The feature names that choose a kernel's instructions (x86 "flags", ARM "Features"): the kernel's own entries (pti,
# md_clear, hypervisor) change with its version on the same CPU and are left out
ISA = ("avx", "amx", "fma", "f16c", "sse", "ssse", "asimd", "sve", "sme", "bf16", "i8mm", "fp")


def cpu_record(cpuinfo: str, fallback: str, capability: str) -> str:
    """The CPU's model name, the kernels torch picks for it and a digest of its instruction sets. The name is not
    enough: two hosts that both called themselves "Intel(R) Xeon(R) Processor (AVX512)" made other runs of one seed
    (step 0's greedy accuracy 0.180 and 0.172, docs/LOG.md 2026-12-02); what else differed between them is not known,
    their instruction sets being the likeliest."""
    model, isa = None, None
    for line in cpuinfo.splitlines():  # the first processor's lines: every core of a host is the same CPU
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "model name" and model is None:
            model = value or None
        elif key.lower() in ("flags", "features") and isa is None:
            isa = " ".join(sorted(f for f in value.split() if f.startswith(ISA)))
    digest = f", flags {hashlib.sha256(isa.encode()).hexdigest()[:8]}" if isa else ""
    return f"{model or fallback} ({capability}{digest})"
