"""What every script's command line shares: which model, where the data is, the hardware (add_shared_flags), and the
checks of values any script takes (a finite number, a seed, a count, a thread count, a device). A check that fails
raises Refused with one line naming the flag; a parser shows it as its own error (as_errors_of), a script that
builds its settings itself exits with the line (scaling/trl_grpo.py)."""
import argparse
import contextlib
import io
import math
import os

import torch

import data
from infra import models

# Bounds beyond which a float flag is not a setting but a mistake (each check says why).
MAX_LR = 1.0
MIN_TEMPERATURE = 1e-3


class Refused(ValueError):
    """A setting refused before anything heavy runs; its text is the one line that says which and why."""


@contextlib.contextmanager
def as_errors_of(p: argparse.ArgumentParser):
    """Inside: a Refused is p.error(its line), argparse's exit 2 with the usage line, as for any flag it checks."""
    try:
        yield
    except Refused as e:
        p.error(str(e))


def parse_quietly(p: argparse.ArgumentParser, argv: list):
    """p.parse_args(argv), a refusal being Refused(argparse's one line) instead of its usage on stderr and exit 2:
    for a caller that names more than argparse can (a recipe's file and key, a run of compare.py)."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            return p.parse_args(argv)
    except SystemExit as e:
        lines = said.getvalue().strip().splitlines()
        own = getattr(p, "refused", None)  # infra/cli.Parser keeps its error's text
        raise Refused(own or (lines[-1].split("error: ", 1)[-1] if lines else f"refused (exit status {e.code})")) \
            from None


def add_shared_flags(p: argparse.ArgumentParser):
    """The flags train.py and evaluate.py share, declared once: which model, where the data is, and the hardware."""
    p.add_argument("--model", default=models.DEFAULT,
                   help=f"{', '.join(models.MODELS)} (infra/models.py: {models.DEFAULT} is built here, the others "
                        f"install offline), a GGUF file, a local HF model directory (a train.py checkpoint), or a "
                        f"hub name")
    p.add_argument("--data-dir", default=data.DATA_DIR, help="where the benchmark files are (else: the hub)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                   help="compute in bf16: weights that do not train are held in bf16 (evaluate.py's model, the "
                        "reference model); weights that train keep float32 and run under bf16 autocast, since a "
                        "1e-6 update is below a bf16 weight's precision (default: on for a real model where the "
                        "device has bf16 hardware, a GPU or a CPU with AVX512-BF16; off for the tiny world)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice; on a "
                                                             "shared machine pass what is yours)")


def number(text: str) -> float:
    """argparse's type for every float flag: float() also takes "nan", "inf" and "1e400" (infinity), which no
    setting means and which would reach the weights or the sampler; each is refused in one line naming the flag."""
    value = float(text)  # a ValueError: argparse's own "invalid number value"
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text}: not a finite number")
    return value


def check_shared(args):
    """The checks of add_shared_flags' values: a path that is empty, a thread count this machine does not have, a
    device that torch does not know or that is not here (a CUDA device on a machine without one); then --bf16's
    default, which depends on the device."""
    for flag in ("model", "data_dir"):
        if not getattr(args, flag).strip():
            raise Refused(f"--{flag.replace('_', '-')} {getattr(args, flag)!r}: empty")
    if threads_problem(args.threads):
        raise Refused(f"--threads {args.threads}: {threads_problem(args.threads)}")
    why = device_problem(args.device)
    if why and not (getattr(args, "dry_run", False) and "not a device" not in why):  # a plan for a GPU elsewhere
        raise Refused(f"--device {args.device}: {why}")
    if args.bf16 is None:  # the default follows the hardware (models.bf16_default)
        args.bf16 = models.bf16_default(args.model, args.device)


def threads_problem(threads: int):
    """Why --threads cannot be used here (a phrase), or None (None: torch's choice)."""
    cpus = os.cpu_count() or 1
    if threads is None or 1 <= threads <= cpus:
        return None
    return f"must be at least 1 and at most this machine's {cpus} CPUs"


def device_problem(device: str):
    """Why `device` cannot run the model here (a phrase), or None."""
    try:
        kind = torch.device(device)
    except (RuntimeError, ValueError):
        return "not a device torch knows (cpu, cuda, cuda:1, mps)"
    if kind.type == "cpu":
        return None
    if kind.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            return f"no CUDA device is visible (torch {torch.__version__}); use --device cpu"
        return None if kind.index is None or kind.index < n else f"{n} CUDA device(s) visible, numbered from 0"
    if kind.type == "mps":
        return None if torch.backends.mps.is_available() else "MPS is not available on this machine"
    return f"{kind.type} is not a device this project runs on (cpu, cuda, mps)"


def check_seed(seed: int, flag: str = "--seed"):
    """Refused where seed_problem has one."""
    if seed_problem(seed):
        raise Refused(f"{flag} {seed}: {seed_problem(seed)}")


def seed_problem(seed: int):
    """torch, Python's random and numpy (TRL seeds it) all take a seed in [0, 2^32); torch refuses a larger one only
    once the model is loaded, and a negative one would draw as its absolute value in Python's random."""
    return None if 0 <= seed < 2 ** 32 else "must be at least 0 and below 2^32"


def at_least(args, lows: dict):
    """Each flag of lows ({dest: lowest value}) given (not None) at least its lowest value."""
    for name, low in lows.items():
        value = getattr(args, name)
        if value is not None and value < low:
            raise Refused(f"--{name.replace('_', '-')} {value}: must be at least {low}")
