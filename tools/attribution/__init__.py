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

The command is here (its flags, OUT, the run's order of work); its four jobs are a file each:
    locate.py     the Monte Carlo location of each first wrong step (F1-F3) and every rule's blame of it (F4)
    progress.py   the resumable job store: the block under way (block.pt) and the lines written (rollouts.jsonl)
    report.py     the tables, auc.png and rollouts.html of the lines
    given.py      --responses: answers made elsewhere, checked line by line, located and scored
"""
import argparse
import hashlib
import json
import os
import sys
import time

from tqdm import tqdm

import data
import epicprm
import methods
from config import shared
from infra import cli, cpu, models, outfolder
from tools.attribution import given, locate, progress, report


# --overwrite's: this tool's files in OUT, nothing else
WRITTEN = ("rollouts.jsonl", "table.md", "auc.png", "rollouts.html", progress.PROGRESS, progress.PROGRESS + ".tmp")


def parser() -> argparse.ArgumentParser:
    p = cli.Parser(prog="python -m tools.attribution",
                   description="every token rule's blame against the first wrong step (tools.attribution)")
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
    progress.check_lines(path)
    world = locate.World(args)
    for q in problems:
        q.setdefault("prompt", ds.prompt(world.tok, q))
    world.problems = problems
    K = 1 if args.responses else args.group_batch
    blocks = [range(f, min(f + K, len(problems))) for f in range(0, len(problems), K)]
    done_lines = progress.read_lines(path)
    done = {x["problem"] for x in done_lines if x.get("done")}
    done = {i for b in blocks if all(i in done for i in b) for i in b}  # a half-written block: Progress
    beyond = [x for x in done_lines if x["problem"] >= len(problems)]  # a larger --limit's: kept, not reported
    if args.rescore:  # every line kept: those of blocks not whole under this --limit are left as they are
        locate.rescore(world, path, done_lines, [b for b in blocks if b[0] in done])
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
        located = before = sum(1 for x in progress.read_lines(path) if "rollout" in x)
        world.say = lambda what: bar.set_postfix_str(f"located={located}" + (f", {what}" if what else ""))
        for block in todo:
            world.progress = saved = progress.Progress(out, block, args.device, given=bool(args.responses))
            if args.responses:
                write(given.run_given(world, block[0], problems[block[0]], write, scored))
            else:
                groups = saved.get("groups")
                if groups is None:
                    world.say(f"sampling the groups of {len(block)} problem" + "s" * (len(block) > 1))
                    groups = locate.sample_groups(world, block[0], [problems[i] for i in block])
                    saved.save(groups=groups)
                locate.run_block(world, block[0], groups, write, scored)
            world.progress = None
            saved.done()
            bar.update(len(block))
            located = sum(1 for x in progress.read_lines(path) if "rollout" in x)
            world.say("")
    if not args.rescore:  # every block of this --limit is written now
        progress.Progress.clear(out, blocks)
    lines = [x for x in progress.read_lines(path) if x["problem"] < len(problems)]
    text = report.report(out, lines, world.task is not None, time.time() - t0 if todo else None, located - before)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(f"`python -m tools.attribution {' '.join(argv if argv is not None else sys.argv[1:])}`\n\n{text}\n")
    print(text)
    located = [x for x in lines if "rollout" in x]  # report's figures: the page of every located, the AUCs of the sure
    figures = ((", auc.png" if any(report.confident(x) for x in located) else "")
               + (", rollouts.html" if located else ""))
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
        return given.load_responses(args)
    problems, skipped = data.load(args.dataset, "test", args.data_dir, args.limit, flag="--dataset")
    if not problems:
        sys.exit(f"--dataset {args.dataset}: no usable problem" + (f": {skipped[0]}" if skipped else ""))
    return problems
