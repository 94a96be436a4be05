import json
import os
import shutil
import sys

import torch

# tests import the flat modules of the project root
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# TEST_THREADS=1 or 2: float sums may group differently with the thread count, so the suite runs with both. Default 2,
# or 1 in each of pytest-xdist's workers (-n 2 on 2 cores: a thread each, not two fighting over one core)
THREADS = int(os.environ.get("TEST_THREADS", "1" if os.environ.get("PYTEST_XDIST_WORKER") else "2"))
from infra import cpu  # noqa: E402
cpu.setup(THREADS)  # the threads, and freed memory kept for the next large tensor, as every entry point sets

import pytest


# The suite's files that take longest (seconds on 2 cores, 2026-11-28, .ci/run --durations), largest first. With
# pytest-xdist's --dist loadfile each worker takes whole files, two to start and the next as one ends; its default
# order is by number of tests, which left the 4-test, 280-s GPU rehearsal to start last, alone, while the other
# worker idled. Largest first (then the rest in their usual order) lets the two workers finish together.
SLOW_FIRST = ["test_smollm2.py", "test_bench.py", "test_gpu_check.py", "test_qwen.py", "test_train.py",
              "test_checkpoint.py", "test_evaluate.py", "test_cli.py", "test_track.py", "test_compare.py",
              "test_gpu_path.py", "test_models.py", "test_trl.py"]


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(os.path.basename(str(item.fspath)), len(rank)))  # stable: the rest as before


@pytest.fixture(autouse=True)
def float32_unless_asked(monkeypatch):
    """--bf16's default follows the hardware (infra/models.bf16_default): the suite pins it to float32 so that every
    CPU runs the same tests; a test that wants bf16 passes --bf16, and tests/test_models.py checks the default."""
    from infra import models
    monkeypatch.setattr(models, "native_bf16", lambda device: False)


@pytest.fixture(autouse=True)
def tmp_path_removed_after(request):
    """Removes each test's tmp_path when the test ends. Tests write real checkpoints with their optimizer state, and
    pytest keeps every tmp_path of its last three sessions, which filled CI's disk (docs/LOG.md, 2026-11-24). Asked
    for at setup, so tmp_path outlives this teardown. (pytest's tmp_path_retention_policy would need an ini file at
    the root, which shows the paper.)"""
    path = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def memory_recorded(request):
    """With TEST_MEMLOG=FILE, a JSON line per test: its worker and the process's peak resident memory so far (and of
    its finished children), in MiB. The peak only rises, so the test at which a worker's line jumps is the one that
    needs it: how the suite's two workers were kept from meeting at their peaks (docs/LOG.md, 2026-11-28)."""
    yield
    if os.environ.get("TEST_MEMLOG"):
        import resource
        with open(os.environ["TEST_MEMLOG"], "a") as f:
            f.write(json.dumps({"test": request.node.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", ""),
                                "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
                                "children_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024})
                    + "\n")


def record_margin(what: str, used: float):
    """With TEST_MARGINS=FILE, a JSON line per comparison: the test, what it compared and the share of its tolerance
    the difference used (max|diff| / bound). The margins the tolerance comments state were measured so:
    TEST_MARGINS=/tmp/margins.jsonl python -m pytest, then the largest share per test."""
    if os.environ.get("TEST_MARGINS"):
        with open(os.environ["TEST_MARGINS"], "a") as f:
            f.write(json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0], "what": what,
                                "used": used}) + "\n")


def alternating_grader():
    """A grader for (response, gold, stats) that marks every other call right, whatever the text: a group of 4
    rollouts graded one after another gets 2 right and 2 wrong, so it always mixes and the step does its whole work
    (G1 gives an unmixed group no advantage). A grader by the text's length mixed groups only by chance, and a
    change of the sampler's random stream once left every response of a test's step the same parity."""
    calls = iter(range(1 << 62))
    return lambda response, gold, stats=None: next(calls) % 2 == 0


def assert_close(actual, expected, rel: float = 1e-5, scale: float = None, what: str = ""):
    """max|actual - expected| <= rel * scale, scale = max|expected| unless given (tiny if 0).

    A tolerance relative to the scale of the whole tensor, not of each element: float rounding errors come
    from the tensor's largest terms, so an element near 0 may carry an error of rel * max|x|. An absolute
    tolerance instead passes or fails with the size of the numbers, which depends on data and model (the tiny
    model's weights are trained on the machine that runs the tests). For gradients pass the scale of all
    parameters' gradients together: errors flow from the shared upstream gradients into every parameter.
    """
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    scale = expected.abs().max().item() if scale is None else scale
    bound = rel * max(scale, torch.finfo(torch.float32).tiny)
    err = (actual - expected).abs().max().item() if actual.numel() else 0.0
    record_margin(what, err / bound)
    assert err <= bound, f"{what}: max|diff| {err:.3g} > {rel:g} x scale {scale:.3g} (max|expected| " \
                         f"{expected.abs().max().item():.3g})"


@pytest.fixture(scope="session")
def base():
    """The warm-started tiny base model (built once into .cache, about a minute on 2 cores, then read from disk)."""
    from toyworld import tiny
    model, tok, _ = tiny.load_or_build()
    return model, tok


@pytest.fixture
def float64_exact(monkeypatch):
    """Makes a float64 model compute in float64 throughout, for identities that must hold to ~1e-12.

    Two places compute in float32 whatever the model's dtype, which caps a float64 comparison at float32
    precision (1e-7 relative): HF's Qwen2RMSNorm (it casts its input to float32) and sample._chunk_logprobs
    (head(h).float(), meant to lift bf16 logits to float32). Both are replaced by the same arithmetic in the
    input's dtype; float32 and bf16 inputs still get float32 as before."""
    import sample
    from transformers.models.qwen2 import modeling_qwen2

    def up(x):
        return x if x.dtype == torch.float64 else x.float()

    def rms_norm(self, x):
        h = up(x)
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)).to(x.dtype)

    def chunk_logprobs(head, h, targets, temperature, fast=False):
        logits = up(head(h))  # [n, V]
        if temperature > 0:
            logits = logits / temperature
        return logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)  # [n]

    monkeypatch.setattr(modeling_qwen2.Qwen2RMSNorm, "forward", rms_norm)
    monkeypatch.setattr(sample, "_chunk_logprobs", chunk_logprobs)


def greedy_equals_generate(model, tok, prompts: list, new_tokens: int) -> dict:
    """Our sampler's greedy rollouts of the prompts (token-id lists), asserted token for token equal to
    transformers' model.generate; returns ours (sample.generate's layout) for further checks."""
    import sample
    ours = sample.generate(model, prompts, max_new_tokens=new_tokens, temperature=0.0, eos_id=tok.eos_token_id,
                           pad_id=tok.pad_token_id)
    ids, mask = sample.left_pad(prompts, tok.pad_token_id)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)[:, ids.shape[1]:]
    P, lengths = ours["prompt_len"], ours["response_mask"].sum(-1)
    for i in range(len(prompts)):
        assert ours["input_ids"][i, P:P + lengths[i]].tolist() == ref[i, :lengths[i]].tolist(), f"row {i}"
    return ours


def sampled_against_forward(model, tok, prompts: list, n: int, temperature: float, new_tokens: int = 40) -> tuple:
    """(the sampler's log-probs, the training forward's) of the response tokens of n rollouts per prompt, drawn at
    temperature from seed 0 (sample.generate, then sample.token_logprobs at the same temperature), and the batch."""
    import sample
    torch.manual_seed(0)
    out = sample.generate(model, prompts, n=n, max_new_tokens=new_tokens, temperature=temperature,
                          eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    with torch.no_grad():
        logp = sample.token_logprobs(model, out["input_ids"], out["attention_mask"], out["prompt_len"], temperature)
    m = out["response_mask"].bool()
    return out["logprobs"][m], logp[m], out


def checkpoint_reopens(path: str, model, tok, text: str) -> float:
    """A train.py checkpoint opens with AutoModelForCausalLM and AutoTokenizer: the same ids for `text`, the same chat
    template. Returns how far its weights moved from `model`'s (the largest change)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    saved, saved_tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    assert saved_tok(text)["input_ids"] == tok(text)["input_ids"] and saved_tok.chat_template == tok.chat_template
    return max((a - b).abs().max().item() for a, b in zip(saved.parameters(), model.parameters()))


def oar_span(tok, text: str):
    """(reasoning, the rest) of a response as OAR splits it (oar.reasoning_length) on this tokenizer's tokens."""
    import oar
    pieces = [tok.decode([t]) for t in tok(text, add_special_tokens=False)["input_ids"]]
    R = oar.reasoning_length(pieces)
    return "".join(pieces[:R]), "".join(pieces[R:])
