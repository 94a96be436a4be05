"""KTAE, Key-token Advantage Estimation: equations K1-K7 of EQUATIONS.md#ktae.

Source: Sun et al., 2025, "KTAE: A Model-Free Algorithm to Key-Tokens Advantage Estimation in Mathematical
Reasoning", arXiv 2505.16826. Where the printed formula and the authors' released code differ, this follows the
code (see key_token_values). KTAE adds no model and no forward pass: it is statistics over the token ids of the
G rollouts of one prompt. The unit is the token id; nothing is carried across groups or steps.

Everything is vectorised over the U distinct (group, id) pairs that occur (torch.unique), never over the
vocabulary, and a batch of B groups is one pass. Shapes: B groups of G rollouts, N = B * G, T response tokens.

Worked example (EQUATIONS.md#ktae-worked-example), r = [1, 1, 0, 0]:
    o_1 = [5, 6, 7], o_2 = [5, 6, 8], o_3 = [5, 9, 8], o_4 = [5, 9, 9]
    id 5 (everywhere) -> KTV 0;  id 6 (only in correct) -> +1.0;  id 9 (only in incorrect) -> -1.0
    A_1 = 0.8660 + KTV per token = [0.8660, 1.8660, 1.8660]
"""

import torch


def split(rewards: torch.Tensor):
    """K1. Correct set T = {r > 0}, incorrect set F = {r <= 0}, per group. rewards [B, G] ->
    (correct [B, G] bool, n_T [B], n_F [B]). With DAPO's rewards a correct but over-long rollout
    (1 - 0.4 = 0.6) is still correct. A group with n_T = 0 or n_F = 0 gets key-token values 0."""
    correct = rewards > 0  # [B, G]
    n_T = correct.sum(-1)  # [B]
    return correct, n_T, rewards.shape[1] - n_T


def contingency(ids: torch.Tensor, mask: torch.Tensor, correct: torch.Tensor, G: int):
    """K2. Presence table per token id that occurs in a group's masked response tokens, for every group at once.

    ids, mask [N, T] and correct [N] bool hold B groups of G consecutive rollouts (N = B * G; one group: N = G).
    Groups never share statistics: an entry of the table is a (group, id) pair, so one pass over the batch is
    B independent applications of K2. Per entry e (U of them):
        a = correct rollouts of its group containing the id at least once   b = incorrect ones   (presence)
        c = n_T - a      d = n_F - b      (n_T, n_F, L_T, L_F: the entry's group's)
    plus count_T, count_F (occurrences) and L_T, L_F (masked tokens per class) for K5's frequency term,
    group and vocab (which group and id the entry is), and inv [#masked]: the entry of each masked token.
    Everything is 1-D over the tokens that occur: nothing is the size of the vocabulary.
    """
    N = ids.shape[0]
    m = mask.bool()
    group = torch.arange(N, device=ids.device) // G  # [N] group of each rollout
    V = int(ids.max()) + 1
    row = torch.arange(N, device=ids.device)[:, None].expand_as(ids)[m]  # [M] rollout of each masked token
    entries, inv = torch.unique((group[:, None] * V + ids)[m], return_inverse=True)  # [U], [M]
    U = len(entries)
    cf = correct.to(torch.float64)  # [N]
    present = torch.unique(row * U + inv)  # (rollout, entry) pairs that occur: presence, not count
    p_row, p_entry = present // U, present % U
    a = torch.bincount(p_entry, weights=cf[p_row], minlength=U)  # [U]
    b = torch.bincount(p_entry, weights=1 - cf[p_row], minlength=U)  # [U]
    n_T = cf.view(-1, G).sum(-1)  # [B]
    lengths = mask.to(torch.float64).sum(-1)  # [N]
    L_T, L_F = (cf * lengths).view(-1, G).sum(-1), ((1 - cf) * lengths).view(-1, G).sum(-1)  # [B], [B]
    g = torch.div(entries, V, rounding_mode="floor")  # [U] group of each entry
    return {"group": g, "vocab": entries % V, "inv": inv, "a": a, "b": b, "c": n_T[g] - a, "d": (G - n_T)[g] - b,
            "count_T": torch.bincount(inv, weights=cf[row], minlength=U),  # [U]
            "count_F": torch.bincount(inv, weights=1 - cf[row], minlength=U),  # [U]
            "L_T": L_T[g], "L_F": L_F[g]}  # [U], [U]


def fisher_p(a, b, c, d, rel_tol: float = 1e-7) -> torch.Tensor:
    """K3. Two-sided Fisher exact p-value of each 2x2 table [[a, b], [c, d]] (as scipy.stats.fisher_exact).

    With R1 = a + b, C1 = a + c, n = a + b + c + d: P(k) = C(C1, k) C(n - C1, R1 - k) / C(n, R1), and
    p = sum of P(k) over the valid k with P(k) <= P(a) (1 + rel_tol). Exact: log-gamma in float64, all k at once.
    Example: a=2 b=0 c=0 d=2 -> P(0), P(1), P(2) = 1/6, 4/6, 1/6 -> p = 1/6 + 1/6 = 1/3.
    p is exactly 1 when no valid k is left out (a float sum would give 1 - 1e-16, and F = exp(-2) instead of 0).
    """
    a, b, c, d = (x.to(torch.float64) for x in (a, b, c, d))  # [U] each
    n, R1, C1 = a + b + c + d, a + b, a + c  # [U]
    k = torch.arange(int(n.max()) + 1, dtype=torch.float64, device=a.device)[None, :]  # [1, K]
    lo, hi = torch.clamp(R1 + C1 - n, min=0)[:, None], torch.minimum(R1, C1)[:, None]  # [U, 1]
    valid = (k >= lo) & (k <= hi)  # [U, K]
    kk = torch.where(valid, k, lo)  # keep lgamma's arguments positive where invalid

    def log_choose(x, y):
        return torch.lgamma(x + 1) - torch.lgamma(y + 1) - torch.lgamma(x - y + 1)

    logP = log_choose(C1[:, None], kk) + log_choose((n - C1)[:, None], R1[:, None] - kk) - log_choose(n, R1)[:, None]
    P = torch.where(valid, logP.exp(), torch.zeros_like(logP))  # [U, K]
    P_obs = torch.exp(log_choose(C1, a) + log_choose(n - C1, b) - log_choose(n, R1))  # [U]
    included = valid & (P <= P_obs[:, None] * (1 + rel_tol))  # [U, K]
    p = (P * included).sum(-1).clamp(max=1.0)  # [U]
    return torch.where((valid & ~included).any(-1), p, torch.ones_like(p))


def fisher_strength(p: torch.Tensor) -> torch.Tensor:
    """K3. F = exp(-2 p) if p < 1, and 0 if p = 1 (a token that says nothing gets no strength).
    The released code computes p in float32 without the tolerance, so tables whose true p is 1 get
    F ~ 0.135 there; not copied."""
    return torch.where(p < 1, torch.exp(-2 * p), torch.zeros_like(p))


def _H(p: torch.Tensor) -> torch.Tensor:
    """-p log2 p with 0 log 0 := 0."""
    return torch.where(p > 0, -p * torch.log2(p.clamp(min=1e-300)), torch.zeros_like(p))


def information_gain(a, b, c, d) -> torch.Tensor:
    """K4. IG_v = H_Y - H_Y|X in bits, in [0, 1]: 1 when presence of v separates T from F perfectly.

        H_Y   = H(n_T/N) + H(n_F/N)
        H_Y|X = (a+b)/N [H(a/(a+b)) + H(b/(a+b))] + (c+d)/N [H(c/(c+d)) + H(d/(c+d))]
    Example: a=2 b=0 c=0 d=2 -> H_Y = 1, H_Y|X = 0 -> IG = 1. a=2 b=2 c=0 d=0 -> IG = 1 - 1 = 0.
    """
    N = a + b + c + d
    H_Y = _H((a + c) / N) + _H((b + d) / N)
    with_v, without_v = (a + b).clamp(min=1e-300), (c + d).clamp(min=1e-300)  # a side of size 0 adds 0
    H_YX = (a + b) / N * (_H(a / with_v) + _H(b / with_v)) + (c + d) / N * (_H(c / without_v) + _H(d / without_v))
    return H_Y - H_YX


def direction(t: dict, k1: float = 2.0, bm25_b: float = 0.5, use_tf: bool = True) -> torch.Tensor:
    """K5. Direction D_v, + when v goes with correct rollouts: a Cohen's-h-like term plus a BM25-style
    frequency term (k1 = 2, b = 0.5; `t` is what contingency() returns).

        h_v  = arcsin(sqrt(a/(a+c))) - arcsin(sqrt(b/(b+d)))            (no factor 2)
        TF_T = tf_T (k1+1) / (tf_T + k1 (1 - b + b L_T/L_avg)),  tf_T = count of v in correct rollouts / L_T
        D_v  = h_v + TF_T/(TF_F + 1e-5) - TF_F/(TF_T + 1e-5)            (use_tf=False: D_v = h_v, an ablation)
    Example (worked example, id 6): h = pi/2, TF_T = (1/3)(3)/(1/3 + 2) = 3/7, TF_F = 0 -> D = pi/2 + 42857.
    """
    a, b, c, d = t["a"], t["b"], t["c"], t["d"]
    h = torch.asin(torch.sqrt(a / (a + c))) - torch.asin(torch.sqrt(b / (b + d)))  # [U]
    if not use_tf:
        return h
    L_T, L_F = t["L_T"], t["L_F"]
    L_avg = (L_T + L_F) / 2
    tf_T, tf_F = t["count_T"] / L_T, t["count_F"] / L_F  # [U], [U]
    TF_T = tf_T * (k1 + 1) / (tf_T + k1 * (1 - bm25_b + bm25_b * L_T / L_avg))
    TF_F = tf_F * (k1 + 1) / (tf_F + k1 * (1 - bm25_b + bm25_b * L_F / L_avg))
    return h + TF_T / (TF_F + 1e-5) - TF_F / (TF_T + 1e-5)


def key_token_values(F, IG, D, alpha: float = 1.0, beta: float = 1.0, top: float = 1.0) -> torch.Tensor:
    """K6. Key-token value in (-top, top):  S = (alpha F + beta IG) / (alpha + beta),
    KTV = (sigmoid(S * D) - 0.5) * 2 * top.

    Follows the authors' released code, not the printed formula. The paper prints sigmoid(.) - 0.5 (range
    -0.5..0.5), does not divide the strength by alpha + beta, and weights the frequency term with an h3; the
    code uses this form (range -1..1, matching the paper's heat-map scale) and no h3. The released run scripts
    pass beta_ig = 2, which the code ignores (it runs with 1). alpha = 0 removes the Fisher term, beta = 0 the
    information gain (the paper's ablations).
    A token seen in only one class saturates to about +-top because of the 1e-5 in K5 (released behaviour).
    """
    if alpha + beta <= 0:
        raise ValueError("KTAE needs alpha + beta > 0 (alpha weighs Fisher, beta information gain)")
    S = (alpha * F + beta * IG) / (alpha + beta)  # [U]
    return (torch.sigmoid(S * D) - 0.5) * 2 * top


def token_values(ids, mask, rewards, special_ids=(), alpha=1.0, beta=1.0, top=1.0, use_tf=True):
    """K1-K6: the key-token value of every response position, for B groups of G rollouts at once.

    ids, mask [B*G, T] (the G rollouts of a group consecutive, as generate() returns them); rewards [B, G].
    Returns values [B*G, T] (0 on masked positions, on special ids such as pad and EOS, and in every group that
    is all right or all wrong) and the table of K2-K6 per (group, id) entry, for inspection.
    """
    G = rewards.shape[1]
    correct, n_T, n_F = split(rewards)  # K1 [B, G], [B], [B]
    mixed = ((n_T > 0) & (n_F > 0)).repeat_interleave(G)  # [N] a flat group's values are all 0
    values = torch.zeros(ids.shape, dtype=torch.float32, device=ids.device)  # [N, T]
    m = mask.bool() & mixed[:, None]  # [N, T]
    if not m.any():
        return values, None
    t = contingency(ids, m, correct.reshape(-1), G)  # K2
    # An entry's table is fixed by (n_T, a, b), n_F being G - n_T: at most a few hundred distinct tables for
    # G = 16 however many ids occur. K3 and K4 are computed once per table, then gathered.
    n_T_e = t["a"] + t["c"]  # [U]
    keys, which = torch.unique((n_T_e * (G + 1) + t["a"]) * (G + 1) + t["b"], return_inverse=True)  # [K], [U]
    kn, ka, kb = keys // (G + 1) ** 2, keys // (G + 1) % (G + 1), keys % (G + 1)  # [K] each
    p = fisher_p(ka, kb, kn - ka, G - kn - kb)[which]  # K3 [U]
    IG = information_gain(ka, kb, kn - ka, G - kn - kb)[which]  # K4 [U]
    F, D = fisher_strength(p), direction(t, use_tf=use_tf)  # K3, K5 [U]
    ktv = key_token_values(F, IG, D, alpha, beta, top)  # K6 [U]
    for s in special_ids:
        ktv = torch.where(t["vocab"] == s, torch.zeros_like(ktv), ktv)
    values[m] = ktv.float()[t["inv"]]  # every masked position gets the value of its (group, id)
    return values, {**t, "ktv": ktv, "p": p, "F": F, "IG": IG, "D": D}


def token_advantages(adv_seq: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """K7. Additive token-level advantage: A_{i,t} = m_{i,t} (A_i + KTV_{o_{i,t}}).

    adv_seq [N] (the base method's rollout advantage: GRPO G1 or DAPO's), values [N, T] from
    token_values, mask [N, T]. The base method's loss is then used unchanged.
    """
    return mask * (adv_seq[:, None] + values)  # [N, T]
