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


# These two reach math-verify with different spellings of one answer (gold 2^{1/2}): equal strings are graded
# correct without it.
def test_checker_timeout_and_crash_are_counted(monkeypatch):
    from math_verify.errors import TimeoutException

    def hangs(*a, **k):
        raise TimeoutException("Operation timed out!")

    def breaks(*a, **k):
        raise RecursionError("sympy blew up")

    stats = reward.new_stats()
    monkeypatch.setattr(reward, "verify", hangs)
    assert reward.reward("\\boxed{\\sqrt{2}}", "2^{1/2}", stats) == 0.0
    monkeypatch.setattr(reward, "verify", breaks)
    assert reward.reward("\\boxed{\\sqrt{2}}", "2^{1/2}", stats) == 0.0
    assert stats["timeouts"] == 1 and stats["errors"] == 1


def test_a_hanging_checker_is_cut_off_and_counted(monkeypatch):
    import time

    def sleeps(*a, **k):
        time.sleep(30)

    stats = reward.new_stats()
    monkeypatch.setattr(reward, "TIMEOUT_S", 0.2)
    monkeypatch.setattr(reward, "verify", sleeps)
    t0 = time.time()
    assert reward.reward("\\boxed{\\sqrt{2}}", "2^{1/2}", stats) == 0.0
    assert time.time() - t0 < 5 and stats["timeouts"] == 1
    monkeypatch.setattr(reward, "verify", lambda *a, **k: True)  # the timer is gone: a later check is unaffected
    time.sleep(0.3)
    assert reward.reward("\\boxed{\\sqrt{2}}", "2^{1/2}", stats) == 1.0


# --- issue 15, point 7: a grader that never raises, never hangs, and does not reward trailing garbage. Each test
# below fails on the grader before it (int() raised over 4,300 digits; 12 nested braces took ~5 s; the deadline
# did nothing off the main thread; `\boxed{11}}}}}}` was 11; there was no "malformed" counter).
import concurrent.futures
import random
import threading
import time


def test_huge_integers_are_compared_without_int():
    big = "7" * 4999 + "3"  # 5,000 digits: int() raises "Exceeds the limit (4300 digits)"
    stats = reward.new_stats()
    assert reward.reward("\\boxed{" + big + "}", big, stats) == 1.0
    assert reward.reward("\\boxed{" + big[:-1] + "4}", big, stats) == 0.0
    assert reward.reward("\\boxed{-000" + big + "}", "-" + big, stats) == 1.0  # sign and leading zeros
    assert reward.reward("\\boxed{" + big + "}", "-" + big, stats) == 0.0
    assert reward.same_integer("-0", "0") and reward.same_integer("007", "7") and not reward.same_integer("-7", "7")
    assert stats["errors"] == stats["timeouts"] == 0


@pytest.mark.parametrize("pred,gold,expected,timeouts", [
    ("10^{10000}", "10^{10000}", 1.0, 0),
    ("10^{9999}", "10^{10000}", 0.0, 0),
    ("10^{10^{10}}", "10^{10^{10}}", 1.0, 0),  # too big to compute, equal strings: correct
    ("10^{10^{10}}", "3", 0.0, 1),  # too big to compute: refused, counted as a timeout (before: 5 s, then timeout)
    ("1000000!", "3", 0.0, 1),
    ("7" * 5000 + "x", "3", 0.0, 1),  # a digit run too long for sympy
])
def test_huge_powers_are_bounded(pred, gold, expected, timeouts):
    stats = reward.new_stats()
    t0 = time.time()
    assert reward.reward("\\boxed{" + pred + "}", gold, stats) == expected
    assert time.time() - t0 < 2.5 and stats["timeouts"] == timeouts and stats["errors"] == 0


def test_redundant_braces_are_stripped_before_parsing():
    deep = "{" * 12 + "11" + "}" * 12  # math-verify's parse is exponential in the depth: ~5 s at 12 levels
    assert reward.strip_redundant_braces(deep) == "11"
    assert reward.strip_redundant_braces("{\\frac{{{1}}}{2}}") == "\\frac{1}{2}"
    assert reward.strip_redundant_braces("{1}+{2}") == "{1}+{2}"  # not one group: kept
    stats = reward.new_stats()
    t0 = time.time()
    assert reward.reward("\\boxed{" + deep + "}", "11", stats) == 1.0
    assert reward.reward("\\boxed{\\frac{" + deep.replace("11", "1") + "}{2}}", "0.5", stats) == 1.0
    assert time.time() - t0 < 2.5 and stats["timeouts"] == 0


def _busy_verify(*a, **k):  # pure Python for 3 s: only an asynchronous exception can cut it short
    t0 = time.time()
    while time.time() - t0 < 3:
        pass
    return True


def _grade_twice(stats):
    t0 = time.time()
    first = reward.reward("\\boxed{\\sqrt{2}}", "2^{1/2}", stats)
    took = time.time() - t0
    reward.verify = lambda *a, **k: True  # the timer is gone: nothing lands in a later check, or after it
    second = reward.reward("\\boxed{\\sqrt{2}}", "2^{1/2}", stats)
    t1 = time.time()
    while time.time() - t1 < 0.5:
        pass
    return first, took, second


def test_deadline_works_in_a_thread(monkeypatch):
    monkeypatch.setattr(reward, "TIMEOUT_S", 0.2)
    monkeypatch.setattr(reward, "verify", _busy_verify)
    stats, out = reward.new_stats(), {}
    worker = threading.Thread(target=lambda: out.update(result=_grade_twice(stats)))
    worker.start()
    worker.join(10)
    first, took, second = out["result"]
    assert first == 0.0 and took < 1.5 and second == 1.0 and stats["timeouts"] == 1


def test_deadline_works_in_a_thread_pool(monkeypatch):
    monkeypatch.setattr(reward, "TIMEOUT_S", 0.2)
    monkeypatch.setattr(reward, "verify", _busy_verify)
    stats = reward.new_stats()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        first, took, second = pool.submit(_grade_twice, stats).result(timeout=10)
    assert first == 0.0 and took < 1.5 and second == 1.0 and stats["timeouts"] == 1


@pytest.mark.parametrize("response,gold,expected,malformed", [
    ("\\boxed{11}}}}}}", "11", 0.0, 1),  # a policy padding with braces instead of stopping
    ("\\boxed{11} }", "11", 0.0, 1),
    ("\\boxed{11}\\\\}", "11", 0.0, 1),  # \\ is a line break: the } after it is structure
    ("\\boxed{11}.", "11", 1.0, 0),
    ("$\\text{so } \\boxed{11}$ {done}", "11", 1.0, 0),
    ("\\text{so \\boxed{11}}", "11", 1.0, 0),  # closes a brace opened before the box
    ("\\boxed{\\{1,2\\}}", "\\{1,2\\}", 1.0, 0),  # escaped braces are not structure
    ("\\boxed{11} \\}", "11", 1.0, 0),
    ("\\left\\{ x \\right. \\boxed{11} \\}", "11", 1.0, 0),
])
def test_text_after_the_box_closes_nothing(response, gold, expected, malformed):
    stats = reward.new_stats()
    assert reward.reward(response, gold, stats) == expected
    assert stats["malformed"] == malformed


def test_escaped_braces_are_content():
    assert reward.last_boxed("\\boxed{a\\}b}") == "a\\}b"
    assert reward.last_boxed("\\boxed{\\{1,2\\}} and more") == "\\{1,2\\}"


def _random_prediction(rng):
    parts = ["", "{", "}", "{{{{{{{{{{{{", "}}}}}}}}}}}}", "\\boxed{", "\\fbox{", "^", "^{", "\\frac", "\\frac{1}{2}",
             "\\{", "\\}", "\\\\", "x", "-", ".", "!", " ", "10^{10^{10}}", "7" * 5000, "9" * 200, "é", "∞", "٣",
             "😀", "\x00", "\\sqrt{", "\\left(", "\\right)", "(", ")", ",", "=", "+"]
    pieces = [rng.choice(parts) for _ in range(rng.randint(0, 12))]
    pieces += [str(rng.randint(0, 10 ** rng.randint(1, 30))) for _ in range(rng.randint(0, 3))]
    rng.shuffle(pieces)
    pred = "".join(pieces)
    tail = rng.choice(["", "}", "}}}", "."])
    return rng.choice(["", "\\boxed{" + pred + "}", "\\boxed{" + pred, pred, "so \\boxed{" + pred + "}" + tail])


def test_fuzzed_predictions_never_raise_or_hang(monkeypatch):
    monkeypatch.setattr(reward, "TIMEOUT_S", 1.0)
    rng = random.Random(15)
    golds = ["11", "\\frac{1}{2}", "10^{10000}", "x", "", "7" * 5000, "}{"]
    stats = reward.new_stats()
    failures = ("no_box", "malformed", "gold_unparseable", "timeouts", "errors")
    for n in range(1, 301):
        pred, gold = _random_prediction(rng), rng.choice(golds)
        before = dict(stats)
        t0 = time.time()
        r = reward.reward(pred, gold, stats)
        assert time.time() - t0 < reward.TIMEOUT_S + 1.0, (pred, gold)
        assert type(r) is float and r in (0.0, 1.0)
        counted = sum(stats[k] - before[k] for k in failures)
        assert stats["graded"] == n and counted <= 1 and (r == 0.0 or counted == 0), (pred, gold)
