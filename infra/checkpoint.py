"""A run directory that loses nothing: checkpoints swapped in safely, checked on resume, one run at a time.

RUN_DIR holds
    run.json         the method and every setting of the run, whether it finished, and the machine it ran on
    metrics.jsonl    one JSON line per step and per evaluation (train.py)
    checkpoint/      an ordinary Hugging Face model directory, state.pt (optimizer, step, RNG states, D2's
                     buffer, RLSD's frozen teacher between syncs) and manifest.json (every file's size and SHA-256,
                     written last)
    checkpoint.prev/ the checkpoint saved before it, kept until the next save begins
    checkpoint.tmp/  a checkpoint being written (complete once its manifest is there)
    .lock            held (flock) while a run writes here, so two runs never interleave their metrics

Why each piece: a kill can land anywhere, so a new checkpoint is written beside the old one and the old one moves
aside only after the new one is complete; the manifest says a directory is complete and undamaged (a truncated
or bit-flipped file is caught before anything loads it), and a damaged checkpoint falls back to the one before;
run.json (and, if it is lost, state.pt's own copy of the settings) lets --resume refuse another method's
checkpoint and lets a new run refuse to overwrite a finished one. A write that fails (a full disk, a folder made
read-only) stops the run with one line and leaves the last complete checkpoint in place.
"""
import hashlib
import fnmatch
import json
import math
import os
import shutil
import sys
import tempfile

import torch

from infra import cpu, lora, track
from infra.files import lock, read_json, write_json, write_jsonl  # read_json: also tools.paired's name for it

CHECKPOINT, PREVIOUS, TMP = "checkpoint", "checkpoint.prev", "checkpoint.tmp"
MANIFEST = "manifest.json"
# The settings that may change on --resume: where and how fast the run goes, what it logs and when it evaluates or
# saves (extending a run is what --resume is for), and the derived base and rule. Every other setting defines the run
# (its sampling, its grader, its objective, its optimizer, a rule's knobs, the held-out set), and a resume with
# another value is refused: the earlier steps were made with the old one, while run.json would record the new.
# --lr was the first such setting: the optimizer's and scheduler's saved state would keep the old one.
MAY_CHANGE_ON_RESUME = ("run_dir", "resume", "overwrite", "config", "dry_run", "memory", "steps", "max_minutes",
                        "threads", "device", "data_dir", "rules_file", "eval_every", "save_every", "final_eval",
                        "final_save", "report_to", "eval_batch_size", "gen_batch_size", "micro_batch_size",
                        "grad_checkpointing", "ref_on_cpu", "oar_chunk", "base", "rule")


def defines_the_run(key: str) -> bool:
    """Whether a setting (an args name) must keep its value on --resume (MAY_CHANGE_ON_RESUME lists the others)."""
    return key not in MAY_CHANGE_ON_RESUME


# what --overwrite deletes of the run before it
CLEARED = ("metrics.jsonl", "run.json", CHECKPOINT, PREVIOUS, TMP, "heatmaps", "tensorboard", "wandb", "trackio")


def fail(message: str):
    """One line on stderr, exit status 1: what is wrong and what to do."""
    sys.exit(message)


# ---- run.json, the lock, and the refusal to overwrite -----------------------------------------------------------

def read_info(run_dir: str):
    """run.json as written by write_info, or None if it is missing, not JSON, or not of that shape."""
    info = read_json(os.path.join(run_dir, "run.json"))
    return info if isinstance(info, dict) and isinstance(info.get("args"), dict) else None


def saved_args(ckpt: str) -> dict:
    """The settings a checkpoint was saved with (state.pt's "args"), read without loading its tensors."""
    return load_state(ckpt, mmap=True).get("args") or {}


def check(run_dir: str, args, resume: bool, overwrite: bool, ckpt: str = None):
    """Before anything heavy runs, leaving nothing behind: refuse a run directory that cannot be written, and
    another run's directory unless --resume (with the same method and task as both run.json and the checkpoint
    ckpt say, so that a lost or damaged run.json changes nothing) or --overwrite."""
    check_layout(run_dir)
    writable_dir(run_dir, "--run-dir")
    info = read_info(run_dir)
    if resume:
        as_saved = lambda v: list(v) if isinstance(v, tuple) else v  # noqa: E731 (run.json holds lists)
        for saved in ([info["args"]] if info else []) + ([saved_args(ckpt)] if ckpt else []):
            for key in filter(defines_the_run, saved):  # a setting run.json lacks (an older run's) is not checked
                if hasattr(args, key) and as_saved(saved[key]) != as_saved(getattr(args, key)):
                    fail(f"--resume: {run_dir} is a run with --{key.replace('_', '-')} {saved[key]}, not "
                         f"{getattr(args, key)}; resume it with the same setting, or use another --run-dir")
        for name in (CHECKPOINT, PREVIOUS):  # the saves ahead rotate these folders away whole
            kept = foreign(os.path.join(run_dir, name)) if os.path.isdir(os.path.join(run_dir, name)) else []
            if kept:
                fail(f"--resume: {kept[0]} is not of this run (its checkpoint's manifest does not list it), and the "
                     f"run's next saves would take its folder away: move it out of {run_dir}, then --resume")
        done = (read_json(os.path.join(ckpt, MANIFEST)) or {}).get("step") if ckpt else None
        if isinstance(done, int) and args.steps < done:
            fail(f"--resume: {ckpt} is at step {done}, past --steps {args.steps}; pass --steps {done} or more")
    if overwrite and not resume:  # training from the run's own checkpoint would delete the weights it starts from
        model = os.path.realpath(os.path.expanduser(str(args.model)))
        for name in CLEARED:
            there = os.path.realpath(os.path.join(run_dir, name))
            if model == there or model.startswith(there + os.sep):
                fail(f"--model {args.model} lies in {there}, which --overwrite would delete: copy it elsewhere "
                     f"first, or choose another --run-dir")
        for name in CLEARED:  # all of it checked before anything is deleted: a refusal halfway would lose the run
            kept = foreign(os.path.join(run_dir, name)) if os.path.isdir(os.path.join(run_dir, name)) else []
            if kept:
                fail(f"--overwrite: {kept[0]} is not of this run (not what it writes there), and --overwrite clears "
                     f"{os.path.join(run_dir, name)}: move it out of {run_dir}, then --overwrite again (nothing was "
                     f"deleted)")
    holds_a_run = any(os.path.exists(os.path.join(run_dir, n)) for n in ("metrics.jsonl", CHECKPOINT, PREVIOUS, TMP))
    if holds_a_run and not resume and not overwrite:
        what = (f"a {'finished' if info.get('finished') else 'stopped'} {info['args'].get('method')} run"
                if info else "a run")
        can = resumable(run_dir)
        fail(f"--run-dir {run_dir} holds {what}: "
             + (f"pass --resume to continue it from {can}, " if can
                else "it has no checkpoint --resume could continue from; ")
             + "--overwrite to start over, or choose another --run-dir")


# What a run folder holds: files, and folders (a part of the wrong kind, made by hand, is refused in one line)
FILES, FOLDERS = ("metrics.jsonl", "run.json", ".lock"), (CHECKPOINT, PREVIOUS, TMP, "heatmaps")


def check_layout(run_dir: str):
    """A run folder no other run holds, whose parts are of their kind: else one line, before anything is read."""
    outer = enclosing_run(run_dir)
    if outer:
        fail(f"--run-dir {run_dir}: inside the run {outer} (its next save or --overwrite would take this folder "
             f"with it); choose a folder outside it")
    wrong = wrong_kind(run_dir)
    if wrong:
        fail(f"--run-dir {run_dir}: {wrong}; move it away, or choose another --run-dir")


def is_run(path: str) -> bool:
    """Whether the folder `path` holds a train.py run (its run.json, metrics.jsonl or a checkpoint)."""
    return os.path.isdir(path) and any(os.path.exists(os.path.join(path, n)) for n in ("run.json", "metrics.jsonl",
                                                                                       CHECKPOINT, PREVIOUS))


def enclosing_run(run_dir: str):
    """The run folder that holds `run_dir` below it (in its checkpoint, its heatmaps, anywhere), or None. A run
    there would be taken away by the outer run's next save (a checkpoint folder is rotated whole) or its
    --overwrite."""
    here = os.path.dirname(os.path.abspath(run_dir))
    while True:
        if is_run(here):
            return here
        up = os.path.dirname(here)
        if up == here:
            return None
        here = up


def in_checkpoint(path: str):
    """The checkpoint folder of a run (checkpoint, checkpoint.prev, checkpoint.tmp) that `path` is or lies in, or
    None: what a save rotates away."""
    here = os.path.abspath(path)
    while os.path.dirname(here) != here:
        if os.path.basename(here) in (CHECKPOINT, PREVIOUS, TMP) and is_run(os.path.dirname(here)):
            return here
        here = os.path.dirname(here)
    return None


def wrong_kind(run_dir: str):
    """A part of a run folder of the wrong kind (a file where a folder belongs, or the reverse), said as a phrase,
    or None: found now, not as a traceback at the first write."""
    for name in FILES + FOLDERS:
        path = os.path.join(run_dir, name)
        if name in FILES and os.path.isdir(path):
            return f"{path} is a folder where the run keeps a file"
        if name in FOLDERS and os.path.exists(path) and not os.path.isdir(path):
            return f"{path} is a file where the run keeps a folder"
    return None


def resumable(run_dir: str):
    """The checkpoint --resume would take in run_dir, or None when none is usable (sizes checked, not checksums)."""
    for name in (TMP, CHECKPOINT, PREVIOUS):
        if _intact(os.path.join(run_dir, name)):
            return os.path.join(run_dir, name)
    return None


def writable_dir(path: str, flag: str):
    """Fail in one line, now rather than at the first save, if a file cannot be created in the folder `path`: a
    path that is a file or lies under one, a parent that is read-only. The folders made to find out, and the probe
    file, are removed again."""
    missing, there = [], os.path.abspath(path)
    while not os.path.exists(there):
        missing.append(there)
        there = os.path.dirname(there)
    if not os.path.isdir(there):
        fail(f"{flag} {path}: {there} is a file, not a folder")
    made = []
    try:
        for folder in reversed(missing):
            os.mkdir(folder)
            made.append(folder)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        fail(f"{flag} {path}: cannot write there ({e.strerror or e})")
    finally:
        for folder in reversed(made):
            os.rmdir(folder)


def claim(run_dir: str, args, resume: bool, overwrite: bool, ckpt: str = None):
    """Make RUN_DIR this run's, just before the first write (a start that fails earlier leaves no folder behind):
    take the lock, check again under it (a run that started beside this one may have finished there since
    check()), finish a swap a kill interrupted (or clear the old run on --overwrite), write run.json. Returns the
    lock's open file, which must stay open while the run writes (a kill releases it)."""
    os.makedirs(run_dir, exist_ok=True)
    lock = _lock(run_dir)
    check(run_dir, args, resume, overwrite, ckpt)
    if overwrite and not resume:
        for name in CLEARED:
            path = os.path.join(run_dir, name)
            if os.path.isdir(path):
                discard(path)
            elif os.path.exists(path):
                os.remove(path)
    elif problem(os.path.join(run_dir, TMP)) is None:  # complete: killed between save()'s two renames
        _swap_in(run_dir)
    write_info(run_dir, args, finished=False)
    return lock


def _lock(run_dir: str):
    """RUN_DIR/.lock held (files.lock) while this run writes there."""
    held = lock(run_dir)
    if held is None:
        fail(f"--run-dir {run_dir}: another run is writing there now; wait for it or choose another --run-dir")
    return held


def write_info(run_dir: str, args, finished: bool, step: int = None):
    """run.json: the method and settings (as parsed, presets applied), whether the run reached its end, and the
    machine it ran on (cpu.machine: another CPU sums in another order, so the same seed makes another run)."""
    info = {"method": args.method, "finished": finished, "step": step, "machine": cpu.machine(), "args": vars(args)}
    try:
        write_json(os.path.join(run_dir, "run.json"), info, indent=1, default=str)
    except OSError as e:
        fail(f"{os.path.join(run_dir, 'run.json')}: cannot be written ({e.strerror or e})")


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


# ---- metrics.jsonl --------------------------------------------------------------------------------------------

def finite_or_none(record: dict) -> dict:
    """JSON has no NaN or infinity: an undefined value (e.g. O7's ESS-ratio on a step where every advantage is 0)
    is written as null, so every line stays valid JSON for any reader."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}


def append_metrics(path: str, record: dict):
    try:
        with open(path, "a") as f:
            f.write(json.dumps(finite_or_none(record), allow_nan=False) + "\n")
    except OSError as e:  # a full disk: the lines before stay; what --resume can do is said as it is
        fail(f"{path}: cannot append the record of step {record.get('step')} ({e.strerror or e}); "
             f"{last_saved(os.path.dirname(path))}")


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
            except (ValueError, RecursionError):
                record = None
            step = record.get("step", 0) if isinstance(record, dict) else None
            if not isinstance(step, int) or isinstance(step, bool):  # a hand-edited line, too
                print(f"{path}:{i}: not a complete JSON line with an integer step (a run killed while writing?); "
                      f"dropped")
                continue
            if up_to_step is None or step <= up_to_step:
                records.append(record)
    return records


def rewrite_metrics(path: str, records: list):
    write_jsonl(path, records)


def resume_metrics(path: str, step: int) -> list:
    """A resumed run's metrics.jsonl cut back to the checkpoint's step (what was logged after it is done again);
    returns the records kept."""
    kept = read_metrics(path, up_to_step=step)
    rewrite_metrics(path, kept)
    return kept


# ---- checkpoints ----------------------------------------------------------------------------------------------

def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def save(run_dir: str, model, tokenizer, state: dict, write=None):
    """Write RUN_DIR/checkpoint: the model and tokenizer (an HF directory), state.pt, then manifest.json; the
    checkpoint it replaces becomes checkpoint.prev. write: write(path) writes the model files instead (LoRA: the
    merged model and the adapter, infra/lora.py).

    The order makes every kill safe: the one before the last (checkpoint.prev) goes first, to make room, unless
    the last is damaged; the new checkpoint is complete in checkpoint.tmp (manifest last) before the last one
    moves aside to checkpoint.prev. Whatever the moment of a kill, `checkpoint`, a complete `checkpoint.tmp` or
    `checkpoint.prev` is complete, and find() takes the newest of them. A write that fails (a full disk) stops
    the run with one line; the last checkpoint stays in place."""
    final, prev, tmp = (os.path.join(run_dir, n) for n in (CHECKPOINT, PREVIOUS, TMP))
    for old in (tmp, prev) if _intact(final) else (tmp,):
        if os.path.isdir(old):
            discard(old)
    try:
        _write(tmp, model, tokenizer, state, write)
    except Exception as e:  # safetensors, torch.save and the tokenizer each raise their own kind on a full disk
        if os.path.isdir(tmp):
            discard(tmp, strict=False)  # incomplete: it only takes space
        free = shutil.disk_usage(run_dir).free / 2 ** 20
        fail(f"{tmp}: the checkpoint of step {state['step']} could not be written ({_first_line(e)}; {free:.0f} MiB "
             f"free there); {_last(final)}")
    try:
        _swap_in(run_dir)
    except OSError as e:
        fail(f"{final}: the checkpoint of step {state['step']} is complete in {tmp} but could not be moved in "
             f"({e.strerror or e}); --resume takes it from there")


def save_run(run_dir: str, step: int, model, tokenizer, optimizer, scheduler, problem_rng, args, buffer: tuple,
             adapters=None, base: str = None, base_identity: dict = None, rule_state: dict = None):
    """A train.py run's checkpoint at `step` (save): the model, or under LoRA its adapters alone (adapters: the peft
    model, infra/lora.py; base: the --model they belong to), and state.pt, which holds all that --resume needs to
    continue bit for bit: the optimizer and scheduler, the torch and problem RNG states, D2's buffer of mixed groups
    (problems, batches), what the token rule keeps across steps (rule_state: RLSD's frozen teacher where it is not
    the policy) and the settings."""
    state = {"step": step, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "torch_rng": torch.get_rng_state(), "problem_rng": problem_rng.getstate(), "args": vars(args),
             "surplus_qs": buffer[0], "surplus": buffer[1], "rule_state": rule_state or {}}
    write = (lambda path: lora.save(path, adapters, tokenizer, base, base_identity)) if adapters else None  # noqa
    final, prev = os.path.join(run_dir, CHECKPOINT), os.path.join(run_dir, PREVIOUS)
    tmp = os.path.join(run_dir, TMP)
    # what save() removes before it writes: a checkpoint.tmp a kill left, and the older one when the last is whole
    freed = sum(folder_bytes(x) for x in ((tmp, prev) if _intact(final) else (tmp,)) if os.path.isdir(x))
    check_room(run_dir, checkpoint_bytes(model, optimizer, adapters) + tensor_bytes(rule_state),
               f"the checkpoint of step {step}", freed, f"; {_last(final)}")
    save(run_dir, model, tokenizer, state, write=write)


def restore_run(state: dict, optimizer, scheduler, problem_rng, device: str) -> tuple:
    """What save_run saved, put back into a run's optimizer, scheduler and RNGs; returns (the step, D2's buffer with
    its tensors on `device`)."""
    how = [(g.get("fused"), g.get("foreach")) for g in optimizer.param_groups]
    optimizer.load_state_dict(state["optimizer"])
    # the loaded groups say how the saving run's AdamW ran (not fused before 2026-11-26): this run's way is kept
    for group, (fused, foreach) in zip(optimizer.param_groups, how):
        group.update(fused=fused, foreach=foreach)
        for p in group["params"] if fused else ():  # fused AdamW keeps its step count beside the weight, float32
            if "step" in optimizer.state.get(p, {}):
                optimizer.state[p]["step"] = optimizer.state[p]["step"].to(device=p.device, dtype=torch.float32)
    torch.set_rng_state(state["torch_rng"])
    problem_rng.setstate(state["problem_rng"])
    scheduler.load_state_dict(state["scheduler"])
    batches = [{k: v.to(device) if torch.is_tensor(v) else v for k, v in b.items()} for b in state.get("surplus", [])]
    return state["step"], (state.get("surplus_qs", []), batches)


def restore_rule_state(state: dict, device: str) -> dict:
    """The token rule's state that save_run kept (Context.state; {} from a checkpoint before it), its tensors on
    `device`."""
    def to(x):
        return x.to(device) if torch.is_tensor(x) else {k: to(v) for k, v in x.items()} if isinstance(x, dict) else x
    return to(state.get("rule_state", {}))


def tensor_bytes(obj) -> int:
    """The bytes of the tensors in obj (a tensor, or dicts of them; anything else counts 0)."""
    if torch.is_tensor(obj):
        return obj.numel() * obj.element_size()
    return sum(tensor_bytes(v) for v in obj.values()) if isinstance(obj, dict) else 0


def _write(path: str, model, tokenizer, state: dict, write=None):
    """A complete checkpoint directory at path: the model, the tokenizer (or what write(path) writes), state.pt, and
    last the manifest of every file below path."""
    if write is None:
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    else:
        write(path)
    torch.save(state, os.path.join(path, "state.pt"))
    files = sorted(os.path.relpath(os.path.join(d, n), path) for d, _, names in os.walk(path) for n in names)
    usual_modes(path)
    manifest = {"step": state["step"],
                "files": {n: {"bytes": os.path.getsize(os.path.join(path, n)),
                              "sha256": _sha256(os.path.join(path, n))} for n in files}}
    with open(os.path.join(path, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


# The names of what a checkpoint's writers put in its folder (transformers' model and tokenizer, peft's adapter and
# the card it writes beside it, state.pt, the manifest), and of a heat map page: what discard() may remove where no
# manifest lists the files (a checkpoint.tmp a kill left behind, the heatmaps folder).
WRITTEN = ("config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json", "tokenizer*",
           "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja",
           "state.pt", MANIFEST, "adapter_config.json", lora.BASE_FILE, "README.md", "step*.html")


def ours(path: str):
    """A test of the files below the folder `path` that this run wrote (by their path relative to it): those its
    manifest lists, and the manifest, where it has a readable one (a checkpoint); where it has none (a checkpoint.tmp
    a kill left unfinished, the heat maps), those named as the writers name them (WRITTEN). A model card or notes
    a user put into a checkpoint are not the run's, however they are named."""
    listed = (read_json(os.path.join(path, MANIFEST)) or {}).get("files")
    if isinstance(listed, dict):
        return lambda rel: rel in listed or rel == MANIFEST
    tracker = track.TRACKERS.get(os.path.basename(os.path.normpath(path)))
    if tracker is not None:  # a tracker's folder (--report-to): what it writes at its top, and everything below that
        return lambda rel: any(fnmatch.fnmatch(rel.split(os.sep)[0], w) for w in tracker.writes)
    return lambda rel: any(fnmatch.fnmatch(os.path.basename(rel), w) for w in WRITTEN)


def _entries(d: str, dirs: list, names: list) -> list:
    """An os.walk step's files, and its links to folders (wandb's latest-run), which os.walk lists as folders but
    does not enter: removed as the files are."""
    return names + [n for n in dirs if os.path.islink(os.path.join(d, n))]


def foreign(path: str) -> list:
    """What lies below the folder `path` that this run did not write (ours), a run below it included."""
    mine, found = ours(path), []
    for d, dirs, names in os.walk(path, topdown=True):
        if d != path and is_run(d):
            found.append(d)
            dirs[:] = []
            continue
        found += [os.path.join(d, n) for n in _entries(d, dirs, names)
                  if not mine(os.path.relpath(os.path.join(d, n), path))]
    return found


def discard(path: str, strict: bool = True):
    """Remove a folder this run wrote (a checkpoint, the heat maps) without removing what it did not write (ours),
    then the folders left empty. Anything else (a run put there by hand, a file of another program, a user's notes)
    is left in place, and with strict the run stops in one line saying so, before it writes anything."""
    mine, kept = ours(path), foreign(path)
    try:
        for d, dirs, names in os.walk(path):
            for n in _entries(d, dirs, names):
                file = os.path.join(d, n)
                if mine(os.path.relpath(file, path)) and not any(file.startswith(k + os.sep) for k in kept):
                    os.remove(file)
        for d, _, _ in sorted(os.walk(path), key=lambda x: -len(x[0])):  # the deepest first
            if not os.listdir(d):
                os.rmdir(d)
    except OSError as e:  # a folder made read-only: one line, and what the run can still continue from
        fail(f"{path}: cannot be removed ({e.strerror or e}: {e.filename}); make it writable again, then --resume "
             f"({_last(os.path.join(os.path.dirname(path), CHECKPOINT))})")
    if kept and strict:
        more = f" and {len(kept) - 1} more" if len(kept) > 1 else ""
        fail(f"{path}: holds what this run did not write ({kept[0]}{more}), which it leaves in place; move it out "
             f"of the run's folder, then --resume")


def folder_bytes(path: str) -> int:
    """The bytes of the files below the folder `path` (or of the file `path`); a link takes none (wandb's debug.log
    links to a file counted where it lies)."""
    if not os.path.isdir(path):
        return os.lstat(path).st_size if os.path.isfile(path) and not os.path.islink(path) else 0
    return sum(os.lstat(os.path.join(d, n)).st_size for d, _, names in os.walk(path) for n in names
               if not os.path.islink(os.path.join(d, n)))


RUN_ADVICE = "free space, or choose another --run-dir (--save-every 0 --no-final-save saves nothing)"


def check_room(run_dir: str, need: int, what: str, freed: int = 0, then: str = "", advice: str = RUN_ADVICE):
    """Fail in one line if the disk under run_dir has less than `need` bytes free (plus `freed`, what goes before the
    write): said before the write, not as a traceback in it. what: the line's subject; then: what follows it."""
    there = os.path.abspath(run_dir)
    while not os.path.exists(there):
        there = os.path.dirname(there)
    free = shutil.disk_usage(there).free + freed
    if need > free:
        fail(f"{what} take{'s' * (not what.endswith('s'))} about {need / 2 ** 30:.2f} GiB and {free / 2 ** 30:.2f} "
             f"GiB are free there: {advice}{then}")


def held_bytes(run_dir: str) -> int:
    """What the run's own files take now (all --overwrite clears: checkpoints, checkpoint.prev, a checkpoint.tmp a kill
    left, metrics.jsonl, heat maps, trackers' folders): the plan (memory.disk_plan) counts the whole run's, from
    step 0, and a resumed run replaces these as it goes (an overwritten one deletes them), so they are room it has."""
    return sum(folder_bytes(os.path.join(run_dir, n)) for n in CLEARED if os.path.exists(os.path.join(run_dir, n)))


def checkpoint_bytes(model, optimizer, adapters=None) -> int:
    """What a checkpoint of this run takes: the weights (under LoRA the adapters), AdamW's two moments of what
    trains, and room for the tokenizer and the rest (32 MiB)."""
    trained = sum(p.numel() * 4 for group in optimizer.param_groups for p in group["params"])
    weights = trained if adapters else sum(p.numel() * p.element_size() for p in model.parameters())
    return weights + 2 * trained + 32 * 2 ** 20


def usual_modes(path: str):
    """Every file below the folder `path` given the mode any other file of the user has (0666 less the umask):
    safetensors writes its weights 0600, which another user of a shared model or run folder then cannot read.
    Used on everything the project writes a model into (checkpoints, tools.merge's and TRL's outputs, converted
    models)."""
    mode = 0o666 & ~_umask()
    for d, _, names in os.walk(path):
        for n in names:
            os.chmod(os.path.join(d, n), mode)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _swap_in(run_dir: str):
    """The complete checkpoint.tmp becomes `checkpoint`, and `checkpoint` becomes checkpoint.prev; a damaged
    `checkpoint` (the run resumed from checkpoint.prev) goes instead, so that prev stays the last complete one."""
    final, prev, tmp = (os.path.join(run_dir, n) for n in (CHECKPOINT, PREVIOUS, TMP))
    if _intact(final):
        if os.path.isdir(prev):
            discard(prev)
        os.replace(final, prev)
    elif os.path.isdir(final):
        discard(final)
    os.replace(tmp, final)


def _intact(path: str) -> bool:
    """A checkpoint directory whose manifest is readable and whose files have the sizes it lists: problem()'s
    checks but the checksums, which would read every byte of a large model at each save."""
    files = (read_json(os.path.join(path, MANIFEST)) or {}).get("files") if os.path.isdir(path) else None
    try:
        return isinstance(files, dict) and all(os.path.getsize(os.path.join(path, n)) == e["bytes"]
                                               for n, e in files.items())
    except (OSError, TypeError, KeyError):
        return False


def last_saved(run_dir: str) -> str:
    """What --resume would continue from (one line), said when a run stops early."""
    return _last(os.path.join(run_dir, CHECKPOINT))


def _last(final: str) -> str:
    """What --resume would continue from, said after a failed save."""
    step = (read_json(os.path.join(final, MANIFEST)) or {}).get("step") if os.path.isdir(final) else None
    return f"{final} (step {step}) is intact: --resume continues from it" if step is not None else \
        "no earlier checkpoint was saved"


def problem(path: str, skip: tuple = ()):
    """Why the checkpoint directory `path` cannot be resumed from (one line), or None if it is complete. skip: files
    not checked (state.pt, where only the model is read)."""
    manifest = read_json(os.path.join(path, MANIFEST))
    if manifest is None and os.path.isfile(os.path.join(path, MANIFEST)) and not readable(os.path.join(path, MANIFEST)):
        return f"{os.path.join(path, MANIFEST)}: cannot be read (permissions?)"
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(isinstance(e, dict) and {"bytes", "sha256"} <= e.keys()
                                              for e in files.values()):
        return f"{path}: no readable {MANIFEST} (incomplete: the run was killed while saving?)"
    for name, expect in files.items():
        file = os.path.join(path, name)
        if name in skip:
            continue
        if not os.path.isfile(file):
            return f"{file}: missing"
        # a size or checksum that differs says only that the file changed: cut short, damaged, or edited by hand
        if os.path.getsize(file) != expect["bytes"]:
            return (f"{file}: changed since it was saved ({os.path.getsize(file)} bytes, {expect['bytes']} when "
                    f"saved){changed_advice(path, name)}")
        try:
            digest = _sha256(file)
        except OSError as e:  # there, but not readable (permissions): not "missing", not "damaged"
            return f"{file}: cannot be read ({e.strerror or e})"
        if digest != expect["sha256"]:
            return f"{file}: its contents changed since it was saved (SHA-256 differs){changed_advice(path, name)}"
    return None


def changed_advice(path: str, name: str) -> str:
    """What to do about a checkpoint file changed since its save, where more can be said than that it changed: a LoRA
    checkpoint's adapter_config.json is edited by hand to point the adapters at a base that moved, which no
    supported way does (the manifest holds the file as saved, and lora.BASE_FILE the base's weights)."""
    if name != lora.ADAPTER_CONFIG:
        return ""
    saved = read_json(os.path.join(path, lora.BASE_FILE))
    where = saved.get("base") if isinstance(saved, dict) and isinstance(saved.get("base"), str) else None
    return (f"; the adapters cannot be pointed at a base moved elsewhere: put the base back"
            f"{f' at {where}' if where else ''} and restore {name} as saved (the run's checkpoint.prev holds one)")


def readable(path: str) -> bool:
    try:
        with open(path, "rb"):
            return True
    except OSError:
        return False


def find(run_dir: str) -> str:
    """The checkpoint to resume from: a complete checkpoint.tmp (a kill, or a failed rename, between save()'s two
    renames: the newest), else `checkpoint` if it is complete, else `checkpoint.prev` (the one saved before).
    Exits with one line naming each damaged candidate if none is usable."""
    check_layout(run_dir)
    tmp = os.path.join(run_dir, TMP)
    if os.path.isdir(tmp) and problem(tmp) is None:
        return tmp
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


def load_state(path: str, mmap: bool = False) -> dict:
    """state.pt of a checkpoint that find() accepted (torch.load of a file we wrote ourselves); mmap: its tensors
    are read only when used."""
    try:
        state = torch.load(os.path.join(path, "state.pt"), weights_only=False, map_location="cpu", mmap=mmap)
    except Exception as e:  # unpickling a damaged file can raise almost anything
        fail(f"--resume: {os.path.join(path, 'state.pt')} cannot be read: {_first_line(e)}")
    if not isinstance(state, dict):
        fail(f"--resume: {os.path.join(path, 'state.pt')} is not a train.py state")
    return state
