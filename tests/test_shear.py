"""SHEAR as Algorithm 1, S1-S5 of EQUATIONS.md#shear: each equation on numbers checked by hand (the arithmetic in the
comments), S3's Sinkhorn against exact transports (by hand, and scipy's assignment solver), the rule on the tiny
model."""
import math

import pytest
import torch
from scipy.optimize import linear_sum_assignment

import grpo
import methods
import sample
import shear
from config import training

EPS, ITERS = 0.05, 100  # the knobs' defaults


def test_s3_two_points_each_against_the_exact_transport():
    # x = {(0, 0), (1, 0)}, y = {(0, 1), (1, 1)}: C = [[1, sqrt 2], [sqrt 2, 1]]; straight up costs (1 + 1) / 2 = 1,
    # crossed (sqrt 2 + sqrt 2) / 2 = 1.414, so W1 = 1. e = 0.05 x mean C = 0.05 (2 + 2 sqrt 2) / 4 = 0.060355
    x, y = torch.tensor([[[0.0, 0.0], [1.0, 0.0]]]), torch.tensor([[[0.0, 1.0], [1.0, 1.0]]])
    got = shear.sinkhorn_w1(x, torch.ones(1, 2), y, torch.ones(1, 2), EPS, ITERS)  # [1, 1]
    e = EPS * (2 + 2 * math.sqrt(2)) / 4
    assert 1 - 1e-6 <= got.item() <= 1 + e * math.log(2)  # W1 <= W_eps <= W1 + e log n
    # the 2 x 2 plan is [[p, 1/2 - p], [1/2 - p, p]], (1/2 - p) / p = exp(-D / 2e), D = 2 sqrt 2 - 2 what crossing
    # adds: W_eps = 1 + D / (2 (1 + exp(D / 2e))) = 1 + 0.8284 / (2 x 957.4) = 1.000433
    D = 2 * math.sqrt(2) - 2
    assert got.item() == pytest.approx(1 + D / (2 * (1 + math.exp(D / (2 * e)))), abs=1e-6)
    # a padded point (mask 0), however far, is not there; a cloud with no point has no distance (inf)
    y3 = torch.tensor([[[0.0, 1.0], [50.0, 50.0], [1.0, 1.0]]])
    assert torch.allclose(shear.sinkhorn_w1(x, torch.ones(1, 2), y3, torch.tensor([[1, 0, 1]]), EPS, ITERS), got)
    assert shear.sinkhorn_w1(x, torch.zeros(1, 2), y, torch.ones(1, 2), EPS, ITERS).item() == math.inf


def test_s3_sinkhorn_against_scipys_exact_assignment():
    # equal-size uniform clouds: W1 is an assignment's mean cost, which linear_sum_assignment finds exactly; every
    # cloud of x against every cloud of y at once, [3, 4]
    torch.manual_seed(0)
    x, y = torch.randn(3, 6, 5), torch.randn(4, 6, 5) + 0.5
    got = shear.sinkhorn_w1(x, torch.ones(3, 6), y, torch.ones(4, 6), EPS, ITERS)  # [3, 4]
    for a in range(3):
        for b in range(4):
            C = torch.cdist(x[a].double(), y[b].double()).numpy()  # [6, 6]
            w1 = C[linear_sum_assignment(C)].mean()
            assert w1 - 1e-5 <= got[a, b].item() <= w1 + EPS * C.mean() * math.log(6)


def test_s2_windows_start_every_s_tokens_and_the_last_reaches_the_end():
    # K = 1 + ceil((T - w) / s): T = 10, w = 4, s = 3: 1 + 2 = 3 windows [0, 4), [3, 7), [6, 10)
    starts, ends = shear.windows(10, 4, 3)
    assert starts.tolist() == [0, 3, 6] and ends.tolist() == [4, 7, 10]
    # T = 11: 1 + ceil(7 / 3) = 4, the last [9, 11) shorter (the paper's min(a_k + w - 1, T))
    starts, ends = shear.windows(11, 4, 3)
    assert starts.tolist() == [0, 3, 6, 9] and ends.tolist() == [4, 7, 10, 11]
    # shorter than a window: one window of all of it; empty: none
    assert [t.tolist() for t in shear.windows(3, 4, 1)] == [[0], [3]]
    assert [t.tolist() for t in shear.windows(0, 4, 1)] == [[], []]
    # the paper's w = 100, s = 25 on 3,000 tokens: 1 + 2,900 / 25 = 117 windows, the last [2900, 3000)
    starts, ends = shear.windows(3000, 100, 25)
    assert len(starts) == 117 and (starts[-1].item(), ends[-1].item()) == (2900, 3000)


def test_s2_the_window_rule_fits_short_and_long_answers():
    # w = min(w_max, max(2, ceil(mean / 4))), s = max(1, w // 4): mean 40 -> (10, 2); mean 3,000 -> (100, 25)
    assert shear.window_size(torch.tensor([30, 50]), 100) == (10, 2)
    assert shear.window_size(torch.tensor([2900, 3100]), 100) == (100, 25)
    assert shear.window_size(torch.tensor([3, 0]), 100) == (2, 1)  # ceil(1.5 / 4) = 1, at least 2
    assert shear.window_size(torch.tensor([40]), 100, stride=7) == (10, 7)  # a fixed stride
    assert shear.window_size(torch.tensor([40]), 100, stride=20) == (10, 10)  # at most w: no token left out
    # coverage: lengths 5 (w = 4, s = 2: 1 + ceil(1 / 2) = 2 windows, [0, 4) and [2, 5)) and 0 (none)
    cover = shear.coverage(torch.tensor([[1, 1, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0]]), 4, 2)  # [2, 2, 6]
    assert cover[0].int().tolist() == [[1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 0]] and not cover[1].any()


def test_s3_each_window_keeps_its_nearest_window_of_the_other_outcome():
    # single-point windows (w = s = 1): W1 of two points is their distance. Wrong rollout A: (0, 0), (3, 4); right
    # rollouts B: (0, 1) and C: (6, 8), (0, 1)
    h = torch.tensor([[[0.0, 0.0], [3.0, 4.0]], [[0.0, 1.0], [0.0, 0.0]], [[6.0, 8.0], [0.0, 1.0]]])  # [3, 2, 2]
    mask, correct = torch.tensor([[1, 1], [1, 0], [1, 1]]), torch.tensor([False, True, True])
    cover = shear.coverage(mask, 1, 1)  # [3, 2, 2]
    d = shear.window_distances(h, cover, correct, 1, 1, EPS, ITERS)  # [3, 2]
    r18 = math.sqrt(18)
    # A (0, 0): min(1 to B, 10 and 1 to C) = 1; A (3, 4): min(sqrt 18 to B, 5 and sqrt 18 to C) = 4.243
    # B (0, 1): min(1, sqrt 18) = 1: C's (0, 1), at 0, is of its own outcome and never compared; B's window 2: none
    # C (6, 8): min(10, 5) = 5; C (0, 1): min(1, sqrt 18) = 1
    assert torch.allclose(d, torch.tensor([[1.0, r18], [1.0, math.inf], [5.0, 1.0]]), atol=1e-5)
    # any number of windows a solve (speed only): the same numbers
    assert torch.equal(shear.window_distances(h, cover, correct, 1, 1, EPS, ITERS, max_elements=1), d)


def _example():
    """The module docstring's worked example: H = 1, a wrong rollout [0, 1, 4], a right one [0, 2]."""
    h = torch.tensor([[0.0, 1.0, 4.0], [0.0, 2.0, 0.0]])[..., None]  # [2, 3, 1]
    return h, torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]), torch.tensor([False, True])


def test_s3_windows_of_two_states_by_hand():
    # w = 2, s = 1: W1({0, 1}, {0, 2}) = (0 + 1) / 2 = 0.5, W1({1, 4}, {0, 2}) = (1 + 2) / 2 = 1.5; the right rollout's
    # one window keeps min(0.5, 1.5). Sinkhorn's excess: D (1/2 - p) = 2 / (1 + exp(D / 2e)), D = 2, e = 0.05 x
    # mean C (1 and 2): 4e-9 and 9e-5
    h, mask, correct = _example()
    d = shear.window_distances(h, shear.coverage(mask, 2, 1), correct, 2, 1, EPS, ITERS)  # [2, 2]
    assert torch.allclose(d, torch.tensor([[0.5, 1.5], [0.5, math.inf]]), atol=2e-4)


def test_s4_the_farthest_window_holding_a_token_over_the_groups_mean_norm():
    cover = shear.coverage(torch.ones(1, 3), 2, 1)  # [1, 2, 3] windows [0, 2) and [1, 3)
    n_bar = torch.tensor(1.4)
    # token 0 in window 0 only: 0.5 / 1.4 = 0.357; tokens 1 (both windows: max(0.5, 1.5)) and 2: 1.5 / 1.4 = 1.071
    omega, measured, top = shear.weights(torch.tensor([[0.5, 1.5]]), cover, n_bar, torch.ones(1, 3))
    assert torch.allclose(omega, torch.tensor([[0.5, 1.5, 1.5]]) / 1.4) and torch.equal(measured, torch.ones(1, 3))
    assert torch.allclose(top, torch.tensor([[0.5, 1.5, 1.5]]))
    # a window with nothing to compare with (inf) does not count: token 2, in it alone, keeps 1
    omega, measured, _ = shear.weights(torch.tensor([[0.5, math.inf]]), cover, n_bar, torch.ones(1, 3))
    assert torch.allclose(omega, torch.tensor([[0.5 / 1.4, 0.5 / 1.4, 1.0]])) and measured.tolist() == [[1, 1, 0]]
    # n_bar over the scored tokens: |(3, 4)| = 5 and |(0, 0)| = 0: 2.5; the second unscored: 5
    h = torch.tensor([[[3.0, 4.0], [0.0, 0.0]]])
    assert shear.mean_norm(h, torch.ones(1, 2)).item() == 2.5 and shear.mean_norm(h, torch.tensor([[1, 0]])) == 5
    # the worked example end to end: n_bar = (0 + 1 + 4 + 0 + 2) / 5 = 1.4, no per-rollout renormalisation
    h, mask, correct = _example()
    omega, got = shear.group_weights(h, mask, correct, window=2, eps=EPS, iters=ITERS)
    assert torch.allclose(omega, torch.tensor([[0.5, 1.5, 1.5], [0.5, 0.5, 0.0]]) / 1.4, atol=2e-4)
    assert got["n_bar"][0, 0].item() == pytest.approx(1.4) and got["windows"].tolist() == [[1, 2, 1], [1, 1, 0]]


def test_s4_one_outcome_short_and_empty_responses():
    h, mask, _ = _example()
    # a group of one outcome has no other set: GRPO's weight 1 on every scored token, nothing measured
    omega, got = shear.group_weights(h, mask, torch.tensor([True, True]), window=100, eps=EPS, iters=ITERS)
    assert torch.equal(omega, mask) and not got["measured"].any()
    # a response shorter than the window is one window: lengths 40 and 2, mean 21: w = ceil(21 / 4) = 6 > 2
    torch.manual_seed(0)
    h2, mask2 = torch.randn(2, 40, 3), torch.zeros(2, 40)
    mask2[0], mask2[1, :2] = 1, 1
    omega, got = shear.group_weights(h2, mask2, torch.tensor([False, True]), window=100, eps=EPS, iters=ITERS)
    assert got["window"][0, 0] == 6 and shear.coverage(mask2, 6, 1)[1].any(-1).sum() == 1
    assert torch.isfinite(omega).all() and got["measured"][1, :2].all() and not omega[1, 2:].any()
    # an empty response (all its mask 0): no token to weigh, no NaN; when it is the only wrong one, the right
    # ones have nothing to compare with and keep 1
    mask3 = mask.clone()
    mask3[0] = 0
    omega, got = shear.group_weights(h, mask3, torch.tensor([False, True]), window=2, eps=EPS, iters=ITERS)
    assert torch.equal(omega, mask3) and not got["measured"].any() and torch.isfinite(omega).all()


def test_s5_the_advantage_times_the_weight_and_the_losss_gradient():
    # A = [-0.8, 0.8], weights [2, 0] and [1, 1]: A_t = [-1.6, 0] and [0.8, 0.8] (the sign A_i's); no gradient
    w = torch.tensor([[2.0, 0.0], [1.0, 1.0]], requires_grad=True)
    adv = shear.token_advantages(torch.tensor([-0.8, 0.8]), w, torch.ones(2, 2))
    assert torch.allclose(adv, torch.tensor([[-1.6, 0.0], [0.8, 0.8]])) and not adv.requires_grad
    # at rho = 1 the seq-mean-token-mean loss's gradient is -A_t / (N |o_i|) = -A_t / 4
    logp = torch.zeros(2, 2, requires_grad=True)
    loss, _ = grpo.policy_loss(logp, torch.zeros(2, 2), adv, torch.ones(2, 2))
    loss.backward()
    assert torch.allclose(logp.grad, -adv / 4)


def test_s1_the_last_layers_state_at_each_response_token(base):
    model, tok = base
    torch.manual_seed(0)
    batch = sample.generate(model, [tok("Q:7+8-9=?\nA:")["input_ids"], tok("Q:1+2=?\nA:")["input_ids"]], n=2,
                            max_new_tokens=20, temperature=1.0, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    got = shear.hidden_states(model, batch, torch.tensor([3, 0]), chunk=1)  # [2, T, H]
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    position_ids=sample.position_ids(batch["attention_mask"]), output_hidden_states=True)
    want = out.hidden_states[-1][[3, 0], batch["prompt_len"]:]  # [2, T, H] after the final norm
    assert torch.allclose(got, want, atol=1e-5)


def test_the_rule_weighs_mixed_groups_only_and_keeps_each_advantages_sign(base):
    model, tok = base
    torch.manual_seed(0)
    problems = [{"prompt": "Q:7+8-9=?\nA:", "answer": "6"}, {"prompt": "Q:1+2=?\nA:", "answer": "3"}]
    batch = sample.generate(model, [tok(p["prompt"])["input_ids"] for p in problems], n=4, max_new_tokens=30,
                            temperature=1.0, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    rewards = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])  # the second group all wrong: A_i = 0
    mask = batch["response_mask"].float()
    ctx = methods.Context(training.parse_args(["--method", "shear", "--group-size", "4"]), model, tok, problems)
    got = methods.RULES["shear"].advantages(batch, rewards, mask, ctx)
    assert torch.allclose(got.tokens, shear.token_advantages(got.seq, got.values, mask))
    assert torch.isfinite(got.tokens).all() and (got.tokens * got.seq[:, None] >= 0).all()  # A_i's sign, S5
    assert (got.values[:4] >= 0).all() and not torch.allclose(got.values[:4], mask[:4])  # the weights moved
    assert torch.equal(got.values[4:], mask[4:])  # an all-wrong group is not scored: GRPO's
    assert got.terms["S4 weight"] is got.values and got.terms["S2 window w (tokens)"][0, 0] >= 2
    # blame: a wrong rollout's highest weight (its advantage is negative)
    assert torch.equal(methods.RULES["shear"].blame(got, batch, mask, ctx.args), got.values)


@pytest.mark.parametrize("flags, message", [(["--shear-window", "0"], "--shear-window 0"),
                                            (["--shear-eps", "0"], "--shear-eps 0"),
                                            (["--shear-iters", "0"], "--shear-iters 0"),
                                            (["--shear-window", "4", "--shear-stride", "5"], "--shear-stride 5")])
def test_bad_settings_are_one_line_naming_the_flag(flags, message):
    with pytest.raises(SystemExit, match=message):
        training.parse_args_one_line(["--method", "shear", *flags])


def test_the_memory_plan_counts_the_sinkhorn_chunk_shear_uses():
    """infra/memory.py plans SHEAR's solves at shear.py's own chunk (it may not import an equation module)."""
    import inspect
    from infra import memory
    assert inspect.signature(shear.window_distances).parameters["max_elements"].default == memory.SINKHORN_ELEMENTS
    from infra import models
    cfg = models.load_config("tiny")  # H 128, I 384, 2 KV heads of 32: per layer 10 x 128 + 2 x 64 + 4 x 384 = 2944
    kw = dict(rollouts=16, gen_rollouts=16, prompt_len=4, max_new_tokens=3000, micro_batch=1, bf16=False,
              grad_checkpointing=False, reference=False, ref_on_cpu=False, group_size=8)
    plan = memory.memory_plan(cfg, forward_once="hidden states", **kw)["advantage"]
    got = next(v for k, v in plan.items() if k.startswith("SHEAR's Sinkhorn"))
    # (5 x 2^24 + 3000 x 8 x 3000) x 4 bytes = (83,886,080 + 72,000,000) x 4 = 623,544,320, less the forward's
    # freed work of one row: (4 + 3000 + 16) tokens x 2944 x 4 = 35,563,520
    assert got == 623_544_320 - 35_563_520
