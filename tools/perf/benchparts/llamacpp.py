"""llama.cpp on the model's GGUF file, the decode reference a CPU user would pick: one sequence at a time, and the
RL batch (every prompt's G continuations decoded together, llama.cpp's batched decoding), against our sampler on
the same prompts, lengths and temperature. Skipped when llama-cpp-python is not installed
(requirements/bench.txt: it builds from source, about 15 minutes on 2 cores)."""
import importlib.util
import os
import time

from infra import models
from tools.perf.benchparts.table import Table, progress
from tools.perf.benchparts.workload import Workload


def decode(llm, prompts: list, n: int, max_new_tokens: int, temperature: float, seed: int, threads: int) -> tuple:
    """n continuations of each prompt (token-id lists, the GGUF's own vocabulary: our tokenizer is read from the same
    file) decoded together through llama.cpp's low-level API, as examples/batched does: each prompt's tokens are
    evaluated once for its n sequences (one KV cache for all, kv_unified), then every unfinished sequence adds one
    token a llama_decode call. Each sequence draws from softmax(logits / temperature) with its own seed (greedy at 0),
    no top-k, top-p or penalty, as our sampler draws. Returns (the sequences, prompt-major, each up to and including
    its end-of-generation token: the useful tokens; seconds from the first prompt's evaluation to the last token)."""
    import llama_cpp as L
    N, longest = len(prompts) * n, max(len(p) for p in prompts)
    cp = L.llama_context_default_params()
    cp.n_ctx = sum(len(p) for p in prompts) + N * max_new_tokens + 16
    cp.n_batch = cp.n_ubatch = max(N, longest)
    cp.n_seq_max, cp.kv_unified = N, True
    cp.n_threads = cp.n_threads_batch = threads
    ctx = L.llama_init_from_model(llm._model.model, cp)
    vocab = L.llama_model_get_vocab(llm._model.model)
    batch = L.llama_batch_init(cp.n_batch, 0, n)
    samplers = []
    for s in range(N):
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        if temperature > 0:
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_temp(temperature))
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_dist(seed + s))
        else:
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
        samplers.append(chain)

    def run(rows: list):  # rows: (token, position, sequence ids, wants logits)
        for j, (tok, pos, seqs, logits) in enumerate(rows):
            batch.token[j], batch.pos[j], batch.n_seq_id[j], batch.logits[j] = tok, pos, len(seqs), logits
            for k, s in enumerate(seqs):
                batch.seq_id[j][k] = s
        batch.n_tokens = len(rows)
        if L.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed (the KV cache is too small?)")

    try:
        nxt, pos, out = [0] * N, [0] * N, [[] for _ in range(N)]
        t0 = time.perf_counter()
        for k, p in enumerate(prompts):
            seqs = list(range(k * n, (k + 1) * n))
            run([(tok, t, seqs, t == len(p) - 1) for t, tok in enumerate(p)])
            for s in seqs:  # a prompt's logits are gone after the next llama_decode: its first tokens now
                nxt[s], pos[s] = L.llama_sampler_sample(samplers[s], ctx, len(p) - 1), len(p)
                out[s].append(nxt[s])
        active = [s for s in range(N) if not L.llama_vocab_is_eog(vocab, nxt[s]) and len(out[s]) < max_new_tokens]
        while active:
            run([(nxt[s], pos[s], [s], True) for s in active])
            for j, s in enumerate(active):
                nxt[s], pos[s] = L.llama_sampler_sample(samplers[s], ctx, j), pos[s] + 1
                out[s].append(nxt[s])
            active = [s for s in active if not L.llama_vocab_is_eog(vocab, nxt[s]) and len(out[s]) < max_new_tokens]
        return out, time.perf_counter() - t0
    finally:
        for chain in samplers:
            L.llama_sampler_free(chain)
        L.llama_batch_free(batch)
        L.llama_free(ctx)


def llama_rows(table: Table, w: Workload, threads, ours: dict):
    """llama.cpp's rows: one sequence at a time (each of the first step's prompts once), and the RL batch (B prompts
    x G), at the workload's length limit and temperature, against our sampler's rates (ours: sampler_rows' medians,
    one_tps its rate one sequence at a time)."""
    if importlib.util.find_spec("llama_cpp") is None:
        table.row("llama.cpp", "skipped: llama_cpp is not installed (pip install -r requirements/bench.txt builds it "
                               "from source, about 15 minutes)")
        return
    where = models.gguf_location(w.args.model)
    if where is None:
        table.row("llama.cpp", f"skipped: --model {w.args.model} has no GGUF file")
        return
    import llama_cpp
    a, threads = w.args, threads or os.cpu_count()
    path = os.path.join(*where)  # (directory, file)
    llm = llama_cpp.Llama(model_path=path, n_threads=threads, seed=a.seed, n_ctx=512, verbose=False)
    try:
        llama_timed(table, w, llm, path, threads, ours)
    finally:
        llm.close()  # now: its own __del__ at the interpreter's exit finds the library half unloaded


def llama_timed(table: Table, w: Workload, llm, path: str, threads: int, ours: dict):
    a = w.args
    quant = os.path.basename(path).rsplit("-", 1)[-1].removesuffix(".gguf")
    progress(f"llama.cpp: {len(w.prompts)} prompts one at a time, then x {a.group_size} together")
    tokens, seconds = 0, 0.0
    for k, p in enumerate(w.prompts):
        seqs, took = decode(llm, [p], 1, a.max_new_tokens, a.temperature, a.seed + k, threads)
        tokens, seconds = tokens + sum(map(len, seqs)), seconds + took
    one = ours.get("one_tps") if ours else None
    table.row("llama.cpp", f"sampled, one sequence at a time, {quant} GGUF: useful tokens/s",
              f"{tokens / seconds:,.0f}", f"ours {one:,.0f}" if one else "",
              f"ours/llama {one / (tokens / seconds):.2f}" if one else "")
    seqs, seconds = decode(llm, w.prompts, a.group_size, a.max_new_tokens, a.temperature, a.seed, threads)
    tps = sum(map(len, seqs)) / seconds
    table.row("llama.cpp", f"sampled, {len(w.prompts)} prompts x {a.group_size} together, {quant} GGUF: useful "
                           f"tokens/s", f"{tps:,.0f}", f"ours {ours['tps']:,.0f}" if ours else "",
              f"ours/llama {ours['tps'] / tps:.2f}" if ours else "")
