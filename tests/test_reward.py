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


# The grader's table of equivalent (True) and non-equivalent (False) pairs: gold first, prediction second.
@pytest.mark.parametrize("gold,pred,expected", [
    ("\\frac{3}{4}", "0.75", True),  # fraction vs decimal
    ("3/4", "\\frac34", True),
    ("\\dfrac{3}{4}", "\\frac{3}{4}", True),
    ("0.75", "\\frac{3}{5}", False),
    ("0.333", "\\frac13", False),  # a rounded decimal is not the fraction
    ("27.0", "27", True),  # AMC23's float answers
    ("27", "27.5", False),
    ("[1, 2)", "[1,2)", True),  # intervals: the brackets matter
    ("(1,2]", "[1,2]", False),
    ("(-\\infty, 3]", "(-\\infty,3]", True),
    ("(1, 2, 3)", "(1,2,3)", True),  # tuples: the order matters
    ("(1,2)", "(2,1)", False),
    ("1,-2", "-2, 1", True),  # a list of solutions is a set
    ("\\text{Evelyn}", "Evelyn", True),  # \text{}
    ("\\text{(C)}", "C", True),
    ("90^\\circ", "90", True),  # degrees
    ("90", "45", False),
    ("5\\text{ cm}", "5", True),  # units
    ("10\\%", "10", True),
    ("\\$18", "18", True),
    ("-7", "-7", True),  # negative numbers
    ("-7", "7", False),
    ("-\\frac{1}{2}", "-0.5", True),
    ("x=5", "5", True),
    ("3\\sqrt{13}", "\\sqrt{117}", True),
    ("\\pi", "3.14", False),
    ("1,080", "1080", True),  # a thousands separator
])
def test_grader_table(gold, pred, expected):
    stats = reward.new_stats()
    assert reward.is_correct("The answer is \\boxed{" + pred + "}.", gold, stats) is expected
    assert stats["timeouts"] == stats["errors"] == 0


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


def test_a_hanging_checker_is_cut_off_and_counted(monkeypatch):
    import time

    def sleeps(*a, **k):
        time.sleep(30)

    stats = reward.new_stats()
    monkeypatch.setattr(reward, "TIMEOUT_S", 0.2)
    monkeypatch.setattr(reward, "verify", sleeps)
    t0 = time.time()
    assert reward.reward("\\boxed{\\sqrt{2}}", "\\sqrt{2}", stats) == 0.0
    assert time.time() - t0 < 5 and stats["timeouts"] == 1
    monkeypatch.setattr(reward, "verify", lambda *a, **k: True)  # the timer is gone: a later check is unaffected
    time.sleep(0.3)
    assert reward.reward("\\boxed{\\sqrt{2}}", "\\sqrt{2}", stats) == 1.0
