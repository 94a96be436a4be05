"""Any Hugging Face causal LM samples, scores and trains, not only the Qwen2 / Llama layouts that fastpath.py
writes out. Small random models of four other architectures, with the tiny world's tokenizer so that its task
runs on them:

    qwen3   q/k norms in attention (fastpath.decode_step would skip them)
    gemma2  final logit soft-capping (sample.plain_head is False) and a sliding window of 8 on every other layer
            (fastpath.shares_prompts is False): every plain fallback at once
    phi3    fused qkv_proj and gate_up_proj
    gpt2    learned positions, LayerNorm, Conv1D, other module names

For each: greedy tokens equal model.generate's, sampled log-probs equal the model's own forward (with and without
a shared prompt, gradients too), OAR's scores equal those of the full forward, and one RL step of train.py.
"""
import json
import random

import pytest
import torch
from transformers import (Gemma2Config, Gemma2ForCausalLM, GPT2Config, GPT2LMHeadModel, Phi3Config, Phi3ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)

import methods
import oar
import reward
import sample
import train
from infra import fastpath
from toyworld import tiny
from conftest import alternating_grader, assert_close, record_margin
from test_sample import assert_grads_close, grads_of

ARCHS = ["qwen3", "gemma2", "phi3", "gpt2"]
SIZE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=128)
EOS_SCALE = 4  # the EOS row's size in weight stds: rows of mixed lengths on all four (tried 3 to 12: all mixed)


def build(name: str, tok, init: float = 0.02):
    """A random model of the architecture `name` over the tiny tokenizer's vocabulary, weights of std `init`. The
    EOS row of the output layer is a larger random row, so that greedy rows end at different lengths (a random
    model rarely stops) and finished rows leave the decode batch."""
    ids = dict(initializer_range=init, vocab_size=len(tok), bos_token_id=tok.eos_token_id,
               eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    cls, cfg = {
        "qwen3": (Qwen3ForCausalLM, lambda: Qwen3Config(head_dim=8, **SIZE, **ids)),
        # soft-capping at 2: the capped logits differ from the output layer's by a share of their size
        "gemma2": (Gemma2ForCausalLM, lambda: Gemma2Config(head_dim=8, sliding_window=8, final_logit_softcapping=2.0,
                                                           **SIZE, **ids)),
        "phi3": (Phi3ForCausalLM, lambda: Phi3Config(**SIZE, **ids)),
        "gpt2": (GPT2LMHeadModel, lambda: GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=128, **ids)),
    }[name]
    torch.manual_seed(0)
    model = cls(cfg())
    with torch.no_grad():  # (a tied model's EOS row is the pad's embedding, all zeros: a new random row)
        w = model.get_output_embeddings().weight  # [V, H]
        w[tok.eos_token_id] = EOS_SCALE * w.std() * torch.randn(w.shape[1])
    return model.eval()


@pytest.fixture(scope="module")
def tok():
    return tiny.build_tokenizer()


@pytest.fixture(scope="module")
def models_(tok):
    return {name: build(name, tok) for name in ARCHS}


def prompts(tok, n, seed=0):
    qs = tiny.train_problems(random.Random(seed), n, set())
    return [tok(tiny.prompt(q))["input_ids"] for q in qs]  # different lengths -> left padding


def test_the_archs_take_the_plain_paths(models_):
    # what the other tests rely on: none is written out, Gemma2 is neither a plain head nor a shareable cache
    assert not any(fastpath.decodes(m) for m in models_.values())
    assert [sample.plain_head(models_[a]) for a in ARCHS] == [True, False, True, True]
    assert [fastpath.shares_prompts(models_[a]) for a in ARCHS] == [True, False, True, True]


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_tokens_equal_model_generate(models_, tok, arch):
    model, ps = models_[arch], prompts(tok, 8)
    ours = sample.generate(model, ps, max_new_tokens=24, temperature=0.0, eos_id=tok.eos_token_id,
                           pad_id=tok.pad_token_id)
    ids, mask = sample.left_pad(ps, tok.pad_token_id)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=24, do_sample=False,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)[:, ids.shape[1]:]
    P, lengths = ours["prompt_len"], ours["response_mask"].sum(-1)
    assert len(set(lengths.tolist())) > 1, "rows of different lengths: some leave the decode batch early"
    for i in range(len(ps)):
        assert ours["input_ids"][i, P:P + lengths[i]].tolist() == ref[i, :lengths[i]].tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_sampled_logprobs_equal_the_models_forward(models_, tok, arch):
    # The sampler's log-probs and entropies, and token_logprobs' log-probs and gradients (with a shared prompt
    # where the architecture allows one), against log_softmax of the model's own logits over all columns.
    model = models_[arch]
    torch.manual_seed(0)
    out = sample.generate(model, prompts(tok, 4, seed=1), n=3, max_new_tokens=20, temperature=0.7,
                          eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    ids, attn, P, m = out["input_ids"], out["attention_mask"], out["prompt_len"], out["response_mask"]
    assert len(set(m.sum(-1).tolist())) > 1
    logits = model(input_ids=ids, attention_mask=attn, position_ids=sample.position_ids(attn)).logits[:, P - 1:-1]
    full = torch.log_softmax(logits / 0.7, -1)  # [N, T, V]
    ref = full.gather(-1, ids[:, P:, None]).squeeze(-1)  # [N, T]
    # margin: the two paths used 0.036 of the tolerance at worst (this project's CPU, 2026-11-25; TEST_MARGINS)
    assert_close(out["logprobs"], (ref * m).detach(), rel=1e-5, what="sampled log-probs")
    assert_close(out["entropy"], (-(full.exp() * full).sum(-1) * m).detach(), rel=1e-5, what="entropies")
    (ref * m).sum().backward()
    ref_grads = grads_of(model)
    model.zero_grad(set_to_none=True)
    logp = sample.token_logprobs(model, ids, attn, P, 0.7, groups=torch.arange(len(ids)) // 3)
    (logp * m).sum().backward()
    assert_close(logp * m, (ref * m).detach(), rel=1e-5, what="token_logprobs")
    assert_grads_close(grads_of(model), ref_grads, rel=1e-5, what=arch)
    model.zero_grad(set_to_none=True)


def propagated(scores: torch.Tensor, delta: torch.Tensor, reason: torch.Tensor) -> torch.Tensor:
    """How far a score difference `delta` [n, L] can move the weights O4-O5 make of `scores` [n, L], to first order,
    doubled: 2 |J| |delta|, J the Jacobian of reshape(normalise(.)) at `scores` (in float64). O4 divides by each row's
    score range, so a difference in the scores comes out larger in the weights, by as much as that range is small:
    a fixed tolerance on the weights would pass or fail with the model's scores, not with the code."""
    f = lambda s: oar.reshape(oar.normalise(s, reason), reason)  # noqa: E731
    J = torch.autograd.functional.jacobian(f, scores.double())  # [n, L, n, L]
    return 2 * torch.einsum("ijkl,kl->ij", J.abs(), delta.abs().double())  # [n, L]


@pytest.mark.parametrize("arch", ["qwen3", "gpt2", "gemma2"])
def test_oar_weights_equal_the_full_forward(tok, arch):
    # OAR-P's and OAR-G's scores and weights with groups (Qwen3, GPT2: the prompts' cache copied to the rows and
    # the model's own forward over the rest; Gemma2: its sliding window refuses the copy, the full forward runs)
    # equal those of the model's own forward over every column, as tests/test_oar.py checks for the tiny model.
    # Weights of std 0.2 instead of 0.02: a sharper model, whose KLs (OAR-P up to 0.2, OAR-G 4e-5 to 8e-4) are not
    # at float32's floor. The scores are compared at a tolerance relative to their scale (OAR-G's KL under noise of
    # 1e-3 cancels, hence its 1e-2); the weights within what the scores' actual difference can move them through
    # O4-O5 (propagated), plus float32's rounding of the weights themselves.
    # Margins, max|diff| / bound on this project's CPU (2026-11-25, TEST_THREADS 2): scores OAR-P 0.16 (gpt2), 0.03
    # (qwen3), OAR-G 0.05, 0.03; weights 0.46-0.50 of the propagated bound, on any CPU alike (the first order is the
    # whole difference, and the bound is twice it); gemma2 0 (one path). Before, the weights had the scores' 1e-4:
    # gpt2's OAR-P weights used 0.52 of it here and 1.005 on another CPU (issue 42).
    model = build(arch, tok, init=0.2)
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompts_ = [enc(tiny.prompt(q)) for q in ("7+8-9", "3+4", "7+8-9", "7+8-9")]
    responses = [enc(r) for r in ("7+8=15\n15-9=6\n", "3+4=7\n", "7+8=16\n", "7+8=15\n15-9=7\n")]
    answers = [enc("6}"), enc("7}"), enc("6}"), enc("6}")]
    ids, attn, reason, probe, P = oar.build_inputs(prompts_, responses, [len(r) for r in responses], enc("\\boxed{"),
                                                   answers, tok.pad_token_id)
    assert P == len(prompts_[0]) > len(prompts_[1])  # row 1's prompt is padded on the left
    groups = torch.tensor([0, 1, 0, 0])
    for name, rel, score in [("OAR-P", 1e-4, lambda **kw: oar.perturbation_scores(
                                 model, ids, attn, reason, probe, tok.pad_token_id, "last", chunk=16, **kw)),
                             ("OAR-G", 1e-2, lambda **kw: oar.gradient_scores(model, ids, attn, reason, probe, **kw)),
                             # and each copy run from its perturbed token on, over its whole row's cache
                             ("OAR-P rows", 1e-4, lambda **kw: oar.perturbation_scores(
                                 model, ids, attn, reason, probe, tok.pad_token_id, "last", chunk=3,
                                 share_rows="forward" in kw, **kw))]:
        torch.manual_seed(0)
        plain = score()
        torch.manual_seed(0)
        shared = score(forward=fastpath.prompt_sharing(model, ids, attn, sample.position_ids(attn), P, groups))
        assert plain.max() > 0 and torch.equal(plain != 0, reason.bool() & (plain != 0))
        # margin: the two paths used 0.5 of the tolerance at worst (this project's CPU, 2026-11-25; TEST_MARGINS)
        assert_close(shared, plain, rel=rel, what=f"{name} scores")
        w_plain, w_shared = (oar.reshape(oar.normalise(s, reason), reason) for s in (plain, shared))
        assert (w_plain[reason.bool()] - 1).abs().max() > 0.1  # the weights reshape something
        bound = propagated(plain, shared - plain, reason) + 4 * torch.finfo(torch.float32).eps * w_plain.abs().max()
        over = (w_shared - w_plain).abs().double() - bound  # [n, L]
        assert over.max() <= 0, f"{name} weights: {over.max():.3g} past the bound the scores' difference allows"
        record_margin(f"{name} weights", ((w_shared - w_plain).abs().double() / bound).max().item())


RL_STEPS = [("gpt2", m) for m in ("grpo", "dapo", "ktae", "dapo+ktae", "oar-p", "oar-g")] + [
    ("gemma2", "grpo"), ("gemma2", "oar-p"), ("gemma2", "oar-g"), ("qwen3", "grpo"), ("qwen3", "ktae"),
    ("phi3", "grpo")]


@pytest.fixture(scope="module")
def model_dirs(models_, tok, tmp_path_factory):
    """Each model saved as a Hugging Face directory (config.json, weights, the tiny tokenizer) for --model."""
    dirs = {}
    for name, model in models_.items():
        dirs[name] = str(tmp_path_factory.mktemp(name))
        model.save_pretrained(dirs[name])
        tok.save_pretrained(dirs[name])
    return dirs


@pytest.mark.parametrize("arch,method", RL_STEPS)
def test_one_rl_step(model_dirs, monkeypatch, tmp_path, arch, method):
    # A random model answers nothing right, so every advantage would be 0 and nothing would run past the sampler:
    # the grader is replaced by one that marks every other rollout right (conftest), which mixes every group (checked).
    monkeypatch.setattr(reward, "is_correct", alternating_grader())
    run_dir = tmp_path / "run"
    train.main(["--model", model_dirs[arch], "--method", method, "--steps", "1", "--prompts-per-step", "2",
                "--group-size", "4", "--max-new-tokens", "16", "--eval-limit", "4", "--threads", "1",
                *(["--oar-cue", "\\boxed{"] if "oar_cue" in {
                    k.dest for k in methods.RULES[methods.parse(method)[1]].knobs} else []),  # OAR's knob, OAR's alone
                "--run-dir", str(run_dir)])
    step = next(r for r in map(json.loads, open(run_dir / "metrics.jsonl")) if "reward_mean" in r)
    assert 0 < step["accuracy"] < 1 and step["nonfinite_updates"] == 0  # right and wrong rollouts
    assert step["grad_norm"] > 0  # an update with a gradient ran: the loss reached the weights


def test_the_disk_plan_counts_what_each_layout_saves(models_):
    # memory.parameters reads Qwen2/Llama fields; the other layouts are counted on a meta-device model. Either way
    # the count is the model's own: GPT-2's c_attn, Gemma2's, Qwen3's and Phi3's weights included.
    from infra import memory
    for name, model in models_.items():
        assert memory.trained_parameters(model.config, 0, ()) == sum(p.numel() for p in model.parameters()), name
    gpt2 = models_["gpt2"]  # LoRA of rank 2 on c_attn: 2 x (in + out) of its [in, out] Conv1D weight each layer
    expected = sum(2 * sum(b.attn.c_attn.weight.shape) for b in gpt2.transformer.h)
    assert memory.trained_parameters(gpt2.config, 2, ("c_attn",)) == expected
