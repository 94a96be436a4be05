"""Benchmarks that print numbers (targets are checked here, not in timed tests).

    python tools/bench.py --threads 2    # the sampler against model.generate, KTAE on a Qwen-sized group, and
                                         # the seconds per RL step of grpo and each token rule on it
    python tools/bench.py --only-steps   # only the RL steps
    python tools/bench.py --only-steps --methods grpo,ktae --steps 8 --rounds 1    # a quick look
    python tools/bench.py --trl          # also TRL's GRPOTrainer on the same model and setting (requirements/trl.txt)

Medians of several runs after a warm-up, on whatever machine runs it; what they gave is in docs/LOG.md, dated.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the project's root, one folder up
if __package__ in (None, ""):  # run as a file (python tools/bench.py): the project's modules are in ROOT
    sys.path.insert(0, ROOT)

import methods  # noqa: E402  (torch and the heavier modules are imported where they are used: --help answers at once)
TRAIN = os.path.join(ROOT, "train.py")


def median_time(fn, repeat=7, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_ktae_qwen_group():
    """One group as Qwen2.5 would give it: G = 16 rollouts of 1024 tokens, ids up to 151,645 (uniformly random
    ids: about 15k distinct ones, more than real text has, so this is the hard case)."""
    import torch
    import ktae
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 151_646, (16, 1024), generator=g)
    mask = torch.ones_like(ids)
    mask[5, 700:] = 0
    rewards = torch.tensor([1.0, 0.0] * 8)
    t = median_time(lambda: ktae.token_values(ids, mask, rewards[None], special_ids=(151_643, 151_645)))
    distinct = len(torch.unique(ids[mask.bool()]))
    print(f"KTAE, one Qwen-sized group (G=16 x 1024 tokens, {distinct} distinct ids): {t * 1000:.1f} ms "
          f"(target <= 100 ms)")


def bench_sampler(repeat=11):
    """Useful tokens per second (response tokens up to and including EOS) of `model.generate` and of our sampler
    on the tiny default: 16 prompts x 8 rollouts, at most 48 new tokens, temperature 1.0 (top-k off, so both draw
    from the full softmax). generate() runs every row until the longest ends; ours drops finished rows."""
    import torch
    import sample
    from toyworld import tiny
    model, tok, _ = tiny.load_or_build()
    model.eval()
    qs = tiny.train_problems(random.Random(0), 16, set(tiny.eval_problems()))
    prompts = [tok(tiny.prompt(q))["input_ids"] for q in qs]
    ids, mask = sample.left_pad(prompts, tok.pad_token_id)
    ids, mask = ids.repeat_interleave(8, 0), mask.repeat_interleave(8, 0)  # [128, P]
    useful = {}

    def hf():
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=None,
                                 top_p=None, max_new_tokens=48, eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.pad_token_id)[:, ids.shape[1]:]  # [128, <=48]
        is_eos = (out == tok.eos_token_id).int()
        useful["hf"] = int(((is_eos.cumsum(1) - is_eos) == 0).sum())  # up to and including the first EOS

    def ours():
        b = sample.generate(model, prompts, n=8, max_new_tokens=48, temperature=1.0, eos_id=tok.eos_token_id,
                            pad_id=tok.pad_token_id)
        useful["ours"] = int(b["response_mask"].sum())

    for _ in range(2):  # warm-up
        hf(), ours()
    tps = {"hf": [], "ours": []}
    seconds = {"hf": [], "ours": []}
    for _ in range(repeat):  # interleaved, so that a machine slowing down or speeding up affects both alike
        for name, fn in (("hf", hf), ("ours", ours)):
            t0 = time.perf_counter()
            fn()
            seconds[name].append(time.perf_counter() - t0)
            tps[name].append(useful[name] / seconds[name][-1])
    hf_tps, ours_tps = statistics.median(tps["hf"]), statistics.median(tps["ours"])
    print(f"model.generate: {hf_tps:,.0f} useful tokens/s (median of {repeat}; "
          f"{statistics.median(seconds['hf']) * 1000:.0f} ms for about {useful['hf']} tokens)")
    print(f"our sampler:    {ours_tps:,.0f} useful tokens/s (median of {repeat}; "
          f"{statistics.median(seconds['ours']) * 1000:.0f} ms for about {useful['ours']} tokens)")
    print(f"ratio: {ours_tps / hf_tps:.2f}x (target >= 1.5x)")
    return ours_tps / hf_tps


def bench_rl_steps(methods, steps=14, warmup=4, rounds=2, threads=None):
    """Seconds per RL step (sample + reward + advantage + loss + optimizer step) of each method, as train.py runs
    it on the tiny default: the same seed, so the same problems and, until the updates part them, the same
    rollouts. Each method runs in its own process (`python train.py --steps 14`), the methods taking turns for
    `rounds` rounds, every other one in reverse order (a machine whose speed drifts then affects them alike); the
    median over the steps after a warm-up is read from the metrics.jsonl files: time_step and its parts,
    time_advantage being KTAE's K1-K7 or OAR's scoring."""
    def run(method, n_steps):
        with tempfile.TemporaryDirectory() as d:
            cmd = [sys.executable, TRAIN, "--method", method, "--steps", str(n_steps), "--eval-every", "1000",
                   "--save-every", "1000", "--run-dir", d] + (["--threads", str(threads)] if threads else [])
            subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
            return [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl")) if '"time_step"' in l][warmup:]

    run(methods[0], warmup + 2)  # thrown away: a first process after an idle spell can run slower
    lines = {m: [] for m in methods}
    for r in range(rounds):  # every other round in reverse, so that the first run of a round is not always one method
        for m in (methods if r % 2 == 0 else methods[::-1]):
            lines[m] += run(m, steps)
    rows = {m: {k: statistics.median(r[k] for r in lines[m])
                for k in ("time_step", "time_sample", "time_advantage", "time_train")} for m in methods}
    base = rows[methods[0]]["time_step"]
    print(f"{'method':8s} {'s/step':>8s} {'x ' + methods[0]:>8s} {'sample':>8s} {'advantage':>10s} {'train':>8s}")
    for m, r in rows.items():
        print(f"{m:8s} {r['time_step']:8.3f} {r['time_step'] / base:8.2f} {r['time_sample']:8.3f} "
              f"{r['time_advantage']:10.4f} {r['time_train']:8.3f}")
    for m, r in rows.items():
        print(f"{m}: the advantage takes {100 * r['time_advantage'] / r['time_step']:.2f} % of its step, "
              f"{r['time_advantage'] / rows[methods[0]]['time_train']:.2f}x {methods[0]}'s training pass")
    return rows


def bench_trl(steps=14, warmup=4):
    """Seconds per step of TRL's GRPOTrainer on the tiny default, at the setting of bench_rl_steps: 16 prompts x 8
    completions (one optimizer step per 128), at most 48 new tokens, temperature 1 with top-k and top-p off,
    beta 0, the same reward (reward.is_correct) and learning rate. TRL's defaults otherwise, but gradient
    checkpointing off, as ours is (TRL turns it on). Timed from step
    begin to step end by a callback."""
    try:
        from datasets import Dataset
        from transformers import TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as e:
        sys.exit(f"--trl: {e}; `pip install trl` (measured with trl 1.16.0), best in a separate virtual environment")
    import reward
    from toyworld import tiny
    model, tok, _ = tiny.load_or_build()
    qs = tiny.train_problems(random.Random(0), 16 * steps, set(tiny.eval_problems()))
    data = Dataset.from_list([{"prompt": tiny.prompt(q), "answer": tiny.answer(q)} for q in qs])

    def correct(prompts, completions, answer, **kwargs):
        return [float(reward.is_correct(c, a) is True) for c, a in zip(completions, answer)]

    times = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter() - self.t0)

    with tempfile.TemporaryDirectory() as d:
        cfg = GRPOConfig(output_dir=d, per_device_train_batch_size=128, gradient_accumulation_steps=1,
                         num_generations=8, max_completion_length=48, temperature=1.0, top_k=0, top_p=1.0,
                         learning_rate=5e-5, beta=0.0, num_iterations=1, max_steps=steps, use_cpu=True, bf16=False,
                         gradient_checkpointing=False, report_to="none", save_strategy="no", logging_steps=1000,
                         disable_tqdm=True, seed=0)
        GRPOTrainer(model=model, processing_class=tok, reward_funcs=correct, args=cfg, train_dataset=data,
                    callbacks=[Timer()]).train()
    t = statistics.median(times[warmup:])
    print(f"TRL GRPOTrainer: {t:.3f} s per step (median of steps {warmup + 1}-{steps})")
    return t


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only-steps", action="store_true", help="only the seconds per RL step (skip the sampler and "
                                                              "KTAE benchmarks)")
    p.add_argument("--methods", default=",".join(methods.short_names()),
                   help="RL step benchmark: comma-separated train.py methods; the first is the baseline "
                        "(default: %(default)s)")
    p.add_argument("--steps", type=int, default=14, help="RL steps per run (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=4, help="RL steps per run left out of the median "
                                                         "(default: %(default)s)")
    p.add_argument("--rounds", type=int, default=2, help="runs per method, taking turns (default: %(default)s)")
    p.add_argument("--repeat", type=int, default=11, help="sampler: timed repetitions (default: %(default)s)")
    p.add_argument("--trl", action="store_true", help="also TRL's GRPOTrainer (needs `pip install trl`)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch, here and in every train.py "
                                                             "run (default: torch's choice; on a shared machine "
                                                             "pass what is yours)")
    args = p.parse_args(argv)
    chosen = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    if args.steps <= args.warmup:
        p.error(f"--steps {args.steps} must exceed --warmup {args.warmup}")
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if not args.only_steps:
        bench_sampler(args.repeat)
        bench_ktae_qwen_group()
    rows = bench_rl_steps(chosen, args.steps, args.warmup, args.rounds, args.threads)
    if args.trl:
        t = bench_trl(args.steps, args.warmup)
        print(f"our {chosen[0]} step / TRL's: {rows[chosen[0]]['time_step'] / t:.2f}")


if __name__ == "__main__":
    main()
