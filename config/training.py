"""train.py's flags: the parser, the presets of --method (methods.py) and of --dataset (data.py) filled in by
resolve(), and every check made before anything heavy runs (a bad value is one line naming the flag).
`python train.py --help` lists them with defaults; what every script shares is in config/shared.py."""
import argparse
import math
import os
import sys

import data
import methods
import reward
from config import recipe, shared
from config.shared import Refused, number
from infra import cli, lora, track


def parser() -> argparse.ArgumentParser:
    p = cli.Parser(description="Critic-free RL for math reasoning: GRPO, DAPO, KTAE, OAR (train.py)",
                                formatter_class=cli.Defaults)
    shared.add_shared_flags(p)
    p.add_argument("--method", choices=methods.names(), default="grpo", metavar="METHOD",
                   help="BASE+RULE (methods.py): grpo, dapo (its preset below), ktae = grpo+ktae, dapo+ktae, "
                        "oar-p / oar-g = grpo+oar-p / grpo+oar-g, dapo+oar-g, ...")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="a recipe: these flags as YAML keys (recipes/*.yaml), or a run's run.json to repeat it; the "
                        "command line's flags win (config/recipe.py)")
    p.add_argument("--run-dir", default=None, help="default: runs/METHOD-seedSEED")
    p.add_argument("--resume", action="store_true", help="continue from RUN_DIR/checkpoint (same method and data)")
    p.add_argument("--overwrite", action="store_true",
                   help="start over in a RUN_DIR that holds another run, deleting it")
    p.add_argument("--seed", type=int, default=0, help="fixes the problems drawn, the sampling and the initial RNG")
    # the task
    p.add_argument("--dataset", default=data.DEFAULT,
                   help=f"training problems: {', '.join(data.DATASETS)} (data.py: tiny and chain are tasks of the tiny "
                        f"world, made here; arith too), a .jsonl file, or a hub name")
    p.add_argument("--eval-dataset", default=None, help="held-out problems (default: the data's own: tiny, chain and "
                                                        "arith their held-out sets, others math500)")
    p.add_argument("--eval-limit", type=int, default=256, help="first N held-out problems")
    p.add_argument("--grader", choices=list(reward.GRADERS), default="math",
                   help="what grades the sampled responses (reward.GRADERS): math, the last \\boxed{} against the "
                        "gold answer; length-parity, a stand-in for speed benchmarks (an even number of characters "
                        "is right, so groups mix whatever the model; tools/perf/bench.py). The held-out evaluation always "
                        "uses math")
    # sampling
    p.add_argument("--steps", type=int, default=400, help="RL steps (each: one batch of rollouts, --mu updates)")
    p.add_argument("--max-minutes", type=number, default=None,
                   help="stop after this much training wall time (then evaluate and save): compare methods at equal "
                        "time")
    p.add_argument("--prompts-per-step", type=int, default=16, help="B, prompts per step")
    p.add_argument("--group-size", type=int, default=8, help="G, rollouts per prompt")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="response length limit; longer ones are truncated (default: the data's, 48 for tiny, 128 for "
                        "chain; 48 for other datasets)")
    p.add_argument("--temperature", type=number, default=1.0, help="sampling temperature (also applied in the loss)")
    p.add_argument("--problem-pool", type=int, default=0,
                   help="tiny: train on a fixed pool of this many problems (0: fresh problems every step)")
    p.add_argument("--gen-batch-size", type=int, default=0,
                   help="prompts per generate call (0: all B at once); fewer prompts, smaller KV cache")
    p.add_argument("--eval-batch-size", type=int, default=256, help="prompts per generate call when evaluating")
    # optimisation
    p.add_argument("--lr", type=number, default=5e-5, help="AdamW learning rate (the tiny model; 1e-6 for 1.5B)")
    p.add_argument("--warmup-steps", type=int, default=10, help="linear learning-rate warm-up, then constant")
    p.add_argument("--grad-clip", type=number, default=1.0, help="clip the gradient's global norm to this")
    p.add_argument("--mu", type=int, default=1,
                   help="optimizer updates per batch of rollouts (G3: the clip binds when > 1)")
    p.add_argument("--micro-batch-size", type=int, default=64, help="rollouts per training forward (accumulated)")
    # the objective
    p.add_argument("--beta", type=number, default=0.0, help="G4 KL weight; 0 loads no reference model")
    p.add_argument("--ref-on-cpu", action="store_true", help="keep the reference model on the CPU between uses")
    p.add_argument("--eps-low", type=number, default=0.2, help="G3 clip: rho >= 1 - eps_low where A < 0")
    p.add_argument("--eps-high", type=number, default=None, help="D1 clip-higher (dapo: 0.28; default eps-low)")
    p.add_argument("--dual-clip", type=number, default=None, metavar="C",
                   help="G3 dual-clip: a token with A < 0 loses at most -A * C (zero gradient where rho > C); C > 1. "
                        "Off by default, as in the GRPO and DAPO papers; verl uses 3")
    p.add_argument("--agg", default=None, choices=["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"],
                   help="G5 (grpo: seq-mean-token-mean; dapo: token-mean, D3)")
    # DAPO (dapo.py D1-D4); --method dapo turns on all but the overlong filter
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
    p.add_argument("--rules-file", default=None, metavar="FILE",
                   help="a file (or module) of your own token rules, each added to methods.RULES (README.md, "
                        "\"Adding a token rule\"); then --method NAME runs yours")
    # evaluation and saving
    p.add_argument("--eval-every", type=int, default=50,
                   help="greedy held-out evaluation every N steps (0: never during the run); the evaluations before "
                        "the first step and after the last stay unless --no-final-eval")
    p.add_argument("--final-eval", action=argparse.BooleanOptionalAction, default=True,
                   help="evaluate before the first step and after the last (--no-final-eval: a smoke test that "
                        "evaluates nothing)")
    p.add_argument("--save-every", type=int, default=50,
                   help="checkpoint every N steps (0: never during the run); the last step's checkpoint stays unless "
                        "--no-final-save")
    p.add_argument("--final-save", action=argparse.BooleanOptionalAction, default=True,
                   help="checkpoint after the last step (--no-final-save: a smoke test that leaves no checkpoint)")
    p.add_argument("--report-to", default="none", metavar="NAMES",
                   help="none, or trackers that show the run live, joined by commas: tensorboard, wandb (offline), "
                        "trackio; each an optional install (requirements/track.txt), its files in RUN_DIR "
                        "(infra/track.py)")
    # hardware
    p.add_argument("--grad-checkpointing", action="store_true", help="recompute activations in backward (GPU memory)")
    p.add_argument("--lora-rank", type=int, default=0,
                   help="train LoRA adapters of this rank instead of every weight (0: full-parameter; infra/lora.py, "
                        "needs requirements/lora.txt); with --bf16 the frozen base is held in bf16")
    p.add_argument("--lora-alpha", type=number, default=None, help="LoRA's alpha: adapters scaled by alpha / rank "
                                                                  "(default 4 x rank, as Tina's 128 at rank 32)")
    p.add_argument("--lora-targets", default=",".join(lora.TARGETS),
                   help="the projections that take adapters, comma-separated module names")
    p.add_argument("--dry-run", action="store_true", help="print the memory plan for these settings and exit "
                                                          "(reads only the model's config.json)")
    p.add_argument("--memory", "--gpu-memory", type=number, default=None,
                   help="GiB the --dry-run plan is held against (default: the GPU's when --device is one, else this "
                        "machine's memory)")
    methods.add_knobs(p)  # each rule's own flags (methods.Rule.knobs), a group per rule in --help
    return p


def load_rules_file(argv: list):
    """A --rules-file in argv (or in the run.json or recipe of its --config) loaded into methods.RULES before the
    parser is built: its rules are --method choices, their knobs flags. A refusal is Refused."""
    spec = methods.rules_file_of(argv)
    if spec is None:
        path = methods.rules_file_of(["--rules-file" if w == "--config" else w for w in argv])  # the recipe's path
        try:
            values = recipe.read(path) if path else {}
        except Refused:  # a recipe that cannot be read is said by the parser's own reading of it, below
            values = {}
        spec = values.get("rules-file", values.get("rules_file")) if isinstance(values, dict) else None
    if spec:
        try:
            methods.load_rules(str(spec))
            parser()  # a knob of the file's named like one of train.py's own flags cannot join them
        except ValueError as e:
            raise Refused(str(e)) from None
        except argparse.ArgumentError as e:
            raise Refused(f"--rules-file {spec}: a knob of its is a flag of train.py already ({e})") from None


def parse_args(argv=None):
    """train.py's settings from its command line: the flags, resolved (resolve); a refusal is argparse's error."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        load_rules_file(argv)
    except Refused as e:
        parser().error(str(e))  # the parser of the table's own rules: one line, as for any flag
    p = parser()
    with shared.as_errors_of(p):
        args = p.parse_args(recipe.expand(p, argv))  # --config's flags first: the command line's, later, win
        return resolve(args)


def parse_args_one_line(argv: list, **given):
    """parse_args for a script that builds train.py's settings: compare.py checks each run's flags before the first
    starts; the TRL path passes the rule's flags as text and, by name in `given`, the values GRPOConfig decides
    (typed, not written out as flags). A refusal is SystemExit(its one line), not argparse's usage of every flag."""
    try:
        load_rules_file(argv)
        args = shared.parse_quietly(parser(), argv)
        for name, value in given.items():
            setattr(args, name, value)
        return resolve(args)
    except Refused as e:
        raise SystemExit(str(e)) from None


def resolve(args):
    """The settings made whole, once: the presets of --method's base and token rule and of --dataset where a flag
    was not given (None), the values derived from others, then every check. Returns args; a refusal is Refused."""
    try:
        args.base, args.rule, args.term = methods.parse(args.method)
    except ValueError as e:
        raise Refused(str(e)) from None
    ds, base = data.dataset(args.dataset), methods.BASES[args.base]
    term_flags = methods.TERMS[args.term].flags if args.term else {}
    for k, v in {**base.flags, **term_flags}.items():  # a loss term's surrogate settings over its base's
        if getattr(args, k) is None:
            setattr(args, k, v)
    why = methods.resolve_knobs(args, ds)  # the rule's own flags: given, else its defaults; a foreign one refused
    if why:
        raise Refused(why)
    # a frozen reference is loaded for G4's KL (beta > 0) and for a loss term that reads it (SDPG's P3)
    args.reference = args.beta > 0 or bool(args.term and methods.TERMS[args.term].reference(args))
    if args.max_new_tokens is None:
        args.max_new_tokens = ds.max_new_tokens
    if args.overlong_buffer is None:  # D4's L_cache: the base's share of the length limit (dapo: a sixth), or off
        args.overlong_buffer = max(1, math.floor(args.max_new_tokens * base.overlong_share)) if base.overlong_share \
            else 0
    args.eval_dataset = args.eval_dataset or ds.held_out
    if args.run_dir is None:
        args.run_dir = os.path.join("runs", f"{args.method}-seed{args.seed}")
    # the rules file by its content, a setting that defines the run: one edited between a run and its --resume would
    # train the later steps with another rule under the same name (infra/checkpoint.py refuses it)
    args.rules_file_sha256 = methods.rules_digest(args.rules_file) if args.rules_file else None
    if args.lora_alpha is None:
        args.lora_alpha = 4.0 * args.lora_rank
    check(args)
    return args


def check(args):
    """Every flag checked before anything heavy runs: a bad value is one line naming the flag (Refused), not a
    traceback after the model load or a run that silently does nothing."""
    shared.check_shared(args)
    shared.at_least(args, {"steps": 1, "prompts_per_step": 1, "max_new_tokens": 1, "micro_batch_size": 1, "mu": 1,
                           "eval_every": 0, "save_every": 0, "eval_limit": 1, "eval_batch_size": 1,
                           "max_sampling_rounds": 1, "gen_batch_size": 0, "problem_pool": 0, "warmup_steps": 0,
                           "lora_rank": 0})
    if args.group_size < 2:  # G1 divides by the group's standard deviation, which needs two rollouts
        raise Refused(f"--group-size {args.group_size}: must be at least 2 (G1 compares rollouts within a group)")
    positive = {"lr": args.lr, "temperature": args.temperature, "grad_clip": args.grad_clip}
    for name, value in positive.items():
        if not value > 0:
            raise Refused(f"--{name.replace('_', '-')} {value}: must be greater than 0")
    if args.lr > shared.MAX_LR:
        raise Refused(f"--lr {args.lr}: must be at most {shared.MAX_LR} (AdamW moves each weight by up to about lr a "
                      f"step)")
    if args.temperature < shared.MIN_TEMPERATURE:
        raise Refused(f"--temperature {args.temperature}: must be at least {shared.MIN_TEMPERATURE} (below it sampling "
                      f"is greedy in all but name, and logits / temperature overflow float32 near 1e-37)")
    shared.check_seed(args.seed)
    if not args.run_dir.strip():
        raise Refused(f"--run-dir {args.run_dir!r}: empty (leave the flag out for runs/METHOD-seedSEED)")
    if not args.beta >= 0:
        raise Refused(f"--beta {args.beta}: must be at least 0")
    if not 0 < args.eps_low < 1 or (args.eps_high is not None and not args.eps_high > 0):
        raise Refused(f"--eps-low {args.eps_low} / --eps-high {args.eps_high}: need 0 < eps-low < 1 and eps-high > 0")
    if args.dual_clip is not None and not args.dual_clip > 1:
        raise Refused(f"--dual-clip {args.dual_clip}: must be greater than 1")
    if not 0 <= args.overlong_buffer < args.max_new_tokens:
        raise Refused(f"--overlong-buffer {args.overlong_buffer}: must be at least 0 and below --max-new-tokens "
                      f"{args.max_new_tokens}")
    if args.max_minutes is not None and not args.max_minutes >= 0:
        raise Refused(f"--max-minutes {args.max_minutes}: must be at least 0")
    if args.lora_rank and not args.lora_alpha > 0:
        raise Refused(f"--lora-alpha {args.lora_alpha}: must be greater than 0")
    if args.lora_rank:
        lora.peft()  # installed, or one line saying how
    if args.memory is not None and not args.memory > 0:
        raise Refused(f"--memory {args.memory}: must be greater than 0")
    if track.problem(args.report_to):
        raise Refused(track.problem(args.report_to))
    if not args.dry_run and track.folder_problem(args.report_to, args.run_dir):
        raise Refused(track.folder_problem(args.report_to, args.run_dir))
    if args.resume and args.overwrite:
        raise Refused("--resume and --overwrite: choose one (continue the run, or delete it and start over)")
