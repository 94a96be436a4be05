"""--gpu: the one-GPU table (issue 28). A randomly initialised model of Qwen2.5-Math-1.5B's configuration
(QWEN25_MATH_15B, written out: the GPU machine reaches no network and receives only the working tree, so no weights
travel), a tokenizer of its vocabulary and problems of a fixed prompt length, made in a temporary directory and run
through train.py. A random model samples to the length limit, the worst case for memory."""
import importlib.util
import json
import os
import tempfile
from dataclasses import dataclass

import methods
from tools.benchparts.machine import GiB, machine_rows
from tools.benchparts.sampler import gpu_sampler_rows
from tools.benchparts.steps import step_rows, train_run
from tools.benchparts.table import Table, progress
from tools.benchparts.workload import BENCH_FLAGS, Setting, overridden


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
            gpu_sampler_rows(table, model_dir, flags["steps"], s.repeat)
    return table


GPU_METHODS = ["grpo", "ktae", "oar-g", "oar-p"]  # issue 28's four
GPU_PARTS = ["machine", "memory", "steps", "oar-g", "sampler"]  # the sampler, in this process, last
