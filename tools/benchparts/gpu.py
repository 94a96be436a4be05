"""--gpu: the one-GPU table (issue 28). A randomly initialised model of Qwen2.5-Math-1.5B's configuration
(QWEN25_MATH_15B, written out: the GPU machine reaches no network and receives only the working tree, so no weights
travel), a tokenizer of its vocabulary and problems of a fixed prompt length, made in a temporary directory and run
through train.py. A random model samples to the length limit, the worst case for memory.

Parts (GPU_PARTS), each one call of the device tool (`python -m tools.bench --gpu --parts NAME`, under 10 minutes):
machine (matmul and bandwidth at the model's shapes); memory-recipe, memory-smaller, memory-lora (the plan against
each phase's measured peak, at docs/gpu.md's recipe, at a smaller setting and with LoRA); steps (seconds a step of
grpo, ktae, oar-g and oar-p; OAR-P on a short response); oar-g (OAR-G's peak at its default chunk, measured on
shorter responses, and its plan at the recipe's); sampler (ours,
with the two-matmul and with SDPA decode attention, against model.generate). With --device cpu the same code runs
at REDUCED sizes."""
import importlib.util
import json
import os
import tempfile
from dataclasses import dataclass

from tools.benchparts.machine import machine_rows
from tools.benchparts.sampler import gpu_sampler_rows
from tools.benchparts.steps import step_rows, train_run
from tools.benchparts.table import Table, progress
from tools.benchparts.workload import BENCH_FLAGS, Setting, overridden

# Qwen/Qwen2.5-Math-1.5B's config.json, written out: 28 layers, 12 query heads and 2 key-value heads of 128, the
# output layer tied to the embeddings (1.54B parameters in all)
QWEN25_MATH_15B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                       num_key_value_heads=2, vocab_size=151936, max_position_embeddings=4096, max_window_layers=21,
                       rope_theta=10000.0, rms_norm_eps=1e-6, sliding_window=4096, use_sliding_window=False,
                       tie_word_embeddings=True, hidden_act="silu", bos_token_id=151643, eos_token_id=151643,
                       pad_token_id=151643)


@dataclass(frozen=True)
class Sizes:
    """The --gpu table's sizes: FULL on a CUDA device, REDUCED for --device cpu (the same code, small)."""
    shapes: dict  # QWEN25_MATH_15B's fields replaced
    prompt_tokens: int  # every prompt's length: the benchmark's problems are made to it
    prompts: int  # prompts a step at the recipe's memory settings
    group: int  # G of the recipe; the smaller setting, the steps and the sampler take G / 2
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
# On a CPU, 2 layers of the real widths and 8,192 ids instead of 151,936: the real vocabulary alone is 233M
# parameters (3.7 GB with its gradient and AdamW's moments), which would make the 2-layer model a 0.33B one and
# each part minutes on a laptop. --device cpu shows that the code runs; G = 8 so that groups of G / 2 still mix.
REDUCED = Sizes({"num_hidden_layers": 2, "vocab_size": 8192, "bos_token_id": 8191, "eos_token_id": 8191,
                 "pad_token_id": 8191}, 96, 2, 8, 16, 12, 8, 6, 2, 1, 1)

# What each part costs, so that each fits one 10-minute call (estimates: no GPU has run it yet). On an H100 a decode
# step of the 28 layers is assumed 15-30 ms (Python-bound at these batches), a training token about 6 x 1.5 GFLOP at
# 200-400 TFLOP/s; each train.py run adds about 30 s of start and load, a greedy evaluation of one problem at step 0
# and at the end (one row to the length limit: as many decode steps as a sampling phase), and at the end a checkpoint
# (19 GB full-parameter: about a minute). Each part also builds the random model first (under a minute).
#   machine          < 1 min
#   memory-recipe    one step of 128 rollouts x 3072 tokens: sampling 1-1.5 min, training 0.5 min; with the two
#                    evaluations and the save, 4-7 min
#   memory-smaller   one step of 64 x 1024: 2 min
#   memory-lora      as memory-recipe, a small checkpoint: 3-6 min
#   steps            4 methods x 3 steps of 64 x 512 (sampling 8-15 s, training a few): 4 x 1.5-2 min = 6-8 min
#   oar-g            one step of 32 rollouts x 512: 1-2 min
#   sampler          3 contenders x 4 turns of 64 rows x 512 tokens (ours 8-15 s, generate about 2x): 3-5 min
# All of them in one call (no --parts): about 25-35 minutes.
GPU_PARTS = ["machine", "memory-recipe", "memory-smaller", "memory-lora", "steps", "oar-g", "sampler"]
GPU_METHODS = ["grpo", "ktae", "oar-g", "oar-p"]  # issue 28's four


def gpu_flags(model_dir: str, problems: str, device: str, s: Sizes) -> dict:
    """train.py's flags of each --gpu setting (the model, the problems and the device added)."""
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
                         "--max-new-tokens", str(s.step_tokens), "--bf16", "--micro-batch-size", str(s.group // 2)),
        # OAR-G's peak is set by its chunk of rollouts and their length, not by how many a step has. At the recipe's
        # 3072 tokens the plan of its default chunk (8 rollouts at 1.5B) is more than one GPU has (--dry-run),
        # so it is measured on the steps' responses and planned (oar_g_plan_row) at the recipe's.
        "oar-g": recipe + ("--prompts-per-step", str(max(1, s.prompts // 4)), "--max-new-tokens", str(s.step_tokens)),
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


def write_model(directory: str, shapes: dict, device: str):
    """A randomly initialised Qwen2ForCausalLM of QWEN25_MATH_15B (with `shapes` replaced), made on the device and
    saved in bf16 (train.py loads it in float32), and its tokenizer. Returns its config."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(**{**QWEN25_MATH_15B, **shapes})
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


def memory_rows(table: Table, name: str, flags, method: str, threads, phases=None):
    """The plan against the measured peak of each phase, from a one-step run, as tools/memcheck.py compares them:
    the plan (memory.memory_plan, what --dry-run prints) for the run's settings, its prompt length and the rollouts
    it trained, as of a first step, whose AdamW moments are made in its optimizer step; a later step holds them
    throughout (8 bytes a parameter more in each phase before it), which --dry-run's figure includes. One step, not
    two, halves the part's time. A run that failed (out of memory) shows the phases it reached and its error."""
    from tools import memcheck
    with tempfile.TemporaryDirectory() as d:
        run_dir = os.path.join(d, "run")
        records, error = train_run(flags, method, 1, threads, f"memory, {name}", run_dir)
        compared = memcheck.compare(run_dir) if records else []
    for _, phase, plan, got, _ in compared:
        if phases and phase not in phases:
            continue
        table.row("memory", f"{name}: {phase} (first step)", "not reached" if got is None else f"{got:.2f} GiB",
                  f"plan {plan:.2f} GiB", "" if got is None else f"{got / plan:.2f}")
    if error:  # running out of memory is what this part measures; any other end is a failure
        out_of_memory = any("out_of_memory" in r for r in records)
        (table.row if out_of_memory else table.fail)("memory", f"{name}: {error}")


def oar_g_plan_row(table: Table, cfg, flags, s: Sizes):
    """OAR-G's advantage phase at its default chunk and the recipe's lengths, as --dry-run plans it (not run: at
    1.5B it needs more memory than one GPU has). flags: the recipe's."""
    from config import training
    import methods
    from infra import memory
    args = training.parse_args([*flags, "--method", "oar-g", "--dry-run"])  # --dry-run: no GPU needed to plan for one
    plan = memory.memory_plan(cfg, **memory.plan_settings(args, s.prompt_tokens, methods.RULES[args.rule].memory_phase))
    table.row("memory", f"OAR-G at its default chunk ({args.oar_chunk}), {args.max_new_tokens} tokens: advantage",
              "not run", f"plan {sum(plan['advantage'].values()) / memory.GiB:.2f} GiB")


def release(device: str):
    """Hand the memory this process's caching allocator keeps back to the GPU."""
    import gc
    import torch
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def run_gpu(args, chosen: list, parts: list, table_out=None) -> Table:
    """--gpu: Qwen2.5-Math-1.5B's configuration (REDUCED on a CPU), randomly initialised, through train.py."""
    import torch
    from infra import memory
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    s = FULL if device.startswith("cuda") else REDUCED
    name = torch.cuda.get_device_name(device) if device.startswith("cuda") else "CPU"
    # the steps part's counts (its flags are gpu_flags' "steps"), checked before the model is built: one step left
    # out, the median of the other two (the CPU settings' second warm-up step, workload.Setting, is for SmolLM2's
    # slow first full-size update on a CPU, not measured here; a fourth step would take this part past its time)
    steps = overridden(Setting((), steps=3, warmup=1, repeat=s.repeat, short=("--max-new-tokens", str(s.short_tokens))),
                       args)
    with tempfile.TemporaryDirectory() as d:
        model_dir, problems = os.path.join(d, "model"), os.path.join(d, "problems.jsonl")
        progress(f"a random model of Qwen2.5-Math-1.5B's configuration {s.shapes or ''} in {model_dir}")
        cfg = write_model(model_dir, s.shapes, device)
        release(device)
        write_problems(problems, s.prompt_tokens)
        flags = gpu_flags(model_dir, problems, device, s)
        table = Table(f"bench --gpu: Qwen2.5-Math-1.5B's configuration, {cfg.num_hidden_layers} layers, "
                      f"{cfg.vocab_size:,} ids ({memory.n_params(cfg) / 1e9:.3f} B parameters), random weights, "
                      f"{s.prompt_tokens}-token prompts, on {name} ({device})", table_out)
        if "machine" in parts:
            machine_rows(table, cfg, s.gen_prompts * s.group, s.micro * (s.prompt_tokens + s.recipe_tokens), device,
                         gib=2.0 if device.startswith("cuda") else 0.5)
            release(device)  # what this process holds on the GPU is not there for train.py's runs
        for part, setting in (("memory-recipe", "recipe"), ("memory-smaller", "smaller"), ("memory-lora", "LoRA")):
            if part not in parts:
                continue
            if setting == "LoRA" and importlib.util.find_spec("peft") is None:
                table.row("memory", "LoRA: skipped: peft is not installed (pip install -r requirements/lora.txt)")
                continue
            memory_rows(table, setting, flags[setting], "ktae", args.threads)  # the 1.5B runs' method; plan: grpo's
        if "steps" in parts:
            step_rows(table, flags["steps"], chosen, steps, args.threads)
        if "oar-g" in parts:
            memory_rows(table, f"OAR-G at its default chunk, {s.step_tokens} tokens", flags["oar-g"], "oar-g",
                        args.threads, phases=("advantage",))
            oar_g_plan_row(table, cfg, flags["recipe"], s)
        if "sampler" in parts:  # in this process: last
            gpu_sampler_rows(table, model_dir, flags["steps"], s.repeat)
    return table
