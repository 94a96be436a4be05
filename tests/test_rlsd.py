"""RLSD, L1-L5 of EQUATIONS.md#rlsd: each equation on numbers checked by hand, the teacher on the tiny model."""
import copy
import os

import pytest
import torch

import data
import grpo
import methods
import rlsd
import sample
import train
from config import training
from infra import checkpoint, memory, models
from toyworld import tiny


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
    # the released template (teacher_hint_self_distill.jinja) up to "below.", the gold answer as its hint; its
    # <thought>/<answer> sentence left out, the dataset's own instruction asking for the box instead
    got = data.dataset("gsm8k").teacher_prompt(Plain(), {"question": "How many?", "answer": "42"}, rlsd.HINT)
    assert got == ("How many?\n\nHere is a reference solution:\n42\n\nAfter understanding the reference solution, "
                   f"please try to solve this problem using your own approach below.\n{data.INSTRUCTION}\n")


@pytest.mark.parametrize("problem", [{"question": "How many?", "where": "q.jsonl:3"},
                                     {"question": "How many?", "answer": "  ", "where": "q.jsonl:3"}])
def test_a_problem_without_a_gold_answer_has_no_teachers_prompt(problem):
    with pytest.raises(ValueError, match=r"^q\.jsonl:3: no reference answer for the teacher's prompt"):
        data.dataset("gsm8k").teacher_prompt(None, problem, rlsd.HINT)
    with pytest.raises(ValueError, match="no reference answer"):  # the tiny world's own form reads it too
        data.dataset("tiny").teacher_prompt(None, problem, rlsd.HINT)


def test_a_training_set_without_gold_answers_stops_before_the_model_loads(tmp_path, monkeypatch):
    # the loader skips a row with no answer or an empty one, so no problem without one reaches the teacher; a set of
    # only such rows stops in one line where the data are read, before train.py loads the model
    monkeypatch.setattr(data, "INSTRUCTION", "")  # the tiny tokenizer cannot write the papers' instruction
    path = tmp_path / "bare.jsonl"
    path.write_text('{"question": "1+2=?"}\n{"question": "3+4=?", "answer": ""}\n')
    with pytest.raises(SystemExit) as e:
        data.run_problems(str(path), "tiny", tiny.build_tokenizer())
    assert str(e.value.code) == f"--dataset {path}: no usable problem"


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
    # the first step's lambda (L5): 0.5 (1 - 1/60)
    assert torch.allclose(got.tokens, rlsd.token_advantages(got.seq, w, mask, 0.5 * 59 / 60))
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


def test_l5_lambda_decays_from_the_first_step_as_released():
    # the released trainer's global step g is 1 at the first batch: g = step + 1, lambda = 0.5 max(1 - g / 60, 0)
    assert rlsd.lambda_at(0, 0.5, 0, 60) == pytest.approx(0.5 * 59 / 60)  # 0.49167
    assert rlsd.lambda_at(29, 0.5, 0, 60) == pytest.approx(0.25)  # g = 30: half way
    assert rlsd.lambda_at(59, 0.5, 0, 60) == 0.0  # g = 60: RLSD is GRPO from here on
    assert rlsd.lambda_at(100, 0.5, 0, 60) == 0.0  # never below 0
    # a warm-up of 4: g = 2 -> 0.5 * 2 / 4 = 0.25; g = 4 ends it, the decay counting from there: 0.5 (1 - 0 / 60)
    assert rlsd.lambda_at(1, 0.5, 4, 60) == 0.25 and rlsd.lambda_at(3, 0.5, 4, 60) == 0.5
    assert rlsd.lambda_at(1000, 1.0, 0, 0) == 1.0  # the former variant, an ablation: lambda 1 throughout


def test_l1_the_teacher_is_the_copy_of_the_last_sync():
    # a model of one trained weight and one frozen one; each "step" adds 1 to the trained weight, so the policy after
    # s steps holds s, and the teacher of the batch after s steps holds synced_at(s): 0 for s < 20, 20 for 20..39, 40
    model = torch.nn.Sequential(torch.nn.Linear(1, 1, bias=False), torch.nn.Linear(1, 1, bias=False))
    torch.nn.init.zeros_(model[0].weight)
    model[1].weight.requires_grad_(False)  # as LoRA's frozen base: not copied
    state, seen = {}, []
    for step in range(45):
        with rlsd.teacher(model, state, step, 20) as t:
            seen.append(t[0].weight.item())
        assert model[0].weight.item() == step  # the live weight is back after the teacher's forward
        with torch.no_grad():
            model[0].weight += 1
    assert seen == [0.0] * 20 + [20.0] * 20 + [40.0] * 5
    assert list(state["weights"]) == ["0.weight"] and state["synced_at"] == 40  # what trains, and only that
    assert [rlsd.synced_at(s, 20) for s in (0, 19, 20, 39, 40)] == [0, 0, 20, 20, 40]
    with rlsd.teacher(model, state, 45, 0) as t:  # every 0: the live policy, nothing copied
        assert t[0].weight.item() == 45 and t is model


def _rlsd_batch(model, tok):
    problems = [{"question": "7+8-9", "answer": "6", "prompt": "Q:7+8-9=?\nA:"},
                {"question": "1+2", "answer": "3", "prompt": "Q:1+2=?\nA:"}]
    batch = _batch(model, tok, [p["prompt"] for p in problems], 4)
    return problems, batch, torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0]]), batch["response_mask"].float()


def test_the_rule_reads_the_frozen_copy_between_syncs(base):
    model, tok = copy.deepcopy(base[0]), base[1]  # its weights are moved below
    problems, batch, rewards, mask = _rlsd_batch(model, tok)
    args, state = training.parse_args(["--method", "rlsd", "--group-size", "4"]), {}  # K = 20
    rule = methods.RULES["rlsd"].advantages
    evidence = lambda step, st, a=args: rule(batch, rewards, mask, methods.Context(  # noqa: E731
        a, model, tok, problems, step=step, state=st)).values  # [N, T] L2, the teacher's log-probs less the sampler's
    at_sync = evidence(20, state)  # step 20 is a sync: the copy is the policy as it is
    with torch.no_grad():  # an update
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    live = evidence(21, None)  # the moved policy as the teacher
    assert not torch.allclose(live, at_sync, atol=1e-3)
    assert torch.equal(evidence(21, state), at_sync)  # between syncs: the copy of step 20, not the moved policy
    assert torch.equal(evidence(40, state), live)  # the next sync takes the moved policy
    former = training.parse_args(["--method", "rlsd", "--group-size", "4", "--rlsd-lambda", "1",
                                  "--rlsd-decay-steps", "0", "--rlsd-sync-every", "0"])
    assert torch.equal(evidence(21, state, former), live)  # the former variant: the live policy, whatever is kept


@pytest.mark.parametrize("lora", [[], ["--lora-rank", "8"]])
def test_the_dry_run_counts_the_frozen_teacher(lora, capsys):
    # the plan of K = 20 against the live teacher's (K = 0): larger in every phase by the float32 copy of what trains,
    # 4 bytes a weight (the tiny model's every weight; under LoRA the adapters', rank 8 x (in + out) a projection)
    cfg = models.load_config("tiny")
    trains = memory.parameters(cfg, 8)["adapters"] if lora else memory.n_params(cfg)
    frozen = train.main(["--method", "rlsd", "--dry-run", *lora])
    live = train.main(["--method", "rlsd", "--dry-run", "--rlsd-sync-every", "0", *lora])
    assert frozen - live == 4 * trains
    assert "the rule's frozen copy of the " + ("adapters" if lora else "weights") in capsys.readouterr().out
    args = training.parse_args(["--method", "rlsd", *lora])
    assert memory.disk_plan(cfg, args, True)["the rule's frozen copy"] == 4 * trains  # saved between syncs


def test_a_run_resumed_mid_interval_reads_the_teacher_of_one_never_stopped(base, tmp_path):
    # K = 3: the teacher of steps 1-3 is the initial policy. One run goes 2 steps; the other stops after step 1 and is
    # resumed for step 2. Both checkpoints at step 2 must hold the initial policy as the teacher: a resume that lost
    # it would re-take it from the policy after step 1
    flags = ["--method", "rlsd", "--rlsd-sync-every", "3", "--threads", "1", "--prompts-per-step", "4",
             "--group-size", "4", "--eval-limit", "8", "--eval-every", "1000"]
    whole, resumed = str(tmp_path / "whole"), str(tmp_path / "resumed")
    train.main(["--steps", "2", "--save-every", "2", "--run-dir", whole, *flags])
    train.main(["--steps", "1", "--save-every", "1", "--run-dir", resumed, *flags])
    train.main(["--steps", "2", "--save-every", "1", "--resume", "--run-dir", resumed, *flags])
    a, b = (checkpoint.load_state(os.path.join(d, checkpoint.CHECKPOINT))["rule_state"] for d in (whole, resumed))
    assert a["synced_at"] == b["synced_at"] == 0 and a["weights"].keys() == b["weights"].keys()
    assert all(torch.equal(a["weights"][k], b["weights"][k]) for k in a["weights"])
    policy = models.load_model(os.path.join(whole, checkpoint.CHECKPOINT))[0].state_dict()
    assert any(not torch.equal(a["weights"][k], policy[k]) for k in a["weights"])  # the teacher is not the policy
