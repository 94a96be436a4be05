"""Seconds a step of each method, each run through train.py in its own process (nothing imports train.py), the
methods taking turns; split into sampling, advantage and training; and the training pass's MFU."""
import contextlib
import math
import os
import subprocess
import sys
import tempfile

import methods
from infra import checkpoint
from tools.perf.benchparts.machine import again
from tools.perf.benchparts.table import Table, median, progress, rate
from tools.perf.benchparts.workload import Setting, Workload, training_flops


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the root
TRAIN = os.path.join(ROOT, "train.py")


def default_methods() -> list:
    """grpo and each token rule on it, from the method table: ['grpo', 'ktae', 'oar-p', 'oar-g', 'entropy']."""
    return [next(iter(methods.BASES))] + [m for m in methods.short_names() if m not in methods.BASES]


def train_run(flags, method: str, steps: int, threads=None, what: str = "", run_dir: str = None) -> tuple:
    """train.py --method METHOD for `steps` steps in its own process (nothing imports train.py), in run_dir, or in a
    temporary one when none is given (flags: the model, its setting and BENCH_FLAGS): (its step records from
    metrics.jsonl, None) or, where it failed, (what it logged, its last line of error: an out-of-memory step is
    logged with its phase's peaks)."""
    with tempfile.TemporaryDirectory() as d:
        run_dir = run_dir or os.path.join(d, "run")
        cmd = [sys.executable, TRAIN, *flags, "--method", method, "--steps", str(steps),
               "--run-dir", run_dir, *(["--threads", str(threads)] if threads else [])]
        progress(f"{what or method}: {' '.join(cmd[2:])}")
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        with contextlib.redirect_stdout(sys.stderr):  # a line dropped is said there: stdout is the table's
            records = checkpoint.read_metrics(os.path.join(run_dir, "metrics.jsonl"))  # a killed run's last line
    steps_done = [x for x in records if "time_step" in x or "out_of_memory" in x]
    if r.returncode == 0:
        return steps_done, None
    lines = [line for line in r.stderr.strip().splitlines() if line.strip()] or ["no output"]
    return steps_done, f"{lines[-1].strip()[:150]} (exit {r.returncode})"


def step_runs(flags, chosen: list, setting: Setting, threads) -> dict:
    """Each method's step records after the warm-up, its runs taking turns over the rounds (every other round in
    reverse order, so that the first run of a round is not always one method's). A rule that runs one forward per
    reasoning token gets setting.short on top. Returns method -> {"records": [...], "error": str or None}."""
    if setting.rounds > 1:
        train_run(flags, chosen[0], setting.warmup + 2, threads, "thrown away")
    out = {m: {"records": [], "error": None} for m in chosen}
    for r in range(setting.rounds):
        for m in (chosen if r % 2 == 0 else chosen[::-1]):
            extra = tuple(setting.short) if forward_scoring(m) else ()
            records, error = train_run(tuple(flags) + extra, m, setting.steps, threads, m + "*" * bool(extra))
            out[m]["records"] += [x for x in records if "time_step" in x][setting.warmup:]
            out[m]["error"] = out[m]["error"] or error
    return out


def forward_scoring(method: str) -> bool:
    """Whether the method's token rule runs one forward per reasoning token (methods.Rule.scoring "forward")."""
    return methods.RULES[methods.parse(method)[1]].scoring == "forward"


def step_medians(records: list) -> dict:
    keys = ("time_step", "time_sample", "time_advantage", "time_train", "response_len", "zero_adv_groups",
            "prompt_tokens")
    return {k: median([x[k] for x in records if x.get(k) is not None]) for k in keys}


def step_rows(table: Table, flags, chosen: list, setting: Setting, threads) -> dict:
    """Seconds a step of each method, split into sampling, advantage and training (medians over the steps after
    the warm-up), against the first method's; a method marked * ran with setting.short, and a row says why.
    Returns method -> medians (absent where a method's run failed)."""
    runs = step_runs(flags, chosen, setting, threads)
    rows = {}
    for m in chosen:
        if not runs[m]["records"]:
            table.fail("step", f"{m}: failed: {runs[m]['error']}")
            continue
        rows[m] = step_medians(runs[m]["records"])
        r, base = rows[m], rows.get(chosen[0])
        name = m + ("*" if forward_scoring(m) and setting.short else "")
        table.row("step", f"{name}: s/step = sampling + advantage + training", f"{r['time_step']:.3f}",
                  f"{r['time_sample']:.2f} + {r['time_advantage']:.3f} + {r['time_train']:.2f}",
                  f"{r['time_step'] / base['time_step']:.2f}x {chosen[0]}" if base else "")
        if runs[m]["error"]:  # a run that failed after some steps: those are timed, and its error said
            table.fail("step", f"{m}: a run then failed: {runs[m]['error']}")
    if setting.short and any(forward_scoring(m) for m in chosen):
        table.row("step", f"* with {' '.join(setting.short)}: its rule runs one forward per reasoning token")
    return rows


def training_mfu(table: Table, w: Workload, method: str, r: dict, limits: dict):
    """Training MFU of a method's step: model FLOPs a second (workload.training_flops) over the matmul peak at the
    training shape in the precision used, the higher of its readings before and after the steps, over the tokens
    trained on: the responses of the rollouts of the groups that mixed right and wrong (1 - zero_adv_groups of
    them) and, once a mixed group, the step's mean prompt (its record's prompt_tokens: each step draws other
    problems; the workload's first-step prompts where no record has it)."""
    if not limits:
        return
    a = w.args
    mixed = 1 - r["zero_adv_groups"]
    responses = mixed * a.prompts_per_step * a.group_size * r["response_len"]
    own = r.get("prompt_tokens", math.nan)  # nan where no record had it (step_medians)
    prompts = mixed * a.prompts_per_step * (w.prompt_tokens if math.isnan(own) else own)
    flops = training_flops(w.config, responses, prompts) / r["time_train"]
    precision = "bfloat16" if a.bf16 else "float32"
    peak = max(limits[precision]["train"], again(table, limits, precision, "train"))  # the machine's, not a neighbour's
    table.row("step", f"{method} training MFU ({responses + prompts:,.0f} tokens a step), {precision}",
              rate(flops, "FLOP/s"), rate(peak, "FLOP/s"), f"{100 * flops / peak:.0f} %")
