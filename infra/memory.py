"""Memory: what a run's settings need at their peak (the --dry-run plan, from a model's config.json alone) and
what a run used (logged as peak_memory_gib). Apart from models.py, which only loads models."""
import os
import sys

import torch

GiB = 1024 ** 3


def rss_bytes() -> int:
    """The process's resident memory now (Linux), 0 where /proc is missing."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def peak_memory_bytes(device: str, rss_at_start: int = 0) -> int:
    """Peak memory so far: on CUDA what torch allocated; on the CPU the process's peak resident memory above what
    it held before the model was loaded (allocator slack included)."""
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated()
    import resource
    return max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_at_start)


def n_params(cfg) -> int:
    """Parameters of a Qwen2/Llama-style decoder from its config: embeddings (and the output layer when untied),
    per layer q/k/v/o projections (q, k, v with bias in Qwen2), the SwiGLU MLP and two RMSNorms, a final norm."""
    H, I, V, L = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_hidden_layers
    hd = getattr(cfg, "head_dim", None) or H // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    bias = getattr(cfg, "attention_bias", cfg.model_type == "qwen2")
    attn = H * q + 2 * H * kv + q * H + (q + 2 * kv if bias else 0)
    layer = attn + 3 * H * I + 2 * H
    return V * H * (1 if cfg.tie_word_embeddings else 2) + L * layer + H


def memory_plan(cfg, *, rollouts: int, gen_rollouts: int, prompt_len: int, max_new_tokens: int, micro_batch: int,
                bf16: bool, grad_checkpointing: bool, beta: float, ref_on_cpu: bool, chunk_tokens: int = 2048):
    """Bytes the RL step needs at its peak, phase by phase, as train.py runs it. Returns {phase: {item: bytes}}.

    Weights, gradients and AdamW's two states are float32 (4 + 4 + 8 bytes per parameter; --bf16 is autocast,
    which also holds a bf16 copy of the weights while a region lasts). Gradients are freed right after the
    optimizer step, so sampling does not hold them. foreach AdamW makes one float32 temporary the size of the
    parameters (sqrt of the second moment).
    Sampling: the KV cache of `gen_rollouts` rows of prompt + response tokens (2 x layers x KV heads x head dim
    each), and a few [rows, vocabulary] float32 buffers for the next-token distribution.
    Training forward of `micro_batch` rows: the activations autograd keeps, per token and layer about
    10 H + 2 kv + 4 I values (norm inputs, q/k/v, attention output, the MLP's gate, up, SiLU and product);
    with gradient checkpointing only each layer's input H is kept, plus one layer's full set while it is
    recomputed. The output layer runs `chunk_tokens` tokens at a time (sample.token_logprobs): logits, softmax
    and their gradient in float32.
    """
    N = n_params(cfg)
    H, I, V, L = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_hidden_layers
    hd = getattr(cfg, "head_dim", None) or H // cfg.num_attention_heads
    kv = cfg.num_key_value_heads * hd
    act = 2 if bf16 else 4  # bytes of an activation
    tokens = micro_batch * (prompt_len + max_new_tokens)
    per_layer = 10 * H + 2 * kv + 4 * I  # values kept per token and layer
    states = {"weights (float32)": 4 * N, "AdamW moments (float32)": 8 * N}
    if bf16:
        states["bf16 copy of the weights (autocast)"] = 2 * N
    if beta > 0 and not ref_on_cpu:
        states["reference model (bf16)" if bf16 else "reference model (float32)"] = (2 if bf16 else 4) * N
    sampling = {
        **states,
        f"KV cache: {gen_rollouts} rows x {prompt_len + max_new_tokens} tokens":
            gen_rollouts * (prompt_len + max_new_tokens) * L * 2 * kv * act,
        "next-token distributions": 3 * gen_rollouts * V * 4,
    }
    training = {
        **states,
        "gradients (float32)": 4 * N,
        f"activations: {micro_batch} rows x {prompt_len + max_new_tokens} tokens"
        + (" (checkpointed)" if grad_checkpointing else ""):
            tokens * act * (L * H + per_layer if grad_checkpointing else L * per_layer),
        f"output layer, {chunk_tokens} tokens at a time": min(chunk_tokens, tokens) * V * (3 * 4 + act),
    }
    step = {k: v for k, v in states.items() if not k.startswith("bf16 copy")}  # outside any autocast region
    step.update({"gradients (float32)": 4 * N, "AdamW temporary (float32)": 4 * N})
    return {"sampling": sampling, "training forward and backward": training, "optimizer step": step}


def dry_run(cfg, args, gpu_bytes: int, prompt_tokens: int):
    """--dry-run: the plan for these settings, and if it does not fit, what each memory flag would bring it to.
    prompt_tokens: the data's prompt length (data.Dataset.prompt_tokens), cut to what the positions leave."""
    positions = getattr(cfg, "max_position_embeddings", None) or 1 << 30
    if args.max_new_tokens >= positions:
        sys.exit(f"--max-new-tokens {args.max_new_tokens}: the model has {positions} positions in all")
    prompt_len = min(prompt_tokens, positions - args.max_new_tokens)
    settings = dict(rollouts=args.prompts_per_step * args.group_size,
                    gen_rollouts=(args.gen_batch_size or args.prompts_per_step) * args.group_size,
                    prompt_len=prompt_len, max_new_tokens=args.max_new_tokens, micro_batch=args.micro_batch_size,
                    bf16=args.bf16, grad_checkpointing=args.grad_checkpointing, beta=args.beta,
                    ref_on_cpu=args.ref_on_cpu)
    print(f"memory plan: {n_params(cfg) / 1e9:.3f} B parameters, {cfg.num_hidden_layers} layers, vocabulary "
          f"{cfg.vocab_size}; prompts taken as {prompt_len} tokens, responses as --max-new-tokens "
          f"{args.max_new_tokens}")
    peak = print_plan(memory_plan(cfg, **settings), gpu_bytes)
    if peak <= gpu_bytes:
        return peak
    print("flags that would bring it down (each alone, then all together):")
    options = [("--bf16", {"bf16": True}), ("--grad-checkpointing", {"grad_checkpointing": True}),
               ("--ref-on-cpu", {"ref_on_cpu": True}),
               (f"--micro-batch-size {max(1, args.micro_batch_size // 4)}",
                {"micro_batch": max(1, args.micro_batch_size // 4)}),
               (f"--gen-batch-size {max(1, (args.gen_batch_size or args.prompts_per_step) // 4)}",
                {"gen_rollouts": max(1, (args.gen_batch_size or args.prompts_per_step) // 4) * args.group_size})]
    peak_with = lambda change: max(sum(v.values()) for v in memory_plan(cfg, **{**settings, **change}).values())
    helpful, together = [], {}
    for flag, change in options:
        if all(settings[k] == v for k, v in change.items()) or (flag == "--ref-on-cpu" and args.beta == 0):
            continue
        if peak_with(change) < peak:
            helpful.append(flag)
            together.update(change)
            print(f"    {flag:28s} -> peak {peak_with(change) / GiB:.1f} GiB")
    if len(helpful) > 1:
        print(f"    {' '.join(helpful)} -> peak {peak_with(together) / GiB:.1f} GiB")
    return peak


def print_plan(plan: dict, gpu_bytes: int = None) -> int:
    """Print the plan phase by phase; return the peak in bytes."""
    peak = 0
    for phase, items in plan.items():
        total = sum(items.values())
        peak = max(peak, total)
        print(f"{phase}: {total / GiB:.1f} GiB")
        for item, b in items.items():
            print(f"    {item:55s} {b / GiB:8.2f} GiB")
    line = f"peak: {peak / GiB:.1f} GiB"
    if gpu_bytes:
        line += f" of {gpu_bytes / GiB:.0f} GiB ({'fits' if peak <= gpu_bytes else 'does NOT fit'})"
    print(line)
    return peak
