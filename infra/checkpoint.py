"""A run directory that loses nothing: checkpoints swapped in safely, checked on resume, one run at a time.

RUN_DIR holds
    run.json         the method and every setting of the run, and whether it finished
    metrics.jsonl    one JSON line per step and per evaluation (train.py)
    checkpoint/      an ordinary Hugging Face model directory, state.pt (optimizer, step, RNG states, D2's
                     buffer) and manifest.json (every file's size and SHA-256, written last)
    checkpoint.prev/ the checkpoint before, kept only while a new one is being swapped in
    .lock            held (flock) while a run writes here, so two runs never interleave their metrics

Why each piece: a kill can land anywhere, so a new checkpoint is written beside the old one and the old one is
removed only after the new one is in place; the manifest says a directory is complete and undamaged (a truncated
or bit-flipped file is caught before anything loads it); run.json lets --resume refuse another method's
checkpoint and lets a new run refuse to overwrite a finished one.
"""
import hashlib
import json
import math
import os
import shutil
import sys

import torch

CHECKPOINT, PREVIOUS, TMP = "checkpoint", "checkpoint.prev", "checkpoint.tmp"
MANIFEST = "manifest.json"
# Settings whose change would make a resumed run a different experiment. Others (--steps, --eval-every,
# --threads, --max-minutes, ...) may change on resume: extending a run is what --resume is for.
SAME_ON_RESUME = ["method", "model", "dataset", "group_size", "prompts_per_step", "max_new_tokens", "seed",
                  "lora_rank"]


def fail(message: str):
    """One line on stderr, exit status 1: what is wrong and what to do."""
    sys.exit(message)


# ---- run.json, the lock, and the refusal to overwrite -----------------------------------------------------------

def _read_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def check(run_dir: str, args, resume: bool, overwrite: bool):
    """Before anything heavy runs, and writing nothing: refuse another run's directory unless --resume (with the
    same method and task) or --overwrite."""
    info = _read_json(os.path.join(run_dir, "run.json"))
    if resume and info is not None:
        for key in SAME_ON_RESUME:
            if key in info["args"] and info["args"][key] != getattr(args, key):
                fail(f"--resume: {run_dir} is a run with --{key.replace('_', '-')} {info['args'][key]}, not "
                     f"{getattr(args, key)}; resume it with the same setting, or use another --run-dir")
    holds_a_run = any(os.path.exists(os.path.join(run_dir, n)) for n in ("metrics.jsonl", CHECKPOINT, PREVIOUS))
    if holds_a_run and not resume and not overwrite:
        what = (f"a {'finished' if info.get('finished') else 'stopped'} {info['args']['method']} run"
                if info else "a run")
        fail(f"--run-dir {run_dir} holds {what}: pass --resume to continue it, --overwrite to start over, "
             f"or choose another --run-dir")


def claim(run_dir: str, args, resume: bool, overwrite: bool):
    """Make RUN_DIR this run's, just before the first write (a start that fails earlier leaves no folder behind):
    take the lock, clear the old run on --overwrite, write run.json. Returns the lock's open file, which must stay
    open while the run writes (a kill releases it)."""
    os.makedirs(run_dir, exist_ok=True)
    lock = _lock(run_dir)
    if overwrite and not resume:
        for name in ("metrics.jsonl", "run.json", CHECKPOINT, PREVIOUS, TMP, "heatmaps"):
            path = os.path.join(run_dir, name)
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.remove(path)
    write_info(run_dir, args, finished=False)
    return lock


def _lock(run_dir: str):
    """An exclusive flock on RUN_DIR/.lock: the kernel drops it when the process dies, so no stale lock remains."""
    try:
        import fcntl
    except ImportError:  # Windows: no flock; one run per directory is then up to the user
        return None
    f = open(os.path.join(run_dir, ".lock"), "w")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fail(f"--run-dir {run_dir}: another run is writing there now; wait for it or choose another --run-dir")
    return f


def write_info(run_dir: str, args, finished: bool, step: int = None):
    """run.json: the method and settings (as parsed, presets applied), and whether the run reached its end."""
    info = {"method": args.method, "finished": finished, "step": step, "args": vars(args)}
    tmp = os.path.join(run_dir, "run.json.tmp")
    with open(tmp, "w") as f:
        json.dump(info, f, indent=1, default=str)
    os.replace(tmp, os.path.join(run_dir, "run.json"))


# ---- metrics.jsonl --------------------------------------------------------------------------------------------

def finite_or_none(record: dict) -> dict:
    """JSON has no NaN or infinity: an undefined value (e.g. O7's ESS-ratio on a step where every advantage is 0)
    is written as null, so every line stays valid JSON for any reader."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}


def append_metrics(path: str, record: dict):
    with open(path, "a") as f:
        f.write(json.dumps(finite_or_none(record), allow_nan=False) + "\n")


def read_metrics(path: str, up_to_step: int = None) -> list:
    """The records of metrics.jsonl (those with step <= up_to_step, if given). A line that is not JSON (a run
    killed while writing leaves a partial last line) is reported with its line number and dropped."""
    records = []
    if not os.path.exists(path):
        return records
    with open(path, "rb") as f:
        for i, line in enumerate(f, 1):
            try:
                record = json.loads(line)
            except ValueError:
                print(f"{path}:{i}: not a complete JSON line (a run killed while writing?); dropped")
                continue
            if up_to_step is None or record.get("step", 0) <= up_to_step:
                records.append(record)
    return records


def rewrite_metrics(path: str, records: list):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    os.replace(tmp, path)


# ---- checkpoints ----------------------------------------------------------------------------------------------

def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def save(run_dir: str, model, tokenizer, state: dict, write=None):
    """Write RUN_DIR/checkpoint: the model and tokenizer (an HF directory), state.pt, then manifest.json. write:
    write(path) writes the model files instead (LoRA: the merged model and the adapter, infra/lora.py).

    The order makes every kill safe: the new checkpoint is complete in checkpoint.tmp (manifest last) before the
    old one moves aside to checkpoint.prev, and checkpoint.prev goes only once checkpoint is in place. Whatever
    the moment of a kill, `checkpoint` or `checkpoint.prev` is complete, and find() takes the newer of them."""
    final, prev, tmp = (os.path.join(run_dir, n) for n in (CHECKPOINT, PREVIOUS, TMP))
    shutil.rmtree(tmp, ignore_errors=True)
    if write is None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    else:
        write(tmp)
    torch.save(state, os.path.join(tmp, "state.pt"))
    files = sorted(os.path.relpath(os.path.join(d, n), tmp) for d, _, names in os.walk(tmp) for n in names)
    manifest = {"step": state["step"],
                "files": {n: {"bytes": os.path.getsize(os.path.join(tmp, n)), "sha256": _sha256(os.path.join(tmp, n))}
                          for n in files}}
    with open(os.path.join(tmp, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    if os.path.isdir(final):
        if os.path.isdir(prev):  # left by an earlier kill; `checkpoint` is complete, so prev is not needed
            shutil.rmtree(prev)
        os.replace(final, prev)
    os.replace(tmp, final)
    shutil.rmtree(prev, ignore_errors=True)


def problem(path: str):
    """Why the checkpoint directory `path` cannot be resumed from (one line), or None if it is complete."""
    manifest = _read_json(os.path.join(path, MANIFEST))
    if manifest is None:
        return f"{path}: no readable {MANIFEST} (incomplete: the run was killed while saving?)"
    for name, expect in manifest["files"].items():
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            return f"{file}: missing"
        if os.path.getsize(file) != expect["bytes"]:
            return f"{file}: {os.path.getsize(file)} bytes, {expect['bytes']} when saved (truncated?)"
        if _sha256(file) != expect["sha256"]:
            return f"{file}: its contents changed since it was saved (SHA-256 differs)"
    return None


def find(run_dir: str) -> str:
    """The checkpoint to resume from: `checkpoint` if it is complete, else `checkpoint.prev` (a kill during the
    swap). Exits with one line per candidate if neither is usable."""
    problems = []
    for name in (CHECKPOINT, PREVIOUS):
        path = os.path.join(run_dir, name)
        if not os.path.isdir(path):
            continue
        why = problem(path)
        if why is None:
            if problems:
                print(f"resuming from {path}: {problems[0]}")
            return path
        problems.append(why)
    if not problems:
        fail(f"--resume: no checkpoint in {run_dir} (none was saved yet: see --save-every)")
    fail("--resume: no usable checkpoint: " + "; ".join(problems))


def load_state(path: str) -> dict:
    """state.pt of a checkpoint that find() accepted (torch.load of a file we wrote ourselves)."""
    try:
        return torch.load(os.path.join(path, "state.pt"), weights_only=False, map_location="cpu")
    except Exception as e:  # unpickling a damaged file can raise almost anything
        fail(f"--resume: {os.path.join(path, 'state.pt')} cannot be read: {str(e).splitlines()[0]}")


def check_finite(model, path: str):
    """A checkpoint whose weights hold NaN or infinity would fail later, deep inside sampling: say so now."""
    for name, p in model.named_parameters():
        if not torch.isfinite(p).all():
            fail(f"--resume: {path}: parameter {name} holds NaN or infinite values")
