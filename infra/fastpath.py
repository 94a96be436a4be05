"""The written-out forwards: speed only. Each computes what the model's own forward computes, in fewer steps, and
a test proves it (tests/test_fastpath.py, tests/test_oar.py). A reader can skip this file: sample.py says what
the sampler and the scorer do; this is how two of their forwards are made fast, and OAR's.

    decode_step          one token for each row with the KV cache in preallocated buffers (sample.generate,
                         through Decoder); equals model(...) with HF's cache, token for token and log-prob for log-prob
    decode_attention     its attention for one query row, as two matmuls (grouped_attention, which
                         product_attention shares)
    NextToken            sample.next_token over a large vocabulary, its [A, V] buffers kept between steps
    draw                 the next token of each row: by the inverse CDF over a large vocabulary
    prompt_prefill       each distinct prompt of a batch run once (a GRPO group shares one); with cache_for its
                         keys and values are copied to the group's rows (sample.token_logprobs, OAR's scores):
                         equals each row's own forward, log-probs and gradients (in float64 to 1e-10)
    prompt_sharing       OAR's forward (O2, O3) over prompt_prefill's cache: oar.model_forward's numbers; with
                         whole rows as the "prompts", OAR-P's copies run only from their perturbed token on
    logits_after_prompt  the forward after a shared prompt, the last layer run only for the columns read (OAR)
    sparse_embedding_grad  train.update's embedding gradient summed sparse over micro-batches, made dense once
    attention_by_products  train.update's attention on a CPU: product_attention, two matmuls a chunk of queries,
                         recomputed in the backward; equals SDPA's outputs and gradients (in float32 and float64)

Which model goes which way (any other model takes the plain path, the model's own forward, in sample.py / oar.py):

    decodes(model)        decode_step and logits_after_prompt: Qwen2 and Llama layouts (DECODABLE) without sliding
                          windows, the modules these two call by name in that order (rotary embedding, pre-norms)
    shares_prompts(model) prompt_prefill and cache_for: any model whose cache is plain full-attention layers (no
                          sliding window, no recurrent state), since they copy whole key/value tensors between rows
    attention_by_products product_attention: a model on a CPU whose attention is SDPA's and which HF can switch
                          at run time (its attention through AttentionInterface); calls it cannot give SDPA's
                          numbers for (dropout, a soft cap, other masks) are handed to SDPA

This module imports nothing of the project: the callers pass position ids in (sample.position_ids), so the arrows
point one way.
"""
import contextlib

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb


DECODABLE = ("Qwen2ForCausalLM", "LlamaForCausalLM")  # the layouts decode_step() writes out
# Above this vocabulary size draw() samples by the inverse CDF: torch.multinomial draws an exponential number for
# every id of every row (203 ms of a 0.5B's 0.8 s decode step at 64 rows x 151,936 ids). Below it, multinomial, as
# before: the tiny world's runs keep their random streams, and so their numbers, bit for bit.
INVERSE_CDF_VOCAB = 4096
# Above this vocabulary size a fresh float32 [rows, V] tensor costs more than its arithmetic (page faults; NextToken):
# sample.generate picks through NextToken and token_logprobs through TargetLogprobs. Below it the plain paths run,
# the ones a reader edits (the tiny world's among them).
LARGE_VOCAB = 4096


class NextToken:
    """sample.next_token with the same numbers (tests/test_fastpath.py), for a large vocabulary. At 151,936 ids a
    [64, V] float32 tensor is 39 MB, above glibc's default mmap threshold (32 MB): each fresh one is asked of the
    system and touched page by page, which took longer than the arithmetic (docs/LOG.md, 2026-11-26; infra/cpu.py
    puts such tensors on huge pages: fewer faults, not none, and the pages are still zeroed). Here two [A, V]
    buffers serve every step of a decode, and the log-softmax is written as its parts, in place: z = logits / T -
    max, p = exp(z) / s with s = sum exp(z), log p = z - log s, and the entropy -sum p log p = log s - sum p z
    (sum p = 1), which needs no logarithm over the vocabulary."""

    def __init__(self):
        self.z = self.p = None  # [rows, V] float32, the first decode step's rows (the batch only shrinks)

    def __call__(self, logits: torch.Tensor, temperature: float):
        A = len(logits)
        if self.z is None or len(self.z) < A or self.z.shape[1] != logits.shape[1] or self.z.device != logits.device:
            self.z, self.p = (torch.empty(logits.shape, dtype=torch.float32, device=logits.device) for _ in "zp")
        z, p = self.z[:A], self.p[:A]  # [A, V] each
        z.copy_(logits)  # float32, whatever the output layer's dtype
        if temperature > 0:
            z.div_(temperature)
        z.sub_(z.amax(-1, keepdim=True))  # [A, V] every exp(z) <= 1
        s = torch.exp(z, out=p).sum(-1, keepdim=True)  # [A, 1]
        p.div_(s)  # [A, V] softmax(logits / T)
        log_s = s.log().squeeze(1)  # [A]
        nxt = draw(p) if temperature > 0 else logits.argmax(-1)  # [A]
        logp = z.gather(1, nxt[:, None]).squeeze(1) - log_s  # [A]
        # z is spent here; nansum: an id of logit -inf has p = 0 and adds 0, as entr(0) = 0 (not -inf x 0 = nan)
        return nxt, logp, log_s - z.mul_(p).nansum(-1)  # the entropy [A]


class TargetLogprobs(torch.autograd.Function):
    """sample._logprobs_of's numbers and gradient (tests/test_fastpath.py) for a chunk of the output layer's logits
    over a large vocabulary, with fewer fresh [n, V] tensors (each a page-faulted allocation at 151,936 ids, see
    NextToken): the forward makes one float32 z = logits / T and keeps nothing of that size (the plain path: the cast,
    the division, logsumexp's shifted copy and its exp, all kept for the backward), the backward one float32 softmax,
    turned in place into the gradient, and its cast (the plain path: softmax, the gather's zeros, their sum, the
    division's and the cast's). log p(target) = z[target] - lse, lse = m + log sum exp(z - m), m = max z (logsumexp's
    own steps, an infinite m taken as 0 as it does); d log p / dz = onehot(target) - softmax(z)."""

    @staticmethod
    def forward(ctx, logits, targets, temperature: float):
        z = _scaled(logits, temperature)  # [n, V] float32, a fresh copy
        picked = z.gather(1, targets[:, None]).squeeze(1)  # [n]
        m = z.amax(-1, keepdim=True)  # [n, 1]
        m.masked_fill_(m.abs() == float("inf"), 0)  # as logsumexp: a row with a +inf logit gets lse = +inf, not nan
        lse = z.sub_(m).exp_().sum(-1).log_().add_(m.squeeze(1))  # [n]; z is spent
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature = temperature
        return picked - lse  # [n]

    @staticmethod
    @torch.autograd.function.once_differentiable  # a second derivative would need lse's graph: none is kept
    def backward(ctx, g):  # g [n]
        logits, targets, lse = ctx.saved_tensors
        grad = _scaled(logits, ctx.temperature).sub_(lse[:, None]).exp_()  # [n, V] softmax(z)
        grad.mul_(-g[:, None]).scatter_add_(1, targets[:, None], g[:, None])  # [n, V] g (onehot - softmax)
        if ctx.temperature > 0:
            grad.div_(ctx.temperature)
        return grad.to(logits.dtype), None, None


def _scaled(logits, temperature: float):
    """A float32 copy of logits [n, V], divided by the temperature (T = 0: greedy, undivided)."""
    z = logits.to(torch.float32, copy=True)
    return z.div_(temperature) if temperature > 0 else z


def draw(p: torch.Tensor, block: int = 256) -> torch.Tensor:
    """One token of each row of p [A, V] (probabilities, rows summing to 1): [A]. torch.multinomial(p, 1) for a small
    vocabulary; for a large one the inverse CDF, one uniform number a row, in two levels: the block of `block` ids
    it falls in (the blocks' running mass), then the id inside that block. The running sums are float64 (a float32
    running sum over 151,936 ids could move the boundaries by 1e-5 of the mass); a block's own mass, a sum of
    `block` values, is summed in float32 and then widened: within about 1e-7 (relative) of its exact sum, as p's
    float32 values are of theirs; a float64 sum would first cast all of p (18 ms of each next-token pick of a 0.5B
    at 64 rows; docs/LOG.md, 2026-11-27, eleventh session). Where u falls in that 1e-7 between a block's mass and its
    ids' own running sum, the block's last id is taken (or, if it has no mass, the row draws again, below).
    The same distribution as multinomial (tests/test_fastpath.py checks the id each number lands on, and the
    frequencies). No copy of p is made: the last block may be short (V need not be a multiple of `block`)."""
    A, V = p.shape
    if V <= INVERSE_CDF_VOCAB:
        return torch.multinomial(p, 1).squeeze(1)
    whole = V // block * block  # the ids in whole blocks
    mass = p[:, :whole].reshape(A, -1, block).sum(-1, dtype=torch.float32).double()  # [A, nb] each block's mass
    if whole < V:
        mass = torch.cat([mass, p[:, whole:].sum(-1, keepdim=True, dtype=torch.float32).double()], 1)  # the short one
    mass = mass.cumsum(-1)  # [A, nb] the mass up to each block's end
    nb = mass.shape[1]
    u = torch.rand((A, 1), device=p.device, dtype=torch.float64) * mass[:, -1:]  # [A, 1]
    k = torch.searchsorted(mass, u, right=True).clamp(max=nb - 1)  # [A, 1] the block u falls in
    before = torch.where(k > 0, mass.gather(1, (k - 1).clamp(min=0)), torch.zeros_like(u))  # [A, 1]
    cols = k * block + torch.arange(block, device=p.device)  # [A, block] the ids of that block
    inner = torch.where(cols < V, p.gather(1, cols.clamp(max=V - 1)), 0).double().cumsum(-1)  # [A, block]
    ids = (k * block + torch.searchsorted(inner, u - before, right=True).clamp(max=block - 1)).squeeze(1)  # [A]
    ids = ids.clamp(max=V - 1)
    zero = p.gather(1, ids[:, None]).squeeze(1) == 0  # rounding at a boundary (a chance of about 1e-7): draw again
    if zero.any():
        ids[zero] = torch.multinomial(p[zero], 1).squeeze(1)
    return ids


def decodes(model) -> bool:
    """Whether decode_step and logits_after_prompt compute this model's forward: a Qwen2 or Llama layout with full
    attention (they attend to every column; a sliding window would need a mask they do not build)."""
    return type(model).__name__ in DECODABLE and not getattr(model.config, "use_sliding_window", False)


def shares_prompts(model) -> bool:
    """Whether prompt_prefill and cache_for give this model's forward: every layer of the cache the model would
    make is a plain full-attention DynamicLayer, keys and values [N, Hkv, L, D] that a row gather copies whole.
    A sliding-window layer (Gemma2, Mistral) or a recurrent state holds something else."""
    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=model.config).layers)


@contextlib.contextmanager
def sparse_embedding_grad(model, tokens: int):
    """Inside it, the input embeddings' gradient accumulates sparse: the rows of the ids looked up, not a dense
    [V, H] tensor zeroed, filled and added at each backward (Qwen2.5-0.5B's: 151,936 x 896 floats, 544 MB, made
    4 times an update of 4 micro-batches). On leaving, the gradient is made dense once, as clipping and AdamW take
    it: the same gradient, its sums in another order (tests/test_fastpath.py). Tied to the output layer (SmolLM2),
    the output layer's dense gradient takes the rows in place. Only on a CPU, where a fresh 544 MB tensor was
    measured slow (docs/LOG.md, 2026-11-27, thirteenth session), and only where the update looks up at most V
    `tokens` (a sparse gradient holds a row per token: more would outgrow the dense one). Left as it is: an
    embedding that is not trained (LoRA), already sparse, or not a torch Embedding. After an exception the
    gradient is dropped (half summed, and densifying could fail again, as after running out of memory)."""
    emb = model.get_input_embeddings()
    if (not isinstance(emb, torch.nn.Embedding) or emb.sparse or not emb.weight.requires_grad
            or emb.weight.device.type != "cpu" or tokens > emb.num_embeddings):
        yield
        return
    emb.sparse = True
    try:
        yield
    except BaseException:
        emb.weight.grad = None
        raise
    finally:
        emb.sparse = False
    if emb.weight.grad is not None and emb.weight.grad.is_sparse:
        emb.weight.grad = emb.weight.grad.to_dense()


# The name product_attention is registered under in HF's attention interface, with SDPA's masks (boolean, or None
# where the mask is plain causal). Queries are taken in chunks whose float32 scores, [rows, heads, queries, keys],
# take at most ATTENTION_CHUNK bytes (a chunk's masked scores, softmax and weights a few times that).
PRODUCTS = "products"
ATTENTION_CHUNK = 64 * 2**20


@contextlib.contextmanager
def attention_by_products(model):
    """Inside it, a CPU model whose attention is SDPA's runs product_attention instead (left as it is elsewhere). Why:
    torch's CPU flash-attention kernel, SDPA's choice there, spends the most time for the least arithmetic of a small
    model's training pass; its backward took 49.5 ms of a SmolLM2-135M layer's responses where HF's eager took 14.7
    (bf16 autocast, the bench's 64 rows of 111 prompt + 40 response tokens). A whole pass at that setting, taking turns:
    7.02 -> 5.62 s (1.25x, 5 rounds), again 6.75 -> 5.66 s (1.19x, 3 rounds); Qwen2.5-0.5B at its 16 rows: 4.32 ->
    3.94 s (1.10x); the process's peak 7.05 -> 6.46 GiB (docs/LOG.md, 2026-11-27, fourteenth session). Eager attention
    is as fast but keeps each layer's [rows, heads, queries, keys] weights for the backward (0.74 GB a row a layer at
    docs/gpu.md's 3,200 tokens); product_attention keeps its inputs and recomputes the weights."""
    before = model.config._attn_implementation
    switchable = getattr(model, "_can_set_attn_implementation", lambda: False)()  # HF's AttentionInterface layout
    if before != "sdpa" or not switchable or next(model.parameters()).device.type != "cpu":
        yield
        return
    model.set_attn_implementation(PRODUCTS)
    try:
        yield
    finally:
        model.set_attn_implementation(before)


def product_attention(module, query, key, value, attention_mask, scaling: float = None, dropout: float = 0.0,
                      **kwargs):
    """HF's attention interface (sdpa_attention_forward's arguments): query [B, H, Tq, D], key and value
    [B, Hkv, Tk, D], attention_mask [B, 1, Tq, Tk] boolean (True: attends) or None: causal from the first key as
    SDPA's is_causal (query i sees keys 0..i), or every key for one query row or a layer that is not causal.
    Returns (out [B, Tq, H, D], None). The queries in chunks of ATTENTION_CHUNK bytes of scores, each through
    grouped_attention under activation checkpointing where a gradient is taken: the backward recomputes a chunk's
    weights instead of keeping them. SDPA's own path where this one would not give its numbers: off a CPU, attention
    dropout while training, a soft cap or sinks, a mask per head, one of added values (not boolean) or one that
    broadcasts over the queries or keys."""
    m = attention_mask
    plain = (query.device.type == "cpu" and not (dropout and module.training)
             and all(kwargs.get(k) is None for k in ("softcap", "s_aux", "sinks", "position_bias", "cache"))
             and (m is None or (m.dtype == torch.bool and m.dim() == 4 and m.shape[1] == 1
                                and m.shape[2:] == (query.shape[2], key.shape[2]))))  # [B or 1, 1, Tq, Tk]
    if not plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    B, H, Tq, D = query.shape
    Tk = key.shape[2]
    scaling = D ** -0.5 if scaling is None else scaling
    causal = kwargs.get("is_causal")
    causal = getattr(module, "is_causal", True) if causal is None else causal  # as sdpa_attention_forward reads it
    if attention_mask is None and Tq > 1 and causal:
        attention_mask = torch.ones(Tq, Tk, dtype=torch.bool, device=query.device).tril()[None, None]  # [1, 1, Tq, Tk]
    chunk = max(1, ATTENTION_CHUNK // (B * H * Tk * 4))  # queries a chunk
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    out = []
    for s in range(0, Tq, chunk):
        m = None if attention_mask is None else attention_mask[:, :, s:s + chunk]  # [B or 1, 1, c, Tk]
        args = (query[:, :, s:s + chunk], key, value, m, scaling)
        out.append(torch.utils.checkpoint.checkpoint(_masked_attention, *args, use_reentrant=False) if grad
                   else _masked_attention(*args))
    return torch.cat(out, 2).transpose(1, 2).contiguous(), None  # [B, Tq, H, D]


def _masked_attention(q, k, v, mask, scaling: float):
    """grouped_attention under a boolean mask [B or 1, 1, c, Tk] (True: attends) or None: [B, H, c, D]. A row with
    every key masked gets weights 0, as SDPA gives it: its bias is left 0 (an all -inf row would make softmax, and
    its backward, NaN) and grouped_attention zeroes its weights."""
    if mask is None:
        return grouped_attention(q, k, v, None, scaling)
    empty = ~mask.any(-1)  # [B or 1, 1, c]
    if not empty.any():  # the usual case; zeroing no row still cost a pass over the weights, forward and backward
        empty = None
    unseen = ~mask if empty is None else ~mask & ~empty[..., None]  # keys a query does not attend to
    bias = torch.zeros(mask.shape, device=mask.device).masked_fill(unseen, float("-inf"))
    return grouped_attention(q, k, v, bias, scaling, empty=empty)  # bias [B or 1, 1, c, Tk]


AttentionInterface.register(PRODUCTS, product_attention)
AttentionMaskInterface.register(PRODUCTS, sdpa_mask)


class Decoder:
    """sample.generate's decode through decode_step: the prompts' cache (the model's own, after its prefill of
    each prompt once) copied to the n rollouts of each, in buffers with room for the next CHUNK tokens, so that a
    step writes one column instead of copying the cache. Same interface as sample.OwnDecoder: keep(rows) drops rows
    from the batch, decoder(nxt, pos) returns the next logits [A, V].

    The attention reads each buffer whole, its columns not yet written masked: torch's batched product copies an
    operand that is not one contiguous block (or its transpose), and a slice of the buffer up to the current column
    is neither (those copies took 11 ms of the 0.5B's 128 ms step at 64 rows, docs/LOG.md, 2026-11-27, twelfth
    session). So the buffers grow CHUNK columns at a time (a copy every CHUNK steps), not to the longest response at
    once: a step attends to at most CHUNK - 1 columns not yet written."""
    CHUNK = 64

    def __init__(self, model, cache, mask, n: int, max_new_tokens: int):
        N, P = len(mask) * n, mask.shape[1]
        self.keys, self.values = [], []
        self.end = P + max_new_tokens  # room for every response token (the last one is never written)
        width = min(self.end, P + self.CHUNK)
        for layer in cache.layers:
            for kv, out_list in ((layer.keys, self.keys), (layer.values, self.values)):
                # zeros, not new_empty: a masked column's score q . k + (-inf) is nan if k is nan, and its weight 0
                # times a nan value is nan
                buf = kv.new_zeros((N, kv.shape[1], width, kv.shape[3]))  # [N, Hkv, width, D]
                buf[:, :, :P] = kv.repeat_interleave(n, 0)
                out_list.append(buf)
        self.bias = torch.full((N, self.end), float("-inf"), device=mask.device)  # [N, P + T] added to the scores
        self.bias[:, :P].masked_fill_(mask.repeat_interleave(n, 0) == 1, 0)  # the prompts' tokens; pads stay -inf
        self.model, self.col = model, P  # col: the column the next token's keys and values go to

    def keep(self, rows: torch.Tensor):
        self.keys, self.values = [k[rows] for k in self.keys], [v[rows] for v in self.values]
        self.bias = self.bias[rows]

    def _grow(self):
        """CHUNK more columns (zeros) in every buffer, or as many as the longest response still needs."""
        width = min(self.end, self.col + self.CHUNK)
        for bufs in (self.keys, self.values):
            for i, kv in enumerate(bufs):  # kv [A, Hkv, col, D]
                bufs[i] = torch.cat([kv, kv.new_zeros((*kv.shape[:2], width - kv.shape[2], kv.shape[3]))], 2)

    def __call__(self, nxt: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        if self.col == self.keys[0].shape[2]:
            self._grow()
        self.bias[:, self.col] = 0  # each row attends to its new token
        width = self.keys[0].shape[2]
        logits = decode_step(self.model, nxt, pos, self.keys, self.values, self.col, self.bias[:, :width])
        self.col += 1
        return logits  # [A, V]


def decode_step(model, tokens, pos, keys, values, col: int, bias):
    """One new token for each row through a Qwen2 / Llama decoder, the KV cache held in preallocated buffers.

    tokens [A], pos [A, 1] their positions, keys and values: per layer [A, Hkv, C, D] with columns < col filled
    and the rest finite (Decoder: zeros), bias [A, C] (0 where a row attends, -inf where it does not, and at every
    column after col). Writes this token's keys and values at column col, attends over all C columns (the buffer
    whole: see Decoder) and returns the next-token logits [A, V].
    It is model(...) written out with the model's own modules. HF's forward also builds a mask, grows its cache by
    torch.cat (a copy of the whole cache per step) and passes through its wrappers at every step, which on the
    tiny default costs more than the arithmetic (docs/LOG.md). The training forward stays HF's, and
    tests check that the two agree token for token and log-prob for log-prob (tests/test_fastpath.py).
    """
    decoder = model.get_decoder()
    x = decoder.embed_tokens(tokens[:, None])  # [A, 1, H]
    cos, sin = decoder.rotary_emb(x, pos)  # [A, 1, D] each
    for layer, k_cache, v_cache in zip(decoder.layers, keys, values):
        attn = layer.self_attn
        h = layer.input_layernorm(x)  # [A, 1, H]
        q, k, v = (proj(h).view(len(x), -1, 1, attn.head_dim) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
        q, k = apply_rotary_pos_emb(q, k, cos, sin)  # [A, heads, 1, D], [A, Hkv, 1, D]
        k_cache[:, :, col], v_cache[:, :, col] = k[:, :, 0], v[:, :, 0]
        x = x + attn.o_proj(decode_attention(q, k_cache, v_cache, bias, attn.scaling))  # [A, 1, H]
        x = x + layer.mlp(layer.post_attention_layernorm(x))  # [A, 1, H]
    return model.get_output_embeddings()(decoder.norm(x))[:, -1]  # [A, V] bf16 under autocast: the caller casts


def grouped_attention(q, k, v, bias, scaling: float, empty=None):
    """softmax(q k^T * scaling + bias) v, the attention of decode_attention and product_attention: q [B, H, c, D],
    k and v [B, Hkv, L, D], bias [B or 1, 1, c, L] (0 where a query attends, -inf where it does not) or None,
    empty [B or 1, 1, c] (True: a query whose weights are set to 0; its bias must be finite) or None. Returns
    [B, H, c, D]. Query heads h*H/Hkv .. (h+1)*H/Hkv - 1 share key/value head h (grouped-query attention): they are
    stacked along the query axis, so each product is one batched matmul over [B, Hkv] without copying the keys. The
    scores' product is in the inputs' precision (bf16 under autocast), the softmax in float32 (float64 for float64
    inputs)."""
    B, H, c, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    G = H // Hkv
    scores = torch.matmul(q.reshape(B, Hkv, G * c, D), k.transpose(-1, -2))  # [B, Hkv, G*c, L]
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32)).view(B, Hkv, G, c, L) * scaling
    weights = torch.softmax(scores if bias is None else scores + bias[:, :, None], -1)  # [B, Hkv, G, c, L]
    if empty is not None:  # only those rows: a NaN of the inputs passes on, as in SDPA
        weights = weights.masked_fill(empty[:, :, None, :, None], 0.0)
    return torch.matmul(weights.to(v.dtype).view(B, Hkv, G * c, L), v).view(B, H, c, D)  # [B, H, c, D]


def decode_attention(q, k, v, bias, scaling: float):
    """Attention of one query per row: q [A, H, 1, D], k and v [A, Hkv, L, D], bias [A, L] (0 where a row attends,
    -inf where it does not). Returns [A, 1, H*D]. grouped_attention's two matmuls (torch's SDPA kernel takes about
    twice as long on a CPU for a single query row)."""
    A, H, _, D = q.shape
    return grouped_attention(q, k, v, bias[:, None, None, :], scaling).view(A, 1, H * D)  # [A, 1, H*D]


def micro_batches(lengths: torch.Tensor, rows: torch.Tensor, groups: torch.Tensor, prompt_len: int,
                  size: int) -> list:
    """rows [n] (indices into lengths [N], the response lengths, and groups [N], which prompt each rollout has) in
    micro-batches of at most `size`, in whichever of two orders computes fewer columns: a micro-batch runs each of
    its distinct prompts once (token_logprobs shares them) and each row up to its longest response. Rows by length
    waste the least padding; whole groups, ordered by their longest response, run each prompt once where groups fit
    in a micro-batch. In a batch of the bench's 8 x 8 shape (prompts of 130 tokens, random response lengths 30-40,
    micro-batches of 16) rows by length put 5-8 groups in each micro-batch: 1.6x the columns of whole groups (5,894
    against 3,584, docs/LOG.md 2026-11-26). The first order wins a tie."""
    by_length = rows[lengths[rows].argsort(stable=True)]  # [n]
    longest = torch.zeros(int(groups.max()) + 1, dtype=lengths.dtype, device=lengths.device).scatter_reduce(
        0, groups[rows], lengths[rows], "amax")  # [groups] each group's longest response among the rows
    together = by_length[groups[by_length].argsort(stable=True)]  # [n] each group's rows together, by length
    by_group = together[longest[groups[together]].argsort(stable=True)]  # [n] the groups, shortest longest first

    def split(order):
        return [order[s:s + size] for s in range(0, len(order), size)]

    def columns(mbs):
        return sum(len(torch.unique(groups[mb])) * prompt_len + len(mb) * int(lengths[mb].max()) for mb in mbs)
    return min(split(by_length), split(by_group), key=columns)


def prompt_prefill(decoder, input_ids, attention_mask, positions, prompt_len: int, groups: torch.Tensor,
                   embeds: torch.Tensor = None):
    """The forward of each distinct prompt, once. Rows with the same value in groups [N] share their first
    prompt_len columns (a GRPO group); positions [N, P + T] as sample.position_ids gives them. Returns kv, a
    (keys, values) pair [U, Hkv, P, D] per layer for the U distinct prompts, their hidden states [U, P, H] and
    row_group [N], which of them each row has. A prompt token's activations never depend on the tokens after it
    (causal attention), so every row gets exactly what its own forward would give. decoder: the model without its
    output layer (model.get_decoder()). embeds [N, >= P, H] (optional): the rows' input embeddings, used instead
    of looking the prompts' ids up again."""
    P = prompt_len
    uniq, row_group = torch.unique(groups, return_inverse=True)  # [U], [N] which prompt each row has
    first = torch.zeros(len(uniq), dtype=torch.long, device=groups.device).scatter_(
        0, row_group, torch.arange(len(groups), device=groups.device))  # [U] a row of each group (any one)
    if not torch.equal(input_ids[first][row_group, :P], input_ids[:, :P]):
        raise ValueError("prompt_prefill: rows of the same group have different prompts")
    cache = DynamicCache()
    ids, first_embeds = (input_ids[first, :P], None) if embeds is None else (None, embeds[first, :P])  # [U, P(, H)]
    hidden = decoder(input_ids=ids, inputs_embeds=first_embeds, attention_mask=attention_mask[first, :P],
                     position_ids=positions[first, :P], past_key_values=cache,
                     use_cache=True).last_hidden_state  # [U, P, H]
    return [(layer.keys, layer.values) for layer in cache.layers], hidden, row_group


def cache_for(kv, rows: torch.Tensor) -> DynamicCache:
    """A cache holding, for each of the rows [n], the prompt kv[rows] (a gather: gradients flow back through
    it), for a forward over the columns after the prompt. Each forward appends to its cache: make one per use.
    On a CPU the gather is index_select: its backward sums a prompt's rows by index_add, in float32 for bf16 (rounded
    once), where indexing's backward (index_put with accumulate) adds them one by one in bf16. That backward took
    239 ms of a SmolLM2-135M training pass at the bench's 64 rows; on its shape alone the gather with its backward
    took 0.13 ms against 1.79 (docs/LOG.md, 2026-11-27, fifteenth session). Elsewhere kv[rows]: a GPU's index_add
    adds by atomics, in an order that changes from run to run."""
    def gather(t):  # t [U, Hkv, P, D] -> [n, Hkv, P, D]
        return t.index_select(0, rows) if t.device.type == "cpu" and rows.device.type == "cpu" else t[rows]
    return DynamicCache(ddp_cache_data=[(gather(k), gather(v)) for k, v in kv])


def prompt_sharing(model, ids, attention_mask, positions, prompt_len: int, groups: torch.Tensor):
    """OAR's forward (oar.model_forward's interface) with each distinct prompt run once: forward(rows, keep,
    ids=None, embeds=None, start=prompt_len) -> the logits of the last `keep` columns [n, keep, V] of rows [n], from
    their ids [n, L] or input embeddings [n, L, H] over all columns, as the model's own forward over every column
    gives them, provided their first `start` columns are their group's. Only the columns from `start` on run, at
    each call: the prompts' keys and values were computed once, here, without gradients (prompt_prefill), so a
    gradient reaches the embeddings from `start` on only (the prompt's end by default: OAR perturbs or adds noise
    to the response's alone). groups [N]: which rows share a prompt, which fills the first prompt_len columns of ids
    [N, L]; attention_mask, positions [N, L] (sample.position_ids). None where the model's cache cannot be shared
    (shares_prompts): the model's own forward then runs."""
    if not shares_prompts(model):
        return None
    with torch.no_grad():
        kv, _, prompt_of = prompt_prefill(model.get_decoder(), ids, attention_mask, positions, prompt_len, groups)

    def forward(rows, keep: int, ids=None, embeds=None, start: int = prompt_len):
        P = start  # the columns taken from the cache: the prompt's, or fewer (OAR-P's copies of whole rows)
        if not 0 < P <= prompt_len:
            raise ValueError(f"prompt_sharing: start {P} outside 1..{prompt_len}, the columns cached")
        part = [(k[:, :, :P], v[:, :, :P]) for k, v in kv]  # views: [U, Hkv, P, D] each
        if decodes(model):  # the written-out layers: the last one only for the `keep` columns
            embeds = model.get_input_embeddings()(ids[:, P:]) if embeds is None else embeds[:, P:]
            return logits_after_prompt(model, embeds, attention_mask[rows], positions[rows], part, prompt_of[rows],
                                       keep)
        out = model(input_ids=None if ids is None else ids[:, P:], inputs_embeds=None if embeds is None else
                    embeds[:, P:], attention_mask=attention_mask[rows], position_ids=positions[rows, P:],
                    past_key_values=cache_for(part, prompt_of[rows]), use_cache=True, logits_to_keep=keep)
        return out.logits  # [n, keep, V]
    return forward


def logits_after_prompt(model, embeds, attention_mask, positions, kv, rows: torch.Tensor, keep: int):
    """Logits [n, keep, V] of the last `keep` columns of prompt + embeds, the prompts' keys and values taken
    from prompt_prefill: kv, and rows [n] (which prompt each row has). embeds [n, S, H] are the input embeddings
    of the S columns after the prompt; attention_mask [n, P + S] covers all columns, and pads may sit anywhere;
    positions [n, P + S] as sample.position_ids gives them.

    It is the model's forward written out with its own modules, as decode_step is, for a saving HF's forward
    cannot make: in the last layer only the `keep` columns need a query, an attention output and an MLP; the
    other columns give that layer only their keys and values. OAR reads the logits of 1-3 columns out of about 22
    on the tiny world, so this is about a fifth of each pass by a count of matrix products (and HF's mask and cache
    handling go too; docs/LOG.md has the A/B against HF's forward).
    tests/test_oar.py checks OAR's scores through it against HF's forward; tests/test_fastpath.py its error for
    other layouts. Qwen2 and Llama layouts only (decodes), as decode_step; oar.py runs other models through their
    own forward.
    """
    if not decodes(model):
        raise ValueError(f"logits_after_prompt runs {' and '.join(DECODABLE)} models; this is a {type(model).__name__}")
    decoder = model.get_decoder()
    n, S, _ = embeds.shape
    P = attention_mask.shape[1] - S
    cos, sin = decoder.rotary_emb(embeds, positions[:, P:])  # [n, S, D] each
    # column P + i sees the columns up to itself that are not padding: [n, 1, S, P + S]
    visible = (torch.ones(S, P + S, dtype=torch.bool, device=embeds.device).tril(P)[None, None]
               & attention_mask[:, None, None, :].bool())
    x = embeds  # [n, S, H]
    for i, layer in enumerate(decoder.layers):
        attn = layer.self_attn
        h = layer.input_layernorm(x)  # [n, S, H]
        q, k, v = (proj(h).view(n, S, -1, attn.head_dim).transpose(1, 2) for proj in (attn.q_proj, attn.k_proj,
                                                                                      attn.v_proj))
        q, k = apply_rotary_pos_emb(q, k, cos, sin)  # [n, heads, S, D], [n, Hkv, S, D]
        k, v = torch.cat([kv[i][0][rows], k], 2), torch.cat([kv[i][1][rows], v], 2)  # [n, Hkv, P + S, D] each
        if i == len(decoder.layers) - 1:  # the last layer needs every column's keys and values, the rest for `keep`
            q, x, visible = q[:, :, -keep:], x[:, -keep:], visible[:, :, -keep:]
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=attn.scaling,
                                                               enable_gqa=True)  # [n, heads, S or keep, D]
        x = x + attn.o_proj(out.transpose(1, 2).reshape(n, x.shape[1], -1))  # [n, S or keep, H]
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.get_output_embeddings()(decoder.norm(x))  # [n, keep, V]
