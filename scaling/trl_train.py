"""Any --method inside TRL's GRPOTrainer (trl_grpo.RuleGRPOTrainer): one CPU, several processes, several GPUs.

    python -m scaling.trl_train --method ktae --threads 1                # the tiny world, one CPU process
    torchrun --nproc_per_node 2 -m scaling.trl_train --method ktae --use_cpu --gradient_accumulation_steps 1
    accelerate launch --num_processes 8 -m scaling.trl_train --method ktae --model DIR --dataset gsm8k \\
        --per_device_train_batch_size 16 --gradient_accumulation_steps 1 --use_vllm

TRL is an optional dependency (pip install -r requirements/trl.txt); no other module imports this one. The flags
are GRPOConfig's own names (--learning_rate, --num_generations, --max_completion_length, --epsilon_high, --loss_type,
--mask_truncated_completions, --num_iterations, --use_vllm, ...: `python -m scaling.trl_train --help`), with
train.py's tiny defaults where TRL's differ (set below, DEFAULTS), plus the few of this script (ScriptArguments).
The held-out evaluation is train.py's: greedy, the same problems, evaluate.score, before and after training.
"""
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field

from infra import track

# trackio fixes its store's folder when it is first imported, and TRL's GRPO trainer imports it: the folder under
# --output_dir is set from the command line before anything imports TRL (keep_offline sets the other trackers' after)
OUTPUT_DIR = "runs/trl"
if __name__ == "__main__":  # run as a command (python -m, torchrun, accelerate launch), not imported by a test
    track.trackio_dir_first(sys.argv[1:], "--output_dir", OUTPUT_DIR)

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import HfArgumentParser, TrainerCallback  # noqa: E402
from trl import GRPOConfig, ModelConfig, get_peft_config  # noqa: E402

import data  # noqa: E402
import evaluate  # noqa: E402
import methods  # noqa: E402
from config import shared  # noqa: E402
from infra import checkpoint, cli, cpu, lora, models  # noqa: E402
from scaling import trl_grpo  # noqa: E402


@dataclass
class ScriptArguments:
    method: str = field(default="grpo", metadata={"help": "as train.py's --method: grpo, dapo, ktae, oar-p, oar-g, "
                                                          "dapo+ktae, ... (methods.py)"})
    method_flags: str = field(default="", metadata={"help": "more train.py flags for the rule, e.g. '--ktae-top 2 "
                                                            "--oar-q 0.4' (config/training.py checks them)"})
    rules_file: str = field(default=None, metadata={"help": "as train.py's --rules-file: your own token rules "
                                                            "(README.md), loaded before --method is read"})
    model: str = field(default=models.DEFAULT, metadata={"help": "as train.py's --model"})
    dataset: str = field(default=data.DEFAULT, metadata={"help": "as train.py's --dataset: tiny (fresh problems), "
                                                                  "gsm8k, a .jsonl file, ..."})
    eval_dataset: str = field(default=None, metadata={"help": "held-out problems (tiny, arith: their own; else "
                                                               "math500)"})
    eval_limit: int = field(default=256, metadata={"help": "first N held-out problems"})
    eval_batch_size: int = field(default=256, metadata={"help": "prompts per generate call when evaluating"})
    data_dir: str = field(default=data.DATA_DIR, metadata={"help": "where the benchmark files are"})
    eval_every: int = field(default=50, metadata={"help": "greedy held-out evaluation every N steps (and at the end); "
                                                          "0: at the end only, as train.py's --eval-every 0"})
    threads: int = field(default=None, metadata={"help": "CPU threads for torch (default: torch's choice)"})
    overwrite: bool = field(default=False, metadata={"help": "replace the model an earlier run left in --output_dir"})


# train.py's tiny defaults where TRL's differ (TRL: lr 1e-6 with linear decay, bf16 and gradient checkpointing on,
# max_completion_length 512, adam_beta2 0.999, seed 42). 64 rollouts per micro-batch x 2 = 16 prompts x 8 a step.
# gradient_checkpointing (TRL's True) is the deprecated name of activation_checkpointing: None leaves both off,
# and either flag given turns it on.
DEFAULTS = dict(output_dir=OUTPUT_DIR, learning_rate=5e-5, lr_scheduler_type="constant_with_warmup", warmup_steps=10,
                adam_beta2=0.99, bf16=False, gradient_checkpointing=None, beta=0.0,
                num_generations=8, max_completion_length=48, temperature=1.0, per_device_train_batch_size=64,
                gradient_accumulation_steps=2, max_steps=250, logging_steps=10, save_strategy="no", report_to="none",
                seed=0, use_cpu=not torch.cuda.is_available(), lora_target_modules=list(lora.TARGETS))


def parse(argv=None):
    """(ScriptArguments, GRPOConfig, the rule's flags, TRL's ModelConfig: its LoRA flags, --use_peft --lora_r ...);
    the base's presets (D1 epsilon_high, G5 loss_type) fill the GRPOConfig fields not given on the command line.
    LoRA's adapters go on every projection by default, as train.py's --lora-rank."""
    argv = sys.argv[1:] if argv is None else argv
    spec = methods.rules_file_of([w.replace("--rules_file", "--rules-file") for w in argv])
    if spec:  # a reader's rules, in every process, before --method is read
        try:
            methods.load_rules(spec, "--rules_file")
        except ValueError as e:
            raise SystemExit(str(e)) from None
    p = type("Parser", (cli.OneLine, HfArgumentParser), {})((ScriptArguments, GRPOConfig, ModelConfig))  # why: cli
    p.set_defaults(**DEFAULTS)
    check(p.parse_args(argv))
    try:
        script, cfg, model_cfg = p.parse_args_into_dataclasses(argv)
    except ValueError as e:  # GRPOConfig's own checks of how its settings combine
        raise SystemExit(f"GRPOConfig: {str(e).strip().splitlines()[0]}") from None
    args = trl_grpo.rule_args(script.method, group_size=cfg.num_generations, max_new_tokens=cfg.max_completion_length,
                              device="cpu", bf16=cfg.bf16, scale_rewards=cfg.scale_rewards, flags=script.method_flags,
                              model=script.model, dataset=script.dataset)
    given = {a.split("=")[0].lstrip("-") for a in argv if a.startswith("--")}
    for k, v in trl_grpo.grpo_config_options(args).items():
        if k not in given:
            setattr(cfg, k, v)
    # --report_to: TRL's own trackers, kept offline with their files in output_dir (infra/track.py); TRL logs a
    # table of completions with their rewards to wandb and trackio when log_completions is on
    cfg.report_to = track.names(",".join(cfg.report_to) if isinstance(cfg.report_to, list) else cfg.report_to or "none")
    if cfg.report_to:
        track.keep_offline(cfg.output_dir)
        cfg.project = cfg.project if "project" in given else track.PROJECT  # trackio's project (TRL: "huggingface")
        if "trackio" in cfg.report_to:
            track.check_trackio_dir()
        cfg.log_completions = cfg.log_completions or "log_completions" not in given
    return script, cfg, args, model_cfg


def check(ns):
    """The settings checked before anything loads, each failure one line naming the flag (TRL checks some only once
    training starts, or with a traceback, and its usage runs to hundreds of lines): no number that is not finite,
    a group of at least two rollouts, a learning rate as train.py's, every count at least 1, a seed numpy takes, an
    output folder that can be written, and a batch of rollouts per generation that whole groups fill
    (per_device_train_batch_size x gradient_accumulation_steps x processes)."""
    for name, value in sorted(vars(ns).items()):
        if isinstance(value, float) and not math.isfinite(value):
            sys.exit(f"--{name} {value}: not a finite number")
    counts = ("max_steps", "per_device_train_batch_size", "gradient_accumulation_steps", "max_completion_length",
              "eval_limit", "eval_batch_size")
    for name in counts:
        if getattr(ns, name) < 1:
            sys.exit(f"--{name} {getattr(ns, name)}: must be at least 1")
    asked = ",".join(ns.report_to) if isinstance(ns.report_to, list) else ns.report_to or "none"
    if track.problem(asked):  # one line before the model loads; TRL's other integrations would go online
        sys.exit(track.problem(asked).replace("--report-to", "--report_to"))
    if ns.eval_every < 0:
        sys.exit(f"--eval_every {ns.eval_every}: must be at least 0 (0: at the end only)")
    if shared.threads_problem(ns.threads):
        sys.exit(f"--threads {ns.threads}: {shared.threads_problem(ns.threads)}")
    if shared.seed_problem(ns.seed):  # one line, not TRL's usage
        sys.exit(f"--seed {ns.seed}: {shared.seed_problem(ns.seed)}")
    if os.environ.get("LOCAL_RANK", "0") == "0":  # one probe a machine: processes making the folder at once collide
        checkpoint.writable_dir(ns.output_dir, "--output_dir")
    outer = checkpoint.enclosing_run(ns.output_dir) or (ns.output_dir if checkpoint.is_run(ns.output_dir) else None)
    if outer:  # a train.py run's folder: TRL's save would mix into it, or its rotation take TRL's model away
        sys.exit(f"--output_dir {ns.output_dir}: in the train.py run {outer}; choose a folder of its own")
    held = [f for f in ("config.json", "adapter_config.json", "model.safetensors", "adapter_model.safetensors")
            if os.path.exists(os.path.join(ns.output_dir, f))]
    if held and not ns.overwrite:  # TRL's save would replace an earlier run's model without a word
        sys.exit(f"--output_dir {ns.output_dir}: holds a model already ({held[0]}): choose another folder, or "
                 f"--overwrite to replace it")
    if ns.num_generations < 2:
        sys.exit(f"--num_generations {ns.num_generations}: must be at least 2 (G1 compares rollouts within a group)")
    if not 0 < ns.learning_rate <= shared.MAX_LR:
        sys.exit(f"--learning_rate {ns.learning_rate}: must be greater than 0 and at most {shared.MAX_LR}")
    if not ns.temperature >= shared.MIN_TEMPERATURE:
        sys.exit(f"--temperature {ns.temperature}: must be at least {shared.MIN_TEMPERATURE}")
    rollouts = ns.per_device_train_batch_size * ns.gradient_accumulation_steps * int(os.environ.get("WORLD_SIZE", 1))
    if rollouts % ns.num_generations:
        sys.exit(f"--per_device_train_batch_size {ns.per_device_train_batch_size} x --gradient_accumulation_steps "
                 f"{ns.gradient_accumulation_steps} x {os.environ.get('WORLD_SIZE', 1)} processes = {rollouts} "
                 f"rollouts: not whole groups of --num_generations {ns.num_generations}")


def problems(script, cfg, tokenizer, n_train: int):
    """(train, held_out): the training problems with their prompts (a tiny-world task: n_train fresh ones) and the
    held-out set (data.Problems), loaded as train.py loads them."""
    eval_name = script.eval_dataset or data.dataset(script.dataset).held_out
    held = data.run_problems(script.dataset, eval_name, tokenizer, data_dir=script.data_dir,
                             eval_limit=script.eval_limit, seed=cfg.seed, eval_flag="--eval_dataset")
    return held.pool or held.draw(random.Random(cfg.seed), n_train), held


def held_out_accuracy(model, tokenizer, held_out, cfg, script) -> float:
    """train.py's evaluation: greedy, evaluate.score, on the held-out prompts."""
    r = evaluate.score(model, tokenizer, held_out.eval_prompts, held_out.eval_golds,
                       max_new_tokens=cfg.max_completion_length, batch_size=script.eval_batch_size)
    return r["accuracy"]


class HeldOut(TrainerCallback):
    """Greedy held-out accuracy every `every` steps, printed and logged (main process only)."""

    def __init__(self, evaluate_now, every: int):
        self.evaluate_now, self.every, self.seconds = evaluate_now, every, 0.0

    def on_step_end(self, args, state, control, model=None, **_):
        periodic = self.every and state.global_step % self.every == 0 and state.global_step < state.max_steps
        if state.is_world_process_zero and periodic:
            t0 = time.time()
            print(f"step {state.global_step}: greedy held-out accuracy {self.evaluate_now(model):.3f}")
            self.seconds += time.time() - t0  # not counted in the seconds per step


def main(argv=None):
    script, cfg, args, model_cfg = parse(argv)
    cpu.setup(script.threads)
    if args.dynamic_sampling:
        print(f"--method {script.method}: D2 dynamic sampling is not in TRL 1.16 and not built here; every group is "
              f"trained on (train.py's --no-dynamic-sampling). D1, D3 and D4 are TRL's options (epsilon_high "
              f"{cfg.epsilon_high}, loss_type {cfg.loss_type}, the reward functions).")
    n_prompts = cfg.max_steps * cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps * \
        max(cfg.world_size, 1) // cfg.num_generations  # every problem sampled once (train.py: fresh problems)
    # the data are read with the tokenizer alone: a bad file fails before the model's minutes of loading
    train, held_out = problems(script, cfg, models.load_tokenizer(script.model), n_prompts)
    torch.manual_seed(cfg.seed)
    model, tokenizer, _ = models.load_model(script.model, world=data.dataset(script.dataset).world)
    trainer = trl_grpo.RuleGRPOTrainer(
        model=model, processing_class=tokenizer, args=cfg, rule_args=args, peft_config=get_peft_config(model_cfg),
        reward_funcs=trl_grpo.reward_functions(args),
        # the question (and arith's worked shots) beside the prompt: RLSD's teacher builds its own prompt from them
        train_dataset=Dataset.from_list([{"prompt": p["prompt"], "answer": p["answer"], "question": p["question"],
                                          **({"shots": p["shots"]} if "shots" in p else {})} for p in train]))
    main_process = trainer.accelerator.is_main_process
    evals = HeldOut(lambda m: held_out_accuracy(m, tokenizer, held_out, cfg, script), script.eval_every)
    trainer.add_callback(evals)
    before = held_out_accuracy(model, tokenizer, held_out, cfg, script) if main_process else None
    t0 = time.time()
    trainer.train(resume_from_checkpoint=cfg.resume_from_checkpoint)  # TRL's flag (with --save_strategy steps)
    seconds = time.time() - t0 - evals.seconds
    if main_process:
        after = held_out_accuracy(trainer.model, tokenizer, held_out, cfg, script)
        trainer.save_model(cfg.output_dir)
        checkpoint.usual_modes(cfg.output_dir)  # safetensors writes 0600
        print(f"{cfg.max_steps} steps in {seconds:.0f} s ({seconds / cfg.max_steps:.2f} s a step)")
        print(f"greedy held-out accuracy: {before:.3f} -> {after:.3f}   ({len(held_out.eval_golds)} problems, "
              f"model in {cfg.output_dir})")
    trainer.accelerator.wait_for_everyone()


def leave():
    """How each process of a multi-process run ends, after main()'s last barrier: its output flushed, then out
    without Python's teardown (os._exit), so that no gloo process group is destroyed. A gloo worker thread can
    still hold the last reference to the tensors of the last collectives, and releasing them needs the GIL;
    ProcessGroupGloo's destructor joins that thread while holding the GIL. Destroyed by destroy_process_group and
    the DDP model's release, that deadlocked (1 run in 15 with both cores busy, 2026-11-25: py-spy showed the main
    thread in ~ProcessGroupGloo's join, the worker in ~AsyncAllgatherWork waiting for the GIL); left to the
    interpreter's exit, the same release aborts the process ("terminate called without an active exception", about
    1 run in 13). Nothing is left to write: the model was saved before the barrier."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
    if torch.distributed.is_initialized():  # several processes (torchrun, accelerate launch)
        leave()
