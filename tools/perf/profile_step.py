"""Where a training pass spends its time: train.py's forward and backward (sample.token_logprobs, grpo.policy_loss)
on one micro-batch of a model, under torch.profiler, the top operators by their own time and the pass's model
FLOP/s. For the speed work of issue 39: what keeps bf16 training below the machine's matmul peak.

    python -m tools.perf.profile_step --model qwen2.5-coder-0.5b --threads 2      # bf16 autocast, this CPU's default
    python -m tools.perf.profile_step --model smollm2-135m --threads 2 -- --no-bf16    # more train.py flags after --
    python -m tools.perf.profile_step --model smollm2-135m --threads 2 --attention eager   # HF's eager attention
    python -m tools.perf.profile_step --model smollm2-135m --threads 2 --numerics          # log-probs by kernel

The micro-batch is what benchparts/workload.py's setting of the model trains on (its prompts, G, the length limit),
the responses random tokens of full length: a pass's cost depends on the shapes, not on the words. One pass warms
up, then --repeat passes are profiled. --numerics profiles nothing: it samples the setting's responses with our
sampler (as train.py does) and prints how far each pass's log-probs of them are from float32 SDPA's (the attention
kernels differ in speed on a CPU; a faster one is worth nothing if it moves the numbers the loss reads).
"""
import time

import torch

import grpo
import sample
from infra import cli, cpu
from tools.perf.benchparts.workload import BENCH_FLAGS, OTHER, SETTINGS, load_workload, training_flops


def batch(w, rows: int, T: int, seed: int = 0) -> dict:
    """rows rollouts of T random response tokens after the workload's prompts (G a prompt), in sample.generate()'s
    layout, as update() receives them."""
    g = torch.Generator().manual_seed(seed)
    G = w.args.group_size
    prompts = [w.prompts[(r // G) % len(w.prompts)] for r in range(rows)]
    ids, mask = sample.left_pad(prompts, w.tok.pad_token_id)  # [rows, P]
    resp = torch.randint(0, w.config.vocab_size, (rows, T), generator=g)  # [rows, T]
    return {"input_ids": torch.cat([ids, resp], 1), "attention_mask": torch.cat([mask, torch.ones_like(resp)], 1),
            "prompt_len": ids.shape[1], "logprobs": torch.full((rows, T), -1.0),
            "advantages": torch.randn(rows, T, generator=g), "mask": torch.ones(rows, T)}


def one_pass(w, b: dict):
    a, P = w.args, b["prompt_len"]
    rows = len(b["input_ids"])
    with sample.autocast(a.device, a.bf16):  # as train.update: one region, the loss and backward with it off
        logp = sample.token_logprobs(w.model, b["input_ids"], b["attention_mask"], P, a.temperature,
                                     groups=torch.arange(rows) // a.group_size)  # [rows, T]
        with sample.autocast(a.device, False):
            loss, _ = grpo.policy_loss(logp, b["logprobs"], b["advantages"], b["mask"], eps_low=a.eps_low,
                                       eps_high=a.eps_high, beta=0.0, agg=a.agg, max_new_tokens=a.max_new_tokens,
                                       n_seqs=rows, n_tokens=b["mask"].sum())
            loss.backward()
    w.model.zero_grad(set_to_none=True)


def numerics(w) -> list:
    """|delta log-prob| of sampled response tokens against the float32 SDPA pass, for each kernel and precision
    and for the sampler's own log-probs: [(what, mean, median, p99, max)]."""
    a, G = w.args, w.args.group_size
    w.model.eval()
    torch.manual_seed(0)
    prompts = w.prompts[:a.prompts_per_step]
    with sample.autocast(a.device, a.bf16):
        b = sample.generate(w.model, prompts, n=G, max_new_tokens=a.max_new_tokens, temperature=a.temperature,
                            eos_id=w.tok.eos_token_id, pad_id=w.tok.pad_token_id)
    ids, attn, P, m = b["input_ids"], b["attention_mask"], b["prompt_len"], b["response_mask"].bool()  # [N, L], [N, T]

    lengths = m.sum(-1)  # [N]

    def logp(kernel: str, bf16: bool) -> torch.Tensor:  # [N, T], one micro-batch at a time as train.update
        w.model.set_attn_implementation(kernel)
        rows, out = torch.arange(len(ids)), torch.zeros(m.shape)
        with torch.no_grad(), sample.autocast(a.device, bf16):
            for s in range(0, len(ids), a.micro_batch_size):
                mb = rows[s:s + a.micro_batch_size]
                t = int(lengths[mb].max())  # cut to the micro-batch's longest response, as train.update does
                out[mb, :t] = sample.token_logprobs(w.model, ids[mb, :P + t], attn[mb, :P + t], P, a.temperature,
                                                    groups=mb // G).float()  # [n, t]
        return out

    kernel = w.model.config._attn_implementation  # the model's own ("sdpa": HF's default, what train.py runs)
    try:
        ref = logp("sdpa", False)
        got = {"float32, eager": logp("eager", False), "bf16 autocast, sdpa (train.py's)": logp("sdpa", True),
               "bf16 autocast, eager": logp("eager", True), "the sampler's own": b["logprobs"].float()}
    finally:
        w.model.set_attn_implementation(kernel)
    out = []
    for what, x in got.items():
        d = (x - ref)[m].abs()  # [response tokens]
        q = torch.quantile(d, torch.tensor([0.5, 0.99]))
        out.append((what, d.mean().item(), q[0].item(), q[1].item(), d.max().item()))
    print(f"{int(m.sum())} sampled response tokens of {len(ids)} rollouts; |delta log-prob| against float32, sdpa:")
    print(f"{'pass':36s} {'mean':>9s} {'median':>9s} {'p99':>9s} {'max':>9s}")
    for what, *v in out:
        print(f"{what:36s} " + " ".join(f"{x:9.2e}" for x in v))
    return out


def main(argv=None):
    p = cli.Parser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--repeat", type=int, default=2, help="passes profiled after one warm-up pass")
    p.add_argument("--top", type=int, default=20, help="operators listed")
    p.add_argument("--attention", default="sdpa", choices=["sdpa", "eager"],
                   help="the model's attention kernel for the profiled pass (default: sdpa, train.py's)")
    p.add_argument("--numerics", action="store_true", help="no profile: the log-probs of sampled responses by kernel "
                                                           "and precision, against float32 sdpa")
    p.add_argument("train_args", nargs="*", help="more train.py flags, after --")
    args = p.parse_args(argv)
    cpu.setup(args.threads)
    setting = SETTINGS.get(args.model, OTHER)
    w = load_workload(args.model, (*BENCH_FLAGS, *setting.flags, *args.train_args))
    a = w.args
    if args.numerics:
        return numerics(w)
    w.model.set_attn_implementation(args.attention)
    w.model.train()
    rows = min(a.micro_batch_size, a.prompts_per_step * a.group_size)
    b = batch(w, rows, a.max_new_tokens)
    one_pass(w, b)  # warm-up: autocast's weight copies, the allocator
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(args.repeat):
            one_pass(w, b)
        seconds = (time.perf_counter() - t0) / args.repeat
    P, T = b["prompt_len"], a.max_new_tokens
    flops = training_flops(w.config, rows * T, -(-rows // a.group_size) * P)  # a group's prompt runs once
    print(f"{args.model}, {'bf16 autocast' if a.bf16 else 'float32'}, {args.attention} attention, "
          f"{torch.get_num_threads()} thread(s): {rows} "
          f"rows x ({P} prompt + {T} response) tokens, a forward and backward in {seconds:.2f} s, "
          f"{flops / seconds / 1e9:.1f} GFLOP/s of model FLOPs (profiler on)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top, max_name_column_width=48))


if __name__ == "__main__":
    main()
