"""Critic-free RL for math reasoning, one loop: sample -> reward -> advantage -> loss -> step -> log -> evaluate -> save.

    python train.py --method ktae                 # the tiny world, on a laptop CPU, in a few minutes
    python train.py --method grpo --model DIR     # any local HF causal LM directory (or a hub name, online)

The equations are in grpo.py (G1-G5), dapo.py (D1-D4), ktae.py (K1-K7) and oar.py (O1-O7), stated in EQUATIONS.md.
--method is a base and a token rule from the tables of methods.py; the flags and their checks are in config.py.
Every step appends one JSON line to RUN_DIR/metrics.jsonl; RUN_DIR/checkpoint (checkpoint.py) holds all that
--resume needs to continue bit for bit.

Where this loop departs from the papers (none changes an equation; see EQUATIONS.md#departures-from-the-papers):
- Rollouts whose every token advantage is 0 are not scored in the loss (they would add exactly 0 to it and to
  its gradient); they still count in the normalisers of G5.
- Micro-batches take rollouts in order of length, and the loss of the whole batch is normalised once (G5), so
  accumulating micro-batches gives the full batch's gradient.
- D2 keeps the mixed groups sampled beyond the batch for the next step (DAPO's Algorithm 1; verl drops them).
- A step whose loss or gradient norm is not finite is skipped and counted: a NaN never reaches the weights.
- AdamW (0.9, 0.99), no weight decay, linear warm-up then a constant rate; one update per batch (--mu 1), so the
  ratio G2 is 1 at the update except for D2's carried groups.
"""
import collections
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

import checkpoint
import config
import credit
import dapo
import data
import evaluate
import grpo
import memory
import methods
import models
import plots
import reward
import sample
import tasks


def main(argv=None):
    args = config.parse_args(argv)
    # the datasets are found (not yet read) first, --dry-run included: a missing file is one line naming its flag
    data.locate(args.dataset, data.train_split(args.dataset), args.data_dir, "--dataset")
    data.locate(args.eval_dataset, "test", args.data_dir, "--eval-dataset")
    if args.dry_run:
        gpu = (torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available()
               else int(args.gpu_memory * memory.GiB))
        return memory.dry_run(models.load_config(args.model), args, gpu)
    # what can fail without loading anything fails now, in one line, and leaves no run directory behind
    models.check_path(args.model)
    checkpoint.check(args.run_dir, args, args.resume, args.overwrite)
    run = start(args, checkpoint.find(args.run_dir) if args.resume else None)
    B, G = args.prompts_per_step, args.group_size
    bar = tqdm(range(run.step, args.steps), initial=run.step, total=args.steps, desc=args.method)
    for step in bar:
        t_step = time.time()
        # ---- 1. sample B prompts x G rollouts, with log pi_old of every sampled token --------------------------
        checker = reward.new_stats()  # the grader's counts (answers without a box, timeouts), logged below
        draw = lambda: sample_round(run, checker)  # noqa: E731  B fresh problems, G rollouts each, graded
        if args.dynamic_sampling:  # D2: rounds until B groups mix right and wrong answers
            got = dapo.fill_batch(draw, B, G, args.max_sampling_rounds, run.buffer, args.keep_surplus,
                                  run.tokenizer.pad_token_id)
        else:
            qs, batch = draw()
            got = {"problems": qs, "batch": batch, "buffer": ([], []), "generated": B, "rounds": 1, "carried": 0,
                   "mixed": B}
        if len(got["problems"]) < B and args.short_batch == "stop":
            sys.exit(f"D2 dynamic sampling: only {len(got['problems'])} of {B} groups mixed right and wrong answers "
                     f"after {got['rounds']} rounds (--max-sampling-rounds); --short-batch train continues with what "
                     f"was kept")
        run.buffer = got["buffer"]
        if got["batch"] is None:  # D2 found nothing to learn from: no update, but the step's duties still run
            tqdm.write(f"step {step + 1}: no group mixed right and wrong answers in {got['rounds']} rounds; no update")
            run.log({"step": step + 1, "no_update": "no group mixed right and wrong answers",
                     "groups_generated": got["generated"], "sampling_rounds": got["rounds"],
                     "time_step": time.time() - t_step})
            if finish_step(run, step + 1):
                break
            continue
        qs, batch = got["problems"], got["batch"]
        t_sample = time.time() - t_step

        # ---- 2. reward: the last \boxed{} against the gold answer; DAPO: +-1 and the D4 length penalty -----------
        rewards, mask = rewards_and_mask(args, batch, len(qs))  # [Bk, G], [N, T]

        # ---- 3. advantage: A_{i,t} from the token rule of --method (methods.py) ----------------------------------
        t0 = time.time()
        adv = methods.RULES[args.rule].advantages(batch, rewards, mask,
                                                  methods.Context(args, run.model, run.tokenizer, qs, run.pieces))
        t_advantage = time.time() - t0
        ref_logp = reference_logprobs(args, run.ref_model, batch)  # [N, T] G4's reference (beta > 0), else None

        # ---- 4-5. loss and optimizer step ---------------------------------------------------------------------
        t0 = time.time()
        stats = update(args, run.model, run.optimizer, batch, adv.tokens, mask, ref_logp, step)
        run.scheduler.step()
        t_train = time.time() - t0

        # ---- 6. log -------------------------------------------------------------------------------------------
        times = {"time_sample": t_sample, "time_train": t_train, "time_step": time.time() - t_step,
                 "time_advantage": t_advantage}
        record = step_record(run, step + 1, batch, rewards, mask, adv, checker, got, stats, times, qs)
        warn_if_degenerate(run, record)
        run.log(record)
        bar.set_postfix(reward=f"{record['reward_mean']:.2f}", len=f"{record['response_len']:.1f}")

        # ---- 7. evaluate, 8. save -----------------------------------------------------------------------------
        heatmap = None
        if methods.RULES[args.rule].heatmap:
            heatmap = lambda done: write_heatmap(args, done, run.tokenizer, qs, batch, mask, rewards, adv)  # noqa: E731
        if finish_step(run, step + 1, heatmap):
            break
    return finish(run)


@dataclass
class Run:
    """What the loop carries from step to step (and what a checkpoint saves of it)."""
    args: object
    model: torch.nn.Module
    tokenizer: object
    ref_model: torch.nn.Module  # G4's frozen reference, None when beta = 0
    optimizer: torch.optim.Optimizer
    scheduler: object
    problem_rng: random.Random  # draws the training problems
    task: dict  # pool (or None: fresh tiny problems), held_out, eval_prompts, eval_golds
    step: int = 0  # steps done
    buffer: tuple = ([], [])  # D2's mixed groups left over for the next step: (problems, batches)
    pieces: dict = field(default_factory=dict)  # token id -> its decoded text, for OAR's spans
    metrics_path: str = ""
    first_accuracy: float = None
    history: list = field(default_factory=list)  # the step records so far, for warn_if_degenerate
    warned: set = field(default_factory=set)
    lock: object = None
    rss_at_start: int = 0
    t_start: float = 0.0

    def log(self, record: dict):
        checkpoint.append_metrics(self.metrics_path, record)


def start(args, ckpt) -> Run:
    """The policy, its optimizer, a frozen reference (only if beta > 0), the task, and the run directory claimed;
    from the checkpoint ckpt when resuming. Ends with the step-0 evaluation of a fresh run."""
    rss_at_start = memory.rss_bytes()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    problem_rng = random.Random(args.seed)
    model, tokenizer, _ = models.load_model(ckpt or args.model, task=args.task)
    if ckpt:
        checkpoint.check_finite(model, ckpt)
    model.to(args.device)
    if args.grad_checkpointing:
        model.activation_checkpointing_enable()
    ref_model = None
    if args.beta > 0:
        ref_model, _, _ = models.load_model(args.model, task=args.task)
        ref_model.eval().requires_grad_(False)
        ref_model.to("cpu" if args.ref_on_cpu else args.device, dtype=torch.bfloat16 if args.bf16 else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / max(args.warmup_steps, 1)))
    run = Run(args, model, tokenizer, ref_model, optimizer, scheduler, problem_rng, load_task(args, tokenizer),
              rss_at_start=rss_at_start)
    if ckpt:
        state = checkpoint.load_state(ckpt)
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        problem_rng.setstate(state["problem_rng"])
        scheduler.load_state_dict(state["scheduler"])
        run.step = state["step"]
        run.buffer = (state.get("surplus_qs", []), [{k: v.to(args.device) if torch.is_tensor(v) else v
                                                     for k, v in b.items()} for b in state.get("surplus", [])])
    # the run directory is ours from here on (locked); on resume the metrics logged after the checkpoint go
    run.lock = checkpoint.claim(args.run_dir, args, args.resume, args.overwrite)
    run.metrics_path = os.path.join(args.run_dir, "metrics.jsonl")
    if ckpt:
        kept = checkpoint.read_metrics(run.metrics_path, up_to_step=run.step)
        checkpoint.rewrite_metrics(run.metrics_path, kept)
        print(f"resumed from {ckpt} at step {run.step}")
        run.history = [r for r in kept if "accuracy" in r]
        # None if the step-0 evaluation's line is gone
        run.first_accuracy = next((r["eval_accuracy"] for r in kept if r.get("step") == 0 and "eval_accuracy" in r),
                                  None)
    else:
        run.first_accuracy = run_eval(run, 0)
    print(f"greedy held-out accuracy before: {_fmt(run.first_accuracy)} ({len(run.task['eval_golds'])} problems)")
    run.t_start = time.time()
    return run


def load_task(args, tokenizer) -> dict:
    """Training problems (a pool, or None: fresh tiny problems each step) and held-out problems with their prompts
    and gold answers; a held-out problem never appears in training."""
    notes = collections.Counter()  # the loader's fallbacks (an answer taken from the solution's box, ...), counted
    eval_problems, skipped = data.load(args.eval_dataset, "test", args.data_dir, args.eval_limit, notes=notes,
                                       flag="--eval-dataset", task=args.task)
    eval_problems, lost = data.drop_unencodable(eval_problems, tokenizer)  # before the prompts add their instruction
    data.report(f"--eval-dataset {args.eval_dataset}", eval_problems, skipped + lost, notes)
    held_out = {p["question"] for p in eval_problems}
    if args.dataset == "tiny":
        draw = tasks.TASKS[args.task].train_problems
        pool = ([data.tiny_problem(q) for q in draw(random.Random(args.seed), args.problem_pool, held_out)]
                if args.problem_pool else None)
    else:
        notes = collections.Counter()
        pool, skipped = data.load(args.dataset, data.train_split(args.dataset), args.data_dir, notes=notes,
                                  flag="--dataset")
        pool, lost = data.drop_unencodable(pool, tokenizer)
        data.report(f"--dataset {args.dataset}", pool, skipped + lost, notes)
        if not pool:
            sys.exit(f"--dataset {args.dataset}: no usable problem")
        print(f"{len(pool)} training problems from {args.dataset}, {len(eval_problems)} held out from "
              f"{args.eval_dataset}")
    for p in (pool or []) + eval_problems:  # the tiny world's prompts are its own; others: the chat template
        p["prompt"] = p.get("prompt") or data.build_prompt(tokenizer, p["question"], p.get("shots", ()))
    return {"pool": pool, "held_out": held_out, "eval_prompts": [p["prompt"] for p in eval_problems],
            "eval_golds": [p["answer"] for p in eval_problems]}


def sample_round(run: Run, checker: dict):
    """B problems and G rollouts of each (sample.generate), every rollout graded: (problems, batch) with
    batch["correct"] [B * G] bool. checker counts what the grader met (reward.new_stats)."""
    args, tok, B = run.args, run.tokenizer, run.args.prompts_per_step
    qs = ([run.problem_rng.choice(run.task["pool"]) for _ in range(B)] if run.task["pool"] else
          [data.tiny_problem(q) for q in tasks.TASKS[args.task].train_problems(run.problem_rng, B,
                                                                               run.task["held_out"])])
    prompt_ids = [tok(q["prompt"])["input_ids"] for q in qs]
    gen = args.gen_batch_size or B
    with amp(args):  # one autocast region per call: the bf16 copies of the weights are made once, not per token
        batch = sample.concat_batches([sample.generate(
            run.model, prompt_ids[i:i + gen], n=args.group_size, max_new_tokens=args.max_new_tokens,
            temperature=args.temperature, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
            for i in range(0, B, gen)], tok.pad_token_id)
    texts = tok.batch_decode(batch["input_ids"][:, batch["prompt_len"]:], skip_special_tokens=True)
    golds = [q["answer"] for q in qs for _ in range(args.group_size)]
    batch["correct"] = torch.tensor([reward.is_correct(t, g, checker) is True for t, g in zip(texts, golds)],
                                    device=args.device)  # [B * G]
    return qs, batch


def rewards_and_mask(args, batch: dict, n_groups: int):
    """Rewards [Bk, G]: 1 / 0 (DAPO: +1 / -1) plus D4's overlong penalty; and the loss mask [N, T] (D4's overlong
    filter takes truncated rollouts out of the loss and out of K2's statistics)."""
    correct, mask = batch["correct"].view(n_groups, args.group_size), batch["response_mask"]  # [Bk, G], [N, T]
    rewards = dapo.signed_reward(correct) if args.signed_reward else correct.float()  # [Bk, G]
    if args.overlong_buffer:
        penalty = dapo.overlong_penalty(mask.sum(-1), args.max_new_tokens, args.overlong_buffer)  # [N]
        rewards = rewards + penalty.view(n_groups, args.group_size)
    if args.overlong_filter:
        mask = dapo.overlong_filter(mask, batch["truncated"])  # [N, T]
    return rewards, mask


def reference_logprobs(args, ref_model, batch: dict):
    """G4's log pi_ref of every sampled token [N, T], micro-batched like the training forward; None if beta = 0."""
    if ref_model is None:
        return None
    ids, attn, P, mb = batch["input_ids"], batch["attention_mask"], batch["prompt_len"], args.micro_batch_size
    ref_model.to(args.device)
    with torch.no_grad(), amp(args):
        ref_logp = torch.cat([sample.token_logprobs(
            ref_model, ids[s:s + mb], attn[s:s + mb], P, args.temperature,
            groups=torch.arange(s, min(s + mb, ids.shape[0]), device=ids.device) // args.group_size)
            for s in range(0, ids.shape[0], mb)])  # [N, T]
    if args.ref_on_cpu:
        ref_model.to("cpu")
    return ref_logp


def update(args, model, optimizer, batch: dict, adv, mask, ref_logp, step: int) -> dict:
    """G2-G5: --mu optimizer updates on the batch, each accumulated over micro-batches. Returns the loss's
    statistics (means over the updates), the last gradient norm and how many updates were skipped as not finite."""
    ids, attn, P, G, N = batch["input_ids"], batch["attention_mask"], batch["prompt_len"], args.group_size, len(adv)
    model.train()
    n_tokens = mask.sum()
    # Only rollouts with a non-zero advantage on some token are scored. With beta = 0 a rollout whose every
    # A_{i,t} is 0 adds exactly 0 to the loss, its gradient and its statistics (G3: rho * 0 = clip(rho) * 0 = 0);
    # it still counts in the normalisers n_seqs and n_tokens, passed in whole. In GRPO these are the groups that
    # all agree. A batch where no rollout counts makes no update (AdamW skips parameters without a gradient).
    # With beta > 0 the KL term (G4) needs every rollout.
    lengths = batch["response_mask"].sum(-1)  # [N]
    scored = (adv != 0).any(-1) | (args.beta > 0)  # [N]
    # Micro-batches take rollouts in order of length and stop at their longest response: a padding column costs a
    # full forward and backward and changes nothing (its mask is 0).
    by_length = lengths.argsort()  # [N]
    by_length = by_length[scored[by_length]]  # [n_scored]
    stats = {"policy_term": 0.0, "kl": 0.0, "clip_low": 0.0, "clip_high": 0.0, "grad_norm": 0.0,
             "nonfinite_updates": 0}
    if args.dual_clip is not None:
        stats["clip_dual"] = 0.0  # logged when on, also on a step where no rollout is scored
    for _ in range(args.mu):
        optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=args.device)
        for s in range(0, len(by_length), args.micro_batch_size):
            mb = by_length[s:s + args.micro_batch_size]  # [n] rollouts of similar length
            t = int(lengths[mb].max())  # the micro-batch's longest response: the columns after it are padding
            with amp(args):
                logp = sample.token_logprobs(model, ids[mb, :P + t], attn[mb, :P + t], P, args.temperature,
                                             groups=mb // G)  # [n, t]; a group's prompt runs once
            # normalised by the whole batch's counts (G5), so the accumulated gradient is the full batch's
            loss, st = grpo.policy_loss(
                logp, batch["logprobs"][mb, :t], adv[mb, :t], mask[mb, :t], eps_low=args.eps_low,
                eps_high=args.eps_high, dual_clip=args.dual_clip, beta=args.beta,
                ref_logp=None if ref_logp is None else ref_logp[mb, :t], agg=args.agg, max_new_tokens=args.max_new_tokens, n_seqs=N, n_tokens=n_tokens)
            loss.backward()
            loss_sum += loss.detach()
            for k, v in st.items():
                stats[k] = stats.get(k, 0.0) + v / args.mu
        stats["grad_norm"] = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip).item()
        if math.isfinite(stats["grad_norm"]) and torch.isfinite(loss_sum):
            optimizer.step()
        else:  # a NaN or infinity must never reach the weights or AdamW's moments: skip this update, count it
            stats["nonfinite_updates"] += 1
            tqdm.write(f"step {step + 1}: the loss or the gradient is not finite; this update is skipped")
        optimizer.zero_grad(set_to_none=True)  # free the gradients before the next sampling
    return stats


def step_record(run: Run, step: int, batch, rewards, mask, adv, checker: dict, got: dict, stats: dict,
                times: dict, problems: list) -> dict:
    """The step's line of metrics.jsonl."""
    correct = batch["correct"]  # [N]
    record = {
        "step": step,
        "reward_mean": rewards.mean().item(),
        "accuracy": correct.float().mean().item(),
        "response_len": mask.sum(-1).float().mean().item(),
        "entropy": ((batch["entropy"] * mask).sum() / mask.sum()).item(),  # of the sampling distribution
        "zero_adv_groups": (rewards.std(dim=1) == 0).float().mean().item(),
        "truncated": batch["truncated"].float().mean().item(),
        "boxed": 1 - checker["no_box"] / max(checker["graded"], 1),  # share of sampled responses with a \boxed answer
        "checker_failures": checker["timeouts"] + checker["errors"] + checker["gold_unparseable"],
        # share of sampled responses with a "}" after the last box's closing brace that nothing opened (graded wrong)
        "malformed": checker["malformed"] / max(checker["graded"], 1),
        "groups_generated": got["generated"],
        "groups_kept": len(got["problems"]),
        "groups_carried_in": got["carried"],  # D2 buffer of earlier steps used here
        "groups_mixed": got["mixed"],  # groups sampled this step that mixed right and wrong
        "sampling_rounds": got["rounds"],
        "grad_norm": stats["grad_norm"],
        "nonfinite_updates": stats["nonfinite_updates"],  # updates skipped because the loss or gradient was not finite
        "lr": run.scheduler.get_last_lr()[0],
        "time_sample": times["time_sample"],
        "time_train": times["time_train"],
        "time_step": times["time_step"],  # sample + reward + advantage + loss + optimizer step
        "peak_memory_gib": memory.peak_memory_bytes(run.args.device, run.rss_at_start) / memory.GiB,
        "time_advantage": times["time_advantage"],  # G1, and KTAE's K1-K7 or OAR's scoring (O1-O5)
        **{k: v for k, v in stats.items() if k not in ("grad_norm", "nonfinite_updates")},
        **grpo.advantage_concentration(adv.tokens, mask, adv.seq),  # O7: ESS-ratio, top-10 % mass
    }
    if run.args.dataset == "tiny":  # a synthetic task: we know where each wrong rollout first went wrong
        record.update(attribution(run, batch, mask, adv, problems))
    record["clip_frac"] = record["clip_low"] + record["clip_high"]
    return record


def attribution(run: Run, batch, mask, adv, problems: list) -> dict:
    """credit.py's rank, hit@1, hit@3 and AUC of the first error under the rule's blame (methods.Rule.blame), means
    over the step's wrong rollouts that had a non-zero advantage (a group that mixed right and wrong: elsewhere no
    rule assigns credit) and a first error among their scored tokens; credit_n counts them."""
    G, resp = run.args.group_size, batch["input_ids"][:, batch["prompt_len"]:]  # [N, T]
    for t in set(resp.flatten().tolist()) - run.pieces.keys():
        run.pieces[t] = run.tokenizer.decode([t])
    pieces = [[run.pieces[t] for t in row] for row in resp.tolist()]
    questions = [p["question"] for p in problems for _ in range(G)]
    wrong = ~batch["correct"] & (adv.seq != 0)  # [N]
    blame = methods.RULES[run.args.rule].blame(adv, batch)  # [N, T]
    return credit.batch_attribution(tasks.TASKS[run.args.task], questions, pieces, wrong.cpu(), blame.detach().cpu(),
                                    mask.cpu())


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


def warn_if_degenerate(run: Run, record: dict):
    """Each kind of degenerate() warning once, on the terminal and in the record."""
    run.history.append(record)
    found = degenerate(run.history)
    new = [w for kind, w in found.items() if kind not in run.warned]
    run.warned.update(found)
    for w in new:
        tqdm.write(f"warning, step {record['step']}: {w}")
    if new:
        record["warnings"] = new


def run_eval(run: Run, step: int) -> float:
    """Greedy accuracy on the held-out problems, logged."""
    with amp(run.args):
        r = evaluate.score(run.model, run.tokenizer, run.task["eval_prompts"], run.task["eval_golds"],
                           max_new_tokens=run.args.max_new_tokens, batch_size=run.args.eval_batch_size)
    run.log({"step": step, "eval_accuracy": r["accuracy"], "eval_response_len": r["response_len"],
             "eval_boxed": r["boxed"], "eval_n": r["n"]})
    return r["accuracy"]


def finish_step(run: Run, done: int, heatmap=None) -> bool:
    """7. evaluate and 8. save when due, and at the end or when out of time. True when the run should stop."""
    args = run.args
    out_of_time = args.max_minutes is not None and time.time() - run.t_start > 60 * args.max_minutes
    last_step = done == args.steps or out_of_time
    if done % args.eval_every == 0 or last_step:
        tqdm.write(f"step {done}: greedy held-out accuracy {run_eval(run, done):.3f}")
        if heatmap is not None:
            heatmap(done)
    if done % args.save_every == 0 or last_step:
        # the HF model directory and state.pt: optimizer, scheduler, RNG states and D2's buffer
        checkpoint.save(args.run_dir, run.model, run.tokenizer, {
            "step": done, "optimizer": run.optimizer.state_dict(), "scheduler": run.scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(), "problem_rng": run.problem_rng.getstate(), "args": vars(args),
            "surplus_qs": run.buffer[0], "surplus": run.buffer[1]})
    if out_of_time:
        tqdm.write(f"--max-minutes {args.max_minutes} reached after {done} steps")
    return out_of_time


def finish(run: Run):
    """The run's end: run.json marked finished, the lock released, before -> after printed."""
    evals = [r for r in checkpoint.read_metrics(run.metrics_path) if "eval_accuracy" in r]
    last = evals[-1]["eval_accuracy"] if evals else None
    checkpoint.write_info(run.args.run_dir, run.args, finished=True, step=evals[-1]["step"] if evals else run.step)
    if run.lock is not None:
        run.lock.close()
    print(f"greedy held-out accuracy: {_fmt(run.first_accuracy)} -> {_fmt(last)}   (run directory: {run.args.run_dir})")
    return run.first_accuracy, last


def write_heatmap(args, step, tokenizer, qs, batch, mask, rewards, adv):
    """RUN_DIR/heatmaps/stepN.html: the first group of this batch that mixes right and wrong answers, every token
    coloured by the rule's per-token values (KTAE's key-token values, OAR's weights, E1's entropies), each rollout
    with its reward and sequence advantage (plots.token_heatmap builds the page and its legend)."""
    G, resp, kind = args.group_size, batch["input_ids"][:, batch["prompt_len"]:], methods.RULES[args.rule].heatmap
    mixed = [g for g in range(len(qs)) if 0 < (rewards[g] > 0).sum() < G]
    if not mixed:
        return
    g = mixed[0]
    rollouts = []
    for i in range(g * G, (g + 1) * G):
        n = int(mask[i].sum())
        tokens = [tokenizer.decode([t]) for t in resp[i, :n].tolist()]
        rollouts.append((tokens, adv.values[i, :n].tolist(), rewards[g, i - g * G].item(), adv.seq[i].item()))
    os.makedirs(os.path.join(args.run_dir, "heatmaps"), exist_ok=True)
    what = {"oar": "OAR weights", "ktae": "key-token values", "entropy": "sampling entropy"}[kind]
    centre = None  # the kind's own (KTAE 0, OAR 1); the entropy rule's is the batch's threshold (E1)
    if kind == "entropy":
        centre = methods.entropy_threshold(batch["entropy"], mask, args.top_entropy_quantile)
    plots.token_heatmap(os.path.join(args.run_dir, "heatmaps", f"step{step}.html"),
                        f"{args.method}: {what}, step {step}", qs[g]["prompt"], rollouts, kind=kind, centre=centre,
                        scale=args.oar_beta if kind == "oar" else 1.0)


def amp(args):
    """bf16 autocast where --bf16 is given (a no-op context otherwise)."""
    return torch.autocast(args.device.split(":")[0], dtype=torch.bfloat16, enabled=args.bf16)


def _fmt(accuracy) -> str:
    return "unknown" if accuracy is None else f"{accuracy:.3f}"


if __name__ == "__main__":
    main()
