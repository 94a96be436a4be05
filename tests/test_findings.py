"""tools/findings.py: the numbers of docs/findings.md that tools.paired does not print, from the archives."""
import os

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
    # the share of tokens KTAE reshapes on tiny: its seed-0 run again (results/tokens-reshaped), 0.142 over 60 steps
    assert "| ktae | 5 | 12.3 [11.8, 12.6] | 16.0 [16.0, 16.0] | 0.23 [0.21, 0.26] | 0.14 (seed 0 run again) |" in out


def test_the_authors_runs_replace_the_former_variants(tmp_path, monkeypatch):
    # an issue-62 archive with grpo, the former rlsd and shear at seed 0; then the authors' rlsd at seed 0: the folder
    # holds grpo and the authors' rlsd (its done.json), and no shear (the former's, left out, not mixed in)
    import json
    import tarfile

    def archive(name, runs):
        src = tmp_path / "src" / name
        for run, method in runs:
            (src / run).mkdir(parents=True)
            (src / run / "done.json").write_text(json.dumps({"method": method, "seed": 0, "who": name}))
        with tarfile.open(tmp_path / f"{name}.tar.gz", "w:gz") as t:
            for run, _ in runs:
                t.add(src / run, arcname=run)
    archive("old", [("grpo-seed0", "grpo"), ("rlsd-seed0", "rlsd"), ("shear-seed0", "shear")])
    archive("new", [("rlsd-seed0", "rlsd")])
    monkeypatch.setattr(findings, "HERE", str(tmp_path))
    monkeypatch.setattr(findings, "FORMER", {"old.tar.gz"})
    (folder,) = findings.unpack(str(tmp_path / "out"), {"EPYC": ["old.tar.gz", "new.tar.gz"]})
    assert sorted(os.listdir(folder)) == ["grpo-seed0", "rlsd-seed0"]
    assert json.loads(open(os.path.join(folder, "rlsd-seed0", "done.json")).read())["who"] == "new"
    # a later archive holding a run already unpacked (grpo-seed0) is refused, not mixed in
    archive("dup", [("grpo-seed0", "grpo")])
    with pytest.raises(ValueError, match="dup.tar.gz: holds grpo-seed0, already unpacked"):
        findings.unpack(str(tmp_path / "out2"), {"EPYC": ["old.tar.gz", "dup.tar.gz"]})
