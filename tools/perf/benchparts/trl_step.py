"""TRL's GRPOTrainer at the benchmark's setting: its seconds a step against ours (--trl; requirements/trl.txt)."""
import contextlib
import random
import sys
import tempfile
import time

from tools.perf.benchparts.steps import step_medians, train_run
from tools.perf.benchparts.table import Table, median, progress
from tools.perf.benchparts.workload import Setting, Workload


class TRLMissing(Exception):
    """TRL is not installed: its row is a skip, not a failure."""


def trl_modules():
    """What the TRL step needs, imported; TRLMissing where TRL is not installed."""
    try:
        from datasets import Dataset
        from transformers import TrainerCallback
        from trl import GRPOConfig, GRPOTrainer

        from scaling import trl_grpo
    except ImportError as e:
        raise TRLMissing(f"{e}: pip install -r requirements/trl.txt (measured with trl 1.16.0)") from None
    return Dataset, TrainerCallback, GRPOConfig, GRPOTrainer, trl_grpo


def trl_seconds(w: Workload, steps: int, warmup: int, prompts: int) -> float:
    """Seconds a step of TRL's GRPOTrainer at the workload's setting: `prompts` x G completions a step (one optimizer
    step per B x G), the same length limit, temperature (top-k and top-p off), learning rate, precision, grader and
    problems (train.py's, in its order), beta 0, and the base's loss and rewards as scaling/trl_grpo.py gives them
    to TRL (G5's aggregation, D1's clip, DAPO's rewards). TRL's defaults otherwise, but gradient checkpointing off,
    as ours is (TRL turns it on). Timed from step begin to step end by a callback; the median after the warm-up. It
    trains w.model in place."""
    Dataset, TrainerCallback, GRPOConfig, GRPOTrainer, trl_grpo = trl_modules()
    a = w.args
    qs = w.problems.draw(random.Random(a.seed), prompts * steps)
    data = Dataset.from_list([{"prompt": q["prompt"], "answer": q["answer"]} for q in qs])

    times = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter() - self.t0)

    with tempfile.TemporaryDirectory() as d:
        rollouts = prompts * a.group_size
        micro = max(k for k in range(1, min(a.micro_batch_size, rollouts) + 1) if rollouts % k == 0)
        # train.py's micro-batch: TRL's per-device batch, accumulated to the step's rollouts (sampled at once)
        cfg = GRPOConfig(output_dir=d, per_device_train_batch_size=micro,
                         gradient_accumulation_steps=rollouts // micro, num_generations=a.group_size,
                         max_completion_length=a.max_new_tokens, temperature=a.temperature, top_k=0, top_p=1.0,
                         learning_rate=a.lr, beta=0.0, num_iterations=1, max_steps=steps,
                         use_cpu=a.device == "cpu", bf16=a.bf16, gradient_checkpointing=None, report_to="none",
                         save_strategy="no", logging_steps=1000, disable_tqdm=True, seed=a.seed,
                         **trl_grpo.grpo_config_options(a))
        trainer = GRPOTrainer(model=w.model, processing_class=w.tok, reward_funcs=trl_grpo.reward_functions(a),
                              args=cfg,
                              train_dataset=data, callbacks=[Timer()])
        with contextlib.redirect_stdout(sys.stderr):  # the Trainer prints its metrics: stdout is the table's
            trainer.train()
    return median(times[warmup:])


def trl_rows(table: Table, w: Workload, setting: Setting, ours: dict, load, flags, method: str, threads):
    """TRL's seconds a step, against our first method's (`ours`, from the steps part). Where the setting gives TRL
    fewer prompts a step (setting.trl_prompts), ours runs again at that size first, in its own process as the steps
    part runs it, and then `load()` puts the model in w.model for TRL."""
    prompts = setting.trl_prompts or w.args.prompts_per_step
    size = f"{prompts} prompts x {w.args.group_size}"
    mine = dict(ours).get(method)
    try:
        trl_modules()  # before ours runs again for it
    except TRLMissing as e:
        table.row("trl", f"skipped: {e}")
        return
    if prompts != w.args.prompts_per_step:
        records, error = train_run(tuple(flags) + ("--prompts-per-step", str(prompts)), method, setting.steps, threads,
                                   f"{method} at {size}, for TRL's comparison")
        records = [x for x in records if "time_step" in x][setting.warmup:]
        if not records:
            table.fail("trl", f"ours ({method}) at {size}: failed: {error}")
            return
        mine = step_medians(records)
    progress(f"TRL GRPOTrainer, {setting.steps} steps at {size}")
    load()
    try:
        t = trl_seconds(w, setting.steps, setting.warmup, prompts)
    except TRLMissing as e:
        table.row("trl", f"skipped: {e}")
        return
    except Exception as e:  # a TRL step that fails is a result bench must not pass as a skip
        table.fail("trl", f"failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return
    timed = f"step {setting.steps}" if setting.steps == setting.warmup + 1 else \
        f"median of steps {setting.warmup + 1}-{setting.steps}"
    table.row("trl", f"TRL GRPOTrainer, {size}: s/step ({timed})", f"{t:.3f}",
              f"ours {method} {mine['time_step']:.3f}" if mine else "",
              f"ours/TRL {mine['time_step'] / t:.2f}" if mine else "")
