"""D1-D4 of EQUATIONS.md#dapo by hand, and dynamic sampling refilling a real batch."""
import json

import pytest
import torch

import dapo
import grpo
import train


def test_d1_clip_higher_values_and_zero_gradient_where_it_binds():
    # eps_low 0.2, eps_high 0.28: the range is [0.8, 1.28]
    # rho 1.25, A +1 -> 1.25 (inside: gradient 1);  rho 1.30, A +1 -> 1.28 (clipped high: gradient 0)
    # rho 0.75, A -1 -> min(-0.75, -0.8) = -0.8 (clipped low: gradient 0);  rho 0.75, A +1 -> 0.75 (gradient 1)
    # rho 1.30, A -1 -> min(-1.3, -1.28) = -1.3 (unclipped: gradient -1)
    rho = torch.tensor([1.25, 1.30, 0.75, 0.75, 1.30], requires_grad=True)
    A = torch.tensor([1.0, 1.0, -1.0, 1.0, -1.0])
    L, low, high = grpo.clipped_surrogate(rho, A, eps_low=0.2, eps_high=0.28)  # D1 is G3 with two epsilons
    assert torch.allclose(L, torch.tensor([1.25, 1.28, -0.8, 0.75, -1.3]))
    assert high.tolist() == [False, True, False, False, False] and low.tolist() == [False, False, True, False, False]
    L.sum().backward()
    assert rho.grad.tolist() == [1.0, 0.0, 0.0, 1.0, -1.0]


def test_d2_mixed_groups():
    correct = torch.tensor([[1, 0, 1], [1, 1, 1], [0, 0, 0], [0, 0, 1]], dtype=torch.bool)
    assert dapo.mixed_groups(correct).tolist() == [True, False, False, True]


def test_d3_token_level_loss_weighs_tokens_not_sequences():
    # rollout 1 has 3 tokens of value 1, rollout 2 one token of value 5: token-mean (3 + 5) / 4 = 2,
    # where seq-mean-token-mean would give (1 + 5) / 2 = 3
    x = torch.tensor([[1.0, 1.0, 1.0], [5.0, 0.0, 0.0]])
    m = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert grpo.aggregate(x, m, "token-mean").item() == pytest.approx(2.0)  # D3 is G5's token-mean


def test_d4_overlong_penalty_boundaries():
    # L_max = 48, L_cache = 8: 0 up to 40 = L_max - L_cache; then (40 - |y|) / 8; -1 beyond 48
    lengths = torch.tensor([10, 40, 41, 44, 48, 49])
    got = dapo.overlong_penalty(lengths, L_max=48, L_cache=8)
    assert torch.allclose(got, torch.tensor([0.0, 0.0, -1 / 8, -0.5, -1.0, -1.0]))
    # DAPO's own numbers: L_max 20480, L_cache 4096: 16384 -> 0, 18432 -> -0.5, 20480 -> -1, 20481 -> -1
    got = dapo.overlong_penalty(torch.tensor([16384, 18432, 20480, 20481]), 20480, 4096)
    assert torch.allclose(got, torch.tensor([0.0, -0.5, -1.0, -1.0]))


def test_d4_overlong_filter_and_signed_reward():
    mask = torch.ones(3, 4, dtype=torch.long)
    assert dapo.overlong_filter(mask, torch.tensor([False, True, False])).sum(-1).tolist() == [4, 0, 4]
    assert dapo.signed_reward(torch.tensor([True, False])).tolist() == [1.0, -1.0]


def test_dynamic_sampling_refills_the_batch(base, tmp_path):
    run_dir = tmp_path / "dapo"
    train.main(["--method", "dapo", "--steps", "3", "--eval-every", "1000", "--save-every", "1000",
                "--run-dir", str(run_dir)])
    steps = [json.loads(l) for l in open(run_dir / "metrics.jsonl") if "groups_kept" in l]
    assert all(s["groups_kept"] == 16 and s["zero_adv_groups"] == 0 for s in steps)
    assert any(s["sampling_rounds"] >= 2 and s["groups_generated"] > 16 for s in steps)  # a refill happened
    assert all(s["groups_generated"] == 16 * s["sampling_rounds"] for s in steps)
    # --keep-surplus (on for dapo): what a step found beyond its 16 groups opens the next step
    for a, b in zip(steps, steps[1:]):
        assert b["groups_carried_in"] == a["groups_carried_in"] + a["groups_mixed"] - 16


def test_without_surplus_nothing_is_carried(base, tmp_path):
    run_dir = tmp_path / "dapo"
    train.main(["--method", "dapo", "--no-keep-surplus", "--steps", "2", "--eval-every", "1000",
                "--save-every", "1000", "--run-dir", str(run_dir)])
    steps = [json.loads(l) for l in open(run_dir / "metrics.jsonl") if "groups_kept" in l]
    assert all(s["groups_carried_in"] == 0 and s["groups_kept"] == 16 for s in steps)


def test_dapo_resumes_with_its_surplus(base, tmp_path):
    common = ["--method", "dapo", "--prompts-per-step", "4", "--group-size", "4", "--eval-every", "1000",
              "--save-every", "2"]
    train.main(["--steps", "4", *common, "--run-dir", str(tmp_path / "full")])
    train.main(["--steps", "2", *common, "--run-dir", str(tmp_path / "b")])
    train.main(["--steps", "4", "--resume", *common, "--run-dir", str(tmp_path / "b")])
    key = lambda d: [(m["step"], m["groups_carried_in"], m["reward_mean"]) for m in  # noqa: E731
                     map(json.loads, open(tmp_path / d / "metrics.jsonl")) if "groups_kept" in m]
    assert key("b") == pytest.approx(key("full"))


def test_dynamic_sampling_can_stop_with_a_message(base, tmp_path):
    with pytest.raises(SystemExit, match="D2 dynamic sampling: only .* of 16 groups"):
        train.main(["--method", "dapo", "--steps", "1", "--max-sampling-rounds", "1", "--short-batch", "stop",
                    "--eval-every", "1000", "--run-dir", str(tmp_path / "stop")])
