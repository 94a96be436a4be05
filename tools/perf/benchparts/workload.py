"""What each model is benchmarked on (train.py's flags and the benchmark's counts), and what the in-process parts
share: train.py's settings, model, tokenizer and first prompts."""
import contextlib
import os
import random
import statistics
import sys
import tempfile
from dataclasses import dataclass

from infra import models


@dataclass(frozen=True)
class Setting:
    """A model's benchmark: train.py's flags for its data, batch, lengths, temperature and grader (the sampler,
    TRL and the machine's shapes read the same ones), how many steps a run takes and how many are left out as
    warm-up, how many runs each method gets (taking turns; with more than one a first run is thrown away, since a
    first process after an idle spell runs slower), the sampler's timed repetitions, and the flags added for a rule
    that runs one forward per reasoning token (methods.Rule.scoring "forward": OAR-P), which at real lengths would
    take most of the benchmark's time, and the prompts a step of TRL's comparison (0: the setting's own; fewer where
    TRL's step at the setting's batch outgrows the machine: ours then runs again at TRL's size, in the same run).
    The defaults are a real model's (see SETTINGS): two warm-up steps, since SmolLM2's first update at full size (the
    length-parity grader's first step may train on few rows) ran slower than the next ones: 13.9 s, then 8.9-10.1 s
    in the four steps after; a cProfile'd run alike, 13.90 then 9.82 s. Its pass alone is slower the first time a
    process runs it (first page faults, or kernels made for new shapes: not separated; docs/LOG.md, 2026-11-27,
    eleventh session). The 0.5B's bf16 step 3 still ran slower than its steps 4 and 5, in all 6 runs of an A/B of
    train.py at its setting (training 22.2-24.7 s against 18.8-23.3 s; docs/LOG.md, 2026-11-27, thirteenth
    session: its early updates meet memory the process touches first): its setting leaves out three and times two."""
    flags: tuple
    steps: int = 3
    warmup: int = 2
    rounds: int = 1
    repeat: int = 1
    short: tuple = ()
    trl_prompts: int = 0


# The SmolLM2 recipe (docs/real-models.md): 8 prompts x 8 rollouts, 40 new tokens, temperature 0.5. Real models are
# graded by length parity (reward.GRADERS): with the real grader many of SmolLM2's groups agree in its first steps
# (docs/LOG.md), and a 0.5B model cannot finish a GSM8K answer in 40 tokens; train.py skips the rollouts of such
# groups, so the training seconds would measure luck. Under length parity nearly every group mixes and a step does
# its full work, in every method and in TRL alike.
RECIPE = ("--prompts-per-step", "8", "--group-size", "8", "--max-new-tokens", "40", "--temperature", "0.5", "--lr",
          "2e-5", "--warmup-steps", "3", "--grader", "length-parity")
SHORT = ("--max-new-tokens", "16")

# A real model's counts are sized so that `bench.py --model smollm2-135m --threads 2` ends in about 20 minutes on the
# 2-core machine: the estimate in docs/LOG.md (2026-11-24, "how bench.py is sized"; float32 at 51 s a step) gives 17
# minutes at two steps a method (a bf16 step on a later host took 13-14 s; in bf16 on 2026-11-27 about 10 s, and
# `--trl --methods grpo` at SmolLM2's five steps took 379 s).
SETTINGS = {
    # the tiny default as earlier entries of docs/LOG.md measured it: 16 prompts x 8, 48 new tokens, the real grader
    "tiny": Setting(("--prompts-per-step", "16", "--group-size", "8"), steps=14, warmup=4, rounds=2, repeat=11),
    # SmolLM2's steps 3-5, a median of three: one timed step read 6.41 s where train.py's steps 3-7 at these flags
    # took 5.73-6.86 s (docs/LOG.md, 2026-11-27, fourteenth session); its step 3 ran as fast as the later ones there
    "smollm2-135m": Setting(("--dataset", "arith") + RECIPE, short=SHORT, steps=5),
    # about 5x (0.5B) and 13x (1.5B) SmolLM2's work: estimated one and three hours on 2 cores at two steps a method (the
    # 0.5B's bench with --trl --methods grpo at five steps, three left out: 698 s on 2026-11-27). Micro-batches of 16:
    # at 64 rows a micro-batch the 0.5B's train.py reached 18.7-19.5 GB resident in its second step and, with the
    # bench's own process beside it, the machine's 24 GB ran out (docs/LOG.md, 2026-11-26; --dry-run plans 29.8 GiB).
    # TRL's GRPOTrainer at 8 x 8 was killed at 24.4 GB resident, with per-device batches of 64 and of 16 (same entry):
    # it is compared at 2 x 8
    "qwen2.5-coder-0.5b": Setting(("--dataset", "gsm8k") + RECIPE + ("--micro-batch-size", "16"), short=SHORT,
                                  trl_prompts=2, steps=5, warmup=3),
    "qwen2.5-coder-1.5b": Setting(("--dataset", "gsm8k") + RECIPE + ("--micro-batch-size", "16"), short=SHORT,
                                  trl_prompts=2),
}
OTHER = Setting(("--dataset", "arith") + RECIPE, short=SHORT)  # any other model: problems made here, no files needed
# train.py evaluates at step 0 and at its last step, and saves a checkpoint at its last, whatever these say: none in
# between, and each evaluation a few problems
BENCH_FLAGS = ("--eval-every", "1000000", "--save-every", "1000000", "--eval-limit", "8", "--eval-batch-size", "8")


@dataclass
class Workload:
    """What every in-process part shares: train.py's settings (config/training.py: the same flags, presets and checks
    included), the model and tokenizer as train.py loads them, on its device, and the prompts of train.py's first
    step (the same problems, drawn with the same seed)."""
    args: object
    model: object
    tok: object
    problems: object
    config: object  # the model's config (the model itself may be freed)
    prompts: list  # token-id lists of the first step's B prompts
    texts: list  # their text
    golds: list  # their gold answers

    @property
    def prompt_tokens(self) -> float:
        return statistics.mean(len(p) for p in self.prompts)


def load_workload(model_name: str, flags) -> Workload:
    """train.py's settings, model, tokenizer and first prompts for --model model_name and these flags."""
    from config import training
    import data
    args = training.parse_args(["--model", model_name, *flags, "--run-dir", os.path.join(tempfile.gettempdir(), "x")])
    with contextlib.redirect_stdout(sys.stderr):  # what the loaders say; stdout is the table's
        model, tok, _ = models.load_model(args.model, world=data.dataset(args.dataset).world)
        model.to(args.device).eval()
        problems = data.run_problems(args.dataset, args.eval_dataset, tok, data_dir=args.data_dir,
                                     eval_limit=args.eval_limit, pool_size=args.problem_pool, seed=args.seed)
    qs = problems.draw(random.Random(args.seed), args.prompts_per_step)  # as train.py's first step draws them
    return Workload(args, model, tok, problems, model.config, [tok(q["prompt"])["input_ids"] for q in qs],
                    [q["prompt"] for q in qs], [q["answer"] for q in qs])


def matmul_parameters(cfg) -> dict:
    """The weights that multiply: the layers' projections, and the output layer (V x H, tied or not). Embedding
    lookups, norms and biases do no matrix product and are not counted."""
    from infra import memory
    n = memory.parameters(cfg)
    return {"layers": n["projections"], "output layer": cfg.vocab_size * cfg.hidden_size}


def training_flops(cfg, responses: float, prompts: float) -> float:
    """Model FLOPs of a training pass: 6 a multiplying weight a token (forward 2, backward 4), over the response
    tokens and the prompt tokens run (a group's prompt once); prompts skip the output layer. Attention's own
    products and padding are not counted."""
    n = matmul_parameters(cfg)
    return 6 * (n["layers"] * (responses + prompts) + n["output layer"] * responses)


def gives_length(train_args) -> bool:
    """Whether train.py's flags after -- set --max-new-tokens (argparse takes a prefix, --max-new, too): then that is
    every method's length on the CPU, OAR-P's too (its cost at that length), not the setting's short one."""
    names = [f.split("=")[0] for f in train_args]
    return any(len(f) >= len("--max-n") and "--max-new-tokens".startswith(f) for f in names)  # --max- is ambiguous


def overridden(setting: Setting, args) -> Setting:
    """The setting with the counts given on the command line (--steps, --warmup, --rounds, --repeat, --trl-prompts);
    one line and exit where they leave no step to time."""
    import dataclasses
    given = {k: getattr(args, k) for k in ("steps", "warmup", "rounds", "repeat", "trl_prompts")
             if getattr(args, k, None) is not None}
    s = dataclasses.replace(setting, **given)
    if s.steps <= s.warmup or min(s.rounds, s.repeat) < 1 or s.warmup < 0:
        sys.exit(f"bench.py: --steps {s.steps} --warmup {s.warmup} --rounds {s.rounds} --repeat {s.repeat}: a run's "
                 f"medians are of its steps after the warm-up, and each count is at least 1")
    return s
