"""oar.py: O1-O6 with hand-computed numbers, OAR-P on a model where one token decides the answer, OAR-G's
hygiene (parameter gradients and the model's mode untouched)."""
import math
from types import SimpleNamespace

import pytest
import torch

import oar
import sample
from infra import fastpath
from toyworld import tiny


def test_reasoning_length_from_sampled_pieces():
    pieces = ["1", "+", "2", "=", "3", "\n", "\\", "b", "o", "x", "e", "d", "{", "3", "}"]
    assert oar.reasoning_length(pieces) == 6
    # a BPE piece may start before the marker (" \\boxed"): that piece is not reasoning
    assert oar.reasoning_length(["So", " x", " =", " \\boxed", "{", "3", "}"]) == 3
    assert oar.reasoning_length(["\\boxed{", "1", "}", " or ", "\\boxed{", "2", "}"]) == 4  # the last marker
    assert oar.reasoning_length(["no", " marker"]) == 2  # the whole response


def test_normalise_and_reshape_by_hand():
    # The docstring's example: s = log(1 + I) = [1, 0, 2, 0.5, 0.25] -> Ihat = s / 2 = [0.5, 0, 1, 0.25, 0.125];
    # tau = quantile(sorted [0, .125, .25, .5, 1], 0.25) = the element at position 0.25 * 4 = 1 -> 0.125.
    # w = [1 + .375/.875, max(0/.125, 0.1), 1 + .875/.875, 1 + .125/.875, 1 + 0] = [1.428571, 0.1, 2, 1.142857, 1]
    # sum w = 5.671429; wt = w * 5 / 5.671429.
    s = torch.tensor([[1.0, 0.0, 2.0, 0.5, 0.25, 0.0]])
    scores = torch.expm1(s)
    reason = torch.tensor([[1, 1, 1, 1, 1, 0]])  # the sixth column is outside the reasoning span
    ihat = oar.normalise(scores, reason)
    assert ihat[0].tolist() == pytest.approx([0.5, 0.0, 1.0, 0.25, 0.125, 0.0], abs=1e-6)
    assert oar.quantile(ihat, reason, 0.25).item() == pytest.approx(0.125, abs=1e-6)
    wt = oar.reshape(ihat, reason, q=0.25, beta=1.0)
    w = [1 + 0.375 / 0.875, 0.1, 2.0, 1 + 0.125 / 0.875, 1.0]
    assert wt[0, :5].tolist() == pytest.approx([x * 5 / sum(w) for x in w], abs=1e-5)
    assert wt[0, :5].sum().item() == pytest.approx(5.0, abs=1e-5)  # mass preservation: sum = R
    assert wt[0, 5].item() == 1.0  # outside the span: 1


def test_reshape_floor_and_quantile_interpolation():
    # Ihat = [0, 0.2, 0.4, 1], q = 0.5: position 0.5 * 3 = 1.5 -> tau = 0.2 + 0.5 * (0.4 - 0.2) = 0.3
    # w = [max(0, 0.1), max(0.2/0.3, 0.1), 1 + 2 (0.4-0.3)/0.7, 1 + 2 (1-0.3)/0.7] = [0.1, 0.6667, 1.2857, 3] (beta 2)
    ihat, reason = torch.tensor([[0.0, 0.2, 0.4, 1.0]]), torch.ones(1, 4, dtype=torch.long)
    assert oar.quantile(ihat, reason, 0.5).item() == pytest.approx(0.3, abs=1e-6)
    wt = oar.reshape(ihat, reason, q=0.5, beta=2.0)
    w = [0.1, 0.2 / 0.3, 1 + 2 * 0.1 / 0.7, 3.0]
    assert wt[0].tolist() == pytest.approx([x * 4 / sum(w) for x in w], abs=1e-5)


def test_degenerate_cases_give_weights_one():
    reason = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    scores = torch.tensor([[0.7, 0.7, 0.7, 9.0],  # all equal -> Ihat 0 = tau -> w = 1
                           [5.0, 0.0, 0.0, 0.0],  # R = 1 < 2
                           [0.0, 0.0, 0.0, 0.0]])  # R = 0
    wt = oar.reshape(oar.normalise(scores, reason), reason)
    assert torch.equal(wt, torch.ones(3, 4))


def test_plug_in_multiplies_the_sequence_advantage():
    adv = oar.token_advantages(torch.tensor([2.0, 0.0]), torch.tensor([[0.5, 1.5, 1.0], [3.0, 1.0, 1.0]]),
                               torch.tensor([[1, 1, 0], [1, 1, 1]]))
    assert adv.tolist() == [[1.0, 3.0, 0.0], [0.0, 0.0, 0.0]]  # 2 * [0.5, 1.5] and the mask; A_i = 0 stays 0


def test_outcome_probe_modes_by_hand():
    # logits [1, 3, 2]; probe positions 1 and 2. last: z = [1, 3]; answer_mean: z = mean([1, 3], [3, 1]) = [2, 2]
    logits = torch.tensor([[[9.0, 9.0], [1.0, 3.0], [3.0, 1.0]]])
    probe = torch.tensor([[0, 1, 1]])
    last = oar.outcome_probe(logits, probe, "last").exp()
    assert last[0].tolist() == pytest.approx([1 / (1 + math.e ** 2), 1 / (1 + math.e ** -2)], abs=1e-6)
    assert oar.outcome_probe(logits, probe, "answer_mean").exp()[0].tolist() == pytest.approx([0.5, 0.5])
    # KL(P || Q) by hand: P = [0.5, 0.5], Q = [0.25, 0.75] -> 0.5 log 2 + 0.5 log(2/3)
    p, q = torch.tensor([[0.5, 0.5]]).log(), torch.tensor([[0.25, 0.75]]).log()
    assert oar.kl(p, q).item() == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(2 / 3), abs=1e-6)


class KeyTokenModel(torch.nn.Module):
    """A causal model where one token decides the answer: the logits at a position are the sum of the output
    rows of the tokens so far, and token 5's row is 100x the others'. Enough of the HF interface for oar.py."""

    def __init__(self, vocab=8):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.emb = torch.nn.Embedding(vocab, vocab)
        with torch.no_grad():
            self.emb.weight.copy_(0.01 * torch.randn(vocab, vocab, generator=g))
            self.emb.weight[5] = 0.0
            self.emb.weight[5, 3] = 1.0  # token 5 says "the answer is 3"

    def get_input_embeddings(self):
        return self.emb

    def forward(self, input_ids=None, inputs_embeds=None, attention_mask=None, logits_to_keep=0, **kw):
        e = self.emb(input_ids) if inputs_embeds is None else inputs_embeds  # [n, L, V]
        logits = 4.0 * (e * attention_mask[..., None]).cumsum(1)  # [n, L, V]
        return SimpleNamespace(logits=logits[:, -logits_to_keep:] if logits_to_keep else logits)


def test_oar_p_ranks_the_deciding_token_first():
    model = KeyTokenModel()
    prompt, reasoning, cue, answer = [1, 2], [4, 6, 5, 7, 2], [1], [3, 0]
    ids, attn, reason, probe, _ = oar.build_inputs([prompt], [reasoning], [5], cue, [answer], pad_id=0)
    assert ids[0].tolist() == prompt + reasoning + cue + answer and reason[0].tolist() == [0, 0, 1, 1, 1, 1, 1, 0, 0, 0]
    assert probe[0].tolist() == [0] * 7 + [1, 1, 0]  # columns 7, 8 predict the answer tokens at 8, 9
    for mode in ("last", "answer_mean"):
        scores = oar.perturbation_scores(model, ids, attn, reason, probe, pad_id=0, mode=mode)[0, 2:7]
        assert scores.argmax().item() == 2  # token 5, the third reasoning token
        assert scores[2] > 100 * scores[[0, 1, 3, 4]].max()
    g = oar.gradient_scores(model, ids, attn, reason, probe, sigma=1e-3)[0, 2:7]
    assert g.argmax().item() == 2


def test_probe_kl_is_zero_when_nothing_is_perturbed(base):
    model, tok = base
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]
    ids, attn, reason, probe, _ = oar.build_inputs([enc(tiny.prompt("3+4"))], [enc("3+4=7\n")], [6], enc("\\boxed{"),
                                                [enc("7}")], tok.pad_token_id)
    model.eval()
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=attn).logits
        again = model(input_ids=ids, attention_mask=attn).logits
    for mode in ("last", "answer_mean"):
        assert oar.kl(oar.outcome_probe(out, probe, mode), oar.outcome_probe(again, probe, mode)).item() == 0.0
    # At the clean input J = 0 and so is its gradient: up to float rounding (the forward with grad takes other
    # kernels than the no-grad one), far below what the sigma = 1e-3 noise gives. The scores live on the reasoning.
    g0 = oar.gradient_scores(model, ids, attn, reason, probe, sigma=0.0)
    torch.manual_seed(0)  # the noise's draw: over seeds 0-7 g.max() was 2e-5 to 1.4e-4, but one draw gave 3e-6
    g = oar.gradient_scores(model, ids, attn, reason, probe, sigma=1e-3)
    assert g0.max() < 1e-3 * g.max() and g[~reason.bool()].abs().max() == 0


def test_oar_on_the_tiny_world_marks_the_last_line(base):
    # What the scores look like on the tiny world: the answer is copied from the last line's result, so the last
    # "=" and the result carry almost all of OAR-P's score, and one of them tops OAR-G's.
    model, tok = base
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]
    ids, attn, reason, probe, _ = oar.build_inputs([enc(tiny.prompt("7+8-9"))], [enc("7+8=15\n15-9=6\n")], [14],
                                                enc("\\boxed{"), [enc("6}")], tok.pad_token_id)
    p = oar.perturbation_scores(model, ids, attn, reason, probe, tok.pad_token_id, "last")[reason.bool()]
    assert set(p.topk(2).indices.tolist()) == {11, 12}  # "=" and "6" of "15-9=6"
    torch.manual_seed(0)  # OAR-G draws one noise sample: over seeds 0-11 the result topped it 11 times, "=" once
    g = oar.gradient_scores(model, ids, attn, reason, probe, "answer_mean")[reason.bool()]
    assert g.argmax().item() in {11, 12}


def test_oar_g_leaves_parameter_gradients_and_mode_untouched(base):
    model, tok = base
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.5)
    before = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.train()
    prompts, responses = [enc(tiny.prompt("3+4")), enc(tiny.prompt("9-2"))], [enc("3+4=7\n\\boxed{7}"), enc("9-2=7\n")]
    pieces = [[tok.decode([t]) for t in r] for r in responses]
    w = oar.token_weights(model, prompts, responses, pieces, [enc("7}"), enc("7}")], enc("\\boxed{"),
                          torch.tensor([1.0, -1.0]), 16, tok.pad_token_id, scorer="gradient", probe="answer_mean",
                          q=0.25, beta=1.0, sigma=1e-3, chunk=1)
    assert model.training  # left in the mode it was found in
    assert all(torch.equal(p.grad, before[n]) for n, p in model.named_parameters())
    assert w[0, :6].sum().item() == pytest.approx(6.0, abs=1e-4) and torch.all(w[0, 6:] == 1)  # R = 6, then the box
    assert w[1, :6].sum().item() == pytest.approx(6.0, abs=1e-4)  # no marker: the whole response is reasoning
    for p in model.parameters():
        p.grad = None
    model.eval()
    oar.token_weights(model, prompts, responses, pieces, [enc("7}"), enc("7}")], enc("\\boxed{"),
                      torch.tensor([1.0, 0.0]), 16, tok.pad_token_id, scorer="perturb", probe="last",
                      q=0.25, beta=1.0, sigma=1e-3, chunk=4)
    assert not model.training and all(p.grad is None for p in model.parameters())


def test_zero_advantage_rollouts_are_not_scored():
    class Boom(torch.nn.Module):
        def forward(self, *a, **k):
            raise AssertionError("a rollout with A_i = 0 was scored")

    w = oar.token_weights(Boom(), [[1]], [[2, 3]], [["a", "b"]], [[4]], [5], torch.tensor([0.0]), 3, 0,
                          scorer="perturb", probe="last", q=0.25, beta=1.0, sigma=1e-3, chunk=8)
    assert torch.equal(w, torch.ones(1, 3))


def test_share_rows_where_a_reasoning_reaches_the_probe_columns(base):
    # Row 0's answer is 14 tokens ("1234567890123}"), row 1's 2 ("7}"): the probe columns are the last 15 (from row
    # 0's first probe position to the end), and row 1's cue + answer fill 9 of them, so its reasoning ends inside.
    # A copy perturbed there must start at the cached columns' end (min(column, head) in O2), not at its own
    # column, past what the cache holds.
    model, tok = base
    model.eval()
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]
    prompts = [enc(tiny.prompt(q)) for q in ("7+8-9", "3+4")]
    responses = [enc(r) for r in ("7+8=15\n15-9=6\n", "3+4=7\n")]
    answers = [enc("1234567890123}"), enc("7}")]
    ids, attn, reason, probe, P = oar.build_inputs(prompts, responses, [len(r) for r in responses],
                                                   enc("\\boxed{"), answers, tok.pad_token_id)
    head = ids.shape[1] - oar._probe_columns(probe)
    assert reason[1, head:].sum() > 0  # the case under test: row 1's reasoning lies in the probe columns
    plain = oar.perturbation_scores(model, ids, attn, reason, probe, tok.pad_token_id, "last", chunk=4)
    rows = oar.perturbation_scores(model, ids, attn, reason, probe, tok.pad_token_id, "last", chunk=4,
                                   share_rows=True)
    assert plain[1, head:].max() > 0 and torch.allclose(rows, plain, rtol=1e-2, atol=1e-5 * plain.max().item())


def test_shared_prompts_give_the_plain_scores(base):
    # Rows 0, 2 and 3 share one prompt, row 1 has another (shorter: it is padded on the left). With groups each
    # prompt runs once and the forwards cover the columns after it; the scores must be those of the plain forward
    # over every column. OAR-G's noise is drawn token by token over the reasoning, so one seed gives both the same.
    model, tok = base
    model.eval()
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]
    prompts = [enc(tiny.prompt(q)) for q in ("7+8-9", "3+4", "7+8-9", "7+8-9")]
    responses = [enc(r) for r in ("7+8=15\n15-9=6\n", "3+4=7\n", "7+8=16\n", "7+8=15\n15-9=7\n")]
    lengths = [len(r) for r in responses]
    answers = [enc("6}"), enc("7}"), enc("6}"), enc("6}")]
    ids, attn, reason, probe, P = oar.build_inputs(prompts, responses, lengths, enc("\\boxed{"), answers,
                                                   tok.pad_token_id)
    assert P == len(prompts[0]) > len(prompts[1]) and attn[1, :P].sum() == len(prompts[1])
    groups = torch.tensor([0, 1, 0, 0])
    plain = oar.perturbation_scores(model, ids, attn, reason, probe, tok.pad_token_id, "last", chunk=16)
    fast = fastpath.prompt_sharing(model, ids, attn, sample.position_ids(attn), P, groups)  # each prompt once
    shared = oar.perturbation_scores(model, ids, attn, reason, probe, tok.pad_token_id, "last", chunk=16,
                                     forward=fast)
    # (float sums in another order: the smallest KLs, under 1e-6 of the largest, moved by up to 1 % here)
    assert plain.max() > 0 and torch.allclose(shared, plain, rtol=1e-2, atol=1e-5 * plain.max().item())
    # each whole row run once, each copy from its perturbed token on; chunk 3 mixes rows and starts in a chunk
    rows = oar.perturbation_scores(model, ids, attn, reason, probe, tok.pad_token_id, "last", chunk=3,
                                   forward=fast, share_rows=True)
    assert torch.allclose(rows, plain, rtol=1e-2, atol=1e-5 * plain.max().item())
    torch.manual_seed(0)
    plain = oar.gradient_scores(model, ids, attn, reason, probe)
    torch.manual_seed(0)
    shared = oar.gradient_scores(model, ids, attn, reason, probe, forward=fast)
    assert plain.max() > 0 and torch.allclose(shared, plain, rtol=1e-2, atol=1e-5 * plain.max().item())
    assert torch.equal(shared != 0, reason.bool() & (plain != 0))
    # what a GPU run with --bf16 does (CPU autocast here): the written-out forward takes mixed dtypes
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fast = fastpath.prompt_sharing(model, ids, attn, sample.position_ids(attn), P, groups)
        half = oar.gradient_scores(model, ids, attn, reason, probe, forward=fast)
    assert half.isfinite().all() and (half[reason.bool()] > 0).all()


def test_o7_concentration_diagnostics():
    # row 1: a = [1, 1, 1, 1] -> ESS 16 / (4 * 4) = 1, top-10% = ceil(0.4) = 1 token -> 1/4
    # row 2: a = [3, 1] -> ESS 16 / (2 * 10) = 0.8, top-10% = ceil(0.2) = 1 token -> 3/4
    # row 3: A_i = 0 -> left out of the means
    adv = torch.tensor([[1.0, -1.0, 1.0, 1.0], [3.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    d = oar.advantage_concentration(adv, mask, torch.tensor([1.0, 2.0, 0.0]))
    assert d["ess_ratio"] == pytest.approx((1 + 0.8) / 2)
    assert d["top10_mass"] == pytest.approx((0.25 + 0.75) / 2)
