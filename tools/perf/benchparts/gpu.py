"""The GPU check's model and its memory rows (tools/perf/gpu_check.py). A randomly initialised model of
Qwen2.5-Math-1.5B's configuration (QWEN25_MATH_15B, written out: no weights need to travel to the GPU machine, nor a
network be reached from it), a tokenizer of its vocabulary and problems of a fixed prompt length, run through
train.py. A random model samples to the length limit, the worst case for memory.
"""
import json
import os
import tempfile

from tools.perf.benchparts.steps import train_run
from tools.perf.benchparts.table import Table

# Qwen/Qwen2.5-Math-1.5B's config.json, written out: 28 layers, 12 query heads and 2 key-value heads of 128, the
# output layer tied to the embeddings (1.54B parameters in all)
QWEN25_MATH_15B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                       num_key_value_heads=2, vocab_size=151936, max_position_embeddings=4096, max_window_layers=21,
                       rope_theta=10000.0, rms_norm_eps=1e-6, sliding_window=4096, use_sliding_window=False,
                       tie_word_embeddings=True, hidden_act="silu", bos_token_id=151643, eos_token_id=151643,
                       pad_token_id=151643)


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
    """The plan against the measured peak of each phase, from a one-step run, as tools/perf/memcheck.py compares them:
    the plan (memory.memory_plan, what --dry-run prints) for the run's settings, its prompt length and the rollouts
    it trained, as of a first step, whose AdamW moments are made in its optimizer step; a later step holds them
    throughout (8 bytes a parameter more in each phase before it), which --dry-run's figure includes. One step, not
    two, halves the part's time. A run that failed (out of memory) shows the phases it reached and its error."""
    from tools.perf import memcheck
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


def oar_g_plan_row(table: Table, cfg, flags, prompt_tokens: int):
    """OAR-G's advantage phase at its default chunk and the recipe's lengths, as --dry-run plans it (not run: at
    1.5B it needs more memory than one GPU has). flags: the recipe's."""
    from config import training
    import methods
    from infra import memory
    args = training.parse_args([*flags, "--method", "oar-g", "--dry-run"])  # --dry-run: no GPU needed to plan for one
    plan = memory.memory_plan(cfg, **memory.plan_settings(args, prompt_tokens, methods.RULES[args.rule].memory_phase))
    table.row("memory", f"OAR-G at its default chunk ({args.oar_chunk}), {args.max_new_tokens} tokens: advantage",
              "not run", f"plan {sum(plan['advantage'].values()) / memory.GiB:.2f} GiB")
