"""tools/gpu_check: the one-GPU check's CPU rehearsal, end to end through tools/gpu_check.sh, so that its one call on
a lent GPU cannot fail on a typo, a missing file or a missing package; its time caps; its wheel list."""
import json
import os
import subprocess

import pytest

from conftest import THREADS
from test_train import ROOT
from tools import gpu_check


# the parts the suite rehearses (machine for the rate the steps part's MFU divides by); left out: sampler and memory,
# which measure with bench's own parts that tests/test_bench.py::test_the_gpu_table_on_the_cpu runs at small widths
REHEARSED = ["setup", "tests", "machine", "steps", "train"]


def test_the_rehearsal_runs_every_part_and_brings_back_what_the_gpu_call_would(tmp_path):
    out = tmp_path / "out"
    # the tests part runs one test of tests/test_on_device.py (the suite runs them all) and the steps part two
    # methods (the four share step_rows): the rest as on the GPU. A slow CI machine gets a budget to match.
    r = subprocess.run(["bash", "tools/gpu_check.sh", "--device", "cpu", "--threads", str(THREADS), "--budget",
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


def test_a_part_past_its_cap_is_stopped_and_the_rest_say_why_they_did_not_run(tmp_path, monkeypatch):
    # setup cannot import torch and build a model in 1 s: it is killed at its cap, and the machine part, which needs
    # setup's model, is skipped with the reason; the JSON holds both
    monkeypatch.setattr(gpu_check, "PARTS", [gpu_check.Part("setup", 1, "x"), gpu_check.Part("machine", 30, "y")])
    args = gpu_check.argparse.Namespace(out=str(tmp_path / "out"), work=str(tmp_path / "work"), parts=["setup",
                                        "machine"], budget=60, device="cpu", methods=["grpo"], threads=THREADS,
                                        pytest_args=[], cap_scale=1.0)
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
