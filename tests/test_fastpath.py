"""fastpath.py: each written-out forward equals the model's own. The decode step against model.generate and
against sample.OwnDecoder (the model's own forward and cache) on the tiny Qwen2 and a Llama, a group's prompt run
once against each row's own forward (log-probs and gradients, in float64 to 1e-10), and a clear error for layouts
it does not write out. (OAR's forward after a prompt: tests/test_oar.py.)"""
from contextlib import nullcontext

import pytest
import torch

import sample
from infra import fastpath
from conftest import assert_close
from test_sample import assert_grads_close, grads_of, prompts


def test_greedy_matches_model_generate(base):
    model, tok = base
    ps = prompts(tok, 12)
    ours = sample.generate(model, ps, max_new_tokens=40, temperature=0.0, eos_id=tok.eos_token_id,
                           pad_id=tok.pad_token_id)
    ids, mask = sample.left_pad(ps, tok.pad_token_id)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=40, do_sample=False,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)[:, ids.shape[1]:]
    P = ours["prompt_len"]
    lengths = ours["response_mask"].sum(-1)
    assert len(set(lengths.tolist())) > 1, "rows of different lengths are the point of this test"
    for i in range(len(ps)):
        n = lengths[i]
        assert ours["input_ids"][i, P:P + n].tolist() == ref[i, :n].tolist()


def shared_prompt_case(model, tok, seed):
    """Rollouts of 5 prompts x 3, 10 of them in a shuffled order: groups of 1 to 3 rows, prompts of different
    lengths (left padding), as train.py's length-sorted micro-batches give them."""
    torch.manual_seed(seed)
    out = sample.generate(model, prompts(tok, 5, seed=5 + seed), n=3, max_new_tokens=30, temperature=1.0,
                          eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    rows = torch.tensor([7, 0, 2, 11, 4, 3, 9, 14, 12, 13])  # groups 2, 0, 0, 3, 1, 1, 3, 4, 4, 4
    return out["input_ids"][rows], out["attention_mask"][rows], out["prompt_len"], out["response_mask"][rows], rows // 3


def shared_and_plain(model, ids, attn, P, m, groups):
    """log-probs and gradients of sum(m * logp), by the plain forward and by the shared-prompt one."""
    res = []
    for g in (None, groups):
        logp = sample.token_logprobs(model, ids, attn, P, groups=g)
        (logp * m.to(logp.dtype)).sum().backward()
        res.append((logp.detach() * m, grads_of(model)))
        model.zero_grad(set_to_none=True)
    return res


@pytest.mark.parametrize("seed", [0, 1])
def test_shared_prompts_give_the_same_logprobs_and_gradients_in_float64(base, float64_exact, seed):
    # groups=: each prompt runs once and its cache is copied to its rollouts; rows come in any order and groups
    # of any size. Mathematically the two forwards are the same function, so in float64 they agree to rounding
    # (3e-14 of the gradients' scale, over seeds 0-7, perturbed and sharpened models, 1 and 2 threads). The only
    # place where they compute differently is the prompt of a group of 2 or more rows: the shared forward sums
    # the rows' gradients at the prompt's keys and values, the plain one at the parameters; a row alone gives
    # bit-identical gradients. float64_exact: HF's RMSNorm and the log-prob head compute in float64 too.
    import copy
    model, tok = base
    ids, attn, P, m, groups = shared_prompt_case(model, tok, seed)
    assert groups.bincount().tolist() == [2, 2, 1, 2, 3] and len(set(attn[:, :P].sum(-1).tolist())) > 1
    model64 = copy.deepcopy(model).double()
    (plain, g_plain), (shared, g_shared) = shared_and_plain(model64, ids, attn, P, m, groups)
    # margin: the two paths used 1.8e-05 of the tolerance at worst (this project's CPU, 2026-11-25; TEST_MARGINS)
    assert_close(shared, plain, rel=1e-10, what="log-probs")
    assert_grads_close(g_shared, g_plain, rel=1e-10, what="float64")


def test_shared_prompts_give_the_same_logprobs_and_gradients(base):
    # The same in float32, the dtype of training. Float32 rounding, relative to the scale of all the gradients:
    # 1e-6 on the tiny model here, up to 5e-5 on a model with sharpened attention and output (q_proj x 4, final
    # norm x 3: saturated softmaxes, whose backward cancels). A real difference (a row's or a group's gradient
    # lost or counted twice) moves them by a share of their size: 1e-3 separates the two; the float64 test above
    # checks the identity itself.
    model, tok = base
    ids, attn, P, m, groups = shared_prompt_case(model, tok, 0)
    (plain, g_plain), (shared, g_shared) = shared_and_plain(model, ids, attn, P, m, groups)
    # margin: the two paths used 0.018 of the tolerance at worst (this project's CPU, 2026-11-25; TEST_MARGINS)
    assert_close(shared, plain, rel=1e-5, what="log-probs")
    assert_grads_close(g_shared, g_plain, rel=1e-3, what="float32")
    with pytest.raises(ValueError, match="different prompts"):
        sample.token_logprobs(model, ids, attn, P, groups=torch.zeros(len(ids), dtype=torch.long))


def test_cache_for_sums_a_prompts_rows_in_float32_under_bf16():
    # The gather's backward adds the gradients of a prompt's rows; on a CPU in bf16 (autocast's keys and values) it
    # sums them in float32 and rounds once (index_select's backward), more exactly than adding them one by one in
    # bf16 (kv[rows]'s). Rows 0, 2, 3 take prompt 0, row 1 prompt 1: prompt 0's gradient is 1 + 2^-8 + 2^-8, which
    # bf16 (8 significant bits) rounds to 1 step by step (1 + 2^-8 is a tie, to even: 1) but holds to 1 + 2^-7
    # summed. As in a pass, the gradient reaches the gather through the cache's concatenation with the new columns
    # (a slice, not contiguous), 4 prompt columns of 8 values: 32 a row.
    k = torch.zeros(2, 1, 4, 8, dtype=torch.bfloat16, requires_grad=True)  # [U, Hkv, P, D]
    rows = torch.tensor([0, 1, 0, 0])
    cache = fastpath.cache_for([(k, k.detach().clone())], rows)
    new = torch.zeros(4, 1, 3, 8, dtype=torch.bfloat16)  # [n, Hkv, 3 new columns, D]
    keys, _ = cache.update(new, new.clone(), 0)  # [n, Hkv, P + 3, D]
    g = torch.tensor([1.0, 5.0, 2 ** -8, 2 ** -8], dtype=torch.bfloat16).view(4, 1, 1, 1).expand(4, 1, 7, 8)
    keys.backward(g)
    assert (k.grad[0] == 1 + 2 ** -7).all() and (k.grad[1] == 5.0).all()


def test_unsupported_layouts_get_a_clear_error():
    # sample.generate and oar.py run any other model through its own forward (tests/test_archs.py); the written-out
    # forward itself refuses what it does not compute
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=10))
    assert not fastpath.decodes(model) and fastpath.shares_prompts(model)
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        fastpath.logits_after_prompt(model, torch.zeros(1, 2, 8), torch.ones(1, 3, dtype=torch.long),
                                     torch.arange(3)[None], [], torch.zeros(1, dtype=torch.long), keep=1)


def random_llama(tok):
    """A random 2-layer Llama over the tiny vocabulary; its EOS row scaled so that rows end at different lengths."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    with torch.no_grad():
        w = model.get_output_embeddings().weight  # [V, H]
        w[tok.eos_token_id] = 4 * w.std() * torch.randn(w.shape[1])
    return model.eval()


@pytest.mark.parametrize("which,chunk", [("tiny", 64), ("llama", 64), ("tiny", 7)])
def test_decode_step_gives_the_plain_decodes_tokens_and_logprobs(base, which, chunk, monkeypatch):
    # sample.generate through fastpath.Decoder (the default for these layouts) and through OwnDecoder, the model's
    # own forward and cache (fast=False): greedy tokens identical; sampled with one seed, the same tokens and
    # log-probs and entropies to 1e-5 of their scale. Rows of different lengths: both drop finished rows. With
    # chunk 7 the cache's buffers grow every 7 tokens, the last growth cut short at 30 (Decoder.CHUNK; 64 holds
    # them all at once): the decoder runs for tokens 2..T of the longest response, columns P .. P + T - 2.
    monkeypatch.setattr(fastpath.Decoder, "CHUNK", chunk)
    grows, grow = [], fastpath.Decoder._grow

    def counted(self):  # the column at which each growth happens
        grows.append(self.col)
        grow(self)
    monkeypatch.setattr(fastpath.Decoder, "_grow", counted)
    model, tok = base
    model = model if which == "tiny" else random_llama(tok)
    assert fastpath.decodes(model)
    kw = dict(eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    for temperature, n in ((0.0, 1), (1.0, 3)):
        outs = []
        for fast in (None, False):
            torch.manual_seed(0)
            grows.clear()
            outs.append(sample.generate(model, prompts(tok, 6, seed=7), n=n, max_new_tokens=30,
                                        temperature=temperature, fast=fast, **kw))
            if fast is None:
                fast_grows = list(grows)
        fast_out, plain_out = outs
        P, T = fast_out["prompt_len"], fast_out["response_mask"].shape[1]
        assert fast_grows == [P + c for c in range(chunk, T - 1, chunk)], (fast_grows, P, T)
        assert len(set(plain_out["response_mask"].sum(-1).tolist())) > 1
        for k in ("input_ids", "attention_mask", "response_mask", "truncated"):
            assert torch.equal(fast_out[k], plain_out[k]), (temperature, k)
        for k in ("logprobs", "entropy"):
            # margin: the two paths used 0.12 of the tolerance at worst (this project's CPU, 2026-11-25; TEST_MARGINS)
            assert_close(fast_out[k], plain_out[k], rel=1e-5, what=f"{k} at temperature {temperature}")


def test_next_token_over_a_large_vocabulary_gives_the_plain_numbers():
    # fastpath.NextToken (buffers kept between steps, the log-softmax in parts, the entropy as log s - sum p z)
    # against sample.next_token (log_softmax, exp, entr), step after step as the decode batch shrinks: the same ids
    # from one seed, the same log-probs and entropies to 1e-5 of their scale; bf16 logits as the output layer gives
    # them under autocast; greedy too. Rows: peaked, flat, and in between (logits of scale 0.1 to 300); some with
    # ids at -inf.
    V = 151_936  # Qwen2.5's vocabulary, not a multiple of draw()'s block
    torch.manual_seed(0)
    scale = torch.logspace(2.5, -1, 24)[:, None]  # [24, 1]
    seen = []
    for dtype in (torch.float32, torch.bfloat16):
        for temperature in (0.7, 1.0, 0.0):
            fast = fastpath.NextToken()
            for A in (24, 24, 17, 5):  # rows leave the batch; the buffers stay
                logits = (scale[:A] * torch.randn(A, V)).to(dtype)  # [A, V]
                logits[::2, -5:] = float("-inf")  # ids a model rules out: p = 0, and 0 in the entropy
                torch.manual_seed(A)
                want = sample.next_token(logits, temperature)
                seen.append(want[2])
                torch.manual_seed(A)
                got = fast(logits, temperature)
                assert torch.equal(got[0], want[0]), (dtype, temperature, A)
                # the entropy sums 151,936 float32 terms in another order (log s - sum p z against entr): a
                # rounding error of about sqrt(V) x 6e-8 = 2.3e-5 of its scale is to be expected, and this host
                # (2026-11-28) read 1.09e-5 (1.14e-4 at a scale of 10.5) where 1e-5 was asked; a wrong formula is off
                # by far more
                for k, what, rel in ((1, "log-prob", 1e-5), (2, "entropy", 5e-5)):
                    assert_close(got[k], want[k], rel=rel, what=f"next token's {what}, T {temperature}")
            assert len(fast.z) == 24
    assert torch.cat(seen).min() < 1e-3 and torch.cat(seen).max() > 10  # peaked rows and flat ones


def test_target_logprobs_give_the_plain_numbers_and_gradients():
    # fastpath.TargetLogprobs against sample._logprobs_of (log_softmax at the targets through autograd), forward and
    # backward, over 151,936 ids, float32 and bf16 logits (the gradient then cast to bf16 by both), T = 0.7, 1, and 0
    # (greedy: undivided); a logit of -inf (p = 0) and a row of equal logits (p = 1 / V everywhere).
    torch.manual_seed(0)
    V = 151936
    for dtype in (torch.float32, torch.bfloat16):
        for temperature in (0.7, 1.0, 0.0):
            x = (4 * torch.randn(6, V)).to(dtype)  # [6, V]
            x[1, :3] = float("-inf")
            x[2] = 1.5
            targets = torch.tensor([5, 7, V - 1, 0, 123456, 42])
            g = torch.randn(6)  # the loss's gradient at each log-prob
            out = {}
            for name, f in (("plain", sample._logprobs_of), ("fast", fastpath.TargetLogprobs.apply)):
                logits = x.clone().requires_grad_()
                logp = f(logits, targets, temperature)  # [6]
                logp.backward(g)
                out[name] = (logp.detach(), logits.grad)
            what = f"{dtype}, T {temperature}"
            assert out["fast"][1].dtype == dtype
            assert_close(out["fast"][0], out["plain"][0], rel=1e-6, what=f"log-probs, {what}")
            assert_close(out["fast"][1].float(), out["plain"][1].float(), rel=1e-6, what=f"gradients, {what}")
            assert out["fast"][1][1, :3].eq(0).all()  # an id at -inf takes no gradient
    # rows logsumexp treats apart (an infinite maximum taken as 0): a +inf logit, and every logit -inf
    x = torch.randn(3, V)
    x[0, 10] = float("inf")
    x[1] = float("-inf")
    got, want = (f(x.clone().requires_grad_(), torch.tensor([3, 3, 7]), 0.7) for f in (
        fastpath.TargetLogprobs.apply, sample._logprobs_of))  # row 0: -inf, row 1: nan, both ways
    torch.testing.assert_close(got, want, equal_nan=True)


def test_token_logprobs_take_target_logprobs_over_a_large_vocabulary(base, monkeypatch):
    # the tiny model's vocabulary counts as large here: token_logprobs then runs TargetLogprobs in its checkpointed
    # chunks (the backward recomputes them), with the plain path's log-probs and gradients
    model, tok = base
    ids, attn, P, m, groups = shared_prompt_case(model, tok, 0)
    calls = []
    monkeypatch.setattr(fastpath, "LARGE_VOCAB", 0)
    monkeypatch.setattr(fastpath.TargetLogprobs, "forward", staticmethod(
        lambda ctx, *a, f=fastpath.TargetLogprobs.forward: calls.append(1) or f(ctx, *a)))
    out = {}
    for fast in (False, None):
        model.zero_grad(set_to_none=True)
        logp = sample.token_logprobs(model, ids, attn, P, 0.7, chunk_tokens=7, groups=groups, fast=fast)
        (logp * m).sum().backward()
        out[fast] = (logp.detach() * m, grads_of(model))
    model.zero_grad(set_to_none=True)
    assert calls  # the fast path ran
    assert_close(out[None][0], out[False][0], rel=1e-6, what="log-probs")
    assert_grads_close(out[None][1], out[False][1], rel=1e-6, what="TargetLogprobs")


@pytest.mark.parametrize("tied", [True, False])
def test_sparse_embedding_grad_sums_the_dense_gradient(base, tied):
    # train.update's micro-batches inside fastpath.sparse_embedding_grad: the embeddings' gradient accumulates as
    # the rows looked up and is made dense on leaving, the sum of the dense gradients of each backward. The tiny
    # model ties its output layer to the embeddings (whose dense gradient then takes the rows); untied, the
    # gradient is sparse until the end. Sums in another order: equal to float32 rounding (the same bits here).
    import copy
    from transformers import Qwen2ForCausalLM
    model, tok = base
    if not tied:
        config = copy.deepcopy(model.config)
        config.tie_word_embeddings = False
        model = Qwen2ForCausalLM(config)  # random weights, as tiny's shapes
    ids, attn, P, m, groups = shared_prompt_case(base[0], tok, 0)
    emb = model.get_input_embeddings()
    assert (emb.weight is model.get_output_embeddings().weight) == tied
    V = emb.num_embeddings  # the tokens an update looks up, as the caller counts them: at most V goes sparse

    def update(sparse: bool):
        model.zero_grad(set_to_none=True)
        layouts = []
        with sample.autocast("cpu", True), (fastpath.sparse_embedding_grad(model, V) if sparse else nullcontext()):
            for mb in (torch.arange(0, 5), torch.arange(5, 10)):  # whole groups: 2 0 0 3 1 | 1 3 4 4 4
                logp = sample.token_logprobs(model, ids[mb], attn[mb], P, 1.0, groups=groups[mb])  # [5, T]
                with sample.autocast("cpu", False):
                    (logp * m[mb]).sum().backward()
                layouts.append(emb.weight.grad.layout)
        return grads_of(model), layouts

    (dense, dense_layouts), (summed, layouts) = update(False), update(True)
    model.zero_grad(set_to_none=True)
    assert dense_layouts == [torch.strided] * 2
    assert layouts == [torch.strided if tied else torch.sparse_coo] * 2
    assert emb.weight.grad is None and not emb.sparse  # as it was before: a plain Embedding
    assert all(g.layout == torch.strided for g in summed.values())
    assert_grads_close(summed, dense, rel=1e-6, what="sparse embedding gradient")
    with fastpath.sparse_embedding_grad(model, V + 1):  # more tokens than ids: left dense
        assert not emb.sparse
    emb.weight.requires_grad_(False)  # not trained (LoRA): left alone
    try:
        with fastpath.sparse_embedding_grad(model, V):
            assert not emb.sparse
    finally:
        emb.weight.requires_grad_(True)
    with pytest.raises(MemoryError):  # an exception inside: the half-summed gradient dropped, the layer plain again
        with fastpath.sparse_embedding_grad(model, V):
            sample.token_logprobs(model, ids[:5], attn[:5], P, 1.0, groups=groups[:5]).sum().backward()
            raise MemoryError
    assert emb.weight.grad is None and not emb.sparse
    model.zero_grad(set_to_none=True)


def attention_case(case: str):
    """query [2, 4, Tq, 8], key and value [2, 2, Tk, 8] (two query heads a key/value head), float64, and SDPA's
    mask: "cache" 3 queries after 4 cached keys, row 1 left-padded by 2 and its first query seeing only padding (a
    row of weights all masked); "causal" 5 queries over themselves, mask None; "one" a single query, mask None;
    "static" 3 queries over 7 keys, mask None (HF's prefill into an empty static cache: causal from the first key);
    "full" 5 queries over themselves, mask None, a layer that is not causal (is_causal=False)."""
    g = torch.Generator().manual_seed(0)
    Tq, Tk = {"cache": (3, 7), "causal": (5, 5), "one": (1, 6), "static": (3, 7), "full": (5, 5)}[case]
    q, k, v = (torch.randn(2, h, t, 8, generator=g, dtype=torch.float64, requires_grad=True)
               for h, t in ((4, Tq), (2, Tk), (2, Tk)))
    mask = None
    if case == "cache":
        mask = torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq)[None, None].repeat(2, 1, 1, 1)  # [2, 1, Tq, Tk]
        mask[1, :, :, :2] = False  # row 1's padding
        mask[1, :, 0] = False  # its first query: every key masked
    return q, k, v, mask


@pytest.mark.parametrize("case,chunk_bytes", [("cache", None), ("cache", 1), ("causal", None), ("causal", 600),
                                               ("one", None), ("static", None), ("full", None), ("full", 600)])
def test_product_attention_gives_sdpas_outputs_and_gradients(case, chunk_bytes, monkeypatch):
    # product_attention against HF's SDPA forward on the same arguments, in float64: outputs and the gradients of
    # query, key and value (sums of products in another order: equal to 1e-12). chunk_bytes: queries in chunks
    # (1 byte: one query a chunk; 600: three of "causal"'s 5, a query's scores 2 rows x 4 heads x 5 keys x 4 bytes).
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    if chunk_bytes:
        monkeypatch.setattr(fastpath, "ATTENTION_CHUNK", chunk_bytes)
    module = random_llama_attention()
    up = torch.randn(2, {"cache": 3, "causal": 5, "one": 1, "static": 3, "full": 5}[case], 4, 8,
                     dtype=torch.float64)  # [B, Tq, H, D]
    extra = {"is_causal": False} if case == "full" else {}
    if case == "full" and chunk_bytes:  # the layer's own attribute, no keyword (as an encoder's layer)
        module.is_causal, extra = False, {}
    got = []
    for attend in (sdpa_attention_forward, fastpath.product_attention):
        q, k, v, mask = attention_case(case)
        out, _ = attend(module, q, k, v, mask, scaling=0.3, dropout=0.0, **extra)  # [B, Tq, H, D]
        (out * up).sum().backward()
        got.append([out.detach(), q.grad, k.grad, v.grad])
    for what, a, b in zip(("output", "query's gradient", "key's", "value's"), *got):
        assert a.shape == b.shape, what
        assert_close(b, a, rel=1e-12, what=what)
    if case == "cache":  # the query that sees only padding: 0, as SDPA gives it, and no NaN anywhere
        assert (got[1][0][1, 0] == 0).all() and not any(t.isnan().any() for t in got[1])


def random_llama_attention():
    """An attention layer with two query heads a key/value head (random_llama's shapes), as HF passes it."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention
    return LlamaAttention(LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2), layer_idx=0)


def test_product_attention_keeps_its_inputs_not_its_weights():
    # Under a gradient each chunk runs under activation checkpointing: no tensor of the weights' shape (queries x
    # keys) is kept for the backward, which recomputes them (as SDPA's kernel keeps none).
    q, k, v, mask = attention_case("cache")
    kept = []

    def pack(t):
        kept.append((tuple(t.shape), t.dtype))
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out, _ = fastpath.product_attention(random_llama_attention(), q, k, v, mask, scaling=0.3)
    out.sum().backward()
    assert ((2, 2, 7, 8), torch.float64) in kept  # the keys: what is kept is seen
    assert not [s for s, dtype in kept if dtype.is_floating_point and s[-1] == 7], kept  # scores, weights: [.., 7]
    assert q.grad is not None and k.grad is not None


def test_product_attention_leaves_to_sdpa_what_it_does_not_write_out(monkeypatch):
    # Attention dropout while training, a mask of added values, one that broadcasts over the queries and a soft
    # cap: SDPA's own path (the same random numbers under the same seed, the same bits; SDPA refuses a soft cap with
    # its own error).
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    module = random_llama_attention().train()
    q, k, v, mask = attention_case("cache")
    outs = []
    for attend in (sdpa_attention_forward, fastpath.product_attention):
        torch.manual_seed(0)
        outs.append(attend(module, q, k, v, mask, scaling=0.3, dropout=0.5)[0])
    assert torch.equal(*outs)
    module.eval()
    added = torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, -1e9)  # a mask of added values
    keys = mask[:, :, :1]  # [2, 1, 1, 7]: one row of keys for every query, broadcast
    monkeypatch.setattr(fastpath, "ATTENTION_CHUNK", 1)  # (a broadcast mask cannot be cut into query chunks)
    for m in (added, keys):
        outs = [attend(module, q, k, v, m, scaling=0.3)[0] for attend in (sdpa_attention_forward,
                                                                          fastpath.product_attention)]
        assert torch.equal(*outs)
    with pytest.raises(ValueError, match="softcap"):
        fastpath.product_attention(module, q, k, v, mask, scaling=0.3, softcap=30.0)


def test_product_attention_under_bf16_autocast_recomputes_its_own_numbers(monkeypatch):
    # train.update's precision: float32 inputs under bf16 autocast, the backward outside it. The checkpointed
    # chunks (one query each here) recompute the very numbers of plain runs of _masked_attention over the same
    # chunks (the same bits); against SDPA under the same autocast they differ by bf16 rounding (scores rounded to
    # bf16 before the softmax), 1e-2 of the scale here. Both give bf16 outputs, as autocast's products do.
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    monkeypatch.setattr(fastpath, "ATTENTION_CHUNK", 1)
    module = random_llama_attention()
    got, dtypes = {}, {}
    for way in ("sdpa", "products", "plain"):
        q, k, v, mask = (t.float().detach().requires_grad_() if t.dtype == torch.float64 else t
                         for t in attention_case("cache"))
        with sample.autocast("cpu", True):
            if way == "plain":
                out = torch.cat([fastpath._masked_attention(q[:, :, i:i + 1], k, v, mask[:, :, i:i + 1], 0.3)
                                 for i in range(q.shape[2])], 2).transpose(1, 2)  # [B, Tq, H, D], as the chunks
            else:
                out, _ = {"sdpa": sdpa_attention_forward, "products": fastpath.product_attention}[way](
                    module, q, k, v, mask, scaling=0.3)
        out.float().square().sum().backward()
        got[way], dtypes[way] = [out.detach().float(), q.grad, k.grad, v.grad], out.dtype
    assert dtypes == {"sdpa": torch.bfloat16, "products": torch.bfloat16, "plain": torch.bfloat16}
    assert not any(t.isnan().any() for t in got["products"])
    for a, b in zip(got["products"], got["plain"]):
        assert torch.equal(a, b)
    for what, a, b in zip(("output", "query's gradient", "key's", "value's"), got["products"], got["sdpa"]):
        assert_close(a, b, rel=2e-2, what=what)


def test_attention_by_products_gives_the_plain_logprobs_and_gradients(base, monkeypatch):
    # train.update's forward and backward inside fastpath.attention_by_products: the tiny model's attention is
    # product_attention there (its prompts shared, left padding, grouped-query heads: every call written out, none
    # handed to SDPA) and SDPA's again after it, also after an exception; the log-probs and gradients those of SDPA
    # to float32 rounding.
    model, tok = base
    ids, attn, P, m, groups = shared_prompt_case(model, tok, 0)
    assert model.config._attn_implementation == "sdpa"
    handed = []
    monkeypatch.setattr(fastpath, "sdpa_attention_forward", lambda *a, **kw: handed.append(1))
    got = []
    for fast in (False, True):
        with fastpath.attention_by_products(model) if fast else nullcontext():
            assert model.config._attn_implementation == ("products" if fast else "sdpa")
            logp = sample.token_logprobs(model, ids, attn, P, 1.0, groups=groups)  # [N, T]
            (logp * m).sum().backward()
        got.append((logp.detach() * m, grads_of(model)))
        model.zero_grad(set_to_none=True)
    assert model.config._attn_implementation == "sdpa" and handed == []
    assert_close(got[1][0], got[0][0], rel=1e-5, what="log-probs")
    assert_grads_close(got[1][1], got[0][1], rel=1e-5, what="gradients")
    with pytest.raises(MemoryError):
        with fastpath.attention_by_products(model):
            raise MemoryError
    assert model.config._attn_implementation == "sdpa"
    model.set_attn_implementation("eager")  # a model on another attention: left on it
    try:
        with fastpath.attention_by_products(model):
            assert model.config._attn_implementation == "eager"
    finally:
        model.set_attn_implementation("sdpa")
    with pytest.MonkeyPatch.context() as mp:  # one HF cannot switch at run time: not asked to (HF would warn)
        calls = []
        mp.setattr(type(model), "_can_set_attn_implementation", lambda self: False)
        mp.setattr(model, "set_attn_implementation", lambda *a, **kw: calls.append(a))
        with fastpath.attention_by_products(model):
            assert model.config._attn_implementation == "sdpa"
        assert calls == []


def test_micro_batches_take_every_row_once_in_the_order_of_fewer_columns():
    # train.update's micro-batches: every scored row exactly once (the accumulated gradient is the same sum), at
    # most `size` rows each, in the cheaper of two orders. Columns = distinct prompts x P + rows x longest response.
    groups = torch.arange(16) // 4  # [16] 4 groups of 4
    rows = torch.tensor([0, 1, 2, 3, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15])  # rows 4 and 7 not scored
    # every group's rows 10-13 tokens long, prompts of 100: by length the micro-batches of 4 hold rows of 3, 4, 4, 2
    # groups (13 prompt runs: 1,300 + 14 rows x ~12 columns); whole groups, the shortest longest first (group 1's rows
    # are 11 and 12: groups 1, 0, 2, 3 with 2, 4, 4, 4 rows) hold 2, 2, 2, 1 groups (700 + about the same)
    lengths = torch.tensor([10, 11, 12, 13] * 4)  # [16]
    got = fastpath.micro_batches(lengths, rows, groups, 100, 4)
    assert sorted(torch.cat(got).tolist()) == rows.tolist() and all(len(mb) <= 4 for mb in got)
    assert [len(set(groups[mb].tolist())) for mb in got] == [2, 2, 2, 1]
    # prompts of 2, each group's rows 1, 30, 2 and 29 long: by length (whole groups would pad every short row to 30)
    lengths = torch.tensor([1, 30, 2, 29] * 4)  # [16]
    got = fastpath.micro_batches(lengths, rows, groups, 2, 4)
    assert sorted(torch.cat(got).tolist()) == rows.tolist() and all(len(mb) <= 4 for mb in got)
    assert [int(lengths[mb].max()) for mb in got] == [2, 29, 30, 30]  # 1 1 1 2 | 2 2 2 29 | 29 29 30 30 | 30 30


def test_draw_lands_on_the_inverse_cdf_id_and_keeps_the_frequencies(monkeypatch):
    # above INVERSE_CDF_VOCAB ids, draw() takes the id where u x total falls in the running sum of the row (two levels:
    # the block, then the id inside it): against the plain search over the whole running sum in float64
    torch.manual_seed(0)
    V = fastpath.INVERSE_CDF_VOCAB + 1000
    p = torch.softmax(3 * torch.randn(6, V), -1)  # [6, V]
    p[0, :V - 1] = 0  # row 0: all its mass on the last id
    p[0, -1] = 1
    u = torch.tensor([[0.0], [1e-9], [0.25], [0.5], [0.999999], [0.7]], dtype=torch.float64)  # [6, 1]
    monkeypatch.setattr(fastpath.torch, "rand", lambda *a, **k: u.clone())
    c = p.double().cumsum(-1)  # [6, V]
    want = torch.searchsorted(c, u * c[:, -1:], right=True).squeeze(1).clamp(max=V - 1)
    assert torch.equal(fastpath.draw(p), want) and fastpath.draw(p)[0] == V - 1
    monkeypatch.undo()
    # the frequencies of 20,000 draws over 8 likely ids and a long tail of tiny ones: within 4 standard errors
    q = torch.full((V,), 0.2 / (V - 8))
    q[:8] = torch.tensor([0.3, 0.2, 0.1, 0.08, 0.05, 0.04, 0.02, 0.01])
    torch.manual_seed(1)
    ids = torch.cat([fastpath.draw(q.expand(4000, V)) for _ in range(5)])  # [20000]
    seen = torch.bincount(ids, minlength=V).double() / len(ids)
    for k in range(8):
        se = (q[k] * (1 - q[k]) / len(ids)) ** 0.5
        assert abs(seen[k] - q[k]) < 4 * se, (k, seen[k].item(), q[k].item())
    assert abs(seen[8:].sum() - 0.2) < 4 * (0.2 * 0.8 / len(ids)) ** 0.5  # the tail's mass
    # a small vocabulary draws with multinomial, as before (the tiny world's random stream)
    small = torch.softmax(torch.randn(3, 28), -1)
    torch.manual_seed(2)
    a = fastpath.draw(small)
    torch.manual_seed(2)
    assert torch.equal(a, torch.multinomial(small, 1).squeeze(1))
