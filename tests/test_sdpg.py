"""SDPG, P1-P4 of EQUATIONS.md#sdpg: each equation on numbers checked by hand, the loss term in train.update."""
import json
import math

import pytest
import torch

import data
import grpo
import methods
import sample
import sdpg
from config import training


def test_p2_the_full_vocabulary_kl_on_three_tokens_and_its_gradient():
    # p = softmax([0, 0, ln 2]) = [1/4, 1/4, 1/2]; q = [1/2, 1/4, 1/4]
    # KL = 1/4 ln(1/2) + 1/4 ln 1 + 1/2 ln 2 = ln(2) / 4 = 0.173287
    logits = torch.tensor([0.0, 0.0, math.log(2)], requires_grad=True)
    q = torch.log(torch.tensor([0.5, 0.25, 0.25]))
    kl = sdpg.token_kl(logits, q)
    assert abs(kl.item() - math.log(2) / 4) < 1e-6
    kl.backward()
    # dKL/dz_j = p_j (log p_j - log q_j - KL): log p - log q = [-ln 2, 0, ln 2] = [-0.693147, 0, 0.693147]
    # minus 0.173287 -> [-0.866434, -0.173287, 0.519860]; times p -> [-0.216609, -0.043322, 0.259930]
    assert torch.allclose(logits.grad, torch.tensor([-0.216609, -0.043322, 0.259930]), atol=1e-5)
    assert q.grad is None  # the teacher is a constant


def test_p2_the_temperature_divides_the_students_logits_and_the_kl_is_clamped():
    q = torch.log(torch.tensor([0.5, 0.25, 0.25]))
    # logits [0, 0, 2 ln 2] at temperature 2 are [0, 0, ln 2] at 1: the same KL, ln(2) / 4
    assert abs(sdpg.token_kl(torch.tensor([0.0, 0.0, 2 * math.log(2)]), q, temperature=2.0).item()
               - math.log(2) / 4) < 1e-6
    # p = one-hot on a token the teacher gives e^-30: KL = 30 > 20, clamped, and no gradient through the clamp
    logits = torch.tensor([100.0, 0.0, 0.0], requires_grad=True)
    kl = sdpg.token_kl(logits, torch.tensor([-30.0, -1e-9, -30.0]))
    kl.backward()
    assert kl.item() == sdpg.KL_MAX and torch.all(logits.grad == 0)


def test_p3_the_four_regularisers_and_urkls_gradient():
    # alpha 0.002, r = logp - ref = -0.1:
    # urkl 0.001 x 0.01 = 1e-5; rkl 0.001 x 0.9^2 = 8.1e-4; fkl 0.002 e^0.1 = 0.00221034; ufkl 0.002 (1.10517 - 0.1)
    # = 0.00201034
    logp, ref = torch.tensor([[-1.1]], requires_grad=True), torch.tensor([[-1.0]])
    want = {"urkl": 1e-5, "rkl": 8.1e-4, "fkl": 0.00221034, "ufkl": 0.00201034}
    for mode, value in want.items():
        assert abs(sdpg.regulariser(logp, ref, 0.002, mode).item() - value) < 1e-8, mode
    sdpg.regulariser(logp, ref, 0.002, "urkl").sum().backward()
    assert abs(logp.grad.item() - (-2e-4)) < 1e-9  # alpha r = 0.002 x -0.1
    with pytest.raises(ValueError, match="kl"):
        sdpg.regulariser(logp, ref, 0.002, "kl")


def test_p4_betas_warm_up_and_decay():
    assert sdpg.beta_at(5, 1e-3) == 1e-3  # no schedule
    assert sdpg.beta_at(5, 1e-3, warmup=10) == pytest.approx(5e-4)  # 1e-3 x 5 / 10
    assert sdpg.beta_at(10, 1e-3, warmup=10) == 1e-3  # warm
    assert sdpg.beta_at(95, 1e-3, decay=10, total=100) == pytest.approx(5e-4)  # 1e-3 x (100 - 95) / 10
    assert sdpg.beta_at(89, 1e-3, decay=10, total=100) == 1e-3  # before the decay starts at 90
    assert sdpg.beta_at(100, 1e-3, decay=10, total=100) == 0.0
    assert sdpg.beta_at(2, 1e-3, warmup=4, decay=10, total=10) == pytest.approx(1e-3 * 2 / 4 * 8 / 10)  # both


def test_p4_the_per_token_loss_and_the_positive_only_gate():
    kl, reg = torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[0.1, 0.1, 0.1]])
    adv = torch.tensor([[0.5, -0.5, 0.0]])
    # beta 0.5: [0.5, 1, 1.5] + 0.1 = [0.6, 1.1, 1.6]; positive only: [0.5, 0, 0] + 0.1 = [0.6, 0.1, 0.1]
    assert torch.allclose(sdpg.per_token(kl, reg, adv, 0.5), torch.tensor([[0.6, 1.1, 1.6]]))
    assert torch.allclose(sdpg.per_token(kl, reg, adv, 0.5, positive_only=True), torch.tensor([[0.6, 0.1, 0.1]]))


@pytest.mark.parametrize("chunk", [1, 3, 100])
def test_p2_in_chunks_equals_the_whole_logits_values_and_gradients(chunk):
    torch.manual_seed(0)
    head = torch.nn.Linear(5, 7, bias=False)
    hs = torch.randn(2, 3, 5, requires_grad=True)
    ht = torch.randn(2, 3, 5)
    whole = sdpg.token_kl(head(hs), torch.log_softmax(head(ht) / 0.7, -1), 0.7)  # [2, 3]
    (whole * torch.arange(6.0).view(2, 3)).sum().backward()
    want_h, want_w = hs.grad.clone(), head.weight.grad.clone()
    hs.grad, head.weight.grad = None, None
    got = sdpg.chunked_token_kl(head, hs, ht, 0.7, chunk)
    (got * torch.arange(6.0).view(2, 3)).sum().backward()
    assert torch.allclose(got, whole, atol=1e-6)
    assert torch.allclose(hs.grad, want_h, atol=1e-6) and torch.allclose(head.weight.grad, want_w, atol=1e-6)


def test_the_loss_term_is_aggregated_as_the_surrogate_and_added_to_the_loss():
    logp = torch.zeros(2, 2, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    extra = torch.tensor([[1.0, 2.0], [3.0, 9.0]])  # the masked 9 never counts
    base, _ = grpo.policy_loss(logp, torch.zeros(2, 2), torch.zeros(2, 2), mask, agg="token-mean")
    loss, stats = grpo.policy_loss(logp, torch.zeros(2, 2), torch.zeros(2, 2), mask, agg="token-mean", extra=extra)
    # token-mean of the term: (1 + 2 + 3) / 3 = 2; seq-mean-token-mean: (1.5 + 3) / 2 = 2.25
    assert loss.item() - base.item() == pytest.approx(2.0) and stats["loss_term"] == pytest.approx(2.0)
    _, stats = grpo.policy_loss(logp, torch.zeros(2, 2), torch.zeros(2, 2), mask, extra=extra)
    assert stats["loss_term"] == pytest.approx(2.25)


def test_the_method_grammar_and_sdpgs_surrogate_defaults():
    assert methods.parse("sdpg") == ("dapo", "none", "sdpg")  # the released recipe is DAPO's
    assert methods.parse("grpo+sdpg") == ("grpo", "none", "sdpg")
    assert methods.parse("dapo+ktae+sdpg") == ("dapo", "ktae", "sdpg")
    for bad in ("sdpg+ktae", "sdpg+sdpg", "ktae+oar-p"):
        with pytest.raises(ValueError, match=bad.replace("+", r"\+")):
            methods.parse(bad)
    a = training.parse_args(["--method", "sdpg"])
    assert (a.dual_clip, a.eps_high, a.agg, a.dynamic_sampling, a.reference) == (10.0, 0.28, "token-mean", True, True)
    g = training.parse_args(["--method", "grpo+sdpg", "--dual-clip", "3", "--sdpg-alpha", "0"])
    assert (g.dual_clip, g.eps_high, g.reference) == (3.0, None, False)  # a flag given wins; alpha 0 reads no reference
    assert training.parse_args(["--method", "ktae"]).term is None


def test_a_terms_knob_is_refused_elsewhere_and_checked():
    with pytest.raises(SystemExit, match="--sdpg-beta 0.1: a flag of sdpg, which --method ktae does not use"):
        training.parse_args_one_line(["--method", "ktae", "--sdpg-beta", "0.1"])
    with pytest.raises(SystemExit, match="--sdpg-alpha -1"):
        training.parse_args_one_line(["--method", "sdpg", "--sdpg-alpha", "-1"])


def test_the_teacher_reads_the_released_context_after_the_question():
    class Plain:  # a tokenizer without a chat template: build_prompt's plain form
        chat_template = None
    got = data.dataset("gsm8k").teacher_prompt(Plain(), {"question": "How many?", "answer": "42"}, sdpg.HINT)
    assert "How many?\n\nThe correct answer to this problem is: 42\nUse this to verify your reasoning" in got
    q = {"question": "7+8-9", "answer": "6"}  # the tiny world keeps its own form
    assert data.dataset("tiny").teacher_prompt(None, q, sdpg.HINT) == "Q:7+8-9=?\\boxed{6}\nA:"


def test_the_memory_plan_counts_the_teacher_and_the_kl_chunk():
    from infra import memory, models
    args = training.parse_args(["--method", "sdpg"])
    cfg = models.load_config(args.model)
    plain = memory.memory_plan(cfg, **memory.plan_settings(args, 16))
    plan = memory.memory_plan(cfg, **memory.plan_settings(args, 16, loss_term="full-vocabulary KL"))
    added = {k: v for k, v in plan["training forward and backward"].items()
             if k not in plain["training forward and backward"]}
    # the tiny model: V = 28, H = 128; the micro-batch's chunk min(chunk, 64 rows x 48 tokens) = 3072 tokens
    # KL chunk: 3072 x 28 x 4 x 4 bytes = 1,376,256; the teacher's states: 64 x 48 x 128 x 4 = 1,572,864
    assert added[next(k for k in added if k.startswith("the KL's"))] == 1_376_256
    assert added[next(k for k in added if k.startswith("its last hidden"))] == 1_572_864
    assert any("reference model" in k for k in plan["sampling"])  # P3's reference (alpha > 0)


def _kl(model, batch, prompts, pad_id, temperature=1.0):
    """P2's token-mean KL over the batch's response tokens, as the update computes it."""
    P, T = batch["prompt_len"], batch["input_ids"].shape[1] - batch["prompt_len"]
    hidden = []
    sample.token_logprobs(model, batch["input_ids"], batch["attention_mask"], P, temperature, hidden_out=hidden)
    teacher = sdpg.teacher_hidden(model, prompts, batch["input_ids"][:, P:], batch["attention_mask"][:, P:], pad_id)
    kl = sdpg.chunked_token_kl(model.get_output_embeddings(), hidden[0], teacher, temperature, 7)  # [N, T]
    m = batch["response_mask"].float()
    return (kl * m).sum() / m.sum()


def test_p2s_teacher_reading_the_students_own_prompt_is_the_student(base):
    model, tok = base
    torch.manual_seed(0)
    prompts = ["Q:7+8-9=?\nA:", "Q:1+2=?\nA:"]
    batch = sample.generate(model, [tok(p)["input_ids"] for p in prompts], n=2, max_new_tokens=12, temperature=1.0,
                            eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    own = [tok(p)["input_ids"] for p in prompts for _ in range(2)]
    assert abs(_kl(model, batch, own, tok.pad_token_id).item()) < 1e-5  # the same distribution: KL 0
    shown = [tok("Q:7+8-9=?\\boxed{6}\nA:")["input_ids"]] * 2 + [tok("Q:1+2=?\\boxed{3}\nA:")["input_ids"]] * 2
    assert _kl(model, batch, shown, tok.pad_token_id).item() > 0.01  # shown the answer, the teacher differs


def test_an_update_on_the_term_alone_brings_the_student_nearer_the_teacher(base):
    """train.update with every advantage 0 (GRPO's surrogate adds nothing) and SDPG's term: the step's gradient is
    the KL's, so it lowers the KL to the teacher's distributions as they were before the step (the teacher being
    the same network, it moves too: that is self-distillation, and not what this checks)."""
    import copy
    import train
    from infra import memory
    model, tok = copy.deepcopy(base[0]), base[1]
    problems = [{"question": "7+8-9", "answer": "6", "prompt": "Q:7+8-9=?\nA:"},
                {"question": "1+2", "answer": "3", "prompt": "Q:1+2=?\nA:"}]
    torch.manual_seed(0)
    batch = sample.generate(model, [tok(p["prompt"])["input_ids"] for p in problems], n=4, max_new_tokens=12,
                            temperature=1.0, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    args = training.parse_args(["--method", "grpo+sdpg", "--group-size", "4", "--sdpg-beta", "1", "--sdpg-alpha",
                                "0", "--temperature", "1"])
    term = methods.term_step(args, batch, methods.Context(args, model, tok, problems))
    P, m, head = batch["prompt_len"], batch["response_mask"].float(), model.get_output_embeddings()
    with torch.no_grad():
        teacher = torch.log_softmax(head(sdpg.teacher_hidden(model, term[1]["prompts"], batch["input_ids"][:, P:],
                                                             batch["attention_mask"][:, P:], tok.pad_token_id)), -1)

    def kl_to_that_teacher():
        with torch.no_grad():
            h = []
            sample.token_logprobs(model, batch["input_ids"], batch["attention_mask"], P, 1.0, hidden_out=h)
            return float((sdpg.token_kl(head(h[0]), teacher) * m).sum() / m.sum())
    before = kl_to_that_teacher()
    stats = train.update(args, model, torch.optim.SGD(model.parameters(), lr=0.01), batch, torch.zeros_like(m), m,
                         None, 0, memory.Peaks("cpu", 0), term)
    assert stats["sdpg_kl"] == pytest.approx(before, rel=1e-4)  # the update read the same KL
    after = kl_to_that_teacher()
    # lr 0.01 after grad_clip's norm 1: 1.0978 -> 1.0540 measured (lr 0.001: 1.0929; a step away from it: up)
    assert after < 0.97 * before, (before, after)


def test_trl_refuses_a_loss_term_in_one_line():
    from scaling import trl_grpo
    with pytest.raises(SystemExit, match="--method sdpg: its loss term"):
        trl_grpo.rule_args("sdpg", group_size=4, max_new_tokens=16, device="cpu")
