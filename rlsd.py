"""RLSD: RLVR with Self-Distillation (Yang, Qin, Si et al. 2026, arXiv 2604.03128), L1-L5 of EQUATIONS.md#rlsd.

The same model, shown privileged context (the reference answer) beside the question, is a teacher: where it finds a
sampled token likelier than the student did, the token is evidence for the answer. RLSD keeps the direction of
every update the verifier's (the sign of A_i) and lets that evidence set only its size, clipped near 1: a right
rollout's tokens the teacher agrees with, and a wrong rollout's tokens the teacher disagrees with, get more.

    L1 teacher_logprobs    log pi_T(o_t) = log pi_T(o_t | privileged prompt, o_<t): one no-grad forward of the
                           teacher (below), at the sampling temperature (the student's are the sampler's log pi_old)
    L2 evidence            delta_t = log pi_T(o_t) - log pi_old(o_t)
    L3 weights             w_t = clip(exp(sign(A_i) delta_t), 1 - eps_w, 1 + eps_w)
    L4 token_advantages    A_{i,t} = A_i ((1 - lambda) + lambda w_t)
    L5 lambda_at           lambda at the g-th step (g = steps done + 1): lambda_0 max(1 - (g - warmup) / decay, 0),
                           lambda_0 g / warmup during a warm-up: after `decay` steps RLSD is GRPO
    L1 teacher, synced_at  the teacher's weights: a frozen copy of what trains, taken at the start and re-taken
                           from the policy after every K-th step (K = 0: the live policy is the teacher)

The released code (iie-ycx/RLSD at 93e46f7, examples/visual_rl/rlsd_train.sh) runs lambda_0 = 0.5 decaying over 60
steps, eps_w = 0.2 and K = 20: those are the defaults (EQUATIONS.md#rlsd).

A worked example (eps_w = 0.2, lambda = 1): a wrong rollout (A_i = -0.8) whose tokens the teacher finds
log-likelier by delta = [0.5, 0, -0.1, -1]:

    exp(-delta) = [0.6065, 1, 1.1052, 2.7183]  ->  w = [0.8, 1, 1.1052, 1.2]
    A_{i,t} = -0.8 w = [-0.64, -0.8, -0.8841, -0.96]       (the token the teacher doubts most takes the most blame)
"""
from contextlib import contextmanager, nullcontext

import torch

import sample

# L1's privileged context, worded as data.Dataset.teacher_prompt takes it (the tiny world keeps its own form): the
# released template (teacher_hint_self_distill.jinja) up to "below.", the hint our gold answer; its last sentence,
# which asks for <thought>/<answer> tags, is left out, since our prompts ask for \boxed{} already
HINT = ("{question}\n\nHere is a reference solution:\n{answer}\n\nAfter understanding the reference solution, please "
        "try to solve this problem using your own approach below.")


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
            t_ids, t_attn, t_P = sample.with_prompts([teacher_prompts[i] for i in r], ids[r, P:], attn[r, P:],
                                                     pad_id)  # [c, P' + T] each
            out.append(sample.token_logprobs(model, t_ids, t_attn, t_P, temperature,
                                             groups=torch.tensor(r, device=ids.device) // group_size).float())  # [c, T]
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


def lambda_at(step: int, lam: float, warmup: int, decay: int) -> float:
    """L5. L4's lambda for the batch after `step` optimiser steps, as the released trainer counts: its global step g
    is 1 at the first batch, so g = step + 1. lam at most, reached after `warmup` steps (0: from the start), then
    falling linearly to 0 over `decay` steps (0: never). lambda_at(0, 0.5, 0, 60) = 0.5 (1 - 1/60)."""
    g = step + 1
    if warmup > 0 and g < warmup:
        return lam * g / warmup
    if decay > 0:
        return lam * max(1 - (g - warmup) / decay, 0.0)
    return lam


def synced_at(step: int, every: int) -> int:
    """L1's teacher for the batch after `step` steps: the policy as it was after synced_at(step, every) steps. The
    released actor copies itself into the frozen teacher after its update g when g % every == 0, so the batches
    g = 1..every (step 0..every-1) read the initial policy, the next `every` the policy after `every` steps, and so
    on; every = 0: the live policy (step itself)."""
    return step if every == 0 else step // every * every


def trainable(model) -> dict:
    """{name: parameter} of what trains: every weight, or under LoRA the adapters (the frozen base never changes,
    so a copy of the adapters is a copy of the policy)."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def copy_of(model) -> dict:
    """L1's frozen teacher: {name: a detached copy} of what trains, on its device and in its dtype."""
    return {name: p.detach().clone() for name, p in trainable(model).items()}


@contextmanager
def swapped_in(model, weights: dict):
    """Run `model` as the frozen teacher: each trainable parameter's storage points at `weights`' copy while the
    block lasts (no copy made: the parameters' own tensors are put back after). Autocast's cache of bf16 casts is
    keyed by the parameter, not its storage, so it is cleared on the way in and out: a cast of the live weights
    made in an enclosing region would otherwise stand in for the teacher's."""
    live = trainable(model)
    if live.keys() != weights.keys():
        raise ValueError(f"L1: the frozen teacher holds {len(weights)} tensors, the policy trains {len(live)}: the "
                         f"copy is of another model")
    kept = {name: p.data for name, p in live.items()}
    torch.clear_autocast_cache()
    try:
        for name, p in live.items():
            p.data = weights[name]
        yield model
    finally:
        for name, p in live.items():
            p.data = kept[name]
        torch.clear_autocast_cache()


def teacher(model, state, step: int, every: int):
    """L1's teacher for the batch after `step` steps, as a context in which `model` is it: the live policy when
    every = 0 or no state is kept (state None: a call alone, whose teacher is the policy as it is); else the frozen
    copy in state (methods.Context.state, which the run keeps across steps and its checkpoints save), re-taken from
    the policy when synced_at says a new interval began. A batch that made no update (D2 found nothing) does not
    move the policy, so a copy taken at the first call of an interval is the copy the released code takes."""
    if every == 0 or state is None:
        return nullcontext(model)
    due = synced_at(step, every)
    if state.get("synced_at") != due:
        if not state and due != step:  # a checkpoint without the teacher (older, or TRL's): the policy as it is now
            print(f"RLSD: the frozen teacher (the policy after step {due}) was not kept; it is the policy after step "
                  f"{step} until the sync after step {due + every}")
        state.pop("weights", None)  # the old copy goes before the new is made: one copy held at a time
        state.update(weights=copy_of(model), synced_at=due)
    return swapped_in(model, state["weights"])


def state_to_save(state: dict, done: int, every: int) -> dict:
    """What a checkpoint after `done` steps keeps of the teacher: nothing where the next batch re-takes it from the
    policy anyway (the live teacher, or done at a sync), else the frozen copy, so that a resumed run reads the same
    teacher as one never stopped."""
    return {} if every == 0 or synced_at(done, every) == done else state
