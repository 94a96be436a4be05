"""What train.py writes of each step besides the model: the step's line of metrics.jsonl, the first-error
attribution on the synthetic tasks, the warnings of a run that has stopped learning, and the token heat maps.

Everything is passed in as values (the batch, the rule's TokenAdvantages, its methods.Rule), so this module
imports nothing of the loop's: train.py calls it, and the arrows point one way.
"""
import os

from tqdm import tqdm

from infra import plots
from toyworld import credit


def step_record(step: int, batch: dict, rewards, mask, adv, checker: dict, draw, stats: dict, times: dict,
                lr: float, peaks: dict, concentration: dict) -> dict:
    """The step's line of metrics.jsonl. batch: the step's rollouts (sample.generate's layout, with "correct");
    rewards [B, G]; mask [N, T] the scored tokens; adv the rule's TokenAdvantages; checker the grader's counts
    (reward.new_stats); draw how the batch was drawn (dapo.Draw); stats the loss's (train.update);
    times the step's stages in seconds; peaks the peak memory (memory.Peaks.record: the run's, each phase's);
    concentration O7's ESS-ratio and top-10 % mass (oar.py)."""
    correct = batch["correct"]  # [N]
    record = {
        "step": step,
        "reward_mean": rewards.mean().item(),
        "accuracy": correct.float().mean().item(),
        "response_len": mask.sum(-1).float().mean().item(),
        "prompt_len": batch["prompt_len"],  # the batch's longest prompt, in tokens (what the memory plan counts)
        # a row's prompt without its left padding, the mean over rows (tools/perf/bench counts a step's FLOPs with it)
        "prompt_tokens": batch["attention_mask"][:, :batch["prompt_len"]].sum(-1).float().mean().item(),
        "entropy": ((batch["entropy"] * mask).sum() / mask.sum()).item(),  # of the sampling distribution
        "zero_adv_groups": (rewards.std(dim=1) == 0).float().mean().item(),
        "truncated": batch["truncated"].float().mean().item(),
        "boxed": 1 - checker["no_box"] / max(checker["graded"], 1),  # share of sampled responses with a \boxed answer
        "checker_failures": checker["timeouts"] + checker["errors"] + checker["gold_unparseable"],
        # share of sampled responses with a "}" after the last box's closing brace that nothing opened (graded wrong)
        "malformed": checker["malformed"] / max(checker["graded"], 1),
        "groups_generated": draw.generated,
        "groups_kept": len(draw.problems),
        "groups_carried_in": draw.carried,  # D2 buffer of earlier steps used here
        # what the step's advantage acts on: the groups of the batch that mix right and wrong (the only ones whose
        # rollouts get A_i != 0), the share of scored tokens with an advantage at all, and the share a token rule
        # moved off its rollout's A_i (0 for GRPO and DAPO, whose every token carries A_i)
        "groups_trained": (rewards.std(dim=1) > 0).sum().item(),
        "tokens_with_advantage": ((adv.tokens != 0) & (mask > 0)).float().sum().item() / max(mask.sum().item(), 1),
        "tokens_reshaped": (((adv.tokens - adv.seq[:, None] * mask).abs() > 1e-6 * (adv.seq.abs().max() + 1e-12))
                            & (mask > 0)).float().sum().item() / max(mask.sum().item(), 1),
        "groups_mixed": draw.mixed,  # groups sampled this step that mix right and wrong (D2 keeps these only)
        "sampling_rounds": draw.rounds,
        "grad_norm": stats["grad_norm"],
        "nonfinite_updates": stats["nonfinite_updates"],  # updates skipped because the loss or gradient was not finite
        "lr": lr,
        "time_sample": times["time_sample"],
        "time_train": times["time_train"],
        "time_step": times["time_step"],  # sample + reward + advantage + loss + optimizer step
        # the step's CPU seconds over its wall-clock seconds times torch's threads: near 1 (less for several threads,
        # which wait on each other) on a machine of its own, lower where other work took the cores (the comparison
        # tools then mark its timings as those of a shared machine: tools/paired.py)
        "time_cpu_share": times["time_cpu_share"],
        **peaks,
        "time_advantage": times["time_advantage"],  # G1, and KTAE's K1-K7 or OAR's scoring (O1-O5)
        **{k: v for k, v in stats.items() if k not in ("grad_norm", "nonfinite_updates")},
        **concentration,  # O7: ESS-ratio, top-10 % mass
    }
    record["clip_frac"] = record["clip_low"] + record["clip_high"]
    return record


def no_update(step: int, draw, seconds: float) -> dict:
    """The line of a step where D2 found no group that mixed right and wrong answers (draw: its dapo.Draw): no
    update, said on the terminal and logged."""
    tqdm.write(f"step {step}: no group mixed right and wrong answers in {draw.rounds} rounds; no update")
    return {"step": step, "no_update": "no group mixed right and wrong answers", "groups_generated": draw.generated,
            "sampling_rounds": draw.rounds, "time_step": seconds}


def first_accuracy(records: list):
    """The step-0 evaluation's accuracy among a run's metrics records, None if its line is gone."""
    return next((r["eval_accuracy"] for r in records if r.get("step") == 0 and "eval_accuracy" in r), None)


def attribution(world, rule, tokenizer, pieces: dict, problems: list, batch: dict, mask, adv, args) -> dict:
    """credit.py's rank, hit@1, hit@3 and AUC of the first error under the rule's blame (methods.Rule.blame), means
    over the step's wrong rollouts that had a non-zero advantage (a group that mixed right and wrong: elsewhere no
    rule assigns credit) and a first error among their scored tokens; credit_n counts them. world: the tiny-world
    task (toyworld/tasks.py) whose grammar finds the first errors; pieces caches token id -> its decoded text."""
    G, resp = len(batch["correct"]) // len(problems), batch["input_ids"][:, batch["prompt_len"]:]  # [N, T]
    for t in set(resp.flatten().tolist()) - pieces.keys():
        pieces[t] = tokenizer.decode([t])
    texts = [[pieces[t] for t in row] for row in resp.tolist()]
    questions = [p["question"] for p in problems for _ in range(G)]
    wrong = ~batch["correct"] & (adv.seq != 0)  # [N]
    blame = rule.blame(adv, batch, mask, args)  # [N, T]
    return credit.batch_attribution(world, questions, texts, wrong.cpu(), blame.detach().cpu(), mask.cpu())


# A run that has stopped learning says so in the log: over the last DEGENERATE_WINDOW steps every sampled answer was
# wrong (or every one right), so every group agrees and G1's advantage is 0; or most rollouts hit the length limit.
DEGENERATE_WINDOW, TRUNCATION_WARNING = 20, 0.5


def degenerate(records: list) -> dict:
    """{kind: warning} about the last DEGENERATE_WINDOW step records (none before there are that many)."""
    last = records[-DEGENERATE_WINDOW:]
    if len(last) < DEGENERATE_WINDOW:
        return {}
    n, warnings = len(last), {}
    if all(r["accuracy"] == 0 for r in last):
        warnings["all wrong"] = (f"every sampled answer was wrong in the last {n} steps: all advantages are 0 and "
                                 f"nothing is learned (a task too hard for the model, or a prompt or grader that "
                                 f"fails?)")
    if all(r["accuracy"] == 1 for r in last):
        warnings["all right"] = (f"every sampled answer was right in the last {n} steps: all advantages are 0 and "
                                 f"nothing is left to learn on these problems")
    truncated = sum(r["truncated"] for r in last) / n
    if truncated > TRUNCATION_WARNING:
        warnings["truncated"] = (f"{truncated:.0%} of the rollouts of the last {n} steps hit --max-new-tokens (an "
                                 f"EOS that is never sampled cannot be learned back: see --overlong-buffer, D4)")
    return warnings


class Watch:
    """Each kind of degenerate() warning once per run, on the terminal and in the step's record. records: the step
    records a resumed run kept, replayed silently, so that a warning given before the kill is not given again."""

    def __init__(self, records: list = ()):
        self.history, self.warned = [], set()
        for r in records:
            self.history.append(r)
            self.warned.update(degenerate(self.history))

    def check(self, record: dict):
        self.history.append(record)
        found = degenerate(self.history)
        new = [w for kind, w in found.items() if kind not in self.warned]
        self.warned.update(found)
        for w in new:
            tqdm.write(f"warning, step {record['step']}: {w}")
        if new:
            record["warnings"] = new


COMPLETION_COLUMNS = ["problem", "completion", "reward", "advantage"]


def completions(tokenizer, problems: list, batch: dict, rewards, adv, groups: int = 2) -> list:
    """The rows of the completions table a tracker shows at each evaluation (--report-to): every rollout of the
    step's first `groups` groups, its question, its text, its reward and its sequence advantage."""
    G, resp = rewards.shape[1], batch["input_ids"][:, batch["prompt_len"]:]  # [N, T]
    n = batch["response_mask"].sum(-1)  # [N] response tokens, EOS included
    return [[problems[g].get("question", problems[g]["prompt"]),
             tokenizer.decode(resp[i, :int(n[i])].tolist(), skip_special_tokens=True),
             round(rewards[g, i - g * G].item(), 4), round(adv.seq[i].item(), 4)]
            for g in range(min(groups, len(problems))) for i in range(g * G, (g + 1) * G)]


def write_heatmap(path: str, method: str, step: int, heatmap, tokenizer, problems: list, batch: dict, mask, rewards,
                  adv):
    """A token heat map of the first group of the batch that mixes right and wrong answers (nothing when none does):
    every token coloured by the rule's per-token values (TokenAdvantages.values: KTAE's key-token values, OAR's
    weights, E1's entropies) as heatmap (methods.HeatMap) says, each rollout with its reward and sequence advantage
    (plots.token_heatmap builds the page and its legend), each token with the terms behind its value
    (TokenAdvantages.terms) and its id."""
    G, resp = rewards.shape[1], batch["input_ids"][:, batch["prompt_len"]:]  # [N, T]
    mixed = [g for g in range(len(problems)) if 0 < (rewards[g] > 0).sum() < G]
    if not mixed:
        return
    g = mixed[0]
    rollouts = []
    for i in range(g * G, (g + 1) * G):
        n = int(mask[i].sum())
        ids = resp[i, :n].tolist()
        terms = {k: v[i, :n].tolist() for k, v in (adv.terms or {}).items()}
        rollouts.append(([tokenizer.decode([t]) for t in ids], adv.values[i, :n].tolist(), rewards[g, i - g * G].item(),
                         adv.seq[i].item(), terms, ids))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    plots.token_heatmap(path, f"{method}: {heatmap.what}, step {step}", problems[g]["prompt"], rollouts,
                        kind=heatmap.kind, centre=heatmap.centre, scale=heatmap.scale)
