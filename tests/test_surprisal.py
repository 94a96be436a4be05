"""U1, surprisal-weighted blame (surprisal.py; this project's rule): the weights and advantages by hand, the rule in
the method table, and a short run."""
import json

import torch

import methods
import surprisal
import train
from conftest import THREADS, assert_close


def test_u1_weights_are_the_surprisal_over_the_rollouts_mean():
    # row 0: s = 0.1, 2.0, 0.9 (mean 1.0) -> the same; row 1: s = 1, 3 and a masked token (mean 2) -> 0.5, 1.5, 0;
    # row 2: every token certain (mean 0) -> 1 where scored
    logp = torch.tensor([[-0.1, -2.0, -0.9], [-1.0, -3.0, -7.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]])
    assert_close(surprisal.weights(logp, mask), [[0.1, 2.0, 0.9], [0.5, 1.5, 0.0], [1.0, 0.0, 0.0]], rel=1e-6)


def test_u1_weighs_a_wrong_rollouts_advantage_only_and_keeps_its_sum():
    # A = -1 (wrong): -1 x [0.1, 2.0, 0.9] = [-0.1, -2.0, -0.9], sum -3.0 = 3 x -1; A = 0.5 (right): 0.5 everywhere
    # scored, whatever its weights; A = 0: 0
    w = torch.tensor([[0.1, 2.0, 0.9], [3.0, 0.0, 0.0], [2.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0]])
    got = surprisal.token_advantages(torch.tensor([-1.0, 0.5, 0.0]), w, mask)
    assert_close(got, [[-0.1, -2.0, -0.9], [0.5, 0.5, 0.5], [0.0, 0.0, 0.0]], rel=1e-6)
    assert abs(got[0].sum().item() - 3 * -1.0) < 1e-6


def test_the_surprisal_rule_in_the_table_blames_by_surprisal(base):
    model, tok = base
    # a group of 2: one right (reward 1), one wrong; G1 gives them +0.707 and -0.707 (std-scaled)
    logp = torch.tensor([[-0.5, -0.5, -0.5], [-0.2, -1.0, -0.3]])  # row 1: s = 0.2, 1.0, 0.3, mean 0.5
    mask = torch.ones(2, 3)
    batch = {"logprobs": logp, "input_ids": torch.zeros(2, 5, dtype=torch.long), "prompt_len": 2,
             "response_mask": mask}
    from types import SimpleNamespace
    ctx = methods.Context(SimpleNamespace(no_std_scale=False, device="cpu"), model, tok, [])
    rule = methods.RULES["surprisal"]
    adv = rule.advantages(batch, torch.tensor([[1.0, 0.0]]), mask, ctx)
    a = adv.seq[1].item()
    assert a < 0 and abs(adv.seq[0].item() + a) < 1e-6
    assert_close(adv.tokens[1], [a * 0.4, a * 2.0, a * 0.6], rel=1e-6)  # w = s / 0.5
    assert_close(adv.tokens[0], [-a] * 3, rel=1e-6)
    assert_close(rule.blame(adv, batch, mask, None), -logp, rel=1e-6)  # the surprisal itself
    assert rule.heatmap(adv, batch, mask, None).kind == "surprisal"


def test_a_short_surprisal_run_steps(base, tmp_path):
    run_dir = tmp_path / "run"
    train.main(["--method", "dapo+surprisal", "--steps", "2", "--prompts-per-step", "4", "--group-size", "4",
                "--eval-limit", "4", "--eval-every", "1000", "--save-every", "1000", "--no-final-save",
                "--run-dir", str(run_dir), "--threads", str(THREADS)])
    steps = [r for r in map(json.loads, open(run_dir / "metrics.jsonl")) if "accuracy" in r]
    assert len(steps) == 2 and all(s["nonfinite_updates"] == 0 for s in steps)
