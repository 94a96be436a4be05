"""Critic-free RL for math reasoning, one loop: sample -> reward -> advantage -> loss -> step -> log -> evaluate ->
save.

    python train.py --method ktae                 # the tiny world, on a laptop CPU, in a few minutes
    python train.py --method grpo --model DIR     # any local HF causal LM directory (or a hub name, online)

The equations are in grpo.py (G1-G5), dapo.py (D1-D4), ktae.py (K1-K7), oar.py (O1-O7) and entropy.py (E1),
stated in EQUATIONS.md. --method is a base and a token rule from the tables of methods.py, --dataset a record of
data.py; the flags and their checks are in config/training.py. Bookkeeping lives in infra/: what a step logs
(logbook.py), the checkpoints that --resume continues from (checkpoint.py), the update that never lets a NaN into
the weights (guard.py), the peak memory of each phase (memory.py), loading the models (models.py).

Where the loop departs from the papers (one update per batch, rollouts with no advantage left out of the forward,
D2's buffer, the skipped non-finite step, ...) is listed once, in EQUATIONS.md#departures-from-the-papers.
"""
import os
import random
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

import dapo
import data
import evaluate
import grpo
import methods
import oar
import reward
import sample
from config import training
from infra import checkpoint, cpu, fastpath, guard, logbook, memory, models, track


def main(argv=None):
    args = training.parse_args(argv)
    if args.dry_run:  # the plan needs the model's config alone: no data, no weights
        rule = methods.RULES[args.rule]
        return memory.dry_run(models.load_config(args.model), args, memory.available_bytes(args.device, args.memory),
                              data.dataset(args.dataset).prompt_tokens, rule.memory_phase, rule.frozen_copy(args),
                              methods.TERMS[args.term].memory if args.term else None)
    # what can fail without loading anything fails now, in one line, and leaves no run directory behind: the datasets
    # are found (not yet read), the model's files looked at, the run directory checked
    data.locate(args.dataset, data.train_split(args.dataset), args.data_dir, "--dataset")
    data.locate(args.eval_dataset, "test", args.data_dir, "--eval-dataset")
    models.check_path(args.model)
    ckpt = checkpoint.find(args.run_dir) if args.resume else None
    if ckpt and args.lora_rank:  # the adapters continue only on the base they were trained on
        models.check_base(ckpt, "--resume")
    checkpoint.check(args.run_dir, args, args.resume, args.overwrite, ckpt)
    checkpoint.check_room(args.run_dir, memory.disk_plan(models.load_config(args.model), args,
                                                         methods.RULES[args.rule].frozen_copy(args))["run"],
                          "this run's checkpoints and logs",  # a full disk said now, not after the steps
                          # --resume replaces the run's own files as it goes, --overwrite deletes them first
                          freed=checkpoint.held_bytes(args.run_dir) if ckpt or args.overwrite else 0)
    run = start(args, ckpt)
    try:
        loop(run)
    except KeyboardInterrupt:  # Ctrl-C loses nothing but the step under way; a traceback would hide that
        sys.exit(f"interrupted during step {run.step + 1}: {checkpoint.last_saved(args.run_dir)}")
    except Exception as e:  # an allocation that failed: one line naming the phase, and logged; nothing is lost
        if not memory.out_of_memory(e):
            raise
        memory.stop(e, run.peaks, run.step + 1, run.log)
    finally:
        run.tracker.close()  # --report-to: a tracker's files are complete however the run ends
    return finish(run)


def loop(run):
    """The RL loop, from the step the run is at to --steps (or --max-minutes)."""
    args, rule = run.args, methods.RULES[run.args.rule]
    bar = tqdm(range(run.step, args.steps), initial=run.step, total=args.steps, desc=args.method)
    for step in bar:
        t_step, cpu_step = time.time(), time.process_time()
        run.peaks.start()  # each phase's peak memory, logged: what --dry-run's plan is checked against
        # ---- 1. sample B prompts x G rollouts, with log pi_old of every sampled token --------------------------
        checker = reward.new_stats()  # the grader's counts (answers without a box, timeouts), logged below
        draw = draw_batch(run, checker)
        run.buffer = draw.buffer
        if draw.batch is None:  # D2 found nothing to learn from: no update, but the step's duties still run
            run.log(logbook.no_update(step + 1, draw, time.time() - t_step))
            if finish_step(run, step + 1):
                break
            continue
        qs, batch = draw.problems, draw.batch
        t_sample = time.time() - t_step
        run.peaks.seen["prompt_len"] = batch["prompt_len"]  # an out-of-memory record then says what ran
        run.peaks.end("sampling")

        # ---- 2. reward: the last \boxed{} against the gold answer; DAPO: +-1 and the D4 length penalty -----------
        rewards, mask = rewards_and_mask(args, batch, len(qs))  # [Bk, G], [N, T]

        # ---- 3. advantage: A_{i,t} from the token rule of --method (methods.py) ----------------------------------
        t0 = time.time()
        ctx = methods.Context(args, run.model, run.tokenizer, qs, run.pieces, step, run.rule_state)
        adv = rule.advantages(batch, rewards, mask, ctx)
        t_advantage = time.time() - t0
        ref_logp = reference_logprobs(args, run, batch)  # [N, T] the reference's (G4, a loss term), else None
        run.peaks.end("advantage")

        # ---- 4-5. loss and optimizer step ---------------------------------------------------------------------
        t0 = time.time()
        term = methods.term_step(args, batch, ctx)  # a loss term beside the surrogate (SDPG's), or None
        stats = update(args, run.model, run.optimizer, batch, adv.tokens, mask, ref_logp, step, run.peaks, term)
        run.scheduler.step()
        t_train = time.time() - t0

        # ---- 6. log (infra/logbook.py) -------------------------------------------------------------------------
        wall = time.time() - t_step
        times = {"time_sample": t_sample, "time_train": t_train, "time_step": wall, "time_advantage": t_advantage,
                 "time_cpu_share": (time.process_time() - cpu_step) / max(wall * torch.get_num_threads(), 1e-9)}
        record = logbook.step_record(step + 1, batch, rewards, mask, adv, checker, draw, stats, times,
                                     lr=run.scheduler.get_last_lr()[0], peaks=run.peaks.record(),
                                     concentration=oar.advantage_concentration(adv.tokens, mask, adv.seq))  # O7
        world = run.problems.dataset.world
        if world is not None:  # a synthetic task: we know where each wrong rollout first went wrong
            record.update(logbook.attribution(world, rule, run.tokenizer, run.pieces, qs, batch, mask, adv, args))
        run.watch.check(record)  # a run that has stopped learning says so, once
        run.log(record)
        bar.set_postfix(reward=f"{record['reward_mean']:.2f}", len=f"{record['response_len']:.1f}")

        # ---- 7. evaluate, 8. save -----------------------------------------------------------------------------
        def shown(done):  # with each evaluation: the rule's token heat map, the trackers' table of completions
            if rule.heatmap:
                logbook.write_heatmap(os.path.join(args.run_dir, "heatmaps", f"step{done}.html"), args.method, done,
                                      rule.heatmap(adv, batch, mask, args), run.tokenizer, qs, batch, mask, rewards,
                                      adv)
            if run.tracker.all:
                run.tracker.table(done, logbook.COMPLETION_COLUMNS,
                                  logbook.completions(run.tokenizer, qs, batch, rewards, adv))
        if finish_step(run, step + 1, shown):
            break


@dataclass
class Run:
    """What the loop carries from step to step (and what a checkpoint saves of it)."""
    args: object
    model: torch.nn.Module
    tokenizer: object
    ref_model: torch.nn.Module  # G4's frozen reference, None when beta = 0 or under LoRA (the base is the reference)
    optimizer: torch.optim.Optimizer
    scheduler: object
    problem_rng: random.Random  # draws the training problems
    problems: data.Problems  # where training problems come from, and the held-out ones
    peaks: memory.Peaks  # the peak memory of each phase of the step
    adapters: object = None  # --lora-rank: the peft model whose adapters `model` holds (infra/lora.py)
    step: int = 0  # steps done
    buffer: tuple = ([], [])  # D2's mixed groups left over for the next step: (problems, batches)
    pieces: dict = field(default_factory=dict)  # token id -> its decoded text, for OAR's spans
    rule_state: dict = field(default_factory=dict)  # what the token rule keeps across steps (RLSD's frozen teacher)
    metrics_path: str = ""
    first_accuracy: float = None
    watch: logbook.Watch = field(default_factory=logbook.Watch)  # the degenerate-run warnings given so far
    lock: object = None
    t_start: float = 0.0
    tracker: track.Trackers = None  # --report-to: TensorBoard, wandb, trackio (none by default)

    def log(self, record: dict):
        checkpoint.append_metrics(self.metrics_path, record)
        self.tracker.log(record)  # the same numbers under the same names


def start(args, ckpt) -> Run:
    """The policy, its optimizer, a frozen reference (only if beta > 0), the problems, and the run directory claimed;
    from the checkpoint ckpt when resuming. Ends with the step-0 evaluation of a fresh run."""
    rss_at_start = memory.rss_bytes()
    cpu.setup(args.threads)  # threads, and the C allocator keeping freed memory (speed only)
    world = data.dataset(args.dataset).world  # --model tiny: this task's warm-started model
    # the data are read with the tokenizer alone: a bad file fails before the model's minutes of loading
    tokenizer = models.load_tokenizer(args.model)
    problems = data.run_problems(args.dataset, args.eval_dataset, tokenizer, data_dir=args.data_dir,
                                 eval_limit=args.eval_limit, pool_size=args.problem_pool, seed=args.seed,
                                 room=models.prompt_room(args.model, args.max_new_tokens))
    if args.oar_cue:  # OAR's cue, like the prompts, must survive the tokenizer
        data.check_encodable(tokenizer, args.oar_cue, "--oar-cue")
    state = checkpoint.load_state(ckpt) if ckpt else None
    model, tokenizer, ref_model, adapters = models.load_policy(args, ckpt, state and state.get("adapter"), world)
    # fused: one pass over each weight's state instead of one per operation (on this project's CPU the 0.5B's step
    # took 1.6 s against 4.2 s, docs/LOG.md 2026-11-26, fourth session); the same update up to float32 rounding
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr, betas=(0.9, 0.99),
                                  weight_decay=0.0, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / max(args.warmup_steps, 1)))
    run = Run(args, model, tokenizer, ref_model, optimizer, scheduler, random.Random(args.seed), problems,
              memory.Peaks(args.device, rss_at_start), adapters)
    if ckpt:
        run.step, run.buffer = checkpoint.restore_run(state, optimizer, scheduler, run.problem_rng, args.device)
        run.rule_state = checkpoint.restore_rule_state(state, args.device)
    # the run directory is ours from here on (locked); on resume the metrics logged after the checkpoint go
    run.lock = checkpoint.claim(args.run_dir, args, args.resume, args.overwrite, ckpt)
    run.metrics_path = os.path.join(args.run_dir, "metrics.jsonl")
    run.tracker = track.Trackers(args.report_to, args.run_dir, vars(args))
    if ckpt:
        kept = checkpoint.resume_metrics(run.metrics_path, run.step)
        print(f"resumed from {ckpt} at step {run.step}")
        run.watch = logbook.Watch([r for r in kept if "accuracy" in r])
        run.first_accuracy = logbook.first_accuracy(kept)  # None if the step-0 evaluation's line is gone
    elif args.final_eval:
        run.first_accuracy = run_eval(run, 0)
    if args.final_eval:
        print(f"greedy held-out accuracy before: {_fmt(run.first_accuracy)} ({len(problems.eval_golds)} problems)")
    run.t_start = time.time()
    return run


def draw_batch(run: Run, checker: dict) -> dapo.Draw:
    """1. The step's groups: one round of B problems x G rollouts, or with D2 (--dynamic-sampling) rounds until B
    groups mix right and wrong answers, starting from the buffer of earlier steps (dapo.fill_batch)."""
    args, B = run.args, run.args.prompts_per_step
    if not args.dynamic_sampling:
        qs, batch = sample_round(run, checker)
        mixed = int(dapo.mixed_groups(batch["correct"].view(B, args.group_size)).sum())  # logged: all B are kept
        return dapo.Draw(qs, batch, generated=B, mixed=mixed)
    draw = dapo.fill_batch(lambda: sample_round(run, checker), B, args.group_size, args.max_sampling_rounds,
                           run.buffer, args.keep_surplus, run.tokenizer.pad_token_id)
    if len(draw.problems) < B and args.short_batch == "stop":
        sys.exit(f"D2 dynamic sampling: only {len(draw.problems)} of {B} groups mixed right and wrong answers after "
                 f"{draw.rounds} rounds (--max-sampling-rounds); --short-batch train continues with what was kept")
    return draw


def sample_round(run: Run, checker: dict):
    """B problems and G rollouts of each (sample.generate), every rollout graded: (problems, batch) with
    batch["correct"] [B * G] bool. checker counts what the grader met (reward.new_stats)."""
    args, tok, B = run.args, run.tokenizer, run.args.prompts_per_step
    qs = run.problems.draw(run.problem_rng, B)
    prompt_ids = [tok(q["prompt"])["input_ids"] for q in qs]
    gen = args.gen_batch_size or B
    # one autocast region per call: the bf16 copies of the weights are made once, not per token
    with sample.autocast(args.device, args.bf16):
        batch = sample.concat_batches([sample.generate(
            run.model, prompt_ids[i:i + gen], n=args.group_size, max_new_tokens=args.max_new_tokens,
            temperature=args.temperature, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
            for i in range(0, B, gen)], tok.pad_token_id)
    texts = tok.batch_decode(batch["input_ids"][:, batch["prompt_len"]:], skip_special_tokens=True)
    golds = [q["answer"] for q in qs for _ in range(args.group_size)]
    grade = reward.GRADERS[args.grader]  # reward.is_correct unless --grader says otherwise
    batch["correct"] = torch.tensor([grade(t, g, checker) is True for t, g in zip(texts, golds)],
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


def reference_logprobs(args, run: Run, batch: dict):
    """log pi_ref of every sampled token [N, T] (G4's KL, a loss term's), micro-batched like the training forward;
    None when nothing reads it. Under LoRA the reference is the frozen base: the policy with its adapters off."""
    if not args.reference:
        return None
    ref_model, off = (run.model, run.adapters.disable_adapter) if run.adapters else (run.ref_model, nullcontext)
    ids, attn, P, mb = batch["input_ids"], batch["attention_mask"], batch["prompt_len"], args.micro_batch_size
    ref_model.to(args.device)
    with torch.no_grad(), sample.autocast(args.device, args.bf16), off():
        ref_logp = torch.cat([sample.token_logprobs(
            ref_model, ids[s:s + mb], attn[s:s + mb], P, args.temperature,
            groups=torch.arange(s, min(s + mb, ids.shape[0]), device=ids.device) // args.group_size)
            for s in range(0, ids.shape[0], mb)])  # [N, T]
    if args.ref_on_cpu and not run.adapters:
        ref_model.to("cpu")
    return ref_logp


def update(args, model, optimizer, batch: dict, adv, mask, ref_logp, step: int, peaks: memory.Peaks,
           term=None) -> dict:
    """G2-G5: --mu optimizer updates on the batch, each accumulated over micro-batches. Returns the loss's
    statistics (means over the updates), the last gradient norm and how many updates were skipped as not finite.
    peaks: the training pass's and the optimizer step's peak memory are read at their ends. term: the method's
    loss term and what it prepared (methods.term_step), added to the surrogate per token, or None."""
    ids, attn, P, G, N = batch["input_ids"], batch["attention_mask"], batch["prompt_len"], args.group_size, len(adv)
    model.train()
    n_tokens = mask.sum()
    # Only rollouts with a non-zero advantage on some token are scored. With beta = 0 a rollout whose every
    # A_{i,t} is 0 adds exactly 0 to the loss, its gradient and its statistics (G3: rho * 0 = clip(rho) * 0 = 0);
    # it still counts in the normalisers n_seqs and n_tokens, passed in whole. In GRPO these are the groups that
    # all agree. A batch where no rollout counts makes no update (AdamW skips parameters without a gradient).
    # With beta > 0 the KL term (G4) needs every rollout, and so does a loss term.
    lengths = batch["response_mask"].sum(-1)  # [N]
    scored = (adv != 0).any(-1) | (args.beta > 0) | (term is not None)  # [N]
    # Each micro-batch stops at its longest response: a padding column costs a full forward and backward and changes
    # nothing (its mask is 0). Rollouts of similar length waste the least; whole groups run their prompt once
    # (token_logprobs shares it). fastpath.micro_batches takes whichever order computes fewer columns.
    rows = torch.nonzero(scored).squeeze(1)  # [n_scored]
    micro_batches = fastpath.micro_batches(lengths, rows, torch.arange(N, device=rows.device) // G, P,
                                           args.micro_batch_size)
    stats = {"policy_term": 0.0, "kl": 0.0, "clip_low": 0.0, "clip_high": 0.0, "grad_norm": 0.0,
             "nonfinite_updates": 0}
    if args.dual_clip is not None:
        stats["clip_dual"] = 0.0  # logged when on, also on a step where no rollout is scored
    for _ in range(args.mu):
        optimizer.zero_grad(set_to_none=True)
        loss_sum = torch.zeros((), device=args.device)
        # One autocast region for the whole update: autocast keeps its bf16 copy of each weight until its
        # outermost region ends, and the weights change only at the optimizer step, so the copies are made once
        # here, not per micro-batch. The loss and its backward run with autocast off, inside it, as before.
        # Speed only: the embeddings' gradient is summed sparse over the micro-batches and made dense once (the
        # same sum, in another order); on a CPU the attention runs as matmuls, not torch's flash kernel (the same
        # numbers in float32; under bf16 other roundings, 11-18 % further from float32 than SDPA's: docs/LOG.md).
        with (sample.autocast(args.device, args.bf16), fastpath.attention_by_products(model),
              fastpath.sparse_embedding_grad(model, len(rows) * ids.shape[1])):
            for mb in micro_batches:  # [n] rollouts
                t = int(lengths[mb].max())  # the micro-batch's longest response: the columns after it are padding
                hidden = [] if term else None  # a loss term reads the states the output layer reads
                logp = sample.token_logprobs(model, ids[mb, :P + t], attn[mb, :P + t], P, args.temperature,
                                             groups=mb // G, hidden_out=hidden)  # [n, t]; a group's prompt runs once
                extra, extra_stats = term[0].per_token(methods.Piece(
                    model, mb, t, hidden[0], logp, batch["logprobs"][mb, :t],
                    None if ref_logp is None else ref_logp[mb, :t], adv[mb, :t], mask[mb, :t], batch),
                    term[1], args, step + 1) if term else (None, {})  # [n, t] per token
                with sample.autocast(args.device, False):
                    # normalised by the whole batch's counts (G5), so the accumulated gradient is the full batch's
                    loss, st = grpo.policy_loss(
                        logp, batch["logprobs"][mb, :t], adv[mb, :t], mask[mb, :t], eps_low=args.eps_low,
                        eps_high=args.eps_high, dual_clip=args.dual_clip, beta=args.beta,
                        ref_logp=None if ref_logp is None else ref_logp[mb, :t], agg=args.agg,
                        max_new_tokens=args.max_new_tokens, n_seqs=N, n_tokens=n_tokens, extra=extra)
                    loss.backward()
                loss_sum += loss.detach()
                for k, v in st.items():
                    stats[k] = stats.get(k, 0.0) + v / args.mu
                for k, v in extra_stats.items():  # a token mean of the micro-batch's: weighed by its tokens
                    stats[k] = stats.get(k, 0.0) + v * float(mask[mb].sum()) / max(float(n_tokens), 1.0) / args.mu
        peaks.end("training")
        # a NaN or infinity never reaches the weights or AdamW's moments: such an update is skipped, and counted
        stats["grad_norm"], why = guard.step(model, optimizer, args.grad_clip, loss_sum)
        if why:
            stats["nonfinite_updates"] += 1
            tqdm.write(f"step {step + 1}: {why}")
        optimizer.zero_grad(set_to_none=True)  # free the gradients before the next sampling
        peaks.end("optimizer")
    return stats


def run_eval(run: Run, step: int) -> float:
    """7. Greedy accuracy on the held-out problems, logged."""
    with sample.autocast(run.args.device, run.args.bf16):
        r = evaluate.score(run.model, run.tokenizer, run.problems.eval_prompts, run.problems.eval_golds,
                           max_new_tokens=run.args.max_new_tokens, batch_size=run.args.eval_batch_size)
    run.log({"step": step, "eval_accuracy": r["accuracy"], "eval_response_len": r["response_len"],
             "eval_boxed": r["boxed"], "eval_n": r["n"]})
    return r["accuracy"]


def finish_step(run: Run, done: int, shown=None) -> bool:
    """7. evaluate and 8. save when due, and at the end or when out of time. True when the run should stop."""
    args, run.step = run.args, done
    out_of_time = args.max_minutes is not None and time.time() - run.t_start > 60 * args.max_minutes
    last_step = done == args.steps or out_of_time
    if (args.eval_every and done % args.eval_every == 0) or (last_step and args.final_eval):
        tqdm.write(f"step {done}: greedy held-out accuracy {run_eval(run, done):.3f}")
        if shown is not None:
            shown(done)
    if (args.save_every and done % args.save_every == 0) or (last_step and args.final_save):
        base = models.base_name(args.model, run.model)  # under LoRA: the adapters' base, by name and by its weights
        checkpoint.save_run(args.run_dir, done, run.model, run.tokenizer, run.optimizer, run.scheduler,
                            run.problem_rng, args, run.buffer, run.adapters, base,
                            models.identity(base) if run.adapters else None,
                            methods.RULES[args.rule].saved(run.rule_state, done, args))
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
    said = f"{_fmt(run.first_accuracy)} -> {_fmt(last)}" if evals else "not evaluated (--no-final-eval)"
    if evals and evals[-1]["step"] != run.step:  # an older evaluation is not the run's result: say whose it is
        said += f" (the evaluation of step {evals[-1]['step']}; none after the last step, {run.step}: --no-final-eval)"
    print(f"greedy held-out accuracy: {said}   (run directory: {run.args.run_dir})")
    return run.first_accuracy, last


def _fmt(accuracy) -> str:
    return "unknown" if accuracy is None else f"{accuracy:.3f}"


if __name__ == "__main__":
    main()
