"""SHEAR: Span-level Hidden state Enabled Advantage Reweighting (Chen, He et al. 2026, arXiv 2604.23318), as the
paper's Algorithm 1 (Eqs. 2-4); S1-S5 of EQUATIONS.md#shear, where every choice the paper leaves open is stated.

Within a group, each rollout's hidden states are cut into overlapping windows; each window, as the uniform measure on
its states, is compared with every window of every rollout of the other outcome by an entropic Wasserstein-1
distance, and keeps the smallest (a window is far only if it is unlike every alternative). A token's weight is the
largest distance among the windows that hold it, over the group's mean hidden-state norm; A_i is scaled by it.

    S1 hidden_states      h_{i,t}: the last layer's state (after the final norm) at response token t, one no-grad
                          forward
    S2 window_size        w = min(w_max, max(2, ceil(mean response length / 4))), s = --shear-stride or max(1, w // 4)
       windows            start a_k = k s, end b_k = min(a_k + w, T) (0-based, end excluded), k = 0 .. K - 1 with
                          K = 1 + ceil((T - w) / s) (1 if T <= w, 0 if T = 0): the last window reaches the end
       coverage           [G, K, T]: which token lies in which window of its rollout
    S3 costs              ||x - y||_2 between every pair of points of two sets of clouds
       sinkhorn           <P, C> of the entropic plan between uniform measures (log domain, eps-scaling, rounded
                          onto the couplings), eps a fraction of the problem's mean cost; sinkhorn_w1 from points
       window_distances   d_{i,k} = min over the other outcome's rollouts j and their windows l of W_eps(P_k^i, P_l^j)
    S4 mean_norm          n_bar: the group's mean ||h|| over its scored tokens
       weights            omega_t = max over the windows k holding t of d_k, / n_bar; 1 where no window was measured
    S5 token_advantages   A_{i,t} = A_i omega_{i,t}

A worked example (H = 1, w = 2, s = 1). A wrong rollout's states [0, 1, 4] (windows {0, 1} and {1, 4}), a right
rollout's [0, 2] (one window {0, 2}). In one dimension W1 pairs the sorted values:

    W1({0, 1}, {0, 2}) = (|0 - 0| + |1 - 2|) / 2 = 0.5       W1({1, 4}, {0, 2}) = (|1 - 0| + |4 - 2|) / 2 = 1.5
    d_wrong = [0.5, 1.5]      d_right = [min(0.5, 1.5)] = [0.5]
    n_bar = (0 + 1 + 4 + 0 + 2) / 5 = 1.4
    omega_wrong = [0.5, max(0.5, 1.5), 1.5] / 1.4 = [0.357, 1.071, 1.071]      omega_right = [0.357, 0.357]
    A = [-0.707, +0.707] (G1):  A_t wrong = [-0.253, -0.758, -0.758], right = [0.253, 0.253]

Sinkhorn's values lie above these, by at most e log 2. Two clouds of two points: the plan is [[p, 1/2 - p], [1/2 - p,
p]], (1/2 - p) / p = exp(-D / 2e) with D = C12 + C21 - C11 - C22 what crossing adds, so the value is W1 + D (1/2 - p).
Here D = 2 for both windows, e = 0.05 x the mean cost (1 and 2): W1 + 4e-9 and W1 + 9e-5 (tests/test_shear.py).
"""
import math

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


def window_size(lengths: torch.Tensor, w_max: int, stride: int = None):
    """S2, our rule (the paper's w = 100, s = 25 fit 3,000-token answers, not 40-token ones): (w, s) for a group whose
    responses hold `lengths` [G] scored tokens. w = min(w_max, max(2, ceil(mean length / 4))): about four windows'
    worth of a mean response and at least two states a window; s = stride, or max(1, w // 4) (the paper's 100 / 25),
    at most w so that no token falls between windows. Lengths of mean 40: (10, 2); of mean 3,000: (100, 25)."""
    w = min(w_max, max(2, math.ceil(lengths.float().mean().item() / 4)))
    return w, min(w, stride or max(1, w // 4))


def window_count(lengths: torch.Tensor, w: int, s: int) -> torch.Tensor:
    """S2. K = 1 + ceil((T - w) / s) windows for a response of T tokens (1 if T <= w, 0 if T = 0): [G] -> [G]."""
    more = torch.div(torch.clamp(lengths - w, min=0) + s - 1, s, rounding_mode="floor")  # [G] ceil((T - w) / s)
    return torch.where(lengths > 0, 1 + more, torch.zeros_like(more))


def windows(T: int, w: int, s: int):
    """S2. (starts, ends) [K] of the windows of a response of T tokens, 0-based, ends excluded: the paper's
    a_k = 1 + (k - 1) s and min(a_k + w - 1, T), 1-based and inclusive. windows(10, 4, 3): [0, 3, 6], [4, 7, 10];
    windows(11, 4, 3): [0, 3, 6, 9], [4, 7, 10, 11] (the last window shorter); windows(3, 4, 1): [0], [3]."""
    K = int(window_count(torch.tensor([T]), w, s))
    starts = torch.arange(K) * s  # [K]
    return starts, torch.clamp(starts + w, max=T)  # [K], [K]


def coverage(mask: torch.Tensor, w: int, s: int) -> torch.Tensor:
    """S2. cover [G, K, T]: token t of rollout i lies in its window k (and is scored). A response's length is up to
    its last scored token; K is the longest's window count, a shorter rollout's extra windows are empty."""
    G, T = mask.shape
    t = torch.arange(T, device=mask.device)  # [T]
    lengths = torch.where(mask.bool(), t + 1, torch.zeros_like(t)).amax(-1)  # [G] up to the last scored token
    count = window_count(lengths, w, s)  # [G]
    K = int(count.max()) if G else 0
    start = torch.arange(K, device=mask.device)[:, None] * s  # [K, 1]
    inside = (t >= start) & (t < start + w)  # [K, T]
    return inside[None] & mask.bool()[:, None, :] & (torch.arange(K, device=mask.device) < count[:, None])[..., None]


def costs(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """S3's ground cost ||x - y||_2 in the full hidden space, between every point of every cloud of x [A, n, H] and of
    y [B, m, H]: [A, B, n, m]. One matrix product (|x|^2 + |y|^2 - 2 x.y, clamped at 0): centre the points first
    (distances do not move) so that the difference of large squares loses little."""
    xy = torch.einsum("anh,bmh->abnm", x, y)  # [A, B, n, m]
    sq = (x * x).sum(-1)[:, None, :, None] + (y * y).sum(-1)[None, :, None, :] - 2 * xy  # [A, B, n, m]
    return sq.clamp(min=0).sqrt()


def sinkhorn(C: torch.Tensor, a_mask: torch.Tensor, b_mask: torch.Tensor, eps: float, iters: int) -> torch.Tensor:
    """S3. The transport cost <P, C> of the entropic plan P between the uniform measures on the valid points of two
    clouds, for every cloud a [A] against every cloud b [B]: C [A, B, n, m], a_mask [A, n], b_mask [B, m] -> [A, B].
    P minimises <P, C> - e H(P) over the couplings, e = eps times the problem's mean cost over its valid pairs (scale
    free): `iters` Sinkhorn iterations in the log domain (a fixed count: the same numbers in any chunking), e lowered
    to its value over the first half. P is then rounded onto the couplings, so W1 <= <P, C> always; converged,
    <P, C> <= W1 + e log min(n, m). +inf where a cloud has no valid point."""
    am, bm = a_mask.bool()[:, None, :], b_mask.bool()[None, :, :]  # [A, 1, n], [1, B, m]
    ok = am.any(-1) & bm.any(-1)  # [A, B]
    am, bm = am | ~am.any(-1, keepdim=True), bm | ~bm.any(-1, keepdim=True)  # an empty cloud solved on its padding
    log_a = torch.where(am, -am.sum(-1, keepdim=True).float().log(), -torch.inf)  # [A, 1, n] log(1/n) on the valid
    log_b = torch.where(bm, -bm.sum(-1, keepdim=True).float().log(), -torch.inf)  # [1, B, m]
    pair = (am[..., :, None] & bm[..., None, :]).to(C.dtype)  # [A, B, n, m]
    e = eps * (C * pair).sum((-2, -1)) / pair.sum((-2, -1))  # [A, B]
    e = e.clamp(min=torch.finfo(C.dtype).tiny)[..., None, None]  # [A, B, 1, 1]
    f = torch.zeros(C.shape[:-1], dtype=C.dtype, device=C.device)  # [A, B, n] the potentials
    g = torch.zeros(C.shape[:-2] + C.shape[-1:], dtype=C.dtype, device=C.device)  # [A, B, m]
    for it in range(iters):  # each half step makes one marginal exact
        # eps-scaling: e falls from the mean cost (x 1 / eps) to its value over the first half, then stays; plain
        # Sinkhorn at a small e needs thousands of iterations when mass must cross between clusters of states
        r = e * max(1.0, 1 / eps) ** max(0.0, 1 - it / max(1, iters // 2))  # [A, B, 1, 1]
        f = -r[..., 0] * torch.logsumexp((g[..., None, :] - C) / r + log_b[..., None, :], -1)  # [A, B, n]
        g = -r[..., 0] * torch.logsumexp((f[..., :, None] - C) / r + log_a[..., :, None], -2)  # [A, B, m]
    plan = ((f[..., :, None] + g[..., None, :] - C) / e + log_a[..., :, None] + log_b[..., None, :]).exp()
    # rounded onto the couplings (Altschuler et al. 2017, Alg. 2), so that W1 <= <P, C> whatever the iterations
    # left: rows then columns scaled down to their marginals, what is missing put back as a product of the two
    a, b = log_a.exp(), log_b.exp()  # [A, 1, n], [1, B, m]
    plan = plan * torch.clamp(a / plan.sum(-1).clamp(min=1e-30), max=1)[..., None]  # [A, B, n, m]
    plan = plan * torch.clamp(b / plan.sum(-2).clamp(min=1e-30), max=1)[..., None, :]
    miss_a, miss_b = a - plan.sum(-1), b - plan.sum(-2)  # [A, B, n], [A, B, m] both sum to 1 - plan's total
    cost = (plan * C).sum((-2, -1)) + torch.einsum("abn,abnm,abm->ab", miss_a, C, miss_b) / miss_a.sum(
        -1).clamp(min=1e-30)  # [A, B]
    return torch.where(ok, cost, torch.full_like(cost, torch.inf))


def sinkhorn_w1(x: torch.Tensor, x_mask: torch.Tensor, y: torch.Tensor, y_mask: torch.Tensor, eps: float,
                iters: int) -> torch.Tensor:
    """S3 from the points: W_eps between every cloud of x [A, n, H] (x_mask [A, n]) and every cloud of y [B, m, H]
    (y_mask [B, m]): [A, B]. The two-point example of tests/test_shear.py: {(0, 0), (1, 0)} against {(0, 1), (1, 1)}
    is 1 (straight up) against sqrt 2 (crossed), W1 = 1."""
    centre = torch.cat([x[x_mask.bool()], y[y_mask.bool()]]).mean(0) if x_mask.any() or y_mask.any() else 0
    return sinkhorn(costs(x - centre, y - centre), x_mask, y_mask, eps, iters)


def window_distances(h: torch.Tensor, cover: torch.Tensor, correct: torch.Tensor, w: int, s: int, eps: float,
                     iters: int, max_elements: int = 2 ** 24) -> torch.Tensor:
    """S3 over one group: d [G, K], d_{i,k} = min over the rollouts j of the other outcome and their windows l of
    W_eps(window k of i, window l of j); +inf where there is none (an empty window, or no state of the other outcome).
    h [G, T, H], cover [G, K, T] (S2's coverage), correct [G] bool. The right rollouts' windows are the rows, each
    solved against every wrong window at once, max_elements / (wrong windows x w^2) rows a solve (speed and memory
    only: the same numbers); W_eps is symmetric, so one solve gives both sides' minima. The cost of two windows is a
    block of the token-to-token costs of their rollouts, computed once per pair of rollouts."""
    G, K, T = cover.shape
    d = torch.full((G, K), torch.inf, dtype=h.dtype, device=h.device)  # [G, K]
    right, wrong = correct.nonzero().flatten(), (~correct).nonzero().flatten()  # [c], [G - c]
    if not len(right) or not len(wrong) or not K:
        return d
    span = (K - 1) * s + w  # tokens the windows reach
    at = torch.clamp(torch.arange(K, device=h.device)[:, None] * s + torch.arange(w, device=h.device), max=T - 1)
    inside = (torch.arange(K, device=h.device)[:, None] * s + torch.arange(w, device=h.device)) < T  # [K, w]
    wmask = cover.gather(2, at[None].expand(G, K, w)) & inside  # [G, K, w] window k's tokens
    centre = h[cover.any(1)].mean(0)  # [H] the group's mean state: costs() loses less around it
    ym = wmask[wrong].reshape(-1, w)  # [B, w], B = (G - c) K
    rows = max(1, max_elements // (len(wrong) * K * w * w))  # (right rollout, window) rows a solve
    between = torch.full((len(right) * K, len(wrong) * K), torch.inf, dtype=h.dtype, device=h.device)  # [c K, B]
    blocks = {}  # right rollout -> its windows' cost blocks against every wrong window, while its rows are solved
    for r0 in range(0, len(right) * K, rows):
        r1 = min(r0 + rows, len(right) * K)
        at_rows = torch.arange(r0, r1, device=h.device)  # [r]
        for a in range(r0 // K, (r1 - 1) // K + 1):
            if a not in blocks:
                D = costs(h[right[a]][None] - centre, h[wrong] - centre)[0]  # [G - c, T, T] token to token
                D = torch.nn.functional.pad(D, (0, max(0, span - T), 0, max(0, span - T)))[:, :span, :span]
                blocks[a] = D.unfold(1, w, s).unfold(2, w, s).transpose(0, 1)  # [K, G - c, K, w, w] a view
        C = torch.stack([blocks[r // K][r % K] for r in range(r0, r1)]).flatten(1, 2)  # [r, B, w, w]
        between[at_rows] = sinkhorn(C, wmask[right][at_rows // K, at_rows % K], ym, eps, iters)  # [r, B]
        blocks = {a: b for a, b in blocks.items() if a >= (r1 - 1) // K}  # the rows left need no other
    between = between.view(len(right), K, len(wrong), K)  # [c, K, G - c, K]
    d[right] = between.flatten(2).amin(-1)  # [c, K] each right window against every wrong one
    d[wrong] = between.permute(2, 3, 0, 1).flatten(2).amin(-1)  # [G - c, K]
    return d


def mean_norm(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """S4. n_bar: the mean ||h_t||_2 over the group's scored tokens; h [G, T, H], mask [G, T] -> a scalar."""
    return (h.norm(dim=-1) * mask).sum() / mask.sum().clamp(min=1)


def weights(d: torch.Tensor, cover: torch.Tensor, n_bar: torch.Tensor, mask: torch.Tensor):
    """S4. (omega [G, T], measured [G, T], top [G, T]): omega_t = max over the windows k holding t of d_k, / n_bar; 1
    on a token no measured window holds (d = inf: nothing of the other outcome to compare with), 0 off the mask. top
    is the numerator (0 where unmeasured). d [G, K], cover [G, K, T] (S2), mask [G, T]. No renormalisation per
    rollout: a rollout's weights need not sum to its length."""
    held = torch.where(cover & torch.isfinite(d)[..., None], d[..., None], -torch.inf)  # [G, K, T]
    top = held.amax(1) if d.shape[1] else torch.full(mask.shape, -torch.inf, device=mask.device)  # [G, T]
    measured = torch.isfinite(top) & mask.bool()  # [G, T]
    top = torch.where(measured, top, torch.zeros_like(top))  # [G, T]
    omega = torch.where(measured, top / n_bar.clamp(min=torch.finfo(top.dtype).tiny), torch.ones_like(top))
    return omega * mask, measured.to(top.dtype), top


def group_weights(h: torch.Tensor, mask: torch.Tensor, correct: torch.Tensor, *, window: int, stride: int = None,
                  eps: float, iters: int, max_elements: int = 2 ** 24):
    """S2-S4 for one group: (omega [G, T], details). h [G, T, H], mask [G, T], correct [G] bool. details, each
    [G, T]: "distance" (S4's max d over the windows holding t, 0 where unmeasured), "measured", "windows" (how many
    windows hold t), "window" (the group's w), "n_bar"."""
    w, s = window_size(mask.sum(-1), window, stride)
    cover = coverage(mask, w, s)  # [G, K, T] S2
    d = window_distances(h, cover, correct.bool(), w, s, eps, iters, max_elements)  # [G, K] S3
    n_bar = mean_norm(h, mask)  # S4
    omega, measured, top = weights(d, cover, n_bar, mask)  # [G, T] S4
    full = lambda v: torch.full_like(omega, float(v)) * mask  # noqa: E731
    return omega, {"distance": top, "measured": measured, "windows": cover.sum(1).to(omega.dtype) * mask,
                   "window": full(w), "n_bar": full(n_bar)}


def token_advantages(adv_seq: torch.Tensor, w: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """S5. A_{i,t} = A_i omega_{i,t} (the sign A_i's, omega >= 0): adv_seq [N], w [N, T], mask [N, T] -> [N, T]. The
    weights are constants of the policy that sampled (no gradient through them)."""
    return adv_seq[:, None] * w.detach() * mask  # [N, T]


def batch_weights(model, batch: dict, correct: torch.Tensor, adv_seq: torch.Tensor, mask: torch.Tensor,
                  group_size: int, *, window: int, stride: int = None, eps: float, iters: int, chunk: int,
                  max_elements: int = 2 ** 24):
    """S1-S4 for a batch of sample.generate(): (weights [N, T], details), details as group_weights's, [N, T] each.
    correct [N] bool (K1's split, r_i > 0). Only groups that hold both outcomes and some A_i != 0 run the forward;
    the others keep weight 1 (GRPO's A_i: a group of one outcome has no other set to compare with)."""
    N, T = mask.shape
    w = torch.ones((N, T), device=mask.device) * mask  # [N, T]
    details = {k: torch.zeros((N, T), device=mask.device) for k in ("distance", "measured", "windows", "window",
                                                                      "n_bar")}
    groups = correct.view(-1, group_size)  # [B, G]
    mixed = (groups.any(1) & ~groups.all(1) & (adv_seq.view(-1, group_size) != 0).any(1)).nonzero().flatten()
    if not len(mixed):
        return w, details
    rows = (mixed[:, None] * group_size + torch.arange(group_size, device=mixed.device)).flatten()  # [n]
    h = hidden_states(model, batch, rows.to(batch["input_ids"].device), chunk).to(mask.device)  # [n, T, H]
    for k, g in enumerate(mixed.tolist()):
        r = slice(g * group_size, (g + 1) * group_size)
        w[r], got = group_weights(h[k * group_size:(k + 1) * group_size], mask[r].float(), correct[r], window=window,
                                  stride=stride, eps=eps, iters=iters, max_elements=max_elements)
        for name, value in got.items():
            details[name][r] = value
    return w, details
