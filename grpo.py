"""GRPO, equations G1-G5 of EQUATIONS.md#grpo, as pure functions over tensors.

Sources: DeepSeekMath (Shao et al., 2024, arXiv 2402.03300) for the objective and the group-normalised
advantage; Dr. GRPO (Liu et al., 2025, arXiv 2503.20783) for the two bias fixes (no std division, a
constant length normaliser). Shapes: B prompts, G rollouts each, N = B * G rows, T response tokens.
"""
import torch


def group_advantages(rewards: torch.Tensor, scale_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """G1. Outcome-supervised advantage, normalised within each group of G rollouts of one prompt.

        A_i = (r_i - mean(r)) / (std(r) + eps)     std unbiased (N-1), eps = 1e-6
        Dr. GRPO (scale_std=False):  A_i = r_i - mean(r)

    rewards: [B, G]. Returns [B, G]. A group whose rewards are all equal gets exactly 0 (std = 0, numerator 0).
    Example: r = [1, 1, 0, 0] -> mean 0.5, std sqrt(1/3) = 0.5774 -> A = [0.8660, 0.8660, -0.8660, -0.8660].
    """
    centred = rewards - rewards.mean(dim=1, keepdim=True)  # [B, G]
    if not scale_std:
        return centred
    return centred / (rewards.std(dim=1, keepdim=True) + eps)  # [B, G]


def ratio(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """G2. Per-token importance ratio rho = exp(log pi_theta - log pi_old). [N, T] -> [N, T]."""
    return torch.exp(logp - old_logp)


def clipped_surrogate(rho: torch.Tensor, adv: torch.Tensor, eps_low: float = 0.2, eps_high: float = None,
                      dual_clip: float = None):
    """G3 (and DAPO D1 when eps_high != eps_low). Per-token PPO surrogate, to be maximised:

        L = min( rho * A , clip(rho, 1 - eps_low, 1 + eps_high) * A )
        dual_clip = c (optional):  L = max(L, c * A) where A < 0   (so -L, the loss, is at most -A * c)

    rho, adv: [N, T] (a rollout advantage is broadcast to its tokens before the call). Returns L [N, T] and
    where the clip binds, split by side: low (rho < 1 - eps_low and A < 0), high (rho > 1 + eps_high and A > 0).
    Where it binds, L does not depend on rho, so the gradient there is exactly 0.

    dual_clip [why: the min() leaves a negative-advantage token unbounded as rho grows, L = rho * A -> -inf; a
    token whose ratio has exploded (stale buffered groups, several updates per batch, --mu > 1) then dominates the
    batch's loss and gradient. Dual-clip (Ye et al., 2020, arXiv 1912.09729; verl's clip_ratio_c, 3 by default)
    caps that token's loss at -A * c and gives it zero gradient, exactly where A < 0 and rho > c
    (dual_clip_active). None (the default, as in the GRPO and DAPO papers) runs the ops of plain G3 and nothing
    else, so the result is bit-identical to it.] c must be > 1 (c <= 1 would bound tokens inside the trust region).
    Example, c = 3: rho 5, A -1 -> min(-5, -1.2) = -5, max(-5, -3) = -3 (loss 3, gradient 0).
    """
    eps_high = eps_low if eps_high is None else eps_high
    unclipped = rho * adv  # [N, T]
    clipped = torch.clamp(rho, 1 - eps_low, 1 + eps_high) * adv  # [N, T]
    L = torch.minimum(unclipped, clipped)  # [N, T]
    if dual_clip is not None:
        if not dual_clip > 1:  # also catches nan
            raise ValueError(f"dual_clip {dual_clip}: must be greater than 1 (or None for no dual-clip)")
        L = torch.where(adv < 0, torch.maximum(L, dual_clip * adv), L)  # [N, T]
    clip_low = (rho < 1 - eps_low) & (adv < 0)  # [N, T]
    clip_high = (rho > 1 + eps_high) & (adv > 0)  # [N, T]
    return L, clip_low, clip_high


def dual_clip_active(rho: torch.Tensor, adv: torch.Tensor, dual_clip: float) -> torch.Tensor:
    """Where the dual-clip bound of clipped_surrogate binds: A < 0 and rho > c. [N, T] -> bool [N, T].
    (For A < 0 the G3 value is A * max(rho, clip(rho)), below c * A exactly when rho > c, as c > 1.)"""
    return (adv < 0) & (rho > dual_clip)  # [N, T]


K3_LOG_RATIO_MAX = 20.0  # |ref - logp| is clamped to this before exp(): exp(20) = 4.9e8 is finite in float32
K3_MAX = 10.0  # and the per-token k3 value to at most this (verl's low_var_kl clamps the same two)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """G4. k3 estimator of KL(pi_theta || pi_ref), per token: exp(ref - logp) - (ref - logp) - 1 >= 0. [N, T].

    Clamped as verl clamps it [why: one token whose log-ratio d = ref - logp is far from 0 would otherwise give
    exp(d) = inf in float32 (d > 88.7), inf * 0 = NaN in the backward, and a NaN update]: d to [-20, 20] before
    the exp, the value to at most 10. A clamped token has zero KL gradient. k3 reaches 10 at d = 2.61 and d = -11.0,
    so the log-ratio clamp only matters where the value clamp already holds: it keeps the backward finite. Inside
    those ranges both clamps are identities on values and gradients, bit for bit.
    """
    d = (ref_logp - logp).clamp(-K3_LOG_RATIO_MAX, K3_LOG_RATIO_MAX)  # [N, T]
    return (torch.exp(d) - d - 1).clamp(max=K3_MAX)  # [N, T]


def aggregate(x: torch.Tensor, mask: torch.Tensor, mode: str, max_new_tokens: int = None,
              n_seqs: int = None, n_tokens: float = None) -> torch.Tensor:
    """G5. Reduce per-token values x [N, T] over the masked tokens to one scalar.

        seq-mean-token-mean      (GRPO):     (1/G) sum_i (1/|o_i|) sum_t m x
        token-mean               (DAPO D3):  sum_{i,t} m x / sum_{i,t} m
        seq-mean-token-sum-norm  (Dr. GRPO): (1/G) sum_i sum_t m x / L_max

    Under gradient accumulation pass the *whole batch's* n_seqs (number of rollouts) and n_tokens (number of
    masked tokens): each micro-batch then contributes its share, and the micro-batch values add up to the
    full-batch value. Left as None they are this call's own counts.
    Example: x = [[1, 2, pad], [3, pad, pad]] -> seq-mean-token-mean (1.5 + 3) / 2 = 2.25, token-mean 6 / 3 = 2,
    seq-mean-token-sum-norm with L_max 4: (3/4 + 3/4) / 2 = 0.75.
    """
    mask = mask.to(x.dtype)
    n_seqs = x.shape[0] if n_seqs is None else n_seqs
    if mode == "seq-mean-token-mean":
        per_seq = (x * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # [N]
        return per_seq.sum() / n_seqs
    if mode == "token-mean":
        n_tokens = mask.sum() if n_tokens is None else n_tokens
        return (x * mask).sum() / max(float(n_tokens), 1.0)
    if mode == "seq-mean-token-sum-norm":
        return (x * mask).sum() / (n_seqs * max_new_tokens)
    raise ValueError(f"unknown aggregation {mode!r}")


def policy_loss(logp, old_logp, adv, mask, *, eps_low=0.2, eps_high=None, dual_clip=None, beta=0.0, ref_logp=None,
                agg="seq-mean-token-mean", max_new_tokens=None, n_seqs=None, n_tokens=None, extra=None):
    """G2-G5 together: loss = -aggregate( L_{i,t} - beta * KL_{i,t} ) + aggregate(extra). All tensors [N, T]; adv
    is per token; extra (optional) a method's own loss per token (methods.TERMS: SDPG's P2-P3), aggregated as the
    surrogate is and logged as loss_term.

    Returns the loss (a scalar to backpropagate) and detached statistics: the policy term, the KL term and
    the clip fractions, each aggregated the same way, so that a micro-batch's values also add up. With dual_clip
    (G3's optional bound, None = off) the statistics also hold clip_dual, the share of tokens where it binds.
    With one update per batch rho = 1 at the gradient, the clip never binds and the loss value is ~0 by
    construction (normalised advantages have mean 0): watch reward and accuracy, not this number.
    """
    rho = ratio(logp, old_logp)  # [N, T]
    L, clip_low, clip_high = clipped_surrogate(rho, adv, eps_low, eps_high, dual_clip)  # [N, T]
    agg_kw = dict(mode=agg, max_new_tokens=max_new_tokens, n_seqs=n_seqs, n_tokens=n_tokens)
    objective = aggregate(L, mask, **agg_kw)
    kl = torch.zeros((), device=logp.device)
    if beta > 0:
        kl = aggregate(kl_k3(logp, ref_logp), mask, **agg_kw)
        objective = objective - beta * kl
    if extra is not None:
        objective = objective - aggregate(extra, mask, **agg_kw)
    stats = {
        "policy_term": aggregate(L.detach(), mask, **agg_kw).item(),
        "kl": kl.item(),
        # clip fractions are shares of tokens, whatever the aggregation of the loss
        "clip_low": aggregate(clip_low.float(), mask, "token-mean", n_tokens=n_tokens).item(),
        "clip_high": aggregate(clip_high.float(), mask, "token-mean", n_tokens=n_tokens).item(),
    }
    if extra is not None:
        stats["loss_term"] = aggregate(extra.detach(), mask, **agg_kw).item()
    if dual_clip is not None:
        stats["clip_dual"] = aggregate(dual_clip_active(rho.detach(), adv, dual_clip).float(), mask, "token-mean",
                                       n_tokens=n_tokens).item()
    return -objective, stats
