"""RLSD, L1-L4 of EQUATIONS.md#rlsd: each equation on numbers checked by hand, the teacher on the tiny model."""
import pytest
import torch

import data
import grpo
import methods
import rlsd
import sample
from config import training


def test_l2_the_teachers_log_probability_minus_the_samplers_on_the_scored_tokens():
    # [-1 - (-2), -3 - (-1), masked] = [1, -2, 0]
    got = rlsd.evidence(torch.tensor([[-1.0, -3.0, -5.0]]), torch.tensor([[-2.0, -1.0, -0.5]]),
                        torch.tensor([[1.0, 1.0, 0.0]]))
    assert torch.equal(got, torch.tensor([[1.0, -2.0, 0.0]]))


def test_l3_the_sign_is_the_advantages_and_the_size_is_clipped():
    delta = torch.tensor([[0.5, 0.0, -0.1, -1.0]] * 3)
    w = rlsd.weights(delta, torch.tensor([-0.8, 0.8, 0.0]), torch.ones(3, 4), eps=0.2)
    # wrong (A < 0): exp(-delta) = [0.6065, 1, 1.1052, 2.7183] -> [0.8, 1, 1.1052, 1.2]
    # right (A > 0): exp(delta) = [1.6487, 1, 0.9048, 0.3679] -> [1.2, 1, 0.9048, 0.8]; A = 0: exp(0) = 1
    assert torch.allclose(w, torch.tensor([[0.8, 1, 1.1052, 1.2], [1.2, 1, 0.9048, 0.8], [1, 1, 1, 1]]), atol=1e-4)
    assert rlsd.weights(delta[:1], torch.tensor([-0.8]), torch.tensor([[1.0, 1, 1, 0]]))[0, 3] == 0  # off the mask


def test_l4_the_advantage_scaled_never_flipped_and_the_losss_gradient():
    w = torch.tensor([[0.8, 1.0, 1.1052, 1.2]], requires_grad=True)
    # lambda 1: -0.8 w = [-0.64, -0.8, -0.8842, -0.96]; lambda 0.5: -0.8 (0.5 + 0.5 w) = [-0.72, -0.8, -0.8421, -0.88]
    adv = rlsd.token_advantages(torch.tensor([-0.8]), w, torch.ones(1, 4))
    assert torch.allclose(adv, torch.tensor([[-0.64, -0.8, -0.88416, -0.96]])) and not adv.requires_grad
    half = rlsd.token_advantages(torch.tensor([-0.8]), w, torch.ones(1, 4), lam=0.5)
    assert torch.allclose(half, torch.tensor([[-0.72, -0.8, -0.84208, -0.88]]))
    assert (adv < 0).all()  # the direction stays the verifier's: w >= 1 - eps > 0
    # at rho = 1 the seq-mean-token-mean loss's gradient is -A_t / (N |o_i|) = -A_t / 4: the teacher only scales it
    logp = torch.zeros(1, 4, requires_grad=True)
    loss, _ = grpo.policy_loss(logp, torch.zeros(1, 4), adv, torch.ones(1, 4))
    loss.backward()
    assert torch.allclose(logp.grad, -adv / 4)


def test_each_datasets_teacher_reads_the_gold_answer():
    q = {"question": "7+8-9", "answer": "6"}
    assert data.dataset("tiny").teacher_prompt(None, q, rlsd.HINT) == "Q:7+8-9=?\\boxed{6}\nA:"
    assert data.dataset("chain").teacher_prompt(None, q, rlsd.HINT) == "Q:7+8-9=?\\boxed{6}\nA:"

    class Plain:  # a tokenizer without a chat template: the question, then the papers' instruction
        chat_template = None
    got = data.dataset("gsm8k").teacher_prompt(Plain(), {"question": "How many?", "answer": "42"}, rlsd.HINT)
    assert got == f"How many?\n\nThe reference answer is 42.\n{data.INSTRUCTION}\n"


def _batch(model, tok, prompts, n):
    torch.manual_seed(0)
    return sample.generate(model, [tok(p)["input_ids"] for p in prompts], n=n, max_new_tokens=20, temperature=1.0,
                           eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)


def test_l1_the_teacher_is_the_same_models_forward_after_its_own_prompt(base):
    model, tok = base
    batch = _batch(model, tok, ["Q:7+8-9=?\nA:", "Q:1+2=?\nA:"], 2)
    P, resp = batch["prompt_len"], batch["input_ids"][:, batch["prompt_len"]:]
    # the student's own prompt as the teacher's: the sampler's log-probs again (delta 0: RLSD is GRPO)
    own = [tok("Q:7+8-9=?\nA:")["input_ids"]] * 2 + [tok("Q:1+2=?\nA:")["input_ids"]] * 2
    got = rlsd.teacher_logprobs(model, batch, own, torch.arange(4), tok.pad_token_id, 1.0, 3, 2)
    m = batch["response_mask"].float()
    assert torch.allclose(got * m, batch["logprobs"] * m, atol=1e-4)
    # a privileged prompt: one plain forward of each row alone gives the same numbers
    teacher = tok("Q:7+8-9=?\\boxed{6}\nA:")["input_ids"]
    got = rlsd.teacher_logprobs(model, batch, [teacher] * 4, torch.tensor([1]), tok.pad_token_id, 1.0, 3, 2)
    ids = torch.cat([torch.tensor([teacher]), resp[1:2]], 1)
    alone = sample.token_logprobs(model, ids, torch.cat([torch.ones(1, len(teacher), dtype=torch.long),
                                                         batch["attention_mask"][1:2, P:]], 1), len(teacher))
    assert torch.allclose(got * m[1], alone * m[1], atol=1e-5)


def test_the_rule_asks_the_teacher_shown_the_answer_and_blames_its_doubt(base):
    model, tok = base
    problems = [{"question": "7+8-9", "answer": "6", "prompt": "Q:7+8-9=?\nA:"},
                {"question": "1+2", "answer": "3", "prompt": "Q:1+2=?\nA:"}]
    batch = _batch(model, tok, [p["prompt"] for p in problems], 4)
    rewards = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])  # the second group: A_i = 0
    mask = batch["response_mask"].float()
    args = training.parse_args(["--method", "rlsd", "--group-size", "4"])
    got = methods.RULES["rlsd"].advantages(batch, rewards, mask, methods.Context(args, model, tok, problems))
    assert got.values[:4].abs().max() > 0.01  # the teacher, shown "\boxed{6}", differs from the student
    assert torch.equal(got.values[4:], torch.zeros_like(got.values[4:]))  # no advantage, no teacher
    w = rlsd.weights(got.values, got.seq, mask, args.rlsd_eps)
    assert torch.allclose(got.tokens, rlsd.token_advantages(got.seq, w, mask))
    assert torch.equal(torch.sign(got.tokens), torch.sign(got.seq)[:, None] * mask)  # the sign is the verifier's
    # blame: -delta, where the teacher finds the token less likely than the student did
    assert torch.equal(methods.RULES["rlsd"].blame(got, batch, mask, args), -got.values)


@pytest.mark.parametrize("flags, message", [(["--rlsd-eps", "1"], "--rlsd-eps 1"),
                                            (["--rlsd-lambda", "-0.5"], "--rlsd-lambda -0.5")])
def test_bad_settings_are_one_line_naming_the_flag(flags, message):
    with pytest.raises(SystemExit, match=message):
        training.parse_args_one_line(["--method", "rlsd", *flags])


@pytest.mark.parametrize("rule", ["shear", "rlsd"])
def test_the_memory_plan_counts_the_rules_own_forward(rule):
    from infra import memory, models
    args = training.parse_args(["--method", rule])
    settings = memory.plan_settings(args, 16, methods.RULES[rule].memory_phase)
    assert settings["forward_once"] and settings["oar_chunk"] == 0  # not OAR's chunked scoring
    plan = memory.memory_plan(models.load_config(args.model), **settings)
    without = memory.memory_plan(models.load_config(args.model), **{**settings, "forward_once": False})
    assert "advantage" in plan and "advantage" not in without  # GRPO's step has no such phase


def test_each_rules_plan_counts_only_what_its_forward_keeps():
    """SHEAR keeps hidden states, RLSD's teacher an output-layer chunk: each plan holds its own term, not the other's
    (counting both over-planned SHEAR's advantage phase at 1.5B: 10.66 GiB planned, 7.45 measured, docs/gpu.md)."""
    from infra import memory, models
    args = training.parse_args(["--method", "shear"])  # the tiny model: H = 128, V = 28; 16 x 8 = 128 rollouts
    cfg = models.load_config(args.model)
    plans = {rule: memory.memory_plan(cfg, **memory.plan_settings(args, 16, methods.RULES[rule].memory_phase))
             ["advantage"] for rule in ("shear", "rlsd")}
    kept = {rule: {k: v for k, v in plan.items() if k.startswith("its ")} for rule, plan in plans.items()}
    # SHEAR: 128 rows x 48 tokens x 128 x 4 bytes = 3,145,728
    assert list(kept["shear"].values()) == [3_145_728] and "hidden states" in next(iter(kept["shear"]))
    # RLSD: min(chunk, 64 rows x 48 tokens = 3072) tokens x 28 ids x 3 buffers x 4 bytes = 1,032,192
    assert list(kept["rlsd"].values()) == [1_032_192] and "output layer" in next(iter(kept["rlsd"]))
    # a step of fewer rollouts than a micro-batch: 8 rows x 48 tokens = 384 tokens x 28 x 3 x 4 = 129,024 (the plan
    # took 64 rows' worth, and over-planned RLSD's advantage phase at 1.5B: 10.66 GiB planned, 8.34 measured)
    few = memory.memory_plan(cfg, **{**memory.plan_settings(args, 16, "logits"), "rollouts": 8})["advantage"]
    assert [v for k, v in few.items() if k.startswith("its ")] == [129_024]
