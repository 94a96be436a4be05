"""Side-by-side runs: every method over the same seeds on the tiny default, one command, one directory.

    python -m tools.compare --threads 2          # every short --method of methods.py, seeds 0 1 2, 100 steps
    python -m tools.compare --methods grpo,ktae --seeds 0 --steps 20 --out runs/quick
    python -m tools.compare --methods grpo,ktae --seeds 0 --steps 20 --out runs/quick -- --lr 1e-4   # train.py flags
    python -m tools.compare --dataset chain --methods grpo,ktae,oar-g,oar-p,entropy --seeds 0,1,2,3,4 --out runs/chain
    python -m tools.compare --methods "ktae,ktae[ktae-alpha=0],ktae[ktae-no-tf]" --seeds 0,1,2 --jobs 2 --threads 1

A variant is a method with train.py flags of its own in brackets, `METHOD[flag=value,switch]` (`dapo[no-dynamic-
sampling]`, `ktae[ktae-beta=0,ktae-top=2]`): it runs beside the others under that name, in a folder of that name
(`ktae.ktae-alpha=0-seed0`), and every table and plot names it so. The flags after `--` go to every run; a flag may
not be given both there and in a variant. `--rules-file FILE` loads your own rules (README.md) for every run.

OUT (--out, or its alias --run-dir) is taken relative to the directory you run the command from, wherever
compare.py itself lies. --eval-every defaults to a quarter of --steps (4 evaluations, plus step 0).

Each run is `python /path/to/train.py --method M --seed S --run-dir OUT/M-seedS` in its own process. A seed fixes the
problems drawn and the sampling RNG, so every method sees the same problems at the same step (DAPO's extra
rounds of dynamic sampling draw further problems, so its batches drift from the others'). A run that already
finished is reused, one that was interrupted resumes from its checkpoint, and one stopped before its first
checkpoint starts over (train.py --overwrite), so a stopped comparison picks up where it was. A finished run's
checkpoint is deleted (--keep-checkpoints keeps it). An OUT's runs come from one machine (run.json records it):
another CPU makes other runs of the same seed, so to go on elsewhere give another OUT and pair the two folders with
`python -m tools.paired OUT OTHER`. Then OUT holds:
    paired.md paired_diffs.png paired_curves.png            the answer: every method against the first, paired by
                                                             seed, a 95 % interval, the smallest detectable
                                                             difference and a verdict (tools/paired.py)
    results.md                                               final accuracy mean +- std, length, minutes in steps,
                                                             the attribution metrics, and a line on each picture
    accuracy.png reward.png length.png entropy.png ess.png   a line per method (mean over seeds), band from the
                                                             lowest to the highest seed
    credit_auc.png credit_hit1.png credit_hit3.png credit_rank.png
                                                             diagnostics of the synthetic tasks only: how well the
                                                             rule's blame points at a wrong rollout's first error
                                                             (toyworld/credit.py)
    heatmaps/METHOD.html                                     the last evaluation's heat map (seed 0)
Minutes are marked "(shared)" where a run's CPU share says other work took its machine (tools/paired.py).
"""
import concurrent.futures
import os
import re
import shutil
import statistics
import subprocess
import sys

import data
import methods
from config import shared, training
from infra import checkpoint, cli, cpu, files, models, outfolder, plots
from tools import paired

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the project's root, one folder up

TRAIN = os.path.join(ROOT, "train.py")  # by its full path: compare.py may be run from any directory
OWN_FLAGS = ("--method", "--seed", "--steps", "--run-dir", "--eval-every", "--save-every", "--threads", "--resume",
             "--overwrite", "--dataset")  # set by compare.py itself for every run

PLOTS = {"accuracy.png": ("eval_accuracy", "greedy held-out accuracy"), "reward.png": ("reward_mean", "sampled reward"),
         "length.png": ("response_len", "response length (tokens)"), "entropy.png": ("entropy", "entropy"),
         "ess.png": ("ess_ratio", "ESS-ratio of the advantage (O7)"),
         "credit_auc.png": ("credit_auc", "first-error AUC (0.5: chance)"),
         "credit_hit1.png": ("credit_hit1", "first-error hit@1"),
         "credit_hit3.png": ("credit_hit3", "first-error hit@3"),
         "credit_rank.png": ("credit_rank", "first-error rank (1: most blamed)")}
CREDIT = ("credit_rank", "credit_hit1", "credit_hit3", "credit_auc")  # the table's attribution columns


def variant(name: str):
    """tools.paired.variant, a flag compare.py sets for every run refused inside the brackets."""
    return paired.variant(name, OWN_FLAGS + ("--rules-file",))


def run_name(method: str) -> str:
    """The folder name of a method's runs: a variant's brackets and commas, which a shell would read as a pattern,
    become dots ('ktae[ktae-alpha=0]' -> 'ktae.ktae-alpha=0'), any other character outside [A-Za-z0-9._=+-] '_'."""
    return re.sub(r"[^A-Za-z0-9._=+-]", "_", method.replace("[", ".").replace(",", ".").replace("]", ""))


def train_flags(method, seed, args) -> list:
    """The flags of train.py's run of method (a variant's flags after the shared ones) and seed."""
    name, own = variant(method)
    return ["--method", name, "--seed", str(seed), "--steps", str(args.steps),
            "--run-dir", os.path.join(args.out, f"{run_name(method)}-seed{seed}"), "--eval-every", str(args.eval_every),
            "--save-every", str(args.eval_every), "--dataset", args.dataset,
            *(["--threads", str(args.threads)] if args.threads else []),
            *(["--rules-file", args.rules_file] if args.rules_file else []), *args.train_args, *own]


def check_train_flags(p, chosen, seeds, args):
    """train.py's own checks (config/training.py) of every run's flags, before the first run starts: a flag it
    refuses would otherwise stop the comparison only when its run is reached, perhaps hours in. Two methods whose
    settings come out the same (ktae and ktae[ktae-alpha=1]) are refused: one run counted twice."""
    made = {}
    for method in chosen:
        try:
            name, own = variant(method)
        except ValueError as e:
            p.error(f"--methods: {e}")
        switches = {o for a in training.parser()._actions if a.nargs == 0 for o in a.option_strings}
        given = [w for w in method.partition("[")[2].rstrip("]").split(",") if "=" in w]
        valued = [w for w in given if "--" + w.split("=")[0].strip().lstrip("-") in switches]
        if valued:  # argparse would say "unrecognized arguments: 1" of the value alone
            p.error(f"--methods: {method}: {valued[0].split('=')[0].strip()} is a switch: give it without =value "
                    f"(or its --no- form, where it has one)")
        shared_flags = {f.split("=")[0] for f in args.train_args if f.startswith("--")}
        twice = [f for f in own if f.startswith("--") and f in shared_flags]
        if twice:
            p.error(f"--methods: {method}: {twice[0]} is also given after --, to every run: give it in one place")
        if name not in methods.names():
            p.error(f"--methods: unknown method {name!r} (choose from {', '.join(methods.names())}, or a variant "
                    f"METHOD[flag=value])")
        for seed in seeds:
            try:
                a = training.parse_args_one_line(train_flags(method, seed, args))
            except SystemExit as e:
                p.error(f"train.py refuses the flags of {method} seed {seed}: {e.code}")
        same = {k: v for k, v in vars(a).items() if k not in ("run_dir", "method")}
        for other, settings_ in made.items():
            if settings_ == same:
                p.error(f"--methods: {method} makes the same runs as {other} (its flags change nothing)")
        made[method] = same


def distinct(p, flag: str, text: str, given: list, key):
    """Refuse a name given twice in flag's list (as key sees it: ktae is grpo+ktae, 00 is 0): the run would be
    made once and counted twice, as two seeds that agree or two methods that tie."""
    seen = {}
    for g in given:
        if key(g) in seen:
            again = "given twice" if g == seen[key(g)] else f"is {seen[key(g)]} again"
            p.error(f"{flag} {text}: {g} {again}")
        seen[key(g)] = g


def parse_seeds(p, text: str) -> list:
    seeds = []
    for s in text.split(","):
        try:
            seeds.append(int(s))
        except ValueError:
            p.error(f"--seeds {text!r}: {s!r} is not a whole number (e.g. --seeds 0,1,2)")
        with shared.as_errors_of(p):
            shared.check_seed(seeds[-1], "--seeds")
    return seeds


def settings(args) -> dict:
    """What defines every run of OUT besides its method and seed, recorded in OUT (infra/outfolder.py): a later
    command with other values would reuse or resume runs made with these, and head their table with its own flags.
    A rules file is recorded by its content: one edited between two commands makes other runs."""
    named = defining_files(args)
    return {"--dataset": models.identity(args.dataset), "--steps": args.steps, "--eval-every": args.eval_every,
            "the train.py flags after --": spelled_out(args.train_args),
            # a recipe, model folder or data file named there, by its content: edited between two commands, it makes
            # other runs, which the recorded path alone would not show
            **({"files named after --": {k: v for k, v in named.items() if k != "--rules-file"}}
               if len(named) > ("--rules-file" in named) else {}),
            **({"--rules-file": named["--rules-file"]} if "--rules-file" in named else {})}


def split_methods(text: str) -> list:
    """--methods' names, split at the commas outside brackets: 'grpo,ktae[ktae-alpha=0,ktae-no-tf]' is two."""
    out, depth, word = [], 0, ""
    for c in text:
        depth += (c == "[") - (c == "]")
        if c == "," and depth == 0:
            out, word = out + [word.strip()], ""
        else:
            word += c
    return out + [word.strip()]


def rules_path(spec: str) -> str:
    """A --rules-file as the full path of its file (a module's name found as Python finds it), for train.py run from
    the project's root and for settings.json's record of its content."""
    import importlib.util
    if spec.endswith(".py") or os.path.isfile(spec):
        return os.path.abspath(spec)
    found = importlib.util.find_spec(spec)
    return found.origin if found and found.origin else spec


def defining_files(args) -> dict:
    """The files a run reads by a name given here, by their content (the rules file; a recipe, model folder or data
    file named after --): done.json records them, so that --overwrite redoes a run whose file changed since."""
    return {**({"--rules-file": models.identity(args.rules_file)} if args.rules_file else {}),
            **{w: models.identity(w) for w in spelled_out(args.train_args) if not w.startswith("--")
               and os.path.exists(w)}}


def spelled_out(flags: list) -> list:
    """Flags with every --flag=value as --flag value: two spellings of one setting are one setting."""
    return [w for f in flags for w in (f.split("=", 1) if f.startswith("--") and "=" in f else [f])]


def defining_flags(method, seed, args) -> list:
    """train_flags less --threads (which changes the speed, not the run), --run-dir (where, not what: a folder
    moved, or restored from a snapshot elsewhere, is reused) and --rules-file (settings.json records its content):
    what done.json records of a run."""
    return without(spelled_out(train_flags(method, seed, args)), ("--threads", "--run-dir", "--rules-file"))


def without(flags: list, names: tuple) -> list:
    """flags less each of names and its value (done.json of compare.py before 2026-11-29 holds --run-dir)."""
    out = list(flags)
    for name in names:
        if name in out:
            at = out.index(name)
            del out[at:at + 2]
    return out


def check_machine(p, chosen, seeds, args):
    """A run still to make goes to an OUT whose finished runs this machine made (or that records none): a run made
    on another machine does not pair with theirs (tools/paired.py), so it is refused before any run starts."""
    here = cpu.machine()
    if not os.path.isdir(args.out) or all(read_done(os.path.join(args.out, f"{run_name(m)}-seed{s}", "done.json"))
                                          for m in chosen for s in seeds):
        return  # nothing to run: the tables are remade from what is there
    for name in sorted(os.listdir(args.out)):
        run_dir = os.path.join(args.out, name)
        done = files.read_json(os.path.join(run_dir, "done.json"))
        if isinstance(done, dict) and recorded_machine(run_dir, done):
            was, made = recorded_machine(run_dir, done), "was made on"
        elif has_checkpoint(run_dir) and not args.overwrite:
            # unfinished: its checkpoint, resumed here, would finish as a run of two machines (--overwrite: begun again)
            was, made = recorded_machine(run_dir), "was begun on"
        else:
            continue
        if was not in (None, here):
            older = (", flags " in here and ", flags " not in was) and (
                " (recorded before the CPU's flags were: if step 0's eval_accuracy here equals theirs, this is their "
                "machine, and their records' \"machine\" may be set to this one's)")
            p.error(f"{run_dir} {made} {was}, this machine is {here}: its seeds would not pair with runs "
                    f"made here; choose another --out for them (tools.paired takes both folders){older or ''}")


def recorded_machine(run_dir: str, done=None):
    """The machine a run ran on: run.json's (train.py records it), or in a folder of a compare.py before 2026-12-07
    done.json's or machine.json's (which that compare.py wrote beside run.json); None where none records it."""
    for record in (checkpoint.read_info(run_dir), done, files.read_json(os.path.join(run_dir, "machine.json"))):
        if isinstance(record, dict) and record.get("machine"):
            return record["machine"]
    return None


def has_checkpoint(run_dir: str) -> bool:
    """Whether run_one would resume the run in run_dir (train.py --resume) rather than start it."""
    return any(os.path.isdir(os.path.join(run_dir, d)) for d in ("checkpoint", "checkpoint.prev"))


def read_done(done_path: str):
    """done.json's contents, or None where it is missing or unreadable (cut short by a kill while an older
    compare.py wrote it in place): that run is then resumed from its checkpoint, which redoes no finished step."""
    if not os.path.exists(done_path):
        return None
    done = files.read_json(done_path)
    if not isinstance(done, dict) or not isinstance(done.get("steps"), int):
        print(f"{done_path}: unreadable; its run is checked again", flush=True)
        return None
    return done


def run_one(method, seed, args):
    """Run (or resume, or reuse) one method and seed; return its metrics records."""
    run_dir = os.path.join(args.out, f"{run_name(method)}-seed{seed}")
    done_path = os.path.join(run_dir, "done.json")
    done = read_done(done_path)
    flags, defining = defining_flags(method, seed, args), defining_files(args)
    recorded = without(done.get("flags") or [], ("--run-dir",)) if done is not None else None
    same = recorded == flags and (done.get("files") or {}) == defining if done is not None else False
    if done is not None and (same or not args.overwrite):  # reused: made with these flags and files
        if not same:
            sys.exit(f"{run_dir}: finished with the train.py flags {' '.join(done.get('flags') or ['(not recorded)'])}"
                     f", not {' '.join(flags)}: start it over with --overwrite, or choose another --out")
        return checkpoint.read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    cmd = [sys.executable, TRAIN, *train_flags(method, seed, args)]
    resuming = not args.overwrite and has_checkpoint(run_dir)
    # a run stopped before its first checkpoint left a metrics file that train.py would refuse to start over on
    leftover = not resuming and os.path.isdir(run_dir) and bool(os.listdir(run_dir))
    extra = ["--resume"] if resuming else ["--overwrite"] if leftover else []
    what = "resuming" if resuming else "restarting (no checkpoint to resume)" if leftover else "running"
    print(f"{what} {method} seed {seed}: {' '.join(cmd[1:] + extra)}", flush=True)
    if args.jobs > 1:  # runs side by side: each one's progress bars and messages to its own log, not interleaved
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, "train.log"), "a") as log:
            rc = subprocess.run(cmd + extra, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
        where = f"its message is in {os.path.join(run_dir, 'train.log')}"
    else:
        rc = subprocess.run(cmd + extra, cwd=ROOT).returncode
        where = "its message is above"
    if rc:
        # not "the same command picks up from it": where train.py refused the folder (a run.json edited by hand), it
        # refuses again until the cause is dealt with
        sys.exit(f"{method} seed {seed}: train.py exited with status {rc} ({where}); {run_dir} is kept: once what "
                 f"that message says is dealt with, the same command resumes it (or --overwrite starts it over)")
    print(f"finished {method} seed {seed}", flush=True)
    files.write_json(done_path, {"method": method, "seed": seed, "steps": args.steps, "flags": flags,
                                 **({"files": defining} if defining else {})})  # the machine: run.json's
    if not args.keep_checkpoints:  # done.json first: a kill between the two leaves a finished run, not a lost one
        for d in ("checkpoint", "checkpoint.prev", "checkpoint.tmp"):  # 3 GB a SmolLM2 run: 55 of them fill a disk
            shutil.rmtree(os.path.join(run_dir, d), ignore_errors=True)
    return checkpoint.read_metrics(os.path.join(run_dir, "metrics.jsonl"))


def run_all(chosen: list, seeds: list, args) -> dict:
    """Every run, seed by seed (each method's seed 0 before any seed 1: a comparison stopped part way holds whole
    seeds to pair), args.jobs at a time; {method: [records of each seed]}. A run that fails does not stop the
    others (hours of them, with --jobs 2 already under way): each failure is named at the end, and the same command
    picks up from there."""
    order = [(m, s) for s in seeds for m in chosen]
    done, failed = {}, []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:  # threads that each wait on a train.py process
        futures = {pool.submit(run_one, *ms, args): ms for ms in order}
        try:
            for f in concurrent.futures.as_completed(futures):
                try:
                    done[futures[f]] = f.result()
                except SystemExit as e:  # run_one's one line
                    print(e.code, flush=True)
                    failed.append((order.index(futures[f]), str(e.code)))
        except BaseException:  # Ctrl-C: no further run starts; those running are stopped with this process group
            for f in futures:
                f.cancel()
            raise
    failed = [x for _, x in sorted(failed)]  # in the runs' order, not the order they ended
    if failed:
        sys.exit(failed[0] if len(failed) == 1 else f"{len(failed)} runs failed (each named above): " + "; ".join(
            x.split(":")[0] for x in failed))
    return {m: [done[(m, s)] for s in seeds] for m in chosen}


def step_mean(runs: list, key: str, fmt: str) -> str:
    """The mean of key over every step of every run that logged it ('n/a' for runs from before it was logged): how
    many groups a step's advantage acts on (groups_trained: those mixing right and wrong), and the share of tokens a
    rule moved off their rollout's A_i (tokens_reshaped)."""
    values = [r[key] for recs in runs for r in recs if r.get(key) is not None]
    return format(statistics.mean(values), fmt) if values else "n/a"


def shared_mark(runs: list) -> str:
    """' (shared)' where a run's median time_cpu_share says other work took its machine (tools/paired.py SHARED)."""
    shares = [paired.cpu_share(recs) for recs in runs]
    return " (shared)" if any(x is not None and x < paired.SHARED for x in shares) else ""


# What each picture of OUT answers, a line each, the answer first and the diagnostics after (results.md)
PICTURES = (("paired_diffs.png", "the answer: each method's paired difference from the first method, with its 95 % "
                                 "interval, at equal steps and at the first method's wall-clock"),
            ("paired_curves.png", "greedy held-out accuracy over steps, each method beside the first one"),
            ("accuracy.png", "every method's greedy held-out accuracy on one plot"),
            ("reward.png", "diagnostic: the sampled rollouts' mean reward (training accuracy)"),
            ("length.png", "diagnostic: response length, which a rule can move without gaining accuracy"),
            ("entropy.png", "diagnostic: the sampler's entropy (falling fast: the policy collapsing)"),
            ("ess.png", "diagnostic: how evenly the advantage spreads over tokens (O7; 1: every token alike)"),
            ("credit_auc.png", "diagnostic, synthetic tasks only: how well the rule's blame ranks a wrong rollout's "
                               "first wrong token above the rest (0.5: chance)"),
            ("credit_hit1.png", "diagnostic, synthetic tasks only: the share of wrong rollouts whose most blamed "
                                "token is the first wrong one"),
            ("credit_hit3.png", "diagnostic, synthetic tasks only: ... among the three most blamed"),
            ("credit_rank.png", "diagnostic, synthetic tasks only: the first wrong token's rank in the blame (1: top)"))


def mean_std(values: list) -> str:
    """'mean +- std' over seeds ('nan' when no seed has a value); mean_std([1, 3]) == '2.000 +- 1.414'."""
    values = [v for v in values if v == v]
    if not values:
        return "nan"
    return f"{statistics.mean(values):.3f} +- {statistics.stdev(values) if len(values) > 1 else 0.0:.3f}"


def credit_columns(runs: list) -> list:
    """Each attribution metric: per seed the mean over its steps that logged one, then mean +- std over seeds."""
    cols = []
    for key in CREDIT:
        per_seed = [[r[key] for r in recs if r.get(key) is not None] for recs in runs]
        cols.append(mean_std([statistics.mean(v) if v else float("nan") for v in per_seed]))
    return cols


def table(results: dict) -> str:
    """results: {method: [records of each seed]} -> a Markdown table. Minutes are those spent in steps (time_step:
    sampling to optimizer step, evaluations left out), counted at the run's median step (paired.seconds_to): a run
    paused or sharing the CPU for a while is not charged for it, as a sum of its steps would be. The last four
    columns: credit.py's attribution of the first error (synthetic tasks; nan elsewhere)."""
    lines = ["| method | seeds | greedy accuracy before | after (mean +- std) | response length after | "
             "ESS-ratio (last 20 steps) | groups trained a step | tokens reshaped | minutes in steps per run | "
             "first-error rank | hit@1 | hit@3 | AUC |", "|---" * 13 + "|"]
    for method, runs in results.items():
        evals = [[r for r in recs if "eval_accuracy" in r] for recs in runs]
        if not all(evals):  # a run evaluated nowhere (--no-final-eval, --eval-every past --steps): no accuracy
            lines.append(f"| {method} | {len(runs)} | n/a | n/a (a run has no evaluation) | n/a | n/a | n/a | n/a | "
                         f"n/a | "
                         f"{' | '.join(credit_columns(runs))} |")
            continue
        after = [e[-1]["eval_accuracy"] for e in evals]
        steps = [[r for r in recs if "ess_ratio" in r][-20:] for recs in runs]
        timed = [recs for recs in runs if any("time_step" in r for r in recs)]  # an untimed run has no minutes
        minutes = [paired.seconds_to(recs)[max(r["step"] for r in recs if "time_step" in r)] / 60 for recs in timed]
        ess = [r["ess_ratio"] for s in steps for r in s
               if r["ess_ratio"] is not None and r["ess_ratio"] == r["ess_ratio"]]
        ess = statistics.mean(ess) if ess else float("nan")  # null (NaN) on a step with no advantage at all
        std = statistics.stdev(after) if len(after) > 1 else 0.0
        before = [e[0]["eval_accuracy"] for e in evals if e and e[0]["step"] == 0]  # --no-final-eval: none at step 0
        lines.append(f"| {method} | {len(runs)} | "
                     f"{f'{statistics.mean(before):.3f}' if len(before) == len(evals) else 'n/a'} | "
                     f"{statistics.mean(after):.3f} +- {std:.3f} | "
                     f"{mean_std([e[-1]['eval_response_len'] for e in evals])} | {ess:.3f} | "
                     f"{step_mean(runs, 'groups_trained', '.1f')} | {step_mean(runs, 'tokens_reshaped', '.3f')} | "
                     f"{f'{statistics.mean(minutes):.1f}' if minutes else 'n/a'}{shared_mark(runs)} | "
                     f"{' | '.join(credit_columns(runs))} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = cli.Parser(description=__doc__.split("\n")[0])
    p.add_argument("--methods", default=",".join(methods.short_names()),
                   help="comma-separated --method names, or variants METHOD[flag=value,...] run beside them, e.g. "
                        "\"ktae,ktae[ktae-alpha=0]\" (default: %(default)s)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=100, help="per run (default: %(default)s)")
    p.add_argument("--eval-every", type=int, default=None, help="greedy evaluation (and checkpoint) every N steps "
                                                                 "(default: steps / 4, at least 1)")
    p.add_argument("--out", "--run-dir", dest="out", default="runs/compare",
                   help="directory of the comparison, relative to where you run the command (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch in every train.py run (default: "
                                                             "torch's choice; on a shared machine pass what is yours)")
    p.add_argument("--dataset", default=data.DEFAULT, help="the training problems of every run (train.py --dataset: "
                                                           "tiny, chain, ...)")
    p.add_argument("--overwrite", action="store_true",
                   help="start every run over (train.py --overwrite) in an OUT made with other settings")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time, each its own process (default: %(default)s; "
                                                       "on 2 cores: --jobs 2 --threads 1)")
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="keep each finished run's checkpoint (by default it is deleted once the run's done.json is "
                        "written: the tables need only the metrics, and a SmolLM2 run's checkpoint takes about 3 GB)")
    p.add_argument("--rules-file", default=None, metavar="FILE",
                   help="a file (or module) of your own token rules (README.md, \"Adding a token rule\"), loaded for "
                        "every run")
    p.add_argument("train_args", nargs="*", help="more train.py flags, after --, e.g. -- --lr 1e-4")
    args = p.parse_args(argv)
    if args.rules_file:  # before the names are checked: its rules are methods, its knobs flags
        args.rules_file = rules_path(args.rules_file)  # by its file, as every run loads it
        try:
            methods.load_rules(args.rules_file)
        except ValueError as e:
            p.error(str(e))
    chosen, seeds = split_methods(args.methods), parse_seeds(p, args.seeds)
    for m in chosen:  # a wrong name or variant fails now, not after the first runs
        try:
            if variant(m)[0] not in methods.names():
                raise ValueError(f"unknown method {variant(m)[0]!r} (choose from {', '.join(methods.names())}, or "
                                 f"a "
                                 f"variant METHOD[flag=value,...])")
        except ValueError as e:
            p.error(f"--methods: {e}")
    distinct(p, "--methods", args.methods, chosen, lambda m: (methods.parse(variant(m)[0]), tuple(variant(m)[1])))
    names = {}
    for m in chosen:  # two variants in one folder: ktae[a,b] and ktae.a.b would share it
        if names.setdefault(run_name(m), m) != m:
            p.error(f"--methods: {m} and {names[run_name(m)]} would share the folder {run_name(m)}-seedS")
    distinct(p, "--seeds", args.seeds, seeds, int)
    with shared.as_errors_of(p):
        shared.at_least(args, {"steps": 1, "eval_every": 1, "jobs": 1})
    if shared.threads_problem(args.threads):
        p.error(f"--threads {args.threads}: {shared.threads_problem(args.threads)}")
    if args.eval_every is None:
        args.eval_every = max(1, args.steps // 4)
    for flag in args.train_args:
        if flag.split("=")[0] in OWN_FLAGS:
            p.error(f"{flag.split('=')[0]} after --: compare.py sets it for every run (use compare.py's own flag)")
    args.out = os.path.abspath(args.out)  # the user's cwd, not train.py's
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        p.error(f"--out {args.out}: a file, not a folder")
    for m in chosen:  # found now, not when the run is reached after hours of others
        for s in seeds:
            where = os.path.join(args.out, f"{run_name(m)}-seed{s}")
            if os.path.exists(where) and not os.path.isdir(where):
                p.error(f"{where}: a file where the run of {m} seed {s} goes; move it away")
    check_train_flags(p, chosen, seeds, args)
    check_machine(p, chosen, seeds, args)
    # OUT's runs all made with these settings, by one comparison at a time: the lock is held to the end
    finished = os.path.isfile(os.path.join(args.out, "results.md")) or any(
        isinstance(files.read_json(os.path.join(args.out, f"{run_name(m)}-seed{s}", "done.json")), dict)
        for m in chosen for s in seeds)
    lock = outfolder.claim(args.out, settings(args), args.overwrite, finished)
    try:
        results = run_all(chosen, seeds, args)
    except KeyboardInterrupt:  # Ctrl-C: the runs under way keep their last checkpoint, finished ones their done.json
        sys.exit(f"interrupted: {args.out} keeps every finished run and each stopped run's last checkpoint; the same "
                 f"command picks up from there")
    drawn = []
    for name, (key, label) in PLOTS.items():
        if not any(r.get(key) is not None for recs in results.values() for run in recs for r in run):
            continue  # the credit_* metrics exist on the synthetic tasks only: no empty picture
        plots.curves(os.path.join(args.out, name), key, results, label,
                     title=f"{label}, {len(chosen)} methods x {args.steps} steps")
        drawn.append(name)
    os.makedirs(os.path.join(args.out, "heatmaps"), exist_ok=True)
    for m in chosen:
        maps = os.path.join(args.out, f"{run_name(m)}-seed{seeds[0]}", "heatmaps")
        if os.path.isdir(maps) and os.listdir(maps):
            last = max(os.listdir(maps), key=lambda f: int(f[4:-5]))  # stepN.html
            shutil.copy(os.path.join(maps, last), os.path.join(args.out, "heatmaps", f"{run_name(m)}.html"))
    md = table(results)
    verdict, failed = "", None
    if len(chosen) > 1:  # every method against the first one, paired by seed, only the runs of this command
        try:
            verdict = paired.write(args.out, baseline=chosen[0], only={(m, s) for m in chosen for s in seeds})
        except (ValueError, OSError) as e:
            verdict, failed = getattr(e, "table", ""), f"tools.paired: {e}"
    if os.path.isfile(os.path.join(args.out, "paired.md")) and verdict and not failed:
        drawn += ["paired_diffs.png", "paired_curves.png"]
    pictures = "".join(f"- `{name}`: {what}\n" for name, what in PICTURES if name in drawn)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(f"`python -m tools.compare --dataset {args.dataset} --methods \"{args.methods}\" --seeds {args.seeds} "
                f"--steps {args.steps} --eval-every {args.eval_every}"
                f"{f' --rules-file {args.rules_file}' if args.rules_file else ''}{' -- ' * bool(args.train_args)}"
                f"{' '.join(args.train_args)}`\n\n" + md
                + ("\nThe verdict, against the first method: paired.md (tools/paired.py).\n" if "paired_diffs.png" in
                   drawn else "\nNo paired verdict (no pair of runs with evaluations to compare).\n" if
                   len(chosen) > 1 else "")
                + "\nThe pictures, the answer first:\n" + pictures)
    print(md)
    print(verdict)
    if failed:
        sys.exit(failed)
    lock.close()
    return results


if __name__ == "__main__":
    main()
