"""docs/findings.md filled from the committed archives, so that its numbers are the archives' and remade by one command:

    python -m tools.findings_page            # writes docs/findings.md from tools/findings_page.md
    python -m tools.findings_page --figures  # and docs/paired-{tiny,chain,smol}.png, docs/accuracy-smol.png
    python -m tools.findings_page --check    # says in a line whether docs/findings.md is the archives' page (exit 1)

The prose of tools/findings_page.md is written by hand; its {{name}} places are filled from tools.paired's rows and
tools.findings' numbers over the archives of tools.findings.TASKS (the names: VALUES below), then every paragraph and
list item is wrapped at WIDTH columns, tables, code and headings as they are. A place the code does not fill, or a
value no place takes, is an error naming it: the page and its template cannot drift apart in silence.
"""
import argparse
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import textwrap

import methods
from infra import files, stats
from tools import findings, paired

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATE = os.path.join(ROOT, "tools", "findings_page.md")
PAGE = os.path.join(ROOT, "docs", "findings.md")
WIDTH = 120
SHORT = {"tiny": "tiny", "chain": "chain", "SmolLM2 arith": "smol"}  # a task's name in the template's places
# a difference's interval as the page writes it (signed ends): what "intervals read on this page" counts
INTERVAL = re.compile(r"\[[+-]\d\.\d{3}, [+-]\d\.\d{3}\]")
BLOCK_START = re.compile(r" ([-+*>#]|\d+[.)]) ")  # " - " in "sd^2 - b^2": a list item if a line began with it
LINK = re.compile(r"\[[^\]]+\]: ")  # a link's definition, [name]: address
VALUES = """table:T, grpo:T, mixed:T (GRPO's mixed groups a step), detectable:T, needed:T (seeds for +0.03),
power (section 2's rows), same-seed, early, rho:T, rho-rules:T, rho-rest:T (T tiny or chain), best-blamer,
reshaped range, intervals, exclude, chance; and a method's: step:T:METHOD[:BASELINE], wall:..., groups:... (its
paired difference at that reading, the baseline grpo unless named: step:smol:dapo+ktae:dapo), mean:... (the
equal-steps mean alone), mixed:T:METHOD, sampled:T:METHOD (groups a step) (T: tiny, chain, smol)"""
# a method's place: its paired difference from a baseline at a reading (or the mean alone), or a per-step metric
CELL = re.compile(r"(step|wall|groups|mean|mixed|sampled):(tiny|chain|smol):([^:]+)(?::(.+))?$")
METRIC = {"mixed": "groups_mixed", "sampled": "groups_generated"}


def cell(runs: dict, key: str, fmt: str = "{:.1f}"):
    """A metric's mean over steps, then over a method's runs; None where no run logged it."""
    xs = [x for x in (findings.mean_of(r, key) for r in runs.values()) if x is not None]
    return fmt.format(statistics.mean(xs)) if xs else None


def verdict_cell(r: dict, key: str, mdd: bool = True) -> str:
    """difference [interval] (detectable), bold with its verdict where better or worse."""
    s = paired._ci(r[key])
    v = paired.verdict(*r[key][:3])
    if v in ("better", "worse"):
        s = f"**{s} {v}**"
    k = "mdd_" + key[2:]
    if mdd and r.get(k) == r.get(k):
        s += f" ({r[k]:.3f})"
    return s


def reshaped(method: str, runs: dict, again: dict):
    """The share of a step's tokens a rule moved: logged by the run, else by its seed-0 run again; 0 where the method
    has no token rule (DAPO, SDPG: methods.parse); None where unknown."""
    if methods.parse(method)[1] == "none":
        return "0"
    share = cell(runs[method], "tokens_reshaped", "{:.2f}")
    if share is None and method in again:
        share = cell(again[method], "tokens_reshaped", "{:.2f}")
    return share


def table(runs: dict, again: dict, rows: list, synthetic: bool) -> list:
    """The task's table lines: first-error AUC (synthetic tasks; sorted by it) or seeds (SmolLM2: rows paired on
    several machines first, then by the equal-steps difference), both readings, mixed groups, tokens reshaped."""
    if synthetic:
        rows = sorted(rows, key=lambda r: -(r["auc"][0] if r["auc"] else 0.5))
    else:
        # a run's key is (folder, seed) where the task has several machines' folders (tools.paired.finished)
        rows = sorted(rows, key=lambda r: (len({k[0] if isinstance(k, tuple) else 0 for k in r["seeds"]}) == 1,
                                           -r["d_step"][0]))
    lines = ["| method | " + ("first-error AUC" if synthetic else "seeds") +
             " | equal steps | at GRPO's wall-clock | mixed | reshaped |", "|---|---|---|---|---|---|"]
    for r in rows:
        m = r["method"]
        if synthetic:
            # a method without a token rule blames every token alike: AUC 0.5 at every seed, no spread
            uniform = methods.parse(m)[1] == "none"
            first = "0.500 (uniform)" if uniform else paired._ci(r["auc"], False) if r["auc"] else "n/a"
        else:
            first = str(len(r["seeds"]))
        mixed, kept, drawn = (cell(runs[m], k) for k in ("groups_mixed", "groups_kept", "groups_generated"))
        if kept is not None and drawn is not None and kept != drawn:  # dynamic sampling: kept of sampled
            mixed = f"{float(kept):.0f} of {drawn}"
        lines.append(f"| {m} | {first} | {verdict_cell(r, 'd_step')} | {verdict_cell(r, 'd_wall', False)} | {mixed} | "
                     f"{reshaped(m, runs, again) or 'n/a'} |")
    return lines


def values(tmp: str) -> dict:
    """Every place's value, from the archives unpacked into tmp; also '_folders' and '_runs': each task's unpacked
    folders and their finished runs (tools.paired.finished), which the places of a row's cell read (row_cell)."""
    out, early, folders, n_table, n_excl, spans, all_runs, bests = {}, [], {}, 0, 0, [], {}, set()
    for task, machines in findings.TASKS.items():
        t = SHORT[task]
        folders[t] = findings.unpack(os.path.join(tmp, t), machines)
        runs = all_runs[t] = paired.finished(*folders[t])
        again = {}
        if task in findings.RESHAPED:
            again = paired.finished(findings.unpack(os.path.join(tmp, t + "-again"),
                                                    {"EPYC": [findings.RESHAPED[task]]})[0])
        # the tables' rows: each method paired over two seeds or more; variants (DAPO's parts) are section 4's
        rows = [r for r in paired.rows(runs, "grpo", 0.5) if len(r["seeds"]) > 1 and "[" not in r["method"]]
        synthetic = any(r["auc"] for r in rows)
        out[f"table:{t}"] = "\n".join(table(runs, again, rows, synthetic))
        read = [r[k] for r in rows for k in ("d_step", "d_wall") if r[k][1] == r[k][1]]  # n/a cells: none read
        n_table += len(read)
        n_excl += sum(1 for _, low, high in read if low > 0 or high < 0)
        # GRPO's last accuracy over its seeds (a seed run on several machines averaged first: one seed, not several
        # independent runs), each row pairing with some of them; its mixed groups a step
        by_seed = {}
        for key, recs in runs["grpo"].items():
            by_seed.setdefault(key[1] if isinstance(key, tuple) else key, []).append(findings.last(recs))
        n_runs = sum(map(len, by_seed.values()))
        acc = stats.interval([statistics.mean(v) for v in by_seed.values()])
        out[f"grpo:{t}"] = f"{paired._ci(acc, False)} over its {len(by_seed)} seeds" + \
            (f" ({n_runs} runs on its machines, averaged per seed)" if n_runs > len(by_seed) else "")
        out[f"mixed:{t}"] = cell(runs["grpo"], "groups_mixed")
        w = findings.power_of(runs)
        out[f"detectable:{t}"], out[f"needed:{t}"] = f"{w['detectable']:.2f}", str(w["needed"])
        train = f">= {w['train']:.3f}" if w["train"] > 0 else "within the bound"
        out.setdefault("power", []).append(
            f"| {task} | {w['n_eval']} | {w['noise']:.3f} | {w['pooled']:.3f} ({w['low']:.3f}-{w['high']:.3f}) | "
            f"{train} | {w['detectable']:.3f} | {w['needed']} ({w['needed_eval']}) |")
        e = [f"{r['method']} {r['early']} of {len(r['seeds'])}" for r in rows if r["early"]]
        early.append(f"{task.split()[0]}: " + (", ".join(e) if e else "none"))
        if len(machines) > 1:
            d = [a - b for _, _, a, _, b in findings.same_seed(runs, list(machines))]
            out["same-seed"] = (f"{min(map(abs, d)):.3f}-{max(map(abs, d)):.3f} apart in {len(d)} pairs (root mean "
                                f"square {math.sqrt(statistics.mean(x * x for x in d)):.3f})")
        if synthetic:
            # rank correlation of blame and gain: every row, the credit rules (a token rule), and without the best
            # blamer (the highest AUC: surprisal, also the worst learner, so the rank correlation leans on it)
            rules = [r for r in rows if methods.parse(r["method"])[1] != "none" and r["auc"]]
            best = max(rules, key=lambda r: r["auc"][0])
            bests.add(best["method"])
            for name, rs in (("rho", rows), ("rho-rules", rules), ("rho-rest", [r for r in rules if r is not best])):
                out[f"{name}:{t}"] = "{:+.2f}".format(paired.spearman(
                    [r["auc"][0] if r["auc"] else 0.5 for r in rs], [r["d_step"][0] for r in rs]))
            spans += [(float(reshaped(r["method"], runs, again)), r["method"]) for r in rules
                      if reshaped(r["method"], runs, again)]
    out["power"] = "\n".join(out["power"])
    out["early"] = "; ".join(early)
    if spans:
        (lo, lo_m), (hi, hi_m) = min(spans), max(spans)
        out["reshaped-range"] = f"{lo:.2f} ({lo_m.upper()}) to {hi:.2f} ({hi_m.upper()})"
    out["best-blamer"] = " and ".join(sorted(bests)) or None
    out["_tables"], out["_excluding"], out["_folders"], out["_runs"] = n_table, n_excl, folders, all_runs
    return out


def row_cell(name: str, vals: dict, cache: dict = None):
    """The value of a method's place (CELL) on task T: READING:T:METHOD[:BASELINE] its paired difference from the
    baseline at that reading (step, wall, groups) with its interval and detectable difference, bold with its verdict
    where better or worse (the tables give the wall-clock reading's without its detectable difference); mean:... the
    equal-steps mean alone; mixed:T:METHOD and sampled:T:METHOD its groups a step. None where no such row: a method
    not run, a reading it does not have, or fewer than two seeds (no interval)."""
    m = CELL.match(name)
    if not m or m.group(2) not in vals.get("_runs", {}):
        return None
    reading, t, method, baseline = m.group(1), m.group(2), m.group(3), m.group(4) or "grpo"
    runs = vals["_runs"][t]
    if reading in METRIC:
        return cell(runs[method], METRIC[reading]) if method in runs and baseline == "grpo" else None
    if baseline not in runs:
        return None
    cache = {} if cache is None else cache
    if (t, baseline) not in cache:  # every place of one table pairs the same runs
        cache[t, baseline] = {r["method"]: r for r in paired.rows(runs, baseline, 0.5)}
    r = cache[t, baseline].get(method)
    key = "d_step" if reading == "mean" else "d_" + reading
    if r is None or len(r["seeds"]) < 2 or r.get(key) is None or r[key][1] != r[key][1]:
        return None
    return f"{r[key][0]:+.3f}" if reading == "mean" else verdict_cell(r, key)


def fill(template: str, vals: dict) -> str:
    """Each {{name}} replaced by its value, then the count of intervals read (the tables' two a row, and each signed
    interval in the prose that no table holds) and how many exclude 0; ValueError naming a place with no value or
    a value with no place."""
    names = set(re.findall(r"\{\{([^}]+)\}\}", template))
    counted = {"intervals", "exclude", "chance"}
    cache = {}
    vals = {**vals, **{n: v for n in names - set(vals) if (v := row_cell(n, vals, cache)) is not None}}
    missing = sorted(names - set(vals) - counted)
    if missing:
        raise ValueError(f"{TEMPLATE}: {{{{{missing[0]}}}}} has no value (the values: {VALUES})")
    unused = sorted(k for k in set(vals) - names if not k.startswith("_"))
    if unused:
        raise ValueError(f"{TEMPLATE}: no place takes the value {unused[0]!r}")
    empty = sorted(k for k in names & set(vals) if vals[k] is None)
    if empty:
        raise ValueError(f"{TEMPLATE}: {{{{{empty[0]}}}}}: the archives hold no value for it")
    s = re.sub(r"\{\{([^}]+)\}\}", lambda m: vals[m.group(1)] if m.group(1) in vals else m.group(0), template)
    in_tables = {x for line in s.splitlines() if line.startswith("|") for x in INTERVAL.findall(line)}
    prose = [x for line in s.splitlines() if not line.startswith("|") for x in INTERVAL.findall(line)
             if x not in in_tables]
    n = vals.get("_tables", 0) + len(prose)
    excl = vals.get("_excluding", 0) + sum(1 for x in prose if _excludes_zero(x))
    s = s.replace("{{intervals}}", str(n)).replace("{{exclude}}", str(excl))
    return wrap(s.replace("{{chance}}", str(round(n * 0.05))))


def _excludes_zero(interval: str) -> bool:
    low, high = (float(x) for x in interval[1:-1].split(", "))
    return low > 0 or high < 0


def wrap(text: str, width: int = WIDTH) -> str:
    """Every paragraph and list item (in a quote too) wrapped at width; tables, indented code, headings, link
    definitions and blank lines as they are."""
    out, block = [], []

    def flush():
        if not block:
            return
        first = block[0]
        quote = "> " if first.startswith(">") else ""
        body = [line[len(quote):] if line.startswith(quote) else line for line in block]
        items, cur = [], []
        for line in body:  # a block of a paragraph, or of list items each begun by "- "
            if line.startswith("- ") and cur:
                items.append(cur)
                cur = []
            cur.append(line.strip())
        items.append(cur)
        for item in items:
            lead = "- " if item[0].startswith("- ") else ""
            # a line must not begin with what Markdown reads as a new block ("- ", "+ ", "> ", "# ", "1. "): such a
            # token is glued to the word before it (a NUL, made a space again after wrapping)
            words = BLOCK_START.sub("\0\\1 ", " ".join(item)[len(lead):])
            out.extend(line.replace("\0", " ") for line in textwrap.wrap(
                words, width, initial_indent=quote + lead, subsequent_indent=quote + " " * len(lead),
                break_on_hyphens=False, break_long_words=False))
        block.clear()

    for line in text.split("\n"):
        plain = not line.strip() or line.startswith(("|", "    ", "#")) or LINK.match(line) or line.strip() == ">"
        if plain:
            flush()
            out.append(line)
        else:
            block.append(line)
    flush()
    return "\n".join(out)


def page(tmp: str):
    """The page's text and each task's unpacked folders (for the figures)."""
    vals = values(tmp)
    with open(TEMPLATE) as f:
        return fill(f.read(), vals), vals["_folders"]


def figures(folders: dict, docs: str):
    """tools.paired's pictures of each task into docs/: the differences, and SmolLM2's curves."""
    for t, fs in folders.items():
        paired.write(fs[0], "grpo", 0.5, tuple(fs[1:]))
        shutil.copy(os.path.join(fs[0], "paired_diffs.png"), os.path.join(docs, f"paired-{t}.png"))
        if len(fs) > 1:
            shutil.copy(os.path.join(fs[0], "paired_curves.png"), os.path.join(docs, f"accuracy-{t}.png"))


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m tools.findings_page", description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="only say whether docs/findings.md is the archives' page")
    p.add_argument("--figures", action="store_true", help="also remake docs/paired-*.png and docs/accuracy-smol.png")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        text, folders = page(tmp)
        if a.check:
            with open(PAGE) as f:
                now = f.read()
            if now != text:
                a_, b_ = now.splitlines(keepends=True), text.splitlines(keepends=True)
                line = next((i for i, (x, y) in enumerate(zip(a_, b_)) if x != y), min(len(a_), len(b_)))
                sys.exit(f"{PAGE}: line {line + 1} is not the archives' page; `python -m tools.findings_page` "
                         "remakes it")
            print(f"{PAGE}: the archives' page ({len(text.splitlines())} lines)")
            return
        files.write_text(PAGE, text)
        print(f"{PAGE}: {len(text.splitlines())} lines")
        if a.figures:
            import contextlib
            import io
            with contextlib.redirect_stdout(io.StringIO()):
                figures(folders, os.path.dirname(PAGE))
            print("figures: " + ", ".join(f"docs/paired-{t}.png" for t in folders) + ", docs/accuracy-smol.png")


if __name__ == "__main__":
    main()
