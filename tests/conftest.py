import os
import sys

import torch

# tests import the flat modules of the project root
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# TEST_THREADS=1 or 2 (default 2): float sums may group differently with the thread count, so the suite runs with both
THREADS = int(os.environ.get("TEST_THREADS", "2"))
torch.set_num_threads(THREADS)

import pytest


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

    def chunk_logprobs(head, h, targets, temperature):
        logits = up(head(h))  # [n, V]
        if temperature > 0:
            logits = logits / temperature
        return logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)  # [n]

    monkeypatch.setattr(modeling_qwen2.Qwen2RMSNorm, "forward", rms_norm)
    monkeypatch.setattr(sample, "_chunk_logprobs", chunk_logprobs)
