"""tools/perf/gpu_check: the GPU check's CPU rehearsal, end to end through tools/perf/gpu_check.sh, so that its run on
a GPU cannot fail on a typo, a missing file or a missing package; its time caps; its wheel list."""
import json
import os
import subprocess

import pytest

from conftest import THREADS
from test_train import ROOT
from tools.perf import gpu_check


# the parts the first rehearsal runs through gpu_check.sh (machine for the rate the steps part's MFU divides by); the
# sampler, memory and oar-g parts have a rehearsal of their own below
REHEARSED = ["setup", "tests", "machine", "steps", "train"]


def test_the_rehearsal_runs_every_part_and_brings_back_what_the_gpu_call_would(tmp_path):
    out = tmp_path / "out"
    # the tests part runs one test of tests/test_on_device.py (the suite runs them all) and the steps part two
    # methods (the four share step_rows): the rest as on the GPU. A slow CI machine gets a budget to match.
    r = subprocess.run(["bash", "tools/perf/gpu_check.sh", "--device", "cpu", "--threads", str(THREADS), "--budget",
                        "1500", "--cap-scale", "5", "--pytest-arg=-k", "--pytest-arg=greedy", "--methods", "grpo,oar-p",
                        "--parts", ",".join(REHEARSED)],
                       cwd=ROOT, env={**os.environ, "OUT": str(out)}, capture_output=True, text=True, timeout=1800)
    log = (out / "gpu_check.log").read_text()
    assert r.returncode == 0, log[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert [p["name"] for p in report["parts"]] == REHEARSED
    assert all(p["status"] == "ok" for p in report["parts"]), [(p["name"], p["status"]) for p in report["parts"]]
    for name in REHEARSED:
        assert f"part {name}: start" in log and f"part {name}: end: ok" in log
    rows = {p["name"]: [row["what"] for row in p["rows"]] for p in report["parts"]}
    assert rows["tests"] == ["tests/test_on_device.py on cpu: passed / failed / skipped"]
    assert report["parts"][1]["rows"][0]["measured"] == "1 / 0 / 0"
    assert any(w.startswith("bfloat16 matmul, train shape") for w in rows["machine"])
    assert [w.split(":")[0] for w in rows["steps"][:2]] == ["grpo", "oar-p*"]
    mfu = next(row for row in report["parts"][3]["rows"] if "training MFU" in row["what"])
    assert mfu["ratio"].endswith(" %") and float(mfu["ratio"][:-2]) > 0  # the groups mixed: a pass was timed
    for recipe in ("recipes/gpu-1.5b.yaml", "recipes/gpu-1.5b-lora.yaml"):
        assert f"{recipe}: a step, saved: steps [1]" in rows["train"]
        assert f"{recipe}: --resume, a second step: steps [1, 2]" in rows["train"]
    assert sum(w.startswith("evaluate.py on the") for w in rows["train"]) == 2
    # what the device tool brings back: at most 8 files, none in a folder
    assert sorted(os.listdir(out)) == ["gpu_check.json", "gpu_check.log", "metrics-full.jsonl", "metrics-lora.jsonl",
                                       "tests.xml"]


def test_the_rehearsal_of_the_memory_oar_g_and_sampler_parts(tmp_path):
    # the plan against each phase's measured peak (full-parameter, LoRA where peft is installed), OAR-G's measured
    # advantage phase and its plan, and the sampler against generate: each a row, in the part's JSON
    args = gpu_check.argparse.Namespace(out=str(tmp_path / "out"), work=str(tmp_path / "work"), budget=1500,
                                        parts=["setup", "memory", "oar-g", "sampler"], device="cpu", methods=["grpo"],
                                        threads=THREADS, pytest_args=[], cap_scale=5.0, sizes="quick")
    report = gpu_check.check(args)
    # the parts run in the check's own order (gpu_check.PARTS), each ok
    assert [(p["name"], p["status"]) for p in report["parts"]] == [
        (p.name, "ok") for p in gpu_check.PARTS if p.name in args.parts], report["parts"]
    rows = {p["name"]: [(row["what"], row["against"]) for row in p["rows"]] for p in report["parts"]}
    full = [r for r in rows["memory"] if r[0].startswith("full-parameter:")]
    assert len(full) == 3 and all(against.startswith("plan") for _, against in full)  # sampling, training, step
    assert len(rows["oar-g"]) == 2 and all("advantage" in w and a.startswith("plan") for w, a in rows["oar-g"])
    assert rows["sampler"]


def test_a_part_past_its_cap_is_stopped_and_the_rest_say_why_they_did_not_run(tmp_path, monkeypatch):
    # setup cannot import torch and build a model in 1 s: it is killed at its cap, and the machine part, which needs
    # setup's model, is skipped with the reason; the JSON holds both
    monkeypatch.setattr(gpu_check, "PARTS", [gpu_check.Part("setup", 1, "x"), gpu_check.Part("machine", 30, "y")])
    args = gpu_check.argparse.Namespace(out=str(tmp_path / "out"), work=str(tmp_path / "work"), parts=["setup",
                                        "machine"], budget=60, device="cpu", methods=["grpo"], threads=THREADS,
                                        pytest_args=[], cap_scale=1.0, sizes="quick")
    report = gpu_check.check(args)
    assert [(p["name"], p["status"]) for p in report["parts"]] == [("setup", "timed out after 1 s"),
                                                                   ("machine", "skipped")]
    assert report["parts"][1]["why"] == "setup did not make the model"
    assert json.loads((tmp_path / "out" / "gpu_check.json").read_text())["parts"] == report["parts"]


def test_junit_counts(tmp_path):
    xml = tmp_path / "t.xml"
    xml.write_text('<testsuites><testsuite><testcase name="a"/><testcase name="b"><failure message="boom\nmore"/>'
                   '</testcase><testcase name="c"><skipped/></testcase><testcase name="d"><error message="E"/>'
                   '</testcase></testsuite></testsuites>')
    # (the XML parser reads the newline inside an attribute as a space)
    assert gpu_check.junit_counts(str(xml)) == ({"passed": 1, "failed": 2, "skipped": 1},
                                                [("b", "boom more"), ("d", "E")])


def pins(path) -> dict:
    lines = [x.split("#")[0].strip() for x in open(os.path.join(ROOT, path))]
    return dict(x.split("==") for x in lines if "==" in x)


def test_the_wheels_carried_to_the_gpu_are_the_versions_the_suite_tests():
    carried = pins("requirements/gpu-check-wheels.txt")
    tested = {**pins("requirements.txt"), **pins("requirements/lora.txt")}
    for name in ("transformers", "tokenizers", "math-verify", "peft"):
        assert carried[name] == tested[name], name
    from importlib.metadata import version
    for name in ("latex2sympy2_extended", "antlr4-python3-runtime"):  # math-verify's own, installed here by pip
        assert carried[name] == version(name), name


def one_line_refusal(capsys, call) -> str:
    """call()'s refusal: exit status 2 and one line on stderr, argparse's usage block left out."""
    with pytest.raises(SystemExit) as e:
        call()
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "usage" not in err[0], err
    return err[0]


@pytest.mark.parametrize("flags, said", [
    (["--budget", "0"], "--budget 0: must be at least 1"), (["--cap-scale", "nan"], "--cap-scale nan: must be"),
    (["--parts", ","], "--parts ',': names no part"), (["--bogus"], "unrecognized arguments: --bogus"),
    (["--budg", "5"], "unrecognized arguments: --budg")])
def test_gpu_check_refuses_a_bad_value_in_one_line_before_anything_runs(capsys, monkeypatch, flags, said):
    # round four: bad values were tracebacks minutes in, and a refusal printed argparse's usage block
    monkeypatch.setattr(gpu_check, "check", lambda a: pytest.fail("the check ran"))
    assert said in one_line_refusal(capsys, lambda: gpu_check.main(flags))


def test_gpu_check_refuses_an_out_that_is_a_file(tmp_path, capsys):
    (tmp_path / "out").write_text("x")
    said = one_line_refusal(capsys, lambda: gpu_check.main(["--out", str(tmp_path / "out")]))
    assert f"--out {tmp_path / 'out'}: a file, not a folder" in said
    r = subprocess.run(["bash", "tools/perf/gpu_check.sh"], cwd=ROOT, env={**os.environ, "OUT": str(tmp_path / "out")},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == (f"gpu_check.sh: OUT={tmp_path / 'out'} is a file, not a folder: "
                                                      f"set OUT to a folder (it is made where missing)")


def test_gpu_check_sh_on_a_python_without_torch_is_one_line(tmp_path):
    # round four: a python3 without torch gave a traceback in the log and then each part's failure
    (tmp_path / "hide" / "torch").mkdir(parents=True)
    (tmp_path / "hide" / "torch" / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\")")
    out = tmp_path / "out"
    r = subprocess.run(["bash", "tools/perf/gpu_check.sh", "--device", "cpu"], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "OUT": str(out), "PYTHONPATH": str(tmp_path / "hide")}, timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert lines[0].startswith("gpu_check.sh: ") and "has no torch: install it (" in lines[0] and "pip install torch" \
        in lines[0], lines
    assert (out / "gpu_check.log").read_text().strip() == lines[0]


def test_a_stale_or_second_wheel_is_named_in_one_line(tmp_path, monkeypatch, capsys):
    # round four: a wheel kept from an older fetch beside the pinned one made pip on the GPU refuse both (or install
    # either) without naming which file was the stale one
    monkeypatch.setattr(gpu_check, "WHEEL_DIR", str(tmp_path))
    version = pins("requirements/gpu-check-wheels.txt")["peft"]
    (tmp_path / f"peft-{version}-py3-none-any.whl").write_text("x")
    assert gpu_check.main(["--check-wheels"]) == 0 and gpu_check.wheel_problem() is None
    (tmp_path / "peft-0.1.0-py3-none-any.whl").write_text("x")
    assert gpu_check.main(["--check-wheels"]) == 1
    assert capsys.readouterr().err == (f"gpu_check: {tmp_path}/peft-0.1.0-py3-none-any.whl: stale "
                                       f"(requirements/gpu-check-wheels.txt pins peft=={version}): delete it, then "
                                       f"--fetch-wheels\n")
    os.remove(tmp_path / "peft-0.1.0-py3-none-any.whl")
    (tmp_path / f"peft-{version}-py2.py3-none-any.whl").write_text("x")  # the same version twice
    assert "a second wheel of peft beside" in gpu_check.wheel_problem()


def test_fetch_wheels_with_no_reachable_host_is_one_line(tmp_path, monkeypatch):
    # round four: a CalledProcessError naming pip's whole command; an index nothing listens on stands for no network
    monkeypatch.setattr(gpu_check, "WHEEL_DIR", str(tmp_path / "whl"))
    for var, value in (("PIP_CONFIG_FILE", os.devnull), ("PIP_INDEX_URL", "http://127.0.0.1:9/simple"),
                       ("PIP_RETRIES", "0"), ("PIP_TIMEOUT", "2")):
        monkeypatch.setenv(var, value)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    with pytest.raises(SystemExit) as e:
        gpu_check.main(["--fetch-wheels"])
    said = str(e.value.code)
    assert said.startswith("--fetch-wheels: the wheel host (http://127.0.0.1:9/simple) could not be reached (pip: ") \
        and "copy the wheels" in said and "\n" not in said, said
