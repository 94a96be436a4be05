"""G1-G5 of EQUATIONS.md#grpo on numbers small enough to check by hand."""
import math

import pytest
import torch

import grpo
from conftest import assert_close


def test_g1_group_advantage_by_hand():
    # r = [1, 1, 0, 0]: mean 0.5, unbiased std = sqrt((4 * 0.25) / 3) = 0.57735 -> A = +-0.5 / 0.57735 = +-0.8660
    # r = [1, 0, 0, 0]: mean 0.25, std = sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5 -> A = [1.5, -0.5, -0.5, -0.5]
    r = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    A = grpo.group_advantages(r)
    s = 0.5 / math.sqrt(1 / 3)
    assert torch.allclose(A[0], torch.tensor([s, s, -s, -s]), atol=1e-5)
    assert torch.allclose(A[1], torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-5)


def test_g1_flat_group_is_exactly_zero_and_dr_grpo_skips_std():
    r = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    A = grpo.group_advantages(r)
    assert torch.equal(A, torch.zeros_like(r))  # exactly 0, not NaN
    # Dr. GRPO: r - mean(r) only; [1, 0, 0, 0] -> [0.75, -0.25, -0.25, -0.25]
    A = grpo.group_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]]), scale_std=False)
    assert torch.allclose(A, torch.tensor([[0.75, -0.25, -0.25, -0.25]]))


def test_g2_ratio():
    # exp(log 0.5 - log 0.25) = 2
    rho = grpo.ratio(torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)]))
    assert torch.allclose(rho, torch.tensor([2.0]))


def test_g3_clipped_surrogate_values_and_where_gradient_vanishes():
    # eps = 0.2. rho 1.5, A +1 -> min(1.5, 1.2) = 1.2 (clipped high, no gradient)
    #            rho 0.5, A -1 -> min(-0.5, -0.8) = -0.8 (clipped low, no gradient)
    #            rho 0.5, A +1 -> min(0.5, 0.8) = 0.5 (unclipped: gradient dL/drho = A = 1)
    #            rho 1.5, A -1 -> min(-1.5, -1.2) = -1.5 (unclipped: gradient -1)
    #            rho 1.1, A +2 -> 2.2 (inside the range: gradient 2)
    rho = torch.tensor([1.5, 0.5, 0.5, 1.5, 1.1], requires_grad=True)
    A = torch.tensor([1.0, -1.0, 1.0, -1.0, 2.0])
    L, low, high = grpo.clipped_surrogate(rho, A, eps_low=0.2)
    assert torch.allclose(L, torch.tensor([1.2, -0.8, 0.5, -1.5, 2.2]))
    assert low.tolist() == [False, True, False, False, False]
    assert high.tolist() == [True, False, False, False, False]
    L.sum().backward()
    assert torch.allclose(rho.grad, torch.tensor([0.0, 0.0, 1.0, -1.0, 2.0]))


def test_g4_k3_kl():
    # ref - logp = d: d = 0 -> 0; d = log 2 -> 2 - log 2 - 1 = 0.30685; d = -log 2 -> 0.5 + log 2 - 1 = 0.19315
    logp = torch.tensor([-1.0, -1.0 - math.log(2), -1.0 + math.log(2)], requires_grad=True)
    ref = torch.tensor([-1.0, -1.0, -1.0])
    kl = grpo.kl_k3(logp, ref)
    assert torch.allclose(kl, torch.tensor([0.0, 2 - math.log(2) - 1, 0.5 + math.log(2) - 1]), atol=1e-6)
    # d kl / d logp = -exp(d) + 1: 0, -1, +0.5
    kl.sum().backward()
    assert torch.allclose(logp.grad, torch.tensor([0.0, -1.0, 0.5]), atol=1e-6)


def old_clipped_surrogate(rho, adv, eps_low=0.2, eps_high=None):
    """grpo.clipped_surrogate as it was before dual_clip existed (its default must stay bit-identical to this)."""
    eps_high = eps_low if eps_high is None else eps_high
    L = torch.minimum(rho * adv, torch.clamp(rho, 1 - eps_low, 1 + eps_high) * adv)
    return L, (rho < 1 - eps_low) & (adv < 0), (rho > 1 + eps_high) & (adv > 0)


def test_g3_dual_clip_by_hand():
    # eps = 0.2, c = 3; G3 first, then max(L, c * A) where A < 0:
    #   rho 5,   A -1   -> min(-5, -1.2) = -5;     max(-5, -3) = -3     bound active: loss -A * c = 3, gradient 0
    #   rho 5,   A +1   -> min(5, 1.2) = 1.2 (clipped high, gradient 0); A > 0: unaffected
    #   rho 2,   A -1   -> min(-2, -1.2) = -2;     max(-2, -3) = -2     rho < c: gradient A = -1, as without it
    #   rho 0.5, A -2   -> min(-1, -1.6) = -1.6 (clipped low); max(-1.6, -6) = -1.6, gradient 0
    #   rho 4,   A -0.5 -> min(-2, -0.6) = -2;     max(-2, -1.5) = -1.5 bound active: gradient 0
    #   rho 1.1, A +2   -> 2.2, gradient 2
    A = torch.tensor([-1.0, 1.0, -1.0, -2.0, -0.5, 2.0])
    rho = torch.tensor([5.0, 5.0, 2.0, 0.5, 4.0, 1.1], requires_grad=True)
    L, low, high = grpo.clipped_surrogate(rho, A, eps_low=0.2, dual_clip=3.0)
    assert torch.allclose(L, torch.tensor([-3.0, 1.2, -2.0, -1.6, -1.5, 2.2]))
    assert -L[0].item() == pytest.approx(-A[0].item() * 3)  # the capped loss is -A * c
    assert low.tolist() == [False, False, False, True, False, False]
    assert high.tolist() == [False, True, False, False, False, False]
    assert grpo.dual_clip_active(rho, A, 3.0).tolist() == [True, False, False, False, True, False]
    L.sum().backward()
    assert rho.grad.tolist() == pytest.approx([0.0, 0.0, -1.0, 0.0, 0.0, 2.0])
    # without it the first token's loss is 5 and its gradient dL/drho = A = -1 (the unbounded side)
    rho.grad = None
    L, _, _ = grpo.clipped_surrogate(rho, A, eps_low=0.2)
    L.sum().backward()
    assert L[0].item() == pytest.approx(-5.0) and rho.grad[0].item() == pytest.approx(-1.0)
    for c in (1.0, 0.5, float("nan")):
        with pytest.raises(ValueError, match="greater than 1"):
            grpo.clipped_surrogate(rho, A, dual_clip=c)


@pytest.mark.parametrize("eps_high", [None, 0.28])
def test_g3_without_dual_clip_is_bit_identical_to_plain_g3(eps_high):
    torch.manual_seed(0)
    rho = torch.exp(0.5 * torch.randn(64, 9)).requires_grad_()
    adv = torch.randn(64, 1).expand(64, 9)
    new, old = grpo.clipped_surrogate(rho, adv, 0.2, eps_high), old_clipped_surrogate(rho, adv, 0.2, eps_high)
    for a, b in zip(new, old):
        assert torch.equal(a, b)
    g_new, = torch.autograd.grad(new[0].sum(), rho)
    g_old, = torch.autograd.grad(old[0].sum(), rho)
    assert torch.equal(g_new, g_old)
    # and a dual-clip bound no ratio reaches changes nothing either (max(rho) = exp(0.5 * 4.x) < 1e3)
    assert torch.equal(grpo.clipped_surrogate(rho, adv, 0.2, eps_high, dual_clip=1e3)[0], old[0])


def test_policy_loss_with_dual_clip_by_hand():
    # token-mean over 4 tokens, old logp 0, c = 3: rho = [[5, 1], [5, 1]], A = [[-1, -1], [+1, +1]]
    #   L = [[max(min(-5, -1.2), -3) = -3, -1], [min(5, 1.2) = 1.2, 1]] -> loss = -(-3 - 1 + 1.2 + 1) / 4 = 0.45
    #   (without dual-clip: -(-5 - 1 + 1.2 + 1) / 4 = 0.95)
    #   d loss / d logp = -(dL/drho) * rho / 4: [[0 (dual-clipped), -(-1 * 1) / 4 = 0.25], [0 (clipped high), -0.25]]
    #   clip_dual = 1/4 tokens, clip_high = 1/4
    logp = torch.tensor([[math.log(5), 0.0], [math.log(5), 0.0]], requires_grad=True)
    adv = torch.tensor([[-1.0, -1.0], [1.0, 1.0]])
    mask = torch.ones(2, 2)
    loss, st = grpo.policy_loss(logp, torch.zeros(2, 2), adv, mask, dual_clip=3.0, agg="token-mean")
    loss.backward()
    assert loss.item() == pytest.approx(0.45) and st["policy_term"] == pytest.approx(-0.45)
    assert st["clip_dual"] == 0.25 and st["clip_high"] == 0.25 and st["clip_low"] == 0
    assert logp.grad.tolist() == [pytest.approx([0.0, 0.25]), pytest.approx([0.0, -0.25])]
    loss, st = grpo.policy_loss(logp, torch.zeros(2, 2), adv, mask, agg="token-mean")
    assert loss.item() == pytest.approx(0.95) and "clip_dual" not in st  # reported only when it is on


def test_g4_k3_is_clamped_as_in_verl():
    # d = ref - logp = 30 -> clamped to 20 -> exp(20) - 20 - 1 = 4.85e8 -> clamped to 10, gradient 0
    # d = -30 -> clamped to -20 -> exp(-20) + 20 - 1 = 19.0 -> clamped to 10, gradient 0
    # d = 200: exp(200) is inf in float32; without the first clamp the backward would give inf * 0 = NaN
    # d = 2 -> e^2 - 3 = 4.389 (no clamp binds), gradient d kl / d logp = 1 - e^2 = -6.389
    logp = torch.tensor([-31.0, 29.0, -201.0, -3.0], requires_grad=True)
    ref = torch.tensor([-1.0, -1.0, -1.0, -1.0])
    kl = grpo.kl_k3(logp, ref)
    assert kl.tolist() == pytest.approx([10.0, 10.0, 10.0, math.exp(2) - 3])
    kl.sum().backward()
    assert torch.isfinite(logp.grad).all()
    assert logp.grad.tolist() == pytest.approx([0.0, 0.0, 0.0, 1 - math.exp(2)])


def test_g4_k3_clamps_change_nothing_in_the_normal_range():
    # |d| <= 2.5: k3 <= e^2.5 - 3.5 = 8.68 < 10, so both clamps are identities, values and gradients bit for bit
    torch.manual_seed(0)
    logp = (-3 * torch.rand(50, 7)).requires_grad_()
    ref = logp.detach() + (5 * torch.rand(50, 7) - 2.5)
    new = grpo.kl_k3(logp, ref)
    d = ref - logp
    old = torch.exp(d) - d - 1
    assert torch.equal(new, old)
    g_new, = torch.autograd.grad(grpo.kl_k3(logp, ref).sum(), logp)
    g_old, = torch.autograd.grad((torch.exp(ref - logp) - (ref - logp) - 1).sum(), logp)
    assert torch.equal(g_new, g_old)


X = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]])
M = torch.tensor([[1, 1, 0], [1, 0, 0]])


@pytest.mark.parametrize("mode,expected", [
    ("seq-mean-token-mean", (1.5 + 3.0) / 2),  # per sequence (1+2)/2 and 3/1, then mean over 2 sequences
    ("token-mean", (1 + 2 + 3) / 3),  # all 3 masked tokens
    ("seq-mean-token-sum-norm", ((1 + 2) + 3) / (2 * 4)),  # token sums over G * L_max, L_max = 4
])
def test_g5_aggregations(mode, expected):
    assert grpo.aggregate(X, M, mode, max_new_tokens=4).item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"])
def test_g5_micro_batches_add_up_to_the_full_batch(mode):
    torch.manual_seed(0)
    logp = torch.randn(6, 5, requires_grad=True)
    old = logp.detach() + 0.1 * torch.randn(6, 5)
    adv = torch.randn(6, 1).expand(6, 5)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0],
                         [1, 0, 0, 0, 0]])
    ref = old - 0.05
    kw = dict(agg=mode, max_new_tokens=5, beta=0.1)
    full, _ = grpo.policy_loss(logp, old, adv, mask, ref_logp=ref, **kw)
    g_full, = torch.autograd.grad(full, logp)
    total, g_acc = 0.0, torch.zeros_like(logp)
    for mb in (slice(0, 2), slice(2, 3), slice(3, 6)):  # uneven micro-batches
        part, _ = grpo.policy_loss(logp[mb], old[mb], adv[mb], mask[mb], ref_logp=ref[mb], n_seqs=6,
                                   n_tokens=mask.sum(), **kw)
        g, = torch.autograd.grad(part, logp)
        total, g_acc = total + part.item(), g_acc + g
    assert total == pytest.approx(full.item(), rel=1e-5, abs=1e-7)  # abs: the loss may be ~0
    # margin: 0, bit for bit on this project's CPU (2026-11-25); the tolerance is for other CPUs' kernels
    assert_close(g_acc, g_full, rel=1e-5, what="accumulated gradient")


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"])
def test_rollouts_with_zero_advantage_can_be_left_out_when_beta_is_0(mode):
    # train.py scores only the rollouts with a non-zero advantage. Rows 1 and 3 have A = 0: leaving them out, with
    # the whole batch's n_seqs = 4 and n_tokens = 2 + 3 + 4 + 1 = 10, must give the same loss, statistics and
    # gradient. By hand (token-mean): rho = exp(0 - (-0.1)) = 1.1052 < 1 + 0.2, so nothing clips;
    # d loss / d logp_{0,t} = -rho * A_0 / 10 = -0.11052 and d loss / d logp_{2,t} = -rho * (-0.5) / 10 = +0.05526.
    logp = torch.zeros(4, 4, requires_grad=True)
    old = torch.full((4, 4), -0.1)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    adv = torch.tensor([[1.0], [0.0], [-0.5], [0.0]]) * mask  # [4, 4]
    kw = dict(agg=mode, max_new_tokens=4, n_seqs=4, n_tokens=mask.sum())
    full, st_full = grpo.policy_loss(logp, old, adv, mask, **kw)
    g_full, = torch.autograd.grad(full, logp)
    rows = torch.tensor([0, 2])
    part, st_part = grpo.policy_loss(logp[rows], old[rows], adv[rows], mask[rows], **kw)
    g_part, = torch.autograd.grad(part, logp)
    assert part.item() == pytest.approx(full.item(), abs=1e-7) and st_part == pytest.approx(st_full, abs=1e-7)
    assert torch.allclose(g_part, g_full) and g_full[[1, 3]].abs().sum() == 0
    if mode == "token-mean":
        assert g_full[0, :2].tolist() == pytest.approx([-0.11052] * 2, abs=1e-5)
        assert g_full[2].tolist() == pytest.approx([0.05526] * 4, abs=1e-5)


def test_policy_loss_at_rho_one_is_the_policy_gradient():
    # mu = 1: rho = 1 where the gradient is taken, so d loss / d logp_{i,t} = -A_i / (G |o_i|) (seq-mean-token-mean)
    # rows: |o_1| = 2, A_1 = 1 -> -1/(2*2) = -0.25 ; |o_2| = 1, A_2 = -1 -> +1/(2*1) = 0.5
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0], [-1.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, stats = grpo.policy_loss(logp, logp.detach(), adv, mask)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-0.25, -0.25], [0.5, 0.0]]))
    assert stats["clip_low"] == 0 and stats["clip_high"] == 0
