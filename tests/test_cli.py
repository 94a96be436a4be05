"""What a newcomer runs first: every script's --help answers at once and exits 0, and tools.compare run from
another directory puts its runs under the directory it was given, relative to where it was run."""
import argparse
import importlib
import json
import os
import resource
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, OMP_NUM_THREADS="1")


SCRIPTS = {"train.py": ["train.py"], "evaluate.py": ["evaluate.py"], "data.py": ["data.py"],
           "tools.compare": ["-m", "tools.compare"], "tools.perf.bench": ["-m", "tools.perf.bench"],
           "scaling.trl_train": ["-m", "scaling.trl_train"]}
# run from another folder, as a user may: the root's scripts by their path, tools/ and scaling/ as modules of it
ENV_ROOT = dict(ENV, PYTHONPATH=ROOT)


def command(script: str) -> list:
    how = SCRIPTS[script]
    return [sys.executable, *(how[:1] if how[0] == "-m" else []), os.path.join(ROOT, how[0]) if how[0] != "-m"
            else how[1]]


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_help_exits_zero_at_once(script, tmp_path):
    # the child's CPU seconds, not the wall clock: beside other work (two training runs, a parallel suite) the wall
    # clock of an import of torch stretched past any fixed limit, while the CPU time of printing help does not
    t0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run([*command(script), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env=ENV_ROOT)
    t1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage:") and "--help" in r.stdout
    cpu = (t1.ru_utime - t0.ru_utime) + (t1.ru_stime - t0.ru_stime)
    assert cpu < 40, cpu  # printing help, not running (bench.py alone used to run 13 minutes)
    assert not os.listdir(tmp_path)  # and writing nothing
    if script in ("train.py", "evaluate.py", "tools.compare", "tools.perf.bench"):  # what runs models
        assert "--threads" in r.stdout  # a shared machine needs it (torch's default threads collapse there)


def test_no_module_edits_the_import_path():
    # tools/ and scaling/ are packages of the root, run with -m: none of the project's code inserts a path (a copy
    # of the root on sys.path shadowed modules of the same name once); the tests alone add the root (conftest.py)
    found = [os.path.relpath(os.path.join(d, n), ROOT) for d, _, names in os.walk(ROOT) for n in names
             if n.endswith(".py") and "sys.path.insert" in open(os.path.join(d, n)).read()
             and os.path.relpath(d, ROOT).split(os.sep)[0] != "tests"]
    assert found == []


def test_compare_from_another_directory_puts_runs_under_the_given_dir(base, tmp_path):
    r = subprocess.run([*command("tools.compare"), "--methods", "grpo", "--seeds", "0",
                        "--steps", "2", "--run-dir", "runs/cwdtest", "--threads", "1", "--", "--prompts-per-step",
                        "2", "--group-size", "2", "--eval-limit", "8"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600, env=ENV_ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    run = tmp_path / "runs" / "cwdtest" / "grpo-seed0"
    assert (run / "done.json").exists() and (tmp_path / "runs" / "cwdtest" / "results.md").exists()
    assert not os.path.exists(os.path.join(ROOT, "runs", "cwdtest"))  # nothing went under the repository
    info = json.load(open(run / "run.json"))["args"]
    assert info["threads"] == 1 and info["eval_every"] == 1  # passed through; steps / 4, at least 1


@pytest.mark.parametrize("command", ["train.py", "evaluate.py", "data.py", "tools/compare.py", "tools/attribution",
                                     "tools/merge.py", "tools/perf/bench.py", "tools/check_eval.py",
                                     "tools/perf/profile_step.py", "tools/perf/memcheck.py"])
def test_no_command_takes_an_abbreviated_flag(command):
    # issue 63: argparse took --conf for --config, which the recipe loader does not see: a run recorded a recipe and
    # applied none of it. Every command of the project spells its flags out
    module = command.removesuffix(".py").replace("/", ".")  # a package (tools/attribution) as it is
    parsers = []
    real = argparse.ArgumentParser.parse_args

    def caught(self, args=None, namespace=None):
        parsers.append(self)
        return real(self, args, namespace)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_args", caught)
        with pytest.raises(SystemExit) as e:
            importlib.import_module(module).main(["--hel"])  # --help's abbreviation: runs nothing either way
    assert parsers and e.value.code == 2 and not parsers[0].allow_abbrev, command


@pytest.mark.parametrize("command, bad", [("train.py", ["--lr", "x"]), ("train.py", ["--bogus"]),
                                          ("evaluate.py", ["--threads", "x"]), ("tools/compare.py", ["--steps", "x"]),
                                          ("tools/attribution", ["--n", "x"]), ("tools/merge.py", []),
                                          ("scaling/trl_train.py", ["--output_d", "x"])])
def test_a_refused_flag_is_one_line_that_says_where_help_is(command, bad, capsys):
    if command.startswith("scaling"):
        pytest.importorskip("trl", reason="the TRL path is optional: requirements/trl.txt")
    # issue 63: argparse printed its whole usage (35 lines for train.py) above the one line that says what is wrong
    module = importlib.import_module(command.removesuffix(".py").replace("/", "."))
    with pytest.raises(SystemExit) as e:
        module.main(bad)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].endswith("--help lists the flags)"), err
