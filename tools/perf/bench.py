"""Speed, against model.generate, TRL and the machine's own limits (issue 29). One table, each row printed as soon as
it is measured.

    python -m tools.perf.bench --threads 2                         # the tiny default: every part but TRL's
    python -m tools.perf.bench --model smollm2-135m --threads 2    # the SmolLM2 recipe's setting, about 17 minutes
    python -m tools.perf.bench --model qwen2.5-coder-0.5b --threads 2 --trl
    python -m tools.perf.bench --parts steps --methods grpo,ktae --steps 6    # a quick look at two methods' steps
    python -m tools.perf.bench --model smollm2-135m -- --bf16      # more train.py flags, for every part (bf16 autocast)
    python -m tools.perf.bench --model qwen2.5-coder-0.5b --parts oar-p,steps --methods grpo,oar-p -- \\
        --max-new-tokens 128                                  # a length after --: OAR-P's too (else a short one)

Parts (--parts, in this order): machine (matrix products at the model's shapes, float32 and bf16; memory
bandwidth), sampler (sample.generate against model.generate on the same prompts, lengths and batch, greedy and
sampled, taking turns; medians; ours on each prompt alone, llama.cpp's batch 1; and the share of the machine's
limits that decoding reaches), oar-p (OAR-P's
weights of two rollouts through oar.batch_weights, each perturbed copy from its token on against each over every
column after its prompt, taking turns), steps (train.py in its
own process for grpo and each token rule of methods.RULES, the methods taking turns: seconds a step, split into
sampling, advantage and training; training MFU), trl (--trl: TRL's GRPOTrainer at the same setting, or
at the setting's fewer prompts a step, ours run again at them), llama
(llama.cpp on the model's GGUF file, for reference only; skipped when llama_cpp is not installed). What each model
is benchmarked on (its data, batch, lengths, temperature, grader, steps and repetitions) is
benchparts/workload.py's SETTINGS.

The one-GPU check (Qwen2.5-Math-1.5B's configuration on a CUDA device: memory against the plan, seconds a step,
the sampler, the GPU recipes end to end) is tools/perf/gpu_check.py (docs/gpu.md).

Timings depend on the machine and on what else runs on it: docs/LOG.md has what these commands measured, dated.
"""
import argparse
import dataclasses
import sys
import time

import methods  # (torch and the heavier modules are imported where they are used: --help answers at once)
from infra import cli, cpu, models
from tools.perf.benchparts.llamacpp import llama_rows
from tools.perf.benchparts.machine import machine_rows
from tools.perf.benchparts.oarp import oar_p_rows
from tools.perf.benchparts.sampler import sampler_rows
from tools.perf.benchparts.steps import default_methods, step_rows, training_mfu
from tools.perf.benchparts.table import Table, progress
from tools.perf.benchparts.trl_step import trl_rows
from tools.perf.benchparts.workload import BENCH_FLAGS, OTHER, SETTINGS, gives_length, load_workload, overridden

CPU_PARTS = ["machine", "sampler", "oar-p", "steps", "trl", "llama"]


def run_cpu(args, chosen: list, parts: list, table_out=None) -> Table:
    """The benchmark of --model on args.device (the machine's limits, the sampler, the steps, TRL, llama.cpp)."""
    import torch
    setting = overridden(SETTINGS.get(args.model, OTHER), args)  # SETTINGS is keyed by infra/models.py's aliases
    if gives_length(args.train_args):
        setting = dataclasses.replace(setting, short=())
    flags = ("--model", args.model, *BENCH_FLAGS, *setting.flags, *args.train_args,
             *(("--device", args.device) if args.device else ()))
    w = load_workload(args.model, flags[2:])
    a = w.args
    table = Table(f"bench: --model {args.model}, --dataset {a.dataset} ({a.grader} grader), {a.prompts_per_step} "
                  f"prompts x {a.group_size}, {a.max_new_tokens} new tokens, temperature {a.temperature:g}, "
                  f"{'bf16 autocast' if a.bf16 else 'float32'}, {torch.get_num_threads()} thread(s), {a.device}",
                  table_out)
    limits, ours, rows = {}, None, {}
    if "machine" in parts:
        progress("the machine's limits")
        tokens = min(a.micro_batch_size, a.prompts_per_step * a.group_size) * int(w.prompt_tokens + a.max_new_tokens)
        limits = machine_rows(table, w.config, a.prompts_per_step * a.group_size, tokens, a.device,
                              gib=2.0 if a.device.startswith("cuda") else 0.5)
    if "sampler" in parts:
        ours = sampler_rows(table, w, setting.repeat, limits)
    if "oar-p" in parts:
        oar_p_rows(table, w, setting.repeat)
    w.model = None  # the train.py runs load their own (a 0.5B model and its AdamW state take 10 GB); TRL reloads it
    if "steps" in parts:
        rows = step_rows(table, flags, chosen, setting, args.threads)
        if rows.get(chosen[0]):
            training_mfu(table, w, chosen[0], rows[chosen[0]], limits)
    if "trl" in parts:
        def load():  # after ours has run again at TRL's size, if it had to: one model in memory at a time
            w.model = models.load_model(a.model, world=w.problems.dataset.world)[0].to(a.device)
        trl_rows(table, w, setting, rows, load, flags, chosen[0], args.threads)
    if "llama" in parts:
        llama_rows(table, w, args.threads, ours)
    return table


def main(argv=None):
    p = cli.Parser(description=__doc__.split("\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=models.DEFAULT, help="any train.py --model; benchparts/workload.py's SETTINGS "
                                                           "says what each alias is benchmarked on (default: "
                                                           "%(default)s)")
    p.add_argument("--parts", default=None, help=f"comma-separated, in their order: {','.join(CPU_PARTS)} (default: "
                                                 f"all but trl)")
    p.add_argument("--trl", action="store_true", help="also TRL's GRPOTrainer (the trl part; requirements/trl.txt)")
    p.add_argument("--methods", default=None, help="the steps part's train.py methods, comma-separated; the first is "
                                                   f"the baseline (default: {','.join(default_methods())})")
    p.add_argument("--steps", type=int, default=None, help="train.py steps a run (default: the model's setting)")
    p.add_argument("--warmup", type=int, default=None, help="steps a run left out of the medians (default: the "
                                                            "model's setting)")
    p.add_argument("--rounds", type=int, default=None, help="runs a method, taking turns (default: the setting's)")
    p.add_argument("--repeat", type=int, default=None, help="the sampler's timed repetitions (default: the "
                                                            "setting's)")
    p.add_argument("--trl-prompts", type=int, default=None, help="prompts a step of the TRL comparison, ours run "
                                                                 "again at it (default: the model's setting: 2 for "
                                                                 "Qwen2.5, whose TRL step at 8 outgrows 24 GB)")
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: train.py's)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch, here and in every train.py run "
                                                             "(default: torch's choice; on a shared machine pass what "
                                                             "is yours)")
    p.add_argument("train_args", nargs="*", help="more train.py flags for every part, after --, e.g. -- --bf16")
    args = p.parse_args(argv)
    known = CPU_PARTS
    parts = args.parts.split(",") if args.parts is not None else [x for x in known if x != "trl" or args.trl]
    if args.trl_prompts is not None and args.trl_prompts < 1:
        p.error(f"--trl-prompts {args.trl_prompts}: TRL's prompts a step, at least 1")
    if args.trl and "trl" not in parts:
        parts.append("trl")
    for x in parts:
        if x not in known:
            p.error(f"--parts: unknown part {x!r} (choose from {', '.join(known)})")
    chosen = [m.strip() for m in (args.methods or ",".join(default_methods())).split(",") if m.strip()]
    for m in chosen:
        if m not in methods.names():
            p.error(f"--methods: unknown method {m!r} (choose from {', '.join(methods.names())})")
    from config import shared
    if shared.threads_problem(args.threads):  # train.py would refuse it only in the steps part, after the others ran
        p.error(f"--threads {args.threads}: {shared.threads_problem(args.threads)}")
    import torch
    cpu.setup(args.threads)
    torch.manual_seed(0)
    t0 = time.time()
    table = run_cpu(args, chosen, parts)
    if table.failures:
        more = f" (and {len(table.failures) - 1} more, in the table)" if len(table.failures) > 1 else ""
        sys.exit(f"bench: failed after {time.time() - t0:.0f} s: {table.failures[0]}{more}")
    progress(f"done in {time.time() - t0:.0f} s")
    return table


if __name__ == "__main__":
    main()
