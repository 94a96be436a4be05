"""What `--method` means: a base (grpo, dapo) and a token rule (none, ktae, oar-p, oar-g, entropy), each from one
table.

    --method grpo        = grpo + none       (G1 broadcast to every token)
    --method dapo        = dapo + none       (DAPO's preset flags, D1-D4)
    --method ktae        = grpo + ktae       (K7 on top of G1)
    --method dapo+ktae   = dapo + ktae
    --method oar-p       = grpo + oar-p      (O6 with O2's perturbation scores)
    --method oar-g       = grpo + oar-g      (O6 with O3's gradient scores)
    --method entropy     = grpo + entropy    (E1: only the top 20 % of the batch's tokens by entropy learn)
    and any other BASE+RULE, e.g. dapo+oar-g.

A base is a set of flag defaults (any flag given on the command line wins). A token rule is one function with
one signature, as verl registers its advantage estimators by name:

    rule(batch, rewards, mask, ctx) -> TokenAdvantages(tokens [N, T], seq [N], values [N, T] or None)

batch: what sample.generate() returned for the step's N = B * G rollouts (groups consecutive); rewards [B, G];
mask [N, T] the tokens that enter the loss (D4's overlong filter applied); ctx: the Context below. `tokens` is
A_{i,t}, what the loss (G3) uses; `seq` is the rollout advantage A_i it was built from (logged by O7); `values`
the per-token quantity the heat maps colour (KTAE's key-token values, OAR's weights), None for plain GRPO.

A new rule is one function and one entry in RULES; `--method grpo+NAME` and `--method dapo+NAME` then exist.
For example, a rule that gives the EOS token no credit:

    def no_eos(batch, rewards, mask, ctx):
        seq = grpo.group_advantages(rewards, scale_std=not ctx.args.no_std_scale).view(-1)  # [N] G1
        tokens = seq[:, None] * mask * (batch["input_ids"][:, batch["prompt_len"]:] != ctx.tokenizer.eos_token_id)
        return TokenAdvantages(tokens, seq, None)

    RULES["no-eos"] = Rule(no_eos)

A rule's `blame` says which tokens it holds most responsible for a wrong answer (credit.py measures it against
the first error the synthetic tasks know); without one, every token is blamed alike, as in GRPO.
"""
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Optional

import torch

import grpo
import ktae
import oar

# What each base sets, where its flag was not given (dapo.py D1-D4; GRPO's values are the papers' and verl's)
BASES = {
    "grpo": {"eps_high": None, "agg": "seq-mean-token-mean", "dynamic_sampling": False, "keep_surplus": False,
             "overlong_buffer": 0, "signed_reward": False},
    # dapo: clip-higher 0.28 (D1), dynamic sampling with DAPO's buffer (D2), token-mean loss (D3), the soft overlong
    # penalty over the last sixth of the length limit (D4, as KTAE's 512 of 3072), rewards +-1, no KL
    "dapo": {"eps_high": 0.28, "agg": "token-mean", "dynamic_sampling": True, "keep_surplus": True,
             "overlong_buffer": "1/6", "signed_reward": True},
}


class TokenAdvantages(NamedTuple):
    tokens: torch.Tensor  # [N, T] A_{i,t}, 0 outside the mask
    seq: torch.Tensor  # [N] A_i, the rollout's advantage (G1 of its rewards)
    values: Optional[torch.Tensor]  # [N, T] what the heat map colours, or None


@dataclass
class Context:
    """What a rule may need beyond the batch: the flags, the policy (OAR scores with it), its tokenizer, the step's
    problems (OAR's probe uses the gold answer) and a cache of decoded tokens."""
    args: object
    model: torch.nn.Module
    tokenizer: object
    problems: list  # the B problems of the batch, in group order
    pieces: dict = field(default_factory=dict)  # token id -> its decoded text (OAR's spans)


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
    values, _ = ktae.token_values(resp, mask, rewards, special_ids=special, alpha=a.ktae_alpha, beta=a.ktae_beta,
                                  top=a.ktae_top, use_tf=not a.ktae_no_tf)  # [N, T] K1-K6
    return TokenAdvantages(ktae.token_advantages(seq, values, mask), seq, values)  # [N, T]


def outcome_grounded(scorer: str):
    """OAR: O1-O5 weigh each reasoning token by how much it moves the answer distribution; O6 scales A_i by it.
    scorer: "perturb" (OAR-P, O2) or "gradient" (OAR-G, O3)."""
    def rule(batch, rewards, mask, ctx) -> TokenAdvantages:
        a, seq = ctx.args, sequence_advantages(rewards, ctx)  # [N]
        enc = lambda s: ctx.tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
        answers = [enc(q["answer"] + "}") for q in ctx.problems for _ in range(a.group_size)]  # O1's teacher forcing
        with torch.autocast(a.device.split(":")[0], dtype=torch.bfloat16, enabled=a.bf16):
            weights = oar.batch_weights(ctx.model, batch, answers, enc(a.oar_cue), seq, ctx.tokenizer, ctx.pieces,
                                        scorer=scorer, probe=a.oar_probe, q=a.oar_q, beta=a.oar_beta,
                                        sigma=a.oar_sigma, chunk=a.oar_chunk)  # [N, T]
        return TokenAdvantages(oar.token_advantages(seq, weights, mask), seq, weights)  # [N, T]
    return rule


def entropy_threshold(entropy: torch.Tensor, mask: torch.Tensor, share: float) -> float:
    """E1's tau: the (1 - share)-quantile (linear interpolation, as torch.quantile) of the batch's scored tokens'
    entropies; entropy, mask [N, T]. Entropies [0.1, 0.2, 0.3, 0.4, 0.5], share 0.2: 0.4 + 0.2 * 0.1 = 0.42.
    None when no token is scored."""
    scored = entropy[mask.bool()].float()  # [n] every scored token of the batch
    return torch.quantile(scored, 1 - share).item() if scored.numel() else None


def top_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, share: float) -> torch.Tensor:
    """E1: the scored tokens whose sampling entropy is at least tau (above), i.e. the top `share` of the batch's
    tokens by entropy [N, T]. Entropies [0.1, 0.2, 0.3, 0.4, 0.5], share 0.2: tau = 0.42 -> only 0.5 is kept."""
    tau = entropy_threshold(entropy, mask, share)
    if tau is None:
        return torch.zeros_like(mask, dtype=torch.bool)
    return (entropy >= tau) & mask.bool()  # [N, T]


def high_entropy(batch, rewards, mask, ctx) -> TokenAdvantages:
    """The high-entropy minority (Wang et al., 2025, arXiv 2506.01939): A_{i,t} = A_i on the top share of the
    batch's tokens by sampling entropy (E1, --top-entropy-quantile), 0 elsewhere. The heat maps' values: the
    entropy."""
    seq = sequence_advantages(rewards, ctx)  # [N]
    keep = top_entropy_mask(batch["entropy"], mask, ctx.args.top_entropy_quantile)  # [N, T] E1
    return TokenAdvantages(seq[:, None] * mask * keep, seq, batch["entropy"] * mask)  # [N, T]


def _alike(adv: TokenAdvantages, batch) -> torch.Tensor:
    return torch.zeros_like(adv.tokens)  # [N, T] every token blamed alike (GRPO)


@dataclass
class Rule:
    advantages: Callable  # (batch, rewards, mask, ctx) -> TokenAdvantages
    defaults: dict = field(default_factory=dict)  # flag defaults of this rule (a flag given explicitly wins)
    check: Callable = None  # (args) -> an error message for settings that make the rule meaningless, or None
    heatmap: str = None  # the kind of token heat map to write (plots.token_heatmap), or None
    blame: Callable = _alike  # (TokenAdvantages, batch) -> [N, T], higher = more to blame for a wrong answer
    # What a rule reads beyond ids, masks and rewards; trl_grpo.py, whose sampler keeps neither, acts on it:
    reads_scores: bool = True  # batch["logprobs"] / batch["entropy"] of the sampled tokens (TRL: an extra forward)
    per_rollout: bool = False  # each rollout scored alone with the policy (OAR): TRL splits it across processes


def _ktae_check(args):
    if args.ktae_alpha == 0 and args.ktae_beta == 0:
        return ("--ktae-alpha 0 --ktae-beta 0: every key-token value (K6) would be 0, which is plain GRPO; use a "
                "method without ktae, or keep one of the two")


# blame: KTAE's most negative key-token value, OAR's highest weight (a wrong rollout's advantage is negative, so
# its largest weight takes the most blame), the entropy rule's highest entropy
RULES = {
    "none": Rule(none, reads_scores=False),
    "ktae": Rule(key_tokens, check=_ktae_check, heatmap="ktae", blame=lambda adv, batch: -adv.values,
                 reads_scores=False),
    "oar-p": Rule(outcome_grounded("perturb"), defaults={"oar_probe": "last"}, heatmap="oar",
                  blame=lambda adv, batch: adv.values, reads_scores=False, per_rollout=True),
    "oar-g": Rule(outcome_grounded("gradient"), defaults={"oar_probe": "answer_mean"}, heatmap="oar",
                  blame=lambda adv, batch: adv.values, reads_scores=False, per_rollout=True),
    "entropy": Rule(high_entropy, heatmap="entropy", blame=lambda adv, batch: adv.values),
}


def parse(method: str):
    """'ktae' -> ('grpo', 'ktae'); 'dapo' -> ('dapo', 'none'); 'dapo+oar-g' -> ('dapo', 'oar-g')."""
    base, _, rule = method.partition("+") if "+" in method else (
        (method, "", "none") if method in BASES else ("grpo", "", method))
    if base not in BASES or rule not in RULES:
        raise ValueError(f"--method {method}: choose from {', '.join(names())}")
    return base, rule


def names() -> list:
    """Every --method: the short names first (the bases, then each rule on grpo), then each BASE+RULE."""
    short = list(BASES) + [r for r in RULES if r != "none"]
    return short + [f"{b}+{r}" for b in BASES for r in RULES if r != "none"]
