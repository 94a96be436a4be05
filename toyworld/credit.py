"""Ground-truth credit attribution: does a token rule blame the token where a wrong rollout went wrong?

In the synthetic tasks (tasks.py) we know, for every wrong rollout, its first error: the first token after which
the response can no longer be continued into any correct solution (a wrong digit of a result, a wrong operand
or operator copied, a box opened too early, text after the box). A token rule gives every token a blame score
(methods.Rule.blame: higher = more blamed; KTAE: minus the key-token value, OAR: the weight, the entropy rule:
the sampling entropy, GRPO: the same for every token). Over the rollout's n scored tokens (the loss mask), with
e the first error and b its blame scores, ties broken at random:

    rank   = 1 + #{t: b_t > b_e} + #{t != e: b_t = b_e} / 2        expected rank of the error (1 = most blamed)
    hit@k  = P(rank <= k) = clip((k - #{t: b_t > b_e}) / (1 + #{t != e: b_t = b_e}), 0, 1)
    AUC    = (#{t: b_t < b_e} + #{t != e: b_t = b_e} / 2) / (n - 1)   P(the error outranks another token)

A rule that blames every token alike (GRPO) scores AUC 1/2, rank (n + 1) / 2 and hit@k = k / n: the chance level.

    >>> attribution(torch.tensor([0.1, 0.9, 0.5, 0.5]), 2)   # the error (0.5) ties with one, one above it
    {'rank': 2.5, 'hit1': 0.0, 'hit3': 1.0, 'auc': 0.5}
"""
import torch


class Bisection:
    """The search for the first unit (a token, a step) after which a response can no longer be completed correctly,
    given the whole is not: the least k in 0..n-1 with viable(units 0..k) False, where viability only shrinks as k
    grows, in at most log2(n) + 1 tests. One question at a time (probe, then tell), so that a caller can test the
    prefixes of many responses together (epicprm.py batches its Monte Carlo tests so); first_failure runs one."""

    def __init__(self, n: int):
        self.lo, self.hi = 0, n - 1  # units 0..hi are not viable; every unit before lo is

    def done(self) -> bool:
        return self.lo >= self.hi

    def probe(self) -> int:
        """The k whose prefix (units 0..k) is to be tested next."""
        return (self.lo + self.hi) // 2

    def tell(self, viable: bool):
        """The answer for probe(): whether units 0..probe() can still be completed correctly."""
        if viable:
            self.lo = self.probe() + 1
        else:
            self.hi = self.probe()

    @property
    def result(self) -> int:
        return self.lo


def first_failure(n: int, viable) -> int:
    """Bisection over n units of which the whole is not viable: the least k with viable(k) False."""
    search = Bisection(n)
    while not search.done():
        search.tell(viable(search.probe()))
    return search.result


def first_error(task, q: str, pieces: list):
    """The index of the first token of a response (its tokens' texts, EOS as tiny.EOS) after which no correct
    solution of q can follow, or None if the whole response is still a prefix of one (a truncated rollout).

    Viability only shrinks as the text grows, so the first non-viable prefix is found by bisection over tokens:
    at most log2(n) + 1 calls of task.viable."""
    if task.viable(q, "".join(pieces)):
        return None
    return first_failure(len(pieces), lambda k: task.viable(q, "".join(pieces[:k + 1])))


def attribution(blame: torch.Tensor, error: int) -> dict:
    """rank, hit@1, hit@3 and AUC (above) of the error token `error` among one rollout's scored tokens' blame
    scores blame [n] (n >= 2)."""
    b, n = blame.float(), blame.numel()  # [n]
    above = int((b > b[error]).sum())
    ties = int((b == b[error]).sum()) - 1  # the error itself left out
    below = n - 1 - above - ties
    hit = lambda k: min(1.0, max(0.0, (k - above) / (ties + 1)))  # noqa: E731
    return {"rank": 1 + above + ties / 2, "hit1": hit(1), "hit3": hit(3), "auc": (below + ties / 2) / (n - 1)}


def batch_attribution(task, questions: list, pieces: list, wrong: torch.Tensor, blame: torch.Tensor,
                      mask: torch.Tensor) -> dict:
    """The means of rank, hit@1, hit@3 and AUC over the wrong rollouts that have a first error inside their
    scored tokens, and how many those were (credit_n); {} when none. questions [N]: each rollout's problem;
    pieces [N]: its tokens' texts; wrong [N] bool; blame [N, T]; mask [N, T] the scored tokens."""
    rows = []
    for i in torch.nonzero(wrong).flatten().tolist():
        n = int(mask[i].sum())
        e = first_error(task, questions[i], pieces[i][:n])
        if e is not None and n >= 2:
            rows.append(attribution(blame[i, :n], e))
    if not rows:
        return {}
    out = {f"credit_{k}": sum(r[k] for r in rows) / len(rows) for k in rows[0]}
    return {**out, "credit_n": len(rows)}
