"""The sampler and the scorer: train.py and evaluate.py both sample with generate(), and the loss scores the
sampled tokens with token_logprobs(); the two must agree, token for token.

generate(model, prompts, n=G, ...): G rollouts of each prompt, sampled at a temperature, with a KV cache. Any
  Hugging Face causal LM: each prompt goes once through the model's own forward, which makes the model's own
  cache, and each new token through it again (OwnDecoder). The cache class, sliding windows, position embeddings
  and the final logit transform (Gemma2's soft-capping) are then the model's business.
  * Prompts are left-padded, so every row's next token sits in the last column. Position ids come from the
    attention mask (position_ids: cumsum - 1), never from the column index, so a padded prompt sees the
    positions it would see alone. token_logprobs() derives them the same way: otherwise the training forward
    scores the sampled tokens at other positions than they were sampled at, and pi_old and pi_theta disagree.
  * The log-prob of every sampled token is kept: these are log pi_old for the ratio of grpo.py G2. So is the
    entropy of the distribution it was drawn from (a metric), so that no training forward has to compute it.
  * Rows that have emitted EOS leave the decode batch (once they are a quarter of it), so the batch shrinks
    while the longest rows finish instead of decoding padding to the end.
token_logprobs(model, ids, mask, P): log pi(o_t | q, o_<t) of every response token, by one forward.

How it is made fast lives apart, in infra/fastpath.py (a reader can skip it): for Qwen2 and Llama layouts
(fastpath.decodes, the tiny model among them) each new token goes through fastpath.decode_step (the model's modules
called in turn, writing one column of a preallocated cache) instead of OwnDecoder; over a large vocabulary
next_token's numbers come from fastpath.NextToken (buffers reused, no fresh [A, V] tensor a step); in
token_logprobs a group's prompt runs once (fastpath.prompt_prefill) where the model's cache is plain full attention
(fastpath.shares_prompts).
tests/test_fastpath.py proves each equal to the model's plain forward, tests/test_archs.py the plain path on other
architectures equal to model.generate and to the model's forward.

Layout of what it returns (N = number of prompts * n, P = longest prompt, T = longest response):

    input_ids       [N, P + T]  pad .. pad prompt | response EOS pad .. pad
    attention_mask  [N, P + T]  0   .. 0   1...1  | 1 ...    1   0   .. 0
    response_mask   [N, T]      1 on generated tokens up to and including the first EOS (EQUATIONS.md#notation: m)
    logprobs        [N, T]      log pi_old of each sampled token (0 where response_mask is 0)
    entropy         [N, T]      entropy of the distribution each token was drawn from (0 where the mask is 0)
    truncated       [N]         True where no EOS came within max_new_tokens

The response mask is built from where EOS was sampled, not from `ids != pad`: with pad == eos (Qwen2.5 base,
the tiny world) the latter would drop the real EOS from the loss, and the model would never learn to stop.
"""
from contextlib import contextmanager

import torch

from infra import fastpath, memory


def autocast(device: str, bf16: bool):
    """What --bf16 means where weights train (train.py's sampling, scoring and training forwards): bf16 autocast on
    the device's type, matrix products in bf16 and the weights as they are; a no-op context when bf16 is False."""
    return torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=bf16)


class _Float32Linear(torch.autograd.Function):
    """x W^T + b with W held in bf16, computed in float32: W is upcast for the product (exact: every bf16 value is a
    float32 value), and only the bf16 W is kept for the backward, so no float32 copy of the weights outlives a
    layer. The weight takes no gradient (it is frozen: LoRA's base)."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(weight)
        return torch.nn.functional.linear(x, weight.float(), None if bias is None else bias.float())

    @staticmethod
    def backward(ctx, grad):
        (weight,) = ctx.saved_tensors
        return grad @ weight.float(), None, None


@contextmanager
def float32(model):
    """Everything in float32, whatever --bf16 says: autocast off, and each linear layer whose weight is held in bf16
    (LoRA's frozen base under --bf16) computing in float32 from it. For what bf16's rounding would drown: OAR's
    scores are small differences of the answer distribution (methods.outcome_grounded)."""
    held = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.weight.dtype == torch.bfloat16]
    for m in held:
        m.forward = lambda x, m=m: _Float32Linear.apply(x.float(), m.weight, m.bias)
    try:
        with torch.autocast(next(model.parameters()).device.type, enabled=False):
            yield
    finally:
        for m in held:
            del m.forward


def left_pad(prompts: list, pad_id: int):
    """Token-id lists -> (ids [B, P], attention_mask [B, P]), padded on the left."""
    P = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), P), pad_id, dtype=torch.long)  # [B, P]
    mask = torch.zeros((len(prompts), P), dtype=torch.long)  # [B, P]
    for i, p in enumerate(prompts):
        ids[i, P - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, P - len(p):] = 1
    return ids, mask


def with_prompts(prompts: list, responses: torch.Tensor, response_attn: torch.Tensor, pad_id: int):
    """The same responses [n, t] (and their attention mask) read after other prompts (token-id lists, one a row):
    -> (ids [n, P' + t], attention_mask [n, P' + t], P'), the prompts left-padded to their longest, P'. A teacher
    that is the model shown privileged context (RLSD's L1, SDPG's P2) reads its rollouts this way."""
    pre, pre_attn = left_pad(prompts, pad_id)  # [n, P'], [n, P']
    dev = responses.device
    return (torch.cat([pre.to(dev), responses], 1), torch.cat([pre_attn.to(dev), response_attn], 1),  # [n, P' + t]
            pre.shape[1])


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only: [0,0,1,1,1] mask -> [0,0,0,1,2]."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [N, L]


# Finished rows leave the decode batch once they are this share of it: removing rows copies every layer's cache,
# so it is done in few large steps rather than one row at a time (docs/LOG.md has the shares tried).
DROP_SHARE = 0.25

# Config fields of transformers' causal LMs that transform the output layer's result (soft-capping, a scale, a
# vocabulary cut): where one is set, logits != output_embeddings(hidden) and token_logprobs takes the model's logits.
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier",
                    "lm_head_multiplier", "unpadded_vocab_size")


class OwnDecoder:
    """The plain decode, for any causal LM: each new token through the model's own forward, which appends its keys
    and values (or whatever state the model keeps) to the model's own cache. cache: the cache of the prefill of
    each prompt once, mask [B, P] its attention mask; both are repeated for the n rollouts of each prompt.
    keep(rows) drops rows from the batch, decoder(nxt, pos) returns the next logits [A, V]. (max_new_tokens: for
    fastpath.Decoder's buffers; this cache grows by itself.)"""

    def __init__(self, model, cache, mask, n: int, max_new_tokens: int):
        cache.batch_repeat_interleave(n)  # rows of a prompt's rollouts consecutive, as the logits
        self.model, self.cache, self.mask = model, cache, mask.repeat_interleave(n, 0)  # mask [N, P]

    def keep(self, rows: torch.Tensor):
        self.cache.batch_select_indices(rows)
        self.mask = self.mask[rows]

    def __call__(self, nxt: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(nxt), 1))], 1)  # [A, P + t + 1] this token too
        out = self.model(input_ids=nxt[:, None], attention_mask=self.mask, position_ids=pos,
                         past_key_values=self.cache, use_cache=True)
        return out.logits[:, -1]  # [A, V] (next_token casts)


def next_token(logits: torch.Tensor, temperature: float):
    """The next token of each row, drawn from softmax(logits / temperature) (the most likely at temperature 0), its
    log-prob under that distribution and the distribution's entropy: logits [A, V] -> three [A]. At temperature 0
    the log-prob and entropy are those of softmax(logits). (fastpath.NextToken: the same, faster, for a large V.)"""
    logits = logits.float()  # [A, V]
    logp = torch.log_softmax(logits / temperature if temperature > 0 else logits, dim=-1)  # [A, V]
    p = logp.exp()  # [A, V]
    nxt = fastpath.draw(p) if temperature > 0 else logits.argmax(-1)  # [A]
    return nxt, logp.gather(1, nxt[:, None]).squeeze(1), torch.special.entr(p).sum(-1)  # -sum p log p (entr(0) = 0)


def generate(model, prompts: list, *, n: int = 1, max_new_tokens: int, temperature: float, eos_id: int,
             pad_id: int, fast: bool = None, on_token=None) -> dict:
    """Sample n completions for each prompt (token-id lists). temperature 0 means greedy.

    The log-probs are those of the distribution the token was drawn from, softmax(logits / temperature)
    (softmax(logits) when greedy); token_logprobs() with the same temperature reproduces them.
    fast: None decodes through fastpath.Decoder where fastpath.decodes(model), else OwnDecoder, and draws through
    fastpath.NextToken over a large vocabulary; False forces OwnDecoder and next_token (the tests compare them).
    on_token: called once per decode step (a progress bar's update).
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    ids, mask = left_pad(prompts, pad_id)
    ids, mask = ids.to(device), mask.to(device)
    N = len(prompts) * n
    tokens = torch.full((N, max_new_tokens), pad_id, dtype=torch.long, device=device)  # [N, T]
    logprobs = torch.zeros((N, max_new_tokens), device=device)  # [N, T]
    entropy = torch.zeros((N, max_new_tokens), device=device)  # [N, T]
    lengths = torch.full((N,), max_new_tokens, dtype=torch.long, device=device)  # [N]
    # inference_mode is no_grad without autograd's version and view bookkeeping on every op, which is a visible share
    # of a small model's decode step. What it creates can never enter autograd, so it only writes into the buffers
    # above, which the loss later uses. Under bf16 autocast it is no_grad: inference_mode turns off autocast's cache
    # of the weights' bf16 copies, and every decode step then cast every weight again (a third of a 0.5B's step).
    quiet = torch.no_grad() if torch.is_autocast_enabled(device.type) else torch.inference_mode()
    with quiet:
        # the prompts go through the model's own forward, once per prompt; the model makes its own cache
        out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), use_cache=True,
                    logits_to_keep=1)
        logits = out.logits[:, -1].float().repeat_interleave(n, 0)  # [N, V]
        use_fast = fastpath.decodes(model) and fast is not False
        decoder = (fastpath.Decoder if use_fast else OwnDecoder)(model, out.past_key_values, mask, n, max_new_tokens)
        pos = mask.sum(-1, keepdim=True).repeat_interleave(n, 0)  # [N, 1] position of the first response token
        active = torch.arange(N, device=device)  # [A] rows in the decode batch
        finished = torch.zeros(N, dtype=torch.bool, device=device)  # [A] rows of the batch that have emitted EOS
        # next_token; over a large vocabulary fastpath.NextToken, its numbers with two [A, V] buffers kept all along
        large = logits.shape[-1] > fastpath.LARGE_VOCAB and fast is not False
        pick = fastpath.NextToken() if large else next_token
        for t in range(max_new_tokens):
            nxt, logprobs[active, t], entropy[active, t] = pick(logits, temperature)  # [A] each
            tokens[active, t] = nxt
            done = (nxt == eos_id) & ~finished  # [A] rows that end here
            lengths[active[done]] = t + 1
            finished |= done
            if on_token is not None:
                on_token()
            if finished.all() or t == max_new_tokens - 1:
                break
            # Finished rows leave the batch (their cache rows too), but only once DROP_SHARE of it has finished:
            # copying every layer's cache for each single row that ends would cost more than decoding a few rows
            # for nothing. What a finished row decodes meanwhile lies past its length and is masked out below.
            if finished.sum() >= DROP_SHARE * len(active):
                keep = (~finished).nonzero().squeeze(1)  # [A']
                decoder.keep(keep)
                active, nxt, pos, finished = active[keep], nxt[keep], pos[keep], finished[keep]
            logits = decoder(nxt, pos)  # [A, V]
            pos = pos + 1
    model.train(was_training)

    T = int(lengths.max())
    tokens, logprobs, entropy = tokens[:, :T], logprobs[:, :T], entropy[:, :T]
    response_mask = (torch.arange(T, device=device)[None, :] < lengths[:, None]).long()  # [N, T]
    tokens = tokens.masked_fill(response_mask == 0, pad_id)  # what rows decoded after their EOS
    prompt_ids, prompt_mask = left_pad(prompts, pad_id)
    prompt_ids = prompt_ids.to(device).repeat_interleave(n, 0)  # [N, P]
    prompt_mask = prompt_mask.to(device).repeat_interleave(n, 0)  # [N, P]
    return {
        "input_ids": torch.cat([prompt_ids, tokens], dim=1),  # [N, P + T]
        "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),  # [N, P + T]
        "response_mask": response_mask,  # [N, T]
        "logprobs": logprobs * response_mask,  # [N, T]
        "entropy": entropy * response_mask,  # [N, T]
        "truncated": tokens.gather(1, (lengths - 1)[:, None]).squeeze(1) != eos_id,  # [N]
        "prompt_len": prompt_ids.shape[1],
    }


def token_logprobs(model, input_ids, attention_mask, prompt_len: int, temperature: float = 1.0,
                   chunk_tokens: int = None, groups: torch.Tensor = None, fast: bool = None, hidden_out: list = None):
    """log pi(o_t | q, o_<t) of every response token, by a forward over prompt + response.

    input_ids, attention_mask: [N, P + T] as generate() returns them. Returns logp [N, T].
    The hidden state at column j predicts the token at column j + 1, so columns P-1 .. P+T-2 score the response.

    groups [N] (optional): rows with the same value share their prompt (a GRPO group). Each prompt then runs once
    and its cache is copied to its rows, as in generate(); gradients flow back through the copies. A prompt
    token's activations never depend on the response after it (causal attention), so every row gets exactly
    what its own forward would give. The saving is the prompt's share of the columns times G - 1 of G: large on
    the tiny task (prompts a third of the columns), small where responses are long.

    The output layer runs `chunk_tokens` tokens at a time, each chunk but the last under activation checkpointing, so a
    float32 [N, T, vocabulary] tensor never exists: for Qwen2.5 (151,936 ids) at 4 x 3,300 tokens it would take 8 GB,
    and autograd would keep it and its softmax for the backward. By default a chunk holds 1.2 GB of logits
    (memory.logit_chunk_tokens: 2,048 tokens of Qwen2.5's ids, 6,330 of SmolLM2's 49,152) and, but for the last, is
    recomputed in the backward. This takes logits = output_embeddings(hidden): a model whose
    config sets a final transform (LOGIT_TRANSFORMS: Gemma2's soft-capping, Cohere's scale, ...) gets one forward of its
    own instead, its logits for the response columns whole ([N, T, V]), without chunks or a shared prompt.
    Prompts are shared only where fastpath.shares_prompts(model) (a plain full-attention cache). Over a vocabulary
    above fastpath.LARGE_VOCAB ids each chunk's log-softmax is fastpath.TargetLogprobs, the same numbers; fast=False
    keeps it plain.
    hidden_out (optional): a list that receives the last hidden states [N, T, H] that the output layer reads (with their
    gradient), for a loss term that needs the whole distribution (SDPG's KL, methods.TERMS); a model with a final
    transform is refused then.
    """
    P, pos, decoder = prompt_len, position_ids(attention_mask), model.get_decoder()  # pos [N, P + T]
    targets = input_ids[:, P:]  # [N, T]
    if not plain_head(model) and hidden_out is not None:
        raise ValueError(f"{type(model).__name__}: its logits are not the output layer's alone (a final transform in "
                         f"its config), which a full-vocabulary loss term (SDPG) reads chunk by chunk")
    if not plain_head(model):
        T = targets.shape[1]
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos, use_cache=False,
                       logits_to_keep=T + 1).logits[:, :-1]  # [N, T, V] columns P-1 .. P+T-2
        return _logprobs_of(logits, targets, temperature)  # [N, T]
    if groups is None or model.is_activation_checkpointing or not fastpath.shares_prompts(model):
        # (checkpointed layers run without a cache)
        hidden = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos,
                         use_cache=False).last_hidden_state  # [N, P + T, H]
        h = hidden[:, P - 1:-1]  # [N, T, H]
    else:
        # One lookup for prompts and responses: each lookup's backward makes a dense [V, H] gradient of the
        # embeddings (Qwen2.5-0.5B's: 151,936 x 896 floats, 544 MB), zeroed, filled and added to the other's
        # (train.update sums them sparse: fastpath.sparse_embedding_grad).
        embeds = model.get_input_embeddings()(input_ids)  # [N, P + T, H]
        kv, prompt, row_group = fastpath.prompt_prefill(decoder, input_ids, attention_mask, pos, P, groups,
                                                        embeds)  # prompt [U, P, H]
        response = decoder(inputs_embeds=embeds[:, P:], attention_mask=attention_mask, position_ids=pos[:, P:],
                           past_key_values=fastpath.cache_for(kv, row_group),
                           use_cache=True).last_hidden_state  # [N, T, H]
        h = torch.cat([prompt[row_group, -1:], response[:, :-1]], dim=1)  # [N, T, H]
    if hidden_out is not None:
        hidden_out.append(h)  # [N, T, H]
    N, T = h.shape[:2]
    h, targets = h.reshape(N * T, -1), targets.reshape(N * T)  # [N*T, H], [N*T]
    head = model.get_output_embeddings()
    chunk_tokens = memory.logit_chunk_tokens(head.weight.shape[0]) if chunk_tokens is None else chunk_tokens
    logp = []
    for s in range(0, N * T, chunk_tokens):
        args = (head, h[s:s + chunk_tokens], targets[s:s + chunk_tokens], temperature, fast is not False)
        # The last chunk keeps its tensors instead: the backward takes it first (autograd runs the newest node
        # first), when its recomputation would hold the same tensors, so checkpointing it only ran the output layer
        # twice (the bench's 0.5B update, profiled: 8 products of 227 ms over 151,936 ids for 4 micro-batches of one
        # chunk each; docs/LOG.md, 2026-11-27, thirteenth session).
        if torch.is_grad_enabled() and s + chunk_tokens < N * T:
            logp.append(torch.utils.checkpoint.checkpoint(_chunk_logprobs, *args, use_reentrant=False))
        else:
            logp.append(_chunk_logprobs(*args))
    return torch.cat(logp).view(N, T)  # [N, T]


def _chunk_logprobs(head, h, targets, temperature, fast: bool):
    """Log-prob of each target for a chunk of tokens: h [n, H], targets [n]. fast: through fastpath.TargetLogprobs,
    the same numbers with fewer [n, V] tensors, where the vocabulary is large (fastpath.LARGE_VOCAB)."""
    logits = head(h)  # [n, V]
    if fast and logits.shape[-1] > fastpath.LARGE_VOCAB:
        return fastpath.TargetLogprobs.apply(logits, targets, temperature)  # [n]
    return _logprobs_of(logits, targets, temperature)  # [n]


def _logprobs_of(logits, targets, temperature):
    """log softmax(logits / temperature) at the targets, in float32: logits [..., V], targets [...] -> [...]."""
    logits = logits.float()
    if temperature > 0:
        logits = logits / temperature
    return logits.gather(-1, targets[..., None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def plain_head(model) -> bool:
    """Whether logits = output_embeddings(hidden state): no LOGIT_TRANSFORMS field set in the config (nor in its
    text config, for a multimodal one). Qwen2, Llama, Qwen3, Phi3, GPT2: yes; Gemma2 (soft-capping): no."""
    configs = (model.config, model.config.get_text_config())
    return all(getattr(c, f, None) is None for c in configs for f in LOGIT_TRANSFORMS)


def select_rows(batch: dict, rows: torch.Tensor) -> dict:
    """The rollouts `rows` of a batch that generate() returned (same layout)."""
    return {k: v if k == "prompt_len" else v[rows] for k, v in batch.items()}


def concat_batches(batches: list, pad_id: int) -> dict:
    """Stack batches of generate() whose prompt and response widths differ (DAPO's dynamic sampling collects
    several rounds): prompts get more left padding, responses more right padding, both with mask 0, so the
    positions derived from the attention mask, and hence every log-prob, stay what they were."""
    P = max(b["prompt_len"] for b in batches)
    T = max(b["response_mask"].shape[1] for b in batches)
    pad = torch.nn.functional.pad  # pad(x, (left, right), value=...) along the last dimension
    out = {k: [] for k in batches[0]}
    for b in batches:
        p, t = P - b["prompt_len"], T - b["response_mask"].shape[1]
        out["input_ids"].append(pad(b["input_ids"], (p, t), value=pad_id))
        out["attention_mask"].append(pad(b["attention_mask"], (p, t), value=0))
        out["response_mask"].append(pad(b["response_mask"], (0, t), value=0))
        out["logprobs"].append(pad(b["logprobs"], (0, t), value=0.0))
        out["entropy"].append(pad(b["entropy"], (0, t), value=0.0))
        for k in b.keys() - {"input_ids", "attention_mask", "response_mask", "logprobs", "entropy", "prompt_len"}:
            out[k].append(b[k])  # per-rollout fields ([N, ...]): stacked as they are
    return {**{k: torch.cat(v) for k, v in out.items() if k != "prompt_len"}, "prompt_len": P}
