"""Rewards: the last \\boxed{...} of a response, checked against the gold answer by math-verify.

evaluation.md: answer extraction takes the content of the last \\boxed{...} (nested braces handled, \\fbox too);
a response without one is incorrect. Equivalence is math-verify's (parse both, verify(gold, prediction); the
order matters), so 0.5 = \\frac12 = 1/2 and 27.0 = 27. The checker must never hang or crash a run: its time
is bounded per answer, and timeouts, unparseable gold answers and checker errors are counted in `stats`.
"""
import contextlib
import re
import signal
import threading

import math_verify.grader
import math_verify.parser
from math_verify import parse, verify
from math_verify.errors import TimeoutException

# We bound the time ourselves (deadline below), so math-verify's "timeout is disabled" warning does not apply.
math_verify.grader.TIMEOUT_WARNING_SHOWN = math_verify.parser.TIMEOUT_WARNING_SHOWN = True

BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
INT = re.compile(r"-?\d+")
TIMEOUT_S = 5.0  # for one whole check (both parses and the verify)


@contextlib.contextmanager
def deadline(seconds: float):
    """Raise TimeoutException if the block runs longer than `seconds`.

    math-verify's own timeouts bound each sympy operation separately (a verify may run many), so we switch them
    off and bound the whole check with one SIGALRM timer instead. Signals exist only in the main thread; in
    another thread the block runs unbounded (train.py and evaluate.py grade in the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum, frame):
        raise TimeoutException(f"checker took longer than {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def last_boxed(text: str):
    """Content of the last \\boxed{...} or \\fbox{...}, braces balanced; None if there is none or it is unclosed.

    last_boxed("so \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    """
    starts = [m.end() for m in BOX.finditer(text)]
    if not starts:
        return None
    i = start = starts[-1]
    depth = 1
    while i < len(text):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i]
        i += 1
    return None


def new_stats() -> dict:
    """Counters a run reports: how many answers were graded, and how many the checker could not handle."""
    return {"graded": 0, "no_box": 0, "gold_unparseable": 0, "timeouts": 0, "errors": 0}


def is_correct(response: str, gold: str, stats: dict = None):
    """True / False, or None when the gold answer itself cannot be parsed (the caller skips that problem).

    The pure-integer case (the tiny world, GSM8K, AIME) is decided by comparing integers, which is what
    math-verify would conclude, without its sympy parse; everything else goes through math-verify.
    """
    stats = stats if stats is not None else new_stats()
    stats["graded"] += 1
    pred = last_boxed(response)
    if pred is None:
        stats["no_box"] += 1
        return False
    gold, pred = str(gold).strip(), pred.strip()
    if INT.fullmatch(gold) and INT.fullmatch(pred):
        return int(gold) == int(pred)
    try:
        with deadline(TIMEOUT_S):
            gold_parsed = parse("\\boxed{" + gold + "}", parsing_timeout=None, raise_on_error=True)
            if not gold_parsed:
                stats["gold_unparseable"] += 1
                return None
            pred_parsed = parse("\\boxed{" + pred + "}", parsing_timeout=None, raise_on_error=True)
            return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None, raise_on_error=True))
    except TimeoutException:
        stats["timeouts"] += 1
    except Exception:  # a checker bug on one odd answer must not end a training run
        stats["errors"] += 1
    return False


def reward(response: str, gold: str, stats: dict = None) -> float:
    """1.0 if correct else 0.0 (grpo.md rewards). A problem with an unparseable gold answer gets 0.0 and is
    counted in stats['gold_unparseable']; loaders drop such rows before training (evaluate.py)."""
    return 1.0 if is_correct(response, gold, stats) else 0.0
