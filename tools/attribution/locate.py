"""The location and the scoring (tools.attribution's first job): each wrong rollout's first wrong step by Monte
Carlo (epicprm.py, F1-F3), and every rule's blame of it (F4). World is what a run samples with; sample_groups draws a
block's groups, run_block locates and scores them and writes their lines (record, judge), rescore adds rules to lines
written before."""
from contextlib import contextmanager

import torch
from tqdm import tqdm

import data
import epicprm
import methods
import reward
import sample
from config import training
from infra import files, memory, models
from toyworld import credit


HOWS = ("max", "mean")  # F4's aggregations of a step's token blame


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
            files.write_jsonl(path, lines)
