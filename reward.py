"""Rewards: the last \\boxed{...} of a response, checked against the gold answer by math-verify.

EQUATIONS.md#answer-extraction-and-equivalence: answer extraction takes the content of the last \\boxed{...}
(nested braces handled, \\fbox too); a response without one is incorrect. Equivalence is math-verify's (parse
both, verify(gold, prediction); the order matters), so 0.5 = \\frac12 = 1/2 and 27.0 = 27.
The checker must never hang or crash a run: it never raises, its time is bounded per answer in any thread,
numbers too big to compute with are never handed to sympy, and timeouts, unparseable gold answers and checker
errors are counted in `stats`. A `}` after the box's closing brace that nothing opened makes the answer wrong
(stats["malformed"]): `\\boxed{11}}}}}` is not 11.
"""
import contextlib
import ctypes
import math
import re
import signal
import threading
import unicodedata

import math_verify.grader
import math_verify.parser
from math_verify import parse, verify
from math_verify.errors import TimeoutException

# We bound the time ourselves (deadline below), so math-verify's "timeout is disabled" warning does not apply.
math_verify.grader.TIMEOUT_WARNING_SHOWN = math_verify.parser.TIMEOUT_WARNING_SHOWN = True

BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
INT = re.compile(r"-?\d+")
TOKEN = re.compile(r"\\.|[{}]", re.S)  # a brace, or an escaped character: \{ \} \\ are not structure
DIGITS = re.compile(r"\d+")
TIMEOUT_S = 5.0  # for one whole check (both parses and the verify)
# Answers with numbers too big to work with are not given to sympy, whose slow steps on them (int <-> str is
# quadratic) are single C calls that no timer can interrupt: a digit run over MAX_DIGITS characters (Python's
# int() refuses 4,300), or a power or factorial whose value would have over MAX_VALUE_DIGITS digits (the limits sit
# well below where sympy's time reaches the deadline; docs/LOG.md has the timings). Such an answer is graded by
# string comparison only (equal strings are correct) and otherwise counted in stats["timeouts"]: the checker gave up
# on it.
MAX_DIGITS = 1_000
MAX_VALUE_DIGITS = 10_000
MAX_FACTORIAL = 3_000  # 3000! has 9,131 digits


class CheckerTimeout(BaseException):
    """The deadline passed. A BaseException, so that a library's `except Exception` cannot swallow it."""


def _raise_in(thread_id: int, exc) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), exc)


@contextlib.contextmanager
def deadline(seconds: float):
    """Raise CheckerTimeout in this thread if the block runs longer than `seconds`; works in any thread.

    math-verify's own timeouts bound each sympy operation separately (a verify may run many), so we switch them
    off and bound the whole check with one timer. In the main thread the timer is SIGALRM, which also interrupts
    a blocking call (sleep, I/O). Signals are delivered only to the main thread, so in any other thread (a worker,
    a thread pool) a threading.Timer raises the exception in the grading thread with PyThreadState_SetAsyncExc;
    that lands at the grader's next bytecode, which is enough because everything slow in math-verify and sympy
    is Python code, and the one thing that is not (arithmetic on huge integers) is refused before parsing
    (too_big). Cost: one short-lived timer thread per check that reaches math-verify, small next to a parse;
    integer and equal-string answers never get here. A lock makes the timer and the end of
    the block exclusive, and a pending exception is withdrawn at the end, so none can land after the block."""
    if threading.current_thread() is threading.main_thread():
        def fire(signum, frame):
            raise CheckerTimeout(f"checker took longer than {seconds} s")

        old = signal.signal(signal.SIGALRM, fire)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        return

    tid, lock, state = threading.get_ident(), threading.Lock(), {"armed": True, "fired": False}

    def fire_async():
        with lock:
            if state["armed"]:
                state["fired"] = True
                _raise_in(tid, ctypes.py_object(CheckerTimeout))

    timer = threading.Timer(seconds, fire_async)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        with lock:
            state["armed"] = False
            if state["fired"]:
                _raise_in(tid, None)  # withdraw it if it has not been raised yet
        timer.cancel()


def _box_span(text: str):
    """(box, start, end): where the last box's \\boxed begins, its content begins, and its closing brace is; or None."""
    m = None
    for m in BOX.finditer(text):
        pass
    if m is None:
        return None
    depth = 1
    for t in TOKEN.finditer(text, m.end()):
        depth += {"{": 1, "}": -1}.get(t.group(), 0)
        if depth == 0:
            return m.start(), m.end(), t.start()
    return None


def last_boxed(text: str):
    """Content of the last \\boxed{...} or \\fbox{...}, braces balanced; None if there is none or it is unclosed.
    Escaped braces \\{ \\} are content, not structure.

    last_boxed("so \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    """
    span = _box_span(text)
    return None if span is None else text[span[1]:span[2]]


def unmatched_after(text: str, box: int, end: int) -> bool:
    """Whether text after the box's closing brace (text[end]) has a `}` that no `{` before it opened
    (text[box] is where the box begins).

    `\\boxed{11}}}}}}` would otherwise be read as 11: a policy can learn to stop emitting EOS and pad with braces.
    Braces opened before the box may be closed after it (`\\text{so \\boxed{11}}`)."""
    tail = [t for t in TOKEN.findall(text, end + 1) if t == "{" or t == "}"]
    if "}" not in tail:  # the usual case: a full stop, a `$`, nothing; no need to look before the box
        return False
    depth = 0
    for t in TOKEN.findall(text, 0, box):
        if t == "{":
            depth += 1
        elif t == "}" and depth:
            depth -= 1
    for t in tail:
        if t == "{":
            depth += 1
        elif depth == 0:
            return True
        else:
            depth -= 1
    return False


def _matches(s: str) -> dict:
    """{position of `{`: position of its `}`} for the structural braces of s."""
    stack, match = [], {}
    for t in TOKEN.finditer(s):
        if t.group() == "{":
            stack.append(t.start())
        elif t.group() == "}" and stack:
            match[stack.pop()] = t.start()
    return match


def strip_redundant_braces(s: str) -> str:
    """Drop braces that group nothing: `{{x}}` -> `{x}` anywhere, and `{x}` -> `x` around the whole answer.

    LaTeX reads them the same; math-verify's parser takes time exponential in the nesting depth (10 levels: ~1.5 s,
    12: ~5 s). One pass over the braces, so 10,000 levels cost nothing."""
    s = s.strip()
    match = _matches(s)
    drop = set()
    for i, j in match.items():
        if match.get(i + 1) == j - 1:  # `{{...}}`: the outer pair adds nothing
            drop.update((i, j))
    i, j = 0, len(s) - 1
    while i < j and match.get(i) == j:  # the whole answer in braces
        drop.update((i, j))
        i, j = i + 1, j - 1
        while i < j and s[i].isspace():
            i += 1
        while j > i and s[j].isspace():
            j -= 1
    if not drop:
        return s
    return "".join(c for k, c in enumerate(s) if k not in drop).strip()


def normalise(s: str) -> str:
    return " ".join(strip_redundant_braces(s).split())


def _digits(run: str) -> str:
    """A run of decimal digits (any script, as int() accepts) as ASCII, without leading zeros."""
    return "".join(str(unicodedata.decimal(c)) for c in run).lstrip("0")


def same_integer(a: str, b: str) -> bool:
    """a == b for two INT strings, by their digits: int() refuses over 4,300 digits (and is quadratic)."""
    da, db = _digits(a.lstrip("-")), _digits(b.lstrip("-"))
    return da == db and (da == "" or a.startswith("-") == b.startswith("-"))


def _small_int(run: str, cap: int = 10**7) -> int:
    return int(run) if len(run) < 8 else cap


def too_big(s: str) -> bool:
    """Whether s has a number too big to give to sympy: a digit run over MAX_DIGITS, a factorial over
    MAX_FACTORIAL, or a power with a numeric exponent whose value would have over MAX_VALUE_DIGITS digits (a
    numeric exponent that itself holds a power or a factorial, as in 10^{10^{10}}, counts as too big). Cheap and
    conservative; exponents with a letter in them (x^{n}, e^{-x^2}) stay symbolic and are left to the deadline."""
    if any(len(r) > MAX_DIGITS for r in DIGITS.findall(s)):
        return True
    for m in re.finditer(r"(\d+)\s*!", s):
        if _small_int(m.group(1)) > MAX_FACTORIAL:
            return True
    if "^" not in s and "**" not in s:
        return False
    match = _matches(s)
    for m in re.finditer(r"\^|\*\*", s):
        k = m.end()
        while k < len(s) and s[k].isspace():
            k += 1
        if k < len(s) and s[k] == "{":
            exp = s[k + 1:match.get(k, len(s))]
        else:
            d = DIGITS.match(s, k)
            exp = d.group() if d else s[k:k + 1]
        core = re.sub(r"\\(?:cdot|times|frac|dfrac|tfrac|left|right)|[\s{}()\[\]+\-*/.,]", "", exp)
        if not any(c.isdigit() for c in core) or any(c.isalpha() for c in re.sub(r"[\d^!]", "", core)):
            continue  # no number in the exponent, or a symbolic one
        if "^" in core or "!" in core:
            return True
        if DIGITS.fullmatch(core):
            value = _small_int(core)
        else:  # an upper bound: (a + 1)(b + 1)... >= any + - * / of the numbers a, b, ...
            value = 1
            for r in DIGITS.findall(exp):
                value = min(value * (_small_int(r) + 1), 10**7)
        j = m.start()
        while j > 0 and s[j - 1] in " })":
            j -= 1
        base = DIGITS.search(s, max(0, j - 8), j)
        log_base = math.log10(max(10, _small_int(base.group()))) if base and base.end() == j else 1.0
        if value * log_base > MAX_VALUE_DIGITS:
            return True
    return False


def new_stats() -> dict:
    """Counters a run reports: how many answers were graded, and how many the checker could not handle.
    malformed: a `}` after the box's closing brace that nothing opened (graded wrong)."""
    return {"graded": 0, "no_box": 0, "malformed": 0, "gold_unparseable": 0, "timeouts": 0, "errors": 0}


def is_correct(response: str, gold: str, stats: dict = None):
    """True / False, or None when the gold answer itself cannot be parsed (the caller skips that problem).
    Never raises, and returns within about TIMEOUT_S in any thread.

    Cheap cases are decided without math-verify: equal answers (after dropping redundant braces and extra
    spaces) are correct, and two integers are compared by their digits, which is what math-verify would
    conclude. Answers with numbers too big to compute with (too_big) are wrong unless equal, and counted as
    timeouts. Everything else goes through math-verify under the deadline.
    """
    stats = stats if stats is not None else new_stats()
    stats.setdefault("malformed", 0)
    stats["graded"] += 1
    try:
        response = str(response)
        span = _box_span(response)
        if span is None:
            stats["no_box"] += 1
            return False
        if unmatched_after(response, span[0], span[2]):
            stats["malformed"] += 1
            return False
        gold, pred = normalise(str(gold)), normalise(response[span[1]:span[2]])
        if gold and gold == pred:
            return True
        if INT.fullmatch(gold) and INT.fullmatch(pred):
            return same_integer(gold, pred)
        if too_big(gold) or too_big(pred):
            stats["timeouts"] += 1
            return False
        with deadline(TIMEOUT_S):
            gold_parsed = parse("\\boxed{" + gold + "}", parsing_timeout=None, raise_on_error=True)
            if not gold_parsed:
                stats["gold_unparseable"] += 1
                return None
            pred_parsed = parse("\\boxed{" + pred + "}", parsing_timeout=None, raise_on_error=True)
            return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None, raise_on_error=True))
    except (TimeoutException, CheckerTimeout):
        stats["timeouts"] += 1
    except Exception:  # a checker bug on one odd answer must not end a training run
        stats["errors"] += 1
    return False


def length_parity(response: str, gold: str, stats: dict = None) -> bool:
    """A stand-in grader for benchmarks, not a reward anyone should train for: a response is "right" when it has an
    even number of characters, whatever the gold answer. A random-weight or weak model (a 0.5B model on GSM8K with
    40 new tokens) gets every answer wrong, so no group mixes right and wrong, every advantage is 0, and train.py
    skips the training pass; under this grader about half of any group is right, so nearly every group mixes and
    a step does its full work, the same in every method (tools/perf/bench.py). Counted in stats like is_correct."""
    stats = stats if stats is not None else new_stats()
    stats["graded"] += 1
    return len(str(response)) % 2 == 0


# --grader NAME (train.py): what grades a sampled response, (response, gold, stats) -> True / False / None. "math" is
# the real grader, called through the module's name so that a test that replaces reward.is_correct replaces it too.
GRADERS = {"math": lambda response, gold, stats=None: is_correct(response, gold, stats),
           "length-parity": length_parity}


def reward(response: str, gold: str, stats: dict = None) -> float:
    """1.0 if correct else 0.0 (EQUATIONS.md#rewards). A problem with an unparseable gold answer gets 0.0 and is
    counted in stats['gold_unparseable']; loaders drop such rows before training (evaluate.py)."""
    return 1.0 if is_correct(response, gold, stats) else 0.0
