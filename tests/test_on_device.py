"""The suite's checks that a GPU can break, on the device TEST_DEVICE names (default: cpu): the sampler against
model.generate, the sampler's log-probs against the training forward, one step of every method, the bf16 path, LoRA,
and a checkpoint that reopens and resumes. On a CPU they repeat what other files check; `python -m tools.perf.gpu_check`
runs this file with TEST_DEVICE=cuda on a GPU (docs/gpu.md), where CUDA's kernels, its autocast and its allocator
take the place of the CPU's.

    TEST_DEVICE=cuda python -m pytest -q tests/test_on_device.py
"""
import copy
import json
import os

import pytest
import torch

import methods
import train
from conftest import THREADS, assert_close, checkpoint_reopens, greedy_equals_generate, sampled_against_forward
from test_sample import prompts  # the tiny task's prompts, of different lengths (left padding)

DEVICE = os.environ.get("TEST_DEVICE", "cpu")
if DEVICE != "cpu" and not (DEVICE.startswith("cuda") and torch.cuda.is_available()):
    pytest.skip(f"TEST_DEVICE={DEVICE}: no such device here", allow_module_level=True)
SMALL = ["--prompts-per-step", "4", "--group-size", "4", "--eval-limit", "4", "--eval-every", "1000",
         "--save-every", "1000", "--device", DEVICE, "--threads", str(THREADS)]


def steps(run_dir) -> list:
    return [r for r in map(json.loads, open(os.path.join(run_dir, "metrics.jsonl"))) if "accuracy" in r]


@pytest.fixture
def on_device(base):
    model, tok = base
    return copy.deepcopy(model).to(DEVICE), tok


def test_greedy_sampler_equals_generate_on_the_device(on_device):
    model, tok = on_device
    out = greedy_equals_generate(model, tok, prompts(tok, 8, seed=3), new_tokens=32)
    assert out["input_ids"].device.type == torch.device(DEVICE).type


def test_sampled_logprobs_equal_the_training_forward_on_the_device(on_device):
    model, tok = on_device
    sampled, scored, _ = sampled_against_forward(model, tok, prompts(tok, 8, seed=1), n=4, temperature=1.0)
    # The CPU's two paths used 0.035 of rel 1e-5 (tests/test_sample.py); a GPU's kernels sum in other orders: 1e-4
    # still catches a wrong temperature, position or mask (errors of 1e-1 and more)
    assert_close(scored, sampled, rel=1e-4, what="log-probs")


@pytest.mark.parametrize("method", methods.short_names())
def test_one_step_of_each_method_on_the_device(base, tmp_path, method):
    run_dir = str(tmp_path / "run")
    train.main(["--method", method, "--steps", "1", "--run-dir", run_dir, "--no-final-save", *SMALL])
    (step,) = steps(run_dir)
    assert step["nonfinite_updates"] == 0 and step["grad_norm"] is not None and step["grad_norm"] >= 0


def test_a_bf16_step_on_the_device(base, tmp_path):
    run_dir = str(tmp_path / "run")
    train.main(["--method", "ktae", "--steps", "2", "--bf16", "--run-dir", run_dir, "--no-final-save", *SMALL])
    assert json.load(open(os.path.join(run_dir, "run.json")))["args"]["bf16"] is True
    assert [s["nonfinite_updates"] for s in steps(run_dir)] == [0, 0]


def test_a_checkpoint_reopens_and_a_run_resumes_on_the_device(base, tmp_path):
    run_dir = str(tmp_path / "run")
    flags = ["--method", "grpo", "--run-dir", run_dir, *SMALL, "--save-every", "1"]
    train.main([*flags, "--steps", "2"])
    model, tok = base
    assert checkpoint_reopens(os.path.join(run_dir, "checkpoint"), model, tok, "Q:3+5=?\nA: 8") > 0  # it trained
    train.main([*flags, "--steps", "3", "--resume"])
    assert [s["step"] for s in steps(run_dir)] == [1, 2, 3]


def test_a_lora_run_saves_and_resumes_on_the_device(base, tmp_path):
    pytest.importorskip("peft", reason="LoRA is optional: pip install -r requirements/lora.txt")
    from infra import lora
    run_dir = str(tmp_path / "run")
    flags = ["--method", "oar-g", "--run-dir", run_dir, *SMALL, "--save-every", "1", "--lora-rank", "4",
             "--lr", "1e-3"]
    train.main([*flags, "--steps", "1"])
    train.main([*flags, "--steps", "2", "--resume"])
    assert [(s["step"], s["nonfinite_updates"]) for s in steps(run_dir)] == [(1, 0), (2, 0)]
    assert os.path.exists(os.path.join(run_dir, "checkpoint", lora.ADAPTER_FILE))
