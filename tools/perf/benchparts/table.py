"""The benchmark's one table, printed a row at a time, and the few helpers every part formats its numbers with."""
import statistics
import sys


class Table:
    """One table, printed a row at a time as each is measured, so that a run cut off still shows what it had.
    Columns: the part of the benchmark, what was measured, its value, what it is held against, and the ratio."""
    WIDTHS = (9, 60, 14, 24, 11)

    def __init__(self, title: str, out=None):
        self.out, self.rows, self.failures = out or sys.stdout, [], []
        self._print(title)
        self._line(("part", "what", "measured", "against", "ratio"))
        self._print("-" * (sum(self.WIDTHS) + len(self.WIDTHS) - 1))

    def row(self, part: str, what: str, measured: str = "", against: str = "", ratio: str = ""):
        self.rows.append((part, what, measured, against, ratio))
        self._line(self.rows[-1])

    def fail(self, part: str, what: str):
        """A row saying that a part could not measure what it was asked to: bench.py then exits nonzero."""
        self.failures.append(f"{part}: {what}")
        self.row(part, what)

    def _line(self, cells):
        part, what, measured, against, ratio = (str(c) for c in cells)
        w = self.WIDTHS
        self._print(f"{part:{w[0]}s} {what:{w[1]}s} {measured:>{w[2]}s} {against:>{w[3]}s} {ratio:>{w[4]}s}".rstrip())

    def _print(self, text: str):
        print(text, file=self.out, flush=True)


def progress(text: str):
    """What the benchmark is doing, on stderr (the table alone goes to stdout)."""
    print(f"bench: {text}", file=sys.stderr, flush=True)


def median(values):
    return statistics.median(values) if values else float("nan")


def rate(x: float, unit: str) -> str:
    """1.23e11, "FLOP/s" -> "123.0 GFLOP/s"."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.1f} {prefix}{unit}"
    return f"{x:.1f} {unit}"
