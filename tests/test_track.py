"""--report-to and --config (issue 40): each tracker's files read back with its own reader hold metrics.jsonl's
numbers and the completions table; --resume continues the same tracker run; a tracker asked for and not installed,
or an unknown one, is one line before the model loads; a recipe round-trips with run.json, the command line wins,
a bad key is one line naming the file and the key, and every recipe in recipes/ parses (the tiny one runs)."""
import glob
import importlib.util
import json
import os
import struct
import subprocess
import sys

import pytest

import train
from config import recipe, training
from infra import checkpoint, track

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = ["--method", "ktae", "--steps", "2", "--eval-every", "1", "--eval-limit", "16", "--prompts-per-step", "4",
        "--threads", "1"]
installed = {name: importlib.util.find_spec(t.package) is not None for name, t in track.TRACKERS.items()}
needs = lambda name: pytest.mark.skipif(not installed[name], reason=f"{name} is not installed: {track.INSTALL}")  # noqa


def metrics(run: str) -> dict:
    """{(step, name): value} of metrics.jsonl's numbers."""
    out = {}
    for r in map(json.loads, open(os.path.join(run, "metrics.jsonl"))):
        out.update({(r["step"], k): v for k, v in track.numbers(r).items()})
    return out


def wandb_history(path: str) -> list:
    """The history rows of an offline wandb file (a LevelDB-style log of 32 KiB blocks after a 7-byte header, each
    chunk <crc, length, type>; wandb 0.31 ships no reader for it)."""
    from wandb.proto import wandb_internal_pb2 as pb
    data, pos, buf, rows = open(path, "rb").read(), 7, b"", []
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        buf, pos = buf + data[pos + 7:pos + 7 + n], pos + 7 + n
        if kind in (1, 4):  # a whole record, or the last chunk of one
            r = pb.Record()
            r.ParseFromString(buf)
            buf = b""
            if r.WhichOneof("record_type") == "history":
                rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item})
    return rows


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    """A tiny run sent to every installed tracker: 2 steps, then --resume to a third."""
    names = [n for n, ok in installed.items() if ok]
    if not names:
        pytest.skip(f"no tracker is installed: {track.INSTALL}")
    run = str(tmp_path_factory.mktemp("watched") / "run")
    # processes of their own, as a user runs them: trackio reads its store's folder once a process, and this one
    # may have imported it already (TRL's trainer does)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "TRACKIO_", "TENSORBOARD_"))}
    for more in (["--save-every", "1"], ["--resume", "--steps", "3"]):
        subprocess.run([sys.executable, "train.py", *FAST, "--run-dir", run, "--report-to", ",".join(names), *more],
                       cwd=ROOT, env=env, check=True, capture_output=True)
    return run


def check_same(seen: dict, run: str):
    expected = metrics(run)
    for step in (1, 2, 3):  # steps 1-2 in the first session, 3 after --resume
        assert (step, "reward_mean") in expected
    for key, value in expected.items():
        assert seen.get(key) == pytest.approx(value, rel=1e-6), key  # float32 storage in some trackers


@needs("tensorboard")
def test_tensorboard_shows_the_runs_numbers_and_completions(watched):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray
    ea = EventAccumulator(os.path.join(watched, "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    seen = {(e.step, tag): e.value for tag in ea.Tags()["scalars"] for e in ea.Scalars(tag)}
    check_same(seen, watched)
    tables = {e.step: make_ndarray(e.tensor_proto).item().decode() for e in ea.Tensors("completions/text_summary")}
    assert sorted(tables) == [1, 2, 3]  # one at each evaluation after a step
    lines = tables[3].splitlines()
    assert lines[0] == "| problem | completion | reward | advantage |" and len(lines) == 2 + 2 * 8  # 2 groups of G=8


@needs("wandb")
def test_wandb_offline_history_holds_the_runs_numbers_and_resumes_the_same_run(watched):
    files = sorted(glob.glob(os.path.join(watched, "wandb", "offline-run-*", "run-*.wandb")))
    assert len(files) == 2 and len({os.path.basename(f) for f in files}) == 1  # two sessions, one run id
    seen = {}
    for f in files:
        for row in wandb_history(f):
            seen.update({(row["_step"], k): v for k, v in row.items() if isinstance(v, (int, float))})
    check_same(seen, watched)
    tables = glob.glob(os.path.join(watched, "wandb", "offline-run-*", "files", "media", "table", "completions_*"))
    assert len(tables) == 3
    table = json.load(open(tables[0]))
    assert table["columns"] == ["problem", "completion", "reward", "advantage"] and len(table["data"]) == 16


@needs("trackio")
def test_trackio_store_holds_the_runs_numbers_in_one_run(watched):
    code = ("import json, sys; from trackio.sqlite_storage import SQLiteStorage as S; "
            "print(json.dumps([S.get_runs(sys.argv[1]), S.get_logs(sys.argv[1], sys.argv[2])]))")
    # TRACKIO_DIR is read when trackio is imported: a process of its own reads this run's store
    env = {**os.environ, "TRACKIO_DIR": os.path.join(watched, "trackio")}
    out = subprocess.run([sys.executable, "-c", code, track.PROJECT, os.path.basename(watched)], check=True,
                         capture_output=True, text=True, env=env)
    runs, logs = json.loads(out.stdout.strip().splitlines()[-1])
    assert runs == [os.path.basename(watched)]  # --resume reopened the run, not a second one
    seen = {}
    for row in logs:
        seen.update({(row["step"], k): v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"})
    check_same(seen, watched)
    assert sum("completions" in row for row in logs) == 3


def test_a_tracker_not_installed_or_unknown_is_one_line_before_the_model_loads(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    for value, said in [("wandb", "--report-to wandb: the wandb package is not installed: pip install -r "
                                  "requirements/track.txt"),
                        ("tensorbord", "--report-to tensorbord: 'tensorbord' is not one of none, tensorboard, wandb")]:
        with pytest.raises(SystemExit):
            training.parse_args(["--report-to", value])
        assert said in capsys.readouterr().err.splitlines()[-1]
    assert training.parse_args(["--report-to", "none"]).report_to == "none"


def test_the_quick_start_imports_no_tracker():
    code = "import sys, train; print(sorted(m for m in ('tensorboard', 'wandb', 'trackio') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_recipe_round_trips_with_run_json_and_the_command_line_wins(tmp_path):
    given = ["--method", "dapo+ktae", "--dataset", "chain", "--lr", "3e-5", "--group-size", "4", "--no-bf16",
             "--keep-surplus", "--run-dir", str(tmp_path / "a")]
    first = training.parse_args(given)
    os.makedirs(first.run_dir)
    from infra import checkpoint
    checkpoint.write_info(first.run_dir, first, finished=True, step=3)
    again = training.parse_args(["--config", os.path.join(first.run_dir, "run.json"), "--run-dir", str(tmp_path / "b")])
    differ = {k for k in vars(first) if vars(first)[k] != vars(again)[k]}
    assert differ == {"config", "run_dir"}, differ  # the same settings, in another folder
    path = tmp_path / "r.yaml"
    path.write_text("method: grpo\nlr: 2.0e-5\ngroup_size: 6\nmax-new-tokens: 24\nbf16: false\n")
    args = training.parse_args(["--config", str(path), "--lr", "1e-5"])
    assert (args.method, args.lr, args.group_size, args.max_new_tokens, args.bf16) == ("grpo", 1e-5, 6, 24, False)


def test_a_run_json_from_before_a_flag_was_renamed_repeats_under_the_old_name(tmp_path):
    # round four: a run.json whose key is a flag's old name, still an alias (gpu_memory of --memory, --gpu-memory),
    # was refused as "not a flag of this command"; the alias is the flag, in a recipe as on the command line
    first = training.parse_args(["--method", "grpo", "--memory", "12", "--no-bf16", "--run-dir", str(tmp_path / "a")])
    os.makedirs(first.run_dir)
    from infra import checkpoint
    checkpoint.write_info(first.run_dir, first, finished=True, step=1)
    run_json = os.path.join(first.run_dir, "run.json")
    info = json.load(open(run_json))
    info["args"]["gpu_memory"] = info["args"].pop("memory")  # as the run wrote it before the rename
    json.dump(info, open(run_json, "w"))
    again = training.parse_args(["--config", run_json, "--run-dir", str(tmp_path / "b")])
    assert again.memory == 12 and again.bf16 is False
    path = tmp_path / "r.yaml"
    path.write_text("gpu-memory: 8\nno-bf16: true\n")  # a switch's --no- form is not an alias of it
    with pytest.raises(SystemExit):
        training.parse_args(["--config", str(path)])


@pytest.mark.parametrize("text,said", [
    ("lr: 1e-5\nlearning_rate: 1e-5\n", "learning_rate: not a flag of this command"),
    ("group-size: many\n", "group-size: argument --group-size: invalid int value: 'many'"),
    ("method: ppo\n", "method: argument --method: invalid choice: 'ppo'"),
    ("keep-surplus: 3\n", "keep-surplus: 3 is not true or false (a switch)"),
    ("lr: [1, 2]\n", "lr: [1, 2] is not a value --lr takes"),
    ("- lr\n", "a recipe is a mapping of flags to values"),
    ("lr: : 1\n", "not YAML (mapping values are not allowed here, line 1)"),
    ("config: other.yaml\n", "config: a recipe cannot name another recipe")])
def test_a_bad_recipe_is_one_line_naming_the_file_and_the_key(tmp_path, capsys, text, said):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SystemExit):
        training.parse_args(["--config", str(path)])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"--config {path}: " in line and said in line, line


def test_every_recipe_parses_and_the_tiny_one_runs(tmp_path):
    recipes = sorted(glob.glob(os.path.join(ROOT, "recipes", "*.yaml")))
    assert len(recipes) >= 4
    for path in recipes:
        recipe.argv_of(training.parser(), path)  # every key a flag, every value one it takes
    args = training.parse_args(["--config", os.path.join(ROOT, "recipes", "tiny.yaml")])
    assert (args.method, args.model, args.dataset) == ("ktae", "tiny", "tiny")
    run = str(tmp_path / "run")
    train.main(["--config", os.path.join(ROOT, "recipes", "tiny.yaml"), "--steps", "2", "--eval-limit", "16",
                "--threads", "1", "--run-dir", run])
    assert json.load(open(os.path.join(run, "run.json")))["args"]["config"].endswith("tiny.yaml")


@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="TRL is not installed: requirements/trl.txt")
def test_trl_sends_its_logs_to_the_same_trackers_offline_under_its_output_dir(tmp_path):
    names = [n for n, ok in installed.items() if ok]
    if not names:
        pytest.skip(f"no tracker is installed: {track.INSTALL}")
    out = str(tmp_path / "trl")
    subprocess.run([sys.executable, "-m", "scaling.trl_train", "--method", "ktae", "--threads", "1", "--max_steps", "2",
                    "--logging_steps", "1", "--eval_limit", "8", "--output_dir", out, "--report_to", ",".join(names),
                    "--num_completions_to_print", "1"], cwd=ROOT, check=True, capture_output=True, text=True,
                   env={k: v for k, v in os.environ.items() if not k.startswith(("WANDB", "TRACKIO", "TENSORBOARD"))})
    if installed["tensorboard"]:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        ea = EventAccumulator(os.path.join(out, "tensorboard"), size_guidance={"scalars": 0})
        ea.Reload()
        assert [e.step for e in ea.Scalars("train/reward")] == [1, 2]
    if installed["wandb"]:
        rows = [r for f in glob.glob(os.path.join(out, "wandb", "**", "run-*.wandb"), recursive=True)
                for r in wandb_history(f)]
        assert {r.get("train/global_step") for r in rows if "train/reward" in r} == {1, 2}
        assert any("completions" in k for r in rows for k in r)
    if installed["trackio"]:
        assert os.path.exists(os.path.join(out, "trackio", f"{track.PROJECT}.db"))


def test_trl_refuses_a_tracker_it_cannot_keep_offline(tmp_path):
    said = subprocess.run([sys.executable, "-m", "scaling.trl_train", "--report_to", "mlflow", "--output_dir",
                           str(tmp_path / "o")], cwd=ROOT, capture_output=True, text=True)
    assert said.returncode != 0 and said.stderr.strip().splitlines()[-1] == \
        "--report_to mlflow: 'mlflow' is not one of none, tensorboard, wandb, trackio"


def test_a_recipe_is_applied_whole_or_refused(tmp_path, capsys):
    # issue 63: --conf (an abbreviation argparse took) recorded a recipe and applied none of it; two --config applied
    # the first and recorded the second; a dapo run.json under --method grpo kept dapo's presets without a word
    one, two = tmp_path / "one.yaml", tmp_path / "two.yaml"
    one.write_text("lr: 1e-5\n")
    two.write_text("lr: 2e-5\n")
    for argv, said in ((["--conf", str(one)], "unrecognized arguments: --conf"),
                       (["--config", str(one), "--config", str(two)], "--config given 2 times")):
        with pytest.raises(SystemExit):
            training.parse_args(argv)
        assert said in capsys.readouterr().err
    first = training.parse_args(["--method", "dapo", "--run-dir", str(tmp_path / "a")])
    os.makedirs(first.run_dir)
    checkpoint.write_info(first.run_dir, first, finished=True)
    run_json = os.path.join(first.run_dir, "run.json")
    with pytest.raises(SystemExit):
        training.parse_args(["--config", run_json, "--method", "grpo"])
    assert "a run of --method dapo" in capsys.readouterr().err
    again = training.parse_args(["--config", run_json, "--method", "dapo", "--run-dir", str(tmp_path / "b")])
    assert again.eps_high == 0.28 and again.config == run_json


def test_a_tracker_never_ends_a_run_with_a_traceback(base, tmp_path, monkeypatch, capsys):
    # issue 63: an unwritable tracker folder, a disk that fills during a tracker's write, an empty wandb run id on
    # --resume each ended the run with a traceback
    from infra import models
    run_dir = tmp_path / "run"
    small = ["--steps", "2", "--prompts-per-step", "2", "--group-size", "4", "--eval-limit", "8", "--eval-every", "1",
             "--threads", "1", "--run-dir", str(run_dir), "--report-to", "tensorboard"]
    run_dir.mkdir()
    (run_dir / "tensorboard").write_text("not a folder")
    with monkeypatch.context() as m:
        m.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
        with pytest.raises(SystemExit):
            train.main(small)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tensorboard is a file where the tracker keeps a folder" in err[0], err
    os.remove(run_dir / "tensorboard")
    calls = {"n": 0}

    def full(self, record):
        calls["n"] += 1
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(track.TensorBoard, "log", full)
    train.main(small)
    out = capsys.readouterr().out
    assert calls["n"] == 1 and out.count("--report-to tensorboard: failed (OSError") == 1
    assert "training goes on without it" in out
    assert [r["step"] for r in map(json.loads, open(run_dir / "metrics.jsonl")) if "reward_mean" in r] == [1, 2]
    id_file = tmp_path / "run-id"
    for text in ("", "\x00\x01 not an id\n"):
        id_file.write_text(text)
        run_id = track.read_run_id(str(id_file))
        assert run_id and run_id.isalnum()
        assert "this run's curves go on in a new wandb run" in capsys.readouterr().out
    id_file.write_text("ab12cd34\n")
    assert track.read_run_id(str(id_file)) == "ab12cd34"


def test_overwrite_clears_the_trackers_folders_and_checks_all_before_deleting(base, tmp_path, capsys):
    # round four: --overwrite of a run made with --report-to deleted metrics.jsonl and the checkpoint, then stopped
    # at the tracker's own files as "not of this run", the run lost and no new one started
    run_dir = tmp_path / "run"
    small = ["--steps", "1", "--prompts-per-step", "2", "--group-size", "4", "--eval-limit", "8", "--eval-every", "1",
             "--threads", "1", "--run-dir", str(run_dir), "--report-to", "tensorboard"]
    train.main(small)
    # wandb's and trackio's folders as they lay them out (wandb 0.2x offline, trackio): a link to a folder too
    online = run_dir / "wandb" / "offline-run-20260101_000000-ab12cd34"
    (online / "files").mkdir(parents=True)
    (online / "run-ab12cd34.wandb").write_text("x")
    (run_dir / "wandb" / "run-id").write_text("ab12cd34")
    os.symlink(online.name, run_dir / "wandb" / "latest-run")
    os.symlink(f"{online.name}/run-ab12cd34.wandb", run_dir / "wandb" / "debug.log")
    (run_dir / "trackio").mkdir()
    for name in (f"{track.PROJECT}.db", f"{track.PROJECT}.db-wal", f"{track.PROJECT}.lock"):
        (run_dir / "trackio" / name).write_text("x")
    before = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*"))
    note = run_dir / "wandb" / "notes.txt"
    note.write_text("mine")
    with pytest.raises(SystemExit) as e:
        train.main(small + ["--overwrite"])
    said = str(e.value.code)
    assert f"--overwrite: {note} is not of this run" in said and "nothing was deleted" in said and "\n" not in said
    assert sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p != note) == before
    note.unlink()
    train.main(small + ["--overwrite"])
    assert not (run_dir / "wandb").exists() and not (run_dir / "trackio").exists()
    assert len(os.listdir(run_dir / "tensorboard")) == 1  # the new run's events file only
    assert [r["step"] for r in map(json.loads, open(run_dir / "metrics.jsonl")) if "reward_mean" in r] == [1]
