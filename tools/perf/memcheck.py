"""The --dry-run plan against what runs measured, phase by phase, as one Markdown table.

    python -m tools.perf.memcheck runs/ktae-seed0 runs/oar-g-seed0 ...     # train.py's run directories

For each run directory (run.json: the settings; metrics.jsonl: each step's peak memory by phase, its seconds by
stage and its prompt length) the first step is compared: the plan (infra/memory.py) for that run's settings, its
actual prompt length and the rollouts it actually trained (a group whose rollouts all agree has no advantage and
is left out of the training pass; OAR scores the others only), as of a first step (AdamW's moments are made by its
optimizer step), against the measured peak, and the difference. A phase the run did not reach (it ran out of
memory) shows the plan alone. Measured on the CPU, a peak is the resident set above what the process held before
the model loaded (allocator slack included); on a GPU, torch's allocated peak.
"""
import json
import os
from types import SimpleNamespace

import methods
from infra import cli, memory, models

PHASES = {plan: short for short, plan in memory.Peaks.PHASES.items()}  # the plan's phase -> peak_SHORT_gib
STAGES = {"sampling": "time_sample", "advantage": "time_advantage", "training forward and backward": "time_train"}


def first_step(run_dir: str) -> dict:
    """The first step's record (a complete one, or the line an out-of-memory stop wrote)."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return next(r for r in map(json.loads, f) if r.get("step", 0) >= 1)


def compare(run_dir: str) -> list:
    """Rows (method, phase, planned GiB, measured GiB or None, seconds or None) of a run directory's first step."""
    info = json.load(open(os.path.join(run_dir, "run.json")))
    args, record = SimpleNamespace(**info["args"]), first_step(run_dir)
    # run.json before 2026-12-07 holds neither: no loss term, and a reference only for G4's KL
    args.term, args.reference = getattr(args, "term", None), getattr(args, "reference", args.beta > 0)
    rule = methods.RULES[args.rule]
    settings = memory.plan_settings(args, record.get("prompt_len", 512), rule.memory_phase, rule.frozen_copy(args),
                                    methods.TERMS[args.term].memory if args.term else None)
    if "zero_adv_groups" in record and not args.reference and not args.term:  # the rollouts trained (and OAR's)
        trained = round(record["groups_kept"] * args.group_size * (1 - record["zero_adv_groups"]))
        settings["rollouts"] = max(trained, 1)
        settings["oar_chunk"] = min(settings["oar_chunk"], trained)
    plan = memory.memory_plan(models.load_config(args.model), **settings, first_step=True)
    rows = []
    for phase, items in plan.items():
        measured = record.get(f"peak_{PHASES[phase]}_gib")
        rows.append((args.method, phase, sum(items.values()) / memory.GiB, measured,
                     record.get(STAGES.get(phase, ""))))
    return rows


def table(rows: list) -> str:
    lines = ["| method | phase | plan (GiB) | measured (GiB) | measured / plan | seconds |",
             "|---|---|---|---|---|---|"]
    for method, phase, plan, measured, seconds in rows:
        cells = [f"{measured:.2f}", f"{measured / plan:.2f}"] if measured is not None else ["not reached", ""]
        lines.append(f"| {method} | {phase} | {plan:.2f} | {' | '.join(cells)} | "
                     f"{'' if seconds is None else f'{seconds:.0f}'} |")
    return "\n".join(lines)


def main(argv=None):
    p = cli.Parser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", help="train.py run directories")
    args = p.parse_args(argv)
    print(table([row for run in args.runs for row in compare(run)]))


if __name__ == "__main__":
    main()
