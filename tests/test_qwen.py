"""The papers' model family on real weights: Qwen2.5-Coder-0.5B-Instruct (infra/models.py, MODELS), the Qwen2
architecture with a 151,936-id vocabulary, the Qwen chat template with the papers' instruction as its system turn,
answers in \\boxed{}. The 1.5B the papers train has the same architecture at other sizes.

    the sampler is the model's          greedy tokens equal model.generate's (through fastpath's Qwen2 decode step);
                                        sampled log-probs equal the training forward's, a group's prompt run once
                                        or with every row, at tolerances relative to scale
    two methods take a step             one RL step of ktae and of oar-g on the papers' prompt; the checkpoint
                                        reopens with AutoModelForCausalLM / AutoTokenizer
    OAR's and KTAE's inputs             OAR's span ends where " \\boxed{" begins, its cue and the answer's ids decode
                                        back; KTAE's values sit on the real ids that tell right from wrong

The model installs with the test command (README); without its packages these tests are skipped with the pip
command. One model load serves the module; sizes are the smallest that still exercise each path.
"""
import importlib.util
import json
import os

import pytest
import torch

from config import training
import data
import ktae
import reward
import sample
import train
from conftest import THREADS, alternating_grader, assert_close, greedy_equals_generate, oar_span
from infra import fastpath, models

NAME = "qwen2.5-coder-0.5b"
ALIAS = models.MODELS[NAME]
pytestmark = pytest.mark.skipif(any(importlib.util.find_spec(p) is None for p in ALIAS.packages)
                                or importlib.util.find_spec("gguf") is None,
                                reason=f"the packaged {NAME} is not installed: {ALIAS.pip}")
NEW_TOKENS = 24
# grade-school word problems in GSM8K's style, written here so that no benchmark file is needed
PROBLEMS = [{"question": "A baker makes 12 muffins and sells 5 of them. How many muffins are left?", "answer": "7"},
            {"question": "Tom has 3 boxes with 4 pencils in each box. How many pencils does he have?", "answer": "12"}]


@pytest.fixture(scope="module")
def qwen():
    model, tok, _ = models.load_model(NAME)  # assembled, checked and converted once into .cache/
    return model, tok


def prompts(tok):
    """The papers' prompt: the chat template with the instruction as the system turn (data.build_prompt)."""
    return [tok(data.build_prompt(tok, p["question"]))["input_ids"] for p in PROBLEMS]


def test_the_tokenizer_and_the_papers_prompt(qwen):
    model, tok = qwen
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.config.vocab_size == 151936
    assert tok.padding_side == "left" and tok.eos_token == "<|im_end|>" and tok.pad_token_id is not None
    text = data.build_prompt(tok, PROBLEMS[0]["question"])
    assert text.startswith(f"<|im_start|>system\n{data.INSTRUCTION}<|im_end|>\n<|im_start|>user\n")
    assert text.endswith("<|im_start|>assistant\n")


def test_greedy_tokens_equal_model_generate(qwen):
    model, tok = qwen
    assert fastpath.decodes(model)  # through the written-out Qwen2 decode step
    greedy_equals_generate(model, tok, prompts(tok), NEW_TOKENS)


def test_sampled_logprobs_equal_the_training_forward_with_and_without_shared_prompts(qwen):
    model, tok = qwen
    torch.manual_seed(0)
    out = sample.generate(model, prompts(tok), n=4, max_new_tokens=NEW_TOKENS, temperature=0.7,
                          eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    m, args = out["response_mask"], (out["input_ids"], out["attention_mask"], out["prompt_len"], 0.7)
    with torch.no_grad():
        shared = sample.token_logprobs(model, *args, groups=torch.arange(8) // 4)  # [8, T] each prompt run once
        plain = sample.token_logprobs(model, *args)  # [8, T] every row's own forward
    # margin: the two paths used 0.023 of the tolerance at worst (this project's CPU, 2026-11-25; TEST_MARGINS)
    assert_close(shared * m, out["logprobs"], rel=1e-4, what="training forward vs sampler")
    assert_close(shared * m, plain * m, rel=1e-4, what="shared prompts vs each row's own")


@pytest.mark.parametrize("method", ["ktae"])  # OAR-G's step on a real model: test_smollm2.py (79 s more here)
def test_one_rl_step_on_the_papers_prompt(qwen, monkeypatch, tmp_path, method):
    # A 0.5B model answers these few problems all right or all wrong, and such groups have no advantage (G1):
    # grading every other rollout right (conftest) mixes every group, so every step updates (the real grader:
    # test_reward.py).
    monkeypatch.setattr(reward, "is_correct", alternating_grader())
    problems, held = tmp_path / "problems.jsonl", tmp_path / "held.jsonl"
    problems.write_text("".join(json.dumps(p) + "\n" for p in PROBLEMS))
    held.write_text(json.dumps({"question": "Sam has 10 apples and eats 3. How many are left?", "answer": "7"}) + "\n")
    run = str(tmp_path / "run")
    # the step alone: the evaluation and the 7.5 GB checkpoint (weights and AdamW's moments) are the same code for
    # every model and method, run whole and reopened on SmolLM2 (test_smollm2.py) and the tiny model (33 s more here)
    train.main(["--model", NAME, "--dataset", str(problems), "--eval-dataset", str(held), "--method", method,
                "--steps", "1", "--prompts-per-step", "2", "--group-size", "4", "--max-new-tokens", str(NEW_TOKENS),
                "--temperature", "0.7", "--lr", "1e-6", "--eval-batch-size", "2", "--run-dir", run,
                "--threads", str(THREADS), "--no-final-eval", "--no-final-save"])
    records = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
    step = next(r for r in records if "accuracy" in r)
    assert 0 < step["accuracy"] < 1 and step["grad_norm"] > 0 and step["nonfinite_updates"] == 0
    assert not any("eval_accuracy" in r for r in records)


def test_oar_spans_and_ktae_values_on_qwen_tokens(qwen):
    _, tok = qwen
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    reasoning, rest = oar_span(tok, "3 x 4 = 12 pencils. The final answer is \\boxed{12}.")
    assert reasoning == "3 x 4 = 12 pencils. The final answer is" and rest == " \\boxed{12}."  # at " \boxed{"
    right = enc("3 x 4 = 12 pencils. The final answer is \\boxed{12}.")
    wrong = enc("3 + 4 = 7 pencils. The final answer is \\boxed{7}.")
    args = training.parse_args(["--method", "oar-g", "--model", NAME, "--dataset", "gsm8k"])
    assert args.oar_cue == data.OAR_CUE and args.oar_chunk == ALIAS.oar_chunk
    assert tok.decode(enc(args.oar_cue)) == args.oar_cue and tok.decode(enc("12}")) == "12}"
    # KTAE on the real vocabulary: two right and two wrong rollouts of one group, with ids from the whole
    # 151,936-id table ("因此", "therefore", is one id above 100,000)
    right, wrong = enc("因此") + right, enc("因此") + wrong
    assert max(right) > 100_000
    T = max(len(right), len(wrong))
    rows = (right, right, wrong, wrong)
    ids = torch.tensor([r + [tok.pad_token_id] * (T - len(r)) for r in rows])  # [4, T]
    mask = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in rows])  # [4, T]
    values, _ = ktae.token_values(ids, mask, torch.tensor([[1.0, 1.0, 0.0, 0.0]]),
                                  special_ids=(tok.pad_token_id, tok.eos_token_id))
    only_right, only_wrong = set(right) - set(wrong), set(wrong) - set(right)
    assert only_right and only_wrong
    for i, row in enumerate(ids.tolist()):
        for j, (t, v) in enumerate(zip(row, values[i].tolist())):
            if mask[i, j]:  # ids in both classes: 0; only in the right ones: positive; only in the wrong: negative
                assert (v > 0) if t in only_right else (v < 0) if t in only_wrong else (v == 0), (tok.decode([t]), v)


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed: "
                                                                            "pip install -r requirements/bench.txt")
def test_llama_cpp_decodes_the_same_gguf_batched_as_one_at_a_time(qwen):
    # the bench's llama.cpp reference (benchparts/llamacpp.decode), greedy: both prompts x 2 together give what each
    # prompt alone gives, and its first token is our model's (the same file, its 4-bit weights against our float32)
    from tools.perf.benchparts import llamacpp
    import llama_cpp
    model, tok = qwen
    ids = prompts(tok)
    llm = llama_cpp.Llama(model_path=os.path.join(*models.gguf_location(NAME)), n_threads=THREADS, n_ctx=512,
                          verbose=False)
    try:
        together, _ = llamacpp.decode(llm, ids, 2, 8, 0.0, 0, THREADS)
        alone = [llamacpp.decode(llm, [p], 1, 8, 0.0, 0, THREADS)[0][0] for p in ids]
    finally:
        llm.close()
    assert together == [alone[0], alone[0], alone[1], alone[1]]
    ours = sample.generate(model, ids, max_new_tokens=1, temperature=0.0, eos_id=tok.eos_token_id,
                           pad_id=tok.pad_token_id)["input_ids"][:, -1].tolist()
    assert [alone[0][0], alone[1][0]] == ours
