"""SHEAR: Span-level Hidden state Enabled Advantage Reweighting (Chen, He et al. 2026, arXiv 2604.23318), S1-S5 of
EQUATIONS.md#shear.

Within a group, a rollout's hidden states are cut into spans; each span is compared, as a distribution of hidden
states, with the same span of the rollouts of the other outcome (the right ones for a wrong rollout, and the other
way round), by a Wasserstein distance; a token's share of its rollout's advantage grows with its span's distance.
The paper's claim: spans after the point where right and wrong reasoning part have larger distances than spans
before it. Every choice the paper left open to us (the layer, the span, the estimator, the weights) is stated in
EQUATIONS.md and listed under its departures.

    S1 hidden_states       h_{i,t}: the last layer's hidden state at response token t, one no-grad forward
    S2 span_index          span(t) = floor(t / K), K tokens a span from the response's first token
    S3 wasserstein_1d      W1 of two sets of numbers, per hidden dimension; span_distances: its mean over them,
                           a rollout's span j against the pooled span j of the opposite outcome
    S4 weights             w_{i,t} = 1 + alpha (d_{i,span(t)} / dbar_i - 1), dbar_i the rollout's token-mean of d:
                           the weights of a rollout's measured tokens sum to their number
    S5 token_advantages    A_{i,t} = A_i w_{i,t}

A worked example of S3-S4 in one dimension (H = 1), K = 2, alpha = 1. A wrong rollout's states [0, 1 | 5, 6] (two
spans), the right rollouts' pooled span 0 {1, 2, 3} and span 1 {5, 6}:

    span 0: W1({0, 1}, {1, 2, 3}) = integral |F - G| = 0.5 (on [0, 1)) + 2/3 (on [1, 2)) + 1/3 (on [2, 3)) = 1.5
    span 1: W1({5, 6}, {5, 6}) = 0
    dbar = (1.5 + 1.5 + 0 + 0) / 4 = 0.75       w = [2, 2, 0, 0]        (sum 4 = the 4 tokens)
"""
import torch

import sample


def hidden_states(model, batch: dict, rows: torch.Tensor, chunk: int) -> torch.Tensor:
    """S1. h [n, T, H]: the last layer's hidden state (after the model's final norm, as its output layer reads it) at
    each response token of the rollouts `rows` [n] of a sample.generate() batch, i.e. the state after reading that
    token; no gradient, `chunk` rollouts a forward, with the sampler's position ids."""
    P, ids, attn = batch["prompt_len"], batch["input_ids"], batch["attention_mask"]
    decoder, out = model.get_decoder(), []
    with torch.no_grad():
        for s in range(0, len(rows), chunk):
            r = rows[s:s + chunk]
            h = decoder(input_ids=ids[r], attention_mask=attn[r],
                        position_ids=sample.position_ids(attn[r])).last_hidden_state  # [c, P + T, H]
            out.append(h[:, P:].float())  # [c, T, H]
    return torch.cat(out)  # [n, T, H]


def span_index(T: int, span: int) -> torch.Tensor:
    """S2. span(t) = floor(t / K) for t = 0 .. T-1: [T]. span_index(5, 2) == [0, 0, 1, 1, 2]."""
    return torch.arange(T) // span


def wasserstein_1d(x: torch.Tensor, x_mask: torch.Tensor, y: torch.Tensor, y_mask: torch.Tensor) -> torch.Tensor:
    """S3. The Wasserstein-1 distance between the empirical distributions of x's and y's valid values, per row and
    dimension: integral over v of |F_x(v) - F_y(v)|, each value of a set weighing 1 / its size. x [S, n, H], x_mask
    [S, n], y [S, m, H], y_mask [S, m] -> [S, H]. A row whose x or y holds no valid value gives 0 (its callers mark
    it unmeasured). W1({0, 1}, {1, 2, 3}) = 1.5 (module docstring)."""
    xm, ym = x_mask.bool(), y_mask.bool()
    nx, ny = xm.sum(1, keepdim=True).clamp(min=1), ym.sum(1, keepdim=True).clamp(min=1)  # [S, 1], [S, 1]
    z = torch.cat([x, y], 1).transpose(1, 2)  # [S, H, n + m] (sorted along its last, contiguous dimension)
    valid = torch.cat([xm, ym], 1)[:, None, :]  # [S, 1, n + m]
    step = torch.cat([xm / nx, -(ym / ny)], 1)[:, None, :]  # [S, 1, n + m] the jump of F_x - F_y at each value
    top = z.masked_fill(~valid, -torch.inf).amax(-1, keepdim=True)  # [S, H, 1]
    z = torch.where(valid, z, top)  # an invalid value sits on the largest: the gap after it is 0
    z, order = z.sort(-1)  # [S, H, n + m]
    gap = torch.nan_to_num(z[..., 1:] - z[..., :-1], nan=0.0, posinf=0.0)  # [S, H, n + m - 1] to the next value
    diff = step.expand_as(order).gather(-1, order).cumsum(-1)[..., :-1]  # [S, H, n + m - 1] F_x - F_y after each
    w = (diff.abs() * gap).sum(-1)  # [S, H]
    return torch.where((xm.any(1) & ym.any(1))[:, None], w, torch.zeros_like(w))


def span_distances(h: torch.Tensor, mask: torch.Tensor, correct: torch.Tensor, span: int,
                   max_elements: int = 2 ** 26):
    """S3 over one group: (d [G, T], measured [G, T]). d[i, t] is the mean over the hidden dimensions of W1 between
    rollout i's states in span(t) and the pooled states, in the same span, of the group's rollouts of the other
    outcome; measured is 1 where both held a state. h [G, T, H], mask [G, T] the scored tokens, correct [G] bool.
    Each rollout's pool is the whole group's span with its own outcome's states masked out; rollouts are taken
    max_elements / (J G K H) at a time (speed and memory only: the same numbers)."""
    G, T, H = h.shape
    J = -(-T // span)  # spans, the last one perhaps short
    pad = J * span - T
    hs = torch.nn.functional.pad(h, (0, 0, 0, pad)).view(G, J, span, H)  # [G, J, K, H]
    ms = torch.nn.functional.pad(mask.bool(), (0, pad)).view(G, J, span)  # [G, J, K]
    pool = hs.transpose(0, 1).reshape(J, G * span, H)  # [J, G K, H] span j of every rollout of the group
    pool_mask = ms.transpose(0, 1).reshape(J, G, span)  # [J, G, K]
    other = correct[:, None] != correct[None, :]  # [G, G] rollout i's opposite outcome
    d = torch.zeros((G, J), dtype=h.dtype, device=h.device)  # [G, J]
    seen = torch.zeros((G, J), dtype=torch.bool, device=h.device)  # [G, J]
    step = max(1, max_elements // (J * G * span * H))
    for s in range(0, G, step):
        n = min(step, G - s)
        ym = (pool_mask[None] & other[s:s + n, None, :, None]).reshape(n * J, G * span)  # [n J, G K]
        y = pool[None].expand(n, J, G * span, H).reshape(n * J, G * span, H)  # [n J, G K, H]
        x, xm = hs[s:s + n].reshape(n * J, span, H), ms[s:s + n].reshape(n * J, span)  # [n J, K, H], [n J, K]
        d[s:s + n] = wasserstein_1d(x, xm, y, ym).mean(-1).view(n, J)
        seen[s:s + n] = (xm.any(-1) & ym.any(-1)).view(n, J)
    at = span_index(T, span).to(h.device)  # [T]
    return d[:, at] * mask, (seen[:, at] & mask.bool()).to(h.dtype)  # [G, T], [G, T]


def weights(d: torch.Tensor, measured: torch.Tensor, mask: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """S4. w = 1 + alpha (d / dbar - 1) on each rollout's measured tokens, dbar the mean of d over them (so those
    weights sum to their number: the rollout's advantage mass is kept); 1 on its other scored tokens, and on every
    token of a rollout whose dbar is 0. d, measured, mask [N, T] -> w [N, T], 0 off the mask."""
    n = measured.sum(-1, keepdim=True)  # [N, 1]
    dbar = (d * measured).sum(-1, keepdim=True) / n.clamp(min=1)  # [N, 1]
    ok = (dbar > 0) & (measured > 0)  # [N, T]
    w = torch.where(ok, 1 + alpha * (d / torch.where(dbar > 0, dbar, torch.ones_like(dbar)) - 1),
                    torch.ones_like(d))  # [N, T]
    return w * mask


def token_advantages(adv_seq: torch.Tensor, w: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """S5. A_{i,t} = A_i w_{i,t}: adv_seq [N], w [N, T], mask [N, T] -> [N, T]. The weights are constants of the policy
    that sampled (no gradient through them)."""
    return adv_seq[:, None] * w.detach() * mask  # [N, T]


def batch_weights(model, batch: dict, correct: torch.Tensor, adv_seq: torch.Tensor, mask: torch.Tensor,
                  group_size: int, *, span: int, alpha: float, chunk: int):
    """S1-S4 for a batch of sample.generate(): (weights [N, T], details). details, for the heat maps: "distance"
    (S3's d) and "measured" (1 where S3 compared the span with the other outcome's), [N, T] each. correct [N] bool
    (K1's split, r_i > 0); only groups that hold both outcomes and some A_i != 0 run the forward; the others keep
    weight 1."""
    N, T = mask.shape
    w, dist = torch.ones((N, T), device=mask.device) * mask, torch.zeros((N, T), device=mask.device)
    seen = torch.zeros((N, T), device=mask.device)  # [N, T]
    details = {"distance": dist, "measured": seen}
    groups = correct.view(-1, group_size)  # [B, G]
    mixed = (groups.any(1) & ~groups.all(1) & (adv_seq.view(-1, group_size) != 0).any(1)).nonzero().flatten()
    if not len(mixed):
        return w, details
    rows = (mixed[:, None] * group_size + torch.arange(group_size, device=mixed.device)).flatten()  # [n]
    h = hidden_states(model, batch, rows.to(batch["input_ids"].device), chunk)  # [n, T, H]
    for k, g in enumerate(mixed.tolist()):
        r = slice(g * group_size, (g + 1) * group_size)
        d, measured = span_distances(h[k * group_size:(k + 1) * group_size], mask[r].float(), correct[r], span)
        w[r], dist[r], seen[r] = weights(d, measured, mask[r].float(), alpha), d, measured
    return w, details
