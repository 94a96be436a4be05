"""The tiny world's tasks, each a --dataset of data.py: tiny (the default) and "chain", where answers vary in length.

Both are left-to-right chains of single-digit operands joined by + and -, worked one step a line and ended by
\\boxed{answer}, with the tiny world's tokenizer (one token per character) and model class. They differ in what
the warm start imitates:

    tiny:   2-4 operands, one way to write the solution:    "7+8=15\\n15-9=6\\n\\boxed{6}"
    chain:  2-5 operands, a concise style (as tiny) or a padded one, half of the time each:
            "7+8-9+2\\n7+8=15\\n15+0=15\\n15-9=6\\n6-0=6\\n6+2=8\\n\\boxed{8}"
            (the question restated on the first line; after a step, sometimes a step that adds or takes 0)

In the chain task only a few tokens decide the answer (the digits of each result), many correct solutions of
different lengths exist, and a method could learn to be brief. Every task knows, for any text, whether it can
still be continued into a correct solution (viable()): credit.py finds the first token of a wrong rollout that
departs from every correct solution with it. `--model tiny` means the task's own warm-started model.

A Task's fields: make_problem(rng) -> q; answer(q); prompt(q); solution(q, rng) -> one correct worked solution
(the warm start's target, without EOS); viable(q, text) -> bool; and the warm start's settings (steps, batch
size, learning rate), the default --max-new-tokens and the held-out set's seed.
"""
import random
from dataclasses import dataclass
from typing import Callable

from toyworld import tiny


@dataclass(frozen=True)
class Task:
    name: str
    make_problem: Callable  # (rng) -> q
    solution: Callable  # (q, rng) -> a correct worked solution, without EOS
    padded: bool  # whether viable() accepts the padded style's lines
    max_new_tokens: int  # the default --max-new-tokens: room for the longest padded solution
    warm_steps: int  # warm start: supervised steps, batch size, learning rate (tiny.warm_start)
    warm_batch: int
    warm_lr: float
    eval_seed: int = 1234  # the held-out set's own seed

    answer = staticmethod(tiny.answer)
    prompt = staticmethod(tiny.prompt)
    teacher_prompt = staticmethod(tiny.teacher_prompt)

    def viable(self, q: str, text: str) -> bool:
        return viable(q, text, self.padded)

    def eval_problems(self, n: int = tiny.N_EVAL) -> list:
        """The fixed held-out set: n distinct problems drawn with the task's own seed (tiny.eval_problems)."""
        return tiny.eval_problems(self.eval_seed, n, self.make_problem)

    def train_problems(self, rng: random.Random, n: int, held_out: set) -> list:
        """n training problems, none of them held out (tiny.train_problems)."""
        return tiny.train_problems(rng, n, held_out, self.make_problem)


# --------------------------------------------------------------------------------------------------
# The chain task

def make_chain(rng: random.Random) -> str:
    """A chain of 2 to 5 single-digit operands, such as '7+8-9+2'."""
    q = str(rng.randint(0, 9))
    for _ in range(rng.randint(2, 5) - 1):
        q += rng.choice("+-") + str(rng.randint(0, 9))
    return q


def chain_solution(q: str, rng: random.Random) -> str:
    """Concise (as the tiny world's) or padded, half of the time each. Padded: the question restated first, and
    after each step, with probability 1/2, a step that adds or takes 0 ('15+0=15')."""
    if rng.random() < 0.5:
        return tiny.solution(q)
    lines = [q]
    for a, op, b, c in tiny._steps(q):
        lines.append(f"{a}{op}{b}={c}")
        if rng.random() < 0.5:
            lines.append(f"{c}{rng.choice('+-')}0={c}")
    return "\n".join(lines) + "\n\\boxed{" + tiny.answer(q) + "}"


# --------------------------------------------------------------------------------------------------
# Which texts can still become a correct solution

def next_lines(q: str, done: int, value: int, first: bool, padded: bool) -> list:
    """Every line (with its ending: a newline, or EOS after the box) a correct solution may write next, after
    `done` steps that reached `value`; `first`: nothing written yet. Each line: (text, steps done after it)."""
    steps = list(tiny._steps(q))
    out = []
    if done < len(steps):
        a, op, b, c = steps[done]
        out.append((f"{value}{op}{b}={c}\n", done + 1))
    else:
        out.append(("\\boxed{" + tiny.answer(q) + "}" + tiny.EOS, done))
    if padded:
        out += [(f"{value}+0={value}\n", done), (f"{value}-0={value}\n", done)]
        if first:
            out.append((q + "\n", done))
    return out


def viable(q: str, text: str, padded: bool) -> bool:
    """True if `text` (a response so far, EOS written as tiny.EOS) is a prefix of some correct solution of q:
    its complete lines are each one a correct solution may write there, and the rest begins one.
    viable('7+8', '7+8=15\\n\\box', False) is True; viable('7+8', '7+8=16', False) is False.

    When a step's operand is 0 the step and a zero step are the same line; it is read as the step, which loses
    nothing (from there, every line the other reading allows is allowed too)."""
    done, value, first = 0, int(q[0]), True
    while text:
        lines = next_lines(q, done, value, first, padded)
        full = next(((line, d) for line, d in lines if text.startswith(line)), None)
        if full is None:
            return any(line.startswith(text) for line, _ in lines)
        line, done = full
        if line.endswith(tiny.EOS):
            return len(text) == len(line)  # nothing may follow EOS
        if "=" in line:  # a step or a zero step (not the restated question)
            value = int(line.split("=")[1])
        text, first = text[len(line):], False
    return True


TASKS = {
    tiny.NAME: Task(tiny.NAME, tiny.make_problem, lambda q, rng: tiny.solution(q), padded=False, max_new_tokens=48,
                 warm_steps=250, warm_batch=64, warm_lr=1e-3),
    "chain": Task("chain", make_chain, chain_solution, padded=True, max_new_tokens=128,
                  warm_steps=350, warm_batch=64, warm_lr=1e-3, eval_seed=4321),
}
