"""K1-K7 of EQUATIONS.md#ktae: the worked example, Fisher against scipy, IG, symmetry, masks."""
import math

import pytest
import torch

import grpo
import ktae

# the worked example of EQUATIONS.md#ktae-worked-example: r = [1, 1, 0, 0]
IDS = torch.tensor([[5, 6, 7], [5, 6, 8], [5, 9, 8], [5, 9, 9]])
MASK = torch.ones_like(IDS)
R = torch.tensor([1.0, 1.0, 0.0, 0.0])


def table(token):
    _, info = ktae.token_values(IDS, MASK, R[None])
    i = info["vocab"].tolist().index(token)
    return {k: v[i].item() for k, v in info.items()}


def test_k1_split():
    correct, n_T, n_F = ktae.split(torch.tensor([[0.6, -1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]]))  # 0.6: over-long
    assert correct[0].tolist() == [True, False, True, False] and n_T.tolist() == [2, 3] and n_F.tolist() == [2, 1]


def test_k2_presence_not_count():
    t = ktae.contingency(IDS, MASK, R > 0, G=4)
    v = t["vocab"].tolist()
    assert v == [5, 6, 7, 8, 9]
    # id 9: twice in o_4, once in o_3 -> present in 2 incorrect rollouts: a=0 b=2 c=2 d=0; counted 3 times
    i = v.index(9)
    assert [t[k][i].item() for k in "abcd"] == [0, 2, 2, 0] and t["count_F"][i] == 3
    assert (t["L_T"] == 6).all() and (t["L_F"] == 6).all()  # the group's class lengths, on every entry


def test_k3_worked_example_fisher():
    # id 6: a=2 b=0 c=0 d=2 -> P(k) = 1/6, 4/6, 1/6, p = 1/3, F = exp(-2/3) = 0.5134
    assert table(6)["p"] == pytest.approx(1 / 3)
    assert table(6)["F"] == pytest.approx(math.exp(-2 / 3), abs=1e-4)
    # id 5 in every rollout and id 8 (a=b=c=d=1): p = 1 exactly, F = 0 (not exp(-2) = 0.135)
    assert table(5)["p"] == 1.0 and table(5)["F"] == 0.0
    assert table(8)["p"] == 1.0 and table(8)["F"] == 0.0


def test_k3_fisher_equals_scipy_on_every_table_with_G_16():
    from scipy.stats import fisher_exact
    rows = [(a, b, nT - a, 16 - nT - b) for nT in range(1, 16) for a in range(nT + 1) for b in range(16 - nT + 1)
            if a + b > 0]
    a, b, c, d = (torch.tensor([r[j] for r in rows]) for j in range(4))
    ours = ktae.fisher_p(a, b, c, d)
    ref = torch.tensor([fisher_exact([[r[0], r[1]], [r[2], r[3]]]).pvalue for r in rows], dtype=torch.float64)
    assert len(rows) == 920  # sum over n_T = 1..15 of (n_T + 1)(17 - n_T) tables, less the one with a = b = 0
    assert torch.allclose(ours, ref, rtol=1e-9, atol=1e-12)
    assert torch.equal(ours == 1, ref == 1)  # p = 1 exactly where scipy says 1


def test_k4_information_gain():
    # perfect separation (id 6) -> 1 bit; present everywhere (id 5) -> 0
    assert table(6)["IG"] == pytest.approx(1.0)
    assert table(5)["IG"] == pytest.approx(0.0, abs=1e-12)
    # id 7: a=1 b=0 c=1 d=2: H_Y = 1, H_Y|X = 1/4 * 0 + 3/4 * H(1/3, 2/3) = 0.75 * 0.918296 = 0.688722
    assert table(7)["IG"] == pytest.approx(1 - 0.75 * 0.918296, abs=1e-5)


def test_k5_direction_worked_example():
    # id 6: h = pi/2, TF_T = 3/7, TF_F = 0 -> D = pi/2 + (3/7)/1e-5
    assert table(6)["D"] == pytest.approx(math.pi / 2 + (3 / 7) / 1e-5, rel=1e-9)
    # without the frequency term D = h; id 7: h = arcsin(sqrt(1/2)) - 0 = pi/4
    t = ktae.contingency(IDS, MASK, R > 0, G=4)
    assert ktae.direction(t, use_tf=False)[2].item() == pytest.approx(math.pi / 4)


def test_k6_key_token_values_worked_example():
    assert table(5)["ktv"] == 0.0 and table(8)["ktv"] == 0.0
    assert table(6)["ktv"] == pytest.approx(1.0, abs=1e-4)
    assert table(9)["ktv"] == pytest.approx(-1.0, abs=1e-4)
    # by hand, an unsaturated value: F = 0.5, IG = 0.5, D = 1 -> S = 0.5, (sigmoid(0.5) - 0.5) * 2 = 0.244919
    v = ktae.key_token_values(torch.tensor([0.5]), torch.tensor([0.5]), torch.tensor([1.0]))
    assert v.item() == pytest.approx(2 * (1 / (1 + math.exp(-0.5)) - 0.5), abs=1e-6)
    # top scales; alpha = 0 keeps only IG: S = IG = 0.5 -> same number here
    assert ktae.key_token_values(torch.tensor([0.9]), torch.tensor([0.5]), torch.tensor([1.0]), alpha=0,
                                 top=0.5).item() == pytest.approx(0.5 * 0.244919, abs=1e-6)


def test_k7_worked_example_advantages():
    values, _ = ktae.token_values(IDS, MASK, R[None])
    A = grpo.group_advantages(R[None])[0]  # +-0.8660
    adv = ktae.token_advantages(A, values, MASK)
    assert torch.allclose(adv[0], torch.tensor([0.8660, 1.8660, 1.8660]), atol=1e-4)
    assert torch.allclose(adv[2], torch.tensor([-0.8660, -1.8660, -0.8660]), atol=1e-4)


def test_swapping_correct_and_incorrect_flips_every_sign():
    torch.manual_seed(0)
    ids = torch.randint(0, 30, (8, 12))
    mask = torch.ones_like(ids)
    mask[3, 7:] = 0
    r = torch.tensor([1.0, 0, 1, 1, 0, 0, 1, 0])
    v, _ = ktae.token_values(ids, mask, r[None])
    v_swapped, _ = ktae.token_values(ids, mask, 1 - r[None])
    assert torch.allclose(v_swapped, -v, atol=1e-6) and v.abs().sum() > 0


def test_flat_groups_masks_and_special_ids_give_zero():
    ids = torch.tensor([[3, 4, 0, 0], [3, 5, 5, 0]])  # 0 = pad = EOS
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    for r in (torch.tensor([1.0, 1.0]), torch.tensor([0.0, 0.0])):
        v, _ = ktae.token_values(ids, mask, r[None])
        assert torch.equal(v, torch.zeros_like(v))
    v, _ = ktae.token_values(ids, mask, torch.tensor([[1.0, 0.0]]), special_ids=(0,))
    assert (v[mask == 0] == 0).all() and (v[ids == 0] == 0).all()
    assert v[0, 1] > 0.9 and v[1, 1] < -0.9  # 4 only in the correct one, 5 only in the wrong one
    # K7 keeps masked positions at zero
    adv = ktae.token_advantages(torch.tensor([0.7, -0.7]), v, mask)
    assert adv[0, 3] == 0


def test_a_batch_is_its_groups_one_by_one():
    # groups share ids but never statistics: the batch's values equal each group's values computed alone
    torch.manual_seed(1)
    ids = torch.randint(0, 12, (5 * 6, 10))  # B = 5 groups of G = 6
    mask = (torch.rand(30, 10) < 0.9).long()
    r = torch.tensor([[1.0, 0, 0, 1, 0, 0], [1, 1, 1, 1, 1, 1], [0, 1, 0, 0, 0, 0], [1, 1, 0, 1, 0, 1],
                      [0, 0, 0, 0, 0, 0]])
    batch, _ = ktae.token_values(ids, mask, r)
    for g in range(5):
        alone, _ = ktae.token_values(ids[6 * g:6 * g + 6], mask[6 * g:6 * g + 6], r[g:g + 1])
        assert torch.equal(batch[6 * g:6 * g + 6], alone)
    assert batch[6:12].abs().sum() == 0 and batch[24:].abs().sum() == 0  # all right, all wrong
    assert batch[:6].abs().sum() > 0 and batch[18:24].abs().sum() > 0

