"""data.py: every published layout normalised, unusable rows reported with file and line, and the grader agreeing
with each benchmark's own reference answers."""
import json
import os

import pytest

import data

# rows per file, as published (../shared/data/README.md); every one of them must load
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
    assert "no answer" in skipped[0] and "not JSON" in skipped[1] and "not a JSON object" in skipped[2]


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
