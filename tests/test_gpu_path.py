"""The one-GPU path, checked on the CPU: a model with Qwen2.5-1.5B's exact shapes but 2 layers runs a full RL
step through train.py, its peak memory matches the plan, the 28-layer plan prints from a config alone, and what
train.py saves opens with the Auto classes."""
import json
import os
import subprocess
import sys

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import train
from infra import memory, models
from toyworld import tiny
from conftest import THREADS
from test_train import ROOT

QWEN15 = dict(hidden_size=1536, num_attention_heads=12, num_key_value_heads=2, intermediate_size=8960,
              vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=4096)


def test_parameter_count_of_qwen25_15b():
    # Qwen2.5-1.5B: 1,543,714,304 parameters (embeddings 151936 x 1536 = 233,373,696, tied; 28 layers of
    # 46,797,824 = q 1536^2 + k, v 1536 x 256 each + o 1536^2 + biases 1536 + 2 x 256 + MLP 3 x 1536 x 8960 + 2 norms
    # 1536; a final norm 1536)
    cfg = Qwen2Config(num_hidden_layers=28, **QWEN15)
    assert memory.n_params(cfg) == 1_543_714_304
    small = Qwen2Config(num_hidden_layers=2, **QWEN15)
    with torch.device("meta"):
        assert memory.n_params(small) == sum(p.numel() for p in Qwen2ForCausalLM(small).parameters())


def test_dry_run_prints_the_full_size_plan_from_a_config_alone(tmp_path, capsys):
    Qwen2Config(num_hidden_layers=28, **QWEN15).save_pretrained(tmp_path)  # config.json only, no weights
    train.main(["--method", "ktae", "--model", str(tmp_path), "--dataset", "gsm8k", "--dry-run", "--max-new-tokens",
                "3072", "--micro-batch-size", "16", "--gpu-memory", "80", "--threads", str(THREADS)])
    out = capsys.readouterr().out
    assert "1.544 B parameters, 28 layers" in out and "KV cache: 128 rows x 3584 tokens" in out
    # the disk: 1,543,714,304 x 4 bytes = 5.75 GiB of weights, x 8 = 11.50 GiB of AdamW's moments, 32 MiB more: 17.28
    # GiB a checkpoint, and the run keeps two (400 steps, one save every 50), and 25 MiB of its logs: 34.59
    assert "disk: a checkpoint takes 17.28 GiB (weights 5.75, optimizer state 11.50, tokenizer and the rest 0.03); " \
           "the run keeps at most 34.59 GiB (the last and the one before, and 25.0 MiB of metrics" in out
    assert "does NOT fit" in out and "--grad-checkpointing" in out  # 16 rows of 3584 tokens need checkpointing
    together = [line for line in out.splitlines() if line.strip().startswith("--grad-checkpointing --")]
    assert together and float(together[0].split("peak")[1].split()[0]) < 80


def test_dry_run_names_the_oar_chunk_that_fits(tmp_path, capsys):
    # OAR-G's backward keeps every layer's float32 activations for the rollouts it scores at once: at 3072 tokens
    # a 1.5B takes about 16.7 GiB a rollout, so the default chunk of 8 needs 133 GiB; the plan names the largest
    # chunk under which the run fits in 80 GB: beside 19 GiB of weights and moments, (80 - 19) / 16.7 = 3.6 -> 3
    Qwen2Config(num_hidden_layers=28, **QWEN15).save_pretrained(tmp_path)
    train.main(["--method", "oar-g", "--model", str(tmp_path), "--dataset", "gsm8k", "--dry-run", "--max-new-tokens",
                "3072", "--micro-batch-size", "4", "--gpu-memory", "80", "--bf16", "--grad-checkpointing",
                "--oar-chunk", "8", "--threads", str(THREADS)])
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("--oar-chunk"))
    chunk, peak = int(line.split()[1]), float(line.split("peak")[1].split()[0])
    assert chunk == 3 and peak <= 80


def test_one_rl_step_of_a_two_layer_qwen15b_shape_fits_its_plan(tmp_path):
    # random init, Qwen2.5-1.5B shapes, 2 layers (327M parameters); the tiny tokenizer (its 28 ids are valid
    # ids of the 151,936-row embedding; the rest decode to nothing). A random model gets no answer right, so every
    # advantage is 0 and train.py would skip the forward and backward (see its step 4); beta > 0 makes it score
    # every rollout for the KL term, and puts a reference model in the plan too.
    cfg = Qwen2Config(num_hidden_layers=2, pad_token_id=0, eos_token_id=0, bos_token_id=0, **QWEN15)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(tmp_path / "model")
    tiny.build_tokenizer().save_pretrained(tmp_path / "model")
    run_dir = tmp_path / "run"
    # No evaluation and no checkpoint (--no-final-eval --no-final-save): the plan covers the step's phases, and a
    # checkpoint of 4 GB (weights and AdamW's moments) would take a quarter of the test; train.py's checkpoints
    # reopen with the Auto classes in tests/test_train.py (the tiny tokenizer), test_qwen.py and test_smollm2.py.
    args = ["--method", "grpo", "--model", str(tmp_path / "model"), "--steps", "1", "--prompts-per-step", "2",
            "--group-size", "2", "--max-new-tokens", "16", "--micro-batch-size", "4", "--eval-limit", "2",
            "--no-final-eval", "--no-final-save", "--run-dir", str(run_dir), "--threads", str(THREADS), "--beta",
            "0.01"]
    r = subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    step = [json.loads(line) for line in open(run_dir / "metrics.jsonl") if "time_step" in line][0]
    prompt_len = max(len(tiny.prompt(q)) for q in tiny.eval_problems())  # one token per character
    plan = memory.memory_plan(cfg, rollouts=4, gen_rollouts=4, prompt_len=prompt_len, max_new_tokens=16,
                              micro_batch=4, bf16=False, grad_checkpointing=False, reference=True, ref_on_cpu=False)
    planned = max(sum(items.values()) for items in plan.values()) / memory.GiB
    measured = step["peak_memory_gib"]
    print(f"planned {planned:.2f} GiB, measured {measured:.2f} GiB")
    assert abs(measured - planned) <= 0.25 * planned, (planned, measured)


@pytest.mark.parametrize("flags", [["--bf16"], ["--grad-checkpointing", "--gen-batch-size", "2", "--beta", "0.04",
                                                "--ref-on-cpu", "--micro-batch-size", "3"]])
def test_memory_flags_run_on_the_tiny_model(base, tmp_path, flags):
    import train
    train.main(["--steps", "2", "--prompts-per-step", "4", "--group-size", "4", "--eval-every", "1000",
                "--eval-limit", "8", "--run-dir", str(tmp_path / "run"), "--threads", str(THREADS), *flags])
    steps = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl") if "time_step" in line]
    assert len(steps) == 2 and all(s["peak_memory_gib"] > 0 for s in steps)
    if "--beta" in flags:
        assert steps[-1]["kl"] >= 0


def test_training_on_a_dataset_file_reports_bad_rows(base, tmp_path, capsys, monkeypatch):
    import train
    monkeypatch.setattr(train.data, "INSTRUCTION", "")  # the tiny tokenizer cannot write the papers' instruction
    path, held = tmp_path / "train.jsonl", tmp_path / "held.jsonl"
    rows = [{"question": f"Q:{a}+{b}=?", "answer": f"#### {a + b}"} for a in range(3) for b in range(3)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n" + json.dumps({"question": "no answer"}) + "\n")
    held.write_text("".join(json.dumps({"question": f"Q:5+{b}=?", "answer": f"#### {5 + b}"}) + "\n" for b in (1, 2)))
    train.main(["--dataset", str(path), "--eval-dataset", str(held), "--steps", "1", "--prompts-per-step", "4",
                "--group-size", "2", "--eval-every", "1000", "--run-dir", str(tmp_path / "run"),
                "--threads", str(THREADS)])
    printed = capsys.readouterr()
    assert f"--dataset {path}: loaded 9 rows, skipped 1 (1 no answer)" in printed.err
    assert f"  {path}:10: no answer" in printed.err and "9 training problems" in printed.out
    evals = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl") if "eval_n" in line]
    assert evals[0]["eval_n"] == 2


def test_a_bf16_checkpoint_loads_as_float32(tmp_path):
    # transformers 5 keeps a checkpoint's dtype by default; Qwen2.5 is stored in bf16, where a 1e-6 update is lost
    tok = tiny.build_tokenizer()
    tiny.build_model(tok).to(torch.bfloat16).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    model, _, _ = models.load_model(str(tmp_path))
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    w = torch.tensor([0.02], dtype=torch.bfloat16)
    assert (w + 1e-6).item() == w.item()  # why: the update vanishes in bf16


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="per-phase CPU peaks need Linux's clear_refs")
def test_a_phase_peak_on_the_cpu_is_not_the_memory_the_last_phase_freed():
    # 640 MB in 32 KB tensors, one in 50 kept: glibc keeps the freed blocks between survivors, and without
    # malloc_trim the next phase's resident set still held all 640 MB. That is the first step's (memcheck's); a
    # later step's phases start from what glibc kept, as the process does (each release costs the next phase its
    # page faults again)
    peaks = memory.Peaks("cpu", memory.peak_memory_bytes("cpu", 0))
    advantage = []
    for step in range(2):
        peaks.start()
        blocks = [torch.ones(8_000) for _ in range(20_000)]
        keep = blocks[::50]  # noqa: F841
        del blocks
        peaks.end("sampling")
        peaks.end("advantage")  # nothing allocated in between
        assert peaks.step["sampling"] > 500 * 2**20
        advantage.append(peaks.step["advantage"])
        del keep
    assert advantage[0] < 100 * 2**20 and advantage[1] > 500 * 2**20


@pytest.mark.parametrize("tied", [False, True])
def test_oar_on_a_bf16_lora_base_plans_the_float32_copy_of_an_untied_output_layer(tied):
    # sample.float32 computes each bf16 layer in float32 from an upcast copy of its weight, made per product: the
    # largest is an untied output layer, 151,936 x 1536 x 4 bytes = 0.87 GiB; a tied one is the float32 embeddings
    cfg = Qwen2Config(num_hidden_layers=2, **{**QWEN15, "tie_word_embeddings": tied})
    settings = dict(rollouts=8, gen_rollouts=8, prompt_len=128, max_new_tokens=32, micro_batch=8, bf16=True,
                    grad_checkpointing=False, reference=False, ref_on_cpu=False, group_size=4, lora_rank=32, oar_chunk=8)
    advantage = memory.memory_plan(cfg, **settings)["advantage"]
    copy = advantage.get("float32 copy of the bf16 output layer, while used", 0)
    assert copy == (0 if tied else 151_936 * 1536 * 4)


def test_a_micro_batch_larger_than_the_step_plans_the_steps_rollouts_alone():
    # --micro-batch-size 64 (the default) with 2 prompts x 4 rollouts: every phase holds 8 rows, so the output
    # layer's chunk is 8 x 32 = 256 tokens (of at most 512 a chunk here), not 64 x 32 = 2048 cut to 512
    cfg = Qwen2Config(num_hidden_layers=2, **QWEN15)
    settings = dict(rollouts=8, gen_rollouts=8, prompt_len=128, max_new_tokens=32, bf16=False,
                    grad_checkpointing=False, reference=False, ref_on_cpu=False, group_size=4, chunk_tokens=512)
    assert memory.memory_plan(cfg, micro_batch=64, **settings) == memory.memory_plan(cfg, micro_batch=8, **settings)
    training = memory.memory_plan(cfg, micro_batch=64, **settings)["training forward and backward"]
    assert training["output layer, 256 tokens at a time"] == 256 * 151_936 * (3 * 4 + 4)


def test_dry_run_names_a_micro_batch_smaller_than_the_rollouts_it_holds(tmp_path, capsys):
    # 2 prompts x 4 rollouts hold 8 rows, whatever --micro-batch-size (64 by default) says: the smaller micro-batch
    # named is 8 / 4 = 2 rows (64 / 4 = 16 would hold the same 8 and lower nothing)
    Qwen2Config(num_hidden_layers=28, **QWEN15).save_pretrained(tmp_path)
    train.main(["--method", "grpo", "--model", str(tmp_path), "--dataset", "gsm8k", "--dry-run", "--max-new-tokens",
                "3072", "--prompts-per-step", "2", "--group-size", "4", "--gpu-memory", "40", "--threads",
                str(THREADS)])
    out = capsys.readouterr().out
    assert "does NOT fit" in out and "    --micro-batch-size 2 " in out and "--micro-batch-size 16" not in out
