"""sample.py: the sampler's log-probs against the training forward, masks, padding, chunked scoring.
(The written-out forwards against the model's own: tests/test_fastpath.py.)"""
import random
from contextlib import nullcontext

import torch

import sample
from toyworld import tiny
from conftest import assert_close, sampled_against_forward


def prompts(tok, n, seed=0):
    qs = tiny.train_problems(random.Random(seed), n, set(tiny.eval_problems()))
    return [tok(tiny.prompt(q))["input_ids"] for q in qs]  # different lengths -> left padding


def test_sampled_logprobs_equal_the_training_forward(base):
    model, tok = base
    sampled, scored, out = sampled_against_forward(model, tok, prompts(tok, 8, seed=1), n=4, temperature=1.0)
    assert len(set(out["response_mask"].sum(-1).tolist())) > 1
    # margin: the two paths used 0.035 of the tolerance at worst (this project's CPU, 2026-11-25; TEST_MARGINS)
    assert_close(scored, sampled, rel=1e-5, what="log-probs")


def test_temperature_is_applied_in_both_places(base):
    model, tok = base
    sampled, scored, out = sampled_against_forward(model, tok, prompts(tok, 4, seed=2), n=2, temperature=0.7)
    # The decode (a KV cache, a token at a time) and the full forward sum in other orders: 6.6e-6 of the scale here,
    # 0.66 of the 1e-5 this test had, too close for another CPU; a wrong temperature moves log-probs by 1e-1.
    # margin: the two paths used 0.066 of the tolerance at worst (this project's CPU, 2026-11-25; TEST_MARGINS)
    assert_close(scored, sampled, rel=1e-4, what="log-probs")


def test_eos_stays_in_the_mask_when_pad_is_eos(base):
    model, tok = base
    assert tok.pad_token_id == tok.eos_token_id
    steps = []
    out = sample.generate(model, prompts(tok, 6, seed=3), max_new_tokens=40, temperature=0.0,
                          eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, on_token=lambda: steps.append(1))
    resp, mask = out["input_ids"][:, out["prompt_len"]:], out["response_mask"]
    assert len(steps) == mask.shape[1] < 40  # one call a decode step, up to the longest row's EOS (evaluate's bar)
    for i in range(resp.shape[0]):
        n = int(mask[i].sum())
        assert resp[i, n - 1] == tok.eos_token_id  # the last masked token is the EOS itself
        assert (resp[i, n:] == tok.pad_token_id).all() and mask[i, n:].sum() == 0
    assert not out["truncated"].any()


def test_truncated_rows_are_flagged(base):
    model, tok = base
    out = sample.generate(model, prompts(tok, 3), max_new_tokens=5, temperature=0.0, eos_id=tok.eos_token_id,
                          pad_id=tok.pad_token_id)
    assert out["truncated"].all() and out["response_mask"].sum() == 15


def test_position_ids_ignore_left_padding():
    got = sample.position_ids(torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])).tolist()
    assert got == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]


def test_responses_after_other_prompts():
    # prompts [7] and [8, 9] (pad 0) before responses [[1, 2], [3, 0]] with mask [[1, 1], [1, 0]]:
    # rows [0, 7, 1, 2] and [8, 9, 3, 0], masks [0, 1, 1, 1] and [1, 1, 1, 0], the new prompt width 2
    ids, attn, P = sample.with_prompts([[7], [8, 9]], torch.tensor([[1, 2], [3, 0]]), torch.tensor([[1, 1], [1, 0]]), 0)
    assert (ids.tolist(), attn.tolist(), P) == ([[0, 7, 1, 2], [8, 9, 3, 0]], [[0, 1, 1, 1], [1, 1, 1, 0]], 2)


def test_concatenated_rounds_keep_their_logprobs(base):
    # DAPO's dynamic sampling stacks rounds with different prompt and response widths
    model, tok = base
    torch.manual_seed(1)
    kw = dict(max_new_tokens=40, temperature=1.0, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    b1 = sample.generate(model, [tok("Q:1+2=?\nA:")["input_ids"]], n=3, **kw)
    b2 = sample.generate(model, prompts(tok, 3, seed=4), n=2, **kw)
    both = sample.concat_batches([b1, sample.select_rows(b2, torch.tensor([0, 3, 5]))], tok.pad_token_id)
    assert both["input_ids"].shape[0] == 6 and both["prompt_len"] == max(b1["prompt_len"], b2["prompt_len"])
    with torch.no_grad():
        logp = sample.token_logprobs(model, both["input_ids"], both["attention_mask"], both["prompt_len"])
    m = both["response_mask"].bool()
    # margin: the two paths used 0.028 of the tolerance at worst (this project's CPU, 2026-11-25; TEST_MARGINS)
    assert_close(logp[m], both["logprobs"][m], rel=1e-5, what="log-probs")


def grads_of(model):
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def assert_grads_close(grads, ref, rel, what):
    """Every parameter's gradient within rel x the scale of all the reference gradients (see assert_close)."""
    scale = max(g.abs().max().item() for g in ref.values())
    for n in ref:
        assert_close(grads[n], ref[n], rel=rel, scale=scale, what=f"{what}: gradient of {n}")


def test_chunked_logprobs_equal_the_full_vocabulary_forward_with_gradients(base):
    # token_logprobs never builds [N, T, V] at once; its values and gradients must equal a plain log_softmax over
    # the model's full logits. The sampler's entropies must be those of the same distributions.
    # In float32, relative to the scale of each tensor (of all gradients together for the gradients): an absolute
    # 1e-5 failed on another CPU where the largest gradient was 13 and the difference 1.6e-5 (1.2e-6 of the scale).
    model, tok = base
    torch.manual_seed(0)
    out = sample.generate(model, prompts(tok, 4, seed=3), n=2, max_new_tokens=20, temperature=0.7,
                          eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    ids, attn, P = out["input_ids"], out["attention_mask"], out["prompt_len"]
    m = out["response_mask"].float()
    logits = model(input_ids=ids, attention_mask=attn, position_ids=sample.position_ids(attn)).logits[:, P - 1:-1]
    full = torch.log_softmax(logits / 0.7, -1)  # [N, T, V]
    ref = full.gather(-1, ids[:, P:, None]).squeeze(-1)
    ref_entropy = -(full.exp() * full).sum(-1) * m
    (ref * m).sum().backward()
    ref_grads = grads_of(model)
    model.zero_grad()
    runs = []  # the output layer's forwards: each chunk once, and again in the backward for all but the last
    hook = model.get_output_embeddings().register_forward_hook(lambda *_: runs.append(1))
    logp = sample.token_logprobs(model, ids, attn, P, 0.7, chunk_tokens=7)
    (logp * m).sum().backward()
    hook.remove()
    chunks = -(-logp.numel() // 7)
    assert chunks > 2 and len(runs) == 2 * chunks - 1, (chunks, len(runs))
    # margin: the two paths used 0.12 of the tolerance at worst (this project's CPU, 2026-11-25; TEST_MARGINS)
    assert_close(logp * m, ref.detach() * m, rel=1e-5, what="log-probs")
    assert_close(out["entropy"], ref_entropy.detach(), rel=1e-5, what="entropies")
    assert_grads_close(grads_of(model), ref_grads, rel=1e-5, what="chunked")
    model.zero_grad(set_to_none=True)


def test_the_output_layers_chunk_is_a_budget_of_bytes(base, monkeypatch):
    # 2048 x 151,936 x 4 bytes a chunk: Qwen2.5's 151,936 ids take 2,048 tokens, SmolLM2's 49,152 take
    # 2048 x 151,936 / 49,152 = 6,330.67 -> 6,330, a vocabulary above the budget one token.
    from infra import memory
    assert [memory.logit_chunk_tokens(v) for v in (151_936, 49_152, 10 ** 12)] == [2048, 6330, 1]
    # token_logprobs's default chunk follows it: a budget of 5 tokens of the tiny model's logits makes chunks of 5
    model, tok = base
    V = model.get_output_embeddings().weight.shape[0]
    monkeypatch.setattr(memory, "LOGIT_CHUNK_BYTES", 5 * 4 * V + 3)
    ids, attn = sample.left_pad(prompts(tok, 3, seed=1), tok.pad_token_id)
    P = ids.shape[1]
    ids, attn = torch.cat([ids, ids[:, :4]], 1), torch.cat([attn, torch.ones(3, 4, dtype=attn.dtype)], 1)
    runs = []
    hook = model.get_output_embeddings().register_forward_hook(lambda _, x, __: runs.append(len(x[0])))
    with torch.no_grad():
        sample.token_logprobs(model, ids, attn, P)
    hook.remove()
    assert runs == [5, 5, 2]  # 3 rows x 4 response tokens


class CastsOfWeights(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the bf16 copies made of each parameter (autocast's casts reach the dispatcher as _to_copy)."""

    def __init__(self, model):
        super().__init__()
        self.names = {p.data_ptr(): n for n, p in model.named_parameters()}
        self.count = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and kwargs.get("dtype") == torch.bfloat16:
            name = self.names.get(args[0].data_ptr())
            if name is not None:
                self.count[name] = self.count.get(name, 0) + 1
        return func(*args, **kwargs)


def test_one_autocast_region_per_update_casts_each_weight_once_with_the_same_gradients(base):
    # train.update runs an update's micro-batches in one bf16 autocast region, each loss and backward with autocast
    # off inside it: autocast keeps its copy of a weight until its outermost region ends, so each weight is cast
    # once an update, not once a micro-batch (and again for the output layer's recomputation in the backward: on a
    # CPU, where the backward runs on this thread; CUDA's runs on a thread of its own, with its own cache).
    # The gradients must be those of a region per micro-batch: the same bf16 copies, made once. This loop is the
    # test's own: it checks torch's behaviour train.update relies on (a torch that cleared the cache inside the region,
    # or gave a cached copy a stale gradient, fails it); tests/test_train.py checks train.update itself.
    model, tok = base
    torch.manual_seed(0)
    out = sample.generate(model, prompts(tok, 4, seed=5), n=2, max_new_tokens=12, temperature=1.0,
                          eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    ids, attn, P, m = out["input_ids"], out["attention_mask"], out["prompt_len"], out["response_mask"].float()

    def update(one_region: bool):
        model.zero_grad(set_to_none=True)
        with CastsOfWeights(model) as casts, (sample.autocast("cpu", True) if one_region else nullcontext()):
            for mb in (torch.arange(0, 4), torch.arange(4, 8)):  # two micro-batches of two groups each
                with sample.autocast("cpu", True):
                    logp = sample.token_logprobs(model, ids[mb], attn[mb], P, 1.0, chunk_tokens=5,
                                                 groups=mb // 2)  # [4, T]
                with sample.autocast("cpu", False):
                    (logp * m[mb]).sum().backward()
        return grads_of(model), casts.count

    per_micro_batch, casts_apart = update(False)
    one_region, casts_once = update(True)
    model.zero_grad(set_to_none=True)
    cast = {n for n, _ in model.named_parameters() if "norm" not in n}  # the products' (the output layer is tied)
    assert set(casts_once) == set(casts_apart) == cast, (set(casts_once) ^ cast, set(casts_apart) ^ cast)
    assert all(c == 1 for c in casts_once.values()), casts_once
    assert all(c >= 2 for c in casts_apart.values()), casts_apart
    assert_grads_close(one_region, per_micro_batch, rel=1e-6, what="one autocast region")
