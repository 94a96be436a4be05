"""reward.py: the last \\boxed{} (nested braces), math-verify equivalence, and a checker that never crashes a run."""
import pytest

import reward


@pytest.mark.parametrize("text,expected", [
    ("so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),  # nested braces
    ("\\boxed{1} then \\boxed{2}", "2"),  # the last one
    ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("\\fbox{7}", "7"),
    ("no box at all", None),
    ("\\boxed{unclosed {", None),
])
def test_last_boxed(text, expected):
    assert reward.last_boxed(text) == expected


@pytest.mark.parametrize("response,gold,expected", [
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("\\boxed{1/2}", "\\frac12", 1.0),
    ("\\boxed{27.0}", "27", 1.0),
    ("\\boxed{(3, \\pi/2)}", "\\left( 3, \\frac{\\pi}{2} \\right)", 1.0),
    ("\\boxed{-12}", "-12", 1.0),  # the tiny world's integer path
    ("\\boxed{12}", "-12", 0.0),
    ("\\boxed{\\frac{1}{3}}", "0.5", 0.0),
    ("the answer is 5", "5", 0.0),  # no box: incorrect
])
def test_reward_equivalences(response, gold, expected):
    assert reward.reward(response, gold) == expected


def test_unparseable_gold_is_reported_not_fatal():
    stats = reward.new_stats()
    assert reward.is_correct("\\boxed{3}", "}{", stats) is None
    assert reward.reward("\\boxed{3}", "}{", stats) == 0.0
    assert stats["gold_unparseable"] == 2 and stats["graded"] == 2


def test_no_box_is_counted():
    stats = reward.new_stats()
    reward.reward("I think 4", "4", stats)
    assert stats["no_box"] == 1


def test_checker_timeout_and_crash_are_counted(monkeypatch):
    from math_verify.errors import TimeoutException

    def hangs(*a, **k):
        raise TimeoutException("Operation timed out!")

    def breaks(*a, **k):
        raise RecursionError("sympy blew up")

    stats = reward.new_stats()
    monkeypatch.setattr(reward, "verify", hangs)
    assert reward.reward("\\boxed{\\sqrt{2}}", "\\sqrt{2}", stats) == 0.0
    monkeypatch.setattr(reward, "verify", breaks)
    assert reward.reward("\\boxed{\\sqrt{2}}", "\\sqrt{2}", stats) == 0.0
    assert stats["timeouts"] == 1 and stats["errors"] == 1
