"""The first wrong step of a wrong answer, by Monte Carlo, F1-F4 of EQUATIONS.md#first-wrong-step-by-monte-carlo.

EpicPRM (Sun et al. 2025, "An Efficient and Precise Training Data Construction Framework for Process-supervised
Reward Model in Mathematical Reasoning", arXiv 2503.02382; OmegaPRM and Math-Shepherd estimate the same thing): a
prefix of a wrong solution is still sound if the model, continuing from it, often reaches the right answer; a
bisection over the solution's steps finds the first step after which it no longer does. Here it is the ground
truth against which every token rule's blame is scored on a real model (tools/attribution/), where the synthetic
tasks know theirs exactly (toyworld/credit.py: the same bisection, over the exact test).

    F1 steps          a response's non-empty lines, each with its token span
    F2 prefix_values  v(prefix) = the share of n continuations from the prompt and the prefix, sampled at the
                      run's temperature within the rollout's token budget, that the grader marks right
    F3 locate         the first wrong step: the least k with v(steps 1..k) < v(question alone) / 2, by bisection
                      (toyworld/credit.Bisection), the whole response (wrong) counted as below; refine: the first
                      wrong token inside it, by a second bisection
    F3b decision_error  (EQUATIONS.md#f3b) how likely a probe's call (above or below the threshold) is wrong, from
                      its counts: a probe draws n more continuations while that exceeds ALPHA, up to a cap
                      (locate_all); a located step whose two bracketing calls are not both within ALPHA is
                      "uncertain" (confidence)
    F4 step_blame     a rule's per-token blame summed up to steps: the largest of a step's tokens, or their mean

A worked example of F3: a wrong response of 5 steps, v(question) = 0.5, so the threshold is 0.25. The bisection
tests steps 1..2 (v = 0.44: sound), then 1..3 (v = 0.06: below): the first wrong step is step 3, found with two
tests of 16 continuations each, where testing every prefix would take four.

And of F3b: v(question) = 2/16 puts the threshold at 1/16. A prefix with no right continuation of 16 is "below",
but a prefix whose true v is 1/16 shows none with probability (15/16)^16 = 0.356: too likely wrong, so 16 more are
drawn: (15/16)^32 = 0.127, still above ALPHA = 0.1; 16 more: (15/16)^48 = 0.045, decided, after 48 continuations.
"""
import math

import torch

import sample
from toyworld import credit


def steps(pieces: list) -> list:
    """F1. The steps of a response from its tokens' texts (EOS left out): its non-empty lines, as token spans
    [(start, end), ...] covering every token. A token belongs to the line its first character lies on, so a token
    that ends a line ("\n", ".\n\n") ends its step; a line of whitespace alone joins the step before it (the
    first step, when it comes first).

    steps(["7", "+", "8", "=", "1", "5", "\n", "\n", "1", "5", "\n"]) == [(0, 8), (8, 11)]
    """
    groups, line = [], 0  # [first token, end, the line its tokens' first characters lie on]
    for t, p in enumerate(pieces):
        if groups and groups[-1][2] == line:
            groups[-1][1] = t + 1
        else:
            groups.append([t, t + 1, line])
        line += p.count("\n")
    spans = []
    for a, b, _ in groups:
        if spans and not "".join(pieces[a:b]).strip():
            spans[-1][1] = b  # a blank line joins the step before it
        elif spans and not "".join(pieces[spans[-1][0]:spans[-1][1]]).strip():
            spans[-1][1] = b  # the first steps were blank: they join this one
        else:
            spans.append([a, b])
    return [tuple(s) for s in spans]


def prefix_values(model, prompts: list, prefixes: list, *, n: int, temperature: float, max_new_tokens: int,
                  grades: list, decode, eos_id: int, pad_id: int, batch: int = 64) -> list:
    """F2. v for each (prompt, prefix) pair, both token-id lists: the share of n continuations of prompt + prefix,
    sampled at `temperature`, for which the pair's grader, grades[i](the prefix's and continuation's text), is
    True (pairs of different problems, each graded against its own gold answer, share a batch). The prefix counts
    against the rollout's budget: a continuation has max_new_tokens - len(prefix) tokens, so that prefix and
    continuation together are held to what the rollout itself was (a prefix late in a long answer is not given a
    second budget that its rollout never had). The n continuations of a prefix
    run as one group of the sampler, the prefix's cache shared (sample.generate); pairs are batched `batch` rows
    at a time. decode(ids) -> text of response tokens."""
    values, per_call = [], max(1, batch // n)
    for s in range(0, len(prompts), per_call):
        pairs = list(zip(prompts[s:s + per_call], prefixes[s:s + per_call], grades[s:s + per_call]))
        budgets = [max(0, max_new_tokens - len(x)) for _, x, _ in pairs]
        out = sample.generate(model, [p + x for p, x, _ in pairs], n=n, max_new_tokens=max(1, max(budgets)),
                              temperature=temperature, eos_id=eos_id, pad_id=pad_id)
        P, m = out["prompt_len"], out["response_mask"]
        for j, ((_, prefix, ok), budget) in enumerate(zip(pairs, budgets)):
            rows = range(j * n, (j + 1) * n)  # each cut at its own budget (the call ran to the largest)
            texts = [decode(prefix + out["input_ids"][r, P:P + min(budget, int(m[r].sum()))].tolist()) for r in rows]
            values.append(sum(bool(ok(t)) for t in texts) / n)
    return values


def standard_error(v: float, n: int) -> float:
    """The Monte Carlo standard error of a share v of n: sqrt(v (1 - v) / n)."""
    return math.sqrt(v * (1 - v) / n)


ALPHA = 0.1  # F3b: the error probability a probe's call aims for


def decision_error(successes: int, draws: int, threshold: float) -> float:
    """F3b. How likely the call on a prefix is wrong, at worst: the call is "above" when successes / draws >= threshold
    (else "below"), and it is wrong when the true v lies on the other side; the likeliest such v is the threshold
    itself, under which counts this far on the call's side have the binomial tail probability returned:
    P(X >= successes) for "above", P(X <= successes) for "below", X ~ Binomial(draws, threshold).

    decision_error(0, 16, 1 / 16) == (15 / 16) ** 16 == 0.356;  decision_error(8, 16, 0.25) == 0.027"""
    def pmf(k):
        return math.comb(draws, k) * threshold ** k * (1 - threshold) ** (draws - k)
    ks = range(successes, draws + 1) if successes >= threshold * draws else range(0, successes + 1)
    return min(1.0, sum(pmf(k) for k in ks))


class Locate:
    """F3 for one wrong response: the first step k (0-based) with v(steps 0..k) below threshold, by bisection over
    its steps (the whole response, wrong, is below without a test), then with refine the first token inside that
    step below it (the prefix through the step before is above). probe() names the response tokens of the prefix
    to test next (its length), tell(successes, draws) gives its counts; tests records every (tokens, v, draws,
    decision_error)."""

    def __init__(self, spans: list, threshold: float, refine: bool = False):
        self.spans, self.threshold, self.refine = spans, threshold, refine
        self.search, self.step, self.token, self.tests = credit.Bisection(len(spans)), None, None, []
        self._settle()

    def _settle(self):
        """Move on when a bisection has nothing left to ask: from the steps to the step's tokens, then to done."""
        if self.step is None and self.search.done():
            self.step = self.search.result
            a, b = self.spans[self.step]
            self.search = credit.Bisection(b - a) if self.refine else None
        if self.step is not None and self.search is not None and self.search.done():
            self.token = self.spans[self.step][0] + self.search.result
            self.search = None

    def done(self) -> bool:
        return self.search is None

    def probe(self) -> int:
        """How many response tokens the prefix to test holds."""
        k = self.search.probe()
        return self.spans[k][1] if self.step is None else self.spans[self.step][0] + k + 1

    def tell(self, successes: int, draws: int):
        v = successes / draws
        self.tests.append((self.probe(), v, draws, decision_error(successes, draws, self.threshold)))
        self.search.tell(v >= self.threshold)
        self._settle()

    def confidence(self, alpha: float = ALPHA) -> dict:
        """F3b of the located step: the errors of its two bracketing calls, the prefix through the step before
        ("above"; None for the first step, whose "above" is the question itself) and through the step ("below";
        None for the last step, the wrong outcome itself), the chance that either is wrong (at most their sum), and
        whether both are within alpha."""
        return confidence(self.spans, self.step, {length: e for length, _, _, e in self.tests}, alpha)


def confidence(spans: list, step: int, errors: dict, alpha: float = ALPHA) -> dict:
    """F3b of a located step from its probes' errors (prefix tokens -> decision_error): see Locate.confidence."""
    before = errors.get(spans[step - 1][1]) if step > 0 else None
    at = errors.get(spans[step][1]) if step < len(spans) - 1 else None
    return {"error_before": before, "error_at": at, "p_wrong": min(1.0, (before or 0.0) + (at or 0.0)),
            "confident": all(e is None or e <= alpha for e in (before, at))}


def locate_all(locates: list, values, n: int, cap: int = None, alpha: float = ALPHA) -> None:
    """F3 for many responses at once: each round, every unfinished search's next prefix is tested in one batch of n
    continuations, then (F3b) the prefixes whose call is more likely wrong than alpha get n more each, again
    together, until each is within alpha or has drawn cap (default n: no more), and the searches move on.
    locates: Locate objects; values(indices, lengths) -> their v (a share of n), for the prefixes of those
    responses."""
    cap = max(n, cap or n)
    while True:
        active = [i for i, loc in enumerate(locates) if not loc.done()]
        if not active:
            return
        counts = {i: [round(v * n), n] for i, v in zip(active, values(active, [locates[i].probe() for i in active]))}
        while True:
            more = [i for i in active if counts[i][1] + n <= cap
                    and decision_error(*counts[i], locates[i].threshold) > alpha]
            if not more:
                break
            for i, v in zip(more, values(more, [locates[i].probe() for i in more])):
                counts[i][0] += round(v * n)
                counts[i][1] += n
        for i in active:
            locates[i].tell(*counts[i])


def step_blame(blame: torch.Tensor, spans: list, how: str) -> torch.Tensor:
    """F4. A rule's blame of each step from its tokens' blame [T]: the largest ("max") or the mean ("mean") over
    the step's tokens. step_blame([0, 2, 1, 5], [(0, 2), (2, 4)], "max") == [2, 5]; "mean" == [1, 3]."""
    reduce = {"max": lambda x: x.max(), "mean": lambda x: x.mean()}[how]
    return torch.stack([reduce(blame[a:b].float()) for a, b in spans])  # [S]
