"""trl_grpo.py inside TRL 1.16's GRPOTrainer: the advantages it hands to TRL's loss are ours (KTAE, OAR-P, OAR-G,
on a fixed batch), TRL's loss and gradient with them are grpo.policy_loss's, and two CPU processes under torchrun
with a group split between them get the advantages one process gets on the same batch."""
import copy
import os
import random
import shutil
import socket
import subprocess

import pytest
import torch

pytest.importorskip("trl", reason="TRL is optional: pip install -r requirements/trl.txt")

from conftest import THREADS, assert_close  # noqa: E402
import grpo  # noqa: E402
import methods  # noqa: E402
import reward  # noqa: E402
import sample  # noqa: E402
from toyworld import tiny  # noqa: E402
from infra import lora  # noqa: E402
from scaling import trl_grpo, trl_train  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B, G, L = 4, 8, 24  # prompts, rollouts each, max new tokens


@pytest.fixture(scope="module")
def fixed(base):
    """A batch from our sampler (B problems x G rollouts, seed 0) with its rewards, and the tiny model (a copy)."""
    model, tok = copy.deepcopy(base[0]), base[1]
    qs = tiny.train_problems(random.Random(7), B, set())
    problems = [{"prompt": tiny.prompt(q), "answer": tiny.answer(q), "question": q} for q in qs]  # as trl_train's
    torch.manual_seed(0)
    batch = sample.generate(model, [tok(p["prompt"])["input_ids"] for p in problems], n=G, max_new_tokens=L,
                            temperature=1.0, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    texts = tok.batch_decode(batch["input_ids"][:, batch["prompt_len"]:], skip_special_tokens=True)
    golds = [p["answer"] for p in problems for _ in range(G)]
    rewards = torch.tensor([float(reward.is_correct(t, g) is True) for t, g in zip(texts, golds)]).view(B, G)
    assert ((rewards.sum(1) > 0) & (rewards.sum(1) < G)).any(), "no group mixes right and wrong: nothing to compare"
    return model, tok, problems, batch, rewards


def trainer_for(method, model, tok, problems, tmp_path, **cfg):
    """RuleGRPOTrainer on the fixed problems, one step = the B x G batch in one micro-batch (no accumulation)."""
    from datasets import Dataset
    from trl import GRPOConfig
    config = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, gradient_checkpointing=False,
                        activation_checkpointing=False, per_device_train_batch_size=B * G, num_generations=G,
                        max_completion_length=L, report_to="none", **cfg)
    args = trl_grpo.rule_args(method, group_size=G, max_new_tokens=L, device="cpu")
    t = trl_grpo.RuleGRPOTrainer(model=model, processing_class=tok, args=config, rule_args=args,
                                 reward_funcs=trl_grpo.reward_functions(args),
                                 train_dataset=Dataset.from_list(problems))
    t.model.train()
    t.current_gradient_accumulation_steps = 1  # (set by Trainer's loop, which these tests do not run)
    return t


def through_trl(trainer, batch, problems, monkeypatch):
    """TRL's _generate_and_score_completions on the fixed batch: its sampler replaced by the batch's completions,
    everything after it (decoding, rewards, masks, our advantages) TRL's and trl_grpo's own code."""
    n_resp = batch["response_mask"].sum(-1).tolist()
    completions = [row[batch["prompt_len"]:batch["prompt_len"] + n].tolist()
                   for row, n in zip(batch["input_ids"], n_resp)]
    from trl import GRPOTrainer
    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", lambda self, *a, **k: (completions, None))
    return trainer._generate_and_score_completions([p for p in problems for _ in range(G)])


def ours(method, model, tok, problems, batch, rewards):
    args = trl_grpo.rule_args(method, group_size=G, max_new_tokens=L, device="cpu")
    ctx = methods.Context(args, model, tok, problems)
    return methods.RULES[args.rule].advantages(batch, rewards, batch["response_mask"], ctx)


@pytest.mark.parametrize("method,rel", [("ktae", 1e-6), ("oar-p", 1e-5), ("oar-g", 1e-5), ("grail", 1e-5),
                                        ("shear", 1e-5), ("rlsd", 1e-4)])
def test_advantages_handed_to_trl_are_ours(fixed, tmp_path, monkeypatch, method, rel):
    model, tok, problems, batch, rewards = fixed
    trainer = trainer_for(method, model, tok, problems, tmp_path)
    torch.manual_seed(1)  # OAR-G draws its noise (O3): the same draws in both
    out = through_trl(trainer, batch, problems, monkeypatch)
    torch.manual_seed(1)
    want = ours(method, model, tok, problems, batch, rewards)
    assert out["advantages"].shape == want.tokens.shape  # [N, T]: per token, not TRL's [N]
    assert want.values is not None and (want.tokens != want.seq[:, None] * batch["response_mask"]).any()
    # margin: 0, bit for bit on this project's CPU (2026-11-25); the tolerance is for other CPUs' kernels
    assert_close(out["advantages"], want.tokens, rel=rel, what=f"{method}: TRL's advantages vs ours")


@pytest.mark.parametrize("mask_truncated", [False, True])
def test_a_new_rule_reading_logprobs_and_entropy_works_unchanged(fixed, tmp_path, monkeypatch, mask_truncated):
    # a rule that reads scores (methods.Rule.reads_scores, the default) gets log pi_old and the entropy of each
    # sampled token from TRL's scorer:
    # they must be what our sampler recorded while sampling the same tokens, truncated rollouts included when
    # TRL's mask_truncated_completions takes them out of its masks
    model, tok, problems, batch, rewards = fixed
    assert batch["truncated"].any() or not mask_truncated, "no truncated rollout in the fixed batch"

    def probe(b, r, mask, ctx):  # A_{i,t} = entropy + log-prob, so that both are compared
        return methods.TokenAdvantages((b["entropy"] + b["logprobs"]) * b["response_mask"], torch.zeros(len(mask)),
                                       None)  # (response_mask: the truncated rollouts too)

    monkeypatch.setitem(methods.RULES, "probe", methods.Rule(probe))
    trainer = trainer_for("probe", model, tok, problems, tmp_path, mask_truncated_completions=mask_truncated)
    out = through_trl(trainer, batch, problems, monkeypatch)
    want = (batch["entropy"] + batch["logprobs"]) * batch["response_mask"]  # [N, T]
    # margin: the two paths used 0.048 of the tolerance at worst (this project's CPU, 2026-11-25; TEST_MARGINS)
    assert_close(out["advantages"], want, rel=1e-5, what="entropy + log-prob through TRL vs our sampler's")


@pytest.mark.parametrize("loss_type,agg", [("grpo", "seq-mean-token-mean"), ("dapo", "token-mean"),
                                           ("dr_grpo", "seq-mean-token-sum-norm")])
def test_trl_loss_and_gradient_equal_policy_loss(fixed, tmp_path, monkeypatch, loss_type, agg):
    model, tok, problems, batch, rewards = fixed
    trainer = trainer_for("ktae", model, tok, problems, tmp_path, loss_type=loss_type, epsilon_high=0.28)
    out = through_trl(trainer, batch, problems, monkeypatch)
    mask, adv = batch["response_mask"], out["advantages"]  # [N, T]
    params = [p for p in model.parameters() if p.requires_grad]

    model.zero_grad()
    logp = sample.token_logprobs(model, batch["input_ids"], batch["attention_mask"], batch["prompt_len"])  # [N, T]
    # pi_old 0.3 nats off pi_theta on average: ratios from ~0.5 to ~2, so both clips (0.8, 1.28) bind somewhere
    old = (logp.detach() + 0.3 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(0))) * mask
    want, st = grpo.policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28, agg=agg, max_new_tokens=L)
    want.backward()
    want_grad = [p.grad.clone() for p in params]
    assert st["clip_low"] > 0 and st["clip_high"] > 0

    model.zero_grad()
    got = trainer._compute_loss(model, {**out, "old_per_token_logps": old})
    got.backward()
    # the loss is a sum of terms of both signs that nearly cancel: its error is relative to the terms' size
    terms = grpo.aggregate(adv.abs(), mask, agg, max_new_tokens=L).item()
    # margin: the two paths used 0.014 of the tolerance at worst (this project's CPU, 2026-11-25; TEST_MARGINS)
    assert_close(got.detach(), want.detach(), rel=1e-5, scale=terms, what=f"{loss_type} loss")
    scale = max(g.abs().max().item() for g in want_grad)
    for p, w in zip(params, want_grad):
        assert_close(p.grad, w, rel=1e-4, scale=scale, what=f"{loss_type} gradient")


def test_a_rule_flag_train_py_refuses_is_its_line_alone():
    with pytest.raises(SystemExit) as e:  # before: "-: error: --lr 0.0: ...", argparse's prefix of a nameless parser
        trl_grpo.rule_args("grpo", group_size=4, max_new_tokens=16, device="cpu", flags="--lr 0")
    assert e.value.code == "--lr 0.0: must be greater than 0"


def test_dapo_rewards_and_options_are_trls():
    args = trl_grpo.rule_args("dapo", group_size=4, max_new_tokens=48, device="cpu")
    assert trl_grpo.grpo_config_options(args) == {"epsilon_high": 0.28, "loss_type": "dapo"}
    correctness, overlong = trl_grpo.reward_functions(args)
    # +1 / -1 (DAPO), and D4 over the last 48 // 6 = 8 tokens: 44 tokens are 4 into the buffer -> -4 / 8 = -0.5
    assert correctness(["\\boxed{3}", "\\boxed{4}"], answer=["3", "3"]) == [1.0, -1.0]
    assert overlong([[1] * 40, [1] * 44, [1] * 48]) == [0.0, -0.5, -1.0]
    with pytest.raises(SystemExit, match="--scale_rewards batch"):
        trl_grpo.rule_args("ktae", group_size=4, max_new_tokens=48, device="cpu", scale_rewards="batch")



def test_a_bad_method_or_rule_flag_is_one_line():
    for method, flags, names in (("nope", "", "--method"), ("ktae", "--ktae-alpha 0 --ktae-beta 0", "--ktae-alpha 0")):
        with pytest.raises(SystemExit) as e:
            trl_grpo.rule_args(method, group_size=4, max_new_tokens=48, device="cpu", flags=flags)
        assert names in str(e.value.code) and "\n" not in str(e.value.code)

@pytest.mark.parametrize("flags, line", [
    (["--num_generations", "1"], "--num_generations 1: must be at least 2 (G1 compares rollouts within a group)"),
    (["--num_generations", "0"], "--num_generations 0: must be at least 2 (G1 compares rollouts within a group)"),
    (["--learning_rate", "inf"], "--learning_rate inf: not a finite number"),
    (["--learning_rate", "nan"], "--learning_rate nan: not a finite number"),
    (["--learning_rate", "1e30"], "--learning_rate 1e+30: must be greater than 0 and at most 1.0"),
    (["--learning_rate", "0"], "--learning_rate 0.0: must be greater than 0 and at most 1.0"),
    (["--per_device_train_batch_size", "6", "--num_generations", "4", "--gradient_accumulation_steps", "1"],
     "--per_device_train_batch_size 6 x --gradient_accumulation_steps 1 x 1 processes = 6 rollouts: not whole "
     "groups of --num_generations 4"),
    (["--per_device_train_batch_size", "0"], "--per_device_train_batch_size 0: must be at least 1"),
    (["--eval_every", "-1"], "--eval_every -1: must be at least 0"), (["--max_steps", "0"], "--max_steps 0: must be"),
    (["--temperature", "0"], "--temperature 0.0: must be at least 0.001"),
    (["--epsilon", "inf"], "--epsilon inf: not a finite number"), (["--threads", "0"], "--threads 0: must be"),
    (["--seed", "-1"], "--seed -1: must be at least 0 and below 2^32"),
    (["--output_dir", "TMP/afile"], "--output_dir TMP/afile: TMP/afile is a file, not a folder"),
])
def test_trl_settings_are_one_line_before_the_model_loads(monkeypatch, tmp_path, flags, line):
    from scaling import trl_train
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(trl_train.models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    (tmp_path / "afile").write_text("x")
    with pytest.raises(SystemExit) as e:
        trl_train.main([f.replace("TMP", str(tmp_path)) for f in flags])
    assert str(e.value.code).startswith(line.replace("TMP", str(tmp_path))) and "\n" not in str(e.value.code)


DRIVER = """
import sys, torch
from scaling import trl_grpo, trl_train
orig = trl_grpo.RuleGRPOTrainer._generate_and_score_completions
def saving(self, inputs):
    out = orig(self, inputs)
    r, s = self.accelerator.process_index, self.state.global_step
    torch.save({**self.last, "handed": out["advantages"], "answers": [x["answer"] for x in inputs]},
               f"{sys.argv[1]}/rank{r}-step{s}.pt")
    return out
trl_grpo.RuleGRPOTrainer._generate_and_score_completions = saving
trl_train.main(sys.argv[2:])
"""


def test_two_processes_split_a_group_and_get_one_process_advantages(base, tmp_path):
    if shutil.which("torchrun") is None:
        pytest.skip("torchrun is not on PATH")
    (tmp_path / "driver.py").write_text(DRIVER)
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # 2 processes x 6 rollouts = 12 = 3 groups of 4: rank 0 holds group 0 and half of group 1, rank 1 the rest
    cmd = ["torchrun", "--nproc_per_node", "2", "--master_port", str(port), str(tmp_path / "driver.py"),
           str(tmp_path), "--method", "ktae", "--threads", "1", "--max_steps", "2", "--num_generations", "4",
           "--per_device_train_batch_size", "6", "--gradient_accumulation_steps", "1", "--max_completion_length",
           "16", "--eval_limit", "4", "--ddp_backend", "gloo", "--output_dir", str(tmp_path / "out")]
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": str(THREADS)}
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "greedy held-out accuracy" in r.stdout
    _, tok = base
    learned = False
    for step in (0, 1):
        ranks = [torch.load(tmp_path / f"rank{k}-step{step}.pt", weights_only=False) for k in (0, 1)]
        b0, b1 = ranks[0]["batch"], ranks[1]["batch"]
        assert torch.equal(b0["input_ids"], b1["input_ids"]) and b0["input_ids"].shape[0] == 12  # one gathered batch
        assert ranks[0]["answers"][4] == ranks[1]["answers"][0]  # group 1 lies on both processes
        answers = ranks[0]["answers"] + ranks[1]["answers"]
        problems = [{"answer": a} for a in answers[::4]]
        args = trl_grpo.rule_args("ktae", group_size=4, max_new_tokens=16, device="cpu")
        one = methods.RULES["ktae"].advantages(b0, ranks[0]["rewards"], ranks[0]["mask"],
                                               methods.Context(args, None, tok, problems))  # [12, T]
        learned |= bool((one.values != 0).any())
        for k, rows in ((0, slice(0, 6)), (1, slice(6, 12))):
            handed = ranks[k]["handed"]  # [6, T_k] what rank k gave TRL's loss
            # margin: 0, bit for bit on this project's CPU (2026-11-25); the tolerance is for other CPUs' kernels
            assert_close(handed, one.tokens[rows, :handed.shape[1]], rel=1e-6, scale=one.tokens.abs().max().item()
                         or 1.0, what=f"step {step}, rank {k}")
    if not learned:  # the tiny base built on this host (2026-11-28) mixed no group of 4 in either step: KTAE gave
        # nothing, so the comparison above held zeros against zeros; say so rather than pass on them
        pytest.skip("no group mixed right and wrong in either step on this host's tiny base: no key-token value to "
                    "compare")


@pytest.mark.parametrize("method", ["ktae", "oar-g"])
def test_trls_own_lora_flags_train_adapters_under_every_rule(base, tmp_path, method):
    pytest.importorskip("peft", reason="LoRA is optional: pip install -r requirements/lora.txt")
    from safetensors.torch import load_file
    out = tmp_path / "out"
    trl_train.main(["--method", method, "--threads", "1", "--max_steps", "2", "--num_generations", "4",
                    "--per_device_train_batch_size", "16", "--gradient_accumulation_steps", "1",
                    "--max_completion_length", "24", "--eval_limit", "4", "--learning_rate", "1e-2",
                    "--use_peft", "--lora_r", "4", "--lora_alpha", "16", "--output_dir", str(out)])
    adapter = load_file(out / "adapter_model.safetensors")  # TRL saves the adapters alone
    targets = {k.split(".lora_")[0].rsplit(".", 1)[-1] for k in adapter}
    assert targets == set(lora.TARGETS)  # every projection, as train.py's --lora-rank
    assert any(v.abs().max() > 0 for k, v in adapter.items() if "lora_B" in k)  # B starts at 0: it trained


def test_trl_refuses_an_output_folder_that_holds_a_model_or_a_train_run(monkeypatch, tmp_path):
    # TRL's save replaced an earlier run's model without a word (the default runs/trl too), and mixed into a train.py
    # run's folder, whose next save could rotate it away: one line each, before the model loads
    from scaling import trl_train
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(trl_train.models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "run" / "checkpoint").mkdir(parents=True)
    (tmp_path / "run" / "run.json").write_text("{}")
    for out, line in [(tmp_path / "model", f"--output_dir {tmp_path / 'model'}: holds a model already (config.json): "
                                           f"choose another folder, or --overwrite to replace it"),
                      (tmp_path / "run", f"--output_dir {tmp_path / 'run'}: in the train.py run {tmp_path / 'run'}; "
                                         f"choose a folder of its own"),
                      (tmp_path / "run" / "trl", f"--output_dir {tmp_path / 'run' / 'trl'}: in the train.py run "
                                                 f"{tmp_path / 'run'}; choose a folder of its own")]:
        with pytest.raises(SystemExit) as e:
            trl_train.main(["--output_dir", str(out)])
        assert str(e.value.code) == line
    with pytest.raises(pytest.fail.Exception, match="the model was loaded"):  # --overwrite: past the check
        trl_train.main(["--output_dir", str(tmp_path / "model"), "--overwrite"])


def test_rlsds_frozen_teacher_is_saved_with_a_checkpoint_and_read_back(fixed, tmp_path):
    # RLSD keeps the policy of its last sync (every 20 steps by default) as the teacher: a checkpoint after step 1
    # must keep that copy (the policy before step 1's update), and a run resumed from it must read it, not re-take
    # the teacher from the policy it resumes with (which step 1 moved)
    import rlsd
    model, tok, problems, _, _ = fixed
    before = {n: p.detach().clone() for n, p in rlsd.trainable(model).items()}
    cfg = dict(save_strategy="steps", save_steps=1, learning_rate=1e-2, lr_scheduler_type="constant", seed=0)
    t = trainer_for("rlsd", copy.deepcopy(model), tok, problems, tmp_path, max_steps=1, **cfg)
    t.train()
    after = rlsd.trainable(t.model)
    assert any(not torch.equal(after[n], p) for n, p in before.items()), "step 1 did not move the policy"
    saved = torch.load(tmp_path / "checkpoint-1" / trl_grpo.RULE_STATE, weights_only=True)
    kept = saved["state"]
    assert saved["rule"] == "rlsd" and not (tmp_path / "checkpoint-1" / (trl_grpo.RULE_STATE + ".tmp")).exists()
    assert kept["synced_at"] == 0 and all(torch.equal(kept["weights"][n], p) for n, p in before.items())
    # another rule's run resumed from that checkpoint: refused in a line, before anything trains
    other = trainer_for("ktae", copy.deepcopy(model), tok, problems, tmp_path, max_steps=2, **cfg)
    with pytest.raises(SystemExit, match="kept by the rule rlsd, and this run's rule is ktae"):
        other.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
    # the same rule with another sync interval (what the kept teacher's sync step means): refused too
    other = trainer_for("rlsd", copy.deepcopy(model), tok, problems, tmp_path, max_steps=2, **cfg)
    other.rule_args.rlsd_sync_every += 1
    with pytest.raises(SystemExit, match="kept with --rlsd-sync-every"):
        other.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
    resumed = trainer_for("rlsd", copy.deepcopy(model), tok, problems, tmp_path, max_steps=2, **cfg)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
    assert resumed.rule_state["synced_at"] == 0
    assert all(torch.equal(resumed.rule_state["weights"][n], p) for n, p in before.items())
