"""Every token rule of methods.py inside TRL's GRPOTrainer (TRL 1.16), on one process or many.

TRL samples, rewards and trains; this module only replaces the advantages it hands to its loss. TRL's own G1
gives one value per rollout, advantages [n]; its loss (_compute_loss) also takes advantages [n, T], one per token,
and that is what RuleGRPOTrainer returns: A_{i,t} from methods.RULES[rule].advantages(batch, rewards, mask, ctx),
the same function train.py calls, so no equation is written twice and a rule added to the table works here as it is.
The rule's G1 (grpo.group_advantages) replaces TRL's even for --method grpo: one G1 in both programs.

Where the rule is computed [why: a group's G rollouts may lie on two processes, and K2's statistics need all of
them]: right after generation, on the whole generation batch. Each process gathers the prompt and completion ids,
the masks and the rewards of every process (TRL's RepeatSampler puts a group's rollouts next to each other in
process order, so the gathered rows hold the groups consecutively, as sample.generate() does), computes the rule on
all of it, and keeps its own rows. Every process computes the same thing, so nothing else needs sending.

OAR (O1-O5) scores each rollout with the live policy, and a rollout's weights depend on itself alone (O6 multiplies
them by its group's A_i). It is computed at the same place, after generation, on the groups that hold this
process's rows only, not on the whole batch: the scoring forwards are split across the processes. After
generation and not per micro-batch in _compute_loss [why: with num_iterations > 1 TRL updates the policy several
times on one generation batch; the advantage must stay what it was when the rollouts were sampled (pi_old), as
in PPO and in train.py with --mu > 1. Per micro-batch it would be rescored with a policy already moved by the
earlier iterations, and the objective would change under the optimizer.]

Rules that read the sampler's log-probs or entropies (batch["logprobs"], batch["entropy"]) get them from one
no-grad forward of TRL's scorer after generation (TRL's generate does not keep them); the built-in rules, which
read only ids, masks and rewards, skip it (methods.Rule.reads_scores False).

DAPO inside TRL takes TRL's options: D1 epsilon_high, D3 loss_type "dapo" (token-mean over the generation batch),
D4 the reward functions below (+-1 and the soft overlong penalty) and mask_truncated_completions (the overlong
filter). D2's dynamic sampling is not in TRL 1.16 and is not built here: every group is trained on, as
train.py's --no-dynamic-sampling does. trl_train.py says so when the method asks for it.
"""
import os
import shlex

import torch
from accelerate.utils import gather_object
from transformers.trainer_utils import get_last_checkpoint
from trl import GRPOTrainer

import dapo
import methods
import oar
import reward
from config import training
from infra import checkpoint, files

RULE_STATE = "rule_state.pt"  # in a TRL checkpoint folder: what the rule keeps across steps (RLSD's frozen teacher)
# G5's aggregations and TRL's loss_type that computes each (TRL divides by its own counts: "grpo" by each
# micro-batch's rollouts, "dapo" by the generation batch's tokens, "dr_grpo" by rollouts x max_completion_length)
LOSS_TYPE = {"seq-mean-token-mean": "grpo", "token-mean": "dapo", "seq-mean-token-sum-norm": "dr_grpo"}


def rule_args(method: str, *, group_size: int, max_new_tokens: int, device: str, bf16: bool = False,
              scale_rewards: str = "group", flags: str = "", model: str = None, dataset: str = None):
    """train.py's settings for --method (config/training.py: the base's and rule's presets, every check), with the
    values TRL's GRPOConfig decides given as they are. flags: more train.py flags for the rule, as text, e.g.
    "--ktae-top 2"; model, dataset: the run's (None: train.py's defaults), whose records set some of the rule's
    defaults (OAR's cue and chunk). A refusal is one line (SystemExit)."""
    if scale_rewards not in ("group", "none"):
        raise SystemExit(f"--scale_rewards {scale_rewards}: G1 scales by the group's std (group) or not (none); "
                         f"TRL's batch scaling is not one of this project's rules")
    given = dict(method=method, group_size=group_size, max_new_tokens=max_new_tokens, device=device,
                 no_std_scale=scale_rewards == "none")
    given.update({k: v for k, v in dict(model=model, dataset=dataset, bf16=bf16 or None).items() if v is not None})
    args = training.parse_args_one_line(shlex.split(flags), **given)
    if args.term:  # TRL computes its own loss from per-token log-probs: no place for a full-vocabulary term
        raise SystemExit(f"--method {method}: its loss term ({args.term}, methods.TERMS) runs in train.py only; "
                         f"TRL's GRPOTrainer computes its loss itself")
    return args


def grpo_config_options(args) -> dict:
    """GRPOConfig fields that carry the base's presets (methods.BASES): D1's clip-higher and G5's aggregation."""
    return {"epsilon_high": args.eps_high, "loss_type": LOSS_TYPE[args.agg]}


def reward_functions(args) -> list:
    """TRL reward functions for the base: correctness 1 / 0 (DAPO: +1 / -1, signed_reward) and, where
    overlong_buffer > 0, D4's soft overlong penalty as a second function. TRL sums them (weights 1): the reward
    train.py's rewards_and_mask computes. The dataset's "answer" column reaches them as a keyword."""
    grade = reward.GRADERS[args.grader]  # train.py's --grader (tools/perf/bench.py's length-parity stand-in)

    def correctness(completions, answer, **_):
        ok = torch.tensor([grade(c, a) is True for c, a in zip(completions, answer)])  # [n]
        return (dapo.signed_reward(ok) if args.signed_reward else ok.float()).tolist()

    def overlong(completion_ids, **_):
        lengths = torch.tensor([len(c) for c in completion_ids])  # [n] tokens, EOS included (as response_mask)
        return dapo.overlong_penalty(lengths, args.max_new_tokens, args.overlong_buffer).tolist()

    return [correctness] + ([overlong] if args.overlong_buffer else [])


def first_tokens(lengths, T: int):
    """The mask [N, T] of each row's first lengths[i] tokens: [2, 1], T 3 -> [[1, 1, 0], [1, 0, 0]]."""
    return (torch.arange(T, device=lengths.device)[None, :] < lengths[:, None]).long()  # [N, T]


def our_batch(prompt_ids, prompt_mask, completion_ids, lengths, end_ids) -> dict:
    """TRL's tensors in sample.generate()'s layout (see sample.py): prompt_ids, prompt_mask [N, P] left-padded;
    completion_ids [N, T] right-padded; lengths [N] tokens of each completion, EOS included; end_ids: the ids that
    end a completion (EOS, pad), to find the truncated ones as TRL does."""
    response_mask = first_tokens(lengths, completion_ids.shape[1])  # [N, T]
    last = completion_ids.gather(1, (lengths - 1).clamp(min=0)[:, None]).squeeze(1)  # [N]
    return {
        "input_ids": torch.cat([prompt_ids, completion_ids], dim=1),  # [N, P + T]
        "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),  # [N, P + T]
        "response_mask": response_mask,  # [N, T]
        "truncated": ~torch.isin(last, torch.tensor(end_ids, device=last.device)),  # [N]
        "prompt_len": prompt_ids.shape[1],
    }


def rule_advantages(rule: str, batch: dict, rewards, mask, ctx, rows: slice) -> methods.TokenAdvantages:
    """The rule on the gathered batch (groups of G consecutive rows; rewards [B, G], mask [N, T]), for `rows`.
    A rule that scores each rollout alone with the policy (methods.Rule.scoring, OAR) runs on the groups that hold
    those rows only; any other on the whole batch."""
    G = rewards.shape[1]
    if not methods.RULES[rule].scoring:
        adv = methods.RULES[rule].advantages(batch, rewards, mask, ctx)
        return adv.rows(rows)
    g0, g1 = rows.start // G, -(-rows.stop // G)  # the groups that hold rows start .. stop - 1
    keep = torch.arange(g0 * G, g1 * G, device=mask.device)  # [n_g * G]
    sub = {k: v if k == "prompt_len" else v[keep] for k, v in batch.items()}
    part = methods.Context(ctx.args, ctx.model, ctx.tokenizer, ctx.problems[g0:g1], ctx.pieces, ctx.step, ctx.state)
    adv = methods.RULES[rule].advantages(sub, rewards[g0:g1], mask[keep], part)
    inner = slice(rows.start - g0 * G, rows.stop - g0 * G)
    return adv.rows(inner)


class RuleGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose advantages [n, T] come from methods.RULES[args.rule] (module docstring: where and why).

    args: rule_args(...)'s namespace (the rule's flags). Everything else is GRPOTrainer's. The rows of the
    dataset must carry "answer" (the gold answer: OAR's probe and the correctness reward read it)."""

    def __init__(self, *a, args=None, rule_args=None, **kw):
        super().__init__(*a, args=args, **kw)
        self.rule_args = rule_args
        self.rule_args.group_size = self.num_generations  # G, as TRL groups the rollouts
        self.rule_args.device = str(self.accelerator.device)
        self.pieces = {}  # token id -> its decoded text, for OAR's spans (kept across steps)
        # what the rule keeps across steps (methods.Context.state: RLSD's frozen teacher), on each process; saved
        # beside TRL's checkpoint (RULE_STATE) where the rule keeps it (methods.Rule.saved), read back on resume
        self.rule_state = {}
        self._lengths = None
        self._rewards_per_func = None
        self.last = None  # the last step's gathered batch, rewards and local advantages (tests, heat maps)

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        keep = methods.RULES[self.rule_args.rule].saved(self.rule_state, self.state.global_step, self.rule_args)
        if keep and self.accelerator.is_main_process:  # every process holds the same copy
            folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
            # with the rule and its flags that kept it: a run of another rule, or of the same rule with other flags
            # (another sync interval), resumed from this folder must not read it as its own
            files.write_tensors(os.path.join(folder, RULE_STATE), {"rule": self.rule_args.rule, "knobs": self._knobs(),
                                                                   "state": keep})

    def _knobs(self) -> dict:
        """The rule's own flags as this run set them (methods.Knob), which define what its kept state means."""
        return {k.flag: getattr(self.rule_args, k.dest, None) for k in methods.RULES[self.rule_args.rule].knobs}

    def train(self, resume_from_checkpoint=None, **kw):
        folder = get_last_checkpoint(self.args.output_dir) if resume_from_checkpoint is True else resume_from_checkpoint
        path = os.path.join(folder, RULE_STATE) if isinstance(folder, str) else None
        if path and os.path.exists(path):
            kept = torch.load(path, map_location="cpu", weights_only=True)
            if kept.get("rule") != self.rule_args.rule:
                raise SystemExit(f"{path}: kept by the rule {kept.get('rule')}, and this run's rule is "
                                 f"{self.rule_args.rule}: resume with the same --method, or from another checkpoint")
            other = {f: v for f, v in kept.get("knobs", {}).items() if self._knobs().get(f) != v}
            if other:
                flag, value = next(iter(other.items()))
                raise SystemExit(f"{path}: kept with {flag} {value}, and this run's is {self._knobs().get(flag)}: "
                                 f"resume with the flags that made it, or from another checkpoint")
            self.rule_state = checkpoint.restore_rule_state({"rule_state": kept["state"]}, str(self.accelerator.device))
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kw)

    def _generate(self, prompts):
        out = super()._generate(prompts)  # (prompt_ids, completion_ids, ...) as lists, this process's rows
        self._lengths = [len(c) for c in out[1]]  # kept before mask_truncated_completions zeroes the masks
        return out

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        self._rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        return self._rewards_per_func  # [N, F] every process's rows (TRL gathers them for G1)

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if not self.model.training:  # evaluation keeps TRL's advantages
            return out
        acc, G, pad = self.accelerator, self.num_generations, self._tokenizer.pad_token_id
        n = out["completion_ids"].shape[0]
        gather = lambda x, value, first=False: acc.gather(  # noqa: E731  [n, W] per process -> [N, W_max]
            acc.pad_across_processes(x, dim=1, pad_index=value, pad_first=first))
        lengths = torch.tensor(self._lengths, device=acc.device)  # [n]
        loss_mask = out["completion_mask"] * out.get("tool_mask", 1)  # [n, T] what TRL's loss counts
        batch = our_batch(gather(out["prompt_ids"], pad, first=True), gather(out["prompt_mask"], 0, first=True),
                          gather(out["completion_ids"], pad), acc.gather(lengths),
                          [*self.eos_token_ids, pad])  # [N, ...]
        mask = gather(loss_mask, 0)  # [N, T]
        if methods.RULES[self.rule_args.rule].reads_scores:
            batch["logprobs"], batch["entropy"] = (gather(x, 0.0) * batch["response_mask"]
                                                   for x in self._scores(out, lengths))  # [N, T]
        rewards = (self._rewards_per_func * self.reward_weights.to(acc.device)).nansum(dim=1).view(-1, G)  # [B, G]
        problems = gather_object([{k: v for k, v in x.items() if k != "prompt"} for x in inputs])[::G]  # [B]
        # the step: TRL's optimiser steps done before this generation batch (RLSD's L5 schedule and L1 syncs)
        ctx = methods.Context(self.rule_args, self.model, self._tokenizer, problems, self.pieces,
                              self.state.global_step, self.rule_state)
        rows = slice(acc.process_index * n, (acc.process_index + 1) * n)
        adv = rule_advantages(self.rule_args.rule, batch, rewards, mask, ctx, rows)
        out["advantages"] = adv.tokens[:, :out["completion_ids"].shape[1]]  # [n, T_local]
        self.last = {"batch": batch, "rewards": rewards, "mask": mask, "rows": rows, "advantages": adv}
        for k, v in oar.advantage_concentration(adv.tokens, mask[rows], adv.seq).items():  # O7, this process's rows
            self._metrics["train"][k].append(v)
        return out

    def _scores(self, out, lengths):
        """log pi_old and the entropy of each sampled token [n, T], by one no-grad forward of TRL's scorer. The
        attention mask is the completions' own (lengths [n]): mask_truncated_completions zeroes TRL's."""
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        attn = torch.cat([out["prompt_mask"], first_tokens(lengths, out["completion_ids"].shape[1])], dim=1)
        with torch.no_grad():
            logp, ent, _ = self._get_per_token_logps_and_entropies(
                self.model, ids, attn, out["completion_ids"].shape[1], batch_size=self.args.per_device_train_batch_size,
                compute_entropy=True)
        return logp, ent

