"""DAPO: the four changes to GRPO, equations D1-D4 of ../shared/papers/dapo.md, each one switchable.

Source: Yu et al., 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", arXiv 2503.14476.
DAPO uses no KL term (beta = 0) and rewards +1 (correct) / -1 (incorrect). Shapes: B prompts, G rollouts each,
N = B * G rows, T response tokens.

The paper's ablation ladder is a sequence of train.py flags on the same loop:
    --overlong-filter  --eps-high 0.28  --overlong-buffer L_cache  --agg token-mean  --dynamic-sampling
and --method dapo turns them all on.
"""
import torch

import grpo


def signed_reward(correct: torch.Tensor) -> torch.Tensor:
    """DAPO's correctness reward: +1 if correct, -1 otherwise. correct [...] bool -> float."""
    return correct.float() * 2 - 1


def clip_higher(rho: torch.Tensor, adv: torch.Tensor, eps_low: float = 0.2, eps_high: float = 0.28):
    """D1. Clip-Higher, the decoupled clip range:
        L = min( rho A , clip(rho, 1 - eps_low, 1 + eps_high) A )
    A larger eps_high lets low-probability tokens with A > 0 grow more before the clip binds (against entropy
    collapse). It is G3 with two epsilons: returns (L, clip_low, clip_high) as grpo.clipped_surrogate does."""
    return grpo.clipped_surrogate(rho, adv, eps_low, eps_high)


def mixed_groups(correct: torch.Tensor) -> torch.Tensor:
    """D2. Dynamic sampling's filter: keep groups with 0 < #correct < G. correct [B, G] bool -> keep [B] bool.
    A group that is all right or all wrong has zero advantage (G1) and only dilutes the batch."""
    n = correct.sum(dim=1)  # [B]
    return (n > 0) & (n < correct.shape[1])


def token_level_loss(x: torch.Tensor, mask: torch.Tensor, n_tokens=None) -> torch.Tensor:
    """D3. Token-level policy-gradient loss: the mean over all tokens of all rollouts in the batch,
    sum_{i,t} m x / sum_{i,t} m, so a long rollout counts per token (grpo.aggregate's token-mean)."""
    return grpo.aggregate(x, mask, "token-mean", n_tokens=n_tokens)


def overlong_penalty(lengths: torch.Tensor, L_max: int, L_cache: int) -> torch.Tensor:
    """D4. Soft overlong punishment, added to the correctness reward. lengths [N] (response tokens) -> [N]:

        0                                   if |y| <= L_max - L_cache
        ((L_max - L_cache) - |y|) / L_cache if L_max - L_cache < |y| <= L_max
        -1                                  if |y| >  L_max
    Example, L_max = 48, L_cache = 8: |y| = 40 -> 0, 44 -> -0.5, 48 -> -1, 49 -> -1.
    """
    lengths = lengths.float()
    ramp = ((L_max - L_cache) - lengths) / L_cache  # [N]
    penalty = torch.where(lengths <= L_max - L_cache, torch.zeros_like(lengths), ramp)
    return torch.where(lengths > L_max, -torch.ones_like(lengths), penalty)


def overlong_filter(mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """D4's companion, overlong filtering: truncated rollouts (no EOS within the budget) leave the loss.
    mask [N, T], truncated [N] bool -> mask [N, T]."""
    return mask * (~truncated).to(mask.dtype)[:, None]
