"""The machine's own limits, measured in the same run as what is held against them: matrix products at the
model's shapes (float32 and bf16, FLOP/s) and memory bandwidth (bytes/s). The sampler's and the training step's
shares of them are computed where those are measured (sampler.py, steps.py)."""
import statistics
import time

from tools.perf.benchparts.table import Table, rate


GiB = 1024 ** 3


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


def matmul_rate(rows: int, inner: int, outer: int, dtype, device: str, weights: int = 1) -> float:
    """FLOP/s of x W^T, x [rows, inner], W [outer, inner], as nn.Linear computes a projection; with weights > 1,
    over that many distinct W in turn."""
    import torch
    x = torch.randn(rows, inner, device=device).to(dtype)
    ws = [torch.randn(outer, inner, device=device).to(dtype) for _ in range(weights)]
    return 2 * rows * inner * outer * weights / seconds_per_call(
        lambda: [torch.nn.functional.linear(x, w) for w in ws], device)


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
    the decode batch and at a training micro-batch's tokens, in float32 and bf16, the decode shape again over as
    many distinct weights as the model has layers, and the memory bandwidth. Returns {"float32"/"bfloat16":
    {"decode"/"train"/"decode, distinct": FLOP/s}, "distinct": that count, "read"/"copy": bytes/s, "shapes":
    {"decode"/"train": (rows, H, I)}, "device": device}: what again() reads to measure a product a second time.

    Why the distinct weights: a product repeated on one weight keeps it in the caches, while a decode step reads
    every weight once, its layers' in turn; on this project's CPU a 0.5B's [64 x 896] x [896 x 4864] bf16 product
    read 0.78x as fast over its 24 layers' worth (docs/LOG.md, 2026-11-27, eleventh session). (On a GPU the two
    rows also differ in synchronizations: one a product, one a round of them.)"""
    import torch
    H, I = cfg.hidden_size, cfg.intermediate_size
    limits = {"shapes": {"decode": (decode_rows, H, I), "train": (train_tokens, H, I)}, "device": device,
              "distinct": cfg.num_hidden_layers}
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).split(".")[1]
        limits[name] = {}
        for shape, (rows, _, _) in limits["shapes"].items():
            limits[name][shape] = matmul_rate(rows, H, I, dtype, device)
            ratio = limits[name][shape] / limits["float32"][shape]
            table.row("machine", f"{name} matmul, {shape} shape [{rows} x {H}] x [{H} x {I}]",
                      rate(limits[name][shape], "FLOP/s"), "float32" if name != "float32" else "",
                      f"{ratio:.2f}x" if name != "float32" else "")
        n = limits["distinct"]
        limits[name]["decode, distinct"] = got = matmul_rate(decode_rows, H, I, dtype, device, weights=n)
        table.row("machine", f"{name} matmul, decode shape, {n} weights in turn", rate(got, "FLOP/s"),
                  "one weight", f"{got / limits[name]['decode']:.2f}x")
    bw = bandwidth(device, gib)
    table.row("machine", f"memory bandwidth, reading {gib:g} GiB (a sum)", rate(bw["read"], "B/s"))
    table.row("machine", f"memory bandwidth, copying {gib:g} GiB (read + write)", rate(bw["copy"], "B/s"))
    return {**limits, **bw}


def again(table: Table, limits: dict, precision: str, shape: str) -> float:
    """The product of machine_rows at `shape` in `precision` measured a second time, as a row against the first
    reading: on this shared host Qwen2.5-0.5B's bf16 train-shape product read 244.8-384.2 GFLOP/s on one day
    (docs/LOG.md, 2026-11-26), so a share of one reading alone can be off by a third. Returns the FLOP/s."""
    import torch
    rows, H, I = limits["shapes"][shape]
    got, before = matmul_rate(rows, H, I, getattr(torch, precision), limits["device"]), limits[precision][shape]
    table.row("machine", f"{precision} matmul, {shape} shape, after the steps", rate(got, "FLOP/s"),
              f"before {rate(before, 'FLOP/s')}", f"{got / before:.2f}x")
    return got
