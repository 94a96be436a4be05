"""compare.py: two methods, one seed, a few steps: plots, table and heat maps written, the table's numbers equal
the metrics files', and a finished comparison is reused rather than rerun."""
import json
import os
import shutil
import statistics

import pytest

from infra import cpu
from tools import compare
from conftest import THREADS


def test_compare_two_methods_writes_plots_and_a_table_from_the_metrics(base, tmp_path, capsys):
    out = str(tmp_path / "cmp")
    args = ["--methods", "grpo,ktae", "--seeds", "0", "--steps", "3", "--eval-every", "3", "--out", out,
            "--threads", str(THREADS), "--", "--prompts-per-step", "4", "--group-size", "4", "--eval-limit", "16"]
    compare.main(args)
    for name in compare.PLOTS:
        assert os.path.getsize(os.path.join(out, name)) > 1000  # a PNG was drawn
    assert os.path.exists(os.path.join(out, "heatmaps", "ktae.html"))
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in open(os.path.join(out, "results.md")) if line.startswith("| grpo") or line.startswith("| ktae")}
    for method in ("grpo", "ktae"):
        recs = [json.loads(line) for line in open(os.path.join(out, f"{method}-seed0", "metrics.jsonl"))]
        evals = [r for r in recs if "eval_accuracy" in r]
        assert [e["step"] for e in evals] == [0, 3]
        seeds, before, after, length, ess, trained, reshaped, minutes, rank, hit1, hit3, auc = rows[method]
        # the groups that mix right and wrong, each step's count averaged; tokens moved off A_i: none for GRPO
        assert float(trained) == round(statistics.mean(r["groups_trained"] for r in recs if "groups_trained" in r), 1)
        assert (float(reshaped) == 0) == (method == "grpo") and 0 <= float(reshaped) <= 1
        assert seeds == "1" and float(before) == round(evals[0]["eval_accuracy"], 3)
        assert after == f"{evals[-1]['eval_accuracy']:.3f} +- 0.000"
        assert length == f"{evals[-1]['eval_response_len']:.3f} +- 0.000"
        # a step where every group agreed has no advantage and logs ess_ratio null, which the table leaves out
        assert float(ess) == round(statistics.mean(r["ess_ratio"] for r in recs if r.get("ess_ratio") is not None), 3)
        times = [r["time_step"] for r in recs if "time_step" in r]
        # 3 steps at the run's median step; "(shared)" where other work took the machine meanwhile (a test beside)
        assert float(minutes.removesuffix(" (shared)")) == round(3 * statistics.median(times) / 60, 1)
        for cell, key in zip((rank, hit1, hit3, auc), compare.CREDIT):  # one seed: the mean over its steps, std 0
            assert cell == f"{statistics.mean(r[key] for r in recs if key in r):.3f} +- 0.000"
        assert method != "grpo" or auc == "0.500 +- 0.000"  # GRPO blames every token alike
    capsys.readouterr()
    compare.main(args)  # everything finished: reused, nothing rerun
    assert "running" not in capsys.readouterr().out


def test_minutes_in_steps_are_not_charged_for_a_paused_step():
    """A run paused (kill -STOP) or sharing the CPU in one step: its four steps of 60, 60, 60 and 3600 s are 4 x the
    median 60 s = 4.0 minutes, not the sum's 63.0 (the tiny comparison read 8.3 and 11.7 minutes for runs of 1.3-1.8)."""
    recs = [{"step": 0, "eval_accuracy": 0.5, "eval_response_len": 10.0}]
    recs += [{"step": s, "ess_ratio": 1.0, "time_step": t} for s, t in zip((1, 2, 3, 4), (60.0, 60.0, 60.0, 3600.0))]
    recs += [{"step": 4, "eval_accuracy": 0.6, "eval_response_len": 10.0}]
    row = compare.table({"grpo": [recs]}).splitlines()[2].split("|")
    assert row[9].strip() == "4.0"
    # a run with no step timed (its metrics from before time_step) is left out of the mean, not counted as 0 minutes:
    # (4.0 + nothing) / 1 = 4.0; with only such runs the column says n/a
    untimed = [{k: v for k, v in r.items() if k != "time_step"} for r in recs]
    assert compare.table({"grpo": [recs, untimed]}).splitlines()[2].split("|")[9].strip() == "4.0"
    assert compare.table({"grpo": [untimed]}).splitlines()[2].split("|")[9].strip() == "n/a"


def test_a_run_stopped_before_its_first_checkpoint_starts_over(base, tmp_path, capsys):
    # train.py refuses a directory that holds a run unless --resume or --overwrite: with no checkpoint to resume,
    # compare.py must start over (--overwrite) rather than fail
    out = tmp_path / "cmp"
    (out / "grpo-seed0").mkdir(parents=True)
    (out / "grpo-seed0" / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval_accuracy": 0.0}) + "\n")
    compare.main(["--methods", "grpo", "--seeds", "0", "--steps", "2", "--out", str(out), "--threads", "1",
                  "--", "--prompts-per-step", "2", "--group-size", "2", "--eval-limit", "8"])
    assert "restarting (no checkpoint to resume)" in capsys.readouterr().out
    recs = [json.loads(line) for line in open(out / "grpo-seed0" / "metrics.jsonl")]
    assert [r["step"] for r in recs if "reward_mean" in r] == [1, 2]  # the leftover line is gone


def test_flags_compare_sets_itself_are_refused_after_the_separator(tmp_path, capsys):
    with pytest.raises(SystemExit):
        compare.main(["--out", str(tmp_path), "--", "--run-dir", "elsewhere"])
    assert "--run-dir after --" in capsys.readouterr().err


@pytest.mark.parametrize("flags, named", [
    (["--methods", "grpo,grpo"], "--methods grpo,grpo: grpo given twice"),
    (["--methods", "ktae,grpo+ktae"], "--methods ktae,grpo+ktae: grpo+ktae is ktae again"),
    (["--seeds", "0,0"], "--seeds 0,0: 0 given twice"), (["--seeds", "a,b"], "--seeds 'a,b': 'a' is not a whole"),
    (["--seeds", ""], "--seeds '': '' is not a whole number"), (["--seeds", "0,-1"], "--seeds -1: must be at least 0"),
    (["--steps", "0"], "--steps 0: must be at least 1"), (["--eval-every", "0"], "--eval-every 0: must be at least 1"),
    (["--threads", "0"], "--threads 0: must be at least 1"),
    (["--", "--lr", "0"], "train.py refuses the flags of grpo seed 0: --lr 0.0: must be greater than 0"),
    (["--", "--bogus"], "train.py refuses the flags of grpo seed 0: unrecognized arguments: --bogus"),
    # variants: a bracket left open, a flag compare.py sets, a flag train.py lacks, a flag of another rule, a flag also
    # after --, flags that change nothing, one run under two spellings, a base that does not exist
    (["--methods", "ktae[ktae-alpha=0"], "ktae[ktae-alpha=0: a variant is METHOD[flag=value,...]"),
    (["--methods", "ktae[seed=3]"], "ktae[seed=3]: --seed is set by compare.py for every run"),
    (["--methods", "ktae[ktae-no-tf=1]"], "ktae[ktae-no-tf=1]: ktae-no-tf is a switch: give it without =value"),
    (["--methods", "ktae[bogus=1]"], "refuses the flags of ktae[bogus=1] seed 0: unrecognized arguments: --bogus 1"),
    (["--methods", "grpo[ktae-alpha=0]"], "--ktae-alpha 0.0: a flag of ktae, which --method grpo does not use"),
    (["--methods", "ktae[ktae-alpha=0]", "--", "--ktae-alpha", "0.5"], "--ktae-alpha is also given after --"),
    (["--methods", "ktae,ktae[ktae-alpha=1.0]"], "ktae[ktae-alpha=1.0] makes the same runs as ktae"),
    (["--methods", "ktae[ktae-alpha=0],grpo+ktae[ktae-alpha=0]"],
     "grpo+ktae[ktae-alpha=0] is ktae[ktae-alpha=0] again"),
    (["--methods", "nope[x=1]"], "--methods: unknown method 'nope'"),
    (["--rules-file", "missing_rules.py"], "missing_rules.py: no such file"),
])
def test_bad_flags_are_one_line_before_any_run(tmp_path, monkeypatch, capsys, flags, named):
    monkeypatch.setattr(compare.subprocess, "run", lambda *a, **k: pytest.fail("a run was started"))
    out = tmp_path / "cmp"
    with pytest.raises(SystemExit) as e:
        compare.main(["--methods", "grpo", "--seeds", "0,1", "--out", str(out), *flags])
    err = capsys.readouterr().err
    assert e.value.code == 2 and named in err.splitlines()[-1] and "Traceback" not in err
    assert not out.exists()


def fake_train(tmp_path, monkeypatch, rc: int = 0):
    """train.py replaced by a script that exits with rc at once, writing its flags to tmp_path/argv."""
    script = tmp_path / "fake_train.py"
    script.write_text(f"import sys\nopen({str(tmp_path / 'argv')!r}, 'w').write(' '.join(sys.argv))\nsys.exit({rc})\n")
    monkeypatch.setattr(compare, "TRAIN", str(script))


def finished_run(run_dir, steps: int = 2):
    """A run directory as a finished train.py run leaves it: a checkpoint and the metrics of each step."""
    (run_dir / "checkpoint").mkdir(parents=True)
    recs = [{"step": 0, "eval_accuracy": 0.25, "eval_response_len": 30.0}]
    recs += [{"step": s, "reward_mean": 0.5, "response_len": 30.0, "entropy": 1.0, "ess_ratio": 0.9, "time_step": 1.0}
             for s in range(1, steps + 1)]
    recs += [{"step": steps, "eval_accuracy": 0.5, "eval_response_len": 28.0}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_a_failed_run_is_one_line_naming_it(tmp_path, monkeypatch):
    fake_train(tmp_path, monkeypatch, rc=3)
    with pytest.raises(SystemExit) as e:
        compare.main(["--methods", "grpo", "--seeds", "0", "--steps", "2", "--out", str(tmp_path / "cmp")])
    assert str(e.value.code).startswith("grpo seed 0: train.py exited with status 3")
    assert not (tmp_path / "cmp" / "grpo-seed0" / "done.json").exists()


def test_with_jobs_a_failed_run_does_not_stop_the_others_and_every_failure_is_named(tmp_path, monkeypatch, capsys):
    # a script that fails for seed 1 only: seed 0 of both methods finishes (done.json), both seed 1 runs are named
    script = tmp_path / "fake_train.py"
    script.write_text("import sys\nsys.exit(3 if sys.argv[sys.argv.index('--seed') + 1] == '1' else 0)\n")
    monkeypatch.setattr(compare, "TRAIN", str(script))
    monkeypatch.setattr(compare.checkpoint, "read_metrics", lambda path: [])
    out = tmp_path / "cmp"
    with pytest.raises(SystemExit) as e:
        compare.main(["--methods", "grpo,ktae", "--seeds", "0,1", "--steps", "2", "--out", str(out), "--jobs", "2"])
    assert str(e.value.code) == "2 runs failed (each named above): grpo seed 1; ktae seed 1"
    assert (out / "grpo-seed0" / "done.json").exists() and (out / "ktae-seed0" / "done.json").exists()
    assert not (out / "grpo-seed1" / "done.json").exists()
    said = capsys.readouterr().out
    assert "ktae seed 1: train.py exited with status 3 (its message is in" in said
    assert (out / "ktae-seed1" / "train.log").exists()  # --jobs 2: each run's output to its own log


def test_a_kill_while_done_json_is_written_leaves_none(tmp_path, monkeypatch):
    fake_train(tmp_path, monkeypatch)
    finished_run(tmp_path / "cmp" / "grpo-seed0")

    real_dump = json.dump

    def killed(obj, f, **kw):  # only done.json's dump (settings.json's goes through): a kill half-way through it
        if not (isinstance(obj, dict) and "seed" in obj):
            return real_dump(obj, f, **kw)
        f.write(json.dumps(obj)[:5])
        raise KeyboardInterrupt
    monkeypatch.setattr(json, "dump", killed)
    with pytest.raises(SystemExit, match="interrupted: "):  # Ctrl-C: one line, not a traceback
        compare.main(["--methods", "grpo", "--seeds", "0", "--steps", "2", "--out", str(tmp_path / "cmp")])
    assert (tmp_path / "argv").exists()  # the run ran: the kill came at its done.json
    assert not (tmp_path / "cmp" / "grpo-seed0" / "done.json").exists()


@pytest.mark.parametrize("keep", [False, True])
def test_a_finished_runs_checkpoint_is_deleted_unless_kept(tmp_path, monkeypatch, keep):
    # done.json holds what the tables need; the checkpoints (3 GB a SmolLM2 run) go, unless --keep-checkpoints
    fake_train(tmp_path, monkeypatch)
    out = tmp_path / "cmp"
    finished_run(out / "grpo-seed0")  # as train.py leaves it: checkpoint/ and the older checkpoint.prev/
    (out / "grpo-seed0" / "checkpoint.prev").mkdir()
    compare.main(["--methods", "grpo", "--seeds", "0", "--steps", "2", "--out", str(out)]
                 + ["--keep-checkpoints"] * keep)
    run = out / "grpo-seed0"
    assert (run / "done.json").exists() and (run / "metrics.jsonl").exists()
    assert (run / "checkpoint").exists() == keep and (run / "checkpoint.prev").exists() == keep


def test_an_unreadable_done_json_reruns_its_run(tmp_path, monkeypatch, capsys):
    fake_train(tmp_path, monkeypatch)
    out = tmp_path / "cmp"
    finished_run(out / "grpo-seed0")
    (out / "grpo-seed0" / "done.json").write_text('{"meth')  # cut short by a kill
    compare.main(["--methods", "grpo", "--seeds", "0", "--steps", "2", "--out", str(out), "--threads", "1"])
    said = capsys.readouterr().out
    assert f"{out / 'grpo-seed0' / 'done.json'}: unreadable" in said and "resuming grpo seed 0" in said
    assert "--resume" in (tmp_path / "argv").read_text()
    assert json.loads((out / "grpo-seed0" / "done.json").read_text())["steps"] == 2


def test_a_partial_last_metrics_line_of_a_reused_run_is_dropped(tmp_path, monkeypatch, capsys):
    fake_train(tmp_path, monkeypatch)
    out = tmp_path / "cmp"
    finished_run(out / "grpo-seed0")
    compare.main(["--methods", "grpo", "--seeds", "0", "--steps", "2", "--out", str(out), "--threads", "1"])
    monkeypatch.setattr(compare.subprocess, "run", lambda *a, **k: pytest.fail("a finished run was run again"))
    with open(out / "grpo-seed0" / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "rew')  # a kill while train.py appended
    compare.main(["--methods", "grpo", "--seeds", "0", "--steps", "2", "--out", str(out), "--threads", "1"])
    assert f"{out / 'grpo-seed0' / 'metrics.jsonl'}:5: not a complete JSON line" in capsys.readouterr().out
    assert "| grpo | 1 | 0.250 | 0.500 +- 0.000 |" in (out / "results.md").read_text()


def test_a_finished_comparison_is_not_reused_under_other_train_flags(tmp_path, monkeypatch, capsys):
    # issue 63: a finished run was reused whatever the train.py flags after -- said, under the new command's header
    fake_train(tmp_path, monkeypatch)
    out = tmp_path / "cmp"
    finished_run(out / "grpo-seed0")
    flags = ["--methods", "grpo", "--seeds", "0", "--steps", "2", "--out", str(out), "--threads", "1"]
    compare.main(flags + ["--", "--lr", "1e-4"])
    monkeypatch.setattr(compare.subprocess, "run", lambda *a, **k: pytest.fail("a run was started"))
    table = (out / "results.md").read_text()
    for other, said in ((["--", "--lr", "3e-4"], "['--lr', '1e-4'], not ['--lr', '3e-4']"),
                        (["--dataset", "chain"], "--dataset tiny, not chain")):
        with pytest.raises(SystemExit) as e:
            compare.main(flags + other)
        assert said in str(e.value.code) and "--overwrite" in str(e.value.code)
        assert (out / "results.md").read_text() == table
    compare.main(flags + ["--", "--lr", "1e-4"])  # the same flags: reused
    compare.main(flags + ["--", "--lr=1e-4"])  # spelled otherwise: the same setting
    with pytest.raises(SystemExit) as e:  # a comparison under way in another process
        held = __import__("infra.outfolder").outfolder.claim(str(out), {}, True, False)
        compare.main(flags + ["--", "--lr", "1e-4"])
    held.close()
    assert "another process is writing there now" in str(e.value.code)
    monkeypatch.undo()
    fake_train(tmp_path, monkeypatch)
    compare.main(flags + ["--overwrite", "--", "--lr", "3e-4"])  # started over: train.py --overwrite
    assert "--overwrite" in (tmp_path / "argv").read_text() and "3e-4" in (tmp_path / "argv").read_text()
    assert json.loads((out / "grpo-seed0" / "done.json").read_text())["flags"][-2:] == ["--lr", "3e-4"]


def test_the_machine_record_tells_apart_two_cpus_of_one_name():
    # two hosts called "Intel(R) Xeon(R) Processor" with torch's AVX512 kernels made other runs of one seed
    # (docs/LOG.md 2026-12-02): a digest of their instruction sets tells such CPUs apart where those differ, and the
    # same host gives the same record
    def cpuinfo(flags):  # two cores, as /proc/cpuinfo lists them
        return "".join(f"processor\t: {i}\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: {flags}\n\n"
                       for i in range(2))
    one = cpu.cpu_record(cpuinfo("fpu avx512f avx512_bf16"), "x86_64", "AVX512")
    assert one.startswith("Intel(R) Xeon(R) Processor (AVX512, flags ")
    assert cpu.cpu_record(cpuinfo("avx512_bf16 fpu avx512f"), "x86_64", "AVX512") == one  # order is not a CPU
    assert cpu.cpu_record(cpuinfo("fpu avx512f avx512_bf16 md_clear"), "x86_64", "AVX512") == one  # the kernel's
    assert cpu.cpu_record(cpuinfo("fpu avx512f avx512_bf16 avx512_fp16"), "x86_64", "AVX512") != one
    arm = "processor\t: 0\nFeatures\t: fp asimd sve\nCPU implementer\t: 0x41\n"  # ARM: Features, no model name
    assert cpu.cpu_record(arm, "aarch64", "SVE256").startswith("aarch64 (SVE256, flags ")
    assert cpu.cpu_record(arm.replace(" sve", ""), "aarch64", "SVE256") != cpu.cpu_record(arm, "aarch64",
                                                                                                   "SVE256")
    assert cpu.cpu_record("", "arm64", "DEFAULT") == "arm64 (DEFAULT)"  # no /proc/cpuinfo (macOS)


def test_a_moved_comparison_is_reused_and_another_machines_folder_refuses_new_runs(tmp_path, monkeypatch, capsys):
    # done.json records the run's flags less --run-dir (a snapshot restored elsewhere is reused); the machine is
    # run.json's, which train.py writes. A run still to make in a folder another machine's runs fill is refused before
    # it starts (its seed would not pair with theirs: tools/paired.py). A folder of a compare.py before 2026-12-07
    # records the machine in done.json and machine.json, and is read so.
    fake_train(tmp_path, monkeypatch)
    out, moved = tmp_path / "cmp", tmp_path / "elsewhere"
    finished_run(out / "grpo-seed0")
    flags = ["--methods", "grpo", "--steps", "2", "--threads", "1"]
    compare.main(flags + ["--seeds", "0", "--out", str(out)])
    done = json.loads((out / "grpo-seed0" / "done.json").read_text())
    assert "--run-dir" not in done["flags"] and "machine" not in done
    assert not (out / "grpo-seed0" / "machine.json").exists()  # compare.py writes no machine record of its own
    shutil.move(str(out), str(moved))
    monkeypatch.setattr(compare.subprocess, "run", lambda *a, **k: pytest.fail("a finished run was run again"))
    compare.main(flags + ["--seeds", "0", "--out", str(moved)])  # reused where it now lies
    old = dict(done, flags=done["flags"] + ["--run-dir", str(out / "grpo-seed0")])  # as compare.py wrote it before
    (moved / "grpo-seed0" / "done.json").write_text(json.dumps(old))
    compare.main(flags + ["--seeds", "0", "--out", str(moved)])  # reused too
    other = "Another CPU (AVX2, flags 01234567)"
    run_json = moved / "grpo-seed0" / "run.json"
    run_json.write_text(json.dumps({"method": "grpo", "machine": other, "args": {}}))  # as train.py writes it
    compare.main(flags + ["--seeds", "0", "--out", str(moved)])  # nothing to run: the tables are remade
    with pytest.raises(SystemExit) as e:
        compare.main(flags + ["--seeds", "0,1", "--out", str(moved)])
    err = capsys.readouterr().err.splitlines()[-1]
    assert e.value.code == 2 and f"made on {other}, this machine is" in err and "another --out" in err
    assert not (moved / "grpo-seed1").exists()
    run_json.unlink()  # an older folder: done.json's "machine"
    (moved / "grpo-seed0" / "done.json").write_text(json.dumps(dict(done, machine=other)))
    with pytest.raises(SystemExit) as e:
        compare.main(flags + ["--seeds", "0,1", "--out", str(moved)])
    assert f"made on {other}, this machine is" in capsys.readouterr().err.splitlines()[-1]
    monkeypatch.setattr(compare.cpu, "machine", lambda: "Intel(R) Xeon(R) Processor (AVX512, flags 01234567)")
    (moved / "grpo-seed0" / "done.json").write_text(json.dumps(dict(done, machine="Intel(R) Xeon(R) Processor "
                                                                    "(AVX512)")))
    with pytest.raises(SystemExit) as e:  # recorded without flags: the same name may be another CPU
        compare.main(flags + ["--seeds", "0,1", "--out", str(moved)])
    assert "recorded before the CPU's flags were" in capsys.readouterr().err.splitlines()[-1]
    # a run begun and stopped at a checkpoint records its machine in run.json from its start: resumed on another
    # machine it would be half of each, so it is refused too (an older folder: machine.json); with --overwrite, or
    # without a checkpoint, it starts over here
    monkeypatch.undo()  # subprocess.run again
    fake_train(tmp_path, monkeypatch)
    run_dir = tmp_path / "cmp2" / "grpo-seed0"
    finished_run(run_dir)
    compare.main(flags + ["--seeds", "0", "--out", str(run_dir.parent), "--overwrite"])  # begun (and finished) here
    (run_dir / "done.json").unlink()
    (run_dir / "checkpoint").mkdir()
    for record in ("run.json", "machine.json"):
        (run_dir / record).write_text(json.dumps({"machine": other, "args": {}}))
        with pytest.raises(SystemExit) as e:
            compare.main(flags + ["--seeds", "0", "--out", str(run_dir.parent)])
        err = capsys.readouterr().err.splitlines()[-1]
        assert e.value.code == 2 and f"grpo-seed0 was begun on {other}, this machine is" in err
        assert not (run_dir / "done.json").exists()
        (run_dir / record).unlink()
    (run_dir / "run.json").write_text(json.dumps({"machine": other, "args": {}}))
    compare.main(flags + ["--seeds", "0", "--out", str(run_dir.parent), "--overwrite"])  # begun again here
    assert "--overwrite" in (tmp_path / "argv").read_text()


def recorded_runs(tmp_path, monkeypatch):
    """subprocess.run of every train.py replaced by a record of its command and a finished run in its --run-dir
    (accuracy 0.25 at step 0, then 0.5; a variant with --ktae-alpha 0: 0.5 + 0.05 * seed). Returns the commands."""
    commands, real = [], compare.subprocess.run

    def fake(cmd, **kwargs):
        if compare.TRAIN not in cmd:  # platform.processor() asks uname
            return real(cmd, **kwargs)
        commands.append(cmd)
        run_dir = cmd[cmd.index("--run-dir") + 1]
        seed = int(cmd[cmd.index("--seed") + 1])
        recs = [{"step": 0, "eval_accuracy": 0.25, "eval_response_len": 30.0},
                {"step": 1, "reward_mean": 0.5, "time_step": 1.0},
                {"step": 1, "eval_accuracy": 0.5 + 0.05 * seed * ("--ktae-alpha" in cmd), "eval_response_len": 28.0}]
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in recs))
        return type("Done", (), {"returncode": 0})()
    monkeypatch.setattr(compare.subprocess, "run", fake)
    return commands


def test_a_variant_runs_beside_its_original_under_its_own_name(tmp_path, monkeypatch):
    commands = recorded_runs(tmp_path, monkeypatch)
    out = tmp_path / "cmp"
    compare.main(["--methods", "ktae,ktae[ktae-alpha=0,ktae-no-tf]", "--seeds", "0,1,2", "--steps", "1", "--out",
                  str(out), "--", "--lr", "1e-4"])
    variant = [c for c in commands if "ktae.ktae-alpha=0.ktae-no-tf-seed1" in " ".join(c)][0]
    # its flags come after the shared ones, and its train.py --method is the method's
    assert variant[variant.index("--method") + 1] == "ktae" and variant[-5:] == ["--lr", "1e-4", "--ktae-alpha", "0",
                                                                                 "--ktae-no-tf"]
    done = json.load(open(out / "ktae.ktae-alpha=0.ktae-no-tf-seed1" / "done.json"))
    assert done["method"] == "ktae[ktae-alpha=0,ktae-no-tf]" and "--ktae-no-tf" in done["flags"]
    # paired against the first method by its name: differences 0, 0.05, 0.10: mean 0.05, sd 0.05, se 0.02887,
    # t(2) 4.303: +- 0.1242; detectable (4.303 + 1.061) * 0.02887 = 0.1549
    row = [x for x in open(out / "paired.md") if x.startswith("| ktae[ktae-alpha=0,ktae-no-tf] | 3 |")][0]
    assert "| +0.050 [-0.074, +0.174] | +-0.155 | not detectable at this size |" in row
    assert "`ktae[ktae-alpha=0,ktae-no-tf]`" not in open(out / "results.md").read()  # a row, not a code name
    assert "| ktae[ktae-alpha=0,ktae-no-tf] | 3 |" in open(out / "results.md").read()


def test_a_rules_file_reaches_every_run_and_its_content_is_recorded(tmp_path, monkeypatch):
    import methods
    from test_methods import readme_blocks
    commands = recorded_runs(tmp_path, monkeypatch)
    rules = tmp_path / "my_rules.py"
    rules.write_text(readme_blocks()[0])
    out = tmp_path / "cmp"
    try:
        compare.main(["--rules-file", str(rules), "--methods", "no-eos,no-eos[eos-share=0.5]", "--seeds", "0",
                      "--steps", "1", "--out", str(out)])
        assert all(c[c.index("--rules-file") + 1] == str(rules) for c in commands) and len(commands) == 2
        recorded = json.load(open(out / "settings.json"))["--rules-file"]
        assert recorded["name"] == str(rules) and len(recorded["sha256"]["my_rules.py"]) == 64
        rules.write_text(readme_blocks()[0].replace("0.0,", "0.25,"))  # edited: another default, other runs
        with pytest.raises(SystemExit, match="--rules-file"):
            compare.main(["--rules-file", str(rules), "--methods", "no-eos", "--seeds", "0", "--steps", "1",
                          "--out", str(out)])
        # --overwrite makes them again, not the old runs reused under the new file's record
        compare.main(["--rules-file", str(rules), "--methods", "no-eos", "--seeds", "0", "--steps", "1", "--out",
                      str(out), "--overwrite"])
        assert len(commands) == 3
        assert json.load(open(out / "no-eos-seed0" / "done.json"))["files"]["--rules-file"] == json.load(
            open(out / "settings.json"))["--rules-file"]
    finally:
        methods.RULES.pop("no-eos", None)
        methods._LOADED.pop(str(rules), None)


def test_a_comparison_without_step_0_or_any_evaluation_says_so(tmp_path, monkeypatch):
    commands = recorded_runs(tmp_path, monkeypatch)
    real = compare.subprocess.run

    def no_step0(cmd, **kwargs):  # --no-final-eval: the runs' first evaluation is not step 0's
        done = real(cmd, **kwargs)
        if compare.TRAIN in cmd:
            path = os.path.join(cmd[cmd.index("--run-dir") + 1], "metrics.jsonl")
            recs = [json.loads(x) for x in open(path)][1:]
            if "--eval-every" in cmd and cmd[cmd.index("--eval-every") + 1] == "5":  # evaluated nowhere
                recs = [r for r in recs if "eval_accuracy" not in r]
            open(path, "w").write("".join(json.dumps(r) + "\n" for r in recs))
        return done
    monkeypatch.setattr(compare.subprocess, "run", no_step0)
    out = tmp_path / "a"
    compare.main(["--methods", "grpo,ktae", "--seeds", "0", "--steps", "1", "--out", str(out), "--", "--no-final-eval"])
    row = [x for x in open(out / "results.md") if x.startswith("| grpo |")][0].split("|")
    assert row[3].strip() == "n/a" and row[4].strip() == "0.500 +- 0.000"  # "before" is no step-1 accuracy
    out = tmp_path / "b"
    compare.main(["--methods", "grpo,ktae", "--seeds", "0", "--steps", "1", "--eval-every", "5", "--out", str(out)])
    assert "| grpo | 1 | n/a | n/a (a run has no evaluation) | n/a | n/a | n/a | n/a | n/a |" in open(
        out / "results.md").read()
    assert len(commands) == 4


def test_a_file_where_a_run_goes_and_ctrl_c_are_one_line(tmp_path, monkeypatch, capsys):
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "ktae-seed1").write_text("notes")
    monkeypatch.setattr(compare.subprocess, "run", lambda *a, **k: pytest.fail("a run was started"))
    with pytest.raises(SystemExit):
        compare.main(["--methods", "grpo,ktae", "--seeds", "0,1", "--out", str(out)])
    assert "ktae-seed1: a file where the run of ktae seed 1 goes" in capsys.readouterr().err
    monkeypatch.setattr(compare, "run_all", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(SystemExit) as e:
        compare.main(["--methods", "grpo", "--seeds", "0", "--out", str(tmp_path / "other")])
    assert str(e.value.code).startswith("interrupted: ") and "the same command picks up" in str(e.value.code)


def test_a_file_named_after_the_separator_is_recorded_by_its_content(tmp_path, monkeypatch):
    recorded_runs(tmp_path, monkeypatch)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("lr: 1.0e-4\n")
    flags = ["--methods", "grpo", "--seeds", "0", "--steps", "1", "--out", str(tmp_path / "cmp"), "--", "--config",
             str(recipe)]
    compare.main(flags)
    assert json.load(open(tmp_path / "cmp" / "settings.json"))["files named after --"][str(recipe)]["sha256"]
    compare.main(flags)  # unchanged: reused
    recipe.write_text("lr: 3.0e-4\n")  # edited between two commands: other runs, refused under the old record
    with pytest.raises(SystemExit, match="files named after --"):
        compare.main(flags)
