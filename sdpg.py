"""SDPG: Self-Distilled Policy Gradient (Liu, Zhang, Zhang, Gu 2026, arXiv 2606.04036), P1-P4 of EQUATIONS.md#sdpg.

The same model, shown the gold answer as privileged context c, is a teacher for every response token: SDPG adds to
the policy-gradient loss the full-vocabulary KL from the student's next-token distribution (no context) to the
teacher's (with c, no gradient), and a small regulariser that keeps the sampled tokens' log-probs near the frozen
reference's. It is not a token rule (the advantages stay GRPO's): it adds loss terms, one value per token,
aggregated as the surrogate is (methods.TERMS).

    P1 surrogate        G3's clipped surrogate with DAPO's clip-higher and a dual clip (c = 10): the base's flags
    P2 token_kl         KL_t = sum_v p(v) (log p(v) - log q(v)), p the student's softmax at the sampling
                        temperature, q the teacher's at the same temperature; clamped at 20
    P3 regulariser      r = log pi_theta(o_t) - log pi_ref(o_t):  urkl (alpha/2) r^2, rkl (alpha/2) (r + 1)^2,
                        fkl alpha e^-r, ufkl alpha (e^-r + r)
    P4 beta_at          beta_eff = beta x the warm-up's share x the decay's share of the step;
       per_token        beta_eff KL_t (only where A > 0 with --sdpg-positive-only) + P3, added to P1's loss

A worked example of P2 on a vocabulary of three, temperature 1: student logits [0, 0, ln 2] give p = [1/4, 1/4, 1/2];
teacher log-probs log q = log [1/2, 1/4, 1/4]:

    KL = 1/4 ln(1/4 / 1/2) + 1/4 ln(1) + 1/2 ln(1/2 / 1/4) = -1/4 ln 2 + 1/2 ln 2 = 1/4 ln 2 = 0.1733

and of P3 (urkl, alpha = 0.002): r = -0.1 gives 0.001 x 0.01 = 1e-5, its gradient in log pi_theta alpha r = -2e-4.
"""
import torch

import sample

# P2's privileged context c, worded as data.Dataset.teacher_prompt takes it: the released data's teacher context
# (README of lauyikfung/SDPG), after the question (the tiny world keeps its own form)
HINT = ("{question}\n\nThe correct answer to this problem is: {answer}\n"
        "Use this to verify your reasoning, but show your full solution process.")
KL_MAX = 20.0  # the released clamp of KL_t (dp_actor.py): one far-off token cannot dominate the batch
MODES = ("urkl", "rkl", "fkl", "ufkl")


def token_kl(student_logits: torch.Tensor, teacher_logprobs: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """P2. KL(p || q) at each token over the whole vocabulary, p = softmax(student_logits / temperature) (with its
    gradient), q = exp(teacher_logprobs) (a constant). [..., V], [..., V] -> [..., ], clamped at KL_MAX. The docstring's
    example gives 0.1733 = ln(2) / 4."""
    logp = torch.log_softmax(student_logits.float() / temperature, -1)  # [..., V]
    kl = (logp.exp() * (logp - teacher_logprobs.detach().float())).sum(-1)  # [...]
    return kl.clamp(max=KL_MAX)


def regulariser(logp: torch.Tensor, ref_logp: torch.Tensor, alpha: float, mode: str = "urkl") -> torch.Tensor:
    """P3. alpha f(r) per token, r = logp - ref_logp (the reference a constant): [N, T], [N, T] -> [N, T].
    urkl (alpha/2) r^2; rkl (alpha/2) (r + 1)^2; fkl alpha e^-r; ufkl alpha (e^-r + r)."""
    r = logp - ref_logp.detach()  # [N, T]
    if mode == "urkl":
        return alpha / 2 * r ** 2
    if mode == "rkl":
        return alpha / 2 * (r + 1) ** 2
    if mode == "fkl":
        return alpha * torch.exp(-r)
    if mode == "ufkl":
        return alpha * (torch.exp(-r) + r)
    raise ValueError(f"P3 mode {mode!r}: choose from {', '.join(MODES)}")


def beta_at(step: int, beta: float, warmup: int = 0, decay: int = 0, total: int = 0) -> float:
    """P4's schedule: beta rises linearly from 0 over the first `warmup` steps and falls linearly to 0 over the last
    `decay` of `total` steps (0: off); step counts from 1 at the first update, as the released trainer's. beta_at(5,
    1e-3, warmup=10) = 5e-4; beta_at(95, 1e-3, decay=10, total=100) = 1e-3 x 5 / 10 = 5e-4."""
    b = beta * step / warmup if warmup > 0 and step < warmup else beta
    if decay > 0 and total > 0 and step >= total - decay:
        b *= max(total - step, 0) / decay
    return b


def per_token(kl: torch.Tensor, reg: torch.Tensor, adv: torch.Tensor, beta_eff: float,
              positive_only: bool = False) -> torch.Tensor:
    """P4. The loss SDPG adds at each token: beta_eff KL_t (where A_t > 0 only, with positive_only) + P3.
    kl, reg, adv [N, T] -> [N, T] (to be aggregated as the surrogate is, G5)."""
    gate = (adv > 0).to(kl.dtype) if positive_only else torch.ones_like(kl)  # [N, T]
    return beta_eff * kl * gate + reg  # [N, T]


def chunked_token_kl(head, student_hidden: torch.Tensor, teacher_hidden: torch.Tensor, temperature: float,
                     chunk_tokens: int) -> torch.Tensor:
    """P2 computed `chunk_tokens` tokens at a time from the last hidden states, so that no [N, T, V] tensor exists
    (at 1.5B, Qwen2.5's 151,936 ids x 3,000 tokens would be 1.8 GB a rollout in float32, and autograd would keep
    its softmax): each chunk's logits are made, reduced to KL_t and, under a gradient, recomputed in the backward
    (activation checkpointing). Memory and speed only: equal to token_kl on the whole logits (tests/test_sdpg.py).
    head: the output layer; student_hidden [N, T, H] with its gradient, teacher_hidden [N, T, H] -> [N, T]."""
    N, T, H = student_hidden.shape
    hs, ht = student_hidden.reshape(N * T, H), teacher_hidden.detach().reshape(N * T, H)  # [N T, H], [N T, H]
    out = []
    for s in range(0, N * T, chunk_tokens):
        args = (head, hs[s:s + chunk_tokens], ht[s:s + chunk_tokens], temperature)
        if torch.is_grad_enabled() and hs.requires_grad:
            out.append(torch.utils.checkpoint.checkpoint(_chunk_kl, *args, use_reentrant=False))
        else:
            out.append(_chunk_kl(*args))
    return torch.cat(out).view(N, T)  # [N, T]


def _chunk_kl(head, hs, ht, temperature):
    # the teacher at the student's temperature: the released code leaves the teacher's logits undivided, the same at
    # its scripts' temperature 1; at another (the SmolLM2 recipe's 0.5) that would pull the student's distribution
    # towards the temperature-1 one, a sharpness change, not the answer's evidence (EQUATIONS.md#sdpg, departures)
    with torch.no_grad():
        teacher = torch.log_softmax(head(ht).float() / temperature, -1)  # [c, V]
    return token_kl(head(hs), teacher, temperature)  # [c]


def teacher_hidden(model, prompts: list, responses: torch.Tensor, response_attn: torch.Tensor,
                   pad_id: int) -> torch.Tensor:
    """P2's teacher, the model reading prompts[i] (token ids of rollout i's privileged prompt) before the same
    response: its last hidden states [n, t, H] before the output layer, at the columns that predict each response
    token (as sample.token_logprobs's), without a gradient. responses, response_attn [n, t]."""
    ids, attn, P = sample.with_prompts(prompts, responses, response_attn, pad_id)  # [n, P' + t] each
    with torch.no_grad():
        h = model.get_decoder()(input_ids=ids, attention_mask=attn, position_ids=sample.position_ids(attn),
                                use_cache=False).last_hidden_state  # [n, P' + t, H]
    return h[:, P - 1:-1]  # [n, t, H]
