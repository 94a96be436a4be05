"""tools/findings.py: the numbers of docs/findings.md that tools.paired does not print, from the archives."""
import pytest

from tools import findings


def test_the_summed_clock_by_hand():
    # steps of 1, 3 and 2 s: 1, 4, 6 s summed (tools.paired's median: 2 s a step, so 2, 4, 6)
    recs = [{"step": 0, "eval_accuracy": 0.2}] + [{"step": s, "time_step": t}
                                                   for s, t in ((1, 1.0), (2, 3.0), (3, 2.0))]
    assert findings.summed(recs) == pytest.approx({0: 0.0, 1: 1.0, 2: 4.0, 3: 6.0})


def test_the_page_numbers_from_the_archives(capsys):
    findings.main()
    out = capsys.readouterr().out
    # grpo's same seed on the three SmolLM2 machines (and the EPYC's seed 3 of results/dapo-parts), issue 81's range
    assert "7 pairs: |difference| 0.008-0.109" in out
    assert "evaluation noise of one difference <= sqrt(2 p (1-p) / n) = 0.061" in out  # SmolLM2, 128 problems
    assert "| grpo | 10 | 2.2 [1.7, 2.6] | 8.0 [8.0, 8.0] |" in out  # the mixed groups of grpo's batches
