"""OAR: Outcome-grounded Advantage Reshaping (arXiv 2601.07408), O1-O6 of ../shared/papers/oar.md.
(O7, the ESS-ratio and top-10 % mass, is in grpo.py because every method logs it.)

OAR asks, for each reasoning token of a rollout, how much it moves the model's own distribution over the final
answer, and moves the rollout's GRPO advantage towards the tokens that move it most, keeping the rollout's total.

    O1 outcome_probe     P_final: the next-token distribution where the answer starts (last) or the mean
                         logits over the teacher-forced answer (answer_mean)
    O2 perturbation_scores   OAR-P: I_t = KL(P_final || P_final with token t replaced by pad), one forward each
    O3 gradient_scores       OAR-G: I_t = |<dJ/de_t, e_t>|, J = KL(P_final || P_final with noisy reasoning)
    O4 normalise             s = log(1 + I), min-max per rollout
    O5 reshape               Bi-Level weights (suppress below the q-quantile, boost above), summing to R
    O6 token_advantages      A_{i,t} = A_i * w_{i,t}

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
    """Token-id sequences prefix + reasoning + cue + answer (answer = the gold's ids and the closing "}"),
    left-padded. Returns ids, attention mask, reasoning mask [n, L] (1 on the R reasoning tokens) and probe
    mask [n, L] (1 on the positions whose logits predict the answer tokens)."""
    seqs = [p + r[:R] + cue + a for p, r, R, a in zip(prompts, responses, lengths, answers)]
    ids, attn = sample.left_pad(seqs, pad_id)  # [n, L], [n, L]
    L = ids.shape[1]
    reason, probe = torch.zeros_like(attn), torch.zeros_like(attn)  # [n, L], [n, L]
    for i, (p, R, a) in enumerate(zip(prompts, lengths, answers)):
        start = L - len(seqs[i]) + len(p)
        reason[i, start:start + R] = 1
        probe[i, L - len(a) - 1:L - 1] = 1  # logits at column j predict the token at column j + 1
    return ids, attn, reason, probe


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
    """KL(P || Q) = sum_v P(v) (log P(v) - log Q(v)) per row: [n, V], [n, V] -> [n]."""
    return (logp.exp() * (logp - logq)).sum(-1)


def _probe_columns(probe: torch.Tensor) -> int:
    """How many last columns hold every row's probe positions: from the earliest first probe column to the end."""
    return int((probe.shape[1] - probe.float().argmax(1)).max())


def _probe_logits(model, ids=None, attn=None, embeds=None, keep: int = 1):
    """Logits of the last `keep` columns (the probe positions lie there): a [n, L, 151936] float32 tensor for
    the whole sequence is never made."""
    out = model(input_ids=ids, inputs_embeds=embeds, attention_mask=attn, position_ids=sample.position_ids(attn),
                use_cache=False, logits_to_keep=keep)
    return out.logits  # [n, keep, V]


@torch.no_grad()
def perturbation_scores(model, ids, attn, reason, probe, pad_id: int, mode: str = "last", chunk: int = 256):
    """O2 (OAR-P). I_t = KL(P_final || P_final^(t)), where P_final^(t) is the probe with reasoning token t
    replaced by the pad id (same length). One forward per reasoning token, `chunk` sequences at a time (the
    authors' listing put all R copies in one batch); eval mode, no grad. Returns I [n, L], 0 off the reasoning.

    The prefix before t is unchanged, so its KV cache could be reused; on the tiny world the prefix is a dozen
    tokens and the plain forward is the readable choice.
    """
    keep = _probe_columns(probe)
    logp = outcome_probe(_probe_logits(model, ids, attn, keep=keep), probe[:, -keep:], mode)  # [n, V]
    rows, cols = reason.nonzero(as_tuple=True)  # [M], [M] one perturbed copy per reasoning token
    scores = torch.zeros(reason.shape, device=ids.device)  # [n, L]
    for s in range(0, len(rows), chunk):
        r, c = rows[s:s + chunk], cols[s:s + chunk]
        perturbed = ids[r].clone()  # [m, L]
        perturbed[torch.arange(len(r)), c] = pad_id
        logq = outcome_probe(_probe_logits(model, perturbed, attn[r], keep=keep), probe[r, -keep:], mode)  # [m, V]
        scores[r, c] = kl(logp[r], logq)
    return scores


def gradient_scores(model, ids, attn, reason, probe, mode: str = "answer_mean", sigma: float = 1e-3):
    """O3 (OAR-G). e = input embeddings; p0 = P_final(e) detached; J = KL(p0 || P_final(e + eps)) with
    eps ~ N(0, sigma^2) on the reasoning positions only (at the clean input J and its gradient are exactly 0);
    g = dJ/de by one torch.autograd.grad to the embeddings alone, so no parameter's .grad is touched (the
    authors' listing called J.backward()); I_t = |<g_t, e_t>| (gradient times input). Returns I [n, L]."""
    keep = _probe_columns(probe)
    e = model.get_input_embeddings()(ids).detach()  # [n, L, H]
    with torch.no_grad():
        logp0 = outcome_probe(_probe_logits(model, attn=attn, embeds=e, keep=keep), probe[:, -keep:], mode)  # [n, V]
    noisy = (e + sigma * torch.randn_like(e) * reason[..., None]).requires_grad_(True)  # [n, L, H]
    with torch.enable_grad():
        logq = outcome_probe(_probe_logits(model, attn=attn, embeds=noisy, keep=keep), probe[:, -keep:], mode)
        J = kl(logp0, logq).sum()  # rows are independent: the sum's gradient is each row's own
        (g,) = torch.autograd.grad(J, noisy)  # [n, L, H]
    return (g * e).sum(-1).abs() * reason  # [n, L]


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
                  chunk: int):
    """O1-O5 for a batch: weights [N, T] on the response tokens (1 outside the reasoning span and for rollouts
    with A_i = 0, which are not scored: their advantage stays 0 whatever the weights).

    prompts: the prompt token ids of each rollout (unpadded); responses: its response ids without EOS; pieces:
    their decoded texts; answers: the gold answer's ids followed by "}"; cue: the conclude cue's ids.
    The model is scored in eval mode and left in the mode it was in.
    """
    weights = torch.ones((len(responses), T), device=adv_seq.device)  # [N, T]
    todo = [i for i in range(len(responses)) if adv_seq[i] != 0]
    if not todo:
        return weights
    lengths = {i: reasoning_length(pieces[i]) for i in todo}
    # Rollouts of similar length share a forward (less padding), `chunk` at a time. OAR-G needs gradients for the
    # embeddings only: the parameters stop requiring them meanwhile, so their .grad cannot be touched and the
    # backward skips the weight gradients it would otherwise compute and throw away.
    todo.sort(key=lambda i: len(prompts[i]) + lengths[i] + len(answers[i]))
    dev, was_training = adv_seq.device, model.training
    needs_grad = [p.requires_grad for p in model.parameters()]
    model.eval()
    model.requires_grad_(False)
    try:
        for s in range(0, len(todo), chunk):
            part = todo[s:s + chunk]
            ids, attn, reason, probe_mask = (x.to(dev) for x in build_inputs(
                [prompts[i] for i in part], [responses[i] for i in part], [lengths[i] for i in part], cue,
                [answers[i] for i in part], pad_id))  # [n, L] each
            if scorer == "perturb":
                scores = perturbation_scores(model, ids, attn, reason, probe_mask, pad_id, probe, chunk)  # [n, L]
            else:
                scores = gradient_scores(model, ids, attn, reason, probe_mask, probe, sigma)  # [n, L]
            wt = reshape(normalise(scores, reason), reason, q, beta)  # [n, L]
            for j, i in enumerate(part):  # the reasoning tokens are the first R of each response
                weights[i, :lengths[i]] = wt[j][reason[j].bool()]
    finally:
        model.train(was_training)
        for p, r in zip(model.parameters(), needs_grad):
            p.requires_grad_(r)
    return weights
