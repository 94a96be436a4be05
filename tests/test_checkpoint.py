"""checkpoint.py and train.py's guards: nothing lost to a kill, a damaged file, a second run or a NaN."""
import copy
import shutil
import errno
import gc
import json
import os
import subprocess
import random
import sys

import pytest
import torch

from config import training
import grpo
import reward
import train
from infra import checkpoint, files, guard, logbook
from conftest import assert_close

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--prompts-per-step", "4", "--group-size", "4", "--eval-limit", "16", "--eval-every", "1000"]


def read(path):
    return [json.loads(line) for line in open(path)]


def steps_of(run_dir):
    return [(r["step"], r["reward_mean"], r["response_len"]) for r in read(os.path.join(run_dir, "metrics.jsonl"))
            if "reward_mean" in r]


def refused(argv) -> str:
    """train.main(argv)'s one-line exit message. Its traceback, and with it the run's lock, goes with this frame,
    as when a process exits."""
    with pytest.raises(SystemExit) as e:
        train.main(argv)
    message = str(e.value.code)
    del e
    gc.collect()
    return message


class Killed(BaseException):
    """Stands for a kill -9 at that point: nothing after it runs (BaseException, so no handler catches it)."""


def kill_at_replace(monkeypatch, n):
    """Make the n-th directory swap of checkpoint.save (os.replace of checkpoint or checkpoint.tmp) die before it
    happens."""
    calls = {"n": 0}
    real = os.replace

    def replace(src, dst):
        if os.path.basename(src) not in (checkpoint.CHECKPOINT, checkpoint.TMP):  # run.json, metrics.jsonl
            return real(src, dst)
        calls["n"] += 1
        if calls["n"] == n:
            raise Killed(f"killed before {src} -> {dst}")
        return real(src, dst)
    monkeypatch.setattr(checkpoint.os, "replace", replace)


# ---- the swap -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kill_at", [1, 2])  # 1: before the old checkpoint moves aside; 2: before the new one moves in
def test_a_kill_during_the_swap_keeps_a_checkpoint_to_resume_from(base, tmp_path, monkeypatch, kill_at):
    full, run_dir = str(tmp_path / "full"), str(tmp_path / "killed")
    train.main(["--steps", "4", "--save-every", "2", "--run-dir", full, *SMALL])
    train.main(["--steps", "2", "--save-every", "2", "--run-dir", run_dir, *SMALL])
    with monkeypatch.context() as m:
        kill_at_replace(m, kill_at)
        with pytest.raises(Killed):  # the step-4 checkpoint's swap dies halfway
            train.main(["--steps", "4", "--save-every", "2", "--resume", "--run-dir", run_dir, *SMALL])
    names = sorted(os.listdir(run_dir))
    # kill_at 1: checkpoint (step 2) untouched; kill_at 2: it moved to checkpoint.prev; the new one is complete in tmp
    assert ("checkpoint" in names) == (kill_at == 1) and ("checkpoint.prev" in names) == (kill_at == 2)
    found = checkpoint.find(run_dir)
    assert found.endswith("checkpoint.tmp") and checkpoint.load_state(found)["step"] == 4  # not left unused
    train.main(["--steps", "4", "--save-every", "2", "--resume", "--run-dir", run_dir, *SMALL])
    assert steps_of(run_dir) == steps_of(full)  # same problems, same rewards as the run never killed
    assert sorted(os.listdir(run_dir)) == sorted(os.listdir(full))  # the swap finished: tmp is gone
    assert [checkpoint.load_state(os.path.join(run_dir, n))["step"] for n in ("checkpoint", "checkpoint.prev")] == \
        [4, 2]


def test_a_kill_while_writing_the_new_checkpoint_leaves_the_old_one(base, tmp_path, monkeypatch):
    model, tok = base
    run_dir = str(tmp_path)
    checkpoint.save(run_dir, model, tok, {"step": 1})
    with monkeypatch.context() as m:
        m.setattr(checkpoint.torch, "save", lambda *a, **k: (_ for _ in ()).throw(Killed()))
        with pytest.raises(Killed):
            checkpoint.save(run_dir, model, tok, {"step": 2})
    assert checkpoint.find(run_dir) == os.path.join(run_dir, "checkpoint")
    assert checkpoint.load_state(checkpoint.find(run_dir))["step"] == 1


# ---- a full disk, a folder that cannot be written ------------------------------------------------------------------

def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class SafetensorError(Exception):
    """What safetensors raises on a full disk (not an OSError)."""


def fail_at_second(real, error):
    """real, failing with `error` from its second call on (the step-4 save of a run saving every 2 steps)."""
    calls = {"n": 0}

    def writer(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] >= 2:
            raise type(error)(*error.args)  # a new one: a raised one keeps the run's frames (and its lock) alive
        return real(*args, **kwargs)
    return writer


@pytest.mark.parametrize("writer, error", [
    ("torch.save", RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")),
    ("model", SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")),
    ("tokenizer", OSError(errno.ENOSPC, "No space left on device")),
])
def test_a_full_disk_at_a_save_is_one_line_and_keeps_the_last_checkpoint(base, tmp_path, monkeypatch, writer,
                                                                           error):
    run_dir = str(tmp_path / "run")
    with monkeypatch.context() as m:
        if writer == "torch.save":
            m.setattr(checkpoint.torch, "save", fail_at_second(torch.save, error))
        else:
            cls = type(base[0]) if writer == "model" else type(base[1])
            m.setattr(cls, "save_pretrained", fail_at_second(cls.save_pretrained, error))
        message = refused(["--steps", "4", "--save-every", "2", "--run-dir", run_dir, *SMALL])
    assert "\n" not in message and "the checkpoint of step 4 could not be written" in message
    assert message.endswith(f"{run_dir}/checkpoint (step 2) is intact: --resume continues from it")
    assert sorted(os.listdir(run_dir)) == [".lock", "checkpoint", "metrics.jsonl", "run.json"]  # no half-written tmp
    train.main(["--steps", "4", "--save-every", "2", "--resume", "--run-dir", run_dir, *SMALL])
    assert checkpoint.load_state(checkpoint.find(run_dir))["step"] == 4


def test_a_checkpoint_folder_made_unwritable_fails_at_the_next_save_in_one_line(base, tmp_path, monkeypatch):
    run_dir = str(tmp_path / "run")
    real = os.replace

    def replace(src, dst):  # as a chmod of checkpoint/ by another user does (root is not stopped by permissions)
        if os.path.basename(src) == checkpoint.CHECKPOINT:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), src)
        return real(src, dst)
    with monkeypatch.context() as m:
        m.setattr(checkpoint.os, "replace", replace)
        message = refused(["--steps", "4", "--save-every", "2", "--run-dir", run_dir, *SMALL])
    assert message == (f"{run_dir}/checkpoint: the checkpoint of step 4 is complete in {run_dir}/"
                                 f"checkpoint.tmp but could not be moved in (Permission denied); --resume takes it "
                                 f"from there")
    train.main(["--steps", "4", "--save-every", "2", "--resume", "--run-dir", run_dir, *SMALL])  # nothing to redo
    assert [checkpoint.load_state(os.path.join(run_dir, n))["step"] for n in ("checkpoint", "checkpoint.prev")] == \
        [4, 2]


def test_ctrl_c_is_one_line_that_says_what_resume_takes(base, tmp_path, monkeypatch):
    run_dir = str(tmp_path / "run")
    real, calls = train.sample_round, {"n": 0}

    def interrupted_third(*args, **kwargs):  # Ctrl-C while step 3 samples
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)
    with monkeypatch.context() as m:
        m.setattr(train, "sample_round", interrupted_third)
        message = refused(["--steps", "4", "--save-every", "2", "--run-dir", run_dir, *SMALL])
    assert message == f"interrupted during step 3: {run_dir}/checkpoint (step 2) is intact: --resume continues from it"
    train.main(["--steps", "4", "--save-every", "2", "--resume", "--run-dir", run_dir, *SMALL])
    assert [s[0] for s in steps_of(run_dir)] == [1, 2, 3, 4]


def test_a_full_disk_at_a_metrics_line_is_one_line(base, tmp_path, monkeypatch):
    run_dir = str(tmp_path / "run")
    train.main(["--steps", "1", "--save-every", "1", "--run-dir", run_dir, *SMALL])
    metrics = os.path.join(run_dir, "metrics.jsonl")
    before = open(metrics).read()
    monkeypatch.setattr(checkpoint, "open", lambda path, mode="r", *a, **k: no_space() if mode == "a" else
                        open(path, mode, *a, **k), raising=False)  # shadows the builtin inside checkpoint.py
    with pytest.raises(SystemExit) as e:
        train.main(["--steps", "2", "--resume", "--run-dir", run_dir, *SMALL])
    assert str(e.value.code) == (f"{metrics}: cannot append the record of step 2 (No space left on device); "
                                 f"{os.path.join(run_dir, 'checkpoint')} (step 1) is intact: --resume continues "
                                 f"from it")
    assert open(metrics).read() == before


@pytest.mark.parametrize("where", ["a file", "under a file", "a read-only parent"])
def test_a_run_directory_that_cannot_be_written_fails_before_the_model_loads(tmp_path, monkeypatch, where):
    monkeypatch.setattr(train.models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    (tmp_path / "file").write_text("x")
    run_dir = {"a file": tmp_path / "file", "under a file": tmp_path / "file" / "run",
               "a read-only parent": tmp_path / "ro" / "run"}[where]
    if where == "a read-only parent":  # root ignores a chmod: the mkdir fails as it would there
        monkeypatch.setattr(checkpoint.os, "mkdir", lambda path, *a: (_ for _ in ()).throw(
            PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)))
    with pytest.raises(SystemExit) as e:
        train.main(["--steps", "1", "--run-dir", str(run_dir), *SMALL])
    expect = {"a file": f"{tmp_path}/file is a file, not a folder", "under a file": f"{tmp_path}/file is a file, "
              f"not a folder", "a read-only parent": "cannot write there (Permission denied)"}[where]
    assert str(e.value.code) == f"--run-dir {run_dir}: {expect}"
    assert sorted(os.listdir(tmp_path)) == ["file"]  # nothing left behind


# ---- damaged files --------------------------------------------------------------------------------------------------

def damaged(base, tmp_path, how):
    model, tok = base
    run_dir = str(tmp_path)
    checkpoint.save(run_dir, model, tok, {"step": 3})
    ckpt = os.path.join(run_dir, "checkpoint")
    how(ckpt)
    return run_dir, ckpt


def truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def flip_a_byte(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))


@pytest.mark.parametrize("how, expect", [
    (lambda c: truncate(os.path.join(c, "state.pt")), "state.pt: "),
    (lambda c: truncate(os.path.join(c, "model.safetensors")), "changed since it was saved ("),
    (lambda c: flip_a_byte(os.path.join(c, "model.safetensors")), "contents changed since it was saved"),
    (lambda c: os.remove(os.path.join(c, "tokenizer.json")), "tokenizer.json: missing"),
    (lambda c: os.remove(os.path.join(c, "manifest.json")), "incomplete"),
])
def test_a_damaged_checkpoint_is_refused_in_one_line(base, tmp_path, capsys, how, expect):
    run_dir, ckpt = damaged(base, tmp_path, how)
    with pytest.raises(SystemExit) as e:
        checkpoint.find(run_dir)
    message = str(e.value.code)
    assert "\n" not in message and message.startswith("--resume: no usable checkpoint") and expect in message


def test_a_damaged_checkpoint_falls_back_to_the_previous_one(base, tmp_path, capsys):
    model, tok = base
    older, run_dir = str(tmp_path / "older"), str(tmp_path / "run")
    checkpoint.save(older, model, tok, {"step": 3})
    checkpoint.save(run_dir, model, tok, {"step": 4})
    # as a kill mid-swap leaves it
    os.rename(os.path.join(older, "checkpoint"), os.path.join(run_dir, "checkpoint.prev"))
    truncate(os.path.join(run_dir, "checkpoint", "state.pt"))
    assert checkpoint.find(run_dir) == os.path.join(run_dir, "checkpoint.prev")
    assert "state.pt" in capsys.readouterr().out


def test_the_previous_checkpoint_is_kept_after_every_save(base, tmp_path, capsys):
    model, tok = base
    run_dir = str(tmp_path)
    for step in (1, 2, 3):
        checkpoint.save(run_dir, model, tok, {"step": step})
        assert checkpoint.load_state(os.path.join(run_dir, "checkpoint"))["step"] == step
        assert step == 1 or checkpoint.load_state(os.path.join(run_dir, "checkpoint.prev"))["step"] == step - 1
    assert sorted(os.listdir(run_dir)) == ["checkpoint", "checkpoint.prev"]  # two at rest, never more
    flip_a_byte(os.path.join(run_dir, "checkpoint", "model.safetensors"))
    assert checkpoint.load_state(checkpoint.find(run_dir))["step"] == 2
    assert "model.safetensors: its contents changed" in capsys.readouterr().out
    # resumed from step 2 because step 3 is damaged (truncated: a save sees that much without reading every byte)
    truncate(os.path.join(run_dir, "checkpoint", "state.pt"))
    checkpoint.save(run_dir, model, tok, {"step": 4})  # the damaged one goes, the complete one stays the previous
    assert [checkpoint.load_state(os.path.join(run_dir, n))["step"] for n in ("checkpoint", "checkpoint.prev")] == \
        [4, 2]


def nan_model(base, where):
    """The tiny base model saved to `where` with one NaN weight."""
    model, tok = base
    broken = type(model)(model.config)
    broken.load_state_dict(model.state_dict())
    with torch.no_grad():
        broken.model.norm.weight[0] = float("nan")
    broken.save_pretrained(where)
    tok.save_pretrained(where)
    return str(where)


def test_weights_that_are_not_finite_are_refused(base, tmp_path):
    path = nan_model(base, tmp_path / "nan")
    with pytest.raises(SystemExit) as e:  # the base model, before a step samples from it
        train.main(["--model", path, "--steps", "1", "--run-dir", str(tmp_path / "run"), *SMALL])
    assert str(e.value.code) == f"--model {path}: parameter model.norm.weight holds NaN or infinite values"
    run_dir = str(tmp_path / "resumed")  # and a checkpoint, on resume
    train.main(["--steps", "1", "--run-dir", run_dir, *SMALL])
    os.replace(os.path.join(path, "model.safetensors"), os.path.join(run_dir, "checkpoint", "model.safetensors"))
    manifest = json.load(open(os.path.join(run_dir, "checkpoint", "manifest.json")))
    saved = os.path.join(run_dir, "checkpoint", "model.safetensors")  # as if it had been saved so: its size and
    manifest["files"]["model.safetensors"] = {"bytes": os.path.getsize(saved),  # checksum in the manifest
                                              "sha256": checkpoint._sha256(saved)}
    json.dump(manifest, open(os.path.join(run_dir, "checkpoint", "manifest.json"), "w"))
    with pytest.raises(SystemExit) as e:
        train.main(["--steps", "2", "--resume", "--run-dir", run_dir, *SMALL])
    assert str(e.value.code).endswith("checkpoint: parameter model.norm.weight holds NaN or infinite values")


def test_a_manifest_or_run_json_of_the_wrong_shape_is_one_line(base, tmp_path):
    model, tok = base
    run_dir = str(tmp_path)
    checkpoint.save(run_dir, model, tok, {"step": 1})
    with open(os.path.join(run_dir, "checkpoint", "manifest.json"), "w") as f:
        f.write("[]")  # JSON, but not a manifest
    with pytest.raises(SystemExit) as e:
        checkpoint.find(run_dir)
    assert str(e.value.code).startswith("--resume: no usable checkpoint") and "no readable manifest.json" in \
        str(e.value.code)
    with open(os.path.join(run_dir, "run.json"), "w") as f:
        f.write("[1]")
    args = training.parse_args(["--run-dir", run_dir])
    with pytest.raises(SystemExit) as e:
        checkpoint.check(run_dir, args, resume=False, overwrite=False)
    # its one checkpoint is damaged: the line does not promise a --resume that would fail
    assert str(e.value.code).startswith(f"--run-dir {run_dir} holds a run: it has no checkpoint --resume could "
                                        f"continue from; --overwrite")


def test_metrics_survive_a_partial_last_line_and_a_missing_file(base, tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    train.main(["--steps", "2", "--save-every", "2", "--run-dir", run_dir, *SMALL])
    metrics = os.path.join(run_dir, "metrics.jsonl")
    with open(metrics, "a") as f:
        f.write('{"step": "abc"}\n{"step": null}\n{"step": 3, "reward_me')  # hand edits; a kill mid-write
    train.main(["--steps", "3", "--save-every", "2", "--resume", "--run-dir", run_dir, *SMALL])
    # lines 1-4: the evaluation at step 0, steps 1 and 2, the evaluation at step 2; lines 5-7 the bad ones
    out = capsys.readouterr().out
    assert all(f"metrics.jsonl:{i}: not a complete JSON line" in out for i in (5, 6, 7))
    assert [r["step"] for r in read(metrics) if "reward_mean" in r] == [1, 2, 3]
    os.remove(metrics)
    first, last = train.main(["--steps", "4", "--save-every", "2", "--resume", "--run-dir", run_dir, *SMALL])
    assert first is None and last is not None  # the step-0 evaluation went with the file: said, not invented
    assert [r["step"] for r in read(metrics) if "reward_mean" in r] == [4]


@pytest.mark.parametrize("flags, saved", [(["--lr", "1e-3"], "--lr 5e-05"), (["--eval-limit", "8"], "--eval-limit 16"),
                                          (["--eval-dataset", "chain"], "--eval-dataset tiny"),
                                          (["--steps", "1"], "step 2, past --steps 1"),
                                          # every setting that defines the run, not a list of a few: the sampling
                                          # temperature, the KL weight, the grader, a rule's knob
                                          (["--temperature", "0.7"], "--temperature 1.0, not 0.7"),
                                          (["--beta", "0.01"], "--beta 0.0, not 0.01"),
                                          (["--grader", "length-parity"], "--grader math, not length-parity"),
                                          (["--no-std-scale"], "--no-std-scale False, not True")])
def test_resume_refuses_what_it_would_not_honour(base, tmp_path, flags, saved):
    # --lr: the optimizer's saved state kept the old rate while run.json said the new; another held-out set made
    # "before -> after" compare two sets; fewer --steps than done ended "finished" without a word
    run_dir = str(tmp_path / "run")
    train.main(["--steps", "2", "--save-every", "2", "--run-dir", run_dir, *SMALL])
    before = open(os.path.join(run_dir, "run.json")).read()
    message = refused(["--steps", "3", "--resume", "--run-dir", run_dir, *SMALL, *flags])
    assert message.startswith("--resume: ") and saved in message and "\n" not in message
    assert open(os.path.join(run_dir, "run.json")).read() == before


def test_resume_takes_what_changes_only_speed_logging_or_length(base, tmp_path):
    run_dir = str(tmp_path / "run")
    train.main(["--steps", "1", "--save-every", "1", "--run-dir", run_dir, *SMALL])
    train.main(["--steps", "2", "--resume", "--run-dir", run_dir, "--threads", "1", "--micro-batch-size", "8",
                "--eval-every", "5", *SMALL[:-2]])
    assert json.load(open(os.path.join(run_dir, "run.json")))["args"]["steps"] == 2
    assert {"steps", "threads", "micro_batch_size", "eval_every"} <= set(checkpoint.MAY_CHANGE_ON_RESUME)
    assert checkpoint.defines_the_run("temperature") and not checkpoint.defines_the_run("threads")


# ---- one run per directory ------------------------------------------------------------------------------------------

def test_a_new_run_refuses_a_directory_holding_a_run(base, tmp_path):
    run_dir = str(tmp_path / "run")
    train.main(["--steps", "1", "--run-dir", run_dir, *SMALL])
    before = open(os.path.join(run_dir, "metrics.jsonl")).read()
    with pytest.raises(SystemExit) as e:
        train.main(["--steps", "1", "--run-dir", run_dir, *SMALL])
    assert "holds a finished grpo run" in str(e.value.code) and "--overwrite" in str(e.value.code)
    assert open(os.path.join(run_dir, "metrics.jsonl")).read() == before  # nothing deleted
    with pytest.raises(SystemExit) as e:
        train.main(["--method", "ktae", "--steps", "2", "--resume", "--run-dir", run_dir, *SMALL])
    assert str(e.value.code).startswith(f"--resume: {run_dir} is a run with --method grpo, not ktae")
    train.main(["--method", "ktae", "--steps", "1", "--overwrite", "--run-dir", run_dir, *SMALL])
    assert json.load(open(os.path.join(run_dir, "run.json")))["method"] == "ktae"
    assert len([r for r in read(os.path.join(run_dir, "metrics.jsonl")) if "reward_mean" in r]) == 1


def test_overwrite_refuses_to_delete_the_model_it_starts_from(base, tmp_path):
    run_dir = str(tmp_path / "run")
    train.main(["--steps", "1", "--run-dir", run_dir, *SMALL])
    model = os.path.join(run_dir, "checkpoint")
    manifest = open(os.path.join(model, "manifest.json")).read()
    message = refused(["--model", model + "/", "--steps", "1", "--overwrite", "--run-dir", run_dir, *SMALL])
    assert message == (f"--model {model}/ lies in {os.path.realpath(model)}, which --overwrite would delete: copy it "
                       f"elsewhere first, or choose another --run-dir")
    assert open(os.path.join(model, "manifest.json")).read() == manifest  # nothing deleted


@pytest.mark.parametrize("damage", ["deleted", "{broken", "[]"])
def test_resume_without_a_readable_run_json_asks_the_checkpoint(base, tmp_path, damage):
    run_dir = str(tmp_path / "run")
    train.main(["--steps", "1", "--run-dir", run_dir, *SMALL])
    info = os.path.join(run_dir, "run.json")
    os.remove(info) if damage == "deleted" else open(info, "w").write(damage)
    message = refused(["--method", "ktae", "--steps", "2", "--resume", "--run-dir", run_dir, *SMALL])
    assert message.startswith(f"--resume: {run_dir} is a run with --method grpo, not ktae")
    assert os.path.exists(info) == (damage != "deleted") and (damage == "deleted" or open(info).read() == damage)
    train.main(["--steps", "2", "--resume", "--run-dir", run_dir, *SMALL])  # the same method continues
    assert json.load(open(info))["method"] == "grpo" and steps_of(run_dir)[-1][0] == 2


def test_two_runs_started_together_into_one_directory_one_refuses(tmp_path):
    # both checked the empty directory before either claimed it (each was loading its model)
    run_dir = str(tmp_path / "run")
    first, second = (training.parse_args(["--run-dir", run_dir, "--method", m]) for m in ("grpo", "ktae"))
    for args in (first, second):
        checkpoint.check(run_dir, args, resume=False, overwrite=False)
    lock = checkpoint.claim(run_dir, first, resume=False, overwrite=False)
    with pytest.raises(SystemExit) as e:  # the first is still writing
        checkpoint.claim(run_dir, second, resume=False, overwrite=False)
    assert "another run is writing there now" in str(e.value.code)
    checkpoint.append_metrics(os.path.join(run_dir, "metrics.jsonl"), {"step": 0, "eval_accuracy": 0.5})
    checkpoint.write_info(run_dir, first, finished=True)
    lock.close()  # the first has finished: the second must still not write into its directory
    with pytest.raises(SystemExit) as e:
        checkpoint.claim(run_dir, second, resume=False, overwrite=False)
    assert str(e.value.code).startswith(f"--run-dir {run_dir} holds a finished grpo run")
    assert json.load(open(os.path.join(run_dir, "run.json")))["method"] == "grpo"


def test_a_second_run_cannot_write_into_a_locked_directory(tmp_path):
    args = training.parse_args(["--run-dir", str(tmp_path)])
    lock = checkpoint.claim(str(tmp_path), args, resume=False, overwrite=False)
    with pytest.raises(SystemExit) as e:
        checkpoint.claim(str(tmp_path), args, resume=True, overwrite=False)
    assert "another run is writing there now" in str(e.value.code)
    lock.close()  # as when the first run ends or is killed
    checkpoint.claim(str(tmp_path), args, resume=True, overwrite=False).close()


# ---- a non-finite step never reaches the weights; metrics stay JSON --------------------------------------------------

# every update is skipped, so the schedule steps with no optimizer step before it and torch warns: expected here
@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step")
def test_a_nan_step_is_skipped_and_counted(base, tmp_path, monkeypatch):
    model, _ = base
    run_dir = str(tmp_path / "run")
    monkeypatch.setattr(grpo, "group_advantages", lambda r, **kw: torch.full_like(r, float("nan")))
    train.main(["--steps", "2", "--run-dir", run_dir, *SMALL])
    text = open(os.path.join(run_dir, "metrics.jsonl")).read()
    assert "NaN" not in text and "Infinity" not in text
    records = [json.loads(line) for line in text.splitlines()]  # strict JSON, every line
    steps = [r for r in records if "reward_mean" in r]
    assert [r["nonfinite_updates"] for r in steps] == [1, 1] and steps[0]["grad_norm"] is None
    saved = checkpoint.find(run_dir)
    state = checkpoint.load_state(saved)
    assert all(len(s) == 0 for s in state["optimizer"]["state"].values())  # AdamW never stepped
    from safetensors.torch import load_file
    weights = load_file(os.path.join(saved, "model.safetensors"))
    for name, p in model.state_dict().items():
        if name in weights:
            assert torch.equal(weights[name], p), name  # the weights are the base model's, untouched


@pytest.mark.parametrize("fused", [True, False])  # train.py's AdamW is fused; the guard holds for either
@pytest.mark.parametrize("lr, grad", [(1e-3, 1e30), (1e-3, -1e30), (1e39, 1.0)])
def test_an_update_that_overflows_is_undone_bit_for_bit(base, lr, grad, fused):
    # finite gradients all: (-)1e30 squared is past float32's 3.4e38 in AdamW's second moment; at lr 1e39 the step
    # size is (the unfused AdamW raises, after updating the moments in place)
    model = type(base[0])(base[0].config)
    model.load_state_dict(base[0].state_dict())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0, fused=fused)

    def step(lr, grad):
        optimizer.param_groups[0]["lr"] = lr
        for p in model.parameters():
            p.grad = torch.full_like(p, grad)
        return guard.step_if_finite(optimizer)
    before = copy.deepcopy(model.state_dict())
    assert not step(lr, grad)  # the first step: AdamW has no state yet, and must have none after
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()) and not optimizer.state
    assert step(1e-3, 1.0)  # a sane step is kept, moments and all
    kept = copy.deepcopy((model.state_dict(), optimizer.state_dict()))
    assert not step(lr, grad)
    assert all(torch.equal(kept[0][k], v) for k, v in model.state_dict().items())
    for i, state in optimizer.state_dict()["state"].items():
        assert all(torch.equal(kept[1]["state"][i][k], v) for k, v in state.items())  # the step count too


def test_the_guarded_step_reads_the_gradients_once(base, monkeypatch):
    # guard.step hands the norm it clipped by to step_if_finite as its bound on every |g| (an L2 norm is at least
    # the largest element), so the gradients are not read a second time (a 0.5B's are 494M floats)
    model = type(base[0])(base[0].config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.full_like(p, 1e-3)
    monkeypatch.setattr(guard.torch, "aminmax", lambda *a: pytest.fail("the gradients were read again"))
    norm, why = guard.step(model, optimizer, 1.0, torch.tensor(0.5))
    n = sum(p.numel() for p in model.parameters())
    assert why is None and optimizer.state and norm == pytest.approx(1e-3 * n ** 0.5, rel=1e-4)  # float32 sums


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step")
def test_a_run_whose_learning_rate_overflows_the_weights_keeps_them_finite(base, tmp_path, monkeypatch):
    real = torch.optim.AdamW  # --lr is at most 1; the guard must hold even where that check is bypassed
    monkeypatch.setattr(train.torch.optim, "AdamW", lambda params, **kw: real(params, **{**kw, "lr": 1e39}))
    run_dir = str(tmp_path / "run")
    train.main(["--steps", "2", "--warmup-steps", "0", "--run-dir", run_dir, *SMALL])
    steps = [r for r in read(os.path.join(run_dir, "metrics.jsonl")) if "reward_mean" in r]
    assert steps[0]["nonfinite_updates"] == 1  # (a step where every group agrees has no gradient, no update)
    from safetensors.torch import load_file
    weights = load_file(os.path.join(run_dir, "checkpoint", "model.safetensors"))
    assert all(torch.equal(weights[k], v) for k, v in base[0].state_dict().items() if k in weights)


def test_a_warning_given_before_a_kill_is_not_given_again(base, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(logbook, "DEGENERATE_WINDOW", 2)
    monkeypatch.setattr(reward, "is_correct", lambda *a, **k: False)  # every answer wrong: warned at step 2
    run_dir = str(tmp_path / "run")
    train.main(["--steps", "3", "--save-every", "1", "--run-dir", run_dir, *SMALL])
    train.main(["--steps", "5", "--save-every", "1", "--resume", "--run-dir", run_dir, *SMALL])
    warned = [r["step"] for r in read(os.path.join(run_dir, "metrics.jsonl")) if "warnings" in r]
    assert warned == [2] and capsys.readouterr().out.count("every sampled answer was wrong") == 1


def test_finite_or_none_writes_null_for_undefined_values():
    assert checkpoint.finite_or_none({"a": float("nan"), "b": float("inf"), "c": 0.5, "d": "x"}) == \
        {"a": None, "b": None, "c": 0.5, "d": "x"}


def test_write_json_is_whole_or_not_at_all(tmp_path, monkeypatch):
    path = str(tmp_path / "done.json")
    files.write_json(path, {"seed": 1})

    def killed_half_way(obj, f, **kw):  # a kill while writing: part of the text, then nothing more
        f.write('{"seed": ')
        raise KeyboardInterrupt

    monkeypatch.setattr(json, "dump", killed_half_way)
    with pytest.raises(KeyboardInterrupt):
        files.write_json(path, {"seed": 2})
    assert files.read_json(path) == {"seed": 1}  # the file before, not the half-written one
    monkeypatch.undo()
    files.write_json(path, {"seed": 2})
    assert files.read_json(path) == {"seed": 2}


def test_write_text_is_whole_or_not_at_all(tmp_path, monkeypatch):
    path = str(tmp_path / "findings.md")
    files.write_text(path, "the page\n")
    real_open = open

    def killed_half_way(name, mode="r", *a, **kw):  # a kill while writing: the file opened, then nothing more
        if "w" in mode:
            real_open(name, mode).write("the pa")
            raise KeyboardInterrupt
        return real_open(name, mode, *a, **kw)

    monkeypatch.setattr("builtins.open", killed_half_way)
    with pytest.raises(KeyboardInterrupt):
        files.write_text(path, "another page\n")
    monkeypatch.undo()
    assert real_open(path).read() == "the page\n"  # the file before, whole


def test_write_tensors_is_whole_or_not_at_all(tmp_path, monkeypatch):
    path = str(tmp_path / "rule_state.pt")
    files.write_tensors(path, {"w": torch.ones(2)})

    def killed_half_way(obj, f, *a, **kw):  # a kill while writing: some bytes, then nothing more
        open(f, "wb").write(b"PK\x03")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", killed_half_way)
    with pytest.raises(KeyboardInterrupt):
        files.write_tensors(path, {"w": torch.zeros(2)})
    monkeypatch.undo()
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.ones(2))  # the file before, whole


# ---- DAPO's empty steps still evaluate, save and watch the clock -----------------------------------------------------

def test_empty_dapo_steps_still_evaluate_save_and_stop(base, tmp_path, monkeypatch):
    monkeypatch.setattr(reward, "is_correct", lambda *a, **k: False)  # no group can mix right and wrong
    run_dir = str(tmp_path / "run")
    common = ["--method", "dapo", "--max-sampling-rounds", "1", "--prompts-per-step", "2", "--group-size", "2",
              "--eval-limit", "8"]
    train.main(["--steps", "3", "--eval-every", "2", "--save-every", "2", "--run-dir", run_dir, *common])
    records = read(os.path.join(run_dir, "metrics.jsonl"))
    assert [r["step"] for r in records if "no_update" in r] == [1, 2, 3]
    assert [r["step"] for r in records if "eval_accuracy" in r] == [0, 2, 3]
    assert checkpoint.load_state(checkpoint.find(run_dir))["step"] == 3
    timed = str(tmp_path / "timed")
    train.main(["--steps", "50", "--max-minutes", "0", "--run-dir", timed, *common])
    assert [r["step"] for r in read(os.path.join(timed, "metrics.jsonl")) if "eval_accuracy" in r] == [0, 1]


# ---- degenerate runs are named in the log ----------------------------------------------------------------------------

def test_degenerate_runs_are_warned_about():
    ok = {"accuracy": 0.4, "truncated": 0.0}
    n = logbook.DEGENERATE_WINDOW
    assert logbook.degenerate([ok] * (n - 1) + [{"accuracy": 0.0, "truncated": 0.0}]) == {}
    assert list(logbook.degenerate([{"accuracy": 0.0, "truncated": 0.0}] * n)) == ["all wrong"]
    assert list(logbook.degenerate([{"accuracy": 1.0, "truncated": 0.0}] * (n - 1))) == []  # not yet N steps
    assert list(logbook.degenerate([{"accuracy": 1.0, "truncated": 0.0}] * n)) == ["all right"]
    # truncation: a mean of 0.55 over the window is above the 0.5 threshold; 0.5 exactly is not
    assert list(logbook.degenerate([{"accuracy": 0.5, "truncated": 0.55}] * n)) == ["truncated"]
    assert logbook.degenerate([{"accuracy": 0.5, "truncated": 0.5}] * n) == {}


# ---- flags are checked before anything heavy runs --------------------------------------------------------------------

@pytest.mark.parametrize("flags, named", [
    (["--group-size", "1"], "--group-size 1"), (["--group-size", "0"], "--group-size 0"),
    (["--max-new-tokens", "0"], "--max-new-tokens 0"), (["--micro-batch-size", "0"], "--micro-batch-size 0"),
    (["--prompts-per-step", "0"], "--prompts-per-step 0"), (["--method", "oar-p", "--oar-q", "2"], "--oar-q 2.0"),
    (["--method", "ktae", "--ktae-alpha", "0", "--ktae-beta", "0"], "--ktae-alpha 0 --ktae-beta 0"),
    (["--lr", "nan"], "--lr: nan: not a finite number"), (["--temperature", "0"], "--temperature 0.0"),
    (["--mu", "0"], "--mu 0"),
    (["--overlong-buffer", "48"], "--overlong-buffer 48"), (["--resume", "--overwrite"], "--resume and --overwrite"),
    (["--dual-clip", "1"], "--dual-clip 1.0"), (["--method", "dapo+ktae", "--ktae-alpha", "0", "--ktae-beta", "0"],
                                               "--ktae-alpha 0 --ktae-beta 0"),
    # numbers that are not finite, or far outside any setting's range
    (["--lr", "inf"], "--lr: inf: not a finite number"), (["--lr", "1e400"], "--lr: 1e400: not a finite number"),
    (["--lr", "2"], "--lr 2.0: must be at most 1.0"), (["--temperature", "1e-40"], "--temperature 1e-40: must be at "
                                                                                  "least 0.001"),
    (["--grad-clip", "inf"], "--grad-clip: inf"), (["--beta", "nan"], "--beta: nan"),
    (["--eps-high", "inf"], "--eps-high: inf"), (["--max-minutes", "inf"], "--max-minutes: inf"),
    (["--ktae-top=-inf"], "--ktae-top: -inf"), (["--gpu-memory", "1e999"], "--gpu-memory: 1e999"),
    (["--seed", "-1"], "--seed -1: must be at least 0"), (["--seed", str(2 ** 70)], f"--seed {2 ** 70}"),
    # the shared flags (config.check_shared, evaluate.py's too)
    (["--device", "bogus"], "--device bogus: not a device torch knows"), (["--threads", "0"], "--threads 0"),
    (["--threads", "1000000"], "--threads 1000000: must be at least 1 and at most this machine's"),
    (["--run-dir", ""], "--run-dir '': empty"), (["--model", " "], "--model ' ': empty"),
])
def test_bad_flags_are_argparse_errors_naming_the_flag(capsys, flags, named):
    with pytest.raises(SystemExit) as e:
        training.parse_args(flags)
    assert e.value.code == 2 and named in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_a_cuda_device_on_a_machine_without_one_is_one_argparse_line(capsys):
    for flags in (["--device", "cuda"], ["--device", "cuda:1"]):
        with pytest.raises(SystemExit) as e:
            training.parse_args(flags)
        assert e.value.code == 2 and f"{flags[1]}: no CUDA device is visible" in capsys.readouterr().err


def run(*args, **env):
    return subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


def one_line(capsys, *args) -> str:
    """refused(args), once nothing else was written to stderr (no traceback, no warning): what `python train.py ARGS`
    prints, since sys.exit(line) prints its line and exits 1. A process of its own would cost seconds of imports for
    the same line (tests/test_train.py runs train.py as a process)."""
    capsys.readouterr()
    message = refused(list(args))
    assert "\n" not in message and capsys.readouterr().err.strip() == ""
    return message


def test_model_directories_without_a_model_are_one_line_and_leave_no_run_dir(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    (config_only / "config.json").write_text("{}")
    for model, expect in [(empty, "no config.json in this directory"), (config_only, "no weights")]:
        line = one_line(capsys, "--model", str(model), "--run-dir", str(tmp_path / "run"))
        assert line == f"--model {model}: {expect}" + (
            " (is it a Hugging Face model directory?)" if model == empty
            else " (*.safetensors or *.bin) in this directory")
        assert not (tmp_path / "run").exists()


def test_dry_run_with_an_unreachable_hub_name_is_one_line(tmp_path):
    r = run("--model", "no-such-owner/no-such-model", "--dry-run", HF_HUB_OFFLINE="1")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith("--model no-such-owner/no-such-model: not a local directory")


def test_a_missing_dataset_file_stops_before_anything_loads_and_a_dry_run_needs_none(tmp_path, capsys):
    missing = tmp_path / "nope.jsonl"
    for flag in ("--dataset", "--eval-dataset"):
        assert one_line(capsys, flag, str(missing), "--run-dir", str(tmp_path / "run")) == \
            f"{flag} {missing}: not found (no file {missing})"
        assert not (tmp_path / "run").exists()
    # the plan reads the model's config alone: a clone with no data beside it can still plan (the data's record
    # gives the prompt length, the default one for a file)
    train.main(["--dataset", str(missing), "--dry-run"])
    assert "peak:" in capsys.readouterr().out


# ---- nothing lost, round two (issue 41) --------------------------------------------------------------------------

@pytest.mark.parametrize("inside", ["checkpoint.prev/x", "checkpoint", "heatmaps/y", "notes"])
def test_a_run_folder_inside_another_run_is_refused(base, tmp_path, inside):
    # a run made in another run's checkpoint.prev was taken away with it by that run's next save
    outer = tmp_path / "outer"
    train.main(["--steps", "2", "--save-every", "1", "--run-dir", str(outer), *SMALL])
    inner = outer / inside
    message = refused(["--steps", "1", "--run-dir", str(inner), *SMALL])
    assert message == f"--run-dir {inner}: inside the run {outer} (its next save or --overwrite would take this " \
                      f"folder with it); choose a folder outside it"
    assert not (outer / "notes").exists()


def test_a_save_never_deletes_what_it_did_not_write(base, tmp_path):
    # something put by hand in checkpoint.prev (a run, a file): the next save stops in one line and leaves it; the last
    # checkpoint is intact and the run resumes once it is moved out
    run_dir = tmp_path / "run"
    train.main(["--steps", "2", "--save-every", "1", "--run-dir", str(run_dir), *SMALL])
    (run_dir / "checkpoint.prev" / "notes.txt").write_text("mine")
    message = refused(["--steps", "3", "--save-every", "1", "--resume", "--run-dir", str(run_dir), *SMALL])
    assert message.startswith(f"--resume: {run_dir / 'checkpoint.prev' / 'notes.txt'} is not of this run")
    assert (run_dir / "checkpoint.prev" / "notes.txt").read_text() == "mine"
    assert checkpoint.problem(str(run_dir / "checkpoint")) is None  # the last checkpoint is whole
    os.rename(run_dir / "checkpoint.prev" / "notes.txt", tmp_path / "notes.txt")
    train.main(["--steps", "3", "--save-every", "1", "--resume", "--run-dir", str(run_dir), *SMALL])
    assert json.load(open(run_dir / "checkpoint" / "manifest.json"))["step"] == 3


def test_the_disk_check_counts_the_logs_gives_true_advice_and_lets_a_resume_reuse_its_room(base, tmp_path,
                                                                                          monkeypatch):
    # issue 63: the check counted checkpoints only (a run saving none needed 0 bytes), advised "--resume continues
    # from the last checkpoint" where none was saved, and refused a --resume that needed less than was free (its own
    # checkpoints, replaced as it saves, counted as new)
    from infra import memory
    args = training.parse_args(["--save-every", "0", "--no-final-save", "--report-to", "none"])
    assert memory.disk_plan(base[0].config, args)["run"] > 0
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").mkdir()  # an append that fails
    with pytest.raises(SystemExit) as e:
        checkpoint.append_metrics(str(run_dir / "metrics.jsonl"), {"step": 1})
    assert "no earlier checkpoint was saved" in str(e.value.code) and "--resume continues" not in str(e.value.code)
    shutil.rmtree(run_dir)
    train.main(["--steps", "2", "--save-every", "1", "--run-dir", str(run_dir), *SMALL])
    plan = memory.disk_plan(base[0].config,
                            training.parse_args(["--steps", "3", "--save-every", "1", *SMALL]))["run"]
    held = checkpoint.held_bytes(str(run_dir))
    assert held > 0
    real = shutil.disk_usage
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: real(p)._replace(free=plan - held // 2))
    train.main(["--steps", "3", "--save-every", "1", "--resume", "--run-dir", str(run_dir), *SMALL])
    assert json.load(open(run_dir / "checkpoint" / "manifest.json"))["step"] == 3


def test_the_disk_check_counts_as_room_what_a_resume_or_overwrite_replaces(base, tmp_path, monkeypatch):
    # round four: a resume that fits was refused: a save counted as freed checkpoint.prev alone, though it removes a
    # checkpoint.tmp a kill left first; and the start's check counted the checkpoints alone of the run's own files
    # (its plan counts metrics.jsonl, heat maps and trackers' files from step 0), and nothing on --overwrite
    from infra import memory
    run_dir = tmp_path / "run"
    flags = ["--save-every", "1", "--run-dir", str(run_dir), *SMALL]
    train.main(["--steps", "2", *flags])
    (run_dir / "checkpoint.tmp").mkdir()  # a save killed midway (no manifest): the next save removes it first
    with open(run_dir / "checkpoint.tmp" / "state.pt", "wb") as f:
        f.truncate(2 ** 30)  # sparse: 1 GiB it would free, none taken here
    real = shutil.disk_usage
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: real(p)._replace(free=0))
    train.main(["--steps", "3", "--resume", *flags])
    assert json.load(open(run_dir / "checkpoint" / "manifest.json"))["step"] == 3
    assert not (run_dir / "checkpoint.tmp").exists()
    held = checkpoint.held_bytes(str(run_dir))
    assert held == sum(checkpoint.folder_bytes(str(run_dir / n)) for n in checkpoint.CLEARED) > \
        sum(checkpoint.folder_bytes(str(run_dir / n)) for n in ("checkpoint", "checkpoint.prev"))
    plan = memory.disk_plan(base[0].config, training.parse_args(["--steps", "2", *flags]))["run"]
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: real(p)._replace(free=plan - held + 1))
    train.main(["--steps", "2", "--overwrite", *flags])
    assert json.load(open(run_dir / "checkpoint" / "manifest.json"))["step"] == 2


def test_a_save_deletes_only_what_the_manifest_says_it_wrote(base, tmp_path):
    # issue 63: a resumed run's rotation deleted files in checkpoint/ named like the ones it writes (a model card
    # README.md a user added, notes named tokenizer_*); tools.merge wrote into a run's checkpoint, which the next
    # save deleted
    from tools import merge
    run_dir = tmp_path / "run"
    train.main(["--steps", "2", "--save-every", "1", "--run-dir", str(run_dir), *SMALL])
    mine = {run_dir / "checkpoint" / "README.md": "my model card", run_dir / "checkpoint" / "tokenizer_notes.txt": "x"}
    for path, text in mine.items():
        path.write_text(text)
    message = refused(["--steps", "4", "--save-every", "1", "--resume", "--run-dir", str(run_dir), *SMALL])
    assert message.startswith("--resume: ") and "is not of this run" in message
    checkpoint.discard(str(run_dir / "checkpoint"), strict=False)  # a rotation by hand: the run's files only
    assert {p: p.read_text() for p in mine} == mine and sorted(os.listdir(run_dir / "checkpoint")) == \
        ["README.md", "tokenizer_notes.txt"]
    for out in (run_dir / "checkpoint" / "merged", run_dir / "checkpoint.prev" / "m" / "n"):
        with pytest.raises(SystemExit) as e:
            merge.main([str(run_dir / "checkpoint.prev"), str(out)])
        assert "inside the run's checkpoint folder" in str(e.value.code)


@pytest.mark.parametrize("part, kind", [("checkpoint", "file"), ("heatmaps", "file"), ("metrics.jsonl", "folder")])
def test_a_run_folder_part_of_the_wrong_kind_is_one_line(base, tmp_path, part, kind):
    run_dir = tmp_path / "run"
    train.main(["--steps", "1", "--run-dir", str(run_dir), *SMALL])
    path = run_dir / part
    if path.exists():
        (shutil.rmtree if path.is_dir() else os.remove)(path)
    path.mkdir() if kind == "folder" else path.write_text("x")
    message = refused(["--steps", "2", "--resume", "--run-dir", str(run_dir), *SMALL])
    want = "a file where the run keeps a folder" if kind == "file" else "a folder where the run keeps a file"
    assert message == f"--run-dir {run_dir}: {path} is {want}; move it away, or choose another --run-dir"


def test_the_hint_offers_resume_only_when_a_checkpoint_can_be_resumed(base, tmp_path):
    run_dir = tmp_path / "run"
    train.main(["--steps", "1", "--save-every", "0", "--no-final-save", "--run-dir", str(run_dir), *SMALL])
    message = refused(["--steps", "1", "--run-dir", str(run_dir), *SMALL])
    assert "it has no checkpoint --resume could continue from" in message and "pass --resume" not in message
    train.main(["--steps", "1", "--overwrite", "--run-dir", str(run_dir), *SMALL])
    message = refused(["--steps", "1", "--run-dir", str(run_dir), *SMALL])
    assert f"pass --resume to continue it from {run_dir / 'checkpoint'}" in message


def test_a_full_disk_is_said_before_the_model_loads_and_before_a_save(base, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    real = shutil.disk_usage
    free = {"bytes": 1 << 20}  # 1 MiB: less than the tiny model's checkpoint (3 MB of weights, 6 MB of moments)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: real(p)._replace(free=free["bytes"]))
    monkeypatch.setattr(train.models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    message = refused(["--steps", "2", "--run-dir", str(run_dir), *SMALL])
    assert message.startswith("this run's checkpoints and logs take about 0.0") and "GiB are free there" in message
    assert not run_dir.exists()
    monkeypatch.undo()
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: real(p)._replace(free=free["bytes"]))
    free["bytes"] = 1 << 40  # room at the start; then, before the second save, none
    calls = {"n": 0}
    room = checkpoint.check_room

    def shrinking(*a, **k):
        calls["n"] += 1
        free["bytes"] = (1 << 40) if calls["n"] < 3 else (1 << 20)
        return room(*a, **k)
    monkeypatch.setattr(checkpoint, "check_room", shrinking)
    message = refused(["--steps", "2", "--save-every", "1", "--run-dir", str(run_dir), *SMALL])
    assert message.startswith("the checkpoint of step 2 takes about") and message.endswith(
        f"{run_dir / 'checkpoint'} (step 1) is intact: --resume continues from it")
    assert json.load(open(run_dir / "checkpoint" / "manifest.json"))["step"] == 1


def test_a_checkpoints_files_have_the_runs_permissions(base, tmp_path):
    # safetensors wrote the weights 0600: another user reading the run got "No such file" for model.safetensors
    run_dir = tmp_path / "run"
    train.main(["--steps", "1", "--run-dir", str(run_dir), *SMALL])
    mode = os.stat(run_dir / "metrics.jsonl").st_mode & 0o777
    assert {os.stat(p).st_mode & 0o777 for p in (run_dir / "checkpoint").iterdir()} == {mode}


def test_a_checkpoint_of_an_unfused_adamw_resumes_fused_with_the_same_updates():
    # checkpoints saved before train.py's AdamW was fused hold param groups that say fused=None: restore_run keeps the
    # resuming run's fused AdamW, and the next update is the one the saving run's AdamW would have made. (Moving the
    # step counts beside the weights matters on a GPU only: on a CPU they are float32 CPU tensors either way.)
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(5, 3))
    kw = dict(lr=1e-2, betas=(0.9, 0.99), weight_decay=0.0)
    old = torch.optim.AdamW([w], **kw)
    for _ in range(2):
        w.grad = torch.randn(5, 3)
        old.step()
    sched = torch.optim.lr_scheduler.LambdaLR(old, lambda s: 1.0)
    state = {"optimizer": copy.deepcopy(old.state_dict()), "torch_rng": torch.get_rng_state(),
             "problem_rng": random.Random(0).getstate(), "scheduler": sched.state_dict(), "step": 2}
    w2 = torch.nn.Parameter(w.detach().clone())
    new = torch.optim.AdamW([w2], **kw, fused=True)
    checkpoint.restore_run(state, new, torch.optim.lr_scheduler.LambdaLR(new, lambda s: 1.0), random.Random(1), "cpu")
    assert new.param_groups[0]["fused"] is True
    g = torch.randn(5, 3)
    w.grad, w2.grad = g, g.clone()
    old.step()
    new.step()
    assert_close(w2.detach(), w.detach(), rel=1e-6, what="the update after resuming")
    assert new.state[w2]["step"].item() == 3


def test_permissions_every_weights_file_alike_unreadable_said_so_a_read_only_folder_one_line(base, tmp_path,
                                                                                           monkeypatch):
    # issue 63: the tiny base in .cache/ kept safetensors' 0600; a file there but unreadable was reported as
    # missing or damaged (or a traceback); a read-only checkpoint folder gave a PermissionError traceback
    from toyworld import tiny
    monkeypatch.setattr(tiny, "warm_start", lambda *a, **k: None)  # the file's mode only: no training
    _, _, path = tiny.load_or_build(cache_dir=str(tmp_path / "cache"))
    usual = 0o666 & ~checkpoint._umask()
    assert {f: os.stat(os.path.join(path, f)).st_mode & 0o777 for f in os.listdir(path)} == \
        {f: usual for f in os.listdir(path)}
    run_dir = tmp_path / "run"
    train.main(["--steps", "2", "--save-every", "1", "--run-dir", str(run_dir), *SMALL])
    weights = str(run_dir / "checkpoint" / "model.safetensors")
    real_sha, real_remove = checkpoint._sha256, os.remove

    def unreadable(path):
        if path == weights:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        return real_sha(path)
    with monkeypatch.context() as m:
        m.setattr(checkpoint, "_sha256", unreadable)
        assert checkpoint.problem(str(run_dir / "checkpoint")) == f"{weights}: cannot be read (Permission denied)"

    def read_only(path, *a, **k):
        if f"{os.sep}checkpoint.prev{os.sep}" in str(path):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        return real_remove(path, *a, **k)
    with monkeypatch.context() as m:
        m.setattr(checkpoint.os, "remove", read_only)
        message = refused(["--steps", "3", "--save-every", "1", "--resume", "--run-dir", str(run_dir), *SMALL])
    assert "\n" not in message and message.startswith(f"{run_dir / 'checkpoint.prev'}: cannot be removed "
                                                      f"(Permission denied")
    assert message.endswith("(step 2) is intact: --resume continues from it)")
