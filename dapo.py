"""DAPO: the four changes to GRPO, equations D1-D4 of EQUATIONS.md#dapo, each one switchable.

Source: Yu et al., 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", arXiv 2503.14476.
DAPO uses no KL term (beta = 0) and rewards +1 (correct) / -1 (incorrect). Shapes: B prompts, G rollouts each,
N = B * G rows, T response tokens.

Two of the four changes are options of GRPO's own functions, so they live there and are not written again:
    D1 clip-higher        = grpo.clipped_surrogate(rho, A, eps_low=0.2, eps_high=0.28)   (--eps-high 0.28)
    D3 token-level loss   = grpo.aggregate(x, mask, "token-mean")                       (--agg token-mean)
Edit those to change D1 or D3: they are what train.py runs. This file holds D2, D4 and DAPO's rewards.

The paper's ablation ladder is a sequence of train.py flags on the same loop:
    --overlong-filter  --eps-high 0.28  --overlong-buffer L_cache  --agg token-mean  --dynamic-sampling
and --method dapo turns on all of them but the overlong filter.
"""
from dataclasses import dataclass

import torch

import sample


@dataclass
class Draw:
    """The groups a step trains on and how they were drawn: one round of B groups (GRPO), or D2's rounds and
    buffer (fill_batch). What the step's log line reports of its sampling (infra/logbook.py)."""
    problems: list  # the groups' problems, in group order (fewer than B when D2 ran out of rounds)
    batch: dict  # their rollouts in sample.generate's layout, with "correct"; None when no group mixed (D2)
    generated: int  # groups sampled this step
    mixed: int  # of those, the groups that mix right and wrong answers (D2 keeps these only; GRPO all B)
    rounds: int = 1  # rounds of sampling
    carried: int = 0  # groups taken from the buffer of earlier steps
    buffer: tuple = ([], [])  # the mixed groups left for the next step: (problems, batches)


def signed_reward(correct: torch.Tensor) -> torch.Tensor:
    """DAPO's correctness reward, the base D4's penalty is added to (--signed-reward): +1 if correct, -1 otherwise.
    correct [...] bool -> float."""
    return correct.float() * 2 - 1


def mixed_groups(correct: torch.Tensor) -> torch.Tensor:
    """D2. Dynamic sampling's filter: keep groups with 0 < #correct < G. correct [B, G] bool -> keep [B] bool.
    A group that is all right or all wrong has zero advantage (G1) and only dilutes the batch."""
    n = correct.sum(dim=1)  # [B]
    return (n > 0) & (n < correct.shape[1])


def fill_batch(draw, B: int, G: int, max_rounds: int, buffer: tuple, keep_surplus: bool, pad_id: int) -> Draw:
    """D2 with DAPO's buffer (Algorithm 1): draw rounds of B groups until B of them mix right and wrong answers.

    draw() -> (problems, batch): one round of B problems and their B * G rollouts from sample.generate(), with
    batch["correct"] [B * G] bool. buffer = (problems, batches): mixed groups left over from the last step, used
    first (their log pi_old is an older policy's, which the ratio G2 accounts for; they are a step or two old).
    Returns the Draw: the first B mixed groups (batch None if there were none), and as its buffer the groups beyond
    B if keep_surplus, else none (verl drops them). After max_rounds the batch may hold fewer than B groups.
    Example, B = 2: a round with groups [mixed, all right] keeps 1; the next [mixed, mixed] brings it to 3: the
    batch is the first 2, and the third waits in the buffer.
    """
    problems, kept, generated, rounds = list(buffer[0]), list(buffer[1]), 0, 0
    while len(problems) < B and rounds < max_rounds:
        qs, b = draw()
        keep = mixed_groups(b["correct"].view(B, G))  # [B]
        problems += [q for q, k in zip(qs, keep) if k]
        kept.append(sample.select_rows(b, keep.repeat_interleave(G).nonzero().squeeze(1)))
        generated, rounds = generated + B, rounds + 1
    out = Draw(problems[:B], None, generated, len(problems) - len(buffer[0]), rounds, len(buffer[0]))
    if problems:
        pooled = sample.concat_batches(kept, pad_id)  # rounds differ in width: padded to the widest
        out.batch = sample.select_rows(pooled, torch.arange(len(out.problems) * G))
        if keep_surplus and len(problems) > B:
            out.buffer = (problems[B:], [sample.select_rows(pooled, torch.arange(B * G, len(problems) * G))])
    return out


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
