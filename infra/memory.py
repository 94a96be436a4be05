"""Memory: what a run's settings need at their peak, phase by phase (the --dry-run plan, from a model's config.json
alone), and what a run used in each phase (Peaks, logged as peak_*_gib). Apart from models.py, which loads models."""
import os
import sys

import torch
import transformers

from infra import cpu, lora

GiB = 1024 ** 3
# sample.token_logprobs makes the output layer's float32 logits a chunk of tokens at a time, at most this many bytes a
# chunk: 2,048 tokens of Qwen2.5's 151,936 ids (1.2 GB). In bytes, not tokens: a smaller vocabulary takes more tokens a
# chunk, so SmolLM2's (49,152 ids, 6,330 tokens) runs the bench's 2,560 response tokens as one chunk, which is not
# recomputed in the backward (a training pass 5.31 -> 5.15 s, 7 rounds in turns: docs/LOG.md, 2026-11-27, fifteenth
# session).
LOGIT_CHUNK_BYTES = 2048 * 151_936 * 4


def logit_chunk_tokens(vocab: int) -> int:
    """Tokens a chunk of the output layer: as many as make LOGIT_CHUNK_BYTES of float32 logits over `vocab` ids."""
    return max(1, LOGIT_CHUNK_BYTES // (4 * vocab))


def resident_bytes() -> int:
    """The process's resident memory now, as it holds it (Linux's /proc/self/statm), 0 where /proc is missing."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def high_water_bytes() -> int:
    """The resident set's high-water mark (VmHWM of /proc/self/status, which reset_peak resets), or where /proc is
    missing the process's peak as getrusage gives it."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss_bytes() -> int:
    """The process's resident memory now (Linux), 0 where /proc is missing: after freed memory goes back to the
    system, as before each phase's peak (reset_peak), so that the two compare."""
    release_freed_memory()
    return resident_bytes()


def peak_memory_bytes(device: str, rss_at_start: int = 0) -> int:
    """Peak memory since the last reset_peak (or the start): on CUDA what torch allocated; on the CPU the process's
    peak resident memory above what it held before the model was loaded (allocator slack included)."""
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated()
    return max(0, high_water_bytes() - rss_at_start)


def release_freed_memory():
    """Hand memory the process freed back to the system (glibc's malloc_trim). glibc keeps freed blocks for reuse (up
    to 32 MB by default, up to 2 GB under cpu.keep_freed_memory), so without this a phase's resident set starts
    with the last phase's freed activations (at 1.5B more than twice what was live: docs/LOG.md, 2026-11-24).
    Elsewhere than glibc, nothing."""
    libc = cpu.glibc()
    if libc is not None:
        libc.malloc_trim(0)


def reset_peak(device: str, release: bool = True):
    """Start a new peak: torch's counter on CUDA; on Linux the resident set's high-water mark (clear_refs 5), after
    the freed memory goes back to the system where `release`. Where that cannot be done, the next peak is the peak
    so far."""
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        return
    if release:
        release_freed_memory()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


class Peaks:
    """The peak memory of each phase of an RL step, by the plan's names (memory_plan): sampling, the advantage (OAR
    scores with the policy; the reference's log-probs), the training forward and backward, the optimizer step.
    Each phase's peak is read at its end and the counter reset, so that every figure is its own phase's (a phase
    that runs twice, as with --mu 2, keeps its larger figure); `run` is the largest of all so far.

    On the CPU the freed memory goes back to the system at each phase's end of a process's first step only (what
    tools/perf/memcheck.py compares with the plan), so that its figures are the phase's own. Later steps' figures also
    hold what glibc kept of earlier phases, as the process does: giving it back costs every next phase its page
    faults again, about a fifth of SmolLM2's training pass (docs/LOG.md, 2026-11-26, fifth session)."""
    PHASES = {"sampling": "sampling", "advantage": "advantage", "training": "training forward and backward",
              "optimizer": "optimizer step"}

    EXACT_STEPS = 1  # the steps of a process whose phases start from released memory

    def __init__(self, device: str, rss_at_start: int):
        self.device, self.base, self.step, self.run, self.current = device, rss_at_start, {}, 0, None
        self.steps = 0  # started in this process
        self.seen = {}  # what the plan depends on, once the step knows it (the prompt length): logged with the peaks

    def start(self):
        """A new step: its phases' figures start empty."""
        self.step, self.current, self.seen = {}, next(iter(self.PHASES)), {}
        self.steps += 1
        reset_peak(self.device, self.steps <= self.EXACT_STEPS)

    def end(self, phase: str):
        peak = peak_memory_bytes(self.device, self.base)
        self.step[phase] = max(self.step.get(phase, 0), peak)
        self.run = max(self.run, peak)
        names = list(self.PHASES)
        self.current = names[(names.index(phase) + 1) % len(names)]  # the phase in progress, for out_of_memory
        reset_peak(self.device, self.steps <= self.EXACT_STEPS)

    def record(self) -> dict:
        """The step's figures for metrics.jsonl, in GiB: peak_memory_gib (the run's so far) and peak_PHASE_gib."""
        return {**self.seen, "peak_memory_gib": self.run / GiB,
                **{f"peak_{k}_gib": v / GiB for k, v in self.step.items()}}


def out_of_memory(error: BaseException) -> bool:
    """Whether an exception is an allocation that failed: CUDA's OutOfMemoryError, or the CPU allocator's
    RuntimeError (torch raises no subclass of its own there)."""
    return isinstance(error, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(error, RuntimeError) and "can't allocate memory" in str(error))


def stop(error: BaseException, peaks: Peaks, step: int, log):
    """A run out of memory: logged (log, a metrics line: the phase and each phase's peak so far) and ended in one
    line naming the phase and what to do; nothing is lost, the last checkpoint stays."""
    phase = Peaks.PHASES[peaks.current]
    log({"step": step, "out_of_memory": phase, **peaks.record()})
    sys.exit(f"out of memory during the {phase} of step {step} ({what_failed(error)}); `--dry-run` plans each phase "
             f"and names the flags that bring it down; the last checkpoint is kept")


def what_failed(error: BaseException) -> str:
    """The part of an allocation error a person needs, in one short line: the CPU allocator's starts with its
    source location ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: ...") and puts the size
    last, where a plain cut lost it."""
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    text = text.split("DefaultCPUAllocator: ")[-1]
    return text if len(text) <= 160 else text[:157] + "..."


def parameters(cfg, lora_rank: int = 0, lora_targets=lora.TARGETS) -> dict:
    """A Qwen2/Llama-style decoder's parameters from its config, by kind: the layers' projections (q, k, v, o and
    the SwiGLU MLP's gate, up, down), their biases (q, k, v in Qwen2), the norms (two a layer and a final one), the
    embeddings, the output layer (0 when tied to the embeddings), and the LoRA adapters of rank lora_rank on the
    projections named in lora_targets (r x (in + out) each)."""
    H, I, V, L = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_hidden_layers
    hd = getattr(cfg, "head_dim", None) or H // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    shapes = {"q_proj": (H, q), "k_proj": (H, kv), "v_proj": (H, kv), "o_proj": (q, H),
              "gate_proj": (H, I), "up_proj": (H, I), "down_proj": (I, H)}  # (in, out)
    bias = getattr(cfg, "attention_bias", cfg.model_type == "qwen2")
    return {"projections": L * sum(i * o for i, o in shapes.values()), "biases": L * (q + 2 * kv) if bias else 0,
            "norms": L * 2 * H + H, "embeddings": V * H, "output layer": 0 if cfg.tie_word_embeddings else V * H,
            "adapters": L * sum(lora_rank * (i + o) for name, (i, o) in shapes.items() if name in lora_targets)}


def n_params(cfg) -> int:
    """The model's parameters (adapters aside)."""
    return sum(v for k, v in parameters(cfg).items() if k != "adapters")


# shear.py's max_elements default: the cost values one Sinkhorn solve holds (tests/test_shear.py checks they agree)
SINKHORN_ELEMENTS = 2 ** 24


def memory_plan(cfg, *, rollouts: int, gen_rollouts: int, prompt_len: int, max_new_tokens: int, micro_batch: int,
                bf16: bool, grad_checkpointing: bool, reference: bool, ref_on_cpu: bool, group_size: int = 1,
                lora_rank: int = 0, lora_targets=lora.TARGETS, oar_chunk: int = 0, oar_gradient: bool = False,
                chunk_tokens: int = None, first_step: bool = False, forward_once: str = None,
                frozen_copy: bool = False, loss_term: str = None):
    """Bytes the RL step needs at its peak, phase by phase, as train.py runs it (memory.Peaks measures the same
    phases). Returns {phase: {item: bytes}}.

    What trains (every weight, or LoRA's adapters) is float32 with its gradient and AdamW's two moments (4 + 4 + 8
    bytes a parameter); AdamW's moments exist from the first optimizer step on, and the plan is of the steps after
    (first_step: of the first, whose phases before its optimizer step hold no moment yet).
    Gradients are freed right after the optimizer step, so sampling does not hold them; train.py's AdamW is fused
    (it updates each weight and its moments in place, no temporary the size of what trains). Full-parameter --bf16
    is autocast, which holds a bf16 copy of the weights while a region lasts (train.py's: an update). Under LoRA
    the frozen base takes no gradient and no moment: with --bf16 its linear layers are held in bf16 (infra/lora.py),
    the embeddings and norms float32; a tied output layer, being the embeddings, is cast to bf16 for each product (a
    transient copy). Under LoRA the reference (G4's, beta > 0, or a loss term's) is the base itself. A rule's
    frozen copy of what trains (frozen_copy, methods.Rule.frozen_copy: RLSD's teacher between syncs) is float32,
    every weight or the adapters, held from the first step's advantage phase on.
    Sampling: the KV cache of `gen_rollouts` rows of prompt + response tokens (2 x layers x KV heads x head dim
    each), and a few [rows, vocabulary] float32 buffers for the next-token distribution.
    Advantage (OAR only: oar_chunk rollouts a scoring forward): OAR scores in float32; OAR-G (oar_gradient) keeps
    the activations of each chunk for its backward to the embeddings; OAR-P keeps none (no gradient) but gathers,
    for its copies of the rows, each row's cache before the perturbed token (oar.perturbation_scores, share_rows).
    Advantage (forward_once, methods.Rule.forward_once): one forward of `micro_batch` rollouts without a gradient,
    float32: each layer's transient work on their tokens, and what the rule keeps: "hidden states" (SHEAR: the last
    layer's state of every scored token of every rollout) or "logits" (RLSD's teacher: its output layer a chunk at a
    time).
    Training forward of `micro_batch` rows: the activations autograd keeps, per token and layer about
    10 H + 2 kv + 4 I values (norm inputs, q/k/v, attention output, the MLP's gate, up, SiLU and product), a
    group's prompt once (sample.token_logprobs shares it), at 4 bytes each even under --bf16: autocast leaves the
    residual stream, the norms and the softmax in float32 (a 1.5B LoRA step: docs/gpu.md). With gradient
    checkpointing only each layer's input H is kept, plus one layer's full set while it is recomputed. The output
    layer runs `chunk_tokens` tokens at a time (logit_chunk_tokens of the vocabulary by default): logits, softmax
    and their gradient in float32.
    """
    micro_batch = min(micro_batch, rollouts)  # a micro-batch holds at most the step's rollouts, in every phase
    n = parameters(cfg, lora_rank, lora_targets)
    N = sum(v for k, v in n.items() if k != "adapters")
    H, I, V, L = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_hidden_layers
    hd = getattr(cfg, "head_dim", None) or H // cfg.num_attention_heads
    kv = cfg.num_key_value_heads * hd
    act = 2 if bf16 else 4  # bytes of an activation
    per_layer = 10 * H + 2 * kv + 4 * I  # values kept per token and layer
    chunk_tokens = logit_chunk_tokens(V) if chunk_tokens is None else chunk_tokens
    chunk = min(chunk_tokens, micro_batch * max_new_tokens)  # tokens in the largest chunk
    trains = n["adapters"] if lora_rank else N
    if lora_rank and bf16:
        weights = {"frozen linear layers (bf16)": 2 * (n["projections"] + n["biases"] + n["output layer"]),
                   "embeddings and norms (float32)": 4 * (n["embeddings"] + n["norms"]),
                   "adapters (float32)": 4 * n["adapters"]}
    else:
        weights = {"weights (float32)": 4 * N, **({"adapters (float32)": 4 * n["adapters"]} if lora_rank else {})}
    copy = {f"the rule's frozen copy of the {'adapters' if lora_rank else 'weights'} (float32)": 4 * trains
            } if frozen_copy else {}
    states = {**weights, **({} if first_step else {"AdamW moments (float32)": 8 * trains}), **copy}
    if reference and not ref_on_cpu and not lora_rank:
        states["reference model (bf16)" if bf16 else "reference model (float32)"] = (2 if bf16 else 4) * N
    autocast = {}  # what --bf16's autocast adds while a region lasts
    if bf16 and not lora_rank:
        autocast["bf16 copy of the weights (autocast)"] = 2 * N
    elif bf16 and cfg.tie_word_embeddings:
        autocast["bf16 copy of the tied output layer (autocast)"] = 2 * V * H
    sampling = {
        # the rule takes its copy after the first step's sampling
        **{k: v for k, v in states.items() if not (first_step and k in copy)}, **autocast,
        f"KV cache: {gen_rollouts} rows x {prompt_len + max_new_tokens} tokens":
            gen_rollouts * (prompt_len + max_new_tokens) * L * 2 * kv * act,
        "next-token distributions": 3 * gen_rollouts * V * 4,
    }
    plan = {"sampling": sampling}
    if oar_chunk:  # a chunk's prompt is run once (no gradient); its reasoning, cue and answer take the passes
        scored = oar_chunk * (max_new_tokens + 16)
        plan["advantage"] = {
            **states,
            f"the rule's scoring KV cache: {oar_chunk} rows x {prompt_len + max_new_tokens + 16} tokens":
                oar_chunk * (prompt_len + max_new_tokens + 16) * L * 2 * kv * 4,
            **({f"its backward's activations (OAR-G, GRAIL): {oar_chunk} rows x {max_new_tokens + 16} tokens "
                f"(float32)":
                scored * L * per_layer * 4} if oar_gradient else {}),
            **({f"its perturbed copies' cache, gathered from the rows' (OAR-P): {oar_chunk} copies at most":
                oar_chunk * (prompt_len + max_new_tokens + 16) * L * 2 * kv * 4} if not oar_gradient else {}),
            "its output layer, a few columns a row (OAR's probe, GRAIL's box)": 3 * oar_chunk * 4 * V * 4,
        }
        if lora_rank and bf16 and n["output layer"]:  # sample.float32 upcasts a bf16 layer's weight per product:
            # the untied output layer's is the largest, and OAR scores with it in float32
            plan["advantage"]["float32 copy of the bf16 output layer, while used"] = 4 * n["output layer"]
    if forward_once:
        seq = prompt_len + max_new_tokens + 16  # RLSD's privileged prompt is a few tokens longer
        teacher_chunk = min(chunk_tokens, micro_batch * max_new_tokens)  # a forward's tokens at most
        plan["advantage"] = {
            **states, **autocast,
            f"the rule's forward, one layer's work: {micro_batch} rows x {seq} tokens (float32)":
                micro_batch * seq * per_layer * 4,
            **({f"its kept hidden states: {rollouts} rows x {max_new_tokens} tokens x {H} (float32)":
                rollouts * max_new_tokens * H * 4} if forward_once == "hidden states" else {}),
            # SHEAR's S3 after the forward: a chunk of SINKHORN_ELEMENTS costs with its kernel, potentials and plan
            # (about 5 such arrays), and one rollout's token distances to its group; what exceeds the forward's
            # per-layer work, freed by then, is added
            **({"SHEAR's Sinkhorn solves (S3) beyond the forward's freed work (float32)": max(0, (
                5 * SINKHORN_ELEMENTS + max_new_tokens * group_size * max_new_tokens) * 4
                - micro_batch * seq * per_layer * 4)} if forward_once == "hidden states" else {}),
            **({f"its output layer, {teacher_chunk} tokens at a time": teacher_chunk * V * 3 * 4}
               if forward_once == "logits" else {}),
        }
    rows_prompts = min(micro_batch, max(1, rollouts // max(group_size, 1)))  # a micro-batch's distinct prompts
    tokens = micro_batch * max_new_tokens + (micro_batch if grad_checkpointing else rows_prompts) * prompt_len
    activations = tokens * 4 * (L * H + per_layer if grad_checkpointing else L * per_layer)
    # the backward frees each layer's activations as it makes that layer's gradients, so the two coexist only where
    # the gradients outgrow what was freed, and at the start, where the output layer's gradient sits beside them all
    # (counting both whole planned half as much again as a full-parameter 1.5B step took: docs/LOG.md)
    extra_gradients = max(4 * trains - activations, 0 if lora_rank else 4 * n["output layer"])
    plan["training forward and backward"] = {
        **states, **autocast,
        "gradients (float32) beyond the activations they replace": extra_gradients,
        f"activations: {micro_batch} rows x {max_new_tokens} tokens, {prompt_len}-token prompts"
        + (" (checkpointed)" if grad_checkpointing else ""): activations,
        f"output layer, {chunk} tokens at a time": chunk * V * (3 * 4 + act),
    }
    if loss_term == "full-vocabulary KL":  # SDPG's P2 (sdpg.chunked_token_kl): the teacher's forward without a
        # gradient, its last hidden states kept for the micro-batch, and a chunk's two log-softmaxes and KL terms
        seq = prompt_len + 32 + max_new_tokens  # the teacher's prompt holds the answer and a sentence more
        plan["training forward and backward"].update({
            f"the teacher's forward, one layer's work: {micro_batch} rows x {seq} tokens":
                micro_batch * seq * per_layer * act,
            f"its last hidden states: {micro_batch} rows x {max_new_tokens} tokens x {H}":
                micro_batch * max_new_tokens * H * 4,
            f"the KL's full-vocabulary chunk, {chunk} tokens (both distributions, float32)": chunk * V * 4 * 4})
    plan["optimizer step"] = {**states, "AdamW moments (float32)": 8 * trains, "gradients (float32)": 4 * trains}
    return plan


def plan_settings(args, prompt_len: int, scoring: str = None, frozen_copy: bool = False,
                  loss_term: str = None) -> dict:
    """memory_plan's settings from train.py's flags; scoring: how the token rule runs the policy itself
    (methods.Rule.memory_phase: "forward", "backward", "hidden states", "logits" or None); frozen_copy: whether it
    keeps a copy of what trains (methods.Rule.frozen_copy); loss_term: what the method's loss term adds to the
    training pass (methods.LossTerm.memory: "full-vocabulary KL" or None)."""
    return dict(rollouts=args.prompts_per_step * args.group_size,
                gen_rollouts=(args.gen_batch_size or args.prompts_per_step) * args.group_size,
                prompt_len=prompt_len, max_new_tokens=args.max_new_tokens, micro_batch=args.micro_batch_size,
                bf16=args.bf16, grad_checkpointing=args.grad_checkpointing, reference=args.reference,
                ref_on_cpu=args.ref_on_cpu, group_size=args.group_size, lora_rank=args.lora_rank,
                lora_targets=args.lora_targets.split(","),
                oar_chunk=args.oar_chunk if scoring in ("forward", "backward") else 0,
                oar_gradient=scoring == "backward",
                forward_once=scoring if scoring in ("hidden states", "logits") else None, frozen_copy=frozen_copy,
                loss_term=loss_term)


def available_bytes(device: str, asked_gib: float = None) -> int:
    """What to plan against: the GiB asked for, else the GPU's memory when the device is one, else this machine's
    physical memory."""
    if asked_gib:
        return int(asked_gib * GiB)
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.device(device)).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def disk_plan(cfg, args, frozen_copy: bool = False) -> dict:
    """The disk a train.py run takes, from the model's config: {what: bytes} of one checkpoint (the weights, under
    LoRA the adapters alone; AdamW's two moments of what trains; a rule's frozen copy of what trains where it keeps
    one, frozen_copy: RLSD's teacher between syncs; 32 MiB for the tokenizer and the rest), and "run"
    what the run keeps at most: two of them (the last and the one before, or the last and the one being written), one
    if it saves once, and its other files (other_files_bytes)."""
    trained = trained_parameters(cfg, args.lora_rank, args.lora_targets.split(","))
    one = {"weights" if not args.lora_rank else "adapters": 4 * trained, "optimizer state": 8 * trained,
           **({"the rule's frozen copy": 4 * trained} if frozen_copy else {}), "tokenizer and the rest": 32 * 2 ** 20}
    saves = (args.steps // args.save_every if args.save_every else 0) + args.final_save
    return {**one, "run": sum(one.values()) * min(2, saves) + other_files_bytes(args)}


# What a run writes besides its checkpoints, generously (measured on the tiny world, 2026-11-28: 1.2 KB a metrics
# line, 16-20 KB a heat map of one group of 8 x 48 tokens): a metrics line a step and an evaluation, a heat map a
# evaluation, and each tracker the same lines again with a table of every completion at each evaluation.
METRICS_LINE, HEATMAP_TOKEN, TABLE_TOKEN = 4096, 100, 16


def other_files_bytes(args) -> int:
    """The bytes of metrics.jsonl, the heat maps and the trackers' files a run of these settings writes at most."""
    evals = (args.steps // args.eval_every if args.eval_every else 0) + 2 * args.final_eval
    trackers = len([t for t in str(getattr(args, "report_to", "none")).split(",") if t.strip() not in ("", "none")])
    lines = (args.steps + evals) * METRICS_LINE
    tables = evals * args.prompts_per_step * args.group_size * args.max_new_tokens * TABLE_TOKEN
    return lines * (1 + trackers) + evals * args.group_size * args.max_new_tokens * HEATMAP_TOKEN + trackers * tables


def trained_parameters(cfg, lora_rank: int, lora_targets) -> int:
    """What a run trains and saves: every parameter, or the LoRA adapters (r x (in + out) a target projection).
    parameters() counts a Qwen2 or Llama model; another layout (GPT-2, Gemma2, Qwen3's norms of q and k) is counted
    on a model built on the meta device, which allocates nothing."""
    if cfg.model_type in ("qwen2", "llama"):
        n = parameters(cfg, lora_rank, lora_targets)
        return n["adapters"] if lora_rank else n_params(cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    if not lora_rank:
        return sum(p.numel() for p in model.parameters())
    return sum(lora_rank * sum(m.weight.shape) for name, m in model.named_modules()
               if name.rsplit(".", 1)[-1] in lora_targets and getattr(m, "weight", None) is not None)


def dry_run(cfg, args, gpu_bytes: int, prompt_tokens: int, scoring: str = None, frozen_copy: bool = False,
            loss_term: str = None):
    """--dry-run: the plan for these settings, and if it does not fit, what each memory flag would bring it to.
    prompt_tokens: the data's prompt length (data.Dataset.prompt_tokens), cut to what the positions leave;
    scoring, frozen_copy: the rule's (methods.Rule.memory_phase, methods.Rule.frozen_copy); loss_term: the
    method's (methods.LossTerm.memory)."""
    positions = getattr(cfg, "max_position_embeddings", None) or 1 << 30
    if args.max_new_tokens >= positions:
        sys.exit(f"--max-new-tokens {args.max_new_tokens}: the model has {positions} positions in all")
    prompt_len = min(prompt_tokens, positions - args.max_new_tokens)
    settings = plan_settings(args, prompt_len, scoring, frozen_copy, loss_term)
    n = parameters(cfg, args.lora_rank, settings["lora_targets"])
    print(f"memory plan: {n_params(cfg) / 1e9:.3f} B parameters, {cfg.num_hidden_layers} layers, vocabulary "
          f"{cfg.vocab_size}" + (f", LoRA rank {args.lora_rank} ({n['adapters'] / 1e6:.1f} M trained)"
                                 if args.lora_rank else "")
          + f"; prompts taken as {prompt_len} tokens, responses as --max-new-tokens {args.max_new_tokens}")
    peak = print_plan(memory_plan(cfg, **settings), gpu_bytes)
    disk = disk_plan(cfg, args, frozen_copy)
    print(f"disk: a checkpoint takes {sum(v for k, v in disk.items() if k != 'run') / GiB:.2f} GiB ("
          + ", ".join(f"{k} {v / GiB:.2f}" for k, v in disk.items() if k != "run")
          + f"); the run keeps at most {disk['run'] / GiB:.2f} GiB"
          + (" (the last and the one before" if disk["run"] - other_files_bytes(args) > sum(
              v for k, v in disk.items() if k != "run") else " (its checkpoint")
          + f", and {other_files_bytes(args) / 2 ** 20:.1f} MiB of metrics, heat maps and trackers' files)")
    if peak <= gpu_bytes:
        return peak
    print("flags that would bring it down (each alone, then all together):")
    smaller = max(1, min(settings["micro_batch"], settings["rollouts"]) // 4)  # of the rows a micro-batch holds
    options = [("--bf16", {"bf16": True}), ("--grad-checkpointing", {"grad_checkpointing": True}),
               ("--ref-on-cpu", {"ref_on_cpu": True}), ("--lora-rank 32", {"lora_rank": 32}),
               (f"--micro-batch-size {smaller}", {"micro_batch": smaller}),
               (f"--gen-batch-size {max(1, (args.gen_batch_size or args.prompts_per_step) // 4)}",
                {"gen_rollouts": max(1, (args.gen_batch_size or args.prompts_per_step) // 4) * args.group_size})]
    peak_with = lambda change: max(sum(v.values()) for v in memory_plan(cfg, **{**settings, **change}).values())
    if settings["oar_chunk"] > 1:  # OAR scores this many rollouts at once: the largest smaller chunk that fits
        fits = [c for c in range(settings["oar_chunk"] - 1, 0, -1) if peak_with({"oar_chunk": c}) <= gpu_bytes]
        options.append((f"--oar-chunk {fits[0] if fits else 1}", {"oar_chunk": fits[0] if fits else 1}))
    helpful, together = [], {}
    for flag, change in options:
        if all(settings[k] == v for k, v in change.items()) or (flag == "--ref-on-cpu" and not args.reference) \
                or (flag.startswith("--lora") and args.lora_rank):
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
