"""sample.py: the sampler against model.generate, and its log-probs against the training forward."""
import random

import pytest
import torch

import sample
import tiny
from conftest import assert_close


def prompts(tok, n, seed=0):
    qs = tiny.train_problems(random.Random(seed), n, set(tiny.eval_problems()))
    return [tok(tiny.prompt(q))["input_ids"] for q in qs]  # different lengths -> left padding


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


def test_sampled_logprobs_equal_the_training_forward(base):
    model, tok = base
    torch.manual_seed(0)
    out = sample.generate(model, prompts(tok, 8, seed=1), n=4, max_new_tokens=40, temperature=1.0,
                          eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    assert len(set(out["response_mask"].sum(-1).tolist())) > 1
    with torch.no_grad():
        logp = sample.token_logprobs(model, out["input_ids"], out["attention_mask"], out["prompt_len"])
    m = out["response_mask"].bool()
    assert_close(logp[m], out["logprobs"][m], rel=1e-5, what="log-probs")


def test_temperature_is_applied_in_both_places(base):
    model, tok = base
    torch.manual_seed(0)
    out = sample.generate(model, prompts(tok, 4, seed=2), n=2, max_new_tokens=40, temperature=0.7,
                          eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    with torch.no_grad():
        logp = sample.token_logprobs(model, out["input_ids"], out["attention_mask"], out["prompt_len"], 0.7)
    m = out["response_mask"].bool()
    assert_close(logp[m], out["logprobs"][m], rel=1e-5, what="log-probs")


def test_eos_stays_in_the_mask_when_pad_is_eos(base):
    model, tok = base
    assert tok.pad_token_id == tok.eos_token_id
    out = sample.generate(model, prompts(tok, 6, seed=3), max_new_tokens=40, temperature=0.0,
                          eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    resp, mask = out["input_ids"][:, out["prompt_len"]:], out["response_mask"]
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
    assert sample.position_ids(torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]


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
    logp = sample.token_logprobs(model, ids, attn, P, 0.7, chunk_tokens=7)
    (logp * m).sum().backward()
    assert_close(logp * m, ref.detach() * m, rel=1e-5, what="log-probs")
    assert_close(out["entropy"], ref_entropy.detach(), rel=1e-5, what="entropies")
    assert_grads_close(grads_of(model), ref_grads, rel=1e-5, what="chunked")
    model.zero_grad(set_to_none=True)


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
    assert_close(shared, plain, rel=1e-5, what="log-probs")
    assert_grads_close(g_shared, g_plain, rel=1e-3, what="float32")
    with pytest.raises(ValueError, match="different prompts"):
        sample.token_logprobs(model, ids, attn, P, groups=torch.zeros(len(ids), dtype=torch.long))


def test_unsupported_layouts_get_a_clear_error():
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=10))
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        sample.generate(model, [[1, 2]], max_new_tokens=2, temperature=0.0, eos_id=0, pad_id=0)
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        sample.logits_after_prompt(model, torch.zeros(1, 2, 8), torch.ones(1, 3, dtype=torch.long), [], torch.zeros(
            1, dtype=torch.long), keep=1)
