"""credit.py, tasks.py and the entropy rule (E1): first errors found by hand on rollouts of both tasks, the
attribution metrics by hand, E1 by hand and against TRL's get_high_entropy_mask, one train.py step of each."""
import json
import math
import random
from types import SimpleNamespace

import pytest
import torch

from config import training
import entropy as e1  # E1's module (the tests name their tensors `entropy`)
import grpo
import methods
import train
from toyworld import credit, tasks, tiny
from conftest import THREADS

TINY, CHAIN, EOS = tasks.TASKS["tiny"], tasks.TASKS["chain"], tiny.EOS
SMALL = ["--prompts-per-step", "8", "--group-size", "4", "--eval-limit", "8", "--eval-every", "1000",
         "--save-every", "1000", "--steps", "1", "--threads", str(THREADS)]


def chars(text: str) -> list:
    """One piece per character (the tiny tokenizer's), EOS one piece of its own."""
    return list(text[:-len(EOS)]) + [EOS] if text.endswith(EOS) else list(text)


@pytest.mark.parametrize("text, error", [
    ("7+8=15\n15-9=6\n\\boxed{6}" + EOS, None),  # the solution
    ("7+8=15\n15-9=", None),  # truncated, still on the way
    ("7+8=16\n16-9=7\n\\boxed{7}" + EOS, 5),  # "7+8=1" can still be 15; the "6" cannot
    ("7+8=15\n15+9=24\n\\boxed{24}" + EOS, 9),  # the operator copied wrong: "7+8=15\n15" is 0-8, "+" is 9
    ("7+8=15\n\\boxed{15}" + EOS, 7),  # boxed before the last step
    ("7+8=15\n15-9=6\n\\boxed{6}}" + EOS, 23),  # a "}" more, after 7 + 7 + 9 characters
    ("7+8-9\n7+8=15", 3),  # the tiny world has no restated question: "7+8" fits "7+8=15", the "-" does not
])
def test_first_error_in_the_tiny_world_by_hand(text, error):
    assert credit.first_error(TINY, "7+8-9", chars(text)) == error
    # one correct solution: the first error is where the text leaves it, character by character
    target = tiny.solution("7+8-9") + EOS
    naive = next((i for i, (a, b) in enumerate(zip(text, target)) if a != b), None)
    if naive is None and len(text) > len(target):
        naive = len(target)
    assert error == naive


@pytest.mark.parametrize("text, error", [
    ("7+8-9\n7+8=15\n15+0=15\n15-9=6\n6-0=6\n\\boxed{6}" + EOS, None),  # padded, correct
    ("7+8=15\n15-9=6\n\\boxed{6}" + EOS, None),  # concise, correct
    # a zero step that changes the value: "7+8-9\n" 0-5, "7+8=15\n" 6-12, "15+0=1" 13-18
    ("7+8-9\n7+8=15\n15+0=16\n", 19),
    ("7+8=15\n7+8-9\n", 7),  # the question restated after the first line
    ("7+8=15\n15+1=16\n", 10),  # only 0 pads: "7+8=15\n" 0-6, "15+" 7-9 fits "15+0=15", the "1" (10) does not
])
def test_first_error_in_the_chain_task_by_hand(text, error):
    assert credit.first_error(CHAIN, "7+8-9", chars(text)) == error


def test_first_error_maps_characters_to_multi_character_tokens():
    # "7+8" "=16" "\n": the first wrong character (the "6", character 5) lies in the second token
    assert credit.first_error(TINY, "7+8-9", ["7+8", "=16", "\n"]) == 1
    assert credit.first_error(TINY, "7+8", ["7+8=15\n", "\\boxed{15}", EOS, "7"]) == 3  # anything after EOS


def test_every_warm_start_solution_is_viable_and_a_changed_digit_is_not():
    rng = random.Random(0)
    for _ in range(200):
        q = CHAIN.make_problem(rng)
        s = CHAIN.solution(q, rng) + EOS
        assert credit.first_error(CHAIN, q, chars(s)) is None
        i = s.index("=") + 1  # the first result's first character, made wrong
        wrong = s[:i] + ("7" if s[i] != "7" else "8") + s[i + 1:]
        assert credit.first_error(CHAIN, q, chars(wrong)) == i, (q, wrong)


def test_attribution_by_hand():
    # error at index 2 (0.5): one score above it (0.9), one tie (0.5), one below (0.1)
    # rank = 1 + 1 + 1/2 = 2.5; hit@1 = clip((1 - 1) / 2) = 0; hit@3 = clip((3 - 1) / 2) = 1; AUC = (1 + 1/2) / 3
    assert credit.attribution(torch.tensor([0.1, 0.9, 0.5, 0.5]), 2) == {"rank": 2.5, "hit1": 0.0, "hit3": 1.0,
                                                                        "auc": 0.5}
    # the error tied with two others, one above: rank 1 + 1 + 1 = 3; hit@1 0; hit@3 = (3 - 1) / 3; AUC (1 + 1) / 4
    got = credit.attribution(torch.tensor([3.0, 2.0, 2.0, 2.0, 0.0]), 2)
    assert got["rank"] == 3 and got["hit1"] == 0 and abs(got["hit3"] - 2 / 3) < 1e-12 and got["auc"] == 0.5
    # the most blamed token is the error: every metric at its best
    assert credit.attribution(torch.tensor([0.2, 0.8, 0.1, 0.3]), 1) == {"rank": 1, "hit1": 1, "hit3": 1, "auc": 1}
    # GRPO blames all alike: chance level, rank (n + 1) / 2 = 3, hit@1 = 1 / 5, hit@3 = 3 / 5, AUC 1/2
    assert credit.attribution(torch.zeros(5), 4) == {"rank": 3, "hit1": 0.2, "hit3": 0.6, "auc": 0.5}


def test_batch_attribution_counts_only_wrong_rollouts_with_a_first_error():
    texts = ["7+8=16\n", "7+8=15\n15-9=6\n", "7+8=15\n1"]  # wrong (error at 5), right, wrong but truncated
    pieces = [chars(t) + [EOS] * (14 - len(t)) for t in texts]  # padded to T = 14 with EOS pieces
    mask = torch.tensor([[1.0] * len(t) + [0.0] * (14 - len(t)) for t in texts])  # [3, 14]
    blame = torch.arange(14.0).flip(0).expand(3, 14)  # [3, 14] 13, 12, ...: token 5 has 13 - 5 = 8, 5 above it
    got = credit.batch_attribution(TINY, ["7+8-9"] * 3, pieces, torch.tensor([True, False, True]), blame, mask)
    # one rollout counts, n = 7 tokens: rank 6, hit@1 0, hit@3 0, AUC 1 / 6 (one token below: the "\n")
    assert got == {"credit_rank": 6, "credit_hit1": 0, "credit_hit3": 0, "credit_auc": 1 / 6, "credit_n": 1}
    assert credit.batch_attribution(TINY, ["7+8-9"] * 3, pieces, torch.tensor([False, True, True]), blame, mask) == {}


def test_entropy_rule_by_hand_and_its_gradient():
    entropy = torch.tensor([[0.1, 0.5, 0.3, 0.0], [0.9, 0.2, 0.4, 0.7]])  # [2, 4]
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])  # [2, 4]
    # 7 scored entropies sorted .1 .2 .3 .4 .5 .7 .9; the 0.8-quantile sits at 0.8 * 6 = 4.8: 0.5 + 0.8 * 0.2 = 0.66
    keep = e1.top_entropy_mask(entropy, mask, 0.2)
    assert keep.tolist() == [[False] * 4, [True, False, False, True]]  # 0.9 and 0.7 only
    ctx = SimpleNamespace(args=SimpleNamespace(no_std_scale=False, device="cpu", top_entropy_quantile=0.2))
    adv = methods.RULES["entropy"].advantages({"entropy": entropy}, torch.tensor([[1.0, 0.0]]), mask, ctx)
    a = 0.5 / 0.5 ** 0.5 / (1 + 2e-6)  # G1: r = [1, 0], mean 0.5, std sqrt(0.5), eps 1e-6 ~ +-0.7071
    assert torch.allclose(adv.seq, torch.tensor([a, -a]), rtol=1e-5)
    assert torch.allclose(adv.tokens, torch.tensor([[0.0] * 4, [-a, 0.0, 0.0, -a]]), rtol=1e-5)
    # the loss's gradient flows through the kept tokens only
    logp = torch.full((2, 4), -1.0, requires_grad=True)
    loss, _ = grpo.policy_loss(logp, logp.detach(), adv.tokens, mask)
    loss.backward()
    assert (logp.grad != 0).tolist() == keep.tolist()


def test_entropy_mask_equals_trls_on_the_same_tensors():
    trainer = pytest.importorskip("trl.trainer.grpo_trainer")
    same = SimpleNamespace(pad_across_processes=lambda x, dim, pad_index: x, gather=lambda x: x)  # one process
    g = torch.Generator().manual_seed(0)
    for share in (0.2, 0.5, 1.0):
        entropy = torch.rand(6, 9, generator=g) * 2  # [6, 9]
        mask = (torch.rand(6, 9, generator=g) > 0.3).float()  # [6, 9]
        theirs = trainer.GRPOTrainer.get_high_entropy_mask(SimpleNamespace(accelerator=same), entropy, mask, 1 - share)
        ours = e1.top_entropy_mask(entropy, mask, share)
        assert torch.equal(ours, theirs), share
        assert ours.sum() >= share * mask.sum() - 1  # about the share of the scored tokens


def test_the_chain_task_is_a_dataset_and_the_share_is_checked(capsys):
    with pytest.raises(SystemExit):
        training.parse_args(["--method", "entropy", "--top-entropy-quantile", "0"])
    assert "--top-entropy-quantile 0.0: E1's share of tokens must lie in (0, 1]" in capsys.readouterr().err
    chain = training.parse_args(["--dataset", "chain"])  # its own budget, held-out set and cue (data.DATASETS)
    assert (chain.max_new_tokens, chain.eval_dataset) == (128, "chain")
    assert training.parse_args([]).max_new_tokens == 48


def steps(run_dir):
    return [r for r in map(json.loads, open(run_dir / "metrics.jsonl")) if "reward_mean" in r]


def test_one_step_of_the_entropy_rule_logs_its_attribution(base, tmp_path):
    train.main(["--method", "entropy", "--run-dir", str(tmp_path / "e"), *SMALL])
    (rec,) = steps(tmp_path / "e")
    assert rec["credit_n"] > 0 and 0 <= rec["credit_auc"] <= 1 and 1 <= rec["credit_rank"]
    page = (tmp_path / "e" / "heatmaps" / "step1.html").read_text()  # coloured by entropy around E1's threshold
    assert "sampling entropy" in page and "threshold" in page


def test_one_step_of_the_chain_task_grpo_is_at_chance(tmp_path, monkeypatch):
    # The tiny world's base model stands in for the chain task's, whose warm start takes minutes (once; the next
    # test runs a few of its steps): the chain prompts use the same alphabet, the tiny model answers them partly
    # right, and neither the step's plumbing nor GRPO's chance-level attribution depends on which model it is.
    real = tiny.load_or_build
    monkeypatch.setattr(tiny, "load_or_build",
                        lambda cache_dir=tiny.CACHE_DIR, seed=0, task=None: real(cache_dir, seed))
    train.main(["--method", "grpo", "--dataset", "chain", "--run-dir", str(tmp_path / "c"), *SMALL])
    (rec,) = steps(tmp_path / "c")
    # GRPO blames every token alike: AUC exactly 1/2 whatever the rollouts
    assert rec["credit_n"] > 0 and rec["credit_auc"] == 0.5 and rec["credit_hit1"] < 0.5


def test_the_chain_warm_start_runs_and_learns():
    # a few supervised steps on the chain task's mixed concise and padded solutions (tiny.warm_start with task=)
    tok = tiny.build_tokenizer()
    model = tiny.build_model(tok)
    first = tiny.warm_start(model, tok, steps=1, batch_size=16, task=CHAIN)
    later = tiny.warm_start(model, tok, steps=8, batch_size=16, task=CHAIN)
    assert math.isfinite(later) and later < first  # at lr 1e-3 the loss falls within a few steps
