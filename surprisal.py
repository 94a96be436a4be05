"""Surprisal-weighted blame: equation U1 of EQUATIONS.md#u1--surprisal-weighted-blame, as pure functions over tensors.

This project's own rule, not a paper's. The attribution tables (docs/LOG.md, tools/attribution/) found that on
Qwen2.5-Coder's wrong answers the first wrong step is located best by a free baseline, the sampled tokens'
surprisal (-log p at the sampling temperature, step AUC 0.73-0.76), and by none of the papers' credit rules. U1 asks
whether training with that blame helps: a wrong rollout's negative advantage is spread over its tokens in proportion
to their surprisal, its total kept (the weights average 1 over the rollout); a right rollout's tokens keep A_i, as in
GRPO. The log-probs are those the sampler kept (sample.py). Shapes: N rollouts, T response tokens.

Worked example, a wrong rollout with A_i = -1 and log-probs [-0.1, -2.0, -0.9]:
    surprisal s = [0.1, 2.0, 0.9], its mean 1.0, so w = s / 1.0 = [0.1, 2.0, 0.9]
    A_{i,t} = A_i w_t = [-0.1, -2.0, -0.9]        (sum -3.0 = 3 x A_i, as GRPO's)
a right rollout with A_i = 0.5 keeps [0.5, 0.5, 0.5].
"""
import torch


def weights(logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """U1's w_{i,t} = s_{i,t} / mean_t' s_{i,t'} over the rollout's scored tokens, s = -log p of the sampled token;
    1 where a rollout's mean surprisal is 0 (every token certain), 0 outside the mask. logprobs, mask [N, T].
    weights([[-0.1, -2.0, -0.9]], [[1, 1, 1]]) == [[0.1, 2.0, 0.9]]"""
    m = mask.float()  # [N, T]
    s = -logprobs.float() * m  # [N, T] surprisal of the scored tokens
    mean = s.sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)  # [N, 1]
    return torch.where(mean > 0, s / mean.clamp(min=torch.finfo(torch.float32).tiny), m)  # [N, T]


def token_advantages(adv_seq: torch.Tensor, w: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """U1: A_{i,t} = A_i w_{i,t} where A_i < 0, A_i where A_i >= 0. adv_seq [N] (G1), w and mask [N, T] -> [N, T].
    A_i = [-1, 0.5], w = [[0.1, 2.0, 0.9], [3.0, 0.0, 0.0]] -> [[-0.1, -2.0, -0.9], [0.5, 0.5, 0.5]]"""
    wrong = (adv_seq < 0)[:, None]  # [N, 1]
    return adv_seq[:, None] * torch.where(wrong, w, torch.ones_like(w)) * mask  # [N, T]
