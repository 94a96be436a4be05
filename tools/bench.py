"""Speed, against model.generate, TRL and the machine's own limits (issue 29), and the one-GPU table of memory and
seconds at Qwen2.5-Math-1.5B's shapes (issue 28). One table, each row printed as soon as it is measured.

    python tools/bench.py --threads 2                         # the tiny default: every part but TRL's
    python tools/bench.py --model smollm2-135m --threads 2    # the SmolLM2 recipe's setting, under 20 minutes
    python tools/bench.py --model qwen2.5-coder-0.5b --threads 2 --trl
    python tools/bench.py --parts steps --methods grpo,ktae --steps 6    # a quick look at two methods' steps
    python tools/bench.py --model smollm2-135m -- --bf16      # more train.py flags, for every part (bf16 autocast)

Parts (--parts, in this order): machine (matrix products at the model's shapes, float32 and bf16; memory
bandwidth), sampler (sample.generate against model.generate on the same prompts, lengths and batch, greedy and
sampled, taking turns; medians; and the share of the machine's limits that decoding reaches), steps (train.py in its
own process for grpo and each token rule of methods.RULES, the methods taking turns: seconds a step, split into
sampling, advantage and training; training MFU), trl (--trl: TRL's GRPOTrainer at the same setting), llama
(llama.cpp on the model's GGUF file, for reference only; skipped when llama_cpp is not installed). The setting of
each model (its data, batch, lengths, temperature, grader, steps and repetitions) is SETTINGS.

    python tools/bench.py --gpu                               # on a CUDA device: every part, about 30 minutes
    python tools/bench.py --gpu --parts machine,memory        # or one part a call (each under 10 minutes):
    python tools/bench.py --gpu --parts steps                 #   machine, memory, steps, sampler, oar-g
    python tools/bench.py --gpu --device cpu --threads 2      # the same code at 2 layers and short lengths

--gpu: a randomly initialised model of Qwen2.5-Math-1.5B's configuration (QWEN25_MATH_15B), a tokenizer of its
vocabulary and problems of a fixed prompt length, made in a temporary directory (no weights travel), run through
train.py. A random model samples to the length limit, the worst case for memory. Parts: machine; memory (the
--dry-run plan against the measured peak of each phase, at docs/gpu.md's recipe, at a smaller setting and with
LoRA); steps (seconds a step for grpo, ktae, oar-g, oar-p; OAR-P on a short response); sampler (our sampler against
model.generate, with SDPA and with the two-matmul decode attention); oar-g (OAR-G's peak at its default chunk).

Timings depend on the machine and on what else runs on it: docs/LOG.md has what these commands measured, dated.
"""
import argparse
import contextlib
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the project's root, one folder up
if __package__ in (None, ""):  # run as a file (python tools/bench.py): the project's modules are in ROOT
    sys.path.insert(0, ROOT)

import methods  # noqa: E402  (torch and the heavier modules are imported where they are used: --help answers at once)
from infra import models  # noqa: E402

TRAIN = os.path.join(ROOT, "train.py")
GiB = 1024 ** 3


# ---- the table ---------------------------------------------------------------------------------------------------

class Table:
    """One table, printed a row at a time as each is measured, so that a run cut off still shows what it had.
    Columns: the part of the benchmark, what was measured, its value, what it is held against, and the ratio."""
    WIDTHS = (9, 60, 14, 24, 11)

    def __init__(self, title: str, out=None):
        self.out, self.rows = out or sys.stdout, []
        self._print(title)
        self._line(("part", "what", "measured", "against", "ratio"))
        self._print("-" * (sum(self.WIDTHS) + len(self.WIDTHS) - 1))

    def row(self, part: str, what: str, measured: str = "", against: str = "", ratio: str = ""):
        self.rows.append((part, what, measured, against, ratio))
        self._line(self.rows[-1])

    def _line(self, cells):
        part, what, measured, against, ratio = (str(c) for c in cells)
        w = self.WIDTHS
        self._print(f"{part:{w[0]}s} {what:{w[1]}s} {measured:>{w[2]}s} {against:>{w[3]}s} {ratio:>{w[4]}s}".rstrip())

    def _print(self, text: str):
        print(text, file=self.out, flush=True)


def progress(text: str):
    """What the benchmark is doing, on stderr (the table alone goes to stdout)."""
    print(f"bench: {text}", file=sys.stderr, flush=True)


def median(values):
    return statistics.median(values) if values else float("nan")


def rate(x: float, unit: str) -> str:
    """1.23e11, "FLOP/s" -> "123.0 GFLOP/s"."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.1f} {prefix}{unit}"
    return f"{x:.1f} {unit}"


# ---- what each model is benchmarked on ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Setting:
    """A model's benchmark: train.py's flags for its data, batch, lengths, temperature and grader (the sampler,
    TRL and the machine's shapes read the same ones), how many steps a run takes and how many are left out as
    warm-up, how many runs each method gets (taking turns; with more than one a first run is thrown away, since a
    first process after an idle spell runs slower), the sampler's timed repetitions, and the flags added for a rule
    that runs one forward per reasoning token (methods.Rule.scoring "forward": OAR-P), which at real lengths would
    take most of the benchmark's time."""
    flags: tuple
    steps: int = 3
    warmup: int = 1
    rounds: int = 1
    repeat: int = 3
    short: tuple = ()


# The SmolLM2 recipe (docs/real-models.md): 8 prompts x 8 rollouts, 40 new tokens, temperature 0.5. Real models are
# graded by length parity (reward.GRADERS): with the real grader many of SmolLM2's groups agree in its first steps
# (docs/LOG.md), and a 0.5B model cannot finish a GSM8K answer in 40 tokens; train.py skips the rollouts of such
# groups, so the training seconds would measure luck. Under length parity nearly every group mixes and a step does
# its full work, in every method and in TRL alike.
RECIPE = ("--prompts-per-step", "8", "--group-size", "8", "--max-new-tokens", "40", "--temperature", "0.5", "--lr",
          "2e-5", "--warmup-steps", "3", "--grader", "length-parity")
SHORT = ("--max-new-tokens", "16")
SETTINGS = {
    # the tiny default as earlier entries of docs/LOG.md measured it: 16 prompts x 8, 48 new tokens, the real grader
    "tiny": Setting(("--prompts-per-step", "16", "--group-size", "8"), steps=14, warmup=4, rounds=2, repeat=11),
    "smollm2-135m": Setting(("--dataset", "arith") + RECIPE, short=SHORT),
    "qwen2.5-coder-0.5b": Setting(("--dataset", "gsm8k") + RECIPE, short=SHORT),
    "qwen2.5-coder-1.5b": Setting(("--dataset", "gsm8k") + RECIPE, steps=2, repeat=2, short=SHORT),
}
OTHER = Setting(("--dataset", "arith") + RECIPE, short=SHORT)  # any other model: problems made here, no files needed
BENCH_FLAGS = ("--eval-every", "1000000", "--save-every", "1000000", "--eval-limit", "8", "--eval-batch-size", "8")


def default_methods() -> list:
    """grpo and each token rule on it, from the method table: ['grpo', 'ktae', 'oar-p', 'oar-g', 'entropy']."""
    return [next(iter(methods.BASES))] + [m for m in methods.short_names() if m not in methods.BASES]


@dataclass
class Workload:
    """What every in-process part shares: train.py's settings (config.parse_args of the same flags, presets and checks
    included), the model and tokenizer as train.py loads them, on its device, and the prompts of train.py's first
    step (the same problems, drawn with the same seed). shapes: the model's widths for the matrix products."""
    args: object
    model: object
    tok: object
    problems: object
    config: object  # the model's config (the model itself may be freed)
    prompts: list  # token-id lists of the first step's B prompts
    texts: list  # their text

    @property
    def prompt_tokens(self) -> float:
        return statistics.mean(len(p) for p in self.prompts)


def load_workload(model_name: str, flags) -> Workload:
    """train.py's settings, model, tokenizer and first prompts for --model model_name and these flags."""
    import config
    import data
    args = config.parse_args(["--model", model_name, *flags, "--run-dir", os.path.join(tempfile.gettempdir(), "x")])
    with contextlib.redirect_stdout(sys.stderr):  # what the loaders say; stdout is the table's
        model, tok, _ = models.load_model(args.model, world=data.dataset(args.dataset).world)
        model.to(args.device).eval()
        problems = data.run_problems(args.dataset, args.eval_dataset, tok, data_dir=args.data_dir,
                                     eval_limit=args.eval_limit, pool_size=args.problem_pool, seed=args.seed)
    qs = problems.draw(random.Random(args.seed), args.prompts_per_step)  # as train.py's first step draws them
    return Workload(args, model, tok, problems, model.config, [tok(q["prompt"])["input_ids"] for q in qs],
                    [q["prompt"] for q in qs])


def matmul_parameters(cfg) -> dict:
    """The weights that multiply: the layers' projections, and the output layer (V x H, tied or not). Embedding
    lookups, norms and biases do no matrix product and are not counted."""
    from infra import memory
    n = memory.parameters(cfg)
    return {"layers": n["projections"], "output layer": cfg.vocab_size * cfg.hidden_size}


# ---- the machine's limits ---------------------------------------------------------------------------------------

def sync(device: str):
    import torch
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def seconds_per_call(fn, device: str, min_seconds: float = 0.2, windows: int = 3) -> float:
    """Median over `windows` of the seconds one call of fn takes, each window repeating it for at least
    min_seconds, after a warm-up call."""
    fn()
    sync(device)
    out = []
    for _ in range(windows):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            sync(device)
            if time.perf_counter() - t0 >= min_seconds:
                break
        out.append((time.perf_counter() - t0) / n)
    return statistics.median(out)


def matmul_rate(rows: int, inner: int, outer: int, dtype, device: str) -> float:
    """FLOP/s of x W^T, x [rows, inner], W [outer, inner], as nn.Linear computes a projection."""
    import torch
    x = torch.randn(rows, inner, device=device).to(dtype)
    w = torch.randn(outer, inner, device=device).to(dtype)
    return 2 * rows * inner * outer / seconds_per_call(lambda: torch.nn.functional.linear(x, w), device)


def bandwidth(device: str, gib: float) -> dict:
    """Bytes a second: reading (a sum over `gib` GiB of float32) and copying (read and write, counted twice)."""
    import torch
    x = torch.ones(int(gib * GiB) // 4, device=device)
    y = torch.empty_like(x)
    read = x.numel() * 4 / seconds_per_call(lambda: x.sum(), device, windows=3)
    copy = 2 * x.numel() * 4 / seconds_per_call(lambda: y.copy_(x), device, windows=3)
    return {"read": read, "copy": copy}


def machine_rows(table: Table, cfg, decode_rows: int, train_tokens: int, device: str, gib: float) -> dict:
    """The machine's own limits at the model's shapes, measured now: the MLP's up projection [rows, H] x [H, I] at
    the decode batch and at a training micro-batch's tokens, in float32 and bf16, and the memory bandwidth.
    Returns {"float32"/"bfloat16": {"decode"/"train": FLOP/s}, "read"/"copy": bytes/s}."""
    import torch
    H, I = cfg.hidden_size, cfg.intermediate_size
    limits = {}
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).split(".")[1]
        limits[name] = {}
        for shape, rows in (("decode", decode_rows), ("train", train_tokens)):
            limits[name][shape] = matmul_rate(rows, H, I, dtype, device)
            ratio = limits[name][shape] / limits["float32"][shape]
            table.row("machine", f"{name} matmul, {shape} shape [{rows} x {H}] x [{H} x {I}]",
                      rate(limits[name][shape], "FLOP/s"), "float32" if name != "float32" else "",
                      f"{ratio:.2f}x" if name != "float32" else "")
    bw = bandwidth(device, gib)
    table.row("machine", f"memory bandwidth, reading {gib:g} GiB (a sum)", rate(bw["read"], "B/s"))
    table.row("machine", f"memory bandwidth, copying {gib:g} GiB (read + write)", rate(bw["copy"], "B/s"))
    return {**limits, **bw}


# ---- the sampler ------------------------------------------------------------------------------------------------

def useful_tokens(responses, eos_id: int) -> int:
    """Response tokens up to and including each row's first EOS: what a sampler is for (generate() runs every row
    until the longest ends; ours drops finished rows). responses [N, T]."""
    is_eos = (responses == eos_id).int()
    return int(((is_eos.cumsum(1) - is_eos) == 0).sum())


def hf_sampler(w: Workload, n: int, T: int, temperature: float):
    """model.generate on the workload's prompts, each repeated n times: a function returning (useful tokens,
    decode steps). Top-k and top-p off, so that it draws from the full softmax, as ours does."""
    import torch
    import sample
    ids, mask = sample.left_pad(w.prompts, w.tok.pad_token_id)
    ids, mask = ids.repeat_interleave(n, 0).to(w.args.device), mask.repeat_interleave(n, 0).to(w.args.device)
    draw = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else \
        dict(do_sample=False)

    def run():
        with torch.no_grad(), sample.autocast(w.args.device, w.args.bf16):
            out = w.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=T, **draw,
                                   eos_token_id=w.tok.eos_token_id, pad_token_id=w.tok.pad_token_id)[:, ids.shape[1]:]
        return useful_tokens(out, w.tok.eos_token_id), out.shape[1]
    return run


def our_sampler(w: Workload, n: int, T: int, temperature: float):
    """sample.generate on the same prompts, as train.py calls it: a function returning (useful tokens, decode
    steps)."""
    import sample

    def run():
        with sample.autocast(w.args.device, w.args.bf16):
            b = sample.generate(w.model, w.prompts, n=n, max_new_tokens=T, temperature=temperature,
                                eos_id=w.tok.eos_token_id, pad_id=w.tok.pad_token_id)
        return int(b["response_mask"].sum()), b["response_mask"].shape[1]
    return run


def in_turns(contenders: dict, repeat: int, device: str, warmup: int = 1) -> dict:
    """Each contender (name -> a function returning (useful tokens, decode steps)) run in turns, `warmup` + `repeat`
    times, so that a machine slowing down or speeding up affects them alike. Returns name -> the medians of
    tokens/s, seconds, tokens and decode steps over the timed runs."""
    got = {name: [] for name in contenders}
    for r in range(warmup + repeat):
        for name, fn in contenders.items():
            sync(device)
            t0 = time.perf_counter()
            tokens, steps = fn()
            sync(device)
            if r >= warmup:
                got[name].append((tokens / (time.perf_counter() - t0), time.perf_counter() - t0, tokens, steps))
    return {name: {k: median([x[i] for x in runs]) for i, k in enumerate(("tps", "seconds", "tokens", "steps"))}
            for name, runs in got.items()}


def sampler_rows(table: Table, w: Workload, repeat: int, limits: dict) -> dict:
    """Our sampler against model.generate, greedy and sampled, on train.py's first prompts x G rollouts; then the
    share of the machine's limits that our sampled decoding reaches. Returns the sampled medians."""
    a = w.args
    sampled = None
    for mode, temperature in (("greedy", 0.0), (f"sampled at {a.temperature:g}", a.temperature)):
        progress(f"sampler, {mode}: {len(w.prompts)} prompts x {a.group_size}, {a.max_new_tokens} new tokens")
        got = in_turns({"generate": hf_sampler(w, a.group_size, a.max_new_tokens, temperature),
                        "ours": our_sampler(w, a.group_size, a.max_new_tokens, temperature)}, repeat, a.device)
        ours, hf = got["ours"], got["generate"]
        table.row("sampler", f"{mode}: useful tokens/s, ours against model.generate", f"{ours['tps']:,.0f}",
                  f"generate {hf['tps']:,.0f}", f"{ours['tps'] / hf['tps']:.2f}x")
        sampled = ours
    decoding_shares(table, w, sampled, limits)
    return sampled


def decoding_shares(table: Table, w: Workload, ours: dict, limits: dict):
    """Our sampled decoding against the machine: model FLOP/s (2 x the multiplying weights x the useful and prompt
    tokens) over the decode-shape matmul, and the bytes of weights read a second (all of them once a decode step,
    2 bytes each under --bf16's autocast copies, else 4) over the read bandwidth."""
    if not limits:
        return
    n = matmul_parameters(w.config)
    precision = "bfloat16" if w.args.bf16 else "float32"
    prompt = sum(len(p) for p in w.prompts)  # each prompt runs once, without the output layer but for its last token
    flops = 2 * (n["layers"] * (ours["tokens"] + prompt) + n["output layer"] * ours["tokens"]) / ours["seconds"]
    peak = limits[precision]["decode"]
    table.row("sampler", f"decoding: model FLOP/s over the {precision} decode matmul", rate(flops, "FLOP/s"),
              rate(peak, "FLOP/s"), f"{100 * flops / peak:.0f} %")
    weights = ours["steps"] * sum(n.values()) * (2 if w.args.bf16 else 4) / ours["seconds"]
    table.row("sampler", "decoding: weights read a second over the read bandwidth", rate(weights, "B/s"),
              rate(limits["read"], "B/s"), f"{100 * weights / limits['read']:.0f} %")


# ---- RL steps through train.py ------------------------------------------------------------------------------------

def train_run(flags, method: str, steps: int, threads=None, what: str = "") -> tuple:
    """train.py --method METHOD for `steps` steps in its own process (nothing imports train.py), in a temporary run
    directory (flags: the model, its setting and BENCH_FLAGS): (its step records from metrics.jsonl, None) or,
    where it failed, (what it logged, its last line of error: an out-of-memory step is logged with its phase's
    peaks)."""
    with tempfile.TemporaryDirectory() as d:
        run_dir = os.path.join(d, "run")
        cmd = [sys.executable, TRAIN, *flags, "--method", method, "--steps", str(steps),
               "--run-dir", run_dir, *(["--threads", str(threads)] if threads else [])]
        progress(f"{what or method}: {' '.join(cmd[2:])}")
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        path = os.path.join(run_dir, "metrics.jsonl")
        records = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
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
    keys = ("time_step", "time_sample", "time_advantage", "time_train", "response_len", "zero_adv_groups")
    return {k: median([x[k] for x in records if x.get(k) is not None]) for k in keys}


def step_rows(table: Table, flags, chosen: list, setting: Setting, threads) -> dict:
    """Seconds a step of each method, split into sampling, advantage and training (medians over the steps after
    the warm-up), against the first method's; a method marked * ran with setting.short, and a row says why.
    Returns method -> medians (absent where a method's run failed)."""
    runs = step_runs(flags, chosen, setting, threads)
    rows = {}
    for m in chosen:
        if not runs[m]["records"]:
            table.row("step", f"{m}: failed: {runs[m]['error']}")
            continue
        rows[m] = step_medians(runs[m]["records"])
        r, base = rows[m], rows.get(chosen[0])
        name = m + ("*" if forward_scoring(m) and setting.short else "")
        table.row("step", f"{name}: s/step = sampling + advantage + training", f"{r['time_step']:.3f}",
                  f"{r['time_sample']:.2f} + {r['time_advantage']:.3f} + {r['time_train']:.2f}",
                  f"{r['time_step'] / base['time_step']:.2f}x {chosen[0]}" if base else "")
    if setting.short and any(forward_scoring(m) for m in chosen):
        table.row("step", f"* with {' '.join(setting.short)}: its rule runs one forward per reasoning token")
    return rows


def training_mfu(table: Table, w: Workload, method: str, r: dict, limits: dict):
    """Training MFU of a method's step: model FLOPs a second over the matmul peak at the training shape in the
    precision used. Counted: 6 FLOPs (forward 2, backward 4) per multiplying weight per token trained on, where
    the tokens are the responses of the rollouts trained on and each of their groups' prompt once (a group's
    prompt runs once, and it skips the output layer); attention's own products (small at these lengths), and the
    padding up to a micro-batch's longest response, are not counted. The rollouts trained on are those of the
    groups that mixed right and wrong (1 - zero_adv_groups of them)."""
    if not limits:
        return
    a, n = w.args, matmul_parameters(w.config)
    mixed = 1 - r["zero_adv_groups"]
    responses = mixed * a.prompts_per_step * a.group_size * r["response_len"]
    prompts = mixed * a.prompts_per_step * w.prompt_tokens
    flops = 6 * (n["layers"] * (responses + prompts) + n["output layer"] * responses) / r["time_train"]
    precision = "bfloat16" if a.bf16 else "float32"
    peak = limits[precision]["train"]
    table.row("step", f"{method} training MFU ({responses + prompts:,.0f} tokens a step), {precision}",
              rate(flops, "FLOP/s"), rate(peak, "FLOP/s"), f"{100 * flops / peak:.0f} %")


# ---- TRL and llama.cpp ------------------------------------------------------------------------------------------

def trl_seconds(w: Workload, steps: int, warmup: int) -> float:
    """Seconds a step of TRL's GRPOTrainer at the workload's setting: B prompts x G completions a step (one optimizer
    step per B x G), the same length limit, temperature (top-k and top-p off), learning rate, precision, grader and
    problems (train.py's, in its order), beta 0. TRL's defaults otherwise, but gradient checkpointing off, as ours is
    (TRL turns it on). Timed from step begin to step end by a callback; the median after the warm-up. It trains
    w.model in place."""
    try:
        from datasets import Dataset
        from transformers import TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as e:
        raise RuntimeError(f"{e}: pip install -r requirements/trl.txt (measured with trl 1.16.0)") from None
    import reward
    a = w.args
    qs = w.problems.draw(random.Random(a.seed), a.prompts_per_step * steps)
    data = Dataset.from_list([{"prompt": q["prompt"], "answer": q["answer"]} for q in qs])
    grade = reward.GRADERS[a.grader]

    def correct(prompts, completions, answer, **kwargs):
        return [float(grade(c, g) is True) for c, g in zip(completions, answer)]

    times = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter() - self.t0)

    with tempfile.TemporaryDirectory() as d:
        cfg = GRPOConfig(output_dir=d, per_device_train_batch_size=a.prompts_per_step * a.group_size,
                         gradient_accumulation_steps=1, num_generations=a.group_size,
                         max_completion_length=a.max_new_tokens, temperature=a.temperature, top_k=0, top_p=1.0,
                         learning_rate=a.lr, beta=0.0, num_iterations=1, max_steps=steps,
                         use_cpu=a.device == "cpu", bf16=a.bf16, gradient_checkpointing=None, report_to="none",
                         save_strategy="no", logging_steps=1000, disable_tqdm=True, seed=a.seed)
        trainer = GRPOTrainer(model=w.model, processing_class=w.tok, reward_funcs=correct, args=cfg,
                              train_dataset=data, callbacks=[Timer()])
        with contextlib.redirect_stdout(sys.stderr):  # the Trainer prints its metrics: stdout is the table's
            trainer.train()
    return median(times[warmup:])


def trl_rows(table: Table, w: Workload, setting: Setting, ours: dict):
    """TRL's seconds a step, against our first method's."""
    progress(f"TRL GRPOTrainer, {setting.steps} steps")
    try:
        t = trl_seconds(w, setting.steps, setting.warmup)
    except RuntimeError as e:
        table.row("trl", f"skipped: {e}")
        return
    mine = next(iter(ours.values()), None) if ours else None
    table.row("trl", f"TRL GRPOTrainer: s/step (steps {setting.warmup + 1}-{setting.steps})", f"{t:.3f}",
              f"ours {next(iter(ours))} {mine['time_step']:.3f}" if mine else "",
              f"ours/TRL {mine['time_step'] / t:.2f}" if mine else "")


def llama_rows(table: Table, w: Workload, threads, ours: dict):
    """llama.cpp on the model's GGUF file, for reference only: what a CPU user would pick to run the model (not to
    train it), with 4-bit weights, one sequence at a time (llama-cpp-python's completion API), the first step's
    prompts once each at the same length limit and temperature."""
    if importlib.util.find_spec("llama_cpp") is None:
        table.row("llama.cpp", "skipped: llama_cpp is not installed (llama-cpp-python builds from source, ~15 min)")
        return
    where = models.gguf_location(w.args.model)
    if where is None:
        table.row("llama.cpp", f"skipped: --model {w.args.model} has no GGUF file")
        return
    import llama_cpp
    a = w.args
    llm = llama_cpp.Llama(model_path=os.path.join(*where), n_threads=threads or os.cpu_count(), seed=a.seed,
                          n_ctx=max(len(p) for p in w.prompts) + a.max_new_tokens + 16, verbose=False)
    tokens, t0 = 0, time.perf_counter()
    for text in w.texts:
        out = llm.create_completion(text, max_tokens=a.max_new_tokens, temperature=a.temperature)
        tokens += out["usage"]["completion_tokens"]
    tps = tokens / (time.perf_counter() - t0)
    table.row("llama.cpp", "sampled, one sequence at a time, 4-bit GGUF: tokens/s", f"{tps:,.0f}",
              f"ours {ours['tps']:,.0f}" if ours else "", f"{ours['tps'] / tps:.2f}x" if ours else "")


# ---- the default benchmark: one model on this machine -------------------------------------------------------------

def overridden(setting: Setting, args) -> Setting:
    """The setting with the counts given on the command line (--steps, --warmup, --rounds, --repeat)."""
    import dataclasses
    given = {k: getattr(args, k) for k in ("steps", "warmup", "rounds", "repeat") if getattr(args, k) is not None}
    return dataclasses.replace(setting, **given)


def run_cpu(args, chosen: list, parts: list, table_out=None) -> Table:
    """The benchmark of --model on args.device (the machine's limits, the sampler, the steps, TRL, llama.cpp)."""
    import torch
    setting = overridden(SETTINGS.get(args.model, OTHER), args)
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
    w.model = None  # the train.py runs load their own (a 0.5B model and its AdamW state take 10 GB); TRL reloads it
    if "steps" in parts:
        rows = step_rows(table, flags, chosen, setting, args.threads)
        if rows.get(chosen[0]):
            training_mfu(table, w, chosen[0], rows[chosen[0]], limits)
    if "trl" in parts:
        w.model = models.load_model(a.model, world=w.problems.dataset.world)[0].to(a.device)
        trl_rows(table, w, setting, rows)
    if "llama" in parts:
        llama_rows(table, w, args.threads, ours)
    return table


# ---- --gpu: Qwen2.5-Math-1.5B's shapes through train.py ----------------------------------------------------------

# Qwen/Qwen2.5-Math-1.5B's config.json, written out (the GPU machine reaches no network)
QWEN25_MATH_15B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                       num_key_value_heads=2, vocab_size=151936, max_position_embeddings=4096, max_window_layers=21,
                       rope_theta=10000.0, rms_norm_eps=1e-6, sliding_window=4096, use_sliding_window=False,
                       tie_word_embeddings=True, hidden_act="silu", bos_token_id=151643, eos_token_id=151643,
                       pad_token_id=151643)


@dataclass(frozen=True)
class Sizes:
    """The --gpu table's sizes: FULL on a CUDA device, REDUCED for --device cpu (the same code, small)."""
    shapes: dict  # QWEN25_MATH_15B's fields replaced (REDUCED: 2 layers)
    prompt_tokens: int  # every prompt's length: the benchmark's problems are made to it
    prompts: int  # prompts a step at the recipe's memory settings
    group: int  # G
    recipe_tokens: int  # --max-new-tokens of docs/gpu.md's recipe
    small_tokens: int  # of the smaller setting
    step_tokens: int  # of the seconds-a-step rows and the sampler
    short_tokens: int  # of OAR-P's step (one forward per reasoning token)
    micro: int  # --micro-batch-size of the recipe
    gen_prompts: int  # --gen-batch-size of the recipe
    repeat: int  # the sampler's timed repetitions


# The recipe's 16 prompts a step are 8 here: its peaks are those of one generation batch of 8 prompts (its
# --gen-batch-size) and of one micro-batch, the same with 8, and a step takes half the time.
FULL = Sizes({}, 256, 8, 16, 3072, 1024, 512, 64, 4, 8, 3)
REDUCED = Sizes({"num_hidden_layers": 2}, 96, 2, 4, 16, 12, 8, 6, 2, 1, 1)


def gpu_flags(model_dir: str, problems: str, device: str, s: Sizes) -> dict:
    """train.py's flags of each --gpu row (the model, the problems and the device added)."""
    base = ("--model", model_dir, *BENCH_FLAGS, "--dataset", problems, "--eval-dataset", problems, "--eval-limit", "1",
            "--eval-batch-size", "1", "--device", device, "--grader", "length-parity", "--temperature", "1.0",
            "--lr", "1e-6", "--warmup-steps", "0")
    recipe = base + ("--prompts-per-step", str(s.prompts), "--group-size", str(s.group), "--max-new-tokens",
                     str(s.recipe_tokens), "--beta", "0.001", "--bf16", "--grad-checkpointing", "--micro-batch-size",
                     str(s.micro), "--gen-batch-size", str(s.gen_prompts))
    return {
        "recipe": recipe,
        "smaller": base + ("--prompts-per-step", str(s.prompts), "--group-size", str(s.group // 2),
                           "--max-new-tokens", str(s.small_tokens), "--bf16", "--micro-batch-size", str(s.micro)),
        "LoRA": recipe + ("--lora-rank", "32"),
        "steps": base + ("--prompts-per-step", str(s.prompts), "--group-size", str(s.group // 2),
                         "--max-new-tokens", str(s.step_tokens), "--bf16", "--micro-batch-size", str(s.group)),
        # OAR-G's peak is set by its chunk of rollouts, not by how many a step has
        "oar-g": recipe + ("--prompts-per-step", str(max(1, s.prompts // 4))),
    }


def write_tokenizer(directory: str, vocab_size: int, eos_id: int):
    """A tokenizer of the model's whole vocabulary, made here: the 256 byte-level symbols (one token a byte, so any
    text encodes, one token a character in ASCII), EOS at eos_id, and a filler token "<i>" for every other id, so
    that whatever a random model samples decodes to text of some length (the length-parity grader then mixes
    groups)."""
    from tokenizers import Tokenizer, decoders, models as tm, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    eos = "<|endoftext|>"
    symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab, fill = {}, iter(range(vocab_size))
    for s in symbols + [None] * (vocab_size - len(symbols) - 1):
        i = next(fill)
        i = next(fill) if i == eos_id else i
        vocab[s if s is not None else f"<{i}>"] = i
    vocab[eos] = eos_id
    tok = Tokenizer(tm.BPE(vocab=vocab, merges=[], unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([eos])
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=eos,
                            padding_side="left").save_pretrained(directory)


def write_model(directory: str, s: Sizes, device: str):
    """A randomly initialised Qwen2ForCausalLM of QWEN25_MATH_15B (with s.shapes), made on the device and saved in
    bf16 (train.py loads it in float32), and its tokenizer. Returns its config."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(**{**QWEN25_MATH_15B, **s.shapes})
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    model.to(torch.bfloat16).save_pretrained(directory)
    del model
    write_tokenizer(directory, cfg.vocab_size, cfg.eos_token_id)
    return cfg


def write_problems(path: str, prompt_tokens: int, n: int = 64):
    """Problems whose prompt (data.build_prompt without a chat template: question, instruction) is prompt_tokens
    characters, one token each under write_tokenizer's; the answers do not matter under the length-parity grader."""
    import data
    room = prompt_tokens - len(f"\n{data.INSTRUCTION}\n")
    if room < 24:
        raise ValueError(f"{prompt_tokens}-token prompts leave no room for a question beside the instruction")
    with open(path, "w") as f:
        for i in range(n):
            q = f"Problem {i}: what is {i} + 1? "
            f.write(json.dumps({"question": (q + "x" * room)[:room], "answer": str(i + 1)}) + "\n")


def plan_figures(cfg, flags, prompt_tokens: int) -> dict:
    """The --dry-run plan of these train.py flags (--method among them) at this prompt length: {phase: bytes}
    (memory.memory_plan with memory.plan_settings, as --dry-run makes it)."""
    import config
    from infra import memory
    args = config.parse_args(list(flags))
    plan = memory.memory_plan(cfg, **memory.plan_settings(args, prompt_tokens, methods.RULES[args.rule].scoring))
    return {phase: sum(items.values()) for phase, items in plan.items()}


def memory_rows(table: Table, cfg, name: str, flags, method: str, s: Sizes, threads, phases=None):
    """The plan against the measured peak of each phase (memory.Peaks' names), from a 2-step run: the plan is of the
    steps after the first, which AdamW's moments join. A run that failed (out of memory) shows what it logged."""
    from infra import memory
    planned = plan_figures(cfg, tuple(flags) + ("--method", method), s.prompt_tokens)
    records, error = train_run(flags, method, 2, threads, f"memory, {name}")
    last = records[-1] if records else {}
    for key, phase in memory.Peaks.PHASES.items():
        if phases and key not in phases:
            continue
        got, plan = last.get(f"peak_{key}_gib"), planned.get(phase)
        if got is None and plan is None:
            continue
        table.row("memory", f"{name}: {phase} (step {last.get('step', '-')})",
                  "-" if got is None else f"{got:.2f} GiB", "-" if plan is None else f"plan {plan / GiB:.2f} GiB",
                  f"{got / (plan / GiB):.2f}" if got is not None and plan else "")
    if error:
        table.row("memory", f"{name}: {error}")


def sdpa_decode_attention(q, k, v, bias, scaling: float):
    """fastpath.decode_attention through torch's SDPA kernel, for the sampler's A/B: the same inputs and result
    (q [A, H, 1, D], k and v [A, Hkv, L, D], bias [A, L] of 0 and -inf; returns [A, 1, H*D])."""
    import torch
    A, H, _, D = q.shape
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias[:, None, None, :].to(q.dtype),
                                                           scale=scaling, enable_gqa=True)  # [A, H, 1, D]
    return out.transpose(1, 2).reshape(A, 1, H * D)


@contextlib.contextmanager
def decode_attention(impl):
    """fastpath.decode_step's attention replaced by impl while the block runs (the bench's A/B only)."""
    from infra import fastpath
    saved = fastpath.decode_attention
    fastpath.decode_attention = impl
    try:
        yield
    finally:
        fastpath.decode_attention = saved


def gpu_sampler_rows(table: Table, model_dir: str, flags, s: Sizes):
    """Our sampler, once with the written-out two-matmul decode attention (fastpath.decode_attention) and once with
    SDPA, against model.generate (SDPA), in turns, sampled at temperature 1 under bf16 autocast."""
    from infra import fastpath
    w = load_workload(model_dir, flags[2:])
    a = w.args
    two_matmul = fastpath.decode_attention

    def with_attention(impl, run):
        def fn():
            with decode_attention(impl):
                return run()
        return fn

    ours = our_sampler(w, a.group_size, a.max_new_tokens, a.temperature)
    progress(f"sampler: {len(w.prompts)} prompts x {a.group_size}, {a.max_new_tokens} new tokens")
    got = in_turns({"generate": hf_sampler(w, a.group_size, a.max_new_tokens, a.temperature),
                    "two matmuls": with_attention(two_matmul, ours),
                    "SDPA": with_attention(sdpa_decode_attention, ours)}, s.repeat, a.device)
    hf = got["generate"]
    for name in ("two matmuls", "SDPA"):
        table.row("sampler", f"ours ({name} decode attention): useful tokens/s, {len(w.prompts)} x {a.group_size} rows",
                  f"{got[name]['tps']:,.0f}", f"generate {hf['tps']:,.0f}", f"{got[name]['tps'] / hf['tps']:.2f}x")


def release(device: str):
    """Hand the memory this process's caching allocator keeps back to the GPU."""
    import gc
    import torch
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def run_gpu(args, chosen: list, parts: list, table_out=None) -> Table:
    """--gpu: Qwen2.5-Math-1.5B's shapes (REDUCED on a CPU), randomly initialised, through train.py."""
    import torch
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    s = FULL if device.startswith("cuda") else REDUCED
    name = torch.cuda.get_device_name(device) if device.startswith("cuda") else "CPU"
    with tempfile.TemporaryDirectory() as d:
        model_dir, problems = os.path.join(d, "model"), os.path.join(d, "problems.jsonl")
        progress(f"a random model of Qwen2.5-Math-1.5B's configuration {s.shapes or ''} in {model_dir}")
        cfg = write_model(model_dir, s, device)
        release(device)
        write_problems(problems, s.prompt_tokens)
        flags = gpu_flags(model_dir, problems, device, s)
        from infra import memory
        table = Table(f"bench --gpu: Qwen2.5-Math-1.5B's configuration, {cfg.num_hidden_layers} layers "
                      f"({memory.n_params(cfg) / 1e9:.3f} B parameters), random weights, {s.prompt_tokens}-token "
                      f"prompts, on {name} ({device})", table_out)
        if "machine" in parts:
            machine_rows(table, cfg, s.gen_prompts * s.group, s.micro * (s.prompt_tokens + s.recipe_tokens), device,
                         gib=2.0 if device.startswith("cuda") else 0.5)
            release(device)  # what this process holds on the GPU is not there for train.py's runs
        if "memory" in parts:
            for setting in ("recipe", "smaller", "LoRA"):
                if setting == "LoRA" and importlib.util.find_spec("peft") is None:
                    table.row("memory", "LoRA: skipped: peft is not installed (pip install -r requirements/lora.txt)")
                    continue
                memory_rows(table, cfg, setting, flags[setting], "ktae", s, args.threads)
        if "steps" in parts:
            setting = overridden(Setting(flags["steps"], short=("--max-new-tokens", str(s.short_tokens))), args)
            step_rows(table, flags["steps"], chosen, setting, args.threads)
        if "oar-g" in parts:
            memory_rows(table, cfg, "OAR-G at its default chunk", flags["oar-g"], "oar-g", s, args.threads,
                        phases=("advantage",))
        if "sampler" in parts:
            gpu_sampler_rows(table, model_dir, flags["steps"], s)
    return table


GPU_METHODS = ["grpo", "ktae", "oar-g", "oar-p"]  # issue 28's four
CPU_PARTS = ["machine", "sampler", "steps", "trl", "llama"]
GPU_PARTS = ["machine", "memory", "steps", "oar-g", "sampler"]  # the sampler, in this process, last


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=models.DEFAULT, help="any train.py --model; SETTINGS says what each alias is "
                                                           "benchmarked on (default: %(default)s)")
    p.add_argument("--gpu", action="store_true", help="the one-GPU table at Qwen2.5-Math-1.5B's shapes (issue 28); "
                                                      "--device cpu runs it at 2 layers and short lengths")
    p.add_argument("--parts", default=None, help=f"comma-separated, in their order: {','.join(CPU_PARTS)} (default: "
                                                 f"all but trl); with --gpu {','.join(GPU_PARTS)} (default: all)")
    p.add_argument("--trl", action="store_true", help="also TRL's GRPOTrainer (the trl part; requirements/trl.txt)")
    p.add_argument("--methods", default=None, help="the steps part's train.py methods, comma-separated; the first is "
                                                   f"the baseline (default: {','.join(default_methods())}; with "
                                                   f"--gpu {','.join(GPU_METHODS)})")
    p.add_argument("--steps", type=int, default=None, help="train.py steps a run (default: the model's setting)")
    p.add_argument("--warmup", type=int, default=None, help="steps a run left out of the medians (default: the "
                                                            "model's setting)")
    p.add_argument("--rounds", type=int, default=None, help="runs a method, taking turns (default: the setting's)")
    p.add_argument("--repeat", type=int, default=None, help="the sampler's timed repetitions (default: the "
                                                            "setting's)")
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: train.py's)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch, here and in every train.py run "
                                                             "(default: torch's choice; on a shared machine pass what "
                                                             "is yours)")
    p.add_argument("train_args", nargs="*", help="more train.py flags for every part, after --, e.g. -- --bf16")
    args = p.parse_args(argv)
    known = GPU_PARTS if args.gpu else CPU_PARTS
    parts = args.parts.split(",") if args.parts else [x for x in known if x != "trl" or args.trl]
    if args.trl and "trl" not in parts and not args.gpu:
        parts.append("trl")
    for x in parts:
        if x not in known:
            p.error(f"--parts: unknown part {x!r} (choose from {', '.join(known)})")
    default = GPU_METHODS if args.gpu else default_methods()
    chosen = [m.strip() for m in (args.methods or ",".join(default)).split(",") if m.strip()]
    for m in chosen:
        if m not in methods.names():
            p.error(f"--methods: unknown method {m!r} (choose from {', '.join(methods.names())})")
    if args.steps is not None and args.warmup is not None and args.steps <= args.warmup:
        p.error(f"--steps {args.steps} must exceed --warmup {args.warmup}")
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    t0 = time.time()
    table = (run_gpu if args.gpu else run_cpu)(args, chosen, parts)
    progress(f"done in {time.time() - t0:.0f} s")
    return table


if __name__ == "__main__":
    main()
