"""The numbers of docs/findings.md that tools.paired does not print, from the committed archives (issue 81):

    python -m tools.findings     # unpacks the archives of results/ (TASKS) into a temporary folder, prints Markdown

The former RLSD and SHEAR runs of issue 62's archives are left out: the authors' methods (results/authors-methods)
take their names. On tiny and chain the share of tokens a credit rule reshapes is read from results/tokens-reshaped, its
seed-0 run again (every logged number equal but the timings) with that share logged.

1. Power per task: each rule's paired differences from grpo at equal steps (last evaluation, same seed, same machine),
   their sd; the pooled sd (root mean square over the rules at five seeds); the minimum detectable difference at 80 %
   power, (t_0.975(n-1) + t_0.80(n-1)) sd / sqrt(n) (infra/stats.py); the evaluation noise of one difference, bounded
   by sqrt(2 p (1 - p) / n_eval) (two checkpoints each scored on n_eval problems, as if independent: p grpo's mean
   accuracy at the last step; the same problems make the true figure smaller where the two checkpoints agree);
   the rest, sqrt(sd^2 - eval^2), is training noise; the seeds a +0.03 effect would need (infra.stats.seeds_needed).
2. grpo's same seed on other machines (SmolLM2: three folders, and grpo seed 3 of results/dapo-parts on the EPYC): the
   difference of their last evaluations, a run of the same method and seed that differs only by float sums.
3. What the credit rules act on: per rule, the groups a step that mix right and wrong answers (metrics'
   groups_mixed; with DAPO's dynamic sampling, of the groups kept), the groups sampled (groups_generated), the share of
   groups with a zero advantage (zero_adv_groups) and, where logged, tokens_reshaped; the mean over steps, then over
   runs, with the runs' range.
4. The wall-clock reading with each run's summed step times beside the median's (tools.paired uses the median), and
   each rule's median step time over grpo's on the same seed and machine.
"""
import math
import os
import shutil
import statistics
import sys
import tarfile
import tempfile

from infra import stats
from tools import paired

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")  # the archives' folder
# a task: its machines' folders, each the archives unpacked into it in this order (a later run replaces an earlier of
# the same name: the authors' RLSD and SHEAR)
TASKS = {"tiny": {"EPYC": ["tiny-compare/runs.tar.gz", "authors-methods/tiny.tar.gz"]},
         "chain": {"EPYC": ["chain-compare/runs.tar.gz", "authors-methods/chain.tar.gz"]},
         "SmolLM2 arith": {"EPYC": ["smol-compare/runs.tar.gz", "dapo-parts/runs.tar.gz",
                                    "authors-methods/smol-arith.tar.gz"],
                           "Xeon": ["smol-compare/runs-xeon.tar.gz"], "Xeon 2": ["smol-compare/runs-xeon2.tar.gz"]}}
# the credit rules' seed-0 runs again, equal in every logged number but their timings, with the share of tokens
# reshaped, which the archived runs predate: read for that share alone (their timings are another session's)
RESHAPED = {"tiny": "tokens-reshaped/tiny.tar.gz", "chain": "tokens-reshaped/chain.tar.gz"}
# issue 62's archives hold RLSD and SHEAR as this project first wrote them, not as their authors did (issue 80)
FORMER = {"tiny-compare/runs.tar.gz", "chain-compare/runs.tar.gz", "smol-compare/runs.tar.gz",
          "smol-compare/runs-xeon.tar.gz", "smol-compare/runs-xeon2.tar.gz"}


def unpack(tmp: str, machines: dict) -> list:
    """Each machine's archives into a folder of its own, the former RLSD and SHEAR runs left out (the log keeps their
    rows), so that the authors' runs of the same names do not mix with them; any other run two archives both hold is
    refused (ValueError)."""
    folders = []
    for name, archives in machines.items():
        d = os.path.join(tmp, name.replace(" ", "-"))
        os.makedirs(d)
        for a in archives:
            with tarfile.open(os.path.join(HERE, a)) as t:
                # a later archive adds runs; one that would overwrite a run already unpacked (another run of the same
                # method and seed) is refused, not mixed in file by file
                clash = sorted({m.name.split("/")[0] for m in t.getmembers()} & set(os.listdir(d)))
                if clash:
                    raise ValueError(f"{a}: holds {clash[0]}, already unpacked from an earlier archive of {name}")
                t.extractall(d)
            if a in FORMER:
                for run in os.listdir(d):
                    if run.rpartition("-seed")[0] in ("rlsd", "shear"):
                        shutil.rmtree(os.path.join(d, run))
        folders.append(d)
    return folders


def last(recs):
    acc = paired.evals(recs)
    return acc[max(acc)]


def mean_of(recs, key):
    values = [r[key] for r in recs if r.get(key) is not None]
    return statistics.mean(values) if values else None


def summed(recs):
    """seconds_to with each step at its own time_step (a sum), for the second wall-clock reading."""
    times = {r["step"]: r["time_step"] for r in recs if "time_step" in r}
    out, total = {0: 0.0}, 0.0
    for s in sorted({r["step"] for r in recs} - {0}):
        total += times.get(s, 0.0)
        out[s] = total
    return out


def f3(x):
    return "n/a" if x is None or x != x else f"{x:+.3f}"


def power_of(runs) -> dict:
    """Section 1's numbers for one task: p, n_eval, the evaluation noise bound, per rule (seeds, sd, detectable,
    training noise, seeds for +0.03) and, over the rules at five seeds, the pooled sd, its range, the detectable
    difference at 5 seeds and the seeds +0.03 would need (with the evaluation noise alone: seeds_eval)."""
    base = runs["grpo"]
    n_eval = [r["eval_n"] for recs in base.values() for r in recs if "eval_n" in r][0]
    p = statistics.mean(last(recs) for recs in base.values())
    noise = math.sqrt(2 * p * (1 - p) / n_eval)
    rules, five = [], []
    for method in sorted(runs):
        if method == "grpo" or "[" in method:
            continue
        common = sorted(set(runs[method]) & set(base))
        d = [last(runs[method][s]) - last(base[s]) for s in common]
        if len(d) < 2:  # one seed (grpo+sdpg on tiny): no spread
            continue
        sd = statistics.stdev(d)
        if len(d) == 5:
            five.append(sd)
        rules.append(dict(method=method, seeds=len(d), sd=sd, detectable=stats.detectable(d),
                          train=math.sqrt(max(0.0, sd ** 2 - noise ** 2)), needed=stats.seeds_needed(sd, 0.03)))
    pooled = math.sqrt(statistics.mean(s ** 2 for s in five))
    return dict(p=p, n_eval=n_eval, noise=noise, rules=rules, n_five=len(five), pooled=pooled, low=min(five),
                high=max(five), detectable=(stats.t975(4) + stats.t80(4)) * pooled / math.sqrt(5),
                train=math.sqrt(max(0, pooled ** 2 - noise ** 2)), needed=stats.seeds_needed(pooled, 0.03),
                needed_eval=stats.seeds_needed(noise, 0.03))


def power(task, runs):
    w = power_of(runs)
    print(f"\n### {task}: power (equal steps; accuracy differences on a 0-1 scale)\n")
    print(f"grpo's mean accuracy at the last step p = {w['p']:.3f}, n_eval = {w['n_eval']} problems: evaluation noise "
          f"of one difference <= sqrt(2 p (1-p) / n) = {w['noise']:.3f}\n")
    print("| rule | seeds | sd of the differences | detectable (80 % power) | training noise sqrt(sd^2 - eval^2) "
          "| seeds for +0.03 |")
    print("|---|---|---|---|---|---|")
    for r in w["rules"]:
        print(f"| {r['method']} | {r['seeds']} | {r['sd']:.3f} | {r['detectable']:.3f} | {r['train']:.3f} | "
              f"{r['needed']} |")
    print(f"\nPooled over the {w['n_five']} rules at 5 seeds: sd {w['pooled']:.3f} (range {w['low']:.3f}-"
          f"{w['high']:.3f}), detectable at 5 seeds {w['detectable']:.3f}; evaluation noise {w['noise']:.3f} is "
          f"{w['noise'] ** 2 / w['pooled'] ** 2:.0%} of the variance, training noise sqrt({w['pooled']:.3f}^2 - "
          f"{w['noise']:.3f}^2) = {w['train']:.3f}; seeds for +0.03: {w['needed']} (with the evaluation noise alone, "
          f"no training noise: {w['needed_eval']})")


def same_seed(runs, names) -> list:
    """grpo's same seed on two machines: (seed, machine, accuracy, other machine, accuracy) at the last evaluation."""
    by_seed = {}
    for (i, seed), recs in runs["grpo"].items():
        by_seed.setdefault(seed, []).append((names[i], last(recs)))
    return [(seed, na, a, nb, b) for seed, xs in sorted(by_seed.items())
            for k, (na, a) in enumerate(xs) for nb, b in xs[k + 1:]]


def machines(runs, names):
    print("\n### SmolLM2 arith: grpo's same seed on other machines (last evaluation, step 40)\n")
    diffs = []
    for seed, na, a, nb, b in same_seed(runs, names):
        diffs.append(a - b)
        print(f"- seed {seed}: {na} {a:.3f}, {nb} {b:.3f}: {a - b:+.3f}")
    absd = [abs(x) for x in diffs]
    print(f"\n{len(diffs)} pairs: |difference| {min(absd):.3f}-{max(absd):.3f}, root mean square "
          f"{math.sqrt(statistics.mean(x * x for x in diffs)):.3f} (the sd of a paired difference between two runs "
          f"that differ only by float sums, if its mean is 0)")


def groups(task, runs, again=None):
    print(f"\n### {task}: what the rules act on (per step: mean over steps, then over runs [runs' range])\n")
    print("| rule | runs | groups mixing right and wrong | groups sampled | groups with zero advantage (share) | "
          "tokens reshaped (share) |")
    print("|---|---|---|---|---|---|")
    for method in sorted(runs):
        rs = list(runs[method].values())

        def cell(key, fmt="{:.1f}"):
            xs = [m for m in (mean_of(r, key) for r in rs) if m is not None]
            some = f" ({len(xs)} of {len(rs)} runs)" if len(xs) < len(rs) else ""
            if not xs and again and method in again:  # the share of tokens reshaped: the rule's seed-0 run again
                xs = [m for m in (mean_of(r, key) for r in again[method].values()) if m is not None]
                some = " (seed 0 run again)"
            if not xs:
                return "not logged"
            spread = fmt.format(xs[0]) if len(xs) == 1 else \
                f"{fmt.format(statistics.mean(xs))} [{fmt.format(min(xs))}, {fmt.format(max(xs))}]"
            return spread + some
        print(f"| {method} | {len(rs)} | {cell('groups_mixed')} | {cell('groups_generated')} | "
              f"{cell('zero_adv_groups', '{:.2f}')} | {cell('tokens_reshaped', '{:.2f}')} |")


def clock(task, runs):
    print(f"\n### {task}: at grpo's wall-clock, each run's median step time x steps against the sum of its step "
          f"times; the rule's median step time over grpo's (same seed and machine)\n")
    median_rows = paired.rows(runs, "grpo", 0.5)
    keep = paired.seconds_to
    paired.seconds_to = summed
    try:
        sum_rows = {r["method"]: r for r in paired.rows(runs, "grpo", 0.5)}
    finally:
        paired.seconds_to = keep
    print("| rule | seeds | median x steps | verdict | summed | verdict | read before the first evaluation after "
          "step 0 (median / sum) | step time over grpo's |")
    print("|---|---|---|---|---|---|---|---|")
    for r in median_rows:
        s = sum_rows[r["method"]]
        ratio = [statistics.median(x["time_step"] for x in runs[r["method"]][k] if "time_step" in x) /
                 statistics.median(x["time_step"] for x in runs["grpo"][k] if "time_step" in x) for k in r["seeds"]]
        print(f"| {r['method']} | {len(r['seeds'])} | {paired._ci(r['d_wall'])} | {paired.verdict(*r['d_wall'])} | "
              f"{paired._ci(s['d_wall'])} | {paired.verdict(*s['d_wall'])} | {r['early']} / {s['early']} | "
              f"{min(ratio):.2f}-{max(ratio):.2f} |")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        for task, archives in TASKS.items():
            folders = unpack(os.path.join(tmp, task.replace(" ", "-")), archives)
            runs = paired.finished(*folders)
            again = None
            if task in RESHAPED:
                again = paired.finished(unpack(os.path.join(tmp, task + "-again"), {"EPYC": [RESHAPED[task]]})[0])
            power(task, runs)
            groups(task, runs, again)
            clock(task, runs)
            if len(archives) > 1:
                machines(runs, list(archives))


if __name__ == "__main__":
    main()
