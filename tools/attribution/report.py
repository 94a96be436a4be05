"""tools.attribution's report of OUT's lines: table.md's tables (hit@1, hit@3, AUC and mean rank with 95 % bootstrap
intervals, per rule and aggregation), auc.png and rollouts.html. F3b's uncertain rollouts are counted in the head
line and left out of the tables (verdict)."""
import html
import os
import random

import torch

import epicprm
from infra import plots
from tools.attribution.locate import HOWS


METRICS = ("hit1", "hit3", "auc", "rank")  # toyworld/credit.attribution's, at the level of steps


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
