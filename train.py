"""Critic-free RL for math reasoning, one loop: sample -> reward -> advantage -> loss -> step -> log -> evaluate -> save.

    python train.py --method grpo                 # the tiny world, on a laptop CPU, in a few minutes
    python train.py --method grpo --model DIR     # any local HF causal LM directory (or a hub name, online)

The equations live in grpo.py (G1-G5); this file only wires them together. Every step appends one JSON line to
RUN_DIR/metrics.jsonl; checkpoints go to RUN_DIR/checkpoint (an HF model directory plus the optimizer, step
and RNG states), and --resume continues from there.
"""
import argparse
import math
import os
import random
import sys
import time

import torch
from tqdm import tqdm

import checkpoint
import dapo
import data
import evaluate
import grpo
import ktae
import models
import oar
import plots
import reward
import sample
import tiny

# ktae = GRPO + KTAE (K7 on top of G1); dapo+ktae = DAPO + KTAE (K7 on top of DAPO's advantage);
# oar-p / oar-g = GRPO with OAR's token weights from perturbations (O2) or one gradient (O3), plugged in by O6
METHODS = ["grpo", "dapo", "ktae", "dapo+ktae", "oar-p", "oar-g"]
# What --method dapo switches on (dapo.md D1-D4, rewards +-1, no KL); any of these flags given explicitly wins,
# and each can be given alone on top of grpo, which is how the paper's ablation ladder is run.
DAPO = {"eps_high": 0.28, "agg": "token-mean", "dynamic_sampling": True, "keep_surplus": True,
        "overlong_buffer": "1/6", "signed_reward": True}
GRPO = {"eps_high": None, "agg": "seq-mean-token-mean", "dynamic_sampling": False, "keep_surplus": False,
        "overlong_buffer": 0, "signed_reward": False}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--method", choices=METHODS, default="grpo",
                   help="grpo, dapo (its preset below), ktae = GRPO + KTAE, dapo+ktae, oar-p / oar-g = GRPO + OAR")
    p.add_argument("--model", default="tiny", help="'tiny' (built here), a local HF model directory, or a hub name")
    p.add_argument("--run-dir", default=None, help="default: runs/METHOD-seedSEED")
    p.add_argument("--resume", action="store_true", help="continue from RUN_DIR/checkpoint (same method and task)")
    p.add_argument("--overwrite", action="store_true", help="start over in a RUN_DIR that holds another run, deleting it")
    p.add_argument("--seed", type=int, default=0, help="fixes the problems drawn, the sampling and the initial RNG")
    # the task
    p.add_argument("--dataset", default="tiny",
                   help="training problems: tiny (generated), gsm8k, math500, a .jsonl file, or a hub name")
    p.add_argument("--eval-dataset", default=None, help="held-out problems (tiny: its 256; else default math500)")
    p.add_argument("--eval-limit", type=int, default=256, help="first N held-out problems")
    p.add_argument("--data-dir", default=data.DATA_DIR, help="where the benchmark files are (else: the hub)")
    # sampling
    p.add_argument("--steps", type=int, default=400, help="RL steps (each: one batch of rollouts, --mu updates)")
    p.add_argument("--max-minutes", type=float, default=None,
                   help="stop after this much training wall time (then evaluate and save): compare methods at equal time")
    p.add_argument("--prompts-per-step", type=int, default=16, help="B, prompts per step")
    p.add_argument("--group-size", type=int, default=8, help="G, rollouts per prompt")
    p.add_argument("--max-new-tokens", type=int, default=48, help="response length limit; longer ones are truncated")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (also applied in the loss)")
    p.add_argument("--problem-pool", type=int, default=0,
                   help="tiny: train on a fixed pool of this many problems (0: fresh problems every step)")
    p.add_argument("--gen-batch-size", type=int, default=0,
                   help="prompts per generate call (0: all B at once); fewer prompts, smaller KV cache")
    p.add_argument("--eval-batch-size", type=int, default=256, help="prompts per generate call when evaluating")
    # optimisation
    p.add_argument("--lr", type=float, default=5e-5, help="AdamW learning rate (the tiny model; 1e-6 for 1.5B)")
    p.add_argument("--warmup-steps", type=int, default=10, help="linear learning-rate warm-up, then constant")
    p.add_argument("--grad-clip", type=float, default=1.0, help="clip the gradient's global norm to this")
    p.add_argument("--mu", type=int, default=1, help="optimizer updates per batch of rollouts (G3: the clip binds when > 1)")
    p.add_argument("--micro-batch-size", type=int, default=64, help="rollouts per training forward (accumulated)")
    # the objective
    p.add_argument("--beta", type=float, default=0.0, help="G4 KL weight; 0 loads no reference model")
    p.add_argument("--ref-on-cpu", action="store_true", help="keep the reference model on the CPU between uses")
    p.add_argument("--eps-low", type=float, default=0.2, help="G3 clip: rho >= 1 - eps_low where A < 0")
    p.add_argument("--eps-high", type=float, default=None, help="D1 clip-higher (dapo: 0.28; default eps-low)")
    p.add_argument("--agg", default=None, choices=["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"],
                   help="G5 (grpo: seq-mean-token-mean; dapo: token-mean, D3)")
    # DAPO (dapo.md); --method dapo turns on all but the overlong filter
    p.add_argument("--dynamic-sampling", action=argparse.BooleanOptionalAction, default=None,
                   help="D2: keep only groups with 0 < #correct < G, sampling more until the batch is full")
    p.add_argument("--max-sampling-rounds", type=int, default=10, help="D2: rounds of generation at most per step")
    p.add_argument("--keep-surplus", action=argparse.BooleanOptionalAction, default=None,
                   help="D2: mixed groups beyond the batch wait in a buffer for the next step (DAPO's Algorithm 1 "
                        "buffer; dapo: on) instead of being dropped (as verl does)")
    p.add_argument("--short-batch", choices=["train", "stop"], default="train",
                   help="D2: after the last round, train on the groups kept, or stop with a message")
    p.add_argument("--overlong-buffer", type=int, default=None,
                   help="D4 L_cache: soft length penalty over the last L_cache of --max-new-tokens tokens "
                        "(0: off; dapo: a sixth of --max-new-tokens, as KTAE's 512 of 3072)")
    p.add_argument("--overlong-filter", action="store_true", help="D4: mask truncated rollouts out of the loss")
    p.add_argument("--signed-reward", action=argparse.BooleanOptionalAction, default=None,
                   help="rewards +1 / -1 as DAPO (default 1 / 0)")
    p.add_argument("--no-std-scale", action="store_true", help="G1 Dr. GRPO: A = r - mean(r)")
    # KTAE (K6 weights and the paper's ablations)
    p.add_argument("--ktae-alpha", type=float, default=1.0, help="K6 weight of the Fisher strength (0: ablate)")
    p.add_argument("--ktae-beta", type=float, default=1.0, help="K6 weight of the information gain (0: ablate)")
    p.add_argument("--ktae-top", type=float, default=1.0, help="K6 largest key-token value")
    p.add_argument("--ktae-no-tf", action="store_true", help="K5 without the BM25 frequency term (D = h)")
    # OAR (oar.md O1-O5)
    p.add_argument("--oar-q", type=float, default=0.25, help="O5 quantile level (an independent reimplementation: 0.4)")
    p.add_argument("--oar-beta", type=float, default=1.0, help="O5 boost (an independent reimplementation: 2.0)")
    p.add_argument("--oar-sigma", type=float, default=1e-3, help="O3 noise on the reasoning embeddings")
    p.add_argument("--oar-probe", choices=["last", "answer_mean"], default=None,
                   help="O1 outcome probe (oar-p: last; oar-g: answer_mean)")
    p.add_argument("--oar-chunk", type=int, default=None,
                   help="sequences per scoring forward (O2: perturbed copies; O3: rollouts); default 64 on the tiny "
                        "world, 8 for other models (OAR-G keeps every layer's activations: ~1.2 MB a token at 1.5B)")
    p.add_argument("--oar-cue", default=None, help="the conclude cue appended after the reasoning (the tiny world: "
                                                    "its own '\\boxed{'; other models: the paper note's sentence)")
    # evaluation and saving
    p.add_argument("--eval-every", type=int, default=50, help="greedy held-out evaluation every N steps (and at the end)")
    p.add_argument("--save-every", type=int, default=50, help="checkpoint every N steps (and at the end)")
    # hardware
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--bf16", action="store_true",
                   help="bf16 autocast for sampling, scoring and the training forward (GPU); the weights, gradients "
                        "and AdamW states stay float32, since a 1e-6 update is below a bf16 weight's precision")
    p.add_argument("--grad-checkpointing", action="store_true", help="recompute activations in backward (GPU memory)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    p.add_argument("--dry-run", action="store_true", help="print the memory plan for these settings and exit "
                                                          "(reads only the model's config.json)")
    p.add_argument("--gpu-memory", type=float, default=80, help="GiB to plan against when no GPU is visible")
    args = p.parse_args(argv)
    preset = DAPO if args.method.startswith("dapo") else GRPO
    for k, v in preset.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.overlong_buffer == "1/6":
        args.overlong_buffer = max(1, args.max_new_tokens // 6)
    args.eval_dataset = args.eval_dataset or ("tiny" if args.dataset == "tiny" else "math500")
    args.oar_probe = args.oar_probe or ("last" if args.method == "oar-p" else "answer_mean")
    args.oar_chunk = args.oar_chunk or (64 if args.model == "tiny" else 8)
    if args.oar_cue is None:
        args.oar_cue = "\\boxed{" if args.model == "tiny" else "\nTherefore, the final answer is \\boxed{"
    args.run_dir = args.run_dir or os.path.join("runs", f"{args.method}-seed{args.seed}")
    check_args(p, args)
    return args



def check_args(p, args):
    """Every flag checked before anything heavy runs: a bad value is one argparse error naming the flag, not a
    traceback after the model load or a run that silently does nothing."""
    at_least = {"steps": 1, "prompts_per_step": 1, "max_new_tokens": 1, "micro_batch_size": 1, "mu": 1,
                "eval_every": 1, "save_every": 1, "eval_limit": 1, "eval_batch_size": 1, "max_sampling_rounds": 1,
                "gen_batch_size": 0, "problem_pool": 0, "warmup_steps": 0, "threads": 1, "oar_chunk": 1}
    for name, low in at_least.items():
        value = getattr(args, name)
        if value is not None and value < low:
            p.error(f"--{name.replace('_', '-')} {value}: must be at least {low}")
    if args.group_size < 2:  # G1 divides by the group's standard deviation, which needs two rollouts
        p.error(f"--group-size {args.group_size}: must be at least 2 (G1 compares rollouts within a group)")
    positive = {"lr": args.lr, "temperature": args.temperature, "grad_clip": args.grad_clip,
                "oar_sigma": args.oar_sigma, "ktae_top": args.ktae_top, "gpu_memory": args.gpu_memory}
    for name, value in positive.items():
        if not value > 0:  # also catches nan
            p.error(f"--{name.replace('_', '-')} {value}: must be greater than 0")
    for name in ("beta", "ktae_alpha", "ktae_beta", "oar_beta"):
        if not getattr(args, name) >= 0:
            p.error(f"--{name.replace('_', '-')} {getattr(args, name)}: must be at least 0")
    if not 0 < args.eps_low < 1 or (args.eps_high is not None and not args.eps_high > 0):
        p.error(f"--eps-low {args.eps_low} / --eps-high {args.eps_high}: need 0 < eps-low < 1 and eps-high > 0")
    if not 0 < args.oar_q < 1:
        p.error(f"--oar-q {args.oar_q}: O5's quantile level must lie strictly between 0 and 1")
    if args.method.endswith("ktae") and args.ktae_alpha == 0 and args.ktae_beta == 0:
        p.error("--ktae-alpha 0 --ktae-beta 0: every key-token value (K6) would be 0, which is plain GRPO; "
                "use --method grpo, or keep one of the two")
    if args.overlong_buffer not in (None, "1/6") and not 0 <= args.overlong_buffer < args.max_new_tokens:
        p.error(f"--overlong-buffer {args.overlong_buffer}: must be at least 0 and below --max-new-tokens "
                f"{args.max_new_tokens}")
    if args.max_minutes is not None and not args.max_minutes >= 0:
        p.error(f"--max-minutes {args.max_minutes}: must be at least 0")
    if args.resume and args.overwrite:
        p.error("--resume and --overwrite: choose one (continue the run, or delete it and start over)")


def save_checkpoint(args, model, tokenizer, optimizer, scheduler, step, problem_rng, extra):
    """RUN_DIR/checkpoint (checkpoint.save): the HF model directory and state.pt: optimizer, scheduler, RNG states
    and `extra` (D2's surplus), everything --resume needs to continue bit for bit."""
    checkpoint.save(args.run_dir, model, tokenizer, {
        "step": step, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
        "torch_rng": torch.get_rng_state(), "problem_rng": problem_rng.getstate(), "args": vars(args), **extra})


# A run that has stopped learning says so in the log: over the last DEGENERATE_WINDOW steps every sampled answer was
# wrong (or every one right), so every group agrees and G1's advantage is 0; or most rollouts hit the length limit.
DEGENERATE_WINDOW, TRUNCATION_WARNING = 20, 0.5


def degenerate(records: list) -> dict:
    """{kind: warning} about the last DEGENERATE_WINDOW step records (none before there are that many)."""
    last = records[-DEGENERATE_WINDOW:]
    if len(last) < DEGENERATE_WINDOW:
        return {}
    n, warnings = len(last), {}
    if all(r["accuracy"] == 0 for r in last):
        warnings["all wrong"] = (f"every sampled answer was wrong in the last {n} steps: all advantages are 0 and nothing is "
                                 f"learned (a task too hard for the model, or a prompt or grader that fails?)")
    if all(r["accuracy"] == 1 for r in last):
        warnings["all right"] = (f"every sampled answer was right in the last {n} steps: all advantages are 0 and nothing "
                                 f"is left to learn on these problems")
    truncated = sum(r["truncated"] for r in last) / n
    if truncated > TRUNCATION_WARNING:
        warnings["truncated"] = (f"{truncated:.0%} of the rollouts of the last {n} steps hit --max-new-tokens (an EOS "
                                 f"that is never sampled cannot be learned back: see --overlong-buffer, D4)")
    return warnings


def write_heatmap(args, step, tokenizer, qs, resp, mask, rewards, values):
    """RUN_DIR/heatmaps/stepN.html: the first group of this batch that mixes right and wrong answers, every
    token coloured by its KTAE key-token value or its OAR weight, each rollout with its reward and sequence
    advantage (plots.token_heatmap builds the page and its legend)."""
    G = args.group_size
    mixed = [g for g in range(len(qs)) if 0 < (rewards[g] > 0).sum() < G]
    if not mixed:
        return
    g = mixed[0]
    adv = grpo.group_advantages(rewards[g:g + 1], scale_std=not args.no_std_scale).view(-1).tolist()  # G1, [G]
    rollouts = []
    for i in range(g * G, (g + 1) * G):
        n = int(mask[i].sum())
        tokens = [tokenizer.decode([t]) for t in resp[i, :n].tolist()]
        rollouts.append((tokens, values[i, :n].tolist(), rewards[g, i - g * G].item(), adv[i - g * G]))
    os.makedirs(os.path.join(args.run_dir, "heatmaps"), exist_ok=True)
    is_oar = args.method.startswith("oar")
    plots.token_heatmap(os.path.join(args.run_dir, "heatmaps", f"step{step}.html"),
                        f"{args.method}: {'OAR weights' if is_oar else 'key-token values'}, step {step}",
                        qs[g]["prompt"], rollouts, kind="oar" if is_oar else "ktae",
                        scale=args.oar_beta if is_oar else 1.0)


def oar_weights(args, model, tokenizer, batch, qs, adv_seq, piece_cache):
    """OAR's token weights [N, T] for this batch (oar.token_weights does O1-O5). Its inputs come from the sampled
    ids: each rollout's prompt tokens, its response without EOS and each token's decoded text (for the spans),
    and the gold answer's tokens with the closing brace for the teacher-forced probe."""
    P, G = batch["prompt_len"], args.group_size
    ids, attn, mask = batch["input_ids"].tolist(), batch["attention_mask"].tolist(), batch["response_mask"]
    n_resp = (mask.sum(-1) - (~batch["truncated"]).long()).tolist()  # response tokens before the EOS
    prompts = [[t for t, a in zip(row[:P], am[:P]) if a] for row, am in zip(ids, attn)]
    responses = [row[P:P + n] for row, n in zip(ids, n_resp)]
    for t in {t for r in responses for t in r} - piece_cache.keys():
        piece_cache[t] = tokenizer.decode([t])
    pieces = [[piece_cache[t] for t in r] for r in responses]
    enc = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]
    answers = [enc(q["answer"] + "}") for q in qs for _ in range(G)]
    return oar.token_weights(model, prompts, responses, pieces, answers, enc(args.oar_cue), adv_seq, mask.shape[1],
                             tokenizer.pad_token_id, scorer="perturb" if args.method == "oar-p" else "gradient",
                             probe=args.oar_probe, q=args.oar_q, beta=args.oar_beta, sigma=args.oar_sigma,
                             chunk=args.oar_chunk)


def main(argv=None):
    args = parse_args(argv)
    if args.dry_run:
        cfg = models.load_config(args.model)
        gpu = (torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available()
               else int(args.gpu_memory * models.GiB))
        return models.dry_run(cfg, args, gpu)
    # what can fail without loading anything fails now, in one line, and leaves no run directory behind
    models.check_path(args.model)
    checkpoint.check(args.run_dir, args, args.resume, args.overwrite)
    ckpt = checkpoint.find(args.run_dir) if args.resume else None
    rss_at_start = models.rss_bytes()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    problem_rng = random.Random(args.seed)

    # ---- the policy, its optimizer, and (only if beta > 0) a frozen reference -----------------------------
    model, tokenizer, model_path = models.load_model(ckpt or args.model)
    if ckpt:
        checkpoint.check_finite(model, ckpt)
    model.to(args.device)
    if args.grad_checkpointing:
        model.activation_checkpointing_enable()
    ref_model = None
    if args.beta > 0:
        ref_model, _, _ = models.load_model(args.model)
        ref_model.eval().requires_grad_(False)
        ref_model.to("cpu" if args.ref_on_cpu else args.device, dtype=torch.bfloat16 if args.bf16 else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / max(args.warmup_steps, 1)))
    start, state = 0, {}
    if ckpt:
        state = checkpoint.load_state(ckpt)
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        problem_rng.setstate(state["problem_rng"])
        scheduler.load_state_dict(state["scheduler"])
        start = state["step"]

    # ---- the task: problems with their prompts and gold answers; held-out problems never appear in training -----
    eval_problems, skipped = data.load(args.eval_dataset, "test", args.data_dir, args.eval_limit)
    if args.dataset == "tiny":
        held_out = {p["question"] for p in eval_problems}
        pool = ([data.tiny_problem(q) for q in tiny.train_problems(random.Random(args.seed), args.problem_pool,
                                                                   held_out)] if args.problem_pool else None)
    else:
        pool, skipped_train = data.load(args.dataset, data.train_split(args.dataset), args.data_dir)
        skipped += skipped_train
        if not pool:
            sys.exit(f"--dataset {args.dataset}: no usable problem")
        print(f"{len(pool)} training problems from {args.dataset}, {len(eval_problems)} held out from "
              f"{args.eval_dataset}")
    for line in skipped[:20]:
        print(f"skipped {line}")
    if skipped:
        print(f"{len(skipped)} rows skipped in all (no question or no answer)")
    for p in (pool or []) + eval_problems:  # the tiny world's prompts are its own; others: the chat template
        p["prompt"] = p.get("prompt") or data.build_prompt(tokenizer, p["question"])
    eval_prompts, eval_golds = [p["prompt"] for p in eval_problems], [p["answer"] for p in eval_problems]
    amp = lambda: torch.autocast(args.device.split(":")[0], dtype=torch.bfloat16, enabled=args.bf16)  # noqa: E731

    # ---- the run directory: ours from here on (locked); on resume the metrics after the checkpoint go ------------
    lock = checkpoint.claim(args.run_dir, args, args.resume, args.overwrite)  # held while this run writes
    metrics_path = os.path.join(args.run_dir, "metrics.jsonl")
    if ckpt:  # the lines logged after the checkpoint are about to be recomputed
        kept = checkpoint.read_metrics(metrics_path, up_to_step=start)
        checkpoint.rewrite_metrics(metrics_path, kept)
        print(f"resumed from {ckpt} at step {start}")
    log = lambda record: checkpoint.append_metrics(metrics_path, record)  # noqa: E731

    def run_eval(step):
        with amp():
            r = evaluate.score(model, tokenizer, eval_prompts, eval_golds, max_new_tokens=args.max_new_tokens,
                               batch_size=args.eval_batch_size)
        log({"step": step, "eval_accuracy": r["accuracy"], "eval_response_len": r["response_len"],
             "eval_boxed": r["boxed"], "eval_n": r["n"]})
        return r["accuracy"]

    if start == 0:
        first_acc = run_eval(0)
    else:  # None if the step-0 evaluation's line is gone
        first_acc = next((r["eval_accuracy"] for r in kept if r.get("step") == 0 and "eval_accuracy" in r), None)
    print(f"greedy held-out accuracy before: {_fmt(first_acc)} ({len(eval_problems)} problems)")

    B, G = args.prompts_per_step, args.group_size
    piece_cache = {}  # token id -> its decoded text, for OAR's spans
    # D2 with --keep-surplus: mixed groups sampled beyond the last batch (saved with the checkpoint)
    surplus_qs, surplus = state.get("surplus_qs", []), state.get("surplus", [])
    surplus = [{k: v.to(args.device) if torch.is_tensor(v) else v for k, v in b.items()} for b in surplus]
    history, warned = [r for r in (kept if ckpt else []) if "accuracy" in r], set()  # step records, for degenerate()
    t_start = time.time()

    def finish_step(done: int, heatmap=None) -> bool:
        """7. evaluate and 8. save when due, and at the end or when out of time. True when the run should stop."""
        out_of_time = args.max_minutes is not None and time.time() - t_start > 60 * args.max_minutes
        last_step = done == args.steps or out_of_time
        if done % args.eval_every == 0 or last_step:
            tqdm.write(f"step {done}: greedy held-out accuracy {run_eval(done):.3f}")
            if heatmap is not None:
                heatmap(done)
        if done % args.save_every == 0 or last_step:
            save_checkpoint(args, model, tokenizer, optimizer, scheduler, done, problem_rng,
                            {"surplus_qs": surplus_qs, "surplus": surplus})
        if out_of_time:
            tqdm.write(f"--max-minutes {args.max_minutes} reached after {done} steps")
        return out_of_time

    bar = tqdm(range(start, args.steps), initial=start, total=args.steps, desc=args.method)
    for step in bar:
        # ---- 1. sample B prompts x G rollouts, keeping log pi_old of every sampled token ------------------
        # With D2 (dynamic sampling) rounds of B prompts are drawn until B groups mix right and wrong answers.
        t_step = t0 = time.time()
        # Mixed groups left over from the last step's rounds come first (their log pi_old is the older policy's,
        # which the ratio G2 accounts for; they are at most a step or two old).
        kept_qs, kept, generated, rounds, checker = list(surplus_qs), list(surplus), 0, 0, reward.new_stats()
        while len(kept_qs) < B and rounds < (args.max_sampling_rounds if args.dynamic_sampling else 1):
            qs = ([problem_rng.choice(pool) for _ in range(B)] if pool else
                  [data.tiny_problem(q) for q in tiny.train_problems(problem_rng, B, held_out)])
            prompt_ids = [tokenizer(q["prompt"])["input_ids"] for q in qs]
            gen = args.gen_batch_size or B
            with amp():  # one autocast region per call: the bf16 copies of the weights are made once, not per token
                b = sample.concat_batches([sample.generate(
                    model, prompt_ids[i:i + gen], n=G, max_new_tokens=args.max_new_tokens,
                    temperature=args.temperature, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id)
                    for i in range(0, B, gen)], tokenizer.pad_token_id)
            texts = tokenizer.batch_decode(b["input_ids"][:, b["prompt_len"]:], skip_special_tokens=True)
            b["correct"] = torch.tensor([reward.is_correct(t, q["answer"], checker) is True
                                         for t, q in zip(texts, [q for q in qs for _ in range(G)])],
                                        device=args.device)  # [B*G]
            keep = (dapo.mixed_groups(b["correct"].view(B, G)) if args.dynamic_sampling
                    else torch.ones(B, dtype=torch.bool, device=args.device))  # [B]
            kept_qs += [q for q, k in zip(qs, keep) if k]
            kept.append(sample.select_rows(b, keep.repeat_interleave(G).nonzero().squeeze(1)))
            generated, rounds = generated + B, rounds + 1
        if len(kept_qs) < B and args.short_batch == "stop":
            sys.exit(f"D2 dynamic sampling: only {len(kept_qs)} of {B} groups mixed right and wrong answers after "
                     f"{rounds} rounds (--max-sampling-rounds); --short-batch train continues with what was kept")
        if not kept_qs:  # D2 found nothing to learn from: no update, but the step's duties still run
            tqdm.write(f"step {step + 1}: no group mixed right and wrong answers in {rounds} rounds; no update")
            log({"step": step + 1, "no_update": "no group mixed right and wrong answers", "groups_generated": generated,
                 "sampling_rounds": rounds, "time_step": time.time() - t_step})
            if finish_step(step + 1):
                break
            continue
        qs, carried, n_kept = kept_qs[:B], len(surplus_qs), len(kept_qs)
        pooled = sample.concat_batches(kept, tokenizer.pad_token_id)
        batch = sample.select_rows(pooled, torch.arange(len(qs) * G))
        if args.keep_surplus and len(kept_qs) > B:
            surplus_qs, surplus = kept_qs[B:], [sample.select_rows(pooled, torch.arange(B * G, len(kept_qs) * G))]
        else:
            surplus_qs, surplus = [], []
        ids, attn, mask = batch["input_ids"], batch["attention_mask"], batch["response_mask"]  # [N,P+T] [N,P+T] [N,T]
        P, Bk = batch["prompt_len"], len(qs)
        t_sample = time.time() - t0

        # ---- 2. reward: the last \boxed{} against the gold answer; DAPO: +-1 and the D4 length penalty ------
        correct = batch["correct"].view(Bk, G)  # [Bk, G]
        rewards = dapo.signed_reward(correct) if args.signed_reward else correct.float()  # [Bk, G]
        if args.overlong_buffer:
            rewards = rewards + dapo.overlong_penalty(mask.sum(-1), args.max_new_tokens, args.overlong_buffer).view(Bk, G)
        if args.overlong_filter:  # D4: truncated rollouts leave the loss (and the statistics of K2)
            mask = dapo.overlong_filter(mask, batch["truncated"])  # [N, T]

        # ---- 3. advantage: G1, one value per rollout, broadcast to its tokens; KTAE adds K7 per token ------
        t0 = time.time()
        adv_seq = grpo.group_advantages(rewards, scale_std=not args.no_std_scale).view(-1).to(args.device)  # [N]
        token_values = None
        if args.method.endswith("ktae"):
            token_values, _ = ktae.token_values(
                ids[:, P:], mask, rewards, special_ids=(tokenizer.pad_token_id, tokenizer.eos_token_id),
                alpha=args.ktae_alpha, beta=args.ktae_beta, top=args.ktae_top, use_tf=not args.ktae_no_tf)  # [N, T]
            adv = ktae.token_advantages(adv_seq, token_values, mask)  # [N, T]
        elif args.method.startswith("oar"):
            with amp():
                token_values = oar_weights(args, model, tokenizer, batch, qs, adv_seq, piece_cache)  # [N, T]
            adv = oar.token_advantages(adv_seq, token_values, mask)  # [N, T]
        else:
            adv = adv_seq[:, None] * mask  # [N, T]
        t_advantage = time.time() - t0

        ref_logp = None
        if ref_model is not None:  # G4's reference, micro-batched like the training forward
            ref_model.to(args.device)
            with torch.no_grad(), amp():
                ref_logp = torch.cat([sample.token_logprobs(
                    ref_model, ids[s:s + args.micro_batch_size], attn[s:s + args.micro_batch_size], P, args.temperature,
                    groups=torch.arange(s, min(s + args.micro_batch_size, ids.shape[0]), device=ids.device) // G)
                    for s in range(0, ids.shape[0], args.micro_batch_size)])  # [N, T]
            if args.ref_on_cpu:
                ref_model.to("cpu")

        # ---- 4-5. loss and optimizer step: mu updates, each accumulated over micro-batches -----------------
        t0 = time.time()
        model.train()
        N, n_tokens = ids.shape[0], mask.sum()
        # Only rollouts with a non-zero advantage on some token are scored. With beta = 0 a rollout whose every
        # A_{i,t} is 0 adds exactly 0 to the loss, its gradient and its statistics (G3: rho * 0 = clip(rho) * 0 = 0);
        # it still counts in the normalisers n_seqs and n_tokens, passed in whole. In GRPO these are the groups
        # that all agree (a fifth to a quarter of them on the tiny task), so this saves that share of the training
        # forward and backward. A batch where no rollout counts makes no update (AdamW skips parameters without
        # a gradient), as DAPO's D2 would have it. With beta > 0 the KL term (G4) needs every rollout.
        lengths = batch["response_mask"].sum(-1)  # [N]
        scored = (adv != 0).any(-1) | (args.beta > 0)  # [N]
        # Micro-batches take rollouts in order of length and stop at their longest response: a padding column costs
        # a full forward and backward and changes nothing (its mask is 0).
        by_length = lengths.argsort()  # [N]
        by_length = by_length[scored[by_length]]  # [n_scored]
        stats_sum, grad_norm = {"policy_term": 0.0, "kl": 0.0, "clip_low": 0.0, "clip_high": 0.0}, 0.0
        nonfinite = 0
        for _ in range(args.mu):
            optimizer.zero_grad(set_to_none=True)
            loss_sum = torch.zeros((), device=args.device)
            for s in range(0, len(by_length), args.micro_batch_size):
                mb = by_length[s:s + args.micro_batch_size]  # [n] rollouts of similar length
                t = int(lengths[mb].max())  # the micro-batch's longest response: the columns after it are padding
                with amp():
                    logp = sample.token_logprobs(model, ids[mb, :P + t], attn[mb, :P + t], P, args.temperature,
                                                 groups=mb // G)  # [n, t]; a group's prompt runs once
                # normalise by the whole batch's counts (G5), so the accumulated gradient is the full batch's
                loss, st = grpo.policy_loss(
                    logp, batch["logprobs"][mb, :t], adv[mb, :t], mask[mb, :t], eps_low=args.eps_low,
                    eps_high=args.eps_high, beta=args.beta, ref_logp=None if ref_logp is None else ref_logp[mb, :t],
                    agg=args.agg, max_new_tokens=args.max_new_tokens, n_seqs=N, n_tokens=n_tokens)
                loss.backward()
                loss_sum += loss.detach()
                for k, v in st.items():
                    stats_sum[k] = stats_sum.get(k, 0.0) + v / args.mu
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip).item()
            if math.isfinite(grad_norm) and torch.isfinite(loss_sum):
                optimizer.step()
            else:  # a NaN or infinity must never reach the weights or AdamW's moments: skip this update, count it
                nonfinite += 1
                tqdm.write(f"step {step + 1}: the loss or the gradient is not finite; this update is skipped")
            optimizer.zero_grad(set_to_none=True)  # free the gradients before the next sampling
        scheduler.step()
        t_train, t_step = time.time() - t0, time.time() - t_step

        # ---- 6. log ----------------------------------------------------------------------------------------
        record = {
            "step": step + 1,
            "reward_mean": rewards.mean().item(),
            "accuracy": correct.float().mean().item(),
            "response_len": mask.sum(-1).float().mean().item(),
            "entropy": ((batch["entropy"] * mask).sum() / n_tokens).item(),  # of the sampling distribution
            "zero_adv_groups": (rewards.std(dim=1) == 0).float().mean().item(),
            "truncated": batch["truncated"].float().mean().item(),
            "boxed": 1 - checker["no_box"] / max(checker["graded"], 1),  # share of sampled responses with a \boxed answer
            "checker_failures": checker["timeouts"] + checker["errors"] + checker["gold_unparseable"],
            "groups_generated": generated,
            "groups_kept": len(qs),
            "groups_carried_in": carried,  # D2 surplus of earlier steps used here
            "groups_mixed": n_kept - carried,  # groups sampled this step that mixed right and wrong
            "sampling_rounds": rounds,
            "grad_norm": grad_norm,
            "nonfinite_updates": nonfinite,  # updates skipped because the loss or gradient was NaN or infinite
            "lr": scheduler.get_last_lr()[0],
            "time_sample": t_sample,
            "time_train": t_train,
            "time_step": t_step,  # sample + reward + advantage + loss + optimizer step
            "peak_memory_gib": models.peak_memory_bytes(args.device, rss_at_start) / models.GiB,
            "time_advantage": t_advantage,  # G1, and KTAE's K1-K7 or OAR's scoring (O1-O5)
            **stats_sum,
            **grpo.advantage_concentration(adv, mask, adv_seq),  # O7: ESS-ratio, top-10 % mass
        }
        record["clip_frac"] = record["clip_low"] + record["clip_high"]
        history.append(record)
        new_warnings = [w for kind, w in degenerate(history).items() if kind not in warned]
        warned.update(degenerate(history))  # each kind once, in the log and on the terminal
        for w in new_warnings:
            tqdm.write(f"warning, step {step + 1}: {w}")
        if new_warnings:
            record["warnings"] = new_warnings
        log(record)
        bar.set_postfix(reward=f"{record['reward_mean']:.2f}", len=f"{record['response_len']:.1f}")

        # ---- 7. evaluate, 8. save ----------------------------------------------------------------------------
        heatmap = None
        if token_values is not None:
            heatmap = lambda done: write_heatmap(args, done, tokenizer, qs, ids[:, P:], mask, rewards, token_values)  # noqa: E731
        if finish_step(step + 1, heatmap):
            break

    evals = [r for r in checkpoint.read_metrics(metrics_path) if "eval_accuracy" in r]
    last = evals[-1]["eval_accuracy"] if evals else None
    checkpoint.write_info(args.run_dir, args, finished=True, step=evals[-1]["step"] if evals else start)
    if lock is not None:
        lock.close()
    print(f"greedy held-out accuracy: {_fmt(first_acc)} -> {_fmt(last)}   (run directory: {args.run_dir})")
    return first_acc, last


def _fmt(accuracy) -> str:
    return "unknown" if accuracy is None else f"{accuracy:.3f}"


if __name__ == "__main__":
    main()
