"""llama.cpp on the model's GGUF file, for reference only: skipped when llama-cpp-python is not installed."""
import importlib.util
import os
import time

from infra import models
from tools.benchparts.table import Table
from tools.benchparts.workload import Workload


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
              f"ours {ours['tps']:,.0f}" if ours else "", f"ours/llama {ours['tps'] / tps:.2f}" if ours else "")
