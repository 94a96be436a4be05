"""Resident memory over repeated sampling calls of tools.attribution's shape (issue 65): one v(question) estimate or
probe a call, n continuations of one prefix of 150-300 tokens with a budget of 512 new tokens (epicprm.prefix_values,
as World.values calls it). Prints the process's resident memory after each call, as it holds it (read before anything
else is handed back), and its peak so far; flat after the first calls is the target. --keep: freed memory kept
between calls, as the attribution did before it handed it back after each (attribution.handed_back).

    python -m tools.perf.memgrowth --model qwen2.5-coder-0.5b --calls 20 --threads 1
    python -m tools.perf.memgrowth --model qwen2.5-coder-0.5b --layers 4 --calls 20 --threads 1   # random weights, the
                                                              # model's widths and vocabulary, 4 layers: cheaper
    python -m tools.perf.memgrowth --model qwen2.5-coder-1.5b --calls 20 --threads 2              # the 1.5B (8-20 GB)

Prompts are random token ids, so a real model seldom samples EOS early and most calls run to the budget (the long
calls that grew); --layers keeps every buffer's width (the KV cache's per layer, the [rows, vocabulary] scores) and
cuts only the count of layers.
"""
import argparse
import contextlib
import random
import time

import torch

import epicprm
import sample
from config import shared
from infra import cli, cpu, memory, models
from tools.attribution.locate import handed_back


def load(args):
    """The model (--layers: random weights of its config, that many layers) and its EOS and pad ids."""
    if not args.layers:
        model, tok, _ = models.load_model(args.model)
        return model.eval(), tok.eos_token_id, tok.pad_token_id
    from transformers import AutoModelForCausalLM
    cfg = models.load_config(args.model)
    cfg.num_hidden_layers = args.layers
    if args.hidden:  # narrower layers, the same keys and values a token (KV heads x head dim) and vocabulary
        cfg.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        cfg.hidden_size, cfg.intermediate_size = args.hidden, 2 * args.hidden
        cfg.num_attention_heads = max(cfg.num_key_value_heads, args.hidden // cfg.head_dim)
    for key in ("layer_types", "max_window_layers"):  # per-layer lists of the full depth
        if isinstance(getattr(cfg, key, None), list):
            setattr(cfg, key, getattr(cfg, key)[:args.layers])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    return model, cfg.eos_token_id if isinstance(cfg.eos_token_id, int) else 0, cfg.pad_token_id or 0


def token_range(text: str) -> tuple:
    """--prompt-tokens' type: LOW-HIGH, 1 <= LOW <= HIGH, as (LOW, HIGH); anything else refused in one line by the
    parser, before the model loads (a range drawn from only at the first call was a traceback then)."""
    low, _, high = text.partition("-")
    if not (low.strip().isdigit() and high.strip().isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r}: not a range of token counts LOW-HIGH, e.g. 150-300")
    if not 1 <= int(low) <= int(high):
        raise argparse.ArgumentTypeError(f"{text!r}: needs 1 <= LOW <= HIGH")
    return int(low), int(high)


def main(argv=None):
    p = cli.Parser(description=__doc__.split("\n")[0])
    shared.add_shared_flags(p)
    p.add_argument("--layers", type=int, default=0, help="random weights with this many layers (0: the model itself)")
    p.add_argument("--hidden", type=int, default=0,
                   help="with --layers: this hidden size (the KV cache's width and the vocabulary kept), cheaper still")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--n", type=int, default=16, help="continuations a prefix (a call's rows)")
    p.add_argument("--prefixes", type=int, default=1, help="prefixes a call (--responses: 1; sampled: up to 4)")
    p.add_argument("--prompt-tokens", type=token_range, default="150-300",
                   help="a prefix's length, drawn from this range")
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--temperature", type=shared.number, default=1.0)
    p.add_argument("--keep", action="store_true",
                   help="keep freed memory between calls, as tools.attribution did before 2026-11-28 (default: hand it "
                        "back as each call ends, attribution.handed_back)")
    args = p.parse_args(argv)
    with shared.as_errors_of(p):  # every value before anything loads: a bad one was a traceback after the model
        shared.check_shared(args)
        shared.at_least(args, {"calls": 1, "n": 1, "prefixes": 1, "max_new_tokens": 1, "layers": 0, "hidden": 0})
        if args.temperature < shared.MIN_TEMPERATURE:
            raise shared.Refused(f"--temperature {args.temperature}: must be at least {shared.MIN_TEMPERATURE}")
        if args.hidden and not args.layers:
            raise shared.Refused(f"--hidden {args.hidden}: only with --layers (random weights of that width)")
    models.check_path(args.model, config_only=bool(args.layers))  # its files, one line, nothing loaded
    cpu.setup(args.threads)
    low, high = args.prompt_tokens
    t0 = time.time()
    model, eos, pad = load(args)
    model.to(args.device)
    vocab = model.get_output_embeddings().weight.shape[0]
    shape = f" ({args.layers} layers{f' of hidden size {args.hidden}' if args.hidden else ''}, random weights)"
    # resident memory as the process holds it (memory.rss_bytes would hand freed memory back first)
    print(f"{args.model}{shape if args.layers else ''}: loaded in {time.time() - t0:.0f} s; resident "
          f"{memory.resident_bytes() / memory.GiB:.2f} GiB; calls of {args.prefixes} x {args.n} rows, "
          f"prefixes of {low}-{high} tokens, {args.max_new_tokens} new tokens at most, bf16 {args.bf16}, "
          f"freed memory {'kept' if args.keep else 'handed back'} after each call")
    plan = memory.memory_plan(model.config, rollouts=args.n * args.prefixes, gen_rollouts=args.n * args.prefixes,
                              prompt_len=high, max_new_tokens=args.max_new_tokens, micro_batch=1, bf16=args.bf16,
                              grad_checkpointing=False, reference=False, ref_on_cpu=False,
                              first_step=True)["sampling"]
    print(f"the memory plan's sampling phase at this shape (infra/memory.py, prefixes of {high}): "
          f"{sum(plan.values()) / memory.GiB:.2f} GiB (" + ", ".join(f"{k} {v / memory.GiB:.2f}" for k, v in
                                                                    plan.items()) + ")")
    rng = random.Random(0)
    for call in range(1, args.calls + 1):
        prompts = [[rng.randrange(vocab) for _ in range(rng.randint(low, high))] for _ in range(args.prefixes)]
        t = time.time()
        with sample.autocast(args.device, args.bf16), (contextlib.nullcontext() if args.keep else handed_back()):
            epicprm.prefix_values(model, prompts, [[]] * len(prompts), n=args.n, temperature=args.temperature,
                                  max_new_tokens=args.max_new_tokens, grades=[lambda text: False] * len(prompts),
                                  decode=lambda ids: "", eos_id=eos, pad_id=pad, batch=args.n * args.prefixes)
        print(f"call {call:3d}: {time.time() - t:6.1f} s, prefixes {[len(x) for x in prompts]}, resident "
              f"{memory.resident_bytes() / memory.GiB:6.2f} GiB, peak so far "
              f"{memory.high_water_bytes() / memory.GiB:6.2f} GiB", flush=True)


if __name__ == "__main__":
    main()
