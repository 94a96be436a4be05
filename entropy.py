"""The high-entropy minority: equation E1 of EQUATIONS.md#e1--high-entropy-minority, as pure functions over tensors.

Source: Wang et al., 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective Reinforcement
Learning for LLM Reasoning", arXiv 2506.01939 (TRL: `top_entropy_quantile`). Only the tokens sampled with the
batch's highest entropy, the "forking" ones, get a policy gradient; the rest keep their place in G5's normalisers
but add nothing. The entropies are those the sampler kept (sample.py). Shapes: N rollouts, T response tokens.

Worked example, share rho = 0.2, the batch's scored entropies [0.1, 0.2, 0.3, 0.4, 0.5]:
    tau = the 0.8-quantile = 0.4 + 0.2 * (0.5 - 0.4) = 0.42    (position 0.8 * 4 = 3.2 of the sorted list)
    only the token at 0.5 is kept: A_{i,t} = A_i there, 0 at the other four
"""
import torch


def entropy_threshold(entropy: torch.Tensor, mask: torch.Tensor, share: float) -> float:
    """E1's tau: the (1 - share)-quantile (linear interpolation, as torch.quantile) of the batch's scored tokens'
    entropies; entropy, mask [N, T]. Entropies [0.1, 0.2, 0.3, 0.4, 0.5], share 0.2: 0.4 + 0.2 * 0.1 = 0.42.
    None when no token is scored."""
    scored = entropy[mask.bool()].float()  # [n] every scored token of the batch
    return torch.quantile(scored, 1 - share).item() if scored.numel() else None


def top_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, share: float) -> torch.Tensor:
    """E1: the scored tokens whose sampling entropy is at least tau (above), i.e. the top `share` of the batch's
    tokens by entropy [N, T]. Entropies [0.1, 0.2, 0.3, 0.4, 0.5], share 0.2: tau = 0.42 -> only 0.5 is kept."""
    tau = entropy_threshold(entropy, mask, share)
    if tau is None:
        return torch.zeros_like(mask, dtype=torch.bool)
    return (entropy >= tau) & mask.bool()  # [N, T]


def token_advantages(adv_seq: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor, share: float) -> torch.Tensor:
    """E1: A_{i,t} = A_i m_{i,t} [H_{i,t} >= tau]. adv_seq [N] (G1), entropy and mask [N, T] -> [N, T]."""
    return adv_seq[:, None] * mask * top_entropy_mask(entropy, mask, share)  # [N, T]
