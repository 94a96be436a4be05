"""SHEAR, S1-S5 of EQUATIONS.md#shear: each equation on numbers checked by hand, the rule on the tiny model."""
import pytest
import torch

import grpo
import methods
import sample
import shear
from config import training


def test_s2_spans_of_k_tokens_from_the_responses_first_token():
    assert shear.span_index(5, 2).tolist() == [0, 0, 1, 1, 2]
    assert shear.span_index(3, 1).tolist() == [0, 1, 2]


def test_s3_wasserstein_1d_by_hand_and_its_padding_ignored():
    # F_x - F_y: 1/2 on [0, 1), 1 - 1/3 on [1, 2), 1 - 2/3 on [2, 3): 0.5 + 2/3 + 1/3 = 1.5
    x, y = torch.tensor([[[0.0], [1.0]]]), torch.tensor([[[1.0], [2.0], [3.0], [-50.0]]])  # y's last is padding
    got = shear.wasserstein_1d(x, torch.ones(1, 2), y, torch.tensor([[1, 1, 1, 0]]))
    assert torch.allclose(got, torch.tensor([[1.5]]))
    # the CDFs cross: {0, 3} vs {1, 2}: 1/2 on [0, 1), 0 on [1, 2), |1/2 - 1| on [2, 3): 1 (0 -> 1 and 3 -> 2)
    cross = shear.wasserstein_1d(torch.tensor([[[0.0], [3.0]]]), torch.ones(1, 2), torch.tensor([[[1.0], [2.0]]]),
                                 torch.ones(1, 2))
    assert torch.allclose(cross, torch.tensor([[1.0]]))
    # two dimensions at once, each its own: {0, 1} vs {0, 1} is 0; {0, 0} vs {4, 4} is 4
    x2, y2 = torch.tensor([[[0.0, 0.0], [1.0, 0.0]]]), torch.tensor([[[0.0, 4.0], [1.0, 4.0]]])
    assert torch.allclose(shear.wasserstein_1d(x2, torch.ones(1, 2), y2, torch.ones(1, 2)), torch.tensor([[0.0, 4.0]]))
    # a side with no value: 0, marked unmeasured by its caller
    assert shear.wasserstein_1d(x, torch.zeros(1, 2), y, torch.ones(1, 4)).item() == 0


def _group():
    """The docstring's example, H = 1, K = 2: a wrong rollout [0, 1 | 5, 6], a right one [1, 2 | 5, 6], and a right
    one of a single token [3]."""
    h = torch.tensor([[0.0, 1, 5, 6], [1, 2, 5, 6], [3, 0, 0, 0]])[..., None]  # [3, 4, 1]
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 1], [1, 0, 0, 0]])
    return h, mask, torch.tensor([False, True, True])


def test_s3_each_span_against_the_same_span_of_the_other_outcome():
    h, mask, correct = _group()
    d, measured = shear.span_distances(h, mask, correct, span=2)
    # wrong: span 0 {0, 1} vs the right ones' pooled {1, 2, 3}: 1.5; span 1 {5, 6} vs {5, 6}: 0
    # right 1: span 0 {1, 2} vs the wrong one's {0, 1}: a shift by 1; span 1: 0
    # right 2: {3} vs {0, 1}: (3 + 2) / 2 = 2.5 (its own outcome's rollout, right 1, is not in its pool)
    assert torch.allclose(d, torch.tensor([[1.5, 1.5, 0, 0], [1, 1, 0, 0], [2.5, 0, 0, 0]]))
    assert torch.equal(measured, mask)
    # the same by any number of rollouts at a time (speed only)
    d1, _ = shear.span_distances(h, mask, correct, span=2, max_elements=1)
    assert torch.equal(d1, d)


def test_s3_a_rollout_of_its_own_outcome_never_enters_its_pool():
    # a fourth rollout, wrong and far away: the wrong rollout's distances do not move, the right ones' do
    h, mask, correct = _group()
    h4, mask4 = torch.cat([h, torch.full((1, 4, 1), 100.0)]), torch.cat([mask, torch.ones(1, 4)])
    d, _ = shear.span_distances(h4, mask4, torch.cat([correct, torch.tensor([False])]), span=2)
    assert torch.allclose(d[0], torch.tensor([1.5, 1.5, 0, 0])) and d[1, 0] > 1


def test_s4_weights_keep_the_rollouts_mass_and_alpha_moves_them_towards_one():
    h, mask, correct = _group()
    d, measured = shear.span_distances(h, mask, correct, span=2)
    # wrong: dbar = (1.5 + 1.5 + 0 + 0) / 4 = 0.75 -> 1.5 / 0.75 = 2 and 0; right 1: dbar 0.5 -> 2 and 0
    # right 2: one token, d / dbar = 1
    w = shear.weights(d, measured, mask, alpha=1.0)
    assert torch.allclose(w, torch.tensor([[2.0, 2, 0, 0], [2, 2, 0, 0], [1, 0, 0, 0]]))
    assert torch.allclose(w.sum(-1), mask.sum(-1))  # the mass: each rollout's weights sum to its tokens
    # alpha 0.5: 1 + 0.5 (2 - 1) = 1.5 and 1 + 0.5 (0 - 1) = 0.5
    assert torch.allclose(shear.weights(d, measured, mask, alpha=0.5)[0], torch.tensor([1.5, 1.5, 0.5, 0.5]))
    # an unmeasured token keeps 1 and the measured ones keep their own mass; all distances 0: all 1
    half = torch.tensor([[1.0, 1, 0, 0]])
    assert torch.allclose(shear.weights(torch.tensor([[3.0, 1, 0, 0]]), half, torch.ones(1, 4)),
                          torch.tensor([[1.5, 0.5, 1, 1]]))
    assert torch.equal(shear.weights(torch.zeros(1, 4), torch.ones(1, 4), torch.ones(1, 4)), torch.ones(1, 4))


def test_s5_the_advantage_times_the_weight_and_the_losss_gradient():
    # A = [-0.8, 0.8], weights [2, 0] and [1, 1]: A_t = [-1.6, 0] and [0.8, 0.8]; the weights are constants
    w = torch.tensor([[2.0, 0.0], [1.0, 1.0]], requires_grad=True)
    adv = shear.token_advantages(torch.tensor([-0.8, 0.8]), w, torch.ones(2, 2))
    assert torch.allclose(adv, torch.tensor([[-1.6, 0.0], [0.8, 0.8]])) and not adv.requires_grad
    # at rho = 1 the seq-mean-token-mean loss's gradient is -A_t / (N |o_i|) = -A_t / 4
    logp = torch.zeros(2, 2, requires_grad=True)
    loss, _ = grpo.policy_loss(logp, torch.zeros(2, 2), adv, torch.ones(2, 2))
    loss.backward()
    assert torch.allclose(logp.grad, -adv / 4)


def test_s1_the_last_layers_state_at_each_response_token(base):
    model, tok = base
    torch.manual_seed(0)
    batch = sample.generate(model, [tok("Q:7+8-9=?\nA:")["input_ids"], tok("Q:1+2=?\nA:")["input_ids"]], n=2,
                            max_new_tokens=20, temperature=1.0, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    got = shear.hidden_states(model, batch, torch.tensor([3, 0]), chunk=1)  # [2, T, H]
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    position_ids=sample.position_ids(batch["attention_mask"]), output_hidden_states=True)
    want = out.hidden_states[-1][[3, 0], batch["prompt_len"]:]  # [2, T, H] after the final norm
    assert torch.allclose(got, want, atol=1e-5)


def test_the_rule_weighs_mixed_groups_only_and_keeps_each_rollouts_mass(base):
    model, tok = base
    torch.manual_seed(0)
    problems = [{"prompt": "Q:7+8-9=?\nA:", "answer": "6"}, {"prompt": "Q:1+2=?\nA:", "answer": "3"}]
    batch = sample.generate(model, [tok(p["prompt"])["input_ids"] for p in problems], n=4, max_new_tokens=30,
                            temperature=1.0, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    rewards = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])  # the second group all wrong: A_i = 0
    mask = batch["response_mask"].float()
    ctx = methods.Context(training.parse_args(["--method", "shear", "--group-size", "4"]), model, tok, problems)
    got = methods.RULES["shear"].advantages(batch, rewards, mask, ctx)
    assert torch.allclose(got.tokens, shear.token_advantages(got.seq, got.values, mask))
    assert torch.allclose(got.values[:4].sum(-1), mask[:4].sum(-1), rtol=1e-5)  # S4's mass, per rollout
    assert not torch.allclose(got.values[:4], mask[:4])  # the weights moved
    assert torch.equal(got.values[4:], mask[4:])  # an all-wrong group is not scored
    # blame: a wrong rollout's highest weight (its advantage is negative)
    assert torch.equal(methods.RULES["shear"].blame(got, batch, mask, ctx.args), got.values)


@pytest.mark.parametrize("flags, message", [(["--shear-span", "0"], "--shear-span 0"),
                                            (["--shear-alpha", "1.5"], "--shear-alpha 1.5")])
def test_bad_settings_are_one_line_naming_the_flag(flags, message):
    with pytest.raises(SystemExit, match=message):
        training.parse_args_one_line(["--method", "shear", *flags])
