"""tools/paired: the paired difference against a baseline, its t-interval, the equal-wall-clock reading and the
verdict by the margin stated before issue 62's runs, on numbers checked by hand."""
import json
import math
import os
import shutil

import pytest

from infra import stats
from tools import paired


def test_interval_by_hand():
    # [0.1, 0.3]: mean 0.2, sd 0.1414, standard error 0.1414 / sqrt 2 = 0.1, t(1 df) 12.706: 0.2 +- 1.2706
    mean, low, high = paired.interval([0.1, 0.3])
    assert mean == pytest.approx(0.2) and low == pytest.approx(0.2 - 1.2706) and high == pytest.approx(0.2 + 1.2706)
    assert paired.t975(4) == 2.776 and paired.t975(22) == 2.086
    # df 40, beyond the table: z 1.959964 + (7.529 + 1.960) / 160 + (144.6 + 120.5 + 5.88) / 153600 = 2.02103
    # (scipy's t.ppf(0.975, 40): 2.021075; the normal's 1.96 alone was narrower)
    assert paired.t975(40) == pytest.approx(2.02103, abs=1e-4)
    assert math.isnan(paired.interval([0.5])[1])
    # two seeds that moved by the same 34/128 (OAR-P on SmolLM2, seeds 0 and 1): sd 0, so no interval, and the
    # verdict is not "worse" on a zero-width one
    mean, low, high = paired.interval([-34 / 128, -34 / 128])
    assert mean == -34 / 128 and math.isnan(low) and math.isnan(high)
    assert paired.verdict(mean, low, high) == "not detectable at this size"


def test_detectable_difference_by_hand():
    # [0.0, 0.2]: sd 0.1414, / sqrt 2 = 0.1; (t975(1) 12.706 + t80(1) 1.376) * 0.1 = 1.4082
    assert stats.detectable([0.0, 0.2]) == pytest.approx(1.4082)
    # [0.10, 0.12, 0.11]: sd 0.01, / sqrt 3 = 0.005774; (4.303 + 1.061) * 0.005774 = 0.03097
    assert stats.detectable([0.10, 0.12, 0.11]) == pytest.approx(0.03097, abs=1e-5)
    assert math.isnan(stats.detectable([0.1])) and math.isnan(stats.detectable([0.1, 0.1]))
    # sd 0.1 and an effect of +0.03: n = 90 gives (t975(89) 1.98698 + t80(89) 0.84568) * 0.1 / sqrt 90 = 0.02986
    # <= 0.03, n = 89: (1.98729 + 0.84572) * 0.1 / sqrt 89 = 0.03003 > 0.03: 90 seeds (with the normal's 1.96 and
    # 0.842, 88: too few)
    assert stats.seeds_needed(0.1, 0.03) == 90
    # df 40: 0.841621 + (0.5961 + 0.8416) / 160 + (2.111 + 9.538 + 2.525) / 153600 = 0.85069 (scipy's 0.850700)
    assert stats.t80(4) == 0.941 and stats.t80(40) == pytest.approx(0.85070, abs=1e-4)


def test_band_is_the_seeds_range_by_hand():
    # step 0: [0.1, 0.3] -> mean 0.2 from 0.1 to 0.3; step 10: [0.9, 0.86] -> 0.88 from 0.86 to 0.9; step 20 is not
    # in both runs
    steps, means, lows, highs = paired.band([{0: 0.1, 10: 0.9, 20: 0.5}, {0: 0.3, 10: 0.86}])
    assert steps == [0, 10] and means == pytest.approx([0.2, 0.88])
    assert lows == pytest.approx([0.1, 0.86]) and highs == pytest.approx([0.3, 0.9])
    assert paired.band([{0: 0.4}]) == ([0], [0.4], [0.4], [0.4])  # one run: no band


def run(tmp, method, seed, accs, step_seconds):
    """A finished compare run: an evaluation at each step 0..len(accs)-1, each step taking step_seconds."""
    d = tmp / f"{method}-seed{seed}"
    d.mkdir()
    recs = [{"step": 0, "eval_accuracy": accs[0], "eval_response_len": 30.0}]
    for s, a in enumerate(accs[1:], 1):
        recs += [{"step": s, "time_step": step_seconds, "reward_mean": a},
                 {"step": s, "eval_accuracy": a, "eval_response_len": 30.0 + s * (method != "grpo")}]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (d / "done.json").write_text(json.dumps({"method": method, "seed": seed, "steps": len(accs) - 1}))


def test_paired_rows_by_hand(tmp_path):
    for seed, (g, k, slow) in enumerate([(0.5, 0.6, 0.6), (0.4, 0.52, 0.5), (0.6, 0.71, 0.8)]):
        run(tmp_path, "grpo", seed, [0.2, 0.3, g], 1.0)
        run(tmp_path, "ktae", seed, [0.2, 0.3, k], 1.0)
        run(tmp_path, "slow", seed, [0.2, 0.25, slow], 2.0)  # twice grpo's seconds a step
    run(tmp_path, "ktae", 3, [0.2, 0.3, 0.9], 1.0)  # no grpo run of seed 3: not paired
    rows = {r["method"]: r for r in paired.rows(paired.finished(str(tmp_path)), "grpo", 0.5)}
    # ktae - grpo at step 2: [0.10, 0.12, 0.11], mean 0.11, sd 0.01, se 0.01 / sqrt 3 = 0.005774, t(2) 4.303:
    # +- 0.02484, lower end 0.0852 > 0 and mean >= 0.03: better
    k = rows["ktae"]
    assert k["seeds"] == [0, 1, 2]
    assert k["d_step"] == pytest.approx((0.11, 0.11 - 0.02484, 0.11 + 0.02484), abs=1e-4)
    assert paired.verdict(*k["d_step"][:3]) == "better"
    # slow - grpo at step 2: [0.1, 0.1, 0.2], mean 0.1333, sd 0.0577, se 0.0333, +- 0.1434: lower end -0.0101
    s = rows["slow"]
    assert s["d_step"] == pytest.approx((0.13333, 0.13333 - 0.14343, 0.13333 + 0.14343), abs=1e-4)
    assert paired.verdict(*s["d_step"][:3]) == "not detectable at this size"
    # its detectable difference: (4.303 + 1.061) * 0.0577 / sqrt 3 = 0.1787; ktae's: 0.03097 (above)
    assert s["mdd_step"] == pytest.approx(0.1787, abs=1e-3) and k["mdd_step"] == pytest.approx(0.03097, abs=1e-4)
    # grpo's 2 steps took 2 s; slow reached only step 1 by then (0.25): 0.25 - [0.5, 0.4, 0.6] = mean -0.25
    assert s["d_wall"][0] == pytest.approx(-0.25)
    assert k["d_wall"][0] == pytest.approx(0.11)  # the same speed: the same reading as at equal steps
    assert s["d_length"][0] == pytest.approx(2.0) and s["minutes"] == pytest.approx(4 / 60)
    assert (s["length"], s["base_length"], s["base_minutes"]) == pytest.approx((32.0, 30.0, 2 / 60))
    assert k["reach"] == [2, 2, 2] and s["reach"] == [2, 2, 2] and rows["slow"]["step"] == 2
    assert s["base_reach"] == [2, None, 2]  # grpo's seed 1 ends at 0.4
    assert paired.verdict(0.02, 0.001, 0.04) == "not detectable at this size"  # above 0 but under the margin
    line = next(x for x in paired.table([s], "grpo", 0.5).splitlines() if x.startswith("| slow"))
    assert "| +-0.179 | not detectable at this size |" in line and "| 0.1 / 0.0 |" in line
    assert "| 2, 2, 2 / 2, none, 2 |" in line and "| 32.0 / 30.0 |" in line
    # a method whose runs timed no step: equal steps as before (0.6 - 0.5 etc.), no wall-clock reading and no minutes
    # (not 0 seconds, which would compare grpo's last evaluation with its step 0)
    for seed, acc in enumerate((0.6, 0.52, 0.71)):
        run(tmp_path, "untimed", seed, [0.2, 0.3, acc], 1.0)
        d = tmp_path / f"untimed-seed{seed}" / "metrics.jsonl"
        d.write_text("".join(line.replace(', "time_step": 1.0', "") + "\n" for line in d.read_text().splitlines()))
    u = {r["method"]: r for r in paired.rows(paired.finished(str(tmp_path)), "grpo", 0.5)}["untimed"]
    assert u["d_step"][0] == pytest.approx(0.11) and math.isnan(u["d_wall"][0]) and math.isnan(u["minutes"])
    line = next(x for x in paired.table([u], "grpo", 0.5).splitlines() if x.startswith("| untimed"))
    assert line.split("|")[7:10] == [" n/a ", " n/a ", " n/a "] and line.split("|")[11] == " n/a / n/a "
    assert paired.verdict(-0.123, -0.195, -0.050) == "worse"  # the whole interval below 0, the mean below -0.03
    assert paired.verdict(-0.031, -0.069, 0.007) == "not detectable at this size"  # the interval holds 0
    assert paired.verdict(-0.02, -0.03, -0.01) == "not detectable at this size"  # below 0, but within the margin


def test_a_shared_machine_marks_the_minutes(tmp_path):
    # cpu_share 0.5 on one of grpo's steps and 0.6 on the other: median 0.55 < 0.8, the row's minutes are marked
    for seed in (0, 1):
        run(tmp_path, "grpo", seed, [0.2, 0.3, 0.5], 1.0)
        run(tmp_path, "ktae", seed, [0.2, 0.3, 0.5 + 0.1 * seed], 1.0)
    for m, shares in (("grpo", (0.5, 0.6)), ("ktae", (0.95, 0.97))):
        path = tmp_path / f"{m}-seed0" / "metrics.jsonl"
        lines, k = [], iter(shares)
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            rec.update({"time_cpu_share": next(k)} if "time_step" in rec else {})
            lines.append(json.dumps(rec))
        path.write_text("\n".join(lines) + "\n")
    (row,) = paired.rows(paired.finished(str(tmp_path)), "grpo", 0.5)
    assert row["cpu_share"] == pytest.approx(0.55)
    md = paired.table([row], "grpo", 0.5)
    assert "| 0.0 / 0.0 (shared) |" in md and "(shared): a run's median CPU share" in md


def test_spearman_and_the_blame_table_by_hand(tmp_path):
    assert paired.spearman([1, 2, 3], [3, 1, 2]) == pytest.approx(-0.5)  # ranks 0,1,2 vs 2,0,1: d^2 4+1+1 = 6
    assert paired.spearman([0.9, 0.6, 0.7], [0.1, -0.2, 0.0]) == pytest.approx(1.0)
    assert paired.ranks([0.3, 0.1, 0.3]) == [1.5, 0, 1.5]  # a tie shares the mean of ranks 1 and 2
    for seed in (0, 1):
        run(tmp_path, "grpo", seed, [0.2, 0.4, 0.5], 1.0)
        run(tmp_path, "ktae", seed, [0.2, 0.4, 0.45], 1.0)
    for m, auc in (("grpo", 0.5), ("ktae", 0.7)):
        for seed in (0, 1):  # a credit_auc on step 1 only, 0.1 apart between seeds: means 0.65 and 0.75 for ktae
            path = tmp_path / f"{m}-seed{seed}" / "metrics.jsonl"
            path.write_text(path.read_text() + json.dumps({"step": 1, "credit_auc": auc + 0.1 * seed - 0.05 * (m == "ktae")}) + "\n")
    (row,) = paired.rows(paired.finished(str(tmp_path)), "grpo", 0.5)
    assert row["auc"][0] == pytest.approx(0.70)
    assert "| ktae | 2 | 0.700 [" in paired.table([row], "grpo", 0.5)


def test_write_makes_the_table_and_both_pictures(tmp_path, capsys):
    for seed in (0, 1):
        run(tmp_path, "grpo", seed, [0.2, 0.4, 0.5], 1.0)
        run(tmp_path, "ktae", seed, [0.2, 0.4, 0.55 + 0.1 * seed], 1.5)
    paired.main([str(tmp_path)])
    md = (tmp_path / "paired.md").read_text()
    assert "| ktae | 2 | 0.600 [" in md and "| +0.100 [" in md
    assert (tmp_path / "paired_curves.png").stat().st_size > 0 and (tmp_path / "paired_diffs.png").stat().st_size > 0
    with pytest.raises(SystemExit):
        paired.main([str(tmp_path), "--baseline", "dapo"])
    assert "no finished run of --baseline dapo" in capsys.readouterr().err


def test_two_machines_folders_pair_within_each(tmp_path, capsys):
    # seed 0 on machine A (grpo 0.5, ktae 0.6) and seed 0 on machine B (grpo 0.4, ktae 0.45), plus seed 1 on B
    # (grpo 0.6, ktae 0.7); B's seed 2 has no grpo run. Pairs within a folder: [0.1, 0.05, 0.1], mean 0.08333,
    # sd 0.02887, se 0.01667, t(2) 4.303: +- 0.07172. Paired across folders (A's ktae with B's grpo), seed 0 would be
    # 0.6 - 0.4 = 0.2
    a, b = tmp_path / "a", tmp_path / "b"
    for folder, seeds in ((a, {0: (0.5, 0.6)}), (b, {0: (0.4, 0.45), 1: (0.6, 0.7), 2: (None, 0.9)})):
        folder.mkdir()
        (folder / "settings.json").write_text('{"--steps": 1}')
        for seed, (g, k) in seeds.items():
            if g is not None:
                run(folder, "grpo", seed, [0.2, g], 1.0)
            run(folder, "ktae", seed, [0.2, k], 1.0)
    (row,) = paired.rows(paired.finished(str(a), str(b)), "grpo", 0.5)
    assert row["seeds"] == [(0, 0), (1, 0), (1, 1)]
    assert row["d_step"] == pytest.approx((0.08333, 0.08333 - 0.07172, 0.08333 + 0.07172), abs=1e-4)
    paired.main([str(a), str(b)])  # the table goes to the first folder
    assert "| ktae | 3 |" in (a / "paired.md").read_text() and not (b / "paired.md").exists()
    (b / "settings.json").write_text('{"--steps": 2}')  # another comparison: not paired with a's
    with pytest.raises(SystemExit):
        paired.main([str(a), str(b)])
    assert "settings.json differs" in capsys.readouterr().err


def test_a_comparison_joins_each_run_once_and_only_its_own(tmp_path, capsys):
    for seed in (0, 1):
        run(tmp_path, "grpo", seed, [0.2, 0.4, 0.5], 1.0)
        run(tmp_path, "ktae", seed, [0.2, 0.4, 0.55 + 0.1 * seed], 1.0)
    # one folder named twice, through a link: refused, not two more seeds
    (tmp_path.parent / "link").symlink_to(tmp_path)
    with pytest.raises(ValueError, match="named twice"):
        paired.finished(str(tmp_path), str(tmp_path.parent / "link"))
    # a backup copy of a run inside the folder: two finished ktae runs of seed 1
    import shutil
    shutil.copytree(tmp_path / "ktae-seed1", tmp_path / "ktae-seed1.bak")
    with pytest.raises(ValueError, match="both a finished ktae run of seed 1"):
        paired.finished(str(tmp_path))
    shutil.rmtree(tmp_path / "ktae-seed1.bak")
    # the same run in two folders (a copied folder named as another machine's)
    shutil.copytree(tmp_path, tmp_path.parent / "copy")
    with pytest.raises(ValueError, match="the same run twice"):
        paired.finished(str(tmp_path), str(tmp_path.parent / "copy"))
    # a run made under other train.py flags than the folder's settings.json is left out, and said
    (tmp_path / "settings.json").write_text(json.dumps({"--steps": 2, "the train.py flags after --": ["--lr", "1e-4"]}))
    for seed in (0, 1):
        for m in ("grpo", "ktae"):
            done = json.loads((tmp_path / f"{m}-seed{seed}" / "done.json").read_text())
            lr = "3e-4" if (m, seed) == ("ktae", 1) else "1e-4"  # an older run left by --overwrite of seed 0 only
            done["flags"] = ["--method", m, "--seed", str(seed), "--steps", "2", "--dataset", "tiny", "--lr", lr]
            (tmp_path / f"{m}-seed{seed}" / "done.json").write_text(json.dumps(done))
    runs = paired.finished(str(tmp_path))
    assert sorted(runs["ktae"]) == [0] and sorted(runs["grpo"]) == [0, 1]
    assert "ktae-seed1: left out, made with the train.py flags --lr 3e-4, not the folder's --lr 1e-4" in \
        capsys.readouterr().out
    # a run with a flag more after -- than the folder's (not only other values) is left out too
    done = json.loads((tmp_path / "grpo-seed1" / "done.json").read_text())
    done["flags"] += ["--beta", "0.1"]
    (tmp_path / "grpo-seed1" / "done.json").write_text(json.dumps(done))
    assert sorted(paired.finished(str(tmp_path))["grpo"]) == [0]
    assert "not the folder's --lr 1e-4" in capsys.readouterr().out
    # a variant's own flags come after the folder's: its run agrees
    done["flags"] = done["flags"][:-2] + ["--ktae-alpha", "0"]
    done["method"] = "grpo[ktae-alpha=0]"
    (tmp_path / "grpo-seed1" / "done.json").write_text(json.dumps(done))
    assert paired.disagrees(done, json.loads((tmp_path / "settings.json").read_text())) is None
    done["method"] = "grpo"
    (tmp_path / "grpo-seed1" / "done.json").write_text(json.dumps(done))
    # tools.compare names the runs it made: those only
    assert sorted(paired.finished(str(tmp_path), only={("grpo", 1), ("ktae", 1)})) == ["grpo", "ktae"]


def test_runs_paired_cannot_read_are_one_line(tmp_path, capsys):
    for seed in (0, 1):
        run(tmp_path, "grpo", seed, [0.2, 0.4, 0.5], 1.0)
        run(tmp_path, "ktae", seed, [0.2, 0.4, 0.6], 1.0)
    # a null accuracy: the run is left out and said, the rest paired
    path = tmp_path / "ktae-seed1" / "metrics.jsonl"
    path.write_text(path.read_text().replace('"eval_accuracy": 0.6', '"eval_accuracy": null'))
    assert sorted(paired.finished(str(tmp_path))["ktae"]) == [0]
    assert "ktae-seed1: left out, its eval_accuracy at step 2 is not a number" in capsys.readouterr().out
    # a finished run without metrics: one line
    os.remove(path)
    with pytest.raises(SystemExit):
        paired.main([str(tmp_path)])
    assert "ktae-seed1: finished (done.json) but without its metrics.jsonl" in capsys.readouterr().err
    # an output folder that refuses the write: the table is printed, then one line
    run(tmp_path, "ktae", 2, [0.2, 0.4, 0.6], 1.0)
    shutil.rmtree(tmp_path / "ktae-seed1")
    (tmp_path / "paired.md").mkdir()  # a folder where the table goes
    with pytest.raises(SystemExit):
        paired.main([str(tmp_path)])
    out, err = capsys.readouterr()
    assert "| ktae | 1 |" in out and "cannot be written" in err.splitlines()[-1] and "Traceback" not in err


def test_the_wall_clock_reading_interpolates_between_evaluations_by_hand(tmp_path):
    # evaluations at steps 0 (0.2) and 10 (0.5), 1 s a step: at 4 s, 0.2 + (0.5 - 0.2) * 4 / 10 = 0.32; past the last
    # evaluation, its value; at the grid point, the value there (not a whole evaluation earlier)
    recs = [{"step": 0, "eval_accuracy": 0.2}] + [{"step": s, "time_step": 1.0} for s in range(1, 11)] + [
        {"step": 10, "eval_accuracy": 0.5}]
    assert paired.accuracy_within(recs, 4.0) == pytest.approx(0.32)
    assert paired.accuracy_within(recs, 10.0) == pytest.approx(0.5) and paired.accuracy_within(recs, 30.0) == 0.5
    assert paired.first_evaluation_time(recs) == 10.0
    assert math.isnan(paired.accuracy_within(recs[1:], 4.0))  # no evaluation by then (none at step 0): no reading
    # a method at 2 s a step read at grpo's 2 s (its step 1 of 2): before its first evaluation after step 0 when that
    # is at step 2, so the row says it was read early; 0.2 + (0.6 - 0.2) * 2 / 4 = 0.4, minus grpo's 0.5: -0.1
    for seed in (0, 1):
        run(tmp_path, "grpo", seed, [0.2, 0.3, 0.5], 1.0)
        d = tmp_path / f"slow-seed{seed}"
        d.mkdir()
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
            {"step": 0, "eval_accuracy": 0.2}, {"step": 1, "time_step": 2.0}, {"step": 2, "time_step": 2.0},
            {"step": 2, "eval_accuracy": 0.6, "eval_response_len": 30.0}]))
        (d / "done.json").write_text(json.dumps({"method": "slow", "seed": seed, "steps": 2}))
    (row,) = paired.rows(paired.finished(str(tmp_path)), "grpo", 0.5)
    assert row["d_wall"][0] == pytest.approx(-0.1) and row["early"] == 2
    assert "first evaluation after step 0, so between the untrained model and that evaluation: slow (2 of 2 seeds)" \
        in paired.table([row], "grpo", 0.5)


def test_the_pictures_say_the_task_and_whose_baseline_curve_by_hand():
    settings = {"--dataset": {"name": "arith"}, "--steps": 40, "the train.py flags after --": [
        "--model", "smollm2-135m", "--prompts-per-step", "8", "--group-size", "8", "--eval-limit", "128"]}
    assert paired.task_title(settings) == \
        "arith, smollm2-135m, 40 steps, 8 x 8 rollouts a step, 128 evaluation problems"
    assert paired.task_title({"--dataset": {"name": "tiny"}, "--steps": 60, "the train.py flags after --": []}) == \
        "tiny, the task's own model, 60 steps"
    assert paired.task_title(None) == ""
    # a panel's grey curve: grpo's runs of the panel's seeds, and on several machines which folder holds which
    assert paired.whose([0, 1], ["epyc"]) == "seeds 0, 1"
    assert paired.whose([(0, 2), (2, 3), (2, 4)], ["epyc", "xeon", "xeon2"]) == "epyc: seed 2; xeon2: seeds 3, 4"


def test_the_difference_plot_keeps_each_seed_and_clips_a_wide_interval_by_hand(tmp_path):
    # OAR-P on SmolLM2 at three seeds: -0.266, -0.266, +0.188 (34/128 and 24/128), mean -0.11458, deviations
    # -0.15104, -0.15104, +0.30208, sd sqrt(0.13688 / 2) = 0.26161, se 0.15104, x t(2) 4.303 = 0.64993: interval
    # [-0.76452, +0.53535]; the axis stays at +-0.4 (every seed inside), the interval is cut there, its ends said
    for seed, d in enumerate((-34 / 128, -34 / 128, 24 / 128)):
        run(tmp_path, "grpo", seed, [0.2, 0.5], 1.0)
        run(tmp_path, "oar-p", seed, [0.2, 0.5 + d], 1.0)
    (row,) = paired.rows(paired.finished(str(tmp_path)), "grpo", 0.5)
    assert row["d_step_seeds"] == pytest.approx([-34 / 128, -34 / 128, 24 / 128])
    assert row["d_step"] == pytest.approx((-0.11458, -0.76452, 0.53535), abs=1e-4)
    assert paired.axis_limit([row]) == 0.4
    assert paired.clipped(row, 0.4).startswith("equal steps [-0.765, +0.535] clipped")
    # a seed beyond +-0.4 widens the axis to a tenth past it, so that no seed is cut off
    assert paired.axis_limit([dict(row, d_step_seeds=[-0.55, 0.1, 0.1])]) == 0.6
    assert paired.clipped({"d_step": (0.1, 0.0, 0.2), "d_wall": (math.nan, math.nan, math.nan)}, 0.4) == ""


def test_the_reading_at_equal_sampled_groups_by_hand(tmp_path):
    # grpo samples 1 group a step (2 by step 2, where it ends at 0.5); "wide" 2 a step at seed 0, 3 at seed 1, with
    # evaluations 0.2, 0.4, 0.6 at steps 0, 1, 2. Read at grpo's 2 groups: seed 0 at its step 1, 0.4 - 0.5 = -0.1;
    # seed 1 two thirds of the way to step 1 (3 groups), 0.2 + 0.2 * 2 / 3 = 0.3333, - 0.5 = -0.1667: mean -0.1333,
    # seed 1 read before its first evaluation after step 0. A method sampling grpo's groups gets no such reading.
    for seed, per_step in ((0, 2), (1, 3)):
        for method, accs, groups in (("grpo", [0.2, 0.3, 0.5], 1), ("wide", [0.2, 0.4, 0.6], per_step),
                                     ("same", [0.2, 0.3, 0.6], 1)):
            run(tmp_path, method, seed, accs, 1.0)
            d = tmp_path / f"{method}-seed{seed}" / "metrics.jsonl"
            d.write_text("".join(line.replace('"reward_mean"', f'"groups_generated": {groups}, "reward_mean"') + "\n"
                                 for line in d.read_text().splitlines()))
    rows = {r["method"]: r for r in paired.rows(paired.finished(str(tmp_path)), "grpo", 0.5)}
    w = rows["wide"]
    assert w["d_groups"][0] == pytest.approx(-0.13333, abs=1e-4) and w["early_groups"] == 1
    assert w["groups"] == [(4, 2), (6, 2)] and rows["same"]["d_groups"] is None
    line = next(x for x in paired.table([w, rows["same"]], "grpo", 0.5).splitlines() if x.startswith("| wide | 2 | 5"))
    assert "| 5 / 2 | -0.133 [" in line and line.endswith("| 1 |")
