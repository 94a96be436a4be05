"""Which tokens matter, measured: every token rule's blame against the first wrong step of a model's own wrong
answers, located by Monte Carlo (epicprm.py, F1-F4; EQUATIONS.md#first-wrong-step-by-monte-carlo).

    python -m tools.attribution --model tiny --dataset chain --limit 64 --threads 2   # the tiny world: MC against
                                                                                      # the exact first error
    python -m tools.attribution --model qwen2.5-coder-0.5b --dataset gsm8k --limit 40 --threads 2
    python -m tools.attribution --model qwen2.5-coder-0.5b --responses answers.jsonl  # answers made elsewhere

For each problem: G rollouts sampled at --temperature; a group that mixes right and wrong answers (the only kind
where KTAE, OAR and GRAIL give credit) has each wrong rollout's first wrong step located (F3: v of the question
alone with n continuations, then a bisection over the steps; the wrong rollouts of a block of --group-batch problems
are probed together, one round of batches a bisection step), and
every rule of methods.RULES scores the group with its own advantages and Rule.blame, summed up to steps (F4, the
max and the mean of a step's tokens). Beside them, the baselines any attribution must beat: uniform (the "none"
rule, GRPO: chance), position (later steps more) and surprisal (-log p of the sampled token). On the synthetic
tasks the exact first error (toyworld/credit.py) is scored too, side by side.

OUT (--out, default runs/attribution-MODEL-DATASET) holds rollouts.jsonl (a line per located rollout and one per
problem, written when the problem's block is done, and the table can be recomputed from it), block.pt (the block
under way: its groups and every sampling call so far; a killed run, rerun with the same --limit and --group-batch,
continues from its last call: Progress), table.md (the printed table: per rule and aggregation
hit@1, hit@3, AUC and mean rank with 95 % bootstrap intervals over rollouts), auc.png, and rollouts.html (the first
wrong step marked, each rule's step blame coloured).
--responses FILE takes answers made elsewhere instead of sampling (JSON lines of question, answer, response): they
have no group, so only the rules that need none (methods.Rule.needs_group) score them.
"""
import argparse
import contextlib
import hashlib
import html
import json
import os
import random
import shutil
import sys
import time
from contextlib import contextmanager

import torch
from tqdm import tqdm

import data
import epicprm
import methods
import reward
import sample
from config import shared, training
from infra import cli, cpu, memory, models, outfolder, plots
from toyworld import credit

HOWS = ("max", "mean")  # F4's aggregations
BASELINES = ("position", "surprisal")  # beside the rules; uniform blame is the rule "none"
METRICS = ("hit1", "hit3", "auc", "rank")  # toyworld/credit.attribution's, at the level of steps
PROGRESS = "block.pt"  # the work so far of the block under way (Progress)
WRITTEN = ("rollouts.jsonl", "table.md", "auc.png", "rollouts.html", PROGRESS, PROGRESS + ".tmp")  # --overwrite's


def parser() -> argparse.ArgumentParser:
    p = cli.Parser(description="every token rule's blame against the first wrong step (tools.attribution)")
    shared.add_shared_flags(p)
    p.add_argument("--dataset", default=data.DEFAULT, help="the problems: tiny, chain, gsm8k, math500, a .jsonl file")
    p.add_argument("--responses", default=None,
                   help="JSON lines of question, answer and response: locate these answers' first wrong step instead "
                        "of sampling (the rules that need a group are not scored)")
    p.add_argument("--out", default=None, help="default: runs/attribution-MODEL-DATASET (a local model or file also by "
                                               "a hash of its full path: two models never share one)")
    p.add_argument("--overwrite", action="store_true",
                   help="start over in an OUT that holds lines made with other settings, deleting this tool's files")
    p.add_argument("--limit", type=int, default=32, help="problems (or responses) to take, from the first")
    p.add_argument("--seed", type=int, default=0, help="the sampling of each problem's group and probes")
    p.add_argument("--group-size", type=int, default=8, help="G, rollouts per problem")
    p.add_argument("--temperature", type=shared.number, default=1.0,
                   help="of the rollouts and of the continuations (F2)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="a rollout's length limit, and what it leaves a continuation after its prefix (F2) "
                        "(default: the data's; 512 for a real model)")
    p.add_argument("--n", type=int, default=16, help="F2: continuations per probed prefix (EpicPRM's least: 16)")
    p.add_argument("--n-max", type=int, default=None,
                   help="F3b: continuations a probe may draw in all, --n at a time, while its call (above or below the "
                        "threshold) is more likely wrong than --alpha (default: 4 x --n; --n-max equal to --n: none "
                        "more); a located step whose calls stay so is marked uncertain and left out of the tables")
    p.add_argument("--alpha", type=shared.number, default=epicprm.ALPHA,
                   help="F3b: the error probability a probe's call aims for (default: %(default)s)")
    p.add_argument("--refine", action="store_true", help="F3: then the first wrong token inside the step")
    p.add_argument("--rules", default=",".join(methods.RULES),
                   help="the rules scored (methods.RULES), comma-separated")
    p.add_argument("--rules-file", default=None, metavar="FILE",
                   help="a file (or module) of your own token rules (README.md, \"Adding a token rule\"), scored "
                        "beside the table's")
    p.add_argument("--oar-p-limit", type=int, default=None,
                   help="score rules that run a forward per response token (methods.Rule.scoring 'forward': OAR-P) on "
                        "the groups of the first N located rollouts only")
    p.add_argument("--rescore", action="store_true",
                   help="score --rules on the rollouts OUT already located, none located again: each block's groups "
                        "drawn again (run with the locating run's --seed, --group-batch, --threads and --limit), a "
                        "line gaining the rules it lacks (--oar-p-limit N: OAR-P on the first N)")
    p.add_argument("--batch", type=int, default=64, help="rows per sampling call (probes x n)")
    p.add_argument("--group-batch", type=int, default=1,
                   help="problems taken as one block: their groups sampled in one call (G x this many rows), then "
                        "the v of their questions and every bisection's probes in shared batches (most groups of a "
                        "weak model do not mix, and one problem's few probes use the machine poorly); 1: each alone. "
                        "A resumed run continues a killed block from its last sampling call (OUT/block.pt)")
    p.add_argument("--per-problem", type=int, default=0,
                   help="locate at most this many wrong rollouts of a group (0: all; the rules score the whole group "
                        "either way): more problems for the same cost")
    return p


def check(p, args):
    with shared.as_errors_of(p):
        shared.check_shared(args)
        shared.check_seed(args.seed)
        args.n_max = 4 * args.n if args.n_max is None else args.n_max
        shared.at_least(args, {"limit": 1, "group_size": 2, "n": 1, "batch": 1, "max_new_tokens": 1,
                               "oar_p_limit": 0, "per_problem": 0, "group_batch": 1, "n_max": args.n})
    if not 0 < args.alpha < 1:
        p.error(f"--alpha {args.alpha}: must lie between 0 and 1")
    if not args.temperature >= shared.MIN_TEMPERATURE:
        p.error(f"--temperature {args.temperature}: must be at least {shared.MIN_TEMPERATURE}")
    rules = [r.strip() for r in args.rules.split(",") if r.strip()]
    for r in rules:
        if r not in methods.RULES:
            p.error(f"--rules: unknown rule {r!r} (choose from {', '.join(methods.RULES)})")
    if args.rescore and args.responses:
        p.error("--rescore: takes the sampled groups of OUT, not --responses (whose rules need no second pass)")
    if args.responses and not os.path.isfile(args.responses):
        p.error(f"--responses {args.responses}: no such file")
    args.rules = rules
    return args


class World:
    """What the run samples with and grades by: the model, its tokenizer, the problems' prompts and the task."""

    def __init__(self, args):
        self.args = args
        self.task = data.dataset(args.dataset).world  # the synthetic tasks' exact first errors, else None
        # float32 weights, sampling under bf16 autocast where --bf16 (as train.py): the rules score in float32
        self.model, self.tok, _ = models.load_model(args.model, world=self.task)
        self.model.to(args.device).eval()
        self.pieces = {}  # token id -> its text
        self.say = lambda what: None  # the stage of the block under way, on the progress bar
        self.progress = None  # the block under way's Progress: each sampling call kept

    def text(self, ids) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def piece_list(self, ids) -> list:
        for t in set(ids) - self.pieces.keys():
            self.pieces[t] = self.tok.decode([t])
        return [self.pieces[t] for t in ids]

    def values(self, prompts: list, prefixes: list) -> list:
        """F2 for (prompt, prefix) pairs, each graded against its prompt's gold answer (prompts: (ids, gold) pairs);
        pairs of different problems share the sampler's batches."""
        a = self.args
        grades = [lambda t, g=gold: reward.is_correct(t, g) is True for _, gold in prompts]

        def draw():
            with sample.autocast(a.device, a.bf16), handed_back():
                return epicprm.prefix_values(self.model, [p for p, _ in prompts], prefixes, n=a.n,
                                             temperature=a.temperature, max_new_tokens=a.max_new_tokens,
                                             grades=grades, decode=self.text, eos_id=self.tok.eos_token_id,
                                             pad_id=self.tok.pad_token_id, batch=a.batch)
        return draw() if self.progress is None else self.progress.call([prompts, prefixes], draw)


@contextmanager
def handed_back():
    """Freed memory goes back to the system when a sampling call ends (memory.release_freed_memory). cpu.setup keeps
    freed memory in the process for the next tensor (a training step's speed), so a process's resident set is the
    most its heap ever held, in whatever pieces its allocations left it. On the 1.5B that rose with each long call
    (issue 65: 1.2-1.5 GB a call of 16 continuations of 512 tokens, to 24 GB); here calls take seconds to minutes,
    and the page faults of memory asked for again cost far less (docs/LOG.md, 2026-11-28)."""
    try:
        yield
    finally:
        memory.release_freed_memory()


def rule_settings(world: World, rule: str):
    """train.py's settings for grpo + rule on this model and data (the rule's presets, its checks)."""
    a = world.args
    method = "grpo" if rule == "none" else rule
    return training.parse_args_one_line([], method=method, model=a.model, dataset=a.dataset, group_size=a.group_size,
                                        max_new_tokens=a.max_new_tokens, temperature=a.temperature, device=a.device,
                                        bf16=a.bf16)


def blames(world: World, batch: dict, problem: dict, correct: list, rules: list, rows: list = None) -> dict:
    """Each rule's per-token blame [G, T] of the group's rollouts (methods.Rule.blame of its own advantages), and the
    baselines': position (the token's index) and surprisal (-log p of the sampled token, at the sampling
    temperature). rows: the rollouts whose blame is wanted (None: all). A rule that scores each rollout alone with
    the model (methods.Rule.scoring: OAR, GRAIL) runs on those rows and one right rollout only, which keeps their
    advantages' signs: its weights of a rollout depend on that rollout alone (the TRL path splits them so too), and
    OAR-P's forward per response token would otherwise be spent on rollouts no one reads. That right rollout is
    the shortest: its weights are not read either, and OAR-P's cost grows as the square of a rollout's length."""
    mask = batch["response_mask"]
    out = {"position": torch.arange(mask.shape[1], dtype=torch.float).expand(mask.shape),
           "surprisal": -batch["logprobs"]}
    shortest_right = lambda: min((i for i, c in enumerate(correct) if c), key=lambda i: int(mask[i].sum()))  # noqa
    keep = None if rows is None else torch.tensor(sorted(rows) + [shortest_right()])  # [k + 1]
    for rule in rules:
        args = rule_settings(world, rule)
        sub = methods.RULES[rule].scoring and keep is not None
        b = sample.select_rows(batch, keep) if sub else batch
        ok = [correct[i] for i in keep.tolist()] if sub else correct
        args.group_size = len(ok)
        ctx = methods.Context(args, world.model, world.tok, [problem], world.pieces)
        torch.manual_seed(world.args.seed)  # OAR-G's noise
        adv = methods.RULES[rule].advantages(b, torch.tensor([ok], dtype=torch.float), b["response_mask"], ctx)
        blame = methods.RULES[rule].blame(adv, b, b["response_mask"], args).detach().float().cpu()
        if sub:  # back into the group's rows; the others are not read
            full = torch.zeros(mask.shape)
            full[keep] = blame
            blame = full
        out[rule] = blame
    return out


def scores(blame: dict, spans: list, step: int) -> dict:
    """credit.attribution of the step `step` under each rule's step blame (F4, both aggregations)."""
    return {rule: {how: credit.attribution(epicprm.step_blame(b, spans, how), step) for how in HOWS}
            for rule, b in blame.items()}


def locate(world: World, wrong: list) -> list:
    """F3 for wrong responses, each (prompt, gold, response token ids with EOS left out, v0), of one problem or of
    several: their Locate objects, located, every unfinished search probed in one round of batches."""
    spans = [epicprm.steps(world.piece_list(r)) for _, _, r, _ in wrong]
    locs = [epicprm.Locate(s, v0 / 2, world.args.refine) for s, (_, _, _, v0) in zip(spans, wrong)]
    a = world.args
    epicprm.locate_all(locs, lambda idx, lengths: world.values([wrong[i][:2] for i in idx],
                                                                [wrong[i][2][:n] for i, n in zip(idx, lengths)]),
                       a.n, a.n_max, a.alpha)
    return locs


class Progress:
    """The work so far of the block under way, kept in OUT/block.pt so that a killed run loses at most one sampling
    call, not the block: on Qwen2.5-Coder-0.5B, on a 2-core host without AVX512, a block of 8 problems was still
    bisecting after 110 minutes, and a block of the 1.5B would outlast a session (docs/LOG.md, 2026-11-28,
    nineteenth session). The block's groups are kept once drawn (--responses: a block is one given answer, nothing
    drawn), then every sampling call of F2 (World.values: v(question), each probe) with what it returned and the
    random state after it. A resumed block runs as before, each call answered from the save while the save has it,
    and the random state of the last is restored: from there it draws what a run never stopped would have drawn (on
    the same machine, --threads and device). Written aside, then renamed: a kill while saving leaves the last whole
    save. A save of another block (another --limit's last block, or one already written) is not used."""

    def __init__(self, out: str, block: range, device: str = "cpu", given: bool = False):
        self.path, self.key, self.device = os.path.join(out, PROGRESS), [block[0], block[-1] + 1], str(device)
        self.name = f"answer {block[0]}" if given else f"problems {block[0]}-{block[-1]}"
        self.state, self.answered = {"block": self.key, "calls": []}, 0
        saved = self.read(self.path)
        if isinstance(saved, dict) and saved["block"] == self.key:
            self.state = saved
            tqdm.write(f"{self.name}: continued from {self.path}" + (", the groups" if "groups" in saved else "")
                       + f", {len(saved['calls'])} sampling calls")

    @staticmethod
    def read(path: str, say: bool = True):
        """The save at path; None if there is none, or "unreadable" for a file that is not a save this class wrote
        (said in one line where say: its block then runs again whole)."""
        if not os.path.exists(path):
            return None
        try:
            saved = torch.load(path, weights_only=True)
            assert isinstance(saved, dict) and isinstance(saved["block"], list) and isinstance(saved["calls"], list)
            return saved
        except Exception as e:  # noqa: BLE001 (anything else: not a save this class wrote)
            if say:
                tqdm.write(f"{path}: not a save of a block ({type(e).__name__}); its block runs again whole")
            return "unreadable"

    def get(self, name: str):
        return self.state.get(name)

    def save(self, **parts):
        self.state.update(parts, rng=torch.get_rng_state())
        if self.device.startswith("cuda"):  # the device's sampler draws from the device's own generator
            self.state["device_rng"] = torch.cuda.get_rng_state(self.device)
        elif self.device.startswith("mps"):
            self.state["device_rng"] = torch.mps.get_rng_state()
        try:
            torch.save(self.state, self.path + ".tmp")
            os.replace(self.path + ".tmp", self.path)
        except Exception as e:  # noqa: BLE001 (torch.save's writer raises its own kind on a full disk, not OSError)
            # whole or nothing, as infra/checkpoint.save: the cut .tmp goes, the last whole save stays for the rerun
            with contextlib.suppress(OSError):
                os.remove(self.path + ".tmp")
            free = shutil.disk_usage(os.path.dirname(self.path) or ".").free / 2 ** 20
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            sys.exit(f"{self.path}: the work so far of {self.name} could not be saved ({first}; {free:.0f} MiB free "
                     f"there): free space and run the same command again, which continues from the last whole save")

    def call(self, asked, draw):
        """One sampling call of the block: draw() -> its values. asked (JSON: what the call samples from) names it:
        the killed run's answer to the same call, in the same place, is returned in its stead."""
        key = hashlib.sha256(json.dumps(asked).encode()).hexdigest()[:16]
        calls = self.state["calls"]
        if self.answered < len(calls):
            if calls[self.answered][0] == key:
                self.answered += 1
                if self.answered == len(calls):
                    self.resume_random()
                return calls[self.answered - 1][1]
            tqdm.write(f"{self.path}: call {self.answered + 1} of its {len(calls)} asks otherwise here; "
                       f"sampled from there")
            del calls[self.answered:]
        values = draw()
        calls.append([key, values])
        self.answered += 1
        self.save()
        return values

    def resume_random(self):
        """The random state after the saved calls: where a run never stopped would be now."""
        torch.set_rng_state(self.state["rng"])
        if "device_rng" in self.state and self.device.startswith("cuda"):
            torch.cuda.set_rng_state(self.state["device_rng"], self.device)
        elif "device_rng" in self.state and self.device.startswith("mps"):
            torch.mps.set_rng_state(self.state["device_rng"])

    def done(self):
        self.remove(self.path)

    @staticmethod
    def remove(path: str):
        for name in (path, path + ".tmp"):
            if os.path.exists(name):
                os.remove(name)

    @staticmethod
    def clear(out: str, blocks: list):
        """Delete OUT's save if it is of one of `blocks` (all written: a kill just after a block's lines leaves its
        save) or unreadable. A save of a block beyond them (a larger --limit's) is kept for that run."""
        path = os.path.join(out, PROGRESS)
        saved = Progress.read(path, say=False)
        if saved == "unreadable" or isinstance(saved, dict) and saved["block"] in [[b[0], b[-1] + 1] for b in blocks]:
            Progress.remove(path)


def record(world: World, i: int, j: int, problem: dict, ids: list, loc, v0: float, blame: dict, exact) -> dict:
    """The JSON line of one located rollout: its steps, every probe, the first wrong step and every rule's blame."""
    n, pieces = world.args.n, world.piece_list(ids)
    tests = {length: (v, m) for length, v, m, _ in loc.tests}
    k, spans = loc.step, loc.spans
    above = tests.get(spans[k - 1][1]) if k > 0 else (v0, n)  # the prefix before the step (None: not probed)
    below = tests.get(spans[k][1])  # through the step (None: the last step, the wrong outcome itself)
    row = {"problem": i, "rollout": j, "question": problem["question"], "gold": problem["answer"],
           "response": "".join(pieces), "steps": [{"tokens": [a, b], "text": "".join(pieces[a:b])} for a, b in spans],
           "v0": v0, "threshold": loc.threshold, "n": n, "n_max": world.args.n_max, "alpha": world.args.alpha,
           "probes": [{"tokens": t, "v": v, "draws": m, "error": e} for t, v, m, e in loc.tests],
           "first_wrong_step": k, "v_before": above and above[0], "v_at": below and below[0],
           "se_before": None if above is None else epicprm.standard_error(*above),
           "se_at": None if below is None else epicprm.standard_error(*below),
           **loc.confidence(world.args.alpha), "first_wrong_token": loc.token}
    if exact is not None:  # the synthetic tasks: the exact first error's step
        row["exact_step"] = exact
    return judge(row, {r: b[:len(ids)] for r, b in blame.items()})


def judge(row: dict, blame: dict) -> dict:
    """row (a located rollout's line), changed in place and returned: each rule's step blame (F4, both aggregations)
    of its token blame [T] added, and its scores against the first wrong step, and against the exact first error
    where the line has one."""
    spans = [tuple(s["tokens"]) for s in row["steps"]]
    row.setdefault("blame", {}).update({r: {how: epicprm.step_blame(b, spans, how).tolist() for how in HOWS}
                                        for r, b in blame.items()})
    row.setdefault("scores", {}).update(scores(blame, spans, row["first_wrong_step"]))
    if row.get("exact_step") is not None:
        row.setdefault("scores_exact", {}).update(scores(blame, spans, row["exact_step"]))
    return row


def exact_step(world: World, problem: dict, ids: list, spans: list):
    """The step holding the exact first error (toyworld/credit.first_error), or None off the synthetic tasks."""
    if world.task is None:
        return None
    token = credit.first_error(world.task, problem["question"], world.piece_list(ids))
    return None if token is None else next(s for s, (a, b) in enumerate(spans) if a <= token < b)


def sample_groups(world: World, first: int, problems: list) -> dict:
    """The groups of problems first, first + 1, ...: G rollouts each, graded, {i: (prompt, batch, responses,
    correct)}. Seeded by the first problem (one problem alone: by it, as before --group-batch), so a resumed run
    draws the same groups."""
    a, G = world.args, world.args.group_size
    torch.manual_seed(a.seed * 100_003 + first if len(problems) == 1 else a.seed * 100_003 + 1_000_000_007 + first)
    prompts = [world.tok(q["prompt"])["input_ids"] for q in problems]
    with sample.autocast(a.device, a.bf16), handed_back():
        both = sample.generate(world.model, prompts, n=G, max_new_tokens=a.max_new_tokens, temperature=a.temperature,
                               eos_id=world.tok.eos_token_id, pad_id=world.tok.pad_token_id)
    out = {}
    for k, (prompt, problem) in enumerate(zip(prompts, problems)):
        batch = sample.select_rows(both, torch.arange(k * G, (k + 1) * G))  # problem k's rows, prompt-major
        P, m = batch["prompt_len"], batch["response_mask"]
        ends = (m.sum(-1) - (~batch["truncated"]).long()).tolist()  # response tokens before the EOS
        responses = [batch["input_ids"][r, P:P + e].tolist() for r, e in enumerate(ends)]
        correct = [reward.is_correct(world.text(r), problem["answer"]) is True for r in responses]
        out[first + k] = (prompt, batch, responses, correct)
    return out


def run_block(world: World, first: int, groups: dict, write, scored: dict):
    """Locate and score the groups (sample_groups) of a block of problems; write each problem's lines, the block's
    problems in order, once the whole block is done (a killed block continues from its Progress, drawing the same
    numbers when --limit and --group-batch are those of the killed run).
    The v of every mixed problem's question runs in one round of batches, then every wrong rollout's bisection
    (F3): a block of K problems fills the sampler's batches where one problem's two or three searches would not."""
    a = world.args
    lines, todo = {}, {}  # problem -> its line; problem -> the wrong rollouts to locate
    for i, (prompt, batch, responses, correct) in groups.items():
        line = {"problem": i, "done": True, "correct": sum(correct), "group": a.group_size}
        lines[i] = line
        if not 0 < sum(correct) < a.group_size:
            line["mixed"] = False
            continue
        wrong = [j for j in range(a.group_size) if not correct[j]]
        # a wrong rollout cut off by the token budget may hold no wrong step, only too many: not located
        cut = [j for j in wrong if batch["truncated"][j]]
        short = [j for j in wrong if j not in cut and len(epicprm.steps(world.piece_list(responses[j]))) < 2]
        line.update(mixed=True, wrong=len(wrong), truncated=len(cut), one_step=len(short))
        todo[i] = [j for j in wrong if j not in cut + short][:a.per_problem or None]
    torch.manual_seed(a.seed * 100_003 + first + 1)
    mixed = [i for i in groups if lines[i]["mixed"]]
    world.say(f"v(question) of {len(mixed)} mixed groups")
    v0s = world.values([(groups[i][0], world.problems[i]["answer"]) for i in mixed], [[]] * len(mixed))
    for i, v0 in zip(mixed, v0s):  # v0 = 0: the model cannot solve it from the question alone, nothing to locate
        lines[i]["v0"] = v0
        if v0 == 0:
            todo[i] = []
    wrong = [(i, j) for i in mixed for j in todo[i]]
    world.say(f"bisecting {len(wrong)} wrong rollouts")
    locs = dict(zip(wrong, locate(world, [(groups[i][0], world.problems[i]["answer"], groups[i][2][j],
                                           lines[i]["v0"]) for i, j in wrong])))
    for i in groups:
        if todo.get(i):
            world.say(f"scoring problem {i}")
            problem, (_, batch, responses, correct) = world.problems[i], groups[i]
            rules = [r for r in a.rules if not (methods.RULES[r].scoring == "forward" and a.oar_p_limit is not None
                                                and scored.get("forward", 0) >= a.oar_p_limit)]
            blame = blames(world, batch, problem, correct, rules, rows=todo[i])
            for j in todo[i]:
                loc = locs[i, j]
                exact = exact_step(world, problem, responses[j], loc.spans)
                write(record(world, i, j, problem, responses[j], loc, lines[i]["v0"],
                             {r: b[j] for r, b in blame.items()}, exact))
            if any(methods.RULES[r].scoring == "forward" for r in rules):
                scored["forward"] = scored.get("forward", 0) + len(todo[i])
            lines[i]["located"] = len(todo[i])
        write(lines[i])


def rescore(world: World, path: str, lines: list, blocks: list):
    """--rescore: the rules of --rules that a located rollout's line lacks, scored on the groups drawn again (the
    seed of a block draws its groups again, sample_groups) and written into the line (judge); the file is replaced
    whole (written aside, then renamed) after each problem, so a killed rescore keeps what it finished. blocks: the
    blocks of this --limit and --group-batch whose problems are all done. A problem whose group drawn again is not
    the one its lines record (its size, its right answers, a located rollout's text or steps: another
    --group-batch, seed or thread count) is reported and left as it was."""
    a = world.args
    is_forward = lambda rules: any(methods.RULES[r].scoring == "forward" for r in rules if r in methods.RULES)  # noqa
    forward = sum(1 for x in lines if "rollout" in x and is_forward(x["blame"]))  # OAR-P's rollouts so far

    def missing(x) -> list:
        full = a.oar_p_limit is not None and forward >= a.oar_p_limit
        return [r for r in a.rules if r not in x["blame"] and not (full and is_forward([r]))]
    todo = [b for b in blocks if any("rollout" in x and x["problem"] in b and missing(x) for x in lines)]
    limit = " at most (--oar-p-limit)" if a.oar_p_limit is not None else ""
    print(f"rescoring {sum(1 for x in lines if 'rollout' in x and missing(x))} located rollouts: {len(todo)} blocks "
          f"of {a.group_batch} problems drawn again{limit}")
    for block in tqdm(todo, desc="blocks"):
        if not any("rollout" in x and x["problem"] in block and missing(x) for x in lines):
            continue  # --oar-p-limit reached in an earlier block: nothing to draw this one again for
        groups = sample_groups(world, block[0], [world.problems[i] for i in block])
        for i in block:
            mine = [x for x in lines if "rollout" in x and x["problem"] == i and missing(x)]
            if not mine:
                continue
            _, batch, responses, correct = groups[i]
            head = next(x for x in lines if x["problem"] == i and x.get("done"))
            same = [x for x in mine if (head["group"], head["correct"]) == (len(correct), sum(correct))
                    and "".join(world.piece_list(responses[x["rollout"]])) == x["response"]
                    and [list(s) for s in epicprm.steps(world.piece_list(responses[x["rollout"]]))]
                    == [s["tokens"] for s in x["steps"]]]
            for x in mine:
                if x not in same:
                    print(f"problem {i} rollout {x['rollout']}: its group drawn again is another; not rescored")
            rules = [r for r in a.rules if any(r in missing(x) for x in same)]
            if not same or not rules:
                continue
            blame = blames(world, batch, world.problems[i], correct, rules, rows=[x["rollout"] for x in same])
            gained = 0
            for x in same:
                j, new = x["rollout"], missing(x)
                gained += is_forward(new)
                judge(x, {r: b[j][:len(responses[j])] for r, b in blame.items() if r in new})
            forward += gained
            with open(path + ".tmp", "w") as f:
                f.writelines(json.dumps(x) + "\n" for x in lines)
            os.replace(path + ".tmp", path)


def bootstrap(values: list, draws: int = 1000, seed: int = 0) -> tuple:
    """(mean, low, high): the mean and its 95 % percentile bootstrap interval over the values."""
    rng, n = random.Random(seed), len(values)
    means = sorted(sum(rng.choice(values) for _ in range(n)) / n for _ in range(draws))
    return sum(values) / n, means[int(0.025 * draws)], means[int(0.975 * draws) - 1]


def summarise(rows: list, key: str = "scores") -> dict:
    """{rule: {"n": rollouts, how: {metric: (mean, low, high)}}} over the located rollouts' lines that the rule
    scored (a rule run on a subset, OAR-P under --oar-p-limit, has fewer)."""
    rules = list(dict.fromkeys(r for row in rows for r in row[key]))
    out = {}
    for r in rules:
        mine = [row[key][r] for row in rows if r in row[key]]
        out[r] = {"n": len(mine), **{how: {m: bootstrap([x[how][m] for x in mine]) for m in METRICS} for how in HOWS}}
    return out


def table(summary: dict, title: str) -> str:
    cell = lambda t: f"{t[0]:.3f} [{t[1]:.3f}, {t[2]:.3f}]"  # noqa: E731
    lines = [f"**{title}**", "", "| rule | rollouts | steps | hit@1 | hit@3 | AUC | mean rank |",
             "|---|---|---|---|---|---|---|"]
    for rule, per in summary.items():
        for how in HOWS:
            lines.append(f"| {rule} | {per['n']} | {how} | " + " | ".join(cell(per[how][m]) for m in METRICS) + " |")
    return "\n".join(lines)


def tick_labels(summary: dict) -> list:
    """A rule's name, with its count where it scored fewer rollouts than the most (OAR-P under --oar-p-limit): the
    most is the title's count, since the baselines score every located rollout, and a subset's interval is wider."""
    most = max(s["n"] for s in summary.values())
    return [r if s["n"] == most else f"{r}\n({s['n']} rollouts)" for r, s in summary.items()]


def plot(summary: dict, path: str, title: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rules = list(summary)
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for k, how in enumerate(HOWS):
        x = [r + (k - 0.5) * 0.3 for r in range(len(rules))]
        mean, low, high = zip(*(summary[r][how]["auc"] for r in rules))
        ax.errorbar(x, mean, yerr=[[m - lo for m, lo in zip(mean, low)], [hi - m for m, hi in zip(mean, high)]],
                    fmt="os"[k], capsize=3, label=f"step blame: {how} of its tokens")
    ax.axhline(0.5, color="grey", linestyle=":", linewidth=1, label="chance (uniform blame)")
    ax.set_xticks(range(len(rules)), tick_labels(summary), rotation=20)
    ax.set_ylabel("first-wrong-step AUC")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def page(rows: list, path: str, title: str, show: int = 30):
    """rollouts.html: each rollout's steps, its first wrong step framed (and the exact one, on the synthetic tasks),
    and each rule's step blame (the max of a step's tokens) coloured from 0 (none) to red (the rollout's most)."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>"
             "body{font-family:sans-serif;margin:2em;max-width:70em} td{padding:2px 6px;vertical-align:top;"
             "font-size:85%} .s{font-family:monospace;white-space:pre-wrap} .w{outline:3px solid #c00}"
             " .x{outline:2px dashed #06c} .u{outline:3px dotted #c60}</style></head><body>",
             f"<h2>{html.escape(title)}</h2><p>A row a step: its text, then each rule's blame of it, red as strong as "
             "the rule's largest blame in this rollout (min-max within the rollout). <span class='w'>Framed red</span>"
             ": the first wrong step found by Monte Carlo (F3); <span class='u'>dotted orange</span>: found, but "
             "uncertain (F3b); <span class='x'>dashed blue</span>: the exact first error (synthetic tasks).</p>"]
    for row in rows[:show]:
        rules = list(row["blame"])
        norm = {}
        for r in rules:
            b = torch.tensor(row["blame"][r]["max"])
            norm[r] = ((b - b.min()) / (b.max() - b.min())).tolist() if b.max() > b.min() else [0.0] * len(b)
        sure = verdict(row)
        doubt = "" if sure["confident"] else (f" <b>(uncertain: the chance that this step is not where v falls "
                                              f"below the threshold is up to {sure['p_wrong']:.2f}; left out of the "
                                              f"tables)</b>")
        sure = sure["confident"]
        parts.append(f"<h4>problem {row['problem']}, rollout {row['rollout']}: gold {html.escape(row['gold'])}; "
                     f"v(question) {row['v0']:.2f}, first wrong step {row['first_wrong_step'] + 1}{doubt}</h4><table>"
                     "<tr><th>step</th>" + "".join(f"<th>{html.escape(r)}</th>" for r in rules) + "</tr>")
        for s, step in enumerate(row["steps"]):
            cls = " ".join(c for c, on in (("w" if sure else "u", s == row["first_wrong_step"]),
                                           ("x", s == row.get("exact_step"))) if on)
            cells = "".join(f"<td style='{plots.style(-norm[r][s], 0, 1)}'>{row['blame'][r]['max'][s]:.3g}</td>"
                            for r in rules)
            parts.append(f"<tr><td class='s {cls}'>{html.escape(step['text'])}</td>{cells}</tr>")
        parts.append("</table>")
    with open(path, "w") as f:
        f.write("".join(parts) + "</body></html>")


# What the report and a resumed run read of each line of OUT's rollouts.jsonl, by kind, and the type of each
PROBLEM_KEYS = {"problem": int, "done": bool, "correct": int, "group": int, "mixed": bool}
MIXED_KEYS = {"v0": (int, float), "wrong": int}
ROLLOUT_KEYS = {"problem": int, "rollout": int, "question": str, "gold": str, "response": str, "steps": list,
                "v0": (int, float), "first_wrong_step": int, "blame": dict, "scores": dict}


def line_problem(x):
    """What a line of rollouts.jsonl lacks for the report and a resumed run, or None."""
    if not isinstance(x, dict):
        return f"a JSON {type(x).__name__}, not an object"
    keys = ROLLOUT_KEYS if "rollout" in x else {**PROBLEM_KEYS, **(MIXED_KEYS if x.get("mixed") else {})} \
        if x.get("done") else None
    if keys is None:
        return "neither a problem's line (\"done\": true) nor a located rollout's (\"rollout\")"
    for k, kind in keys.items():
        if k not in x:
            return f"no \"{k}\""
        if not isinstance(x[k], kind) or (kind is int and isinstance(x[k], bool)):
            return f"\"{k}\" is {json.dumps(x[k])}"
    if "rollout" in x and not all(isinstance(s, dict) and "tokens" in s and "text" in s for s in x["steps"]):
        return "a step without its \"tokens\" or \"text\""
    return None


def check_lines(path: str):
    """Every line of OUT's rollouts.jsonl is one the report and a resumed run can read, checked before the model
    loads: one line naming the file, the line and what it lacks otherwise (a hand-edited line gave a KeyError
    after the model's minutes). A kill cuts the last line only: that one is left to read_lines, which drops it."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        lines = f.read().split("\n")
    while lines and lines[-1] == "":
        lines.pop()
    for k, line in enumerate(lines, 1):
        try:
            why = line_problem(json.loads(line))
        except json.JSONDecodeError as e:
            if k == len(lines):
                return
            why = f"not JSON ({e}), and not the last line (a killed run cuts only that one)"
        if why:
            sys.exit(f"{path}:{k}: {why}: mend or delete the line, or pass another --out")


def read_lines(path: str) -> list:
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by a kill: that problem runs again
                break
    return out


def verdict(row: dict) -> dict:
    """F3b of a located rollout's line (epicprm.confidence: error_before, error_at, p_wrong, confident): its own, or,
    for a line written before F3b, its bracketing probes' calls judged from their counts (v x n of n continuations,
    none more drawn) at the default alpha."""
    if "confident" in row:
        return {k: row[k] for k in ("error_before", "error_at", "p_wrong", "confident")}
    errors = {p["tokens"]: epicprm.decision_error(round(p["v"] * row["n"]), row["n"], row["threshold"])
              for p in row["probes"]}
    return epicprm.confidence([tuple(s["tokens"]) for s in row["steps"]], row["first_wrong_step"], errors)


def confident(row: dict) -> bool:
    return verdict(row)["confident"]


def agreement(rows: list) -> str:
    """The Monte Carlo step against the exact first error (the synthetic tasks): the same step, within one."""
    same = sum(r["exact_step"] == r["first_wrong_step"] for r in rows)
    near = sum(abs(r["exact_step"] - r["first_wrong_step"]) <= 1 for r in rows)
    return (f"{len(rows)} rollouts: the same step {same / len(rows):.3f}, within one step {near / len(rows):.3f}, "
            f"missed {1 - near / len(rows):.3f}") if rows else "0 rollouts"


def report(out: str, lines: list, world_task: bool, seconds: float = None, located_now: int = 0) -> str:
    """The printed table's text (the head line: what was drawn, located and left; then the tables); auc.png and
    rollouts.html are written where a rollout was located. The tables take the confident rollouts only (F3b), the
    head counts the others. seconds: this process's time, over located_now, the rollouts it located (lines located
    by an earlier process are not its work)."""
    located = [x for x in lines if "rollout" in x]
    rows = [x for x in located if confident(x)]  # F3b: an uncertain first wrong step is noise in every table
    problems = [x for x in lines if x.get("done")]
    given = bool(problems) and all(x.get("group") == 1 for x in problems)  # --responses: a "group" of one, given
    head = given_head(problems, located) if given else sampled_head(problems, located)
    uncertain = [x for x in located if not confident(x)]
    if uncertain:
        alpha = lambda x: x.get("alpha", epicprm.ALPHA)  # noqa: E731
        head += (f"; {len(uncertain)} of them uncertain, left out of the tables (F3b: a call bracketing the step "
                 f"more likely wrong than --alpha after --n-max continuations: "
                 f"{sum((verdict(x)['error_before'] or 0) > alpha(x) for x in uncertain)} before the step, "
                 f"{sum((verdict(x)['error_at'] or 0) > alpha(x) for x in uncertain)} through it)")
    if seconds and located_now:
        head += f"; {seconds / located_now:.1f} s a located {'response' if given else 'rollout'} in this run " \
                f"({located_now} located)"
    exact = [r for r in rows if r.get("exact_step") is not None]
    every = [r for r in located if r.get("exact_step") is not None]
    if world_task and located and not every:  # a response whose every prefix a right solution can still follow
        head += "\nno located rollout has an exact first error: no comparison with it"
    if every:
        head += (f"\nMonte Carlo against the exact first error, the confident {agreement(exact)}; every located "
                 f"{agreement(every)}")
    if not rows:
        if located:
            page(located, os.path.join(out, "rollouts.html"), "first wrong step and each rule's blame")
        return head + "\nno located " + ("response" if given else "rollout") + \
            (" with a confident first wrong step" if located else "") + ": no table"
    summary = summarise(rows)
    text = [head, "", table(summary, "against the first wrong step (Monte Carlo, F3)")]
    common = [r for r in rows if set(r["scores"]) == set(summary)]
    if len(common) < len(rows):  # a rule scored on a subset (--oar-p-limit): every rule on those rollouts too
        text += ["", table(summarise(common), f"the same, on the {len(common)} rollouts every rule scored")
                 if common else "(no rollout was scored by every rule: no table of them all on the same rollouts)"]
    if exact:
        text += ["", table(summarise(exact, "scores_exact"), "against the exact first error (toyworld/credit.py)")]
    plot(summary, os.path.join(out, "auc.png"), f"first-wrong-step AUC, {len(rows)} rollouts (95 % CI)")
    page(located, os.path.join(out, "rollouts.html"), "first wrong step and each rule's blame")
    return "\n".join(text)


def sampled_head(problems: list, rows: list) -> str:
    """The head line of a sampled run: its groups, their accuracy, what was located and what was left, and why."""
    mixed = [x for x in problems if x.get("mixed")]
    acc = sum(x["correct"] for x in problems) / max(1, sum(x["group"] for x in problems))
    zero = [x for x in mixed if x["v0"] == 0]
    return (f"{len(problems)} problems, sampled accuracy {acc:.3f}, {len(mixed)} mixed groups, {len(rows)} wrong "
            f"rollouts located from {len({r['problem'] for r in rows})} problems (not located: "
            f"{sum(x.get('truncated', 0) for x in mixed)} cut off by the token budget, "
            f"{sum(x.get('one_step', 0) for x in mixed)} of one step, "
            f"{sum(x['wrong'] - x.get('truncated', 0) - x.get('one_step', 0) for x in zero)} more of the "
            f"{len(zero)} problems whose v(question) is 0)"
            + (f"; {sum(len(r['steps']) for r in rows) / len(rows):.1f} steps a rollout" if rows else ""))


def given_head(problems: list, rows: list) -> str:
    """The head line of --responses: what became of each given response. Nothing was sampled but the probes, so
    there is no accuracy of the model nor any group; a right response has nothing to locate, a wrong one of one
    step nothing to bisect, and one whose question the model never solves (v = 0) no threshold to locate against
    (lines written before "one_step" was recorded: a wrong response not located otherwise was of one step)."""
    right = sum(x["correct"] for x in problems)
    one = sum(1 for x in problems if not x["correct"] and not x.get("mixed"))
    zero = sum(1 for x in problems if x.get("mixed") and x.get("v0") == 0)
    return (f"{len(problems)} given responses: {len(rows)} located, {right} right (nothing to locate), {one} wrong "
            f"of one step (nothing to bisect), {zero} wrong whose question the model never solved in the "
            f"continuations (v(question) 0: no threshold)"
            + (f"; {sum(len(r['steps']) for r in rows) / len(rows):.1f} steps a located response" if rows else ""))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if methods.rules_file_of(argv):  # before the parser: its rules join --rules' default
        try:
            methods.load_rules(methods.rules_file_of(argv))
        except ValueError as e:
            sys.exit(f"attribution.py: error: {e}")
    p = parser()
    args = p.parse_args(argv)
    ds = data.dataset(args.dataset)
    if args.max_new_tokens is None:
        args.max_new_tokens = ds.max_new_tokens if ds.world else 512
    args = check(p, args)
    cpu.setup(args.threads)
    out = args.out or os.path.join("runs", f"attribution-{short_name(args.model)}-"
                                           f"{short_name(args.responses or args.dataset)}")
    path = os.path.join(out, "rollouts.jsonl")
    problems = load(args, ds)  # before OUT is made: a file with no usable line makes nothing
    # OUT's lines all made with these settings, by one process at a time (infra/outfolder.py): held to the end
    lock = outfolder.claim(out, settings(args), args.overwrite,
                           os.path.isfile(path) and os.path.getsize(path) > 0, clear=WRITTEN)
    try:  # however the run ends (a KeyboardInterrupt in a notebook), OUT is let go
        run(args, ds, out, path, problems, argv)
    finally:
        lock.close()


def run(args, ds, out: str, path: str, problems: list, argv):
    """main's work once OUT is claimed: locate what is not done yet, then the report."""
    check_lines(path)
    world = World(args)
    for q in problems:
        q.setdefault("prompt", ds.prompt(world.tok, q))
    world.problems = problems
    K = 1 if args.responses else args.group_batch
    blocks = [range(f, min(f + K, len(problems))) for f in range(0, len(problems), K)]
    done_lines = read_lines(path)
    done = {x["problem"] for x in done_lines if x.get("done")}
    done = {i for b in blocks if all(i in done for i in b) for i in b}  # a half-written block: Progress
    beyond = [x for x in done_lines if x["problem"] >= len(problems)]  # a larger --limit's: kept, not reported
    if args.rescore:  # every line kept: those of blocks not whole under this --limit are left as they are
        rescore(world, path, done_lines, [b for b in blocks if b[0] in done])
    else:
        with open(path, "w") as f:  # rewritten without a cut last line or an unfinished block's lines
            f.writelines(json.dumps(x) + "\n" for x in done_lines if x["problem"] in done or x in beyond)
    todo = [] if args.rescore else [b for b in blocks if b[0] not in done]
    G, n, L = args.group_size, args.n, args.max_new_tokens
    if todo and args.responses:  # nothing sampled but the continuations of F2
        print(f"{len(problems)} given responses ({len(done)} done before), n = {n}: at most about "
              f"{(n + 4 * args.n_max) * L:,} new tokens a wrong response (n continuations of the question, about 4 "
              f"probes of n to --n-max {args.n_max} (F3b), as if all ran to {L} tokens: a probe has {L} less its "
              f"prefix, and most stop earlier and decide on n); none for a right one")
    elif todo:
        print(f"{len(problems)} problems ({len(done)} done before), G = {G}, n = {n}: at most about "
              f"{(G + n + G * 4 * args.n_max) * L:,} new tokens a problem (G rollouts, n for the question, about 4 "
              f"probes of n to --n-max {args.n_max} (F3b) for each wrong one, as if all ran to {L} tokens: a probe "
              f"has {L} less its prefix, and most stop earlier and decide on n)")
    scored, t0 = {"forward": sum(1 for x in done_lines if "rollout" in x and x["problem"] in done)}, time.time()
    with open(path, "a") as f:
        def write(line):
            f.write(json.dumps(line) + "\n")
            f.flush()
        bar = tqdm(total=sum(len(b) for b in todo), desc="problems", disable=not todo)
        located = before = sum(1 for x in read_lines(path) if "rollout" in x)
        world.say = lambda what: bar.set_postfix_str(f"located={located}" + (f", {what}" if what else ""))
        for block in todo:
            world.progress = progress = Progress(out, block, args.device, given=bool(args.responses))
            if args.responses:
                write(run_given(world, block[0], problems[block[0]], write, scored))
            else:
                groups = progress.get("groups")
                if groups is None:
                    world.say(f"sampling the groups of {len(block)} problem" + "s" * (len(block) > 1))
                    groups = sample_groups(world, block[0], [problems[i] for i in block])
                    progress.save(groups=groups)
                run_block(world, block[0], groups, write, scored)
            world.progress = None
            progress.done()
            bar.update(len(block))
            located = sum(1 for x in read_lines(path) if "rollout" in x)
            world.say("")
    if not args.rescore:  # every block of this --limit is written now
        Progress.clear(out, blocks)
    lines = [x for x in read_lines(path) if x["problem"] < len(problems)]
    text = report(out, lines, world.task is not None, time.time() - t0 if todo else None, located - before)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(f"`python -m tools.attribution {' '.join(argv if argv is not None else sys.argv[1:])}`\n\n{text}\n")
    print(text)
    located = [x for x in lines if "rollout" in x]  # report's figures: the page of every located, the AUCs of the sure
    figures = (", auc.png" if any(confident(x) for x in located) else "") + (", rollouts.html" if located else "")
    print(f"wrote {out}/rollouts.jsonl, table.md{figures}")


def short_name(name: str) -> str:
    """A model's or data's part of the default OUT: an alias or a dataset's name as it is, a hub name with its
    organisation, a local path's last part with a hash of its full path (every RUN/checkpoint ends alike)."""
    path = os.path.expanduser(name)
    if name in models.MODELS or not os.path.exists(path):
        return name.strip("/").replace("/", "--")
    digest = hashlib.sha256(os.path.realpath(path).encode()).hexdigest()[:8]
    return f"{os.path.splitext(os.path.basename(name.rstrip('/')))[0]}-{digest}"


def settings(args) -> dict:
    """What defines OUT's lines, recorded beside them: a continuation with any other value is refused (--limit,
    --rules and --oar-p-limit may change: lines are kept per problem, and a line holds the rules it was scored by).
    The model, the data and the given responses by what is in their files (models.identity)."""
    return {"--model": models.identity(args.model), "--dataset": models.identity(args.dataset),
            "--responses": args.responses and models.identity(args.responses), "--seed": args.seed,
            "--group-size": args.group_size, "--temperature": args.temperature,
            "--max-new-tokens": args.max_new_tokens, "--n": args.n, "--n-max": args.n_max, "--alpha": args.alpha,
            "--refine": args.refine, "--batch": args.batch,
            "--group-batch": args.group_batch, "--per-problem": args.per_problem, "--bf16": args.bf16,
            "--device": args.device}


def load(args, ds) -> list:
    """The problems (or given answers) in order, their first --limit."""
    if args.responses:
        rows, skipped, k = [], [], 0
        for k, line in enumerate(open(args.responses), 1):
            why, got = given_fields(line)
            if why is None:  # a lone surrogate: one bad row, as in every loader
                why = next((f"{data.not_unicode(t)} in the {f}" for f, t in got.items() if data.not_unicode(t)), None)
            if why:
                skipped.append(f"{args.responses}:{k}: skipped ({why})")
                print(skipped[-1], file=sys.stderr)
                continue
            rows.append({**got, "where": f"{args.responses}:{k}"})
        if not rows:  # said before the model loads, and nothing written
            sys.exit(f"--responses {args.responses}: no usable line (of {k}; each needs a question, an answer and a "
                     f"response)" + (f": {skipped[0]}" if skipped else ""))
        return rows[:args.limit]
    problems, skipped = data.load(args.dataset, "test", args.data_dir, args.limit, flag="--dataset")
    if not problems:
        sys.exit(f"--dataset {args.dataset}: no usable problem" + (f": {skipped[0]}" if skipped else ""))
    return problems


def given_fields(line: str):
    """(why not, fields) of a --responses line: its question, answer and response as text. A number is taken as
    its text (an answer of 42), anything else (null, a list, true) is not: str() made null the answer "None"."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        return f"not JSON: {e}", None
    if not isinstance(row, dict):
        return f"a JSON {type(row).__name__}, not an object with question, answer and response", None
    got = {}
    for f in ("question", "answer", "response"):
        v = row.get(f)
        if f not in row:
            return f"no {f}", None
        if isinstance(v, (int, float)) and not isinstance(v, bool) and f == "answer":
            v = str(v)
        if not isinstance(v, str):
            return f"its {f} is {json.dumps(v)}, not text", None
        got[f] = v
    return None, got


def run_given(world: World, i: int, problem: dict, write, scored: dict) -> dict:
    """--responses: locate the given answer's first wrong step, and score it by the rules that need no group: the
    answer paired with a right one ("\\boxed{gold}") so that its advantage is negative, as in a mixed group."""
    a = world.args
    prompt = world.tok(problem["prompt"])["input_ids"]
    ids = world.tok(problem["response"], add_special_tokens=False)["input_ids"]
    line = {"problem": i, "done": True, "correct": int(reward.is_correct(problem["response"], problem["answer"])
                                                        is True), "group": 1, "given": True}
    if line["correct"]:
        return {**line, "mixed": False}
    if len(epicprm.steps(world.piece_list(ids))) < 2:
        return {**line, "mixed": False, "one_step": 1}
    torch.manual_seed(a.seed * 100_003 + i)
    v0 = world.values([(prompt, problem["answer"])], [[]])[0]
    line.update(mixed=True, v0=v0, wrong=1, one_step=0)
    if v0 == 0:
        return line
    (loc,) = locate(world, [(prompt, problem["answer"], ids, v0)])
    right = world.tok(f"\\boxed{{{problem['answer']}}}", add_special_tokens=False)["input_ids"]
    batch = scored_batch(world, prompt, [ids, right])
    rules = [r for r in a.rules if not methods.RULES[r].needs_group]
    blame = blames(world, batch, problem, [False, True], rules)
    write(record(world, i, 0, problem, ids, loc, v0, {r: b[0] for r, b in blame.items()},
                 exact_step(world, problem, ids, loc.spans)))
    return {**line, "located": 1}


def scored_batch(world: World, prompt: list, responses: list, chunk_tokens: int = 256) -> dict:
    """Given responses (token-id lists) of one prompt in sample.generate()'s layout, each ended by EOS, with the
    log-prob and entropy of each token at the temperature from one forward (what the sampler would have kept).
    The output layer runs chunk_tokens response tokens at a time (a model whose config transforms its logits,
    sample.plain_head: all at once). Whole, the logits of every column and three float32 [rows, response,
    vocabulary] tensors (log-softmax, exp, product) took about 2.9 GB at once for the 1.5B's 2 rows of 300 + 513
    tokens, where a run capped at 20 GB failed (issue 65); a chunk of 256 tokens, about 0.5 GB."""
    eos, pad, T = world.tok.eos_token_id, world.tok.pad_token_id, max(len(r) for r in responses) + 1
    rows = [r + [eos] + [pad] * (T - len(r) - 1) for r in responses]
    ids = torch.tensor([prompt + r for r in rows], device=world.args.device)
    mask = torch.tensor([[1] * (len(r) + 1) + [0] * (T - len(r) - 1) for r in responses], device=ids.device)
    attn = torch.cat([torch.ones(len(rows), len(prompt), dtype=torch.long, device=ids.device), mask], 1)
    model, targets = world.model, ids[:, len(prompt):]  # [N, T]
    with torch.no_grad():
        if sample.plain_head(model):
            h = model.get_decoder()(input_ids=ids, attention_mask=attn).last_hidden_state[:, len(prompt) - 1:-1]
            h, head = h.reshape(-1, h.shape[-1]), model.get_output_embeddings()  # [N*T, H]
            logits = lambda s: head(h[s:s + chunk_tokens])  # noqa: E731  [c, V]
        else:
            whole = model(input_ids=ids, attention_mask=attn).logits[:, len(prompt) - 1:-1]  # [N, T, V]
            logits = lambda s: whole.reshape(-1, whole.shape[-1])[s:s + chunk_tokens]  # noqa: E731
        flat, chosen, ent = targets.reshape(-1), [], []
        for s in range(0, len(flat), chunk_tokens):
            logp = torch.log_softmax(logits(s).float() / world.args.temperature, -1)  # [c, V]
            chosen.append(logp.gather(-1, flat[s:s + chunk_tokens, None]).squeeze(-1))  # [c]
            ent.append(-(logp.exp() * logp).sum(-1))  # [c]
        chosen, ent = torch.cat(chosen).view(targets.shape), torch.cat(ent).view(targets.shape)  # [N, T]
    return {"input_ids": ids, "attention_mask": attn, "response_mask": mask, "prompt_len": len(prompt),
            "truncated": torch.zeros(len(rows), dtype=torch.bool), "logprobs": chosen * mask, "entropy": ent * mask}

if __name__ == "__main__":
    main()
