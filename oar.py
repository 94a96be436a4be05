"""OAR: Outcome-grounded Advantage Reshaping (arXiv 2601.07408), O1-O7 of EQUATIONS.md#oar.

OAR asks, for each reasoning token of a rollout, how much it moves the model's own distribution over the final
answer, and moves the rollout's GRPO advantage towards the tokens that move it most, keeping the rollout's total.

    O1 outcome_probe     P_final: the next-token distribution where the answer starts (last) or the mean
                         logits over the teacher-forced answer (answer_mean)
    O2 perturbation_scores   OAR-P: I_t = KL(P_final || P_final with token t replaced by pad), one forward each
    O3 gradient_scores       OAR-G: I_t = |<dJ/de_t, e_t>|, J = KL(P_final || P_final with noisy reasoning)
    O4 normalise             s = log(1 + I), min-max per rollout
    O5 reshape               Bi-Level weights (suppress below the q-quantile, boost above), summing to R
    O6 token_advantages      A_{i,t} = A_i * w_{i,t}
    O7 advantage_concentration   ESS-ratio and top-10 % mass of |A_{i,t}| (logged for every method)

Spans are taken from the sampled token ids, never from re-tokenised text (reasoning_length): the reasoning is
the response before the last "\\boxed{", and the conclude cue and the answer are appended as token ids. A
worked example of O4-O5 with q = 0.25, beta = 1 on R = 5 tokens:

    I    = [e - 1, 0, e^2 - 1, e^0.5 - 1, e^0.25 - 1]   ->  s = log(1 + I) = [1, 0, 2, 0.5, 0.25]
    Ihat = (s - 0) / (2 - 0) = [0.5, 0, 1, 0.25, 0.125]
    tau  = quantile([0, 0.125, 0.25, 0.5, 1], 0.25) = 0.125   (position 0.25 * 4 = 1 of the sorted list)
    w    = [1 + (0.5-0.125)/0.875, max(0/0.125, 0.1), 1 + (1-0.125)/0.875, 1 + (0.25-0.125)/0.875, 1 + 0]
         = [1.4286, 0.1, 2.0, 1.1429, 1.0]                     sum 5.6714
    wt   = w * 5 / 5.6714 = [1.2594, 0.0882, 1.7632, 1.0076, 0.8816]   sum 5 = R
"""
import torch

import sample
from infra import fastpath


def reasoning_length(pieces: list, marker: str = "\\boxed{") -> int:
    """R: how many response tokens come before the final-answer marker, from the decoded text of each sampled
    token (EOS excluded). The marker's first character may sit inside a token (" \\boxed"): that token and
    everything after it are not reasoning. Without a marker, the whole response is reasoning.

    reasoning_length(["1", "+", "2", "=", "3", "\\n", "\\\\", "b", "o", "x", "e", "d", "{", "3", "}"]) == 6
    """
    text = "".join(pieces)
    start = text.rfind(marker)
    if start < 0:
        return len(pieces)
    end = 0
    for j, piece in enumerate(pieces):
        end += len(piece)
        if end > start:
            return j
    return len(pieces)


def build_inputs(prompts: list, responses: list, lengths: list, cue: list, answers: list, pad_id: int):
    """Token-id sequences prompt + reasoning + cue + answer (answer = the gold's ids and the closing "}"). The
    prompts are left-padded to a common width P and so are the rest: pad pad prompt | pad reasoning cue answer.
    The prompts then sit in the same columns, so that rows sharing one can share its cache, and the probe
    positions are the last columns. Position ids count real tokens only (sample.position_ids), so the pads in
    the middle change nothing. Returns ids, attention mask, reasoning mask [n, P + S] (1 on the R reasoning
    tokens), probe mask [n, P + S] (1 on the positions whose logits predict the answer tokens), and P."""
    P = max(len(p) for p in prompts)
    pre, pre_attn = sample.left_pad(prompts, pad_id)  # [n, P], [n, P]
    post, post_attn = sample.left_pad([r[:R] + cue + a for r, R, a in zip(responses, lengths, answers)], pad_id)
    ids, attn = torch.cat([pre, post], 1), torch.cat([pre_attn, post_attn], 1)  # [n, P + S], [n, P + S]
    L = ids.shape[1]
    reason, probe = torch.zeros_like(attn), torch.zeros_like(attn)  # [n, L], [n, L]
    for i, (R, a) in enumerate(zip(lengths, answers)):
        start = L - R - len(cue) - len(a)
        reason[i, start:start + R] = 1
        probe[i, L - len(a) - 1:L - 1] = 1  # logits at column j predict the token at column j + 1
    return ids, attn, reason, probe, P


def outcome_probe(logits: torch.Tensor, probe_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """O1. log P_final [n, V] from logits [n, L, V] and the probe mask [n, L] (positions predicting the answer).

    last:        the first probe position, i.e. the end of prefix + reasoning + conclude (OAR-P's probe)
    answer_mean: the mean of the logits over all probe positions, then softmax (OAR-G's probe)
    Float32, no temperature.
    """
    logits, m = logits.float(), probe_mask.float()  # [n, L, V], [n, L]
    if mode == "last":
        first = m.argmax(dim=1)  # [n] first 1 of each row
        z = logits[torch.arange(len(first)), first]  # [n, V]
    elif mode == "answer_mean":
        z = (logits * m[..., None]).sum(1) / m.sum(1, keepdim=True)  # [n, V]
    else:
        raise ValueError(f"probe mode {mode!r}: 'last' or 'answer_mean'")
    return torch.log_softmax(z, dim=-1)  # [n, V]


def kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """The divergence in O2's and O3's scores: KL(P || Q) = sum_v P(v) (log P(v) - log Q(v)) per row: [n, V], [n, V]
    -> [n]."""
    return (logp.exp() * (logp - logq)).sum(-1)


def _probe_columns(probe: torch.Tensor) -> int:
    """How many last columns hold every row's probe positions: from the earliest first probe column to the end."""
    return int((probe.shape[1] - probe.float().argmax(1)).max())


def model_forward(model, attn):
    """The forward O2 and O3 score with: the model's own, over every column. forward(rows, keep, ids=None,
    embeds=None) -> the logits of the last `keep` columns [n, keep, V] (the probe positions lie there; a [n, L,
    151936] float32 tensor for the whole sequence is never made), for rows [n] of attn [N, L] whose ids [n, L] or
    input embeddings [n, L, H] are given. infra/fastpath.prompt_sharing gives the same numbers with each prompt run
    once (tests/test_oar.py)."""
    positions = sample.position_ids(attn)  # [N, L]

    def forward(rows, keep: int, ids=None, embeds=None):
        return model(input_ids=ids, inputs_embeds=embeds, attention_mask=attn[rows], position_ids=positions[rows],
                     logits_to_keep=keep).logits  # [n, keep, V]
    return forward


@torch.no_grad()
def perturbation_scores(model, ids, attn, reason, probe, pad_id: int, mode: str = "last", chunk: int = 256,
                        forward=None, share_rows: bool = False):
    """O2 (OAR-P). I_t = KL(P_final || P_final^(t)), where P_final^(t) is the probe with reasoning token t
    replaced by the pad id (same length). One forward per reasoning token, `chunk` sequences at a time (the
    authors' listing put all R copies in one batch); eval mode, no grad. ids, attn, reason, probe [n, L] ->
    I [n, L], 0 off the reasoning. forward: model_forward(model, attn) unless given (the prompt-sharing one).

    share_rows (speed only, the same scores: tests/test_oar.py): a copy equals its row before token t, so each
    row's keys and values are computed once (fastpath.prompt_sharing with whole rows as the prompts) and a copy
    runs from its perturbed token on: about half the columns of a long reasoning. A chunk's copies run from its
    earliest perturbed column (they are consecutive tokens, of one row or two).
    """
    keep, forward = _probe_columns(probe), forward or model_forward(model, attn)
    logp = outcome_probe(forward(torch.arange(len(ids)), keep, ids=ids), probe[:, -keep:], mode)  # [n, V]
    head = 0  # the columns before every copy's perturbed token that the forward may take from a cache
    if share_rows:
        whole = fastpath.prompt_sharing(model, ids, attn, sample.position_ids(attn), ids.shape[1] - keep,
                                        torch.arange(len(ids), device=ids.device))  # each row its own "prompt"
        forward, head = (whole, ids.shape[1] - keep) if whole else (forward, 0)
    rows, cols = reason.nonzero(as_tuple=True)  # [M], [M] one perturbed copy per reasoning token, row-major
    scores = torch.zeros(reason.shape, device=ids.device)  # [n, L]
    for s in range(0, len(rows), chunk):
        r, c = rows[s:s + chunk], cols[s:s + chunk]
        perturbed = ids[r].clone()  # [m, L]
        perturbed[torch.arange(len(r)), c] = pad_id
        logits = forward(r, keep, ids=perturbed, start=min(int(c.min()), head)) if head else \
            forward(r, keep, ids=perturbed)  # [m, keep, V]
        scores[r, c] = kl(logp[r], outcome_probe(logits, probe[r, -keep:], mode))
    return scores


def gradient_scores(model, ids, attn, reason, probe, mode: str = "answer_mean", sigma: float = 1e-3, forward=None):
    """O3 (OAR-G). e = input embeddings; p0 = P_final(e) detached; J = KL(p0 || P_final(e + eps)) with
    eps ~ N(0, sigma^2) on the reasoning positions only (at the clean input J and its gradient are exactly 0);
    g = dJ/de by one torch.autograd.grad to the embeddings alone, so no parameter's .grad is touched (the
    authors' listing called J.backward()); I_t = |<g_t, e_t>| (gradient times input). ids, attn, reason, probe
    [n, L] -> I [n, L]. forward: model_forward(model, attn) unless given (the prompt-sharing one). The noise is
    drawn token by token over the reasoning, so a seed gives the same noise whichever forward runs."""
    keep, forward, every = _probe_columns(probe), forward or model_forward(model, attn), torch.arange(len(ids))
    e = model.get_input_embeddings()(ids).detach()  # [n, L, H]
    with torch.no_grad():
        logp0 = outcome_probe(forward(every, keep, embeds=e), probe[:, -keep:], mode)  # [n, V]
    m = reason.bool()  # [n, L]
    eps = torch.zeros_like(e)  # [n, L, H]
    eps[m] = sigma * torch.randn((int(m.sum()), e.shape[-1]), device=e.device, dtype=e.dtype)
    noisy = (e + eps).requires_grad_(True)  # [n, L, H]
    with torch.enable_grad():
        logq = outcome_probe(forward(every, keep, embeds=noisy), probe[:, -keep:], mode)  # [n, V]
        J = kl(logp0, logq).sum()  # rows are independent: the sum's gradient is each row's own
        (g,) = torch.autograd.grad(J, noisy)  # [n, L, H]
    return (g * e).sum(-1).abs() * m  # [n, L]


def normalise(scores: torch.Tensor, reason: torch.Tensor) -> torch.Tensor:
    """O4. s = log(1 + I), then (s - min s) / (max s - min s) over each rollout's reasoning tokens; a range of 0
    is taken as 1 (all scores equal -> all 0). scores, reason [n, L] -> Ihat [n, L], 0 off the reasoning."""
    m = reason.bool()
    s = torch.log1p(scores)  # [n, L]
    lo = torch.where(m, s, torch.inf).min(1, keepdim=True).values  # [n, 1]
    hi = torch.where(m, s, -torch.inf).max(1, keepdim=True).values  # [n, 1]
    rng = torch.where(hi - lo > 0, hi - lo, torch.ones_like(hi))  # [n, 1]
    return torch.where(m, (s - lo) / rng, torch.zeros_like(s))  # [n, L]


def quantile(x: torch.Tensor, mask: torch.Tensor, q: float) -> torch.Tensor:
    """The q-quantile of each row's masked values with linear interpolation (numpy.quantile's default):
    position q (R - 1) in the sorted values. x, mask [n, L] -> [n]."""
    R = mask.sum(1)  # [n]
    srt = torch.where(mask.bool(), x, torch.inf).sort(dim=1).values  # [n, L] valid values first
    pos = q * (R - 1).clamp(min=0).to(x.dtype)  # [n]
    lo, hi = pos.floor().long(), pos.ceil().long()  # [n], [n]
    a, b = srt.gather(1, lo[:, None]).squeeze(1), srt.gather(1, hi[:, None]).squeeze(1)  # [n], [n]
    return a + (pos - lo) * torch.where(hi > lo, b - a, torch.zeros_like(a))  # [n]


def reshape(ihat: torch.Tensor, reason: torch.Tensor, q: float = 0.25, beta: float = 1.0) -> torch.Tensor:
    """O5. Bi-Level weights per rollout; 1 off the reasoning span; all 1 when R < 2.

        tau = q-quantile of Ihat;  w = max(Ihat / (tau + 1e-8), 0.1) below tau,  1 + beta (Ihat - tau) / (1 - tau
        + 1e-8) from tau up;  wt = w R / sum w  (mass preservation: the weights sum to R).
    ihat, reason [n, L] -> wt [n, L]. All-equal scores give Ihat = 0 = tau, hence w = 1 everywhere.
    """
    m = reason.bool()
    tau = quantile(ihat, reason, q)[:, None]  # [n, 1]
    w = torch.where(ihat < tau, (ihat / (tau + 1e-8)).clamp(min=0.1), 1 + beta * (ihat - tau) / (1 - tau + 1e-8))
    w = torch.where(m, w, torch.zeros_like(w))  # [n, L]
    R = reason.sum(1, keepdim=True).to(w.dtype)  # [n, 1]
    wt = w * R / w.sum(1, keepdim=True).clamp(min=1e-12)  # [n, L]
    wt = torch.where(m, wt, torch.ones_like(wt))
    return torch.where(R >= 2, wt, torch.ones_like(wt))  # [n, L]


def token_advantages(adv_seq: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """O6. A_{i,t} = A_i * wt_{i,t} on the response tokens: adv_seq [N], weights [N, T], mask [N, T] -> [N, T].
    The weights are constants computed with the current policy before the update (no gradient through them)."""
    return adv_seq[:, None] * weights.detach() * mask  # [N, T]


def token_weights(model, prompts: list, responses: list, pieces: list, answers: list, cue: list, adv_seq,
                  T: int, pad_id: int, *, scorer: str, probe: str, q: float, beta: float, sigma: float,
                  chunk: int, share_rows: bool = True, details: dict = None):
    """O1-O5 for a batch: weights [N, T] on the response tokens (1 outside the reasoning span and for rollouts
    with A_i = 0, which are not scored: their advantage stays 0 whatever the weights).

    prompts: the prompt token ids of each rollout (unpadded); responses: its response ids without EOS; pieces:
    their decoded texts; answers: the gold answer's ids followed by "}"; cue: the conclude cue's ids.
    details: a dict to receive what the weights were made of, for the heat maps (the weights are the same with or
    without it): "scores" (O2's or O3's I), "normalised" (O4's Ihat) and "reason" (1 on the scored reasoning
    tokens), each [N, T] and 0 elsewhere.
    """
    weights = torch.ones((len(responses), T), device=adv_seq.device)  # [N, T]
    todo = [i for i in range(len(responses)) if adv_seq[i] != 0]
    lengths = {i: reasoning_length(pieces[i]) for i in todo}

    def score(ids, attn, reason, probe_mask, P, forward):  # O2 or O3, then O4-O5: weights, I, Ihat [n, 3, L]
        if scorer == "perturb":
            scores = perturbation_scores(model, ids, attn, reason, probe_mask, pad_id, probe, chunk, forward,
                                         share_rows=share_rows)
        else:
            scores = gradient_scores(model, ids, attn, reason, probe_mask, probe, sigma, forward)
        ihat = normalise(scores, reason)  # [n, L]
        return torch.stack([reshape(ihat, reason, q, beta), scores, ihat], 1)  # [n, 3, L]

    if details is not None:
        details.update({k: torch.zeros_like(weights) for k in ("scores", "normalised", "reason")})  # [N, T] each
    for i, (out, reason) in score_in_chunks(model, todo, prompts, responses, lengths, cue, answers, pad_id, chunk,
                                            score).items():
        m = reason.bool()  # [L]
        weights[i, :lengths[i]] = out[0, m]  # the reasoning tokens are the first R of each response
        if details is not None:
            details["scores"][i, :lengths[i]], details["normalised"][i, :lengths[i]] = out[1, m], out[2, m]
            details["reason"][i, :lengths[i]] = 1
    return weights


def score_in_chunks(model, todo: list, prompts: list, responses: list, lengths: dict, cue: list, answers: list,
                    pad_id: int, chunk: int, score, prompt_gradient: bool = False) -> dict:
    """The machinery O2, O3 and GRAIL's saliency (grail.py) share. Each rollout i of todo becomes the row prompt +
    its first lengths[i] response tokens + cue + answers[i] (build_inputs); rollouts of similar length share a
    forward, `chunk` at a time, and those with the same prompt run it once where the model allows it
    (fastpath.prompt_sharing; all of it but its last token with prompt_gradient, for a gradient to reach that token).
    score(ids, attn, reason, probe, P, forward) -> [n, L] (or [n, k, L]: k rows per rollout) for each chunk, forward
    the prompt-sharing one or None.
    The model scores in eval mode with no parameter requiring a gradient, so that a backward reaches the embeddings
    alone and skips the weight gradients it would compute and throw away; it is left as it was.
    Returns {i: (its row of the scores [L] (or [k, L]), its reasoning mask [L])}."""
    if not todo:
        return {}
    todo = sorted(todo, key=lambda i: lengths[i] + len(answers[i]))  # similar lengths together: less padding
    prompt_id = {}
    groups = {i: prompt_id.setdefault(tuple(prompts[i]), len(prompt_id)) for i in todo}
    dev, was_training = next(model.parameters()).device, model.training
    needs_grad = [p.requires_grad for p in model.parameters()]
    model.eval()
    model.requires_grad_(False)
    out = {}
    try:
        for s in range(0, len(todo), chunk):
            part = todo[s:s + chunk]
            ids, attn, reason, probe_mask, P = build_inputs(
                [prompts[i] for i in part], [responses[i] for i in part], [lengths[i] for i in part], cue,
                [answers[i] for i in part], pad_id)  # [n, L] each
            ids, attn, reason, probe_mask = ids.to(dev), attn.to(dev), reason.to(dev), probe_mask.to(dev)
            g = torch.tensor([groups[i] for i in part], device=dev)  # [n]
            # each prompt runs once where the model allows it (speed only: the same scores, tests/test_oar.py)
            shared = P - 1 if prompt_gradient else P  # the columns the forwards take from the prompts' cache
            fast = fastpath.prompt_sharing(model, ids, attn, sample.position_ids(attn), shared, g) if shared else None
            scores = score(ids, attn, reason, probe_mask, P, fast)  # [n, L]
            out.update({i: (scores[j], reason[j]) for j, i in enumerate(part)})
    finally:
        model.train(was_training)
        for p, r in zip(model.parameters(), needs_grad):
            p.requires_grad_(r)
    return out


def rollouts(batch: dict, tokenizer, pieces: dict) -> tuple:
    """What a rule that scores each rollout with the model reads of a batch of sample.generate(), from its sampled
    ids: (prompts, responses, texts): each rollout's prompt tokens (padding removed), its response before the EOS,
    and each response token's decoded text for the spans (pieces caches token id -> text across steps). The spans
    need per-row lengths, hence Python lists."""
    P, mask = batch["prompt_len"], batch["response_mask"]  # [N, T]
    ids, attn = batch["input_ids"].tolist(), batch["attention_mask"].tolist()
    n_resp = (mask.sum(-1) - (~batch["truncated"]).long()).tolist()  # response tokens before the EOS
    prompts = [[t for t, a in zip(row[:P], am[:P]) if a] for row, am in zip(ids, attn)]
    responses = [row[P:P + n] for row, n in zip(ids, n_resp)]
    for t in {t for r in responses for t in r} - pieces.keys():
        pieces[t] = tokenizer.decode([t])
    return prompts, responses, [[pieces[t] for t in r] for r in responses]


def batch_weights(model, batch: dict, answers: list, cue: list, adv_seq, tokenizer, pieces: dict, *, scorer: str,
                  probe: str, q: float, beta: float, sigma: float, chunk: int, share_rows: bool = True,
                  details: dict = None):
    """O1-O5 (token_weights) for a batch of sample.generate(): weights [N, T]. answers: the gold answer's ids and
    "}" per rollout; cue: the conclude cue's ids; adv_seq [N]. share_rows: OAR-P's speed path (False: the plain
    one, for tools/perf/bench's A/B). details: as token_weights's."""
    prompts, responses, texts = rollouts(batch, tokenizer, pieces)
    return token_weights(model, prompts, responses, texts, answers, cue, adv_seq, batch["response_mask"].shape[1],
                         tokenizer.pad_token_id, scorer=scorer, probe=probe, q=q, beta=beta, sigma=sigma, chunk=chunk,
                         share_rows=share_rows, details=details)


def advantage_concentration(adv: torch.Tensor, mask: torch.Tensor, adv_seq: torch.Tensor) -> dict:
    """O7 of EQUATIONS.md#o7--advantage-concentration-diagnostics: how concentrated a rollout's advantage is on few
    tokens. The OAR paper defines it; train.py logs it for every method (GRPO, KTAE, OAR, E1 alike).

    Per rollout, over its valid tokens, with a_t = |A_{i,t}| and T its length:
        ESS-ratio    = (sum_t a_t)^2 / (T sum_t a_t^2)        in [1/T, 1]; plain GRPO gives 1
        Top-10% mass = (sum of the ceil(0.1 T) largest a_t) / sum_t a_t;   plain GRPO gives ~0.1
    Means over the rollouts with A_i != 0. adv, mask [N, T]; adv_seq [N].
    Example: a = [1, 1, 1, 1] -> ESS 1, top-10% = 1/4 (ceil(0.4) = 1 token); a = [3, 1] -> 16 / (2 * 10) = 0.8.
    """
    a = adv.abs() * mask  # [N, T]
    T = mask.sum(-1).float()  # [N]
    keep = (adv_seq != 0) & (a.sum(-1) > 0)  # [N]
    if not keep.any():
        return {"ess_ratio": float("nan"), "top10_mass": float("nan")}
    a, T = a[keep], T[keep]
    ess = a.sum(-1) ** 2 / (T * (a ** 2).sum(-1))  # [n]
    k = torch.ceil(0.1 * T).long()  # [n]
    top = a.sort(dim=-1, descending=True).values.cumsum(-1).gather(1, (k - 1)[:, None]).squeeze(1)  # [n]
    return {"ess_ratio": ess.mean().item(), "top10_mass": (top / a.sum(-1)).mean().item()}
