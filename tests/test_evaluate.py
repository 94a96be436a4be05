"""evaluate.py: the unbiased pass@k, score() with the project's sampler, and the command end to end."""
import json

import pytest
import torch

import evaluate
from toyworld import tiny


@pytest.mark.parametrize("n,c,k,expected", [
    (5, 2, 1, 0.4),  # 1 - C(3,1)/C(5,1) = 1 - 3/5
    (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (5, 2, 5, 1.0),  # n - c = 3 < 5: every 5-subset holds a correct one
    (5, 2, 4, 1.0),  # n - c = 3 < 4
    (5, 2, 3, 0.9),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
    (5, 0, 1, 0.0),  # c = 0
    (5, 0, 5, 0.0),
    (5, 5, 1, 1.0),  # c = n
    (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
])
def test_pass_at_k_by_hand(n, c, k, expected):
    assert evaluate.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_needs_k_samples():
    with pytest.raises(ValueError, match="at least 6 samples"):
        evaluate.pass_at_k(5, 2, 6)


def test_score_greedy_and_sampled_on_the_tiny_model(base):
    model, tok = base
    qs = tiny.eval_problems()[:24]
    prompts, golds = [tiny.prompt(q) for q in qs], [tiny.answer(q) for q in qs]
    greedy = evaluate.score(model, tok, prompts, golds, max_new_tokens=48, batch_size=10)
    # the answers graded one by one must give the same accuracy, in prompt order despite the length sorting
    by_hand = [tiny.answer(q) == (r.rsplit("\\boxed{", 1)[-1].split("}")[0] if "\\boxed{" in r else None)
               for q, r in zip(qs, greedy["responses"])]
    assert greedy["n"] == 24 and greedy["accuracy"] == pytest.approx(sum(by_hand) / 24)
    assert 0 < greedy["accuracy"] < 1 and greedy["boxed"] > 0.9 and greedy["prompts_cut"] == 0
    sampled = evaluate.score(model, tok, prompts, golds, k=4, temperature=1.0, max_new_tokens=48, batch_size=5)
    assert len(sampled["responses"]) == 96
    assert sampled["accuracy"] <= sampled["pass@4"] <= 1
    with pytest.raises(ValueError, match="greedy"):
        evaluate.score(model, tok, prompts, golds, k=4, temperature=0.0, max_new_tokens=8)


def test_evaluate_command_writes_table_and_json(tmp_path, capsys, base, monkeypatch):
    monkeypatch.setattr(evaluate.data, "INSTRUCTION", "")  # the tiny tokenizer cannot write the papers' instruction
    path = tmp_path / "mine.jsonl"
    path.write_bytes(b"\n".join([json.dumps({"question": "Q:2+3=?", "answer": "#### 5"}).encode(),
                                  json.dumps({"question": "no answer"}).encode(),
                                  b'{"question": "Q:2+\xe9=?", "answer": "#### 5"}',  # not UTF-8
                                  json.dumps({"question": "Q:2+3=?", "answer": "five"}).encode(),  # not encodable
                                  b"{broken"]) + b"\n")
    out = tmp_path / "eval.json"
    evaluate.main(["--benchmarks", f"tiny,{path}", "--limit", "6", "--k", "2", "--temperature", "1.0",
                   "--max-new-tokens", "40", "--out", str(out)])
    printed = capsys.readouterr()
    assert "pass@1" in printed.out and "avg@2" in printed.out and "average" in printed.out
    # every unusable row is reported (stderr) with its file and line, and skipped; before, the bad byte killed the
    # run with a UnicodeDecodeError and "five" was graded as "e" (the tiny tokenizer dropped "f", "i" and "v")
    summary = f"{path}: loaded 1 rows, skipped 4 (1 no answer, 1 undecodable, 1 unencodable, 1 broken JSON)"
    assert summary in printed.err.splitlines()
    for line, why in [(2, "no answer"), (3, "undecodable bytes"), (4, "characters the tokenizer cannot encode"),
                      (5, "broken JSON")]:
        assert f"  {path}:{line}: {why}" in printed.err
    saved = json.load(open(out))
    tiny_row, mine = saved["results"]["tiny"], saved["results"][str(path)]
    assert (tiny_row["n"], mine["n"], mine["rows_skipped"], mine["loaded"]) == (6, 1, 4, summary)
    assert saved["results"]["average"]["pass@1"] == pytest.approx((tiny_row["pass@1"] + mine["pass@1"]) / 2)
    assert saved["settings"]["max_new_tokens"] == 40 and saved["settings"]["k"] == 2


def test_two_evaluations_keep_both_results(tmp_path, monkeypatch, capsys, base):
    # the default file name holds the model, the benchmarks and the settings; an existing file is never replaced
    monkeypatch.chdir(tmp_path)
    common = ["--benchmarks", "tiny", "--threads", "1"]
    evaluate.main([*common, "--limit", "4"])
    evaluate.main([*common, "--limit", "6"])
    evaluate.main([*common, "--limit", "6"])  # the same again: a second file beside the first
    names = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert names == ["eval-tiny-tiny-greedy-t48-limit4.json", "eval-tiny-tiny-greedy-t48-limit6-2.json",
                     "eval-tiny-tiny-greedy-t48-limit6.json"]
    assert [json.load(open(tmp_path / "runs" / n))["results"]["tiny"]["n"] for n in names] == [4, 6, 6]
    printed = capsys.readouterr().out
    assert "note:" not in printed  # the tiny default budget (48) fits the tiny model's context
    with pytest.raises(SystemExit):  # an explicit --out that exists needs --overwrite
        evaluate.main([*common, "--limit", "4", "--out", str(tmp_path / "runs" / names[0])])
    assert "--overwrite" in capsys.readouterr().err


def test_unknown_benchmark_is_a_clear_error(capsys):
    with pytest.raises(SystemExit):
        evaluate.main(["--benchmarks", "math5000"])
    assert "--benchmarks math5000: unknown (known: tiny, chain, arith, gsm8k" in capsys.readouterr().err


def test_a_missing_file_fails_in_one_line_before_the_model_loads(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(evaluate.models, "load_model", lambda *a: pytest.fail("the model was loaded"))
    with pytest.raises(SystemExit):
        evaluate.main(["--benchmarks", f"tiny,{tmp_path}/gone.jsonl"])
    assert f"--benchmarks {tmp_path}/gone.jsonl: not found (no file {tmp_path}/gone.jsonl)" in capsys.readouterr().err


@pytest.mark.parametrize("flags, named", [
    (["--limit", "0"], "--limit 0: must be at least 1"), (["--limit", "-1"], "--limit -1: must be at least 1"),
    (["--batch-size", "0"], "--batch-size 0"), (["--max-new-tokens", "0"], "--max-new-tokens 0"),
    (["--k", "0"], "--k 0: must be at least 1"), (["--k", "2", "--temperature", "0"], "--temperature 0.0: must be"),
    (["--k", "2", "--temperature", "nan"], "--temperature: nan: not a finite number"),
    (["--temperature", "inf"], "--temperature: inf: not a finite number"), (["--seed", "-3"], "--seed -3"),
    (["--benchmarks", ","], "--benchmarks ',': names no benchmark"), (["--device", "bogus"], "--device bogus"),
    (["--benchmarks", "tiny,tiny,chain"], "--benchmarks tiny,tiny,chain: tiny given twice"),
    (["--threads", "0"], "--threads 0"), (["--out", "TMP"], "--out TMP: a folder; name a .json file"),
    (["--out", "TMP/file/eval.json"], "--out TMP/file: TMP/file is a file, not a folder"),
])
def test_bad_flags_are_one_argparse_line_before_the_model_loads(tmp_path, monkeypatch, capsys, flags, named):
    monkeypatch.setattr(evaluate.models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit) as e:
        evaluate.main(["--benchmarks", "tiny", *(f.replace("TMP", str(tmp_path)) for f in flags)])
    assert e.value.code == 2 and named.replace("TMP", str(tmp_path)) in capsys.readouterr().err


def test_weights_that_are_not_finite_are_one_line(base, tmp_path):
    model, tok = base
    broken = type(model)(model.config)
    broken.load_state_dict(model.state_dict())
    with torch.no_grad():
        broken.lm_head.weight[3, 0] = float("inf")  # tied: the embedding's too
    broken.save_pretrained(tmp_path / "inf")
    tok.save_pretrained(tmp_path / "inf")
    with pytest.raises(SystemExit) as e:
        evaluate.main(["--model", str(tmp_path / "inf"), "--benchmarks", "tiny", "--limit", "2", "--out",
                       str(tmp_path / "e.json")])
    assert str(e.value.code) == f"--model {tmp_path}/inf: parameter model.embed_tokens.weight holds NaN or infinite " \
                                f"values"
    assert not (tmp_path / "e.json").exists()


def test_a_benchmark_with_no_usable_problem_fails_before_the_model_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(evaluate.models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "no answer"}\n{broken\n')
    with pytest.raises(SystemExit) as e:
        evaluate.main(["--benchmarks", f"tiny,{path}", "--out", str(tmp_path / "e.json")])
    assert str(e.value.code) == f"--benchmarks {path}: no usable problem: {path}:1: no answer (fields `answer`, " \
                                f"`final_answer`, or a \\boxed{{}} in `solution`) (and 1 more rows skipped)"


def test_a_benchmark_the_tokenizer_cannot_encode_fails_before_the_model_loads(base, tmp_path, monkeypatch):
    monkeypatch.setattr(evaluate.models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    path = tmp_path / "words.jsonl"
    path.write_text('{"question": "What is two plus two?", "answer": "four"}\n')
    with pytest.raises(SystemExit) as e:  # the prompt's instruction: before, its letters were dropped without a word
        evaluate.main(["--benchmarks", f"tiny,{path}", "--out", str(tmp_path / "e.json")])
    assert str(e.value.code).startswith(f"--benchmarks {path}: the tokenizer cannot encode 'Plasrntpy,ufiwh.' of ")
    assert str(e.value.code).endswith("(the tiny model writes its own tasks only: give --model a real model)")
    monkeypatch.setattr(evaluate.data, "INSTRUCTION", "")  # an instruction it can write: the question's letters
    with pytest.raises(SystemExit) as e:
        evaluate.main(["--benchmarks", f"tiny,{path}", "--out", str(tmp_path / "e.json")])
    assert str(e.value.code).startswith(f"--benchmarks {path}: no problem the tokenizer can encode: {path}:1: ")


def test_the_second_opinion_agrees_on_the_tiny_model(base, tmp_path, capsys):
    # tools/check_eval.py answers the same prompts with transformers' generate and grades them with math-verify
    # alone; on the tiny model both paths give the same text and the same verdicts, problem by problem
    from tools import check_eval
    out = tmp_path / "e.json"
    evaluate.main(["--benchmarks", "tiny", "--limit", "12", "--batch-size", "6", "--out", str(out), "--threads", "1"])
    saved = json.load(open(out))["results"]["tiny"]["problems"]
    assert len(saved) == 12 and {"where", "gold", "greedy", "correct", "tokens"} <= saved[0].keys()
    report = check_eval.main([str(out), "--threads", "1"])["tiny"]
    assert report["n"] == 12 and report["same_text"] == 12 and report["agree"] == 12
    assert report["ours_correct"] == report["math_verify_correct"] == sum(p["correct"] for p in saved) > 0
    assert json.load(open(tmp_path / "e.check.json"))["tiny"]["agree"] == 12
    assert "verdicts agree on 12/12" in capsys.readouterr().out
    # a first few problems in other batches: float32 greedy does not depend on its batch's padding here
    report = check_eval.main([str(out), "--threads", "1", "--limit", "5", "--batch-size", "2"])["tiny"]
    assert report["n"] == 5 and report["same_text"] == report["agree"] == 5


def test_the_progress_bar_counts_problems_and_tokens_a_second(base, capsys):
    # a real model's batch decodes for half an hour: the bar says how many problems are done and how fast tokens come
    # (it moved per batch only, and a 64-problem batch showed nothing for half an hour)
    model, tok = base
    qs = tiny.eval_problems()[:6]
    evaluate.score(model, tok, [tiny.prompt(q) for q in qs], [tiny.answer(q) for q in qs], max_new_tokens=8,
                   batch_size=4, desc="tiny greedy")
    err = capsys.readouterr().err
    assert "/6 [" in err and "problem/s" in err and "tokens/s" in err  # problems of 6, their rate, the tokens'
