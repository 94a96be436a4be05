"""What `--method` means: a base (grpo, dapo), a token rule (none, ktae, oar-p, oar-g, grail, entropy, shear, rlsd,
surprisal) and a loss term (sdpg, or none), each from one table.

    --method grpo        = grpo + none       (G1 broadcast to every token)
    --method dapo        = dapo + none       (DAPO's preset flags, D1-D4)
    --method ktae        = grpo + ktae       (K7 on top of G1)
    --method dapo+ktae   = dapo + ktae
    --method oar-p       = grpo + oar-p      (O6 with O2's perturbation scores)
    --method oar-g       = grpo + oar-g      (O6 with O3's gradient scores)
    --method grail       = grpo + grail      (R6 with R3's gradient saliency of the rollout's own answer)
    --method entropy     = grpo + entropy    (E1: only the top 20 % of the batch's tokens by entropy learn)
    --method shear       = grpo + shear      (S5 with S3's window Wasserstein distances of the hidden states)
    --method rlsd        = grpo + rlsd       (L4 with L3's teacher evidence: the model shown the gold answer)
    --method surprisal   = grpo + surprisal  (U1: a wrong rollout's advantage spread by its tokens' surprisal)
    --method sdpg        = dapo + sdpg term  (P4: the full-vocabulary KL to the model shown the answer, P3)
    and any other BASE+RULE+TERM, e.g. dapo+oar-g, grpo+sdpg.

A base is a set of flag defaults (any flag given on the command line wins) and D4's length share. A token rule is
one function with one signature, as verl registers its advantage estimators by name:

    rule(batch, rewards, mask, ctx) -> TokenAdvantages(tokens [N, T], seq [N], values [N, T] or None, terms)

batch: what sample.generate() returned for the step's N = B * G rollouts (groups consecutive); rewards [B, G];
mask [N, T] the tokens that enter the loss (D4's overlong filter applied); ctx: the Context below. `tokens` is
A_{i,t}, what the loss (G3) uses; `seq` is the rollout advantage A_i it was built from (logged by O7); `values`
the per-token quantity the heat maps colour (KTAE's key-token values, OAR's weights), None for plain GRPO; `terms`
(optional) the tagged quantities behind `values`, which the heat maps show on hover.

A new rule is one function and one entry in RULES; `--method grpo+NAME` and `--method dapo+NAME` then exist, with
every flag, log and checkpoint of the others (README.md, "Adding a token rule", has a worked one that the tests
run). A Rule also owns everything else about itself: its flag defaults, its checks, its heat map, where it puts
the blame for a wrong answer (toyworld/credit.py measures that against the first error the synthetic tasks know,
epicprm.py against the first wrong step on a real model; without one every token is blamed alike, as in GRPO), and what TRL needs to know of it (scaling/trl_grpo.py).
A loss term (TERMS, LossTerm) adds its own loss to the surrogate's, one value per token aggregated as it is (G5):
SDPG's self-distillation. It reads one micro-batch of the update (Piece: the policy's last hidden states, its log-probs,
the reference's) and returns the per-token loss; train.update adds it. No other module tests a method's, a rule's or a
term's name.
"""
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable, NamedTuple, Optional

import torch

import data
import entropy
import grail
import grpo
import ktae
import oar
import rlsd
import sample
import sdpg
import surprisal
import shear
from config.shared import number
from infra import memory, models
from infra.plots import NOTE, SATURATED  # the two kinds of flag in TokenAdvantages.terms, as the heat maps read them

@dataclass(frozen=True)
class Base:
    """What a base sets where its flag was not given (dapo.py D1-D4; GRPO's values are the papers' and verl's)."""
    flags: dict
    overlong_share: Fraction = Fraction(0)  # D4's L_cache as a share of --max-new-tokens (0: no overlong penalty)


BASES = {
    "grpo": Base({"eps_high": None, "agg": "seq-mean-token-mean", "dynamic_sampling": False, "keep_surplus": False,
                  "signed_reward": False}),
    # dapo: clip-higher 0.28 (D1), dynamic sampling with DAPO's buffer (D2), token-mean loss (D3), the soft overlong
    # penalty over the last sixth of the length limit (D4, as KTAE's 512 of 3072), rewards +-1, no KL
    "dapo": Base({"eps_high": 0.28, "agg": "token-mean", "dynamic_sampling": True, "keep_surplus": True,
                  "signed_reward": True}, overlong_share=Fraction(1, 6)),
}


class TokenAdvantages(NamedTuple):
    tokens: torch.Tensor  # [N, T] A_{i,t}, 0 outside the mask
    seq: torch.Tensor  # [N] A_i, the rollout's advantage (G1 of its rewards)
    values: Optional[torch.Tensor]  # [N, T] what the heat map colours, or None
    # The per-token quantities behind values, for the heat map's hover text and tables: {name: [N, T]}, each name led
    # by its equation's tag ("K3 Fisher p"), NaN where a term was not computed for that token. A name that starts
    # with SATURATED or NOTE holds a 0/1 flag, the rest of the name saying why the token's value is what it is (a
    # clip or a cap reached, a value the rule sets rather than measures). None: the rule explains nothing.
    terms: Optional[dict] = None

    def rows(self, which) -> "TokenAdvantages":
        """The same advantages for the rollouts `which` (a slice or index tensor), terms included."""
        return TokenAdvantages(*(None if x is None else x[which] for x in self[:3]),
                               None if self.terms is None else {k: v[which] for k, v in self.terms.items()})


def _flag(on: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (on & mask.bool()).float()  # [N, T] a term's 0/1 flag, on the scored tokens only


@dataclass
class Context:
    """What a rule may need beyond the batch: the flags, the policy (OAR scores with it), its tokenizer, the step's
    problems (OAR's probe uses the gold answer) and a cache of decoded tokens."""
    args: object
    model: torch.nn.Module
    tokenizer: object
    problems: list  # the B problems of the batch, in group order
    pieces: dict = field(default_factory=dict)  # token id -> its decoded text (OAR's spans)
    step: int = 0  # optimiser steps done before this batch's (RLSD's schedule)
    # What a rule keeps from step to step (RLSD's frozen teacher): the run's own dict, which train.py keeps on its Run
    # and its checkpoints save (Rule.saved says what of it); None: a call alone, nothing kept (RLSD's teacher is then
    # the policy as it is)
    state: Optional[dict] = None


def sequence_advantages(rewards: torch.Tensor, ctx: Context) -> torch.Tensor:
    """G1 of the rewards [B, G], one value per rollout [N] (Dr. GRPO's variant with --no-std-scale)."""
    return grpo.group_advantages(rewards, scale_std=not ctx.args.no_std_scale).view(-1).to(ctx.args.device)  # [N]


def none(batch, rewards, mask, ctx) -> TokenAdvantages:
    """GRPO (and DAPO): every token of a rollout gets the rollout's advantage, A_{i,t} = A_i."""
    seq = sequence_advantages(rewards, ctx)  # [N]
    return TokenAdvantages(seq[:, None] * mask, seq, None)  # [N, T]


def key_tokens(batch, rewards, mask, ctx) -> TokenAdvantages:
    """KTAE: K1-K6 give each (group, token id) a key-token value; K7 adds it to A_i."""
    a, seq = ctx.args, sequence_advantages(rewards, ctx)  # [N]
    special = (ctx.tokenizer.pad_token_id, ctx.tokenizer.eos_token_id)  # never key tokens
    resp = batch["input_ids"][:, batch["prompt_len"]:]  # [N, T]
    values, table = ktae.token_values(resp, mask, rewards, special_ids=special, alpha=a.ktae_alpha,
                                      beta=a.ktae_beta, top=a.ktae_top, use_tf=not a.ktae_no_tf)  # [N, T] K1-K6
    tokens = ktae.token_advantages(seq, values, mask)  # [N, T] K7
    return TokenAdvantages(tokens, seq, values, _ktae_terms(table, rewards, mask, tokens, special, a))


def _ktae_terms(t, rewards, mask, tokens, special, a) -> Optional[dict]:
    """KTAE's terms: each position gets its (group, id) entry's K1-K6 from ktae.token_values's table, and K7's
    A_i + value. None when no group mixes right and wrong rollouts (no table: every value is 0)."""
    if t is None:
        return None
    G = rewards.shape[1]
    _, n_T, n_F = ktae.split(rewards)  # K1 [B], [B]
    covered = mask.bool() & ((n_T > 0) & (n_F > 0)).repeat_interleave(G).to(mask.device)[:, None]  # [N, T]
    # the positions of the table's `inv`, picked as token_values picks them

    def spread(x, empty=float("nan")):  # [U] per entry -> [N, T] per position
        out = torch.full(mask.shape, empty, device=mask.device)  # [N, T]
        out[covered] = x.float()[t["inv"]]
        return out

    S = (a.ktae_alpha * t["F"] + a.ktae_beta * t["IG"]) / (a.ktae_alpha + a.ktae_beta)  # [U] K6's strength
    ktv, top, use_tf = t["ktv"], a.ktae_top, not a.ktae_no_tf  # [U]
    terms = {"K1 n_T (right rollouts)": t["a"] + t["c"], "K1 n_F (wrong rollouts)": t["b"] + t["d"],
             "K2 a (right rollouts with it)": t["a"], "K2 b (wrong rollouts with it)": t["b"], "K3 Fisher p": t["p"],
             "K3 strength F": t["F"], "K4 information gain IG": t["IG"], "K5 count in right": t["count_T"],
             "K5 count in wrong": t["count_F"], "K5 direction D": t["D"], "K6 strength S": S, "K6 S*D": S * t["D"],
             "K6 value": ktv}
    terms = {k: spread(v) for k, v in terms.items()}
    terms["K7 A_i + value"] = tokens
    special_e = torch.zeros_like(t["vocab"], dtype=torch.bool)  # [U]
    for s in special:
        special_e |= t["vocab"] == s
    one_class = (t["a"] == 0) | (t["b"] == 0)  # [U] with K5's frequency term, D divides by TF_other + 1e-5
    # K6 = (sigmoid(S D) - 0.5) 2 top = top tanh(S D / 2): within 0.1 % of +-top once |S D| >= 7.6, 0.05 top below 0.1
    saturated, faint = ktv.abs() >= 0.999 * top, (ktv != 0) & (ktv.abs() < 0.05 * top)  # [U], [U]
    flags = {
        SATURATED + "the id occurs in one class only, so K5's TF_T / (TF_F + 1e-5) (or its mirror) divides by 1e-5 "
        "and D is huge: S*D is past 7.6, where K6 = top tanh(S*D / 2) is within 0.1 % of +-top, whatever F and IG":
            saturated & one_class & use_tf,
        SATURATED + "|S*D| >= 7.6, where K6 = top tanh(S*D / 2) is within 0.1 % of +-top": saturated & ~(
            one_class & use_tf),
        NOTE + "faint (|K6| < 5 % of top, |S*D| < 0.1): the id occurs in both classes, so K5 has no 1e-5 division, "
        "and S or D is near 0 (see their lines)": faint & ~one_class,
        NOTE + "S = 0, so K6 = 0: no strength (F is 0 when p = 1; IG is 0 when the id is as common in right as in "
        "wrong rollouts)":
            (S == 0) & ~special_e,
        NOTE + "pad or EOS: never a key token, K6 set to 0 (its K2-K5 are still shown)": special_e,
    }
    return {**terms, **{k: spread(v.float(), 0.0) for k, v in flags.items()}}


def outcome_grounded(scorer: str):
    """OAR: O1-O5 weigh each reasoning token by how much it moves the answer distribution; O6 scales A_i by it.
    scorer: "perturb" (OAR-P, O2) or "gradient" (OAR-G, O3). Scored in float32 whatever --bf16 says."""
    def rule(batch, rewards, mask, ctx) -> TokenAdvantages:
        a, seq = ctx.args, sequence_advantages(rewards, ctx)  # [N]
        enc = lambda s: ctx.tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
        answers = [enc(q["answer"] + "}") for q in ctx.problems for _ in range(a.group_size)]  # O1's teacher forcing
        got = {}  # O2/O3's scores, O4's normalised ones, the reasoning mask: the heat map's terms
        with sample.float32(ctx.model):  # under bf16's rounding OAR's scores are mostly noise (tests/test_lora.py)
            weights = oar.batch_weights(ctx.model, batch, answers, enc(a.oar_cue), seq, ctx.tokenizer, ctx.pieces,
                                        scorer=scorer, probe=a.oar_probe, q=a.oar_q, beta=a.oar_beta,
                                        sigma=a.oar_sigma, chunk=a.oar_chunk, details=got)  # [N, T]
        tokens = oar.token_advantages(seq, weights, mask)  # [N, T] O6
        return TokenAdvantages(tokens, seq, weights, _oar_terms(got, weights, tokens, seq, mask, scorer, a))
    return rule


def _oar_terms(got: dict, weights, tokens, seq, mask, scorer: str, a) -> dict:
    """OAR's terms: O2's or O3's score I, O4's Ihat, O5's quantile tau and weight, O6's A_i w; NaN off the scored
    reasoning. Flags where O5 floors a weight at 0.1, and where a token keeps weight 1 unscored."""
    reason = got["reason"].bool() & mask.bool()  # [N, T]
    nan = torch.full_like(weights, float("nan"))  # [N, T]
    tau = oar.quantile(got["normalised"], reason, a.oar_q)[:, None].expand_as(weights)  # [N, T] O5's tau
    floored = reason & (got["normalised"] < tau) & (got["normalised"] / (tau + 1e-8) < 0.1)  # [N, T] O5's clamp
    name = "O2 perturbation score I" if scorer == "perturb" else "O3 gradient score I"
    terms = {name: got["scores"], "O4 normalised Ihat": got["normalised"],
             f"O5 tau (Ihat's {a.oar_q:g}-quantile)": tau}
    terms = {k: torch.where(reason, v, nan) for k, v in terms.items()}
    return {**terms, "O5 Bi-Level weight": weights * mask, "O6 A_i * weight": tokens,
            SATURATED + "O5 floors Ihat / tau at 0.1 (a score far below the rollout's quantile tau), before the "
            "weights are scaled to sum to R": _flag(floored, mask),
            NOTE + "not scored: O5 gives 1 to the boxed answer, EOS and every token of a rollout whose A_i is 0":
                _flag(~reason, mask)}


def gradient_saliency(batch, rewards, mask, ctx) -> TokenAdvantages:
    """GRAIL: R1-R5 weigh each token by how strongly the rollout's own boxed answer depends on it (the gradient of
    the answer's log-likelihood to the input embeddings, times the embedding); R6 scales A_i by it. Scored in
    float32 whatever --bf16 says, as OAR."""
    a, seq = ctx.args, sequence_advantages(rewards, ctx)  # [N]
    with sample.float32(ctx.model):
        weights, got = grail.batch_weights(ctx.model, batch, seq, mask, ctx.tokenizer, ctx.pieces,
                                           temperature=a.temperature, symmetry=a.grail_symmetry, std=a.grail_std,
                                           w_min=a.grail_min, w_max=a.grail_max, chunk=a.oar_chunk)  # [N, T]
    tokens = grail.token_advantages(seq, weights, mask)  # [N, T] R6
    raw = 1 + a.grail_std * got["z"]  # [N, T] R5 before its clip
    free = ~got["fallback"][:, None] & ~got["content"] & ~got["boundary"]  # [N, T] where R5's clip decides
    unscored = got["fallback"][:, None].expand_as(raw)  # [N, T] rows R3 did not score: no saliency to show
    nan = torch.full_like(raw, float("nan"))  # [N, T]
    terms = {"R3 saliency s": torch.where(unscored, nan, got["saliency"]),
             "R4 z (log s standardised)": torch.where(unscored, nan, got["z"]),
             f"R5 1 + {a.grail_std:g} z (before the clip)": torch.where(free, raw, nan),
             "R5 weight": weights, "R6 A_i * weight": tokens,
             SATURATED + f"R5 clips 1 + {a.grail_std:g} z to [{a.grail_min:g}, {a.grail_max:g}]":
                 _flag(free & ((raw < a.grail_min) | (raw > a.grail_max)), mask),
             SATURATED + f"R5 sets the box's content to {a.grail_max:g}, whatever its saliency":
                 _flag(got["content"], mask),
             NOTE + "R5 sets the box's marker, its closing brace and what follows to 1": _flag(got["boundary"], mask),
             NOTE + f"not weighted: R5 gives 1 to a rollout without a box, or whose A_i is not of the sign "
             f"--grail-symmetry {a.grail_symmetry} weighs": _flag(got["fallback"][:, None] & ~got["content"]
                                                                  & ~got["boundary"], mask)}
    return TokenAdvantages(tokens, seq, weights, terms)


def high_entropy(batch, rewards, mask, ctx) -> TokenAdvantages:
    """E1, the high-entropy minority: A_{i,t} = A_i on the top share of the batch's tokens by sampling entropy
    (--top-entropy-quantile), 0 elsewhere. The heat maps' values: the entropy."""
    seq, H = sequence_advantages(rewards, ctx), batch["entropy"] * mask  # [N], [N, T]
    share = ctx.args.top_entropy_quantile
    tokens = entropy.token_advantages(seq, batch["entropy"], mask, share)  # [N, T] E1
    tau = entropy.entropy_threshold(batch["entropy"], mask, share)
    terms = {"E1 entropy H (nats)": H.float(),
             f"E1 tau (the batch's {1 - share:g}-quantile)": torch.full_like(H, float("nan") if tau is None else tau,
                                                                            dtype=torch.float),
             "E1 kept (H >= tau)": entropy.top_entropy_mask(batch["entropy"], mask, share).float(),
             "E1 A_i if kept, else 0": tokens}
    return TokenAdvantages(tokens, seq, H, terms)  # [N, T]


def surprisal_weighted(batch, rewards, mask, ctx) -> TokenAdvantages:
    """U1, this project's rule: a wrong rollout's A_i spread over its tokens by their sampling surprisal (its mean
    weight 1), a right rollout's A_i on every token. The heat maps' values: the weights."""
    seq = sequence_advantages(rewards, ctx)  # [N]
    w = surprisal.weights(batch["logprobs"], mask)  # [N, T] U1
    tokens = surprisal.token_advantages(seq, w, mask)  # [N, T]
    s = -batch["logprobs"].float() * mask  # [N, T] the surprisal U1 divides by its rollout's mean
    mean = s.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)  # [N, 1]
    terms = {"U1 surprisal s = -log p": s, "U1 rollout's mean s": mean.expand_as(s), "U1 weight s / mean": w,
             "U1 A_{i,t}": tokens,
             NOTE + "A_i >= 0: U1 leaves a rollout that is not wrong at A_i on every token; its weight is unused":
                 _flag((seq >= 0)[:, None].expand_as(s), mask)}
    return TokenAdvantages(tokens, seq, w, terms)


def hidden_divergence(batch, rewards, mask, ctx) -> TokenAdvantages:
    """SHEAR (Algorithm 1): S1-S4 weigh each token by the largest distance, among the windows that hold it, from its
    window's hidden states to the nearest window of the group's rollouts of the other outcome (K1's split, r_i > 0),
    over the group's mean hidden-state norm; S5 scales A_i by it. One no-grad forward of the mixed groups'
    rollouts, --micro-batch-size at a time, in float32 whatever --bf16 says (as OAR's scores)."""
    a, seq = ctx.args, sequence_advantages(rewards, ctx)  # [N]
    correct = (rewards > 0).view(-1).to(mask.device)  # [N]
    with sample.float32(ctx.model):
        w, got = shear.batch_weights(ctx.model, batch, correct, seq, mask, a.group_size, window=a.shear_window,
                                     stride=a.shear_stride, eps=a.shear_eps, iters=a.shear_iters,
                                     chunk=a.micro_batch_size)  # [N, T]
    tokens = shear.token_advantages(seq, w, mask)  # [N, T] S5
    seen = got["measured"].bool()  # [N, T]
    nan = torch.full_like(w, float("nan"))  # [N, T]
    terms = {"S2 window w (tokens)": torch.where(seen, got["window"], nan),
             "S2 windows holding the token": torch.where(seen, got["windows"], nan),
             "S3 d of its farthest window": torch.where(seen, got["distance"], nan),
             "S4 n_bar (group's mean |h|)": torch.where(seen, got["n_bar"], nan), "S4 weight": w,
             "S5 A_i * weight": tokens,
             NOTE + "not measured (a group all right or all wrong, or no state of the other outcome): weight 1":
                 _flag(~seen, mask)}
    return TokenAdvantages(tokens, seq, w, terms)


def self_distilled(batch, rewards, mask, ctx) -> TokenAdvantages:
    """RLSD: L1-L3 set each token's magnitude from the teacher (the same model shown the gold answer, its prompt the
    dataset's: data.Dataset.teacher_prompt) against the sampler's log-probs; L4 keeps the sign of A_i. One no-grad
    forward of the rollouts with A_i != 0, --micro-batch-size at a time, under --bf16's autocast as the sampler's
    log-probs were. The heat maps' values: the evidence delta (L2)."""
    a, seq = ctx.args, sequence_advantages(rewards, ctx)  # [N]
    G, ds = a.group_size, data.dataset(a.dataset)
    prompts = [ctx.tokenizer(ds.teacher_prompt(ctx.tokenizer, q, rlsd.HINT))["input_ids"] for q in ctx.problems]
    rows = (seq != 0).nonzero().flatten()  # [n] a rollout of A_i = 0 has nothing to weigh
    delta = torch.zeros_like(mask, dtype=torch.float)  # [N, T]
    # L1's frozen copy is taken (or re-taken at a sync) whether or not a row needs it: the interval's teacher is the
    # policy at the interval's start, rows or none
    with rlsd.teacher(ctx.model, ctx.state, ctx.step, a.rlsd_sync_every) as teacher_model:
        if len(rows):
            with sample.autocast(a.device, a.bf16):
                teacher = rlsd.teacher_logprobs(teacher_model, batch, [prompts[i // G] for i in range(len(seq))],
                                                rows, ctx.tokenizer.pad_token_id, a.temperature, a.micro_batch_size,
                                                G)  # [n, T] L1
            delta[rows] = rlsd.evidence(teacher, batch["logprobs"][rows].float(), mask[rows].float())  # [n, T] L2
    lam = rlsd.lambda_at(ctx.step, a.rlsd_lambda, a.rlsd_warmup_steps, a.rlsd_decay_steps)  # L5
    w = rlsd.weights(delta, seq, mask, a.rlsd_eps)  # [N, T] L3
    tokens = rlsd.token_advantages(seq, w, mask, lam)  # [N, T] L4
    taught = (seq != 0)[:, None].expand_as(delta)  # [N, T] the rows the teacher read
    raw = torch.exp(torch.sign(seq)[:, None] * delta)  # [N, T] L3 before its clip
    student = batch["logprobs"].float() * mask  # [N, T]
    nan = torch.full_like(delta, float("nan"))  # [N, T]
    terms = {"L1 teacher log p": torch.where(taught, student + delta, nan), "L1 sampler log p": student,
             "L2 evidence delta": delta, "L3 exp(sign(A_i) delta) (before the clip)": torch.where(taught, raw, nan),
             "L3 weight": w, "L5 lambda at this step": torch.full_like(delta, lam) * mask, "L4 A_{i,t}": tokens,
             SATURATED + f"L3 clips exp(sign(A_i) delta) to [{1 - a.rlsd_eps:g}, {1 + a.rlsd_eps:g}]":
                 _flag(taught & ((raw < 1 - a.rlsd_eps) | (raw > 1 + a.rlsd_eps)), mask),
             NOTE + "A_i = 0: no teacher forward, evidence 0, and no advantage to weigh": _flag(~taught, mask)}
    return TokenAdvantages(tokens, seq, delta, terms)  # [N, T]


def _alike(adv: TokenAdvantages, batch, mask, args) -> torch.Tensor:
    return torch.zeros_like(adv.tokens)  # [N, T] every token blamed alike (GRPO)


class HeatMap(NamedTuple):
    """How a rule's heat map (infra/plots.py) colours its per-token values."""
    kind: str  # which legend explains the colours (plots.LEGENDS)
    what: str  # the values, in the page's title
    centre: float  # the value left uncoloured
    scale: float  # the distance from the centre at full colour


@dataclass(frozen=True)
class Knob:
    """One flag of a rule's own. train.py's parser is built from the rules' knobs (config/training.py: a group per
    rule in --help), so an ablation knob is one line beside its rule. A knob left out takes its rule's default
    (Rule.defaults, for the data or the model), else `default`; one given to a method whose rule does not read it
    is refused, since it would be recorded and ignored."""
    flag: str  # "--ktae-alpha"
    default: object  # None: the rule's defaults() set it, or the setting is off
    help: str
    type: Callable = None  # config.shared.number, int or str; None: a switch (present = True)
    choices: tuple = None
    check: Callable = None  # value -> why it is refused (the text after "--flag value: "), or None

    @property
    def dest(self) -> str:
        return self.flag[2:].replace("-", "_")


def at_least(low):
    return lambda v: None if v >= low else f"must be at least {low}"


def above(low):
    return lambda v: None if v > low else f"must be greater than {low}"


@dataclass
class Rule:
    advantages: Callable  # (batch, rewards, mask, ctx) -> TokenAdvantages
    knobs: tuple = ()  # its flags (Knob), e.g. KTAE's --ktae-alpha; a knob shared by several rules is one Knob
    # (dataset, model) -> flag defaults of this rule, a flag given explicitly winning; dataset: the data.Dataset of
    # --dataset, model: --model's name
    defaults: Callable = lambda dataset, model: {}
    check: Callable = None  # (args) -> an error message for settings that make the rule meaningless, or None
    # The two per-token views of what the rule returned, one signature (adv: its TokenAdvantages, batch, mask, args):
    heatmap: Callable = None  # -> HeatMap: how the heat maps colour adv.values (None: the rule draws none)
    blame: Callable = _alike  # -> [N, T], higher = more to blame for a wrong answer (toyworld/credit.py scores it)
    # What a rule reads beyond ids, masks and rewards; trl_grpo.py, whose sampler keeps neither, acts on it:
    reads_scores: bool = True  # batch["logprobs"] / batch["entropy"] of the sampled tokens (TRL: an extra forward)
    # How the rule runs the policy itself, each rollout alone (OAR): "forward" (OAR-P) or "backward" (OAR-G, to the
    # embeddings); None when it does not. TRL splits that work across processes; the memory plan counts it.
    scoring: str = None
    # Whether the rule's values need the rollout's group (KTAE's K2 counts tokens over it): an answer made elsewhere,
    # with no group, is scored only by the rules that need none (tools/attribution/ --responses)
    needs_group: bool = False
    # What the rule keeps of one forward of each rollout it scores, run without a gradient --micro-batch-size rollouts
    # at a time: "hidden states" (SHEAR's, of every scored token) or "logits" (RLSD's teacher, its output layer a
    # chunk at a time); None for no such forward. The memory plan counts that forward and what it keeps
    forward_once: str = None
    # Whether the rule keeps a copy of what trains from step to step (RLSD's frozen teacher between syncs), given the
    # flags: the memory and disk plans count it
    frozen_copy: Callable = lambda args: False
    # (Context.state, steps done, args) -> what of the rule's state a checkpoint keeps, for a resumed run to go on as
    # one never stopped (train.py restores it into Context.state)
    saved: Callable = lambda state, done, args: state

    @property
    def memory_phase(self):
        """What the memory plan counts of the rule's own work: its scoring ("forward", "backward"), what its one
        forward of each rollout keeps ("hidden states", "logits"), None for nothing (infra/memory.plan_settings)."""
        return self.scoring or self.forward_once


def _ktae_check(args):
    if args.ktae_alpha == 0 and args.ktae_beta == 0:
        return ("--ktae-alpha 0 --ktae-beta 0: every key-token value (K6) would be 0, which is plain GRPO; use a "
                "method without ktae, or keep one of the two")


def _grail_check(args):
    if not args.grail_min <= 1 <= args.grail_max:
        return (f"--grail-min {args.grail_min} / --grail-max {args.grail_max}: R5 clips around 1, so "
                f"grail-min <= 1 <= grail-max")


def _shear_check(args):
    if args.shear_stride is not None and args.shear_stride > args.shear_window:
        return (f"--shear-stride {args.shear_stride}: longer than --shear-window {args.shear_window}, S2's windows "
                f"would leave tokens out")


def _rlsd_check(args):
    if not 0 < args.rlsd_eps < 1:
        return f"--rlsd-eps {args.rlsd_eps}: L3 clips exp(.) to [1 - eps, 1 + eps], so 0 < rlsd-eps < 1"
    if not 0 <= args.rlsd_lambda <= 1:
        return f"--rlsd-lambda {args.rlsd_lambda}: L4 mixes 1 and w, so 0 <= rlsd-lambda <= 1"


def _oar_defaults(probe: str):
    """O1's probe of the variant; the conclude cue is the data's own (data.Dataset.cue), the scoring chunk the
    model's (a small model takes every rollout in one forward)."""
    return lambda dataset, model: {"oar_probe": probe, "oar_cue": dataset.cue, "oar_chunk": models.oar_chunk(model)}


# Each rule's knobs (train.py's flags of that rule; --help shows them grouped by rule). The checks here are the
# ranges a value alone must lie in; Rule.check says what a combination of them makes meaningless.
KTAE_KNOBS = (
    Knob("--ktae-alpha", 1.0, "K6 weight of the Fisher strength (0: ablate)", number, check=at_least(0)),
    Knob("--ktae-beta", 1.0, "K6 weight of the information gain (0: ablate)", number, check=at_least(0)),
    Knob("--ktae-top", 1.0, "K6 largest key-token value", number, check=above(0)),
    Knob("--ktae-no-tf", False, "K5 without the BM25 frequency term (D = h)"),
)
OAR_KNOBS = (
    Knob("--oar-q", 0.25, "O5 quantile level (an independent reimplementation: 0.4)", number,
         check=lambda v: None if 0 < v < 1 else "O5's quantile level must lie strictly between 0 and 1"),
    Knob("--oar-beta", 1.0, "O5 boost (an independent reimplementation: 2.0)", number, check=at_least(0)),
    Knob("--oar-sigma", 1e-3, "O3 noise on the reasoning embeddings", number, check=above(0)),
    Knob("--oar-probe", None, "O1 outcome probe (oar-p: last; oar-g: answer_mean)", str,
         choices=("last", "answer_mean")),
    Knob("--oar-cue", None, "the conclude cue appended after the reasoning (default: the data's; the tiny world's "
                            "own '\\boxed{', OAR's sentence elsewhere: EQUATIONS.md#oar-spans)", str),
)
SCORING_CHUNK = Knob("--oar-chunk", None, "sequences per scoring forward (O2: perturbed copies; O3 and GRAIL: "
                                          "rollouts); default 64 on the tiny model, 8 for other models (a backward "
                                          "keeps every layer's activations)", int, check=at_least(1))
GRAIL_KNOBS = (
    Knob("--grail-symmetry", "wrong", "R5: the rollouts weighted by saliency: of negative advantage (the authors' "
                                      "default), positive, or both; the others keep weight 1 but on their box", str,
         choices=("wrong", "correct", "both")),
    Knob("--grail-std", 0.5, "R5: w = 1 + std z before the clip", number, check=above(0)),
    Knob("--grail-min", 0.5, "R5: the smallest weight", number, check=above(0)),
    Knob("--grail-max", 5.0, "R5: the largest weight, and the box's content's", number),
)
SHEAR_KNOBS = (
    Knob("--shear-window", 100, "S2: the longest window, in tokens (the paper's w); a group's window is "
                                "min(this, max(2, ceil(its mean response length / 4)))", int, check=at_least(1)),
    Knob("--shear-stride", None, "S2: a fixed stride (default: the group's window // 4, at least 1)", int,
         check=at_least(1)),
    Knob("--shear-eps", 0.05, "S3: Sinkhorn's entropic eps, as a fraction of each problem's mean cost", number,
         check=above(0)),
    Knob("--shear-iters", 100, "S3: Sinkhorn iterations (a fixed count; eps-scaling over the first half)", int,
         check=at_least(1)),
)
# The defaults are the released launch script's (EQUATIONS.md#rlsd); --rlsd-lambda 1 --rlsd-decay-steps 0
# --rlsd-sync-every 0 is the project's former variant, kept as an ablation
RLSD_KNOBS = (
    Knob("--rlsd-eps", 0.2, "L3: the teacher's weight is clipped to 1 +- eps", number),
    Knob("--rlsd-lambda", 0.5, "L4: A_t = A ((1 - lambda) + lambda w_t), lambda at most (L5; 0 is GRPO); the "
                               "ablation '--rlsd-lambda 1 --rlsd-decay-steps 0 --rlsd-sync-every 0' is the former "
                               "variant (lambda 1 throughout, the live policy as teacher)", number),
    Knob("--rlsd-decay-steps", 60, "L5: lambda falls linearly to 0 over this many steps, after which RLSD is GRPO "
                                   "(0: never)", int, check=at_least(0)),
    Knob("--rlsd-warmup-steps", 0, "L5: lambda rises linearly from 0 over this many steps first", int,
         check=at_least(0)),
    Knob("--rlsd-sync-every", 20, "L1: the teacher is a frozen copy of the policy, re-taken after every K-th step "
                                  "(0: the live policy, no copy)", int, check=at_least(0)),
)
ENTROPY_KNOBS = (
    Knob("--top-entropy-quantile", 0.2, "E1: the share of the batch's tokens, by sampling entropy, that the entropy "
                                        "rule trains on", number,
         check=lambda v: None if 0 < v <= 1 else "E1's share of tokens must lie in (0, 1]"),
)


# heat maps: KTAE's values around 0 (K6's range is -1..1), OAR's and GRAIL's weights around 1 (O5's boost is
# --oar-beta; R5 clips to 0.5..5), E1's entropies around the batch's threshold tau. blame: KTAE's most negative
# key-token value, OAR's and GRAIL's highest weight (a wrong rollout's advantage is negative, so its largest weight
# takes the most blame), E1's highest entropy. SHEAR's weights around 1 (GRPO's), blamed as OAR's; RLSD's evidence
# delta around 0 (L2), blamed where the teacher shown the answer finds the token least likely against the student
# (-delta: on a wrong rollout L3's weight exp(-delta) before its clip, so the clip's ties do not hide the order).
RULES = {
    "none": Rule(none, reads_scores=False),
    "ktae": Rule(key_tokens, knobs=KTAE_KNOBS, check=_ktae_check, reads_scores=False, needs_group=True,
                 heatmap=lambda adv, batch, mask, args: HeatMap("ktae", "key-token values", 0.0, 1.0),
                 blame=lambda adv, batch, mask, args: -adv.values),
    "oar-p": Rule(outcome_grounded("perturb"), knobs=OAR_KNOBS + (SCORING_CHUNK,), defaults=_oar_defaults("last"),
                  reads_scores=False, scoring="forward",
                  heatmap=lambda adv, batch, mask, args: HeatMap("oar", "OAR weights", 1.0, args.oar_beta),
                  blame=lambda adv, batch, mask, args: adv.values),
    "oar-g": Rule(outcome_grounded("gradient"), knobs=OAR_KNOBS + (SCORING_CHUNK,),
                  defaults=_oar_defaults("answer_mean"), reads_scores=False, scoring="backward",
                  heatmap=lambda adv, batch, mask, args: HeatMap("oar", "OAR weights", 1.0, args.oar_beta),
                  blame=lambda adv, batch, mask, args: adv.values),
    "grail": Rule(gradient_saliency, knobs=GRAIL_KNOBS + (SCORING_CHUNK,),
                  defaults=lambda dataset, model: {"oar_chunk": models.oar_chunk(model)},
                  check=_grail_check, reads_scores=False, scoring="backward",
                  heatmap=lambda adv, batch, mask, args: HeatMap("grail", "GRAIL weights", 1.0, 1.0),
                  blame=lambda adv, batch, mask, args: adv.values),
    "shear": Rule(hidden_divergence, knobs=SHEAR_KNOBS, check=_shear_check, reads_scores=False, needs_group=True,
                  forward_once="hidden states",
                  heatmap=lambda adv, batch, mask, args: HeatMap("shear", "SHEAR weights", 1.0, 1.0),
                  blame=lambda adv, batch, mask, args: adv.values),
    "rlsd": Rule(self_distilled, knobs=RLSD_KNOBS, check=_rlsd_check, forward_once="logits",
                 frozen_copy=lambda args: getattr(args, "rlsd_sync_every", 0) > 0,  # a run.json before it: live
                 saved=lambda state, done, args: rlsd.state_to_save(state, done, args.rlsd_sync_every),
                 heatmap=lambda adv, batch, mask, args: HeatMap("rlsd", "teacher evidence (log pi_T - log pi_old)",
                                                                0.0, 1.0),
                 blame=lambda adv, batch, mask, args: -adv.values),
    "entropy": Rule(high_entropy, knobs=ENTROPY_KNOBS, blame=lambda adv, batch, mask, args: adv.values,
                    heatmap=lambda adv, batch, mask, args: HeatMap("entropy", "sampling entropy",
                                                                   entropy.entropy_threshold(
                                                                       batch["entropy"], mask,
                                                                       args.top_entropy_quantile), 1.0)),
    # U1's blame is the surprisal itself, the attribution tables' baseline: the rule trains with that blame
    "surprisal": Rule(surprisal_weighted, blame=lambda adv, batch, mask, args: -batch["logprobs"] * mask,
                      heatmap=lambda adv, batch, mask, args: HeatMap("surprisal", "surprisal weights", 1.0, 1.0)),
}

# ---- loss terms: what a method adds to the surrogate's loss, one value per token (SDPG's self-distillation) -------
class Piece(NamedTuple):
    """One micro-batch of the update as a loss term reads it (train.update): rows [n] of the batch, each cut at t
    tokens; the policy's last hidden states before its output layer [n, t, H] (with their gradient: the states that
    predict each response token), its log-probs of the sampled tokens [n, t] (with gradient), the sampler's and the
    reference's (None unless LossTerm.reference) [n, t], the advantages and the loss mask [n, t]."""
    model: torch.nn.Module
    rows: torch.Tensor
    t: int
    hidden: torch.Tensor
    logp: torch.Tensor
    old_logp: torch.Tensor
    ref_logp: Optional[torch.Tensor]
    adv: torch.Tensor
    mask: torch.Tensor
    batch: dict


@dataclass
class LossTerm:
    """A loss a method adds to the surrogate's (G3), per token and aggregated as it is (G5): the one extension point
    for KL-type terms (SDPG's P2-P3; a reference KL, an entropy bonus). --method BASE+RULE+TERM runs it."""
    # (piece: Piece, prepared, args, step) -> (loss [n, t] per token, {name: float} logged (each a token mean));
    # step counts from 1 at the first update; prepared: what prepare returned for this step
    per_token: Callable
    prepare: Callable = lambda batch, ctx: None  # once a step, before the update: what per_token reads each time
    knobs: tuple = ()
    flags: dict = field(default_factory=dict)  # surrogate flag defaults over the base's (a flag given wins)
    base: str = "grpo"  # the base of the term's short name (--method sdpg)
    reference: Callable = lambda args: False  # (args) -> whether per_token reads log pi_ref (a reference is loaded)
    check: Callable = None  # (args) -> why the settings are refused, or None
    memory: str = None  # what the memory plan counts of it: "full-vocabulary KL" (a teacher forward, KL chunks)


def _sdpg_prepare(batch, ctx):
    """P2's teacher prompts, one per rollout (the dataset's teacher_prompt in SDPG's wording), token ids."""
    G, ds = ctx.args.group_size, data.dataset(ctx.args.dataset)
    prompts = [ctx.tokenizer(ds.teacher_prompt(ctx.tokenizer, q, sdpg.HINT))["input_ids"] for q in ctx.problems]
    return {"prompts": [prompts[i // G] for i in range(len(batch["input_ids"]))], "pad_id": ctx.tokenizer.pad_token_id}


def _sdpg_per_token(piece: Piece, prepared: dict, args, step: int):
    """P2-P4 on one micro-batch: the teacher's hidden states (the same model reading the privileged prompt, no
    gradient), the full-vocabulary KL chunk by chunk, the regulariser against the reference, beta's schedule."""
    P, resp = piece.batch["prompt_len"], piece.rows.tolist()
    ids = piece.batch["input_ids"][piece.rows, P:P + piece.t]  # [n, t]
    attn = piece.batch["attention_mask"][piece.rows, P:P + piece.t]  # [n, t]
    teacher = sdpg.teacher_hidden(piece.model, [prepared["prompts"][i] for i in resp], ids, attn,
                                  prepared["pad_id"])  # [n, t, H]
    head = piece.model.get_output_embeddings()
    chunk = args.sdpg_chunk or memory.logit_chunk_tokens(head.weight.shape[0])  # the output layer's own chunk
    kl = sdpg.chunked_token_kl(head, piece.hidden, teacher, args.temperature, chunk)  # [n, t] P2
    reg = (sdpg.regulariser(piece.logp.float(), piece.ref_logp.float(), args.sdpg_alpha, args.sdpg_mode)
           if args.sdpg_alpha > 0 else torch.zeros_like(kl))  # [n, t] P3
    beta = sdpg.beta_at(step, args.sdpg_beta, args.sdpg_beta_warmup, args.sdpg_beta_decay, args.steps)
    values = sdpg.per_token(kl, reg, piece.adv, beta, args.sdpg_positive_only)  # [n, t] P4
    m = piece.mask.float()  # [n, t]
    n = m.sum().clamp(min=1)
    return values, {"sdpg_kl": float((kl.detach() * m).sum() / n),
                    "sdpg_regulariser": float((reg.detach() * m).sum() / n), "sdpg_beta": beta}


SDPG_KNOBS = (
    Knob("--sdpg-beta", 1e-3, "P2: the weight of the full-vocabulary KL to the teacher (the released scripts' 1e-3; "
                              "its code's default 1e-4)", number, check=at_least(0)),
    Knob("--sdpg-alpha", 1e-3, "P3: the weight of the regulariser against the reference (0: no reference loaded)",
         number, check=at_least(0)),
    Knob("--sdpg-mode", "urkl", "P3: the regulariser of r = log pi - log pi_ref: urkl (alpha/2) r^2, rkl "
                                "(alpha/2)(r+1)^2, fkl alpha e^-r, ufkl alpha (e^-r + r)", str, choices=sdpg.MODES),
    Knob("--sdpg-beta-warmup", 0, "P4: steps over which beta rises linearly from 0 (0: none)", int, check=at_least(0)),
    Knob("--sdpg-beta-decay", 0, "P4: the last steps over which beta falls linearly to 0 (0: none)", int,
         check=at_least(0)),
    Knob("--sdpg-positive-only", False, "P4: distil only where the advantage is positive"),
    Knob("--sdpg-chunk", None, "P2: tokens a KL chunk (default: the output layer's chunk, sample.token_logprobs)",
         int, check=at_least(1)),
)

# SDPG's released recipe is DAPO's (clip-higher, token-mean, dynamic sampling, the overlong buffer) with a dual clip
# of 10 (verl's clip_ratio_c): `--method sdpg` is dapo+sdpg; grpo+sdpg puts the same terms on GRPO's surrogate
TERMS = {
    "sdpg": LossTerm(_sdpg_per_token, prepare=_sdpg_prepare, knobs=SDPG_KNOBS, flags={"dual_clip": 10.0},
                     base="dapo", reference=lambda args: args.sdpg_alpha > 0, memory="full-vocabulary KL"),
}


def term_step(args, batch, ctx):
    """The loss term of --method for this step, ready for train.update: (LossTerm, what its prepare returned), or
    None when the method adds none."""
    if not getattr(args, "term", None):
        return None
    term = TERMS[args.term]
    return term, term.prepare(batch, ctx)


def parse(method: str):
    """--method as (base, token rule, loss term): 'ktae' -> ('grpo', 'ktae', None); 'dapo' -> ('dapo', 'none', None);
    'dapo+oar-g' -> ('dapo', 'oar-g', None); 'sdpg' -> ('dapo', 'none', 'sdpg') (a term's own base when none is
    named); 'grpo+ktae+sdpg' -> ('grpo', 'ktae', 'sdpg'). At most one of each, in that order."""
    parts = method.split("+")
    base = parts.pop(0) if parts[0] in BASES else None
    rule = term = None
    for part in parts:
        if part in RULES and rule is None and term is None:
            rule = part
        elif part in TERMS and term is None:
            term = part
        else:
            raise ValueError(f"--method {method}: choose from {', '.join(names())} (BASE+RULE+TERM, each optional)")
    return base or (TERMS[term].base if term else "grpo"), rule or "none", term


def short_names() -> list:
    """The bases, then each token rule on grpo, then each loss term on its own base: ['grpo', 'dapo', 'ktae',
    'oar-p', 'oar-g', 'grail', 'entropy', 'shear', 'rlsd', 'surprisal', 'sdpg']."""
    return list(BASES) + [r for r in RULES if r != "none"] + list(TERMS)


def names() -> list:
    """Every --method listed in --help: the short names first, then each BASE+RULE and BASE+TERM (a rule and a term
    together, BASE+RULE+TERM, are accepted but not listed)."""
    return short_names() + [f"{b}+{r}" for b in BASES for r in list(RULES) + list(TERMS) if r != "none"]


def knobs() -> dict:
    """Every rule's and loss term's knobs, in the tables' order: {dest: (Knob, [names of those that read it])}."""
    out = {}
    for name, owner in list(RULES.items()) + list(TERMS.items()):
        for k in owner.knobs:
            out.setdefault(k.dest, (k, []))[1].append(name)
    return out


def add_knobs(p):
    """The rules' knobs as flags of p, a group per set of rules (so --help lists them by rule), each defaulting to
    None: resolve_knobs can then tell a knob given from one left out."""
    groups = {}
    for k, owners in knobs().values():
        kind = "loss term" if all(o in TERMS for o in owners) else "rule"
        title = f"{kind}{'s' * (len(owners) > 1)} {', '.join(owners)}"
        if title not in groups:
            groups[title] = p.add_argument_group(title)
        shown = f"{k.help} (default: {k.default})" if k.default is not None and k.default is not False else k.help
        if k.type is None:
            groups[title].add_argument(k.flag, action="store_true", default=None, help=shown)
        else:
            groups[title].add_argument(k.flag, type=k.type, choices=k.choices, default=None, help=shown,
                                       metavar=None if k.choices else k.dest.upper().split("_")[-1])


def resolve_knobs(args, dataset) -> str:
    """Fill in args' knobs: a knob given wins, then the rule's defaults (for the data and the model), then the
    knob's own default. Returns why the knobs are refused (a knob of another rule given, or a value out of its
    range), else None."""
    rule, term = RULES[args.rule], TERMS.get(getattr(args, "term", None))
    mine = rule.knobs + (term.knobs if term else ())
    own = {k.dest for k in mine}
    for dest, (k, owners) in knobs().items():
        value = getattr(args, dest, None)
        if dest not in own and value is not None:
            return (f"{k.flag}{'' if value is True else f' {value}'}: a flag of {', '.join(owners)}, which --method "
                    f"{args.method} does not use (it would be recorded and ignored)")
    defaults = rule.defaults(dataset, args.model)
    for dest, (k, _) in knobs().items():
        if getattr(args, dest, None) is None:
            setattr(args, dest, defaults.get(dest, k.default))
    for k in mine:
        why = k.check(getattr(args, k.dest)) if k.check and getattr(args, k.dest) is not None else None
        if why:
            return f"{k.flag} {getattr(args, k.dest)}: {why}"
    return (rule.check(args) if rule.check else None) or (term.check(args) if term and term.check else None)


def owned_elsewhere(rule: str, term: str = None) -> set:
    """The knobs (dests) that a run of rule (and loss term) does not read: a run.json repeated as a recipe leaves
    them out."""
    return {dest for dest, (_, owners) in knobs().items() if rule not in owners and term not in owners}


# ---- a reader's own rules: --rules-file FILE (train.py, tools.compare, tools.attribution, scaling.trl_train) -------
_LOADED = {}  # the rule files loaded, by absolute path: {path: the rule names each added}


def load_rules(spec: str, flag: str = "--rules-file") -> list:
    """Import a reader's rule file (a .py path) or module (a dotted name) that adds entries to RULES, as the README's
    "Adding a token rule" shows; returns the names it added. Refused in one line (ValueError) where it cannot be
    read or imported, adds no rule, or replaces a rule of the table (a variant of one gets a name of its own)."""
    import importlib
    import importlib.util
    import os
    path = os.path.abspath(spec) if spec.endswith(".py") or os.path.isfile(spec) or os.sep in spec else None
    if (path or spec) in _LOADED:
        return _LOADED[path or spec]
    before, knobs_before, equations = dict(RULES), knobs(), _equation_functions()
    try:
        if path:
            if not os.path.isfile(path):
                raise ValueError(f"{flag} {spec}: no such file")
            name = "rules_" + os.path.splitext(os.path.basename(path))[0]
            loader = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            importlib.import_module(spec)
    except ValueError:
        raise
    except Exception as e:  # a reader's file: any error it raises is its own, said in one line with its place
        where = e.__traceback__
        while where.tb_next:
            where = where.tb_next
        RULES.clear()
        RULES.update(before)
        raise ValueError(f"{flag} {spec}: does not import ({type(e).__name__}: {e}, line {where.tb_lineno} of "
                         f"{os.path.basename(where.tb_frame.f_code.co_filename)})") from None
    replaced = [n for n in before if RULES.get(n) is not before[n]]
    added = [n for n in RULES if n not in before]
    if replaced:
        RULES.clear()
        RULES.update(before)
        raise ValueError(f"{flag} {spec}: replaces the rule {', '.join(replaced)} of methods.RULES; give its "
                         f"variant a name of its own (e.g. {replaced[0]}-mine)")
    clash = [n for n in added if n in BASES or "+" in n or "[" in n or "," in n]
    if clash:
        for n in added:
            del RULES[n]
        raise ValueError(f"{flag} {spec}: the rule name {clash[0]!r} is a base's or holds '+', '[' or ','")
    if not added:
        raise ValueError(f"{flag} {spec}: adds no rule (it should end with methods.RULES[\"name\"] = "
                         f"methods.Rule(function), README.md \"Adding a token rule\")")
    patched = [name for name, f in _equation_functions().items() if name in equations and equations[name] is not f]
    taken = [k.flag for n in added for k in RULES[n].knobs if k.dest in knobs_before and k is not knobs_before[
        k.dest][0]]
    if patched or taken:
        for n in added:
            del RULES[n]
        for name in patched:  # put the table's equations back: the process may go on (a test, a caller)
            if name in equations:
                module, attr = name.split(".", 1)
                setattr(__import__("sys").modules[module], attr, equations[name])
        if patched:  # every rule of the process would run it, the original of a comparison too
            raise ValueError(f"{flag} {spec}: replaces {patched[0]} for every rule, the table's too; keep the original "
                             f"and run yours beside it with methods.with_equation (README.md, \"A quick ablation\")")
        owners = ", ".join(knobs_before[taken[0][2:].replace("-", "_")][1])
        raise ValueError(f"{flag} {spec}: its knob {taken[0]} is a flag of {owners} already; give yours another "
                         f"name, or reuse that rule's Knob itself")
    _LOADED[path or spec] = added
    return added


def rules_digest(spec: str) -> str:
    """The SHA-256 of a rules file's content (a module's file as Python finds it): what a run records of it."""
    import hashlib
    import importlib.util
    import os
    path = spec if spec.endswith(".py") or os.path.isfile(spec) or os.sep in spec else (
        getattr(importlib.util.find_spec(spec), "origin", None) or spec)
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _equation_functions() -> dict:
    """{"ktae.direction": function, ...}: the functions of the modules the rules compute with (a rule file that
    replaced one would change the table's rules too)."""
    import sys
    names = ("grpo", "dapo", "ktae", "oar", "grail", "entropy", "shear", "rlsd", "surprisal", "sdpg", "sample",
             "methods")
    return {f"{m}.{k}": v for m in names if m in sys.modules for k, v in vars(sys.modules[m]).items()
            if callable(v) and not k.startswith("__")}


def rules_file_of(argv: list):
    """The --rules-file value in a command line, or None: the file is loaded before the parser is built, since its
    rules are --method choices and its knobs flags."""
    for i, word in enumerate(argv):
        if word == "--rules-file" and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith("--rules-file="):
            return word.split("=", 1)[1]
    return None


def with_equation(rule: str, module, name: str, replacement) -> Rule:
    """The table's `rule` with one function of an equation module (say ktae.direction, K5) replaced while its
    advantages are computed: a reader's one-line ablation, run beside the original under a name of its own
    (README.md, "A quick ablation"). Everything else of the rule (knobs, checks, heat map, blame) stays its own."""
    import dataclasses
    original_rule = RULES[rule]

    def advantages(batch, rewards, mask, ctx):
        original = getattr(module, name)
        setattr(module, name, replacement)
        try:
            return original_rule.advantages(batch, rewards, mask, ctx)
        finally:
            setattr(module, name, original)
    return dataclasses.replace(original_rule, advantages=advantages)
