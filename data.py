"""Datasets and prompts: one loader for the published math sets, whatever their field layout.

    python data.py --check      # grade every benchmark's own reference solution against its gold answer

The sets are published with different fields (../shared/data/README.md), so every row goes through normalise():
  question  <- `problem`, else `question`
  answer    <- `final_answer` (OlympiadBench: a list of LaTeX strings, $...$ removed, joined by ", ")
            <- `answer` (GSM8K: the number after "#### ", thousands commas removed; AMC23: the float 27.0 -> "27")
            <- the last \\boxed{} of `solution` (Minerva has no answer field)
A row that gives no question or no answer is reported with its file and line, and counted; nothing is dropped
silently. Files are read from a local directory (--data-dir); a set that is not there is loaded from the hub by
its usual name (needs internet).
"""
import argparse
import json
import os

import reward
import tiny

# the local copies of the benchmarks: $MATH_DATA_DIR, else ../shared/data beside the project
DATA_DIR = os.environ.get("MATH_DATA_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                                           "shared", "data")
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."

# name -> local file per split (under the data directory), and the usual hub dataset (name, config, split).
# The hub names are the ones the papers' evaluation code uses; this machine cannot reach the hub to check them.
BENCHMARKS = {
    "gsm8k": ({"test": "gsm8k/test.jsonl", "train": "gsm8k/train.jsonl"}, ("openai/gsm8k", "main")),
    "math500": ({"test": "math500/test.jsonl"}, ("HuggingFaceH4/MATH-500", None)),
    "aime24": ({"test": "aime24/test.jsonl"}, ("HuggingFaceH4/aime_2024", None)),
    "aime25": ({"test": "aime25/test.jsonl"}, ("math-ai/aime25", None)),
    "amc23": ({"test": "amc23/test.jsonl"}, ("math-ai/amc23", None)),
    "minerva": ({"test": "minerva_math/test.jsonl"}, ("math-ai/minervamath", None)),
    "olympiadbench": ({"test": "olympiadbench/test.jsonl"}, ("Hothan/OlympiadBench", "OE_TO_maths_en_COMP")),
}


def normalise(row: dict):
    """(question, answer) as strings, or a string saying why the row cannot be used.

    normalise({"question": "2+2?", "answer": "It is 4.\\n#### 4"}) == ("2+2?", "4")
    normalise({"problem": "x?", "answer": 27.0}) == ("x?", "27")
    """
    question = row.get("problem") or row.get("question")
    if not isinstance(question, str) or not question.strip():
        return "no question (fields `problem` or `question`)"
    answer = row.get("final_answer")
    if isinstance(answer, list):  # OlympiadBench: ["$(1,8,19), (2,7,13)$"] or ["$69$,$84$"]
        answer = ", ".join(str(a).replace("$", "").strip() for a in answer if str(a).strip())
    elif answer is None:
        answer = row.get("answer")
        if isinstance(answer, bool):
            answer = None
        elif isinstance(answer, (int, float)):  # AMC23 publishes 27.0
            answer = str(int(answer)) if float(answer).is_integer() else repr(answer)
        elif isinstance(answer, str) and "####" in answer:  # GSM8K: reasoning, then "#### 1,080"
            answer = answer.rsplit("####", 1)[1].strip().replace(",", "")
        elif answer is None and isinstance(row.get("solution"), str):  # Minerva: only inside the solution
            answer = reward.last_boxed(row["solution"])
    if not isinstance(answer, str) or not answer.strip():
        return "no answer (fields `answer`, `final_answer`, or a \\boxed{} in `solution`)"
    return question.strip(), answer.strip()


def _rows(name: str, split: str, data_dir: str):
    """Yield (where, row) from a local .jsonl file or, failing that, the hub. `where` is 'file:line'."""
    if name.endswith(".jsonl"):
        path = name
    elif name in BENCHMARKS:
        files, (hub, config) = BENCHMARKS[name]
        if split not in files:
            raise SystemExit(f"dataset {name}: no {split} split (it has {', '.join(files)})")
        path = os.path.join(data_dir, files[split])
        if not os.path.exists(path):
            name, path = hub + (f":{config}" if config else ""), None
    elif "/" in name:  # a hub name, "owner/dataset" or "owner/dataset:config"
        path = None
    else:
        raise SystemExit(f"dataset {name}: unknown (known: {', '.join(BENCHMARKS)}, a .jsonl file, or a hub name)")
    if path is not None:
        if not os.path.exists(path):
            raise SystemExit(f"dataset file {path}: not found")
        with open(path) as f:
            for i, line in enumerate(f, 1):
                if line.strip():
                    try:
                        yield f"{path}:{i}", json.loads(line)
                    except json.JSONDecodeError as e:
                        yield f"{path}:{i}", f"not JSON ({e.msg})"
        return
    import datasets
    hub, _, config = name.partition(":")
    try:
        ds = datasets.load_dataset(hub, config or None, split=split)
    except Exception as e:  # offline, or a wrong name: say which and where we looked
        raise SystemExit(f"dataset {hub}: not in {data_dir} and not loadable from the hub: {str(e).splitlines()[0]}")
    for i, row in enumerate(ds):
        yield f"{hub}[{split}][{i}]", row


def tiny_problem(q: str, where: str = "tiny") -> dict:
    """A tiny-world problem in the loader's layout, with its own prompt ("Q:7+8-9=?\nA:")."""
    return {"question": q, "answer": tiny.answer(q), "prompt": tiny.prompt(q), "where": where}


def train_split(name: str) -> str:
    """The split to train on: "train" where the set has one (GSM8K), else its only split, "test" (MATH500:
    then do not evaluate on it). Files and hub names: "train"."""
    return "test" if name in BENCHMARKS and "train" not in BENCHMARKS[name][0] else "train"


def load(name: str, split: str = "test", data_dir: str = DATA_DIR, limit: int = None):
    """(problems, skipped): problems are dicts with question, answer and where ('file:line') (and prompt, for the
    tiny world, whose prompts are its own); skipped lists
    'file:line: why' for every row that could not be used. `limit` keeps the first N usable problems."""
    if name == "tiny":  # the tiny world's 256 held-out problems, in its own prompt format
        return [tiny_problem(q, f"tiny[{i}]") for i, q in enumerate(tiny.eval_problems()[:limit])], []
    problems, skipped = [], []
    for where, row in _rows(name, split, data_dir):
        got = normalise(row) if isinstance(row, dict) else (row if isinstance(row, str) else "not a JSON object")
        if isinstance(got, str):
            skipped.append(f"{where}: {got}")
            continue
        problems.append({"question": got[0], "answer": got[1], "where": where})
        if limit and len(problems) >= limit:
            break
    return problems, skipped


def build_prompt(tokenizer, question: str) -> str:
    """evaluation.md: the chat template with the paper's instruction as the system turn (Qwen2.5-Math's template,
    as the KTAE paper used) when the tokenizer has one; a base model gets the question and then the instruction."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": question}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"{question}\n{INSTRUCTION}\n"


def reference_response(name: str, row: dict) -> str:
    """The benchmark's own reference, written as a model would answer, for checking the grader on real data:
    MATH500 and Minerva their solution (its last box); GSM8K the number after "#### " in a box; the others the
    published answer field in a box inside a sentence."""
    if name in ("math500", "minerva"):
        return row["solution"]
    if name == "gsm8k":
        return f"So the answer is \\boxed{{{row['answer'].rsplit('####', 1)[1].strip()}}}."
    gold = row["final_answer"] if "final_answer" in row else row["answer"]
    gold = ", ".join(g.replace("$", "") for g in gold) if isinstance(gold, list) else gold
    return f"Therefore, the final answer is \\boxed{{{gold}}}."


def check_references(name: str, data_dir: str = DATA_DIR, split: str = "test"):
    """Grade every reference of a benchmark against its normalised gold: (n, n_correct, disagreements)."""
    stats, n, ok, bad = reward.new_stats(), 0, 0, []
    for where, row in _rows(name, split, data_dir):
        got = normalise(row)
        if isinstance(got, str):
            continue
        n += 1
        if reward.is_correct(reference_response(name, row), got[1], stats):
            ok += 1
        else:
            box = reward.last_boxed(reference_response(name, row))
            bad.append(f"{where}: gold {got[1]!r} vs reference box {box!r}")
    return n, ok, bad


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="check the loader and the grader on the local benchmark files")
    p.add_argument("--check", action="store_true", help="grade each benchmark's reference against its gold")
    p.add_argument("--data-dir", default=DATA_DIR)
    args = p.parse_args()
    for name, (files, _) in BENCHMARKS.items():
        for split in files:
            problems, skipped = load(name, split, args.data_dir)
            line = f"{name:14s} {split:5s} {len(problems):5d} problems, {len(skipped)} rows skipped"
            if args.check and split == "test":
                n, ok, bad = check_references(name, args.data_dir)
                line += f"; references graded correct {ok}/{n} = {ok / n:.4f}"
            print(line)
            for s in skipped + (bad if args.check and split == "test" else []):
                print("   ", s)
