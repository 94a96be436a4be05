"""RLSD: RLVR with Self-Distillation (Yang, Qin, Si et al. 2026, arXiv 2604.03128), L1-L4 of EQUATIONS.md#rlsd.

The same model, shown privileged context (the reference answer) beside the question, is a teacher: where it finds a
sampled token likelier than the student did, the token is evidence for the answer. RLSD keeps the direction of
every update the verifier's (the sign of A_i) and lets that evidence set only its size, clipped near 1: a right
rollout's tokens the teacher agrees with, and a wrong rollout's tokens the teacher disagrees with, get more.

    L1 teacher_logprobs    log pi_T(o_t) = log pi(o_t | privileged prompt, o_<t): one no-grad forward, the policy
                           that sampled, at the sampling temperature (the student's are the sampler's log pi_old)
    L2 evidence            delta_t = log pi_T(o_t) - log pi_old(o_t)
    L3 weights             w_t = clip(exp(sign(A_i) delta_t), 1 - eps_w, 1 + eps_w)
    L4 token_advantages    A_{i,t} = A_i ((1 - lambda) + lambda w_t)

A worked example (eps_w = 0.2, lambda = 1): a wrong rollout (A_i = -0.8) whose tokens the teacher finds
log-likelier by delta = [0.5, 0, -0.1, -1]:

    exp(-delta) = [0.6065, 1, 1.1052, 2.7183]  ->  w = [0.8, 1, 1.1052, 1.2]
    A_{i,t} = -0.8 w = [-0.64, -0.8, -0.8841, -0.96]       (the token the teacher doubts most takes the most blame)
"""
import torch

import sample

# L1's privileged context, worded as data.Dataset.teacher_prompt takes it (the tiny world keeps its own form)
HINT = "{question}\n\nThe reference answer is {answer}."


def teacher_logprobs(model, batch: dict, teacher_prompts: list, rows: torch.Tensor, pad_id: int,
                     temperature: float, chunk: int, group_size: int) -> torch.Tensor:
    """L1. log pi_T [n, T] of each response token of the rollouts `rows` [n] of a sample.generate() batch, the model
    reading teacher_prompts[i] (token ids of rollout i's privileged prompt, unpadded) before the same response;
    no gradient, `chunk` rollouts a forward, each group's prompt run once (sample.token_logprobs)."""
    P, ids, attn = batch["prompt_len"], batch["input_ids"], batch["attention_mask"]
    out = []
    with torch.no_grad():
        for s in range(0, len(rows), chunk):
            r = rows[s:s + chunk].tolist()
            pre, pre_attn = sample.left_pad([teacher_prompts[i] for i in r], pad_id)  # [c, P'], [c, P']
            dev = ids.device
            t_ids = torch.cat([pre.to(dev), ids[r, P:]], 1)  # [c, P' + T]
            t_attn = torch.cat([pre_attn.to(dev), attn[r, P:]], 1)  # [c, P' + T]
            out.append(sample.token_logprobs(model, t_ids, t_attn, pre.shape[1], temperature,
                                             groups=torch.tensor(r, device=dev) // group_size).float())  # [c, T]
    return torch.cat(out)  # [n, T]


def evidence(teacher: torch.Tensor, student: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """L2. delta = log pi_T - log pi_old on the scored tokens: [N, T], [N, T], [N, T] -> [N, T], 0 off the mask."""
    return (teacher - student) * mask


def weights(delta: torch.Tensor, adv_seq: torch.Tensor, mask: torch.Tensor, eps: float = 0.2) -> torch.Tensor:
    """L3. w = clip(exp(sign(A_i) delta), 1 - eps, 1 + eps): delta [N, T], adv_seq [N], mask [N, T] -> w [N, T],
    0 off the mask (1 on a rollout of A_i = 0: sign 0)."""
    return torch.exp(torch.sign(adv_seq)[:, None] * delta).clamp(1 - eps, 1 + eps) * mask  # [N, T]


def token_advantages(adv_seq: torch.Tensor, w: torch.Tensor, mask: torch.Tensor, lam: float = 1.0) -> torch.Tensor:
    """L4. A_{i,t} = A_i ((1 - lambda) + lambda w_t): adv_seq [N], w [N, T], mask [N, T] -> [N, T]. The teacher is a
    constant (stop-gradient): no gradient through w."""
    return adv_seq[:, None] * ((1 - lam) + lam * w.detach()) * mask  # [N, T]
