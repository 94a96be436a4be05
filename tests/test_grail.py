"""GRAIL (grail.py, R1-R6 of EQUATIONS.md#grail): each equation on numbers checked by hand, the saliency against a
finite difference on the tiny model, and the rule in the table (the wrong-only default, no box)."""
import math

import pytest
import torch

import grail
import methods
import sample
from config import training
from conftest import assert_close, record_margin
from toyworld import tiny


def test_r1_the_first_complete_box_its_content_and_boundary():
    # tokens:    0    1     2         3    4    5    6    7
    pieces = ["x", "=", "\\boxed", "{", "1", "2", "}", "."]
    assert grail.answer_span(pieces) == (2, 4, 7)  # box 2..6, content 4..5 ("12"), the closing brace 6
    # a token holding the marker's last character and the content's first is the marker's (content starts after)
    assert grail.answer_span(["\\boxed{1", "2", "}"]) == (0, 1, 3)
    # braces inside the box are counted, escaped ones too, as the authors count them: \{ opens, \} closes
    assert grail.answer_span(["\\boxed{", "\\{", "x", "\\}", "}"]) == (0, 1, 5)
    # a box left open is passed over for the next complete one; the first complete one wins over a later one
    assert grail.answer_span(["\\boxed{", "1", " and ", "\\boxed{", "2", "}"]) == (3, 4, 6)
    assert grail.answer_span(["\\boxed{", "1", "}", " or ", "\\boxed{", "2", "}"]) == (0, 1, 3)
    assert grail.answer_span(["boxed{1}"]) is None and grail.answer_span([]) is None  # no marker: no box


def test_r2_the_answer_loss_at_the_temperature_and_its_gradient():
    # one row, 2 positions over a vocabulary of 2: logits [0, log 3] -> p(token 1) = 3/4; at temperature 2 the
    # logits halve: [0, log 3 / 2] -> p(1) = sqrt(3) / (1 + sqrt(3)); the second position is not the answer's
    logits = torch.tensor([[[0.0, math.log(3)], [5.0, -5.0]]], requires_grad=True)
    targets, mask = torch.tensor([[1, 0]]), torch.tensor([[1.0, 0.0]])
    assert grail.answer_loss(logits, targets, mask, 1.0).item() == pytest.approx(-math.log(0.75))
    loss = grail.answer_loss(logits, targets, mask, 2.0)
    assert loss.item() == pytest.approx(-math.log(math.sqrt(3) / (1 + math.sqrt(3))))
    loss.backward()  # dL/dz = (softmax(z / T) - onehot) / T: [0.366 - 0, 0.634 - 1] / 2 on the answer's position
    p1 = math.sqrt(3) / (1 + math.sqrt(3))
    # margin: the two paths used 0.081 of the tolerance at worst (this project's CPU, 2026-11-25; TEST_MARGINS)
    assert_close(logits.grad, torch.tensor([[[(1 - p1) / 2, (p1 - 1) / 2], [0.0, 0.0]]]), rel=1e-6)


def test_r3_saliency_is_the_norm_of_the_elementwise_product():
    # position 0: g * e = [3 * 1, 4 * 1] -> 5; position 1: [1 * 2, -2 * 1] -> sqrt(8); |<g, e>| would be 7 and 0
    g = torch.tensor([[[3.0, 4.0], [1.0, -2.0]]])
    e = torch.tensor([[[1.0, 1.0], [2.0, 1.0]]])
    # margin: 0, bit for bit on this project's CPU (2026-11-25); the tolerance is for other CPUs' kernels
    assert_close(grail.saliency(g, e), torch.tensor([[5.0, math.sqrt(8)]]), rel=1e-7)


def test_r4_standardise_uses_the_population_variance_over_the_rollouts_tokens():
    # s = [e^-2, e^-1, 1, e, e^2] and two tokens off the mask: log(s + 1e-8) = [-2, -1, 0, 1, 2] (to 1e-7),
    # mean 0, population variance 10 / 5 = 2 -> z = [-2, -1, 0, 1, 2] / sqrt(2) (the sample variance 10 / 4 would
    # give z = [-1.265, ...])
    s = torch.tensor([[math.exp(-2), math.exp(-1), 1.0, math.e, math.exp(2), 0.3, 0.7]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0]])
    z = grail.standardise(s, mask)
    expect = torch.tensor([[-2.0, -1.0, 0.0, 1.0, 2.0, 0.0, 0.0]]) / math.sqrt(2)
    # margin: the two paths used 0.012 of the tolerance at worst (this project's CPU, 2026-11-25; TEST_MARGINS)
    assert_close(z, expect, rel=1e-6)
    # a token after the box has saliency 0: log(1e-8) = -18.42 counts in the mean and the variance
    z = grail.standardise(torch.tensor([[1.0, 1.0, 0.0]]), torch.tensor([[1, 1, 1]]))
    mean = -18.420681 / 3  # (0 + 0 - 18.420681) / 3
    var = (2 * mean ** 2 + (-18.420681 - mean) ** 2) / 3
    assert_close(z, torch.tensor([[-mean, -mean, -18.420681 - mean]]) / math.sqrt(var + 1e-8), rel=1e-5)


def test_r5_clipped_at_both_ends_then_fallback_and_the_boxs_overrides():
    # z = [-2, -0.5, 0, 3, 20]: 1 + 0.5 z = [0, 0.75, 1, 2.5, 11] -> clipped to [0.5, 0.75, 1, 2.5, 5]
    z = torch.tensor([[-2.0, -0.5, 0.0, 3.0, 20.0], [-2.0, -0.5, 0.0, 3.0, 20.0]])
    mask = torch.ones(2, 5)
    none = torch.zeros(2, 5)
    w = grail.weights(z, mask, torch.tensor([False, True]), none, none)
    # margin: 0, bit for bit on this project's CPU (2026-11-25); the tolerance is for other CPUs' kernels
    assert_close(w, torch.tensor([[0.5, 0.75, 1.0, 2.5, 5.0], [1.0] * 5]), rel=1e-7)  # row 1 falls back to 1
    # a box on tokens 2-4: content token 3 -> 5, marker 2 and closing brace 4 (and what follows) -> 1, in both rows,
    # the fallback one too; off the mask -> 0
    content = torch.tensor([[0, 0, 0, 1, 0]] * 2)
    boundary = torch.tensor([[0, 0, 1, 0, 1]] * 2)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    w = grail.weights(z, mask, torch.tensor([False, True]), content, boundary)
    assert_close(w, torch.tensor([[0.5, 0.75, 1.0, 5.0, 1.0], [1.0, 1.0, 1.0, 5.0, 0.0]]), rel=1e-7)
    # other settings: std 1, clip [0.25, 3]: 1 + z = [-1, 0.5, 1, 4, 21] -> [0.25, 0.5, 1, 3, 3]
    w = grail.weights(z[:1], torch.ones(1, 5), torch.tensor([False]), none[:1], none[:1], std=1.0, w_min=0.25,
                      w_max=3.0)
    assert_close(w, torch.tensor([[0.25, 0.5, 1.0, 3.0, 3.0]]), rel=1e-7)


def test_r6_token_advantages():
    # A = [-0.5, 2], w = [[1, 3, 0.5], [1, 1, 5]], mask drops row 1's last -> [[-0.5, -1.5, -0.25], [2, 2, 0]]
    adv = grail.token_advantages(torch.tensor([-0.5, 2.0]), torch.tensor([[1.0, 3.0, 0.5], [1.0, 1.0, 5.0]]),
                                 torch.tensor([[1, 1, 1], [1, 1, 0]]))
    # margin: 0, bit for bit on this project's CPU (2026-11-25); the tolerance is for other CPUs' kernels
    assert_close(adv, torch.tensor([[-0.5, -1.5, -0.25], [2.0, 2.0, 0.0]]), rel=1e-7)


def _rollout(tok):
    """A prompt and a wrong response of the tiny world with a box: token ids and decoded pieces."""
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompt, response = enc(tiny.prompt("7+8-9")), enc("7+8=15\n15-9=7\n\\boxed{7}")
    return prompt, response, [tok.decode([t]) for t in response]


def test_r3_saliency_equals_a_finite_difference_on_the_tiny_model(base, float64_exact):
    # s_t = ||dL/de * e|| of the input that predicts response token t, by the machinery (prompt sharing, the
    # prompt's last token in the forward) against a central difference of L in float64, coordinate by coordinate,
    # at three tokens: the first (predicted by the prompt's last token), one of the reasoning, one inside the box.
    # Measured here: within 1.6e-6 of the difference's value (0.016 of the bound 1e-4, which rounding in the
    # difference, about 1e-16 |L| / 1e-5 a coordinate, leaves room for); a wrong position or product is off by O(1)
    model, tok = base
    model = type(model)(model.config).double().eval()
    model.load_state_dict(base[0].state_dict())
    prompt, response, pieces = _rollout(tok)
    span = grail.answer_span(pieces)
    start, inner, end = span
    assert (start, inner, end) == (len(response) - 9, len(response) - 2, len(response))  # "\boxed{7}": 9 tokens
    s = grail.response_saliency(model, [prompt], [response], {0: span}, 0.7, tok.pad_token_id, len(response) + 1,
                                chunk=4)  # [1, T]
    ids = torch.tensor([prompt + response[:end]])  # the row: prompt and response up to the box's end
    P = len(prompt)

    def L(e):  # R2 on the whole row: the box's tokens, predicted at temperature 0.7
        logits = model(inputs_embeds=e, position_ids=torch.arange(e.shape[1])[None]).logits[:, :-1]
        targets, where = ids[:, 1:], torch.zeros_like(ids[:, 1:], dtype=torch.float64)
        where[:, P + start - 1:] = 1  # the positions predicting response tokens start .. end - 1
        return grail.answer_loss(logits, targets, where, 0.7).item()

    e = model.get_input_embeddings()(ids).detach()  # [1, L, H]
    for t in (0, 4, inner):
        col, g = P - 1 + t, torch.zeros(e.shape[-1], dtype=torch.float64)  # the input that predicts token t
        for h in range(e.shape[-1]):
            up, down = e.clone(), e.clone()
            up[0, col, h] += 1e-6
            down[0, col, h] -= 1e-6
            g[h] = (L(up) - L(down)) / 2e-6
        fd = (g * e[0, col]).norm().item()
        # margin: the two paths used 0.016 of the tolerance at worst (this project's CPU, 2026-11-25; TEST_MARGINS)
        record_margin(f"token {t}", abs(s[0, t].item() - fd) / (1e-4 * fd))
        assert s[0, t].item() == pytest.approx(fd, rel=1e-4), t
    assert (s[0, end:] == 0).all() and (s[0, :end] > 0).all()  # from the box's end on, nothing moves the answer


def _batch(tok, texts, prompt, correct):
    """A batch in sample.generate()'s layout of one group whose responses are the given texts."""
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    rows = [enc(t) + [tok.eos_token_id] for t in texts]
    T = max(map(len, rows))
    ids = torch.tensor([prompt + r + [tok.pad_token_id] * (T - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in rows])
    return {"input_ids": ids, "attention_mask": torch.cat([torch.ones(len(rows), len(prompt), dtype=torch.long),
                                                           mask], 1),
            "response_mask": mask, "truncated": torch.zeros(len(rows), dtype=torch.bool), "prompt_len": len(prompt),
            "correct": torch.tensor(correct), "logprobs": torch.zeros(mask.shape), "entropy": torch.zeros(mask.shape)}


@pytest.mark.parametrize("symmetry, weighted", [("wrong", [False, True, False]), ("both", [True, True, False])])
def test_the_rule_weighs_wrong_rollouts_only_by_default_and_none_without_a_box(base, symmetry, weighted):
    # one group: right with a box, wrong with a box, wrong without a box (advantages +, -, -). Weighted rows carry
    # their saliency's weights; the others 1, but every box's content 5 and its marker and closing brace 1
    model, tok = base
    prompt = tok(tiny.prompt("7+8-9"), add_special_tokens=False)["input_ids"]
    texts = ["7+8=15\n15-9=6\n\\boxed{6}", "7+8=15\n15-9=7\n\\boxed{7}", "7+8=15\n15-9=7\n"]
    batch = _batch(tok, texts, prompt, [True, False, False])
    args = training.parse_args(["--method", "grail", "--group-size", "3", "--grail-symmetry", symmetry])
    ctx = methods.Context(args, model, tok, [{"answer": "6"}])
    adv = methods.RULES["grail"].advantages(batch, torch.tensor([[1.0, 0.0, 0.0]]), batch["response_mask"], ctx)
    w, mask = adv.values, batch["response_mask"]
    for i, text in enumerate(texts):
        n = len(text)  # one token a character, and the EOS after
        box = text.find("\\boxed{")
        if box < 0:
            assert (w[i, :n + 1] == 1).all()  # no box: weight 1 everywhere
            continue
        assert w[i, n - 2] == 5 and (w[i, box:n - 2] == 1).all() and (w[i, n - 1:n + 1] == 1).all()
        before = w[i, :box]  # the reasoning: its saliency's weights, or 1 where the row is not weighted
        assert ((before != 1).any() and (before >= 0.5).all() and (before <= 5).all()) if weighted[i] else \
            (before == 1).all()
    assert torch.equal(adv.tokens, adv.seq[:, None] * w * mask)  # R6
    # the terms say where R5 clipped 1 + 0.5 z (the weight then on a bound) and where it set the box's content
    flag = lambda start: next(v for k, v in adv.terms.items() if k.startswith(start)).bool()  # noqa: E731
    clipped, raw = flag("saturated: R5 clips"), adv.terms["R5 1 + 0.5 z (before the clip)"]
    assert ((w[clipped] == 0.5) | (w[clipped] == 5)).all() and ((raw[clipped] < 0.5) | (raw[clipped] > 5)).all()
    free = ~raw.isnan() & mask.bool() & ~clipped  # weighed by its saliency, within the bounds
    assert torch.allclose(w[free], raw[free]) and free.any() == any(weighted)
    assert torch.equal(flag("saturated: R5 sets the box's content"), (w == 5) & ~clipped & mask.bool())


def test_the_rules_terms_flag_where_r5_clips_at_either_bound(base):
    # --grail-std 10 spreads 1 + 10 z past both of R5's bounds on the wrong rollout's reasoning (at the default 0.5 the
    # test above clips nothing): each token flagged is on a bound its unclipped value passed, each other one unclipped
    model, tok = base
    prompt = tok(tiny.prompt("7+8-9"), add_special_tokens=False)["input_ids"]
    batch = _batch(tok, ["7+8=15\n15-9=6\n\\boxed{6}", "7+8=15\n15-9=7\n\\boxed{7}"], prompt, [True, False])
    args = training.parse_args(["--method", "grail", "--group-size", "2", "--grail-std", "10"])
    adv = methods.RULES["grail"].advantages(batch, torch.tensor([[1.0, 0.0]]), batch["response_mask"],
                                            methods.Context(args, model, tok, [{"answer": "6"}]))
    w, raw = adv.values[1], adv.terms["R5 1 + 10 z (before the clip)"][1]  # [T] the wrong rollout
    clipped = next(v for k, v in adv.terms.items() if k.startswith("saturated: R5 clips 1 + 10 z to [0.5, 5]"))[1]
    low, high = clipped.bool() & (raw < 0.5), clipped.bool() & (raw > 5)
    assert low.any() and high.any() and (w[low] == 0.5).all() and (w[high] == 5).all()
    assert torch.equal(clipped.bool(), low | high)
    free = ~raw.isnan() & ~clipped.bool()
    assert free.any() and torch.allclose(w[free], raw[free])
