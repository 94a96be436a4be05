"""GRAIL: Gradient-Reweighted Advantages for RL with verifiable rewards (arXiv 2606.04889), R1-R6 of
EQUATIONS.md#grail, as its authors' code computes them (declare-lab/grail at 749aa4c: compute_checkpoint_stats.py,
grail_trainer.py, the defaults of qwen3_grail.yaml).

GRAIL asks, for each token of a rollout, how strongly the rollout's own final answer depends on it: the gradient of
the answer's log-likelihood with respect to the input embeddings, in one backward pass (as OAR-G, O3), times the
embedding. A wrong rollout's advantage then falls hardest on the tokens its wrong answer rests on.

    R1 answer_span       the first complete \\boxed{...} of the response: its tokens, marker and braces included
    R2 answer_loss       L = -sum of the answer tokens' log-probabilities at the sampling temperature
    R3 saliency          s_t = || dL/de * e ||_2 of the input that predicts token t (the embedding before it)
    R4 standardise       z_t = (log(s_t + 1e-8) - mean) / sqrt(var + 1e-8) over the rollout's tokens
    R5 weights           w_t = clip(1 + 0.5 z_t, 0.5, 5); 1 for a rollout without a box, or (default) of positive
                         advantage; then the box's content 5, its marker, closing brace and what follows 1
    R6 token_advantages  A_{i,t} = w_{i,t} A_i

A worked example of R4-R5 (std 0.5, clip [0.5, 5]): a rollout of 5 tokens, all before its box (no override),
with saliencies s = [e^-2, e^-1, 1, e, e^2]:

    log(s + 1e-8) = [-2, -1, 0, 1, 2] (to 1e-7)    mean 0    variance (4 + 1 + 0 + 1 + 4) / 5 = 2
    z = [-1.4142, -0.7071, 0, 0.7071, 1.4142]
    w = clip(1 + 0.5 z) = [clip(0.2929) = 0.5, 0.6464, 1, 1.3536, 1.7071]

A token after the box cannot move the answer (attention is causal): its saliency is 0 and its log -18.42, and it
still counts in the mean and variance, as in the authors' code (it pulls the other weights towards 1).
"""
import bisect

import torch

import oar

MARKER = "\\boxed{"


def answer_span(pieces: list):
    """R1. (start, content, end) token indices of the response's first complete \\boxed{...}, from the decoded text
    of each sampled token: tokens start .. end - 1 hold the box, marker and closing brace included; content .. end - 2
    hold what is inside it (the tokens that hold none of the marker's or the closing brace's characters). None
    without a complete box. Braces are counted as the authors count them, every "{" and "}" (escaped ones too); a
    box left open is passed over for the next.

    answer_span(["x", "=", "\\\\boxed", "{", "1", "2", "}", "."]) == (2, 4, 7)
    """
    text = "".join(pieces)
    ends = [0]
    for p in pieces:
        ends.append(ends[-1] + len(p))  # ends[j + 1]: where token j's text ends
    token_at = lambda char: bisect.bisect_right(ends, char) - 1  # noqa: E731  the token holding character `char`
    start = text.find(MARKER)
    while start >= 0:
        depth, j = 1, start + len(MARKER)
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        if depth == 0:  # the closing brace is character j - 1
            return token_at(start), token_at(start + len(MARKER) - 1) + 1, token_at(j - 1) + 1
        start = text.find(MARKER, start + len(MARKER))
    return None


def answer_loss(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor, temperature: float) -> torch.Tensor:
    """R2. L = -sum over the answer tokens of log softmax(logits / temperature)[the token]: logits [n, k, V] of the
    positions that predict targets [n, k], mask [n, k] 1 on the answer's tokens -> a scalar. Rows are independent,
    so the gradient of the batch's sum is each row's own."""
    logp = torch.log_softmax(logits / temperature, dim=-1)  # [n, k, V]
    return -(logp.gather(-1, targets[..., None]).squeeze(-1) * mask).sum()


def saliency(grad: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
    """R3. s = || grad * embeds ||_2 over the hidden size, the elementwise product (gradient times input, as OAR-G's
    O3, whose |<g, e>| sums that product instead): [n, L, H], [n, L, H] -> [n, L]."""
    return (grad * embeds).norm(dim=-1)


def standardise(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """R4. z = (log(s + 1e-8) - mean) / sqrt(var + 1e-8), mean and population variance over each rollout's tokens
    (mask [N, T] 1 on them, EOS and what follows the box included): scores [N, T] -> z [N, T] (0 off the mask)."""
    m = mask.float()
    logs = torch.log(scores.float() + 1e-8)  # [N, T]
    n = m.sum(-1, keepdim=True).clamp(min=1)  # [N, 1]
    mean = (logs * m).sum(-1, keepdim=True) / n  # [N, 1]
    var = (((logs - mean) * m) ** 2).sum(-1, keepdim=True) / n  # [N, 1]
    return (logs - mean) / torch.sqrt(var + 1e-8) * m  # [N, T]


def weights(z: torch.Tensor, mask: torch.Tensor, fallback: torch.Tensor, content: torch.Tensor,
            boundary: torch.Tensor, std: float = 0.5, w_min: float = 0.5, w_max: float = 5.0) -> torch.Tensor:
    """R5. w = clip(1 + std z, w_min, w_max), 1 on the rows of fallback [N] (no box; with --grail-symmetry wrong, a
    positive advantage); then on every row with a box the content [N, T] gets w_max and the boundary [N, T] (the
    marker, the closing brace and what follows the box) 1. z, mask [N, T] -> w [N, T], 0 off the mask."""
    w = torch.where(fallback[:, None], torch.ones_like(z), (1 + std * z).clamp(w_min, w_max))  # [N, T]
    w = torch.where(content.bool(), torch.full_like(w, w_max), w)
    w = torch.where(boundary.bool(), torch.ones_like(w), w)
    return w * mask


def token_advantages(adv_seq: torch.Tensor, w: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """R6. A_{i,t} = A_i * w_{i,t}: adv_seq [N], w [N, T], mask [N, T] -> [N, T]. The weights are constants computed
    with the policy that sampled (no gradient through them)."""
    return adv_seq[:, None] * w.detach() * mask  # [N, T]


def response_saliency(model, prompts: list, responses: list, spans: dict, temperature: float, pad_id: int,
                      T: int, chunk: int) -> torch.Tensor:
    """R2-R3 for the rollouts of spans ({i: its answer_span}): s [N, T], s[i, t] the saliency of the input that
    predicts response token t (the last prompt token for t = 0), 0 from the box's end on. Each rollout runs as its
    prompt and its response up to the box's end (what follows cannot move the answer: its saliency is 0 whether it
    runs or not), through the machinery OAR-G uses (oar.score_in_chunks: the same chunks and prompt sharing, the
    same memory plan), the prompt's last token in the forward so that the gradient reaches it."""
    s = torch.zeros((len(responses), T), device=next(model.parameters()).device)  # [N, T]
    before = {i: span[0] for i, span in spans.items()}  # the response before the box: build_inputs' "reasoning"
    boxes = {i: responses[i][span[0]:span[2]] for i, span in spans.items()}  # its "answer": the box itself

    def score(ids, attn, reason, probe, P, forward):  # [n, L]: row j's first n_j columns hold its tokens' saliency
        keep = oar._probe_columns(probe)  # the box's columns and the one before its first token
        e = model.get_input_embeddings()(ids).detach().requires_grad_(True)  # [n, L, H]
        with torch.enable_grad():
            logits = (forward or oar.model_forward(model, attn))(torch.arange(len(ids)), keep, embeds=e)  # [n, k, V]
            loss = answer_loss(logits[:, :-1], ids[:, -keep + 1:], probe[:, -keep:-1], temperature)  # R2
            (g,) = torch.autograd.grad(loss, e)  # [n, L, H]
        cols, L = saliency(g, e), ids.shape[1]  # [n, L] R3, each input column's
        out = torch.zeros_like(cols)  # [n, L]
        for j, n in enumerate((reason.sum(-1) + probe.sum(-1)).tolist()):  # the row's response tokens: the last n
            out[j, 0] = cols[j, P - 1]  # token 0 is predicted by the prompt's last token
            out[j, 1:n] = cols[j, L - n:L - 1]  # token t by the one before it
        return out

    for i, (row, _) in oar.score_in_chunks(model, list(spans), prompts, responses, before, [], boxes, pad_id, chunk,
                                           score, prompt_gradient=True).items():
        s[i, :spans[i][2]] = row[:spans[i][2]]
    return s


def batch_weights(model, batch: dict, adv_seq, mask, tokenizer, pieces: dict, *, temperature: float,
                  symmetry: str = "wrong", std: float = 0.5, w_min: float = 0.5, w_max: float = 5.0,
                  chunk: int = 8) -> tuple:
    """R1-R5 for a batch of sample.generate(): (weights [N, T], details). details, for the heat maps: "saliency" (R3's
    s), "z" (R4's), "content" and "boundary" (R5's overrides) [N, T], "fallback" [N] (R5's rows of weight 1), as the
    weights were made of them. adv_seq [N] the rollouts' A_i, mask
    [N, T] the loss's tokens. symmetry: which rollouts are weighted, "wrong" (A_i < 0: the authors' default; A_i > 0
    falls back to 1), "correct" (A_i > 0) or "both"; only those rollouts run the backward, and only those with a box
    (the others fall back too); A_i = 0 has no advantage to weigh."""
    prompts, responses, texts = oar.rollouts(batch, tokenizer, pieces)
    spans = {i: answer_span(t) for i, t in enumerate(texts)}
    a = adv_seq.tolist()
    weighted = {"wrong": lambda x: x < 0, "correct": lambda x: x > 0, "both": lambda x: x != 0}[symmetry]
    todo = {i: span for i, span in spans.items() if span and weighted(a[i])}
    s = response_saliency(model, prompts, responses, todo, temperature, tokenizer.pad_token_id, mask.shape[1], chunk)
    N, T = mask.shape
    content, boundary = torch.zeros((N, T), dtype=torch.bool), torch.zeros((N, T), dtype=torch.bool)
    for i, span in spans.items():
        if span:
            start, inner, end = span
            content[i, inner:end - 1] = True
            boundary[i, start:inner], boundary[i, end - 1:] = True, True  # marker, closing brace, what follows
    fallback = torch.tensor([i not in todo for i in range(N)])  # [N]
    z, fallback, content, boundary = standardise(s, mask), fallback.to(mask.device), content.to(mask.device), \
        boundary.to(mask.device)  # [N, T], [N], [N, T], [N, T]
    w = weights(z, mask, fallback, content, boundary, std, w_min, w_max)  # [N, T]
    return w, {"saliency": s, "z": z, "content": content, "boundary": boundary, "fallback": fallback}
