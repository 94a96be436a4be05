"""data.py: every published layout normalised, unusable rows reported with file and line, and the grader agreeing
with each benchmark's own reference answers."""
import codecs
import collections
import json
import os

import pytest

import data
from toyworld import tiny

# rows per file, as published (the benchmark files' own README); every one of them must load
EXPECTED = {("gsm8k", "train"): 7473, ("gsm8k", "test"): 1319, ("math500", "test"): 500, ("aime24", "test"): 30,
            ("aime25", "test"): 30, ("amc23", "test"): 40, ("minerva", "test"): 272, ("olympiadbench", "test"): 675}
needs_data = pytest.mark.skipif(not os.path.isdir(data.DATA_DIR),
                                reason=f"no benchmark files in {data.DATA_DIR} (set MATH_DATA_DIR)")


@pytest.mark.parametrize("row,expected", [
    ({"question": "Q", "answer": "She pays 2 * 540 = 1080.\n#### 1,080"}, ("Q", "1080")),  # GSM8K
    ({"problem": "Q", "answer": "\\frac{14}{3}", "solution": "... \\boxed{\\frac{14}{3}}"}, ("Q", "\\frac{14}{3}")),
    ({"problem": "Q", "question": "Q", "answer": "025"}, ("Q", "025")),  # AIME: a string with a leading zero
    ({"problem": "Q", "answer": 27.0}, ("Q", "27")),  # AMC23: a float
    ({"problem": "Q", "answer": 0.5}, ("Q", "0.5")),
    ({"problem": "Q", "solution": "so $v = \\boxed{1.6}$ m/s"}, ("Q", "1.6")),  # Minerva: the solution's last box
    ({"question": "Q", "final_answer": ["$69$,$84$"]}, ("Q", "69,84")),  # OlympiadBench: a list, $ removed
    ({"question": "Q", "final_answer": ["$(1,8,19), (2,7,13)$"]}, ("Q", "(1,8,19), (2,7,13)")),
    ({"question": "Q", "final_answer": ["$x=1$", "$y=2$"]}, ("Q", "x=1, y=2")),
])
def test_normalise_published_layouts(row, expected):
    assert data.normalise(row) == expected


@pytest.mark.parametrize("row,why", [
    ({"question": "Q"}, "no answer"),
    ({"question": "Q", "answer": ""}, "no answer"),
    ({"question": "Q", "final_answer": []}, "no answer"),
    ({"problem": "Q", "solution": "no box here"}, "no answer"),
    ({"answer": "4"}, "no question"),
    ({"question": "  ", "answer": "4"}, "no question"),
])
def test_unusable_rows_say_why(row, why):
    assert data.normalise(row).startswith(why)


def test_bad_rows_are_reported_with_file_and_line_and_the_rest_load(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join([json.dumps({"question": "1+1?", "answer": "#### 2"}),
                               json.dumps({"question": "no answer here"}),
                               "{not json",
                               "",  # a blank line is not a row
                               json.dumps(["a", "list"]),
                               json.dumps({"problem": "2+2?", "answer": 4.0})]) + "\n")
    problems, skipped = data.load(str(path))
    assert [(p["question"], p["answer"]) for p in problems] == [("1+1?", "2"), ("2+2?", "4")]
    assert problems[1]["where"] == f"{path}:6"
    assert [s.split(": ", 1)[0] for s in skipped] == [f"{path}:2", f"{path}:3", f"{path}:5"]
    assert "no answer" in skipped[0] and "broken JSON" in skipped[1] and "not a JSON object" in skipped[2]


def test_unknown_dataset_names_the_choices():
    with pytest.raises(SystemExit, match="gsm8k_typo: unknown .*math500"):
        data.load("gsm8k_typo")
    with pytest.raises(SystemExit, match="missing.jsonl: not found"):
        data.load("missing.jsonl")
    with pytest.raises(SystemExit, match="no train split"):
        data.load("math500", split="train")


@needs_data
@pytest.mark.parametrize("name,split", sorted(EXPECTED))
def test_every_row_of_every_file_loads(name, split):
    problems, skipped = data.load(name, split)
    assert (len(problems), skipped) == (EXPECTED[name, split], [])
    assert all(p["question"] and p["answer"] for p in problems)
    assert data.load(name, split, limit=7)[0] == problems[:7]


@needs_data
@pytest.mark.parametrize("name", list(data.BENCHMARKS))
def test_grader_marks_the_references_correct(name):
    # MATH500: the last box of `solution` against `answer`; GSM8K: the number after "#### " in a box; the others
    # their gold in a box in a sentence. At least 99 % must be marked correct (all are, on these files).
    n, ok, bad = data.check_references(name)
    assert n == EXPECTED[name, "test"]
    assert ok / n >= 0.99, bad[:10]


def test_prompt_uses_the_chat_template_when_there_is_one():
    class Plain:
        chat_template = None

    class Chat:
        chat_template = "x"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            assert not tokenize and add_generation_prompt
            return "|".join(f"{m['role']}:{m['content']}" for m in messages)

    assert data.build_prompt(Plain(), "What is 1+1?") == "What is 1+1?\n" + data.INSTRUCTION + "\n"
    assert data.build_prompt(Chat(), "What is 1+1?") == f"system:{data.INSTRUCTION}|user:What is 1+1?"


# ---- a loader that loses nothing (issue 15, point 5): each case below failed before ------------------------------

def _row(q="1+1?", a="#### 2"):
    return json.dumps({"question": q, "answer": a}).encode()


def test_a_bad_byte_costs_its_line_only_and_the_line_is_named(tmp_path):
    # before: UnicodeDecodeError at a buffer offset, no line named, no row loaded
    path = tmp_path / "bad_byte.jsonl"
    path.write_bytes(b"\n".join([_row(), b'{"question": "caf\xe9?", "answer": "#### 3"}', _row("2+2?", "#### 4")])
                     + b"\n")
    notes = collections.Counter()
    problems, skipped = data.load(str(path), notes=notes)
    assert [p["answer"] for p in problems] == ["2", "4"]
    assert len(skipped) == 1 and skipped[0].startswith(f"{path}:2: undecodable bytes") and "\\xe9" in skipped[0]


def test_read_jsonl_broken_json_blank_lines_non_objects_and_bom(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(codecs.BOM_UTF8 + b"\n".join([_row(), b"", b"   ", b'{"question": "x", ', b"[1, 2]", b"7",
                                                   b"null", _row("3+3?", "#### 6")]) + b"\n")
    notes = collections.Counter()
    rows, problems = data.read_jsonl(str(path), notes)
    # before: the BOM made line 1 "not JSON (Unexpected UTF-8 BOM)" and the row was lost
    assert [(w, r["question"]) for w, r in rows] == [(f"{path}:1", "1+1?"), (f"{path}:8", "3+3?")]
    assert problems == [f"{path}:4: broken JSON (Expecting property name enclosed in double quotes, column 19)",
                        f"{path}:5: not a JSON object (an array)", f"{path}:6: not a JSON object (a number)",
                        f"{path}:7: not a JSON object (null)"]
    assert notes == {data.BLANK_LINES: 2, data.BOM_REMOVED: 1}  # blank lines counted, the final newline is not one


def test_rows_that_break_the_json_reader_or_a_float_cost_their_line_only(tmp_path):
    # before: RecursionError, OverflowError (int -> float) and ValueError (int -> str) each stopped the whole file,
    # and NaN / Infinity / 1e400 became the gold answers "nan" / "inf"
    path = tmp_path / "hostile.jsonl"
    rows = [_row(), b'{"question": "deep?", "answer": "1", "x": ' + b"[" * 100000 + b"]" * 100000 + b"}",
            b'{"question": "big?", "answer": ' + b"9" * 400 + b"}", b'{"question": "huge?", "answer": ' + b"9" * 5000
            + b"}", b'{"question": "nan?", "answer": NaN}', b'{"question": "inf?", "answer": -Infinity}',
            b'{"question": "1e400?", "answer": 1e400}', b'{"question": "list?", "final_answer": [1, NaN]}',
            b'{"question": "1e300?", "answer": 1e300}', b'{"question": "number?", "final_answer": 5}',
            _row("4+4?", "8")]
    path.write_bytes(b"\n".join(rows) + b"\n")
    problems, skipped = data.load(str(path))
    assert [(p["where"].rsplit(":", 1)[1], p["answer"]) for p in problems] == [
        ("1", "2"), ("3", "9" * 400), ("9", "1e+300"), ("10", "5"), ("11", "8")]  # 1e300 is no 301-digit integer
    assert skipped == [f"{path}:2: broken JSON (nested too deeply to read)",
                       f"{path}:4: broken JSON (Exceeds the limit (4300 digits) for integer string conversion)",
                       *(f"{path}:{i}: {data.NOT_FINITE}" for i in (5, 6, 7, 8))]


def test_a_run_with_no_usable_held_out_problem_stops_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "INSTRUCTION", "")  # the tiny tokenizer cannot write the papers' instruction
    path = tmp_path / "words.jsonl"
    path.write_text('{"question": "What is two plus two?", "answer": "four"}\n{"question": "no answer"}\n')
    with pytest.raises(SystemExit) as e:  # before: every evaluation of the run was of 0 problems, "accuracy 0.000"
        data.run_problems("tiny", str(path), tiny.build_tokenizer())
    assert str(e.value.code) == f"--eval-dataset {path}: no usable problem"


def test_a_run_trains_on_no_held_out_problem(tmp_path, monkeypatch, capsys):
    # math500 has one split: as --dataset it was also the held-out set, and the run trained on its own test
    monkeypatch.setattr(data, "INSTRUCTION", "")  # the tiny tokenizer cannot write the papers' instruction
    path = tmp_path / "sums.jsonl"
    path.write_text("".join(json.dumps({"question": f"{a}+1=?", "answer": str(a + 1)}) + "\n" for a in range(5)))
    problems = data.run_problems(str(path), str(path), tiny.build_tokenizer(), eval_limit=2)
    assert [p["question"] for p in problems.pool] == ["2+1=?", "3+1=?", "4+1=?"]  # rows 3-5: rows 1 and 2 held out
    assert f"--dataset {path}: 2 problems left out of training, held out by --eval-dataset {path}" in \
        capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        data.run_problems(str(path), str(path), tiny.build_tokenizer(), eval_limit=5)
    assert str(e.value.code) == f"--dataset {path}: no usable problem: every one is held out by --eval-dataset {path}"


def test_a_training_prompt_longer_than_the_context_leaves_is_skipped_and_reported(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(data, "INSTRUCTION", "")  # the tiny tokenizer cannot write the papers' instruction
    path = tmp_path / "sums.jsonl"
    path.write_text("".join(json.dumps({"question": q, "answer": "2"}) + "\n" for q in ("1+1=?", "1+" * 20 + "0=?")))
    # the tiny tokenizer: a token a character; "1+1=?\n\n" is 7, the second 45 (43 + 2 newlines)
    problems = data.run_problems(str(path), "tiny", tiny.build_tokenizer(), eval_limit=2, room=10)
    assert [p["question"] for p in problems.pool] == ["1+1=?"]
    assert f"{path}:2: a prompt of 45 tokens, more than the 10 the model's context leaves" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        data.run_problems(str(path), "tiny", tiny.build_tokenizer(), eval_limit=2, room=6)
    assert str(e.value.code).startswith(f"--dataset {path}: no usable problem: {path}:1: a prompt of 7 tokens")


def test_prompts_and_cues_the_tokenizer_cannot_write_are_one_line(tmp_path):
    path = tmp_path / "sums.jsonl"
    path.write_text(json.dumps({"question": "1+1=?", "answer": "2"}) + "\n")
    with pytest.raises(SystemExit) as e:  # before: 'Please reason step by step' lost its letters
        data.run_problems("tiny", str(path), tiny.build_tokenizer())
    # the instruction's characters outside tiny.ALPHABET, in order of first appearance
    lost = "".join(dict.fromkeys(c for c in data.INSTRUCTION if c not in tiny.ALPHABET and not c.isspace()))
    assert lost == "Plasrntpy,ufiwh."
    assert str(e.value.code).startswith(f"--eval-dataset {path}: the tokenizer cannot encode {lost!r} of ")
    with pytest.raises(SystemExit) as e:
        data.check_encodable(tiny.build_tokenizer(), "Hello world", "--oar-cue")
    assert "".join(c for c in "Hlwr" if c in tiny.ALPHABET) == "" and set("eod ") <= set(tiny.ALPHABET + " ")
    assert str(e.value.code) == "--oar-cue: the tokenizer cannot encode 'Hlwr' of 'Hello world' (the tiny model " \
                                "writes its own tasks only: give --model a real model)"
    data.check_encodable(tiny.build_tokenizer(), "\\boxed{", "--oar-cue")  # the tiny world's own cue


def test_parse_line_says_why():
    assert data.parse_line(_row()) == ({"question": "1+1?", "answer": "#### 2"}, None)
    assert data.parse_line(b'{"a": "\xff"}')[1].startswith("undecodable bytes (byte 8 of the line")
    assert data.parse_line(b"{not json")[1].startswith("broken JSON")
    assert data.parse_line(b'"a string"')[1] == "not a JSON object (a string)"


@pytest.mark.parametrize("row,note", [
    ({"problem": "Q", "answer": None, "solution": "so \\boxed{5}"}, data.FILLED_FROM_BOX),  # null answer
    ({"problem": "Q", "solution": "so \\boxed{5}"}, data.FILLED_FROM_BOX),  # no answer field (Minerva)
    ({"problem": "", "question": "Q", "answer": "5"}, data.QUESTION_FROM_QUESTION),
    ({"question": "Q", "final_answer": None, "answer": "5"}, data.ANSWER_FROM_ANSWER),
])
def test_every_fallback_is_counted(row, note):
    notes = collections.Counter()
    assert data.normalise(row, notes) == ("Q", "5")
    assert notes == {note: 1}
    # an ordinary row takes no fallback
    assert data.normalise({"problem": "Q", "answer": "5", "solution": "\\boxed{5}"}, notes) == ("Q", "5")
    assert notes == {note: 1}


def test_a_row_with_no_usable_answer_is_skipped_with_its_line(tmp_path):
    path = tmp_path / "null.jsonl"
    path.write_text(json.dumps({"problem": "Q", "answer": None, "solution": "no box"}) + "\n"
                    + json.dumps({"problem": "Q", "answer": None, "solution": "\\boxed{7}"}) + "\n")
    notes = collections.Counter()
    problems, skipped = data.load(str(path), notes=notes)
    assert [p["answer"] for p in problems] == ["7"] and notes == {data.FILLED_FROM_BOX: 1}  # the skipped row: no note
    assert skipped == [f"{path}:1: no answer (fields `answer`, `final_answer`, or a \\boxed{{}} in `solution`)"]


def test_report_prints_one_summary_line_and_the_first_reasons(capsys):
    skipped = [f"f.jsonl:{i}: undecodable bytes (...)" for i in range(1, 8)] + ["f.jsonl:9: broken JSON (x)"]
    line = data.report("--dataset gsm8k", [{}] * 7471, skipped, collections.Counter({data.FILLED_FROM_BOX: 3}))
    assert line == ("--dataset gsm8k: loaded 7471 rows, skipped 8 (7 undecodable, 1 broken JSON); "
                    "filled answer from the solution's last box in 3 rows")
    err = capsys.readouterr().err.splitlines()
    assert err[0] == line and err[1:6] == [f"  f.jsonl:{i}: undecodable bytes (...)" for i in range(1, 6)]
    assert err[6].startswith("  ... and 3 more") and len(err) == 7
    assert data.report("tiny", [{}], []) == "tiny: loaded 1 rows, skipped 0"


def test_locate_names_the_flag_and_the_path_in_one_line(tmp_path, monkeypatch):
    # before: train.py --dry-run accepted it; a real run failed only after loading the model
    with pytest.raises(SystemExit) as e:
        data.locate(str(tmp_path / "nope.jsonl"), "train", str(tmp_path), "--dataset")
    assert str(e.value) == f"--dataset {tmp_path}/nope.jsonl: not found (no file {tmp_path}/nope.jsonl)"
    unknown = r"^--eval-dataset gsm8k_typo: unknown \(known: tiny, chain, arith, gsm8k.*\)$"
    with pytest.raises(SystemExit, match=unknown):
        data.locate("gsm8k_typo", "test", str(tmp_path), "--eval-dataset")
    with pytest.raises(SystemExit, match="^--dataset math500: no train split"):
        data.locate("math500", "train", str(tmp_path), "--dataset")
    (tmp_path / "mine.json").write_text("{}")
    with pytest.raises(SystemExit, match="must be a .jsonl file"):
        data.locate(str(tmp_path / "mine.json"), "train", str(tmp_path))
    # a benchmark: its file in data_dir, else its hub name, unless the hub is switched off
    (tmp_path / "gsm8k").mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_bytes(_row() + b"\n")
    assert data.locate("gsm8k", "test", str(tmp_path)) == str(tmp_path / "gsm8k" / "test.jsonl")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    assert data.locate("gsm8k", "train", str(tmp_path)) == "openai/gsm8k:main"
    assert data.locate("owner/set:cfg", "train", str(tmp_path)) == "owner/set:cfg"
    assert data.locate("tiny", "test", str(tmp_path)) == "tiny"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SystemExit, match=f"^--eval-dataset gsm8k: not found .no file {tmp_path}/gsm8k/train.jsonl"):
        data.locate("gsm8k", "train", str(tmp_path), "--eval-dataset")


def test_characters_the_tiny_tokenizer_cannot_encode_are_reported_not_dropped():
    # before: the tiny tokenizer silently dropped "é", so "Q:1+é2=?" was trained on as "Q:1+2=?"
    tok = tiny.build_tokenizer()
    texts = ["Q:1+2=?", "Q:1+é2=?", "Q:y+z=?", "e\u0301"]  # the last: e + combining accent, NFC "é"
    assert data.encoding_loss(texts, tiny.ALPHABET) == ["", "é", "yz", "é"]
    assert data.encoding_loss(texts, tok) == ["", "é", "yz", "é"]
    problems = [{"question": "Q:1+2=?", "answer": "3", "where": "f:1"},
                {"question": "Q:1+é2=?", "answer": "3", "where": "f:2"},
                {"question": "Q:1+2=?", "answer": "three", "prompt": "Q:1+2=?\nA:", "where": "f:3"}]
    kept, skipped = data.drop_unencodable(problems, tok)
    assert kept == problems[:1]
    assert skipped == ["f:2: characters the tokenizer cannot encode: '\\\\xe9' in the question",
                       "f:3: characters the tokenizer cannot encode: 'thr' in the answer"]
    assert "2 unencodable" in data.report("--dataset x", kept, skipped)


def test_check_runs_to_the_end_on_bad_files(tmp_path, capsys):
    # before: data.py --check died on a bad byte (UnicodeDecodeError) and on a broken JSON line (normalise(str))
    for name in ("gsm8k", "amc23"):
        (tmp_path / name).mkdir()
    (tmp_path / "gsm8k" / "test.jsonl").write_bytes(b"\n".join([
        json.dumps({"question": "Q", "answer": "so 5\n#### 5"}).encode(), b"", b'{"question": "\xe9"}', b"{broken",
        b""]))
    (tmp_path / "amc23" / "test.jsonl").write_bytes(json.dumps({"problem": "Q", "answer": 27.0}).encode() + b"\n")
    data.main(["--check", "--data-dir", str(tmp_path)])
    out = capsys.readouterr().out
    gsm8k = tmp_path / "gsm8k" / "test.jsonl"
    assert "gsm8k test: loaded 1 rows, skipped 2 (1 undecodable, 1 broken JSON); 1 blank lines skipped" in out
    assert f"{gsm8k}:3: undecodable bytes" in out and f"{gsm8k}:4: broken JSON" in out
    assert out.count("references graded correct 1/1") == 2  # gsm8k's good row, then amc23
    assert f"math500 test: no file {tmp_path}/math500/test.jsonl" in out  # missing files: said, then passed over


def test_a_check_of_nothing_exits_nonzero(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        data.main(["--check", "--data-dir", str(tmp_path / "nothing")])
    assert e.value.code == f"data.py: nothing checked: no benchmark file in --data-dir {tmp_path / 'nothing'}"


@pytest.mark.parametrize("name, named", [("bogusname", "dataset bogusname: unknown (known: tiny"),
                                         ("TMP/gone.jsonl", "dataset TMP/gone.jsonl: not found")])
def test_a_named_set_that_is_no_set_or_no_file_is_one_line_before_any_is_read(tmp_path, capsys, name, named):
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"question": "Q", "answer": "5"}) + "\n")
    with pytest.raises(SystemExit) as e:
        data.main([str(good), name.replace("TMP", str(tmp_path))])
    said = capsys.readouterr()
    assert e.value.code == 2 and named.replace("TMP", str(tmp_path)) in said.err.splitlines()[-1]
    assert "loaded" not in said.out


def test_a_named_benchmark_missing_or_a_file_with_no_usable_problem_exits_nonzero(tmp_path, capsys, monkeypatch):
    for offline in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):  # online, math500 missing here is not refused up front
        monkeypatch.delenv(offline, raising=False)
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text(json.dumps({"question": "Q", "answer": "5"}) + "\n")
    bad.write_text(json.dumps({"question": "Q"}) + "\n")
    with pytest.raises(SystemExit) as e:
        data.main([str(good), "math500", str(bad), "--data-dir", str(tmp_path)])
    assert e.value.code == f"data.py: 2 of 3 failed: math500 test, {bad}: no usable problem (said above)"
    assert f"{good}: loaded 1 rows" in capsys.readouterr().out


def test_a_lone_surrogate_is_one_bad_row_in_every_loader(tmp_path, monkeypatch, capsys):
    # JSON's "\ud800" escape reads as a lone surrogate, which every tokenizer refused with a traceback: one bad row,
    # reported with its line and skipped, wherever a row is read (a run's data, a benchmark, answers given in turn)
    monkeypatch.setattr(data, "INSTRUCTION", "")  # the tiny tokenizer cannot write the papers' instruction
    path = tmp_path / "sums.jsonl"
    path.write_text('{"question": "1+1=?", "answer": "2"}\n{"question": "1+\\ud800=?", "answer": "2"}\n'
                    '{"question": "2+2=?", "answer": "\\udfff4"}\n{"question": "3+3=?", "answer": "6"}\n')
    problems, skipped = data.load(str(path), "test")
    assert [p["question"] for p in problems] == ["1+1=?", "3+3=?"]
    assert skipped == [f"{path}:2: text that is not valid Unicode (a lone surrogate, '\\ud800', at character 3) in "
                       f"the question", f"{path}:3: text that is not valid Unicode (a lone surrogate, '\\udfff', at "
                       f"character 1) in the answer"]
    pool = data.run_problems(str(path), "tiny", tiny.build_tokenizer(), eval_limit=2).pool  # train.py's loader
    assert [p["question"] for p in pool] == ["1+1=?", "3+3=?"] and "2 not unicode" in capsys.readouterr().err
