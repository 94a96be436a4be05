"""What a newcomer runs first: every script's --help answers at once and exits 0, and compare.py run from
another directory puts its runs under the directory it was given, relative to where it was run."""
import json
import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, OMP_NUM_THREADS="1")


@pytest.mark.parametrize("script", ["train.py", "evaluate.py", "tools/compare.py", "tools/bench.py", "data.py",
                                    "scaling/trl_train.py"])
def test_help_exits_zero_at_once(script, tmp_path):
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, os.path.join(ROOT, script), "--help"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120, env=ENV)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage:") and "--help" in r.stdout
    assert time.perf_counter() - t0 < 60  # printing help, not running (bench.py alone used to run 13 minutes)
    assert not os.listdir(tmp_path)  # and writing nothing
    if script in ("train.py", "evaluate.py", "tools/compare.py", "tools/bench.py"):  # what runs models
        assert "--threads" in r.stdout  # a shared machine needs it (torch's default threads collapse there)


def test_compare_from_another_directory_puts_runs_under_the_given_dir(base, tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "compare.py"), "--methods", "grpo", "--seeds", "0",
                        "--steps", "2", "--run-dir", "runs/cwdtest", "--threads", "1", "--", "--prompts-per-step",
                        "2", "--group-size", "2", "--eval-limit", "8"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600, env=ENV)
    assert r.returncode == 0, r.stderr[-2000:]
    run = tmp_path / "runs" / "cwdtest" / "grpo-seed0"
    assert (run / "done.json").exists() and (tmp_path / "runs" / "cwdtest" / "results.md").exists()
    assert not os.path.exists(os.path.join(ROOT, "runs", "cwdtest"))  # nothing went under the repository
    info = json.load(open(run / "run.json"))["args"]
    assert info["threads"] == 1 and info["eval_every"] == 1  # passed through; steps / 4, at least 1
