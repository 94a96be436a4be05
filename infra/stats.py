"""The small statistics of the comparison tools (tools/paired.py, plots.curves): the mean's 95 % t-interval over
seeds, and the smallest difference such a paired comparison detects.

Minimum detectable difference (MDD), at a two-sided 5 % level and 80 % power, for n paired differences of standard
deviation sd: MDD = (t_0.975(n - 1) + t_0.80(n - 1)) sd / sqrt(n), the usual normal-shift approximation of the paired
t-test's power (a true difference of that size is found "different from 0" in about 80 % of repeats). It is read from
the spread the runs showed, so it is itself an estimate: with 3 seeds the sd is known to within a factor of about 2.
"""
import math
import statistics

# Student's t quantiles by degrees of freedom (scipy.stats.t.ppf); a df between tabled ones takes the next smaller
# (a wider interval, a larger MDD); beyond 30 the normal's quantile z widened by the Cornish-Fisher terms (_beyond),
# not z alone, which is narrower than t at every df (it made seeds_needed answer 68 seeds where t says 70)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086,
        25: 2.060, 30: 2.042}
T80 = {1: 1.376, 2: 1.061, 3: 0.978, 4: 0.941, 5: 0.920, 6: 0.906, 7: 0.896, 8: 0.889, 9: 0.883, 10: 0.879,
       11: 0.876, 12: 0.873, 13: 0.870, 14: 0.868, 15: 0.866, 16: 0.865, 17: 0.863, 18: 0.862, 19: 0.861, 20: 0.860,
       25: 0.856, 30: 0.854}


def _beyond(z: float, df: int) -> float:
    """The t quantile at df > 30 from the normal's z (Cornish-Fisher, two terms; within 1e-4 of scipy's there):
    t = z + (z^3 + z) / (4 df) + (5 z^5 + 16 z^3 + 3 z) / (96 df^2)."""
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def _t(table: dict, df: int, z: float) -> float:
    return table[max(d for d in table if d <= df)] if df <= 30 else _beyond(z, df)


def t975(df: int) -> float:
    """The t quantile for a two-sided 95 % interval at df degrees of freedom."""
    return _t(T975, df, 1.959964)


def t80(df: int) -> float:
    """The t quantile of 80 % power (one side) at df degrees of freedom."""
    return _t(T80, df, 0.841621)


def interval(values: list) -> tuple:
    """(mean, low, high): the mean and its 95 % t-interval. interval([0.1, 0.3]) == (0.2, 0.2 - 12.706 * 0.1,
    0.2 + 12.706 * 0.1) (sd 0.1414, / sqrt 2 = 0.1); one value, or values all equal: (v, nan, nan)."""
    n = len(values)
    mean = statistics.mean(values)
    # all equal (two seeds that moved by the same 1/128 of accuracy): the t-interval's width would be 0, a certainty
    # the seeds do not give, and the verdict would read "worse" or "better" on it; no interval instead
    if n < 2 or statistics.pstdev(values) == 0:
        return mean, float("nan"), float("nan")
    half = t975(n - 1) * statistics.stdev(values) / math.sqrt(n)
    return mean, mean - half, mean + half


def detectable(values: list) -> float:
    """The minimum detectable difference of a paired comparison with these differences (module docstring), nan for
    fewer than 2 or all equal. detectable([0.0, 0.2]): sd 0.1414, (12.706 + 1.376) * 0.1414 / sqrt 2 = 1.408."""
    n = len(values)
    if n < 2 or statistics.pstdev(values) == 0:
        return float("nan")
    return (t975(n - 1) + t80(n - 1)) * statistics.stdev(values) / math.sqrt(n)


def seeds_needed(sd: float, effect: float, most: int = 1000) -> int:
    """The fewest seeds whose paired comparison detects `effect` at 80 % power, given the differences' sd (the
    module's formula solved for n); `most` + 1 where even that many would not."""
    for n in range(2, most + 1):
        if (t975(n - 1) + t80(n - 1)) * sd / math.sqrt(n) <= abs(effect):
            return n
    return most + 1
