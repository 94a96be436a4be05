"""LoRA (infra/lora.py, --lora-rank): the adapters' gradients against finite differences, the adapter checkpoint opened
as the adapted model (by --model, peft and tools.merge), resume bit for bit, the frozen weights untouched; and
--bf16 against float32 within bf16's precision, on log-probs and on advantages."""
import json
import os
import random

import pytest
import torch

import grpo
import methods
import sample
import train
from conftest import THREADS, assert_close
from infra import lora
from toyworld import tiny

pytest.importorskip("peft", reason="LoRA is optional: pip install -r requirements/lora.txt")
SMALL = ["--prompts-per-step", "4", "--group-size", "4", "--eval-limit", "8", "--eval-every", "1000",
         "--lr", "1e-3", "--lora-rank", "4", "--threads", str(THREADS)]


def prompts(tok, n=4, seed=0):
    qs = tiny.train_problems(random.Random(seed), n, set(tiny.eval_problems()))
    return [tok(tiny.prompt(q))["input_ids"] for q in qs]


def read(path):
    return [json.loads(line) for line in open(path)]


def test_adapter_gradients_equal_finite_differences(base, float64_exact):
    # float64 throughout, so that a central difference with h = 1e-6 is good to about 1e-8 of the gradient
    model, tok = base
    model = tiny.build_model(tok).double()  # a fresh model: the fixture's stays as it is
    model.load_state_dict({k: v.double() for k, v in base[0].state_dict().items()})
    wrapped = lora.wrap(model, rank=2, alpha=4.0, targets=("q_proj", "down_proj"))
    model.double()
    torch.manual_seed(0)
    for p in lora.trainable(model).values():  # B starts at 0, where A's gradient is 0: give both a value
        p.data.normal_(0, 0.3)
    batch = sample.generate(model, prompts(tok), n=2, max_new_tokens=12, temperature=1.0, eos_id=tok.eos_token_id,
                            pad_id=tok.pad_token_id)
    adv = torch.linspace(-1, 1, 8, dtype=torch.float64)[:, None] * batch["response_mask"]  # [8, T]

    def loss():
        logp = sample.token_logprobs(model, batch["input_ids"], batch["attention_mask"], batch["prompt_len"])
        return grpo.policy_loss(logp, batch["logprobs"].double(), adv, batch["response_mask"])[0]

    model.zero_grad()
    loss().backward()
    trainable = lora.trainable(model)
    assert trainable and all("lora_" in n for n in trainable) and wrapped.get_base_model() is model
    for name, p in list(trainable.items())[:4]:
        for index in [(0, 0), (1, 1)]:
            keep = p.data[index].item()
            with torch.no_grad():
                p.data[index] = keep + 1e-6
                up = loss().item()
                p.data[index] = keep - 1e-6
                down = loss().item()
                p.data[index] = keep
            fd = (up - down) / 2e-6
            assert abs(p.grad[index].item() - fd) <= 1e-6 * max(1.0, abs(fd)), (name, index, p.grad[index], fd)
    frozen = [p for n, p in model.named_parameters() if "lora_" not in n]
    assert frozen and all(p.grad is None for p in frozen)  # the base takes no gradient


def adapted_model(run_dir):
    """The tiny base with the adapters the checkpoint's adapter file holds, as train.py resumes it."""
    model, tok, _ = tiny.load_or_build()
    wrapped = lora.wrap(model, rank=4, alpha=16.0)
    lora.load_adapters(wrapped, os.path.join(run_dir, "checkpoint"))
    return model.eval(), tok


def test_a_lora_checkpoint_is_the_adapters_and_opens_as_the_adapted_model(base, tmp_path):
    # the checkpoint holds peft's adapter files (kilobytes here, 148 MB at rank 32 on a 1.5B) instead of the
    # merged model (7 GB a checkpoint at 1.5B): train.py's --model, evaluate.py and TRL open it as base + adapters
    # merged (infra/models.py), peft opens it itself, and tools.merge writes the merged model when one is wanted
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    from infra import models
    from tools import merge
    run_dir = tmp_path / "run"
    train.main(["--method", "ktae", "--steps", "2", "--run-dir", str(run_dir), *SMALL])
    ckpt = run_dir / "checkpoint"
    files = set(os.listdir(ckpt))
    assert {lora.ADAPTER_CONFIG, lora.ADAPTER_FILE, "state.pt", "manifest.json"} <= files
    assert not any(f.startswith("model") for f in files)  # no merged copy of the model
    assert json.loads((ckpt / lora.ADAPTER_CONFIG).read_text())["base_model_name_or_path"] == base[0].name_or_path
    adapted, tok = adapted_model(run_dir)
    ids = torch.tensor(prompts(tok, 1))
    merge.main([str(ckpt), str(tmp_path / "merged")])
    with torch.no_grad():
        want = adapted(ids).logits
        opened, opened_tok, _ = models.load_model(str(ckpt))  # as --model RUN/checkpoint opens it
        # margin: the two paths used 0.085 of the tolerance at worst (this project's CPU, 2026-11-25; TEST_MARGINS)
        assert_close(opened.eval()(ids).logits, want, rel=1e-5, what="the checkpoint as --model vs adapted model")
        assert opened_tok(tiny.prompt("7+8"))["input_ids"] == tok(tiny.prompt("7+8"))["input_ids"]
        fresh, _, _ = tiny.load_or_build()
        by_peft = PeftModel.from_pretrained(fresh, str(ckpt)).eval()
        assert_close(by_peft(ids).logits, want, rel=1e-5, what="peft's own opening vs adapted model")
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
        assert_close(merged(ids).logits, want, rel=1e-5, what="tools.merge's model vs adapted model")
    # the frozen weights did not move: what is not a projection is the base's, bit for bit; a projection is the
    # base's plus the adapters' product
    original = dict(base[0].named_parameters())
    moved = 0.0
    for name, w in merged.state_dict().items():
        if name not in original:
            continue
        if any(f".{t}." in name for t in lora.TARGETS) and name.endswith("weight"):
            moved = max(moved, (w - original[name]).abs().max().item())
        else:
            assert torch.equal(w, original[name]), name
    assert 0 < moved < 1e-1  # two steps at lr 1e-3 on the adapters


@pytest.mark.parametrize("targets, unknown", [("q_proj,bogus_proj", "'bogus_proj'"), ("", "''")])
def test_unknown_lora_targets_are_one_line(base, targets, unknown):
    model = type(base[0])(base[0].config)
    with pytest.raises(SystemExit) as e:  # before: peft's NoMatchingPeftModuleError, or a KeyError, as a traceback
        lora.wrap(model, 2, 8.0, targets.split(","))
    assert str(e.value.code) == f"--lora-targets {targets}: {unknown} not a linear layer of this model (its linear " \
                                f"layers: down_proj,gate_proj,k_proj,lm_head,o_proj,q_proj,up_proj,v_proj)"


def test_a_lora_run_resumes_bit_for_bit(base, tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    train.main(["--method", "oar-g", "--steps", "4", "--save-every", "2", "--run-dir", a, *SMALL])
    train.main(["--method", "oar-g", "--steps", "2", "--save-every", "2", "--run-dir", b, *SMALL])
    for other in (["--lora-alpha", "200"], ["--lora-targets", "q_proj"]):  # would rescale or lose the adapters
        with pytest.raises(SystemExit) as e:
            train.main(["--method", "oar-g", "--steps", "4", "--run-dir", b, "--resume", *SMALL, *other])
        assert str(e.value.code).startswith(f"--resume: {b} is a run with {other[0]} ")
    train.main(["--method", "oar-g", "--steps", "4", "--save-every", "2", "--run-dir", b, "--resume", *SMALL])
    # every step's line equal, timing and memory aside (b also evaluated at its end, step 2)
    strip = lambda rs: [{k: v for k, v in r.items() if not k.startswith(("time", "peak"))}  # noqa: E731
                        for r in rs if "accuracy" in r]
    assert len(strip(read(f"{a}/metrics.jsonl"))) == 4
    assert strip(read(f"{a}/metrics.jsonl")) == strip(read(f"{b}/metrics.jsonl"))
    from safetensors.torch import load_file
    sa, sb = (load_file(f"{d}/checkpoint/{lora.ADAPTER_FILE}") for d in (a, b))
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_lora_with_a_bf16_base_trains_its_float32_adapters(base, tmp_path):
    run_dir = tmp_path / "run"
    train.main(["--method", "grpo", "--steps", "1", "--bf16", "--run-dir", str(run_dir), *SMALL])
    step = next(r for r in read(run_dir / "metrics.jsonl") if "accuracy" in r)
    assert step["grad_norm"] > 0 and step["nonfinite_updates"] == 0
    model, tok, _ = tiny.load_or_build()
    lora.wrap(model, rank=4, alpha=16.0, bf16_base=True)
    dtypes = {n.rsplit(".", 1)[0].split(".")[-1]: p.dtype for n, p in model.named_parameters()}
    assert dtypes["base_layer"] == torch.bfloat16 and dtypes["default"] == torch.float32  # frozen / adapters
    assert model.get_input_embeddings().weight.dtype == torch.float32  # tied to the output layer: float32


def test_bf16_agrees_with_float32_within_its_precision(base):
    # bf16 keeps 8 bits of mantissa (a relative step of 2^-8 = 0.4 %): log-probs computed under --bf16 must agree
    # with float32's to a few of those steps, on the same rollouts. The advantages are equal: KTAE reads only ids,
    # and OAR scores in float32 whatever --bf16 says (under bf16 its scores were mostly rounding noise)
    model, tok = base
    torch.manual_seed(0)
    batch = sample.generate(model, prompts(tok), n=4, max_new_tokens=24, temperature=1.0, eos_id=tok.eos_token_id,
                            pad_id=tok.pad_token_id)
    args = (batch["input_ids"], batch["attention_mask"], batch["prompt_len"])
    m = batch["response_mask"]
    with torch.no_grad():
        fp32 = sample.token_logprobs(model, *args)
        with sample.autocast("cpu", True):
            bf16 = sample.token_logprobs(model, *args)
    # margin: the two paths used 0.16 of the tolerance at worst (this project's CPU, 2026-11-25; TEST_MARGINS)
    assert_close(bf16 * m, fp32 * m, rel=3e-2, what="log-probs, bf16 vs float32")
    rewards = torch.tensor([[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    batch["correct"] = rewards.view(-1) > 0
    problems = [{"answer": "1"}] * 4
    from config import training
    for rule in ("oar-g", "ktae"):
        got = {}
        for bf16 in (False, True):
            a = training.parse_args(["--method", rule, "--group-size", "4"] + (["--bf16"] if bf16 else []))
            torch.manual_seed(1)  # OAR-G's noise: the same draw in both
            got[bf16] = methods.RULES[rule].advantages(batch, rewards, m, methods.Context(a, model, tok, problems))
        assert torch.equal(got[True].tokens, got[False].tokens), rule


def test_float32_products_from_a_bf16_base(base):
    # OAR on LoRA's bf16 base (sample.float32): the same numbers, gradient included, as a float32 copy of the same
    # bf16-rounded weights, without a float32 copy of them kept for the backward
    model, tok = base
    held = tiny.build_model(tok)
    held.load_state_dict(model.state_dict())
    lora.wrap(held, rank=4, alpha=16.0, bf16_base=True)
    copy = tiny.build_model(tok)
    copy.load_state_dict(model.state_dict())
    lora.wrap(copy, rank=4, alpha=16.0)
    with torch.no_grad():  # the copy's frozen weights: the held ones, upcast
        for (n, p), q in zip(copy.named_parameters(), held.parameters()):
            p.copy_(q.float())
    ids = torch.tensor(prompts(tok, 1))
    results = []
    for m, context in ((held, sample.float32(held)), (copy, sample.autocast("cpu", False))):
        e = m.get_input_embeddings()(ids).detach().requires_grad_(True)
        with context:
            logits = m(inputs_embeds=e).logits
            (g,) = torch.autograd.grad(logits.logsumexp(-1).sum(), e)
        results.append((logits, g))
    assert results[0][0].dtype == torch.float32
    # margin: 0, bit for bit on this project's CPU (2026-11-25); the tolerance is for other CPUs' kernels
    assert_close(results[0][0], results[1][0], rel=1e-5, what="logits")
    assert_close(results[0][1], results[1][1], rel=1e-5, what="gradient to the embeddings")


def test_adapters_refuse_a_base_replaced_in_place(base, tmp_path):
    # issue 63: the adapters recorded the base's path only: weights replaced there were evaluated, merged and
    # resumed as if they were the base the adapters were trained on. Now its weights' SHA-256 are recorded and held
    import shutil
    import evaluate
    from infra import models
    from tools import merge
    shutil.copytree(base[0].name_or_path, tmp_path / "base")
    run_dir = tmp_path / "run"
    flags = ["--model", str(tmp_path / "base"), "--method", "grpo", "--run-dir", str(run_dir), *SMALL]
    train.main(flags + ["--steps", "1", "--no-final-eval"])
    ckpt = str(run_dir / "checkpoint")
    models.check_path(ckpt)  # the same base: accepted
    other = type(base[0])(base[0].config)  # the same shapes, other weights
    other.save_pretrained(tmp_path / "base")
    for act in (lambda: models.check_path(ckpt), lambda: merge.main([ckpt, str(tmp_path / "merged")]),
                lambda: evaluate.main(["--model", ckpt, "--benchmarks", "tiny", "--threads", "1"]),
                lambda: train.main(flags + ["--steps", "2", "--resume"])):
        with pytest.raises(SystemExit) as e:
            act()
        said = str(e.value.code)
        assert f"its base {tmp_path / 'base'} is not the model its adapters were trained on" in said, said
    assert not (tmp_path / "merged").exists()
    # a record that cannot be read is not taken as no record (which would let the replaced base through)
    # (the checkpoint's manifest finds a cut file first; the record is checked alone here, as for a checkpoint whose
    # manifest does not list it)
    (run_dir / "checkpoint" / "adapter_base.json").write_text("{trunc")
    with pytest.raises(SystemExit) as e:
        models.check_base(ckpt, "--model")
    assert "adapter_base.json cannot be read (damaged?)" in str(e.value.code)


def test_a_base_moved_is_said_as_moved_and_an_edited_adapter_config_as_changed(base, tmp_path):
    # round four: a base moved, then adapter_config.json edited to point at it, was refused as "(truncated?)";
    # the file was changed, not cut, and the way out is to put the base back (no supported way points elsewhere)
    import shutil
    from infra import models
    shutil.copytree(base[0].name_or_path, tmp_path / "base")
    run_dir = tmp_path / "run"
    train.main(["--model", str(tmp_path / "base"), "--method", "grpo", "--run-dir", str(run_dir), *SMALL,
                "--steps", "1", "--no-final-eval"])
    ckpt = str(run_dir / "checkpoint")
    os.rename(tmp_path / "base", tmp_path / "moved")
    with pytest.raises(SystemExit) as e:
        models.check_path(ckpt)
    said = str(e.value.code)
    assert f"its base {tmp_path / 'base'} is not there (moved?): put it back there" in said and "\n" not in said
    config = run_dir / "checkpoint" / lora.ADAPTER_CONFIG
    config.write_text(config.read_text().replace(str(tmp_path / "base"), str(tmp_path / "moved")))
    with pytest.raises(SystemExit) as e:
        models.check_path(ckpt)
    said = str(e.value.code)
    assert "truncated" not in said and "\n" not in said, said
    assert f"{lora.ADAPTER_CONFIG}: changed since it was saved (" in said, said
    assert f"put the base back at {tmp_path / 'base'} and restore {lora.ADAPTER_CONFIG}" in said, said


def test_merge_and_evaluate_on_a_full_disk_or_a_damaged_adapter_are_one_line_and_leave_nothing_cut(base, tmp_path,
                                                                                                 monkeypatch):
    # issue 63: evaluate ran the whole benchmark, then failed to write and left a cut JSON that blocked the rerun;
    # merge gave peft's traceback on a truncated adapter, and on a full disk left a folder without weights
    import errno
    import shutil
    import evaluate
    from tools import merge
    run_dir = tmp_path / "run"
    train.main(["--method", "grpo", "--steps", "1", "--no-final-eval", "--run-dir", str(run_dir), *SMALL])
    ckpt = run_dir / "checkpoint"
    real_save = type(base[0]).save_pretrained

    def full(self, path, *a, **k):
        real_save(self, path, *a, **k)
        raise OSError(errno.ENOSPC, "No space left on device")
    with monkeypatch.context() as m:
        m.setattr(type(base[0]), "save_pretrained", full)
        with pytest.raises(SystemExit) as e:
            merge.main([str(ckpt), str(tmp_path / "merged")])
    assert "the merged model could not be written" in str(e.value.code) and "\n" not in str(e.value.code)
    assert not (tmp_path / "merged").exists() and [p for p in os.listdir(tmp_path) if "merged" in p] == []
    merge.main([str(ckpt), str(tmp_path / "merged")])  # nothing blocks the rerun
    assert (tmp_path / "merged" / "model.safetensors").exists()
    out = tmp_path / "eval.json"
    flags = ["--model", str(ckpt), "--benchmarks", "tiny", "--limit", "4", "--threads", "1", "--out", str(out)]
    real_dump = json.dump

    def cut(obj, f, **k):
        f.write(json.dumps(obj)[:20])
        raise OSError(errno.ENOSPC, "No space left on device")
    with monkeypatch.context() as m:
        m.setattr(evaluate.json, "dump", cut)
        with pytest.raises(SystemExit) as e:
            evaluate.main(flags)
    assert str(e.value.code).startswith(f"--out {out}: cannot be written (No space left on device)")
    assert not out.exists() and [p for p in os.listdir(tmp_path) if p.startswith("eval.json")] == []
    evaluate.main(flags)
    assert "results" in json.loads(out.read_text())
    monkeypatch.setattr(json, "dump", real_dump)
    broken = tmp_path / "broken"
    shutil.copytree(ckpt, broken)
    os.remove(broken / "manifest.json")  # a peft folder of its own: nothing lists its files' sizes
    data = (broken / lora.ADAPTER_FILE).read_bytes()
    (broken / lora.ADAPTER_FILE).write_bytes(data[:len(data) // 2])
    with pytest.raises(SystemExit) as e:
        merge.main([str(broken), str(tmp_path / "merged2")])
    assert "\n" not in str(e.value.code) and str(broken) in str(e.value.code), e.value.code
