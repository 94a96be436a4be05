"""Each method against a baseline on the same seeds: the paired difference of held-out accuracy, with its interval.

    python -m tools.paired runs/compare                    # every method of a tools.compare folder against grpo
    python -m tools.paired runs/compare --baseline dapo --threshold 0.5
    python -m tools.paired runs/cmp-epyc runs/cmp-xeon     # one comparison run on two machines, a folder each

Reads the finished runs of a tools.compare folder (OUT/METHOD-seedS with done.json; a comparison still under way
gives the seeds both runs of a pair have finished) and writes
    OUT/paired.md          per method: accuracy at the last step, the paired difference (same seed) with a 95 %
                           t-interval and the smallest detectable difference, the same at the baseline's wall-clock,
                           response length, minutes, steps to --threshold, each for the method and the baseline
    OUT/paired_curves.png  a panel per method: its greedy accuracy over steps beside the baseline's (whose runs: their
                           seeds, and folders), mean and the seeds' range; the task in the title (task_title)
    OUT/paired_diffs.png   the paired differences, each seed's own and the mean with its interval, at equal steps and
                           at equal wall-clock; the axis at +-0.4 or wider, an interval beyond it cut and its ends said

Why paired: a seed fixes the problems each step draws and the held-out set, so two methods' runs of one seed differ
only by the method (and sampling noise); the seed-to-seed spread, which is large on a small model, cancels in the
difference. Only on one machine, though: another CPU sums floats in another order, so the same seed gives other greedy
answers from step 0 on (SmolLM2 on arith: 0.164 on an AMD EPYC, 0.180 on a Xeon) and other runs. A comparison spread
over machines keeps a folder per machine (tools.compare refuses to mix them) and names them all here: a pair is a seed
within one folder, and the intervals take the pairs of every folder. The table and PNGs go to the first. The verdict
is three words with one margin both ways (verdict): "better" is the criterion docs/LOG.md stated before issue 62's
runs (the interval's lower end above 0 and a mean difference of at least MARGIN), "worse" its mirror, and "not
detectable at this size" the rest, beside the smallest difference those seeds could have detected (infra/stats.py).
Any method can be the baseline (--baseline), a variant too: `--baseline "ktae"` for `ktae[ktae-alpha=0]`.

Equal wall-clock: each run's seconds in steps (metrics' time_step, sampling to optimizer step, evaluations left out;
its median step times the steps, robust to a machine shared for a while); a method is read when it had spent the
baseline's time for all its steps, its accuracy interpolated linearly in time between the two evaluations around that
moment (a method faster than the baseline is read at its last step: the runs stop at --steps). The rows read before
their first evaluation after step 0 are named under the table. The times are those of the machine the runs shared.

Equal sampled groups (only for a method that samples another number of groups than the baseline: DAPO's dynamic
sampling, D2): the method read when it had sampled as many groups of rollouts as the baseline did in all its steps
(metrics' groups_generated), interpolated between evaluations as above: its gain per step less the extra samples.
"""
import hashlib
import json
import math
import os
import statistics

from infra import checkpoint, cli
from infra.stats import T975, detectable, interval, t975  # noqa: F401 (paired.interval, ...)

MARGIN = 0.03  # docs/LOG.md 2026-11-28: the smallest mean difference that counts as better, stated before the runs
# (and, since 2026-12-07, as worse: one margin both ways)
SHARED = 0.8  # a run whose median time_cpu_share (logbook.step_record) is below this shared its machine with other work


def variant(name: str, own_flags: tuple = ()):
    """'ktae[ktae-alpha=0,ktae-no-tf]' -> ('ktae', ['--ktae-alpha', '0', '--ktae-no-tf']); 'ktae' -> ('ktae', []).
    A refusal is ValueError(one line); own_flags: flags a variant may not set (tools.compare's own)."""
    method, bracket, inner = name.partition("[")
    if not bracket:
        return name, []
    if not inner.endswith("]") or "[" in inner or not inner[:-1].strip():
        raise ValueError(f"{name}: a variant is METHOD[flag=value,...] with at least one flag, e.g. ktae[ktae-alpha=0]")
    flags = []
    for item in inner[:-1].split(","):
        key, eq, value = (part.strip() for part in item.partition("="))
        flag = "--" + key.lstrip("-")
        if flag in own_flags:
            raise ValueError(f"{name}: {flag} is set by compare.py for every run (use compare.py's own flag)")
        flags += [flag, value] if eq else [flag]
    return method, flags


def evals(recs: list) -> dict:
    """{step: greedy held-out accuracy} of a run's records."""
    return {r["step"]: r["eval_accuracy"] for r in recs if "eval_accuracy" in r}


def seconds_to(recs: list) -> dict:
    """{step: seconds in steps up to that step}, each step counted at the run's median time_step: a run that shared
    the CPU with other work for a while, or was paused (kill -STOP) mid-step, has a few steps many times their
    usual length, which a sum would charge to the method."""
    times = [r["time_step"] for r in recs if "time_step" in r]
    median = statistics.median(times) if times else 0.0
    return {s: s * median for s in {0, *(r["step"] for r in recs)}}


def groups_to(recs: list) -> dict:
    """{step: groups of rollouts sampled up to that step} (metrics' groups_generated: with DAPO's dynamic sampling,
    every round's, kept or not), for the reading at equal sampled groups; a run that logged none: {}."""
    per = {r["step"]: r["groups_generated"] for r in recs if "groups_generated" in r}
    if not per:
        return {}
    out, total = {0: 0}, 0
    for s in sorted({r["step"] for r in recs} - {0}):
        total += per.get(s, 0)
        out[s] = total
    return out


def accuracy_within(recs: list, seconds: float, spent: dict = None) -> float:
    """The run's accuracy after `seconds` of steps: interpolated linearly in time between the two evaluations around
    that moment, so that a run 1 % slower than the baseline is not read a whole evaluation earlier (at the last grid
    point it reached); past its last evaluation, that one's (the run stopped at --steps). accuracy_within of a run
    evaluated at steps 0 (0.2) and 10 (0.5), 1 s a step, at 4 s: 0.2 + 0.4 * 0.3 = 0.32. spent: another cost than
    seconds, {step: cost so far} (groups_to's: the accuracy after that many sampled groups)."""
    acc, spent = evals(recs), seconds_to(recs) if spent is None else spent
    points = sorted((spent.get(s, math.inf), a) for s, a in acc.items())
    before = [p for p in points if p[0] <= seconds * (1 + 1e-9)]
    after = [p for p in points if p[0] > seconds * (1 + 1e-9) and p[0] < math.inf]
    if not before:  # no evaluation by then (none at step 0: --no-final-eval): no reading, not a guess
        return math.nan
    if not after:
        return before[-1][1]
    (t0, a0), (t1, a1) = before[-1], after[0]
    return a0 + (a1 - a0) * (seconds - t0) / (t1 - t0)


def first_evaluation_time(recs: list, spent: dict = None) -> float:
    """The seconds of steps to the run's first evaluation after step 0: a wall-clock reading before it is mostly the
    untrained model's (tools.paired says which rows read so). spent: another cost, as accuracy_within's."""
    acc, spent = evals(recs), seconds_to(recs) if spent is None else spent
    later = [spent.get(s, math.inf) for s in acc if s > 0]
    return min(later) if later else math.inf


def steps_to(recs: list, threshold: float):
    """The first evaluated step whose accuracy is at least threshold, or None."""
    return next((s for s, a in sorted(evals(recs).items()) if a >= threshold), None)


def finished(*outs: str, only=None) -> dict:
    """{method: {seed: records}} of the runs in a tools.compare folder that finished (done.json); of several
    folders (a machine each), {method: {(folder's place, seed): records}}, so that a pair never spans two.

    Only runs of the comparison are joined, each once: `only` ({(method, seed)}, tools.compare's runs of this
    command) or else the runs whose done.json agrees with their folder's settings.json (a run left from an earlier
    command with other flags is left out, and said). Refused in one line (ValueError): a folder named twice (directly
    or through a link), two finished runs of one method and seed in a folder (a backup copy beside the run), the same
    run in two places (a copied folder), a finished run without its metrics. A run with no evaluation, or an
    accuracy that is not a number, is left out and said."""
    real = [os.path.realpath(o) for o in outs]
    for o, r in zip(outs, real):
        if real.count(r) > 1:
            raise ValueError(f"{o}: named twice (directly or through a link): its runs would count as more seeds")
    runs, where, seen = {}, {}, {}
    for i, out in enumerate(outs):
        settings = checkpoint.read_json(os.path.join(out, "settings.json"))
        for name in sorted(os.listdir(out)):
            run_dir = os.path.join(out, name)
            done = checkpoint.read_json(os.path.join(run_dir, "done.json"))
            if not (isinstance(done, dict) and "method" in done and "seed" in done):
                continue
            method, seed = done["method"], done["seed"]
            if only is not None and (method, seed) not in only:
                continue
            why = disagrees(done, settings) if only is None else None
            if why:
                print(f"{run_dir}: left out, {why}")
                continue
            key = (i, seed) if len(outs) > 1 else seed
            if key in where.setdefault(method, {}):
                raise ValueError(f"{where[method][key]} and {run_dir}: both a finished {method} run of seed {seed}; "
                                 f"move one out of {out} (a backup?), or the pairing would take either")
            path = os.path.join(run_dir, "metrics.jsonl")
            if not os.path.isfile(path):
                raise ValueError(f"{run_dir}: finished (done.json) but without its metrics.jsonl")
            with open(path, "rb") as f:  # a run's own record: two folders holding it are a copy, not two machines
                digest = (method, seed, hashlib.sha256(f.read()).hexdigest())
            if digest in seen:
                raise ValueError(f"{seen[digest]} and {run_dir}: the same run twice (a copied folder?): it would "
                                 f"count as two seeds")
            recs = checkpoint.read_metrics(path)
            bad = [r["step"] for r in recs if "eval_accuracy" in r and not (
                isinstance(r["eval_accuracy"], (int, float)) and math.isfinite(r["eval_accuracy"]))]
            if bad or not evals(recs):
                print(f"{run_dir}: left out, " + (f"its eval_accuracy at step {bad[0]} is not a number" if bad else
                                                  "it has no evaluation (--no-final-eval with no --eval-every step?)"))
                continue
            seen[digest], where[method][key] = run_dir, run_dir
            runs.setdefault(method, {})[key] = recs
    return runs


def disagrees(done: dict, settings) -> str:
    """Why a finished run was not made under its folder's settings.json (tools.compare's settings), or None: its
    --steps, --eval-every, --dataset and the train.py flags after -- must be those recorded for the folder."""
    if not isinstance(settings, dict):
        return None
    flags = [w for w in done.get("flags") or []]
    value = lambda flag: flags[flags.index(flag) + 1] if flag in flags[:-1] else None  # noqa: E731
    if "--steps" in settings and str(settings["--steps"]) != str(done.get("steps")):
        return f"made with --steps {done.get('steps')}, not the folder's {settings['--steps']}"
    if "--eval-every" in settings and value("--eval-every") not in (None, str(settings["--eval-every"])):
        return f"made with --eval-every {value('--eval-every')}, not the folder's {settings['--eval-every']}"
    after = settings.get("the train.py flags after --")
    if after is not None and "--dataset" in flags[:-1]:
        at = flags.index("--dataset") + 2
        if at < len(flags) and flags[at] == "--run-dir":  # compare.py before 2026-11-29 recorded it
            at += 2
        try:
            own = variant(done["method"])[1]
        except ValueError:
            own = []
        if flags[at:] != after + own:  # the folder's flags after --, then the variant's own, and nothing else
            return (f"made with the train.py flags {' '.join(flags[at:]) or '(none)'}, not the folder's "
                    f"{' '.join(after + own) or '(none)'}")
    return None


def run_mean(recs: list, key: str):
    """The mean of key over a run's steps that logged it (the first-error AUC: toyworld/credit.py), or None."""
    values = [r[key] for r in recs if r.get(key) is not None and r[key] == r[key]]
    return statistics.mean(values) if values else None


def ranks(v: list) -> list:
    """Ranks from 0, tied values sharing their mean rank: ranks([0.3, 0.1, 0.3]) == [1.5, 0, 1.5]."""
    order = sorted(range(len(v)), key=lambda i: v[i])
    out = [0.0] * len(v)
    k = 0
    while k < len(order):
        j = k
        while j + 1 < len(order) and v[order[j + 1]] == v[order[k]]:
            j += 1
        for i in order[k:j + 1]:
            out[i] = (k + j) / 2
        k = j + 1
    return out


def spearman(x: list, y: list) -> float:
    """Rank correlation: Pearson's over the ranks (ties share their mean rank). spearman([1, 2, 3], [3, 1, 2]):
    ranks [0, 1, 2] and [2, 0, 1], deviations [-1, 0, 1] and [1, -1, 0]: -1 / 2 = -0.5."""
    rx, ry = ranks(x), ranks(y)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return cov / var if var else float("nan")


def verdict(mean: float, low: float, high: float) -> str:
    """Three words, one margin both ways: "better" where the interval lies above 0 and the mean is at least +MARGIN
    (the criterion stated before issue 62's runs), "worse" where it lies below 0 and the mean is at most -MARGIN,
    else "not detectable at this size" (which is not "no difference": see the smallest detectable one beside it)."""
    if mean != mean:  # no reading (a run with no step timed has no wall-clock)
        return "n/a"
    if low > 0 and mean >= MARGIN:
        return "better"
    if high < 0 and mean <= -MARGIN:
        return "worse"
    return "not detectable at this size"


def cpu_share(recs: list):
    """A run's median time_cpu_share over its steps (None where its metrics predate it)."""
    shares = [r["time_cpu_share"] for r in recs if r.get("time_cpu_share") is not None]
    return statistics.median(shares) if shares else None


def rows(runs: dict, baseline: str, threshold: float) -> list:
    """A row per method other than the baseline, over the seeds both have finished."""
    base, out = runs[baseline], []
    for method, seeds in runs.items():
        common = sorted(set(seeds) & set(base))
        if method == baseline or not common:
            continue
        last = [max(evals(seeds[s])) for s in common]
        acc = [evals(seeds[s])[step] for s, step in zip(common, last)]
        d_step = [a - evals(base[s])[step] for s, a, step in zip(common, acc, last)]
        # a run with no step timed (metrics from before time_step) has no wall-clock: n/a, not 0 seconds
        timed = all(any("time_step" in r for r in x) for s in common for x in (seeds[s], base[s]))
        budget = {s: seconds_to(base[s])[max(evals(base[s]))] for s in common} if timed else {}
        d_wall = [accuracy_within(seeds[s], budget[s]) - evals(base[s])[max(evals(base[s]))] for s in common] \
            if timed else [math.nan]
        early = sum(budget[s] < first_evaluation_time(seeds[s]) for s in common) if timed else 0
        # equal sampled groups, where the two sample different numbers of groups (DAPO's dynamic sampling, D2): the
        # method read when it had sampled the baseline's groups, interpolated as the wall-clock reading is
        drawn = {s: (groups_to(seeds[s]), groups_to(base[s])) for s in common}
        d_groups = [accuracy_within(seeds[s], b[max(evals(base[s]))], m) - evals(base[s])[max(evals(base[s]))]
                    for s, (m, b) in drawn.items()] \
            if all(m and b for m, b in drawn.values()) and any(m != b for m, b in drawn.values()) else None
        length = [[r["eval_response_len"] for r in seeds[s] if "eval_response_len" in r][-1]
                  - [r["eval_response_len"] for r in base[s] if "eval_response_len" in r][-1] for s in common]
        minutes = [seconds_to(seeds[s])[max(evals(seeds[s]))] / 60 for s in common] if timed else [math.nan]
        base_minutes = [seconds_to(base[s])[max(evals(base[s]))] / 60 for s in common] if timed else [math.nan]
        reach = [steps_to(seeds[s], threshold) for s in common]
        blame = [run_mean(seeds[s], "credit_auc") for s in common]
        shares = [x for s in common for x in (cpu_share(seeds[s]), cpu_share(base[s])) if x is not None]
        out.append(dict(method=method, seeds=common, step=max(last), accuracy=interval(acc),
                        auc=interval(blame) if None not in blame else None,
                        base_accuracy=interval([evals(base[s])[max(evals(base[s]))] for s in common]),
                        d_step=interval(d_step), d_wall=interval(d_wall), d_length=interval(length),
                        d_step_seeds=d_step, d_wall_seeds=d_wall,
                        mdd_step=detectable(d_step), mdd_wall=detectable(d_wall),
                        d_groups=interval(d_groups) if d_groups else None,
                        mdd_groups=detectable(d_groups) if d_groups else None,
                        groups=[(max(m.values()), max(b.values())) for m, b in drawn.values()] if d_groups else None,
                        early_groups=sum(b[max(evals(base[s]))] < first_evaluation_time(seeds[s], m)
                                         for s, (m, b) in drawn.items()) if d_groups else 0,
                        length=statistics.mean([[r["eval_response_len"] for r in seeds[s] if "eval_response_len" in r]
                                                [-1] for s in common]),
                        base_length=statistics.mean([[r["eval_response_len"] for r in base[s]
                                                      if "eval_response_len" in r][-1] for s in common]),
                        minutes=statistics.mean(minutes), base_minutes=statistics.mean(base_minutes),
                        cpu_share=min(shares) if shares else None, early=early,
                        reach=reach, base_reach=[steps_to(base[s], threshold) for s in common]))
    return out


def _ci(m: tuple, sign: bool = True) -> str:
    mean, low, high = m
    if mean != mean:
        return "n/a"
    f = "{:+.3f}" if sign else "{:.3f}"
    return f.format(mean) + ("" if low != low else f" [{f.format(low)}, {f.format(high)}]")


def _minutes(m: float) -> str:
    return "n/a" if m != m else f"{m:.1f}"


def _mdd(x: float) -> str:
    return "n/a" if x != x else f"+-{x:.3f}"


def _shared(r: dict) -> str:
    return " (shared)" if r["cpu_share"] is not None and r["cpu_share"] < SHARED else ""


def table(rows_: list, baseline: str, threshold: float) -> str:
    b = baseline
    lines = [f"Each method against `{b}`, paired by seed (the same problems, the same machine). A difference is the "
             f"mean over seeds of (method - {b}) in greedy held-out accuracy, [its 95 % t-interval]. Verdict: "
             f"**better** = the interval above 0 and the mean at least +{MARGIN}; **worse** = the interval below 0 "
             f"and the mean at most -{MARGIN}; else **not detectable at this size**. Detectable: the smallest true "
             f"difference these seeds would find 80 % of the time (infra/stats.py): a smaller one may be there "
             f"unseen. Equal steps: both read at the last evaluation. {b}'s wall-clock: the method read when it had "
             f"spent {b}'s time in steps (each run's median step time x steps, robust to a machine paused or shared "
             f"for a while), its accuracy interpolated linearly in time between the evaluations around that moment.",
             "",
             f"| method | seeds | accuracy at last step: method / {b} | difference, equal steps | detectable | verdict "
             f"| difference, {b}'s wall-clock | detectable | verdict | response length, tokens: method / {b} | "
             f"minutes in steps: method / {b} | steps to {threshold}: method / {b} (none: not reached) |",
             "|---" * 12 + "|"]
    reach = lambda xs: ", ".join("none" if x is None else str(x) for x in xs)  # noqa: E731
    for r in rows_:
        lines.append(f"| {r['method']} | {len(r['seeds'])} | {_ci(r['accuracy'], False)} / "
                     f"{_ci(r['base_accuracy'], False)} | {_ci(r['d_step'])} | {_mdd(r['mdd_step'])} | "
                     f"{verdict(*r['d_step'][:3])} | {_ci(r['d_wall'])} | {_mdd(r['mdd_wall'])} | "
                     f"{verdict(*r['d_wall'][:3])} | {r['length']:.1f} / {r['base_length']:.1f} | "
                     f"{_minutes(r['minutes'])} / {_minutes(r['base_minutes'])}{_shared(r)} | "
                     f"{reach(r['reach'])} / {reach(r['base_reach'])} |")
    early = [f"{r['method']} ({r['early']} of {len(r['seeds'])} seeds)" for r in rows_ if r.get("early")]
    if early:
        lines += ["", f"Read at {b}'s wall-clock before their first evaluation after step 0, so between the untrained "
                      f"model and that evaluation: {', '.join(early)}."]
    drawn = [r for r in rows_ if r.get("d_groups")]
    if drawn:  # a method that samples more groups a step than the baseline (D2): is its gain the extra samples?
        lines += ["", f"At equal sampled groups (a method that samples another number of groups than {b}, DAPO's "
                      f"dynamic sampling: read when it had sampled {b}'s groups, interpolated between evaluations):",
                  "", f"| method | seeds | groups sampled in all: method / {b} | difference | detectable | verdict | "
                      f"seeds read before their first evaluation after step 0 |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['method']} | {len(r['seeds'])} | {statistics.mean(m for m, _ in r['groups']):.0f} / "
                  f"{statistics.mean(g for _, g in r['groups']):.0f} | {_ci(r['d_groups'])} | "
                  f"{_mdd(r['mdd_groups'])} | {verdict(*r['d_groups'][:3])} | {r['early_groups']} |" for r in drawn]
    if any(_shared(r) for r in rows_):
        lines += ["", f"(shared): a run's median CPU share (metrics' time_cpu_share: the step's CPU seconds over its "
                      f"wall-clock seconds x threads) was below {SHARED}: other work took the machine while it ran, "
                      f"so its minutes and the wall-clock reading say as much about that load as about the method."]
    blamed = [r for r in rows_ if r["auc"] is not None]
    if blamed:  # a synthetic task: how well each rule's blame found the first error, beside what it gained
        lines += ["", "Blame against gain: each rule's first-error AUC (toyworld/credit.py; the mean over a run's "
                  "steps, then over the seeds) beside its difference at equal steps.", "",
                  "| method | seeds | first-error AUC | difference, equal steps |", "|---|---|---|---|"]
        lines += [f"| {r['method']} | {len(r['seeds'])} | {_ci(r['auc'], False)} | {_ci(r['d_step'])} |"
                  for r in sorted(blamed, key=lambda r: -r["auc"][0])]
        if len(blamed) > 2:
            rho = spearman([r["auc"][0] for r in blamed], [r["d_step"][0] for r in blamed])
            lines += ["", f"Rank correlation (Spearman) of AUC and difference over the {len(blamed)} methods: "
                          f"{rho:+.2f}."]
    return "\n".join(lines) + "\n"


def task_title(settings) -> str:
    """What a comparison trained, in a line for its pictures, from its settings.json (tools.compare's): the task, the
    model, the steps, the rollouts a step and the evaluation problems where the flags after -- set them.
    task_title({"--dataset": {"name": "arith"}, "--steps": 40, "the train.py flags after --": ["--model",
    "smollm2-135m", "--prompts-per-step", "8", "--group-size", "8", "--eval-limit", "128"]}) ==
    "arith, smollm2-135m, 40 steps, 8 x 8 rollouts a step, 128 evaluation problems"; no settings: ''."""
    if not isinstance(settings, dict):
        return ""
    dataset = settings.get("--dataset")
    name = dataset.get("name") if isinstance(dataset, dict) else dataset
    flags = settings.get("the train.py flags after --") or []
    value = lambda flag: flags[flags.index(flag) + 1] if flag in flags[:-1] else None  # noqa: E731
    parts = [str(name) if name else "", value("--model") or ("the task's own model" if name in ("tiny", "chain")
                                                                 else ""),
             f"{settings['--steps']} steps" if "--steps" in settings else ""]
    if value("--prompts-per-step") and value("--group-size"):
        parts.append(f"{value('--prompts-per-step')} x {value('--group-size')} rollouts a step")
    if value("--eval-limit"):
        parts.append(f"{value('--eval-limit')} evaluation problems")
    return ", ".join(p for p in parts if p)


def whose(seeds: list, folders: list) -> str:
    """The runs a panel's baseline curve is, named: their seeds, and with several folders (a machine each) which
    folder holds which. whose([0, 1], ["epyc"]) == "seeds 0, 1"; whose([(0, 2), (2, 3), (2, 4)], ["epyc", "xeon",
    "xeon2"]) == "epyc: seed 2; xeon2: seeds 3, 4"."""
    def said(xs):
        return f"seed{'s' * (len(xs) > 1)} {', '.join(str(x) for x in xs)}"
    if not seeds or not isinstance(seeds[0], tuple):
        return said(list(seeds))
    places = sorted({i for i, _ in seeds})
    return "; ".join(f"{folders[i]}: {said([s for j, s in seeds if j == i])}" for i in places)


CLIP = 0.4  # the difference plot's axis reaches at least +-CLIP (accuracy, 0-1 scale); a wider interval is clipped


def axis_limit(rows_: list) -> float:
    """The half-width of the difference plot's x axis: CLIP, or more where a seed's own difference (a dot) or a
    mean lies beyond it, so that every seed is drawn; an interval's end beyond it is clipped and said (clipped)."""
    far = [abs(x) for r in rows_ for key in ("d_step", "d_wall") for x in
           [r[key][0], *r.get(key + "_seeds", [])] if x == x]
    return max([CLIP, *[math.ceil((x + 0.02) * 10) / 10 for x in far]])  # a tenth beyond the farthest


def clipped(r: dict, limit: float) -> str:
    """The row's intervals that the axis cuts, with their ends, for its label: clipped({"d_step": (-0.115, -0.765,
    0.535), "d_wall": (-0.2, -0.3, -0.1)}, 0.4) == "equal steps [-0.765, +0.535] clipped"; none: ''."""
    cut = [f"{label} [{low:+.3f}, {high:+.3f}] clipped" for key, label in (("d_step", "equal steps"),
                                                                           ("d_wall", "wall-clock"))
           for _, low, high in [r[key][:3]] if low == low and (low < -limit or high > limit)]
    return "; ".join(cut)


def band(series: list) -> tuple:
    """Per step of the runs' common evaluations: steps, mean, lowest, highest run. The seeds' range, the band that
    plots.curves draws too (one kind of band everywhere): the uncertainty of a difference is the paired interval's
    business, in the table and paired_diffs.png, and a 95 % t-band of 3 seeds' accuracies is 0.3-0.6 wide."""
    steps = sorted(set.intersection(*(set(s) for s in series)))
    values = [[s[x] for s in series] for x in steps]
    return steps, [statistics.mean(v) for v in values], [min(v) for v in values], [max(v) for v in values]


def plot(out: str, runs: dict, rows_: list, baseline: str, title: str = "", folders: tuple = ()):
    """paired_curves.png and paired_diffs.png; title: the task (task_title), folders: the folders' names (a machine
    each) for the baseline's curve in each panel."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n = len(rows_)
    cols = min(4, max(1, n))
    rows_of_panels = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows_of_panels, cols, figsize=(max(3.4 * cols, 7), 2.8 * rows_of_panels + 0.7),
                             sharex=True, sharey=True, squeeze=False)
    for ax, r in zip(axes.flat, rows_):
        for name, colour in ((baseline, "0.45"), (r["method"], "C0" if verdict(*r["d_step"][:3]) != "better"
                                                   else "C2")):
            steps, mean, low, high = band([evals(runs[name][s]) for s in r["seeds"]])
            ax.plot(steps, mean, color=colour, marker="o", markersize=3, label=name)
            ax.fill_between(steps, low, high, color=colour, alpha=0.2)
        ax.set_title(f"{r['method']} ({len(r['seeds'])} seed{'s' * (len(r['seeds']) > 1)}): {_ci(r['d_step'])}\n"
                     f"grey: {baseline}, {whose(r['seeds'], list(folders))}", fontsize=7)
        ax.legend(fontsize=7, loc="lower right", frameon=False)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("step")
    for ax in axes[:, 0]:
        ax.set_ylabel("greedy held-out accuracy")
    fig.suptitle((f"{title}\n" if title else "") + f"each method against {baseline}, the same seeds: the mean over "
                 f"seeds, band from the lowest to the highest seed; grey: {baseline}'s runs of the panel's seeds\n"
                 f"panel title: the paired difference at the last step [95 % t-interval], accuracy on a 0-1 scale",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "paired_curves.png"), dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.4, 0.45 * n + 1.4))
    limit = axis_limit(rows_)
    for i, r in enumerate(rows_):
        for dy, key, marker, label in ((-0.12, "d_step", "o", "equal steps"),
                                       (0.12, "d_wall", "s", f"{baseline}'s wall-clock")):
            mean, low, high = r[key][:3]
            colour = "C0" if key == "d_step" else "C1"
            ax.errorbar(mean, i + dy, xerr=None if low != low else [[mean - low], [high - mean]], fmt=marker,
                        color=colour, capsize=3, label=label + ": mean, 95 % t-interval" if i == 0 else None)
            seeds = [x for x in r.get(key + "_seeds", []) if x == x]  # each seed's own difference, apart
            ax.plot(seeds, [i + dy] * len(seeds), "x", color=colour, markersize=4, alpha=0.8,
                    label="one seed's difference" if i == 0 and key == "d_step" else None)
    ax.axvline(0, color="0.3", linewidth=1)
    ax.axvline(MARGIN, color="C2", linestyle="--", linewidth=1,
               label=f"+-{MARGIN}: the margin 'better' and 'worse' need")
    ax.axvline(-MARGIN, color="C2", linestyle="--", linewidth=1)
    ax.set_yticks(range(n), [f"{r['method']} ({len(r['seeds'])} seed{'s' * (len(r['seeds']) > 1)}, detectable "
                             f"{_mdd(r['mdd_step'])})" + (f"\n{clipped(r, limit)}" if clipped(r, limit) else "")
                             for r in rows_])
    ax.set_ylim(n - 0.5, -0.5)  # the first method on top, each row's two markers inside the axes
    ax.set_xlim(-limit, limit)  # an interval wider than the axis is cut at its edge and its ends said in its label
    ax.set_xlabel(f"greedy accuracy minus {baseline}'s (0-1 scale), same seed: over seeds")
    if title:
        ax.set_title(title, fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.savefig(os.path.join(out, "paired_diffs.png"), dpi=110, bbox_inches="tight")  # long labels: no tight_layout
    plt.close(fig)


def write(out: str, baseline: str = "grpo", threshold: float = 0.5, more: tuple = (), only=None) -> str:
    """paired.md and the two PNGs in out; returns the table ('' when the baseline has no finished run). more: the
    same comparison's folders from other machines, paired within each; only: the (method, seed) runs to join
    (finished). A refusal of the runs is ValueError; a folder that cannot be written, OSError with the table
    already made (Unwritable.table)."""
    runs = finished(out, *more, only=only)
    if baseline not in runs:
        return ""
    rows_ = rows(runs, baseline, threshold)
    if not rows_:
        return ""
    md = table(rows_, baseline, threshold)
    try:
        with open(os.path.join(out, "paired.md"), "w") as f:
            f.write(md)
        with open(os.path.join(out, "paired.json"), "w") as f:  # the numbers, for a table elsewhere
            json.dump(rows_, f, indent=1)
        plot(out, runs, rows_, baseline, task_title(checkpoint.read_json(os.path.join(out, "settings.json"))),
             tuple(os.path.basename(os.path.normpath(o)) for o in (out, *more)))
    except OSError as e:
        raise Unwritable(f"{out}: cannot be written ({e.strerror or e}); the table, made, is above", md) from None
    return md


class Unwritable(OSError):
    """The output folder refused a write; .table holds the table that was made, for the caller to print."""
    def __init__(self, message: str, table_: str):
        super().__init__(message)
        self.table = table_


def paired_names(outs: list) -> set:
    """The methods of the finished runs in outs, as done.json names them."""
    return {d["method"] for out in outs for name in os.listdir(out)
            if isinstance(d := checkpoint.read_json(os.path.join(out, name, "done.json")), dict) and "method" in d}


def main(argv=None):
    p = cli.Parser(description=__doc__.split("\n")[0])
    p.add_argument("out", nargs="+", help="a tools.compare folder; or several, one comparison's runs on several "
                                          "machines (a folder each, the same settings.json)")
    p.add_argument("--baseline", default="grpo", help="the method the others are paired with (default: %(default)s)")
    p.add_argument("--threshold", type=float, default=0.5, help="the accuracy whose first step is reported "
                                                                "(default: %(default)s)")
    args = p.parse_args(argv)
    for out in args.out:
        if not os.path.isdir(out):
            p.error(f"{out}: no such folder")
        if checkpoint.read_json(os.path.join(out, "settings.json")) != checkpoint.read_json(
                os.path.join(args.out[0], "settings.json")):  # other flags: its runs are another comparison
            p.error(f"{out}: its settings.json differs from {args.out[0]}'s: not the same comparison")
    try:
        md = write(args.out[0], args.baseline, args.threshold, tuple(args.out[1:]))
    except Unwritable as e:
        print(e.table)
        p.error(str(e))
    except ValueError as e:
        p.error(str(e))
    if not md:
        found = sorted(paired_names(args.out))
        p.error(f"{' '.join(args.out)}: no finished run of --baseline {args.baseline} with another method on its "
                f"seed (its methods: {', '.join(found) or 'none'})")
    print(md)


if __name__ == "__main__":
    main()
