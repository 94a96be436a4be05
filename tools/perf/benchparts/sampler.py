"""Our sampler (sample.generate, as train.py calls it) against model.generate on the same prompts, lengths and
batch, the two taking turns; the share of the machine's limits our decoding reaches; and, for --gpu, our decode
step's attention written out as two matmuls (infra/fastpath.py) against torch's SDPA kernel."""
import contextlib
import time

from tools.perf.benchparts.machine import sync
from tools.perf.benchparts.table import Table, median, progress, rate
from tools.perf.benchparts.workload import Workload, load_workload, matmul_parameters


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


def our_sampler(w: Workload, n: int, T: int, temperature: float, prompts: list = None):
    """sample.generate on the same prompts (or these), as train.py calls it: a function returning (useful tokens,
    decode steps)."""
    import sample

    def run():
        with sample.autocast(w.args.device, w.args.bf16):
            b = sample.generate(w.model, prompts or w.prompts, n=n, max_new_tokens=T, temperature=temperature,
                                eos_id=w.tok.eos_token_id, pad_id=w.tok.pad_token_id)
        return int(b["response_mask"].sum()), b["response_mask"].shape[1]
    return run


def one_at_a_time(w: Workload, T: int, temperature: float):
    """our_sampler on each of the workload's prompts alone (n = 1), what llama.cpp's one-sequence row decodes: a
    function returning (useful tokens, decode steps)."""
    runs = [our_sampler(w, 1, T, temperature, [p]) for p in w.prompts]

    def run():
        got = [r() for r in runs]
        return sum(t for t, _ in got), sum(s for _, s in got)
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
            seconds = time.perf_counter() - t0
            if r >= warmup:
                got[name].append((tokens / seconds, seconds, tokens, steps))
    return {name: {k: median([x[i] for x in runs]) for i, k in enumerate(("tps", "seconds", "tokens", "steps"))}
            for name, runs in got.items()}


def sampler_rows(table: Table, w: Workload, repeat: int, limits: dict) -> dict:
    """Our sampler against model.generate, greedy and sampled, on train.py's first prompts x G rollouts; ours on
    each prompt alone (llama.cpp's batch 1); then the share of the machine's limits that our sampled decoding
    reaches. Returns the sampled medians, and one_tps: the rate one sequence at a time."""
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
    progress(f"sampler: the {len(w.prompts)} prompts one at a time")
    # warm from the rows above: one timed pass (each prompt a run of its own)
    one = in_turns({"ours": one_at_a_time(w, a.max_new_tokens, a.temperature)}, 1, a.device, warmup=0)["ours"]
    table.row("sampler", f"sampled at {a.temperature:g}, one sequence at a time: useful tokens/s, ours",
              f"{one['tps']:,.0f}")
    decoding_shares(table, w, sampled, limits)
    return {**sampled, "one_tps": one["tps"]}


def decoding_shares(table: Table, w: Workload, ours: dict, limits: dict):
    """Our sampled decoding against the machine: model FLOP/s (2 x the multiplying weights x the useful and prompt
    tokens) over the decode-shape matmul (one weight repeated, and one weight a layer in turn, as a decode step reads
    them), and the bytes of weights read a second (all of them once a decode step, 2 bytes each under --bf16's
    autocast copies, else 4) over the read bandwidth."""
    if not limits:
        return
    n = matmul_parameters(w.config)
    precision = "bfloat16" if w.args.bf16 else "float32"
    prompt = sum(len(p) for p in w.prompts)  # each prompt runs once, without the output layer but for its last token
    flops = 2 * (n["layers"] * (ours["tokens"] + prompt) + n["output layer"] * ours["tokens"]) / ours["seconds"]
    for shape, what in (("decode", "decode matmul"), ("decode, distinct", f"matmul, {limits['distinct']} weights")):
        peak = limits[precision][shape]
        table.row("sampler", f"decoding: model FLOP/s over the {precision} {what}", rate(flops, "FLOP/s"),
                  rate(peak, "FLOP/s"), f"{100 * flops / peak:.0f} %")
    weights = ours["steps"] * sum(n.values()) * (2 if w.args.bf16 else 4) / ours["seconds"]
    table.row("sampler", "decoding: weights read a second over the read bandwidth", rate(weights, "B/s"),
              rate(limits["read"], "B/s"), f"{100 * weights / limits['read']:.0f} %")


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


def gpu_sampler_rows(table: Table, model_dir: str, flags, repeat: int):
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
                    "two-matmul": with_attention(two_matmul, ours),
                    "SDPA": with_attention(sdpa_decode_attention, ours)}, repeat, a.device)
    hf = got["generate"]
    for name in ("two-matmul", "SDPA"):
        table.row("sampler", f"{name} attention: our useful tokens/s, {len(w.prompts)} x {a.group_size} rows",
                  f"{got[name]['tps']:,.0f}", f"generate {hf['tps']:,.0f}", f"{got[name]['tps'] / hf['tps']:.2f}x")
