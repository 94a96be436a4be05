"""Datasets and prompts: one loader for the published math sets, whatever their field layout.

    python data.py --check      # grade every benchmark's own reference solution against its gold answer

The sets are published with different fields, so every row goes through normalise():
  question  <- `problem`, else `question`
  answer    <- `final_answer` (OlympiadBench: a list of LaTeX strings, $...$ removed, joined by ", ")
            <- `answer` (GSM8K: the number after "#### ", thousands commas removed; AMC23: the float 27.0 -> "27")
            <- the last \\boxed{} of `solution` (Minerva has no answer field)
Nothing is lost silently: each line is decoded on its own (read_jsonl), so a bad byte costs its line only; a line
that is not UTF-8, not JSON or not a JSON object, and a row that gives no question or no answer, is skipped and
listed as 'file:line: why'; blank lines, a leading byte-order mark and every fallback normalise() takes (the answer
from the solution's last box, ...) are counted in `notes`; report() prints one summary line and the first reasons.
For a tokenizer with a small alphabet (the tiny model's), drop_unencodable() skips and lists the rows it would
mangle. Files are read from a local directory (--data-dir); a set that is not there is loaded from the hub by its
usual name (needs internet). locate() finds a set without reading it, to fail before a model is loaded.

    python data.py gsm8k my.jsonl   # load these and list every row that cannot be used
"""
import argparse
import codecs
import collections
import json
import os
import random
import sys
import unicodedata

import reward
import tasks
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


# Generated sets, made here (no file, no hub): the tiny world (tiny.py), and `arith`, the real-model recipe's task
# (README, "A real model on a CPU"): two-digit additions asked in words, "What is 59 + 63?". SmolLM2-135M-Instruct
# gets about a quarter of them right greedily, so its groups mix right and wrong answers. Its prompt shows one
# worked exchange first (ARITH_SHOT), the papers' instruction after each question: asked with the instruction
# alone, the 135M model reasons at length and never writes a box (0 of 96 in a trial); after the exchange every
# greedy answer was boxed. 256 of the 8,100 pairs are held out; training draws from the other 7,844.
GENERATED = ("tiny", "arith")
ARITH_SHOT = ("What is 3 + 4?", "3 + 4 = 7. The final answer is \\boxed{7}.")
ARITH_HELD_OUT = 256


def arith_problems(split: str, limit: int = None) -> list:
    """The `arith` set: split "test" is the 256 held-out additions, "train" the other 7,844 (a fixed shuffle)."""
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    random.Random(1234).shuffle(pairs)
    pairs = pairs[:ARITH_HELD_OUT] if split == "test" else pairs[ARITH_HELD_OUT:]
    return [{"question": f"What is {a} + {b}?", "answer": str(a + b), "shots": [ARITH_SHOT],
             "where": f"arith[{split}][{i}]"} for i, (a, b) in enumerate(pairs[:limit])]


# What normalise() and read_jsonl() did to make rows usable: a collections.Counter whose keys are these templates
# (report() fills in {n}); nothing is filled in or left out without being counted here or in the skipped list.
FILLED_FROM_BOX = "filled answer from the solution's last box in {n} rows"
QUESTION_FROM_QUESTION = "took `question` because `problem` was empty in {n} rows"
ANSWER_FROM_ANSWER = "took `answer` because `final_answer` was null in {n} rows"
BLANK_LINES = "{n} blank lines skipped"
BOM_REMOVED = "removed a leading UTF-8 byte-order mark from {n} file(s)"

# the reasons a row is skipped, as they begin in the skipped list, and their short names in report()'s summary
REASONS = {"undecodable bytes": "undecodable", "broken JSON": "broken JSON", "not a JSON object": "not an object",
           "no question": "no question", "no answer": "no answer",
           "characters the tokenizer cannot encode": "unencodable"}


def normalise(row: dict, notes=None):
    """(question, answer) as strings, or a string saying why the row cannot be used. Each fallback it takes is
    counted in `notes` (a collections.Counter, keys as FILLED_FROM_BOX above) when one is given.

    normalise({"question": "2+2?", "answer": "It is 4.\\n#### 4"}) == ("2+2?", "4")
    normalise({"problem": "x?", "answer": 27.0}) == ("x?", "27")
    """
    notes = notes if notes is not None else collections.Counter()
    if not isinstance(row, dict):
        return f"not a JSON object ({_json_kind(row)})"
    question, fallback = row.get("problem"), None
    if not (isinstance(question, str) and question.strip()):
        question, fallback = row.get("question"), "problem" in row
    if not isinstance(question, str) or not question.strip():
        return "no question (fields `problem` or `question`)"
    taken = []  # the notes to count, once the row is known to be usable
    if fallback:
        taken.append(QUESTION_FROM_QUESTION)
    answer = row.get("final_answer")
    if isinstance(answer, list):  # OlympiadBench: ["$(1,8,19), (2,7,13)$"] or ["$69$,$84$"]
        answer = ", ".join(str(a).replace("$", "").strip() for a in answer if str(a).strip())
    elif answer is None:
        if "final_answer" in row and row.get("answer") is not None:
            taken.append(ANSWER_FROM_ANSWER)
        answer = row.get("answer")
        if isinstance(answer, bool):
            answer = None
        elif isinstance(answer, (int, float)):  # AMC23 publishes 27.0
            answer = str(int(answer)) if float(answer).is_integer() else repr(answer)
        elif isinstance(answer, str) and "####" in answer:  # GSM8K: reasoning, then "#### 1,080"
            answer = answer.rsplit("####", 1)[1].strip().replace(",", "")
        elif answer is None and isinstance(row.get("solution"), str):  # Minerva: only inside the solution
            answer = reward.last_boxed(row["solution"])
            taken.append(FILLED_FROM_BOX)
    if not isinstance(answer, str) or not answer.strip():
        return "no answer (fields `answer`, `final_answer`, or a \\boxed{} in `solution`)"
    notes.update(taken)
    return question.strip(), answer.strip()


def parse_line(raw: bytes):
    """One line of a .jsonl file, as bytes: (row, None), or (None, why it cannot be read) when its bytes are not
    UTF-8, it is not JSON, or it is JSON but not an object. Each line is decoded on its own, so a bad byte costs
    its line only."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"undecodable bytes (byte {e.start + 1} of the line, {raw[e.start:e.start + 1]!r}, is not UTF-8)"
    try:
        row = json.loads(text)
    except json.JSONDecodeError as e:
        return None, f"broken JSON ({e.msg}, column {e.colno})"
    if not isinstance(row, dict):
        return None, f"not a JSON object ({_json_kind(row)})"
    return row, None


def _json_kind(value) -> str:
    """What a JSON value is, in JSON's words: 'an array', 'a number', 'a string', 'null', 'true/false'."""
    if value is None or isinstance(value, bool):
        return "null" if value is None else "true/false"
    kinds = {list: "an array", str: "a string", int: "a number", float: "a number"}
    return kinds.get(type(value), type(value).__name__)


def read_jsonl(path: str, notes=None):
    """(rows, problems): rows is [(where, dict)] with where = 'file:line'; problems is ['file:line: why'] for every
    line that could not be read (see parse_line). Blank lines are skipped and a leading UTF-8 byte-order mark is
    removed; both are counted in `notes` (a collections.Counter) when one is given."""
    notes = notes if notes is not None else collections.Counter()
    with open(path, "rb") as f:
        raw = f.read()
    if raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8):]
        notes[BOM_REMOVED] += 1
    rows, problems = [], []
    for i, line in enumerate(raw.split(b"\n"), 1):  # "\n" only: JSON strings hold no raw newline; "\r" is space
        if not line.strip():
            if i <= raw.count(b"\n"):  # the empty piece after the final newline is not a line
                notes[BLANK_LINES] += 1
            continue
        row, why = parse_line(line)
        if why:
            problems.append(f"{path}:{i}: {why}")
        else:
            rows.append((f"{path}:{i}", row))
    return rows, problems


def locate(name: str, split: str = "test", data_dir: str = DATA_DIR, flag: str = "--dataset") -> str:
    """Where `name` will be read from, found without reading it (call it before loading any model): the tiny
    world ("tiny"), a local .jsonl file, or a hub name "owner/dataset[:config]" (a known benchmark that is not in
    data_dir, or a hub name as given). Anything that cannot be found raises SystemExit with one line naming the
    flag and the path: an unknown name, a .jsonl file that does not exist, a split the set does not have, or a
    benchmark missing from data_dir while the hub is switched off (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE)."""
    if name in GENERATED:
        return name
    if name.endswith(".jsonl"):
        if not os.path.isfile(name):
            raise SystemExit(f"{flag} {name}: not found (no file {os.path.abspath(name)})")
        return name
    if name in BENCHMARKS:
        files, (hub, config) = BENCHMARKS[name]
        if split not in files:
            raise SystemExit(f"{flag} {name}: no {split} split (it has {', '.join(files)})")
        path = os.path.join(data_dir, files[split])
        if os.path.isfile(path):
            return path
        if any(os.environ.get(v, "0") not in ("", "0") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")):
            raise SystemExit(f"{flag} {name}: not found (no file {os.path.abspath(path)}, and the hub is offline; "
                             f"set --data-dir or MATH_DATA_DIR)")
        return hub + (f":{config}" if config else "")
    if os.path.exists(name):
        raise SystemExit(f"{flag} {name}: a local file must be a .jsonl file (one JSON object a line)")
    if "/" in name:  # a hub name, "owner/dataset" or "owner/dataset:config"
        return name
    raise SystemExit(f"{flag} {name}: unknown (known: {', '.join(BENCHMARKS)}, {', '.join(GENERATED)}, a .jsonl "
                     f"file, or a hub name)")


def read_rows(name: str, split: str, data_dir: str, notes=None, flag: str = "dataset"):
    """(rows, problems) as read_jsonl's, from a local .jsonl file or, failing that, the hub ('hub[split][i]')."""
    where = locate(name, split, data_dir, flag)
    if where.endswith(".jsonl"):
        return read_jsonl(where, notes)
    import datasets
    hub, _, config = where.partition(":")
    try:
        ds = datasets.load_dataset(hub, config or None, split=split)
    except Exception as e:  # offline, or a wrong name: say which and where we looked
        raise SystemExit(f"{flag} {name}: not in {data_dir} and not loadable from the hub as {hub}: "
                         f"{str(e).splitlines()[0] if str(e) else type(e).__name__}")
    rows, problems = [], []
    for i, row in enumerate(ds):
        (rows.append((f"{hub}[{split}][{i}]", row)) if isinstance(row, dict)
         else problems.append(f"{hub}[{split}][{i}]: not a JSON object ({_json_kind(row)})"))
    return rows, problems


def _line_of(entry: str):
    """Sort key of a 'file:line: why' entry: (file, line), so that reasons found at different stages interleave."""
    where = entry.split(": ", 1)[0]
    head, _, tail = where.rpartition(":")
    return (head, int(tail)) if tail.isdigit() else (where, 0)


def encoding_loss(texts, tok_or_alphabet) -> list:
    """For each text, the characters that do not survive the tokenizer's round trip (encode, then decode, both
    NFC-normalised), in order of first appearance; '' for a text that survives. `tok_or_alphabet` is a tokenizer
    (any with __call__ and decode) or a string / set of the characters it can encode (tiny.ALPHABET).
    Whitespace is not counted: some tokenizers add or drop a leading space, which loses nothing.

    encoding_loss(["Q:1+2=?", "Q:1+é2=?"], tiny.ALPHABET) == ["", "é"]
    """
    out = []
    for text in texts:
        text = unicodedata.normalize("NFC", text)
        if isinstance(tok_or_alphabet, (str, set, frozenset)):
            back = "".join(ch for ch in text if ch in tok_or_alphabet)
        else:
            ids = tok_or_alphabet(text, add_special_tokens=False)["input_ids"]
            back = tok_or_alphabet.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        back = unicodedata.normalize("NFC", back)
        if back == text:
            out.append("")
            continue
        lost = collections.Counter(text) - collections.Counter(back)
        out.append("".join(ch for ch in dict.fromkeys(text) if ch in lost and not ch.isspace()))
    return out


def drop_unencodable(problems: list, tok_or_alphabet):
    """(kept, skipped): the problems (load()'s dicts) whose prompt (or question, before prompts are built) and
    answer the tokenizer encodes without loss, and 'where: characters the tokenizer cannot encode: ...' for the
    others. Without it the tiny model's tokenizer silently drops every character outside tiny.ALPHABET."""
    prompts = encoding_loss([p.get("prompt") or p["question"] for p in problems], tok_or_alphabet)
    answers = encoding_loss([p["answer"] for p in problems], tok_or_alphabet)
    kept, skipped = [], []
    for p, lq, la in zip(problems, prompts, answers):
        if not (lq or la):
            kept.append(p)
            continue
        parts = [f"{ascii(lq)[1:-1][:40]!r} in the {'prompt' if p.get('prompt') else 'question'}"] if lq else []
        parts += [f"{ascii(la)[1:-1][:40]!r} in the answer"] if la else []
        skipped.append(f"{p['where']}: characters the tokenizer cannot encode: {'; '.join(parts)}")
    return kept, skipped


def report(name: str, problems: list, skipped: list, notes=None, show: int = 5, file=None) -> str:
    """Print (to stderr, or `file`) one summary line and the first `show` skipped rows ('file:line: why'; all of
    them when show is None), and return the summary, e.g.
    "--dataset gsm8k: loaded 7471 rows, skipped 2 (1 undecodable, 1 broken JSON); filled answer from the
    solution's last box in 3 rows"."""
    skipped = sorted(skipped, key=_line_of)  # in file order, whichever stage found them
    kinds = collections.Counter()
    for s in skipped:
        why = s.split(": ", 1)[1] if ": " in s else s
        kinds[next((short for long, short in REASONS.items() if long in why), "other")] += 1
    line = f"{name}: loaded {len(problems)} rows, skipped {len(skipped)}"
    if skipped:
        line += " (" + ", ".join(f"{n} {k}" for k, n in kinds.items()) + ")"
    if notes:
        line += "; " + "; ".join(k.format(n=n) for k, n in notes.items() if n)
    file = file or sys.stderr
    print(line, file=file)
    for s in skipped if show is None else skipped[:show]:
        print(f"  {s}", file=file)
    if show is not None and len(skipped) > show:
        print(f"  ... and {len(skipped) - show} more", file=file)
    return line


def tiny_problem(q: str, where: str = "tiny") -> dict:
    """A tiny-world problem (of any task of tasks.py) in the loader's layout, with its own prompt ("Q:7+8-9=?\nA:")."""
    return {"question": q, "answer": tiny.answer(q), "prompt": tiny.prompt(q), "where": where}


def train_split(name: str) -> str:
    """The split to train on: "train" where the set has one (GSM8K), else its only split, "test" (MATH500:
    then do not evaluate on it). Files and hub names: "train"."""
    return "test" if name in BENCHMARKS and "train" not in BENCHMARKS[name][0] else "train"


def load(name: str, split: str = "test", data_dir: str = DATA_DIR, limit: int = None, notes=None,
         flag: str = "dataset", task: str = "tiny"):
    """(problems, skipped): problems are dicts with question, answer and where ('file:line') (and prompt, for the
    tiny world, whose prompts are its own); skipped lists 'file:line: why' for every line or row that could not be
    used, in file order. `notes` (a collections.Counter), when given, counts what was filled in or passed over
    (see normalise and read_jsonl); report() prints both. `limit` keeps the first N usable problems."""
    if name == "tiny":  # the tiny world's 256 held-out problems (of --task), in its own prompt format
        return [tiny_problem(q, f"{task}[{i}]") for i, q in enumerate(tasks.TASKS[task].eval_problems()[:limit])], []
    if name == "arith":
        return arith_problems(split, limit), []
    rows, skipped = read_rows(name, split, data_dir, notes, flag)
    problems = []
    for where, row in rows:
        got = normalise(row, notes)
        if isinstance(got, str):
            skipped.append(f"{where}: {got}")
            continue
        problems.append({"question": got[0], "answer": got[1], "where": where})
        if limit and len(problems) >= limit:
            break
    return problems, sorted(skipped, key=_line_of)


def build_prompt(tokenizer, question: str, shots=()) -> str:
    """EQUATIONS.md#evaluation-prompt: the chat template with the paper's instruction as the system turn
    (Qwen2.5-Math's template, as the KTAE paper used) when the tokenizer has one; a base model gets the question and
    then the instruction. With shots, (question, answer) pairs shown first as earlier turns (the `arith` set), the
    instruction follows each question in its user turn instead, and the model's own system turn stays."""
    if shots:
        turns = [t for q, a in shots for t in ({"role": "user", "content": f"{q} {INSTRUCTION}"},
                                               {"role": "assistant", "content": a})]
        turns.append({"role": "user", "content": f"{question} {INSTRUCTION}"})
        if getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
        return "".join(f"{t['content']}\n" if t["role"] == "user" else f"{t['content']}\n\n" for t in turns)
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
    """Grade every reference of a benchmark against its normalised gold: (n, n_correct, disagreements). Rows that
    cannot be read or used are left out here; load() reports them."""
    stats, n, ok, bad = reward.new_stats(), 0, 0, []
    for where, row in read_rows(name, split, data_dir)[0]:
        got = normalise(row)
        if isinstance(got, str):
            continue
        n += 1
        try:
            response = reference_response(name, row)
        except (KeyError, IndexError, TypeError, AttributeError) as e:
            bad.append(f"{where}: no reference to grade ({type(e).__name__}: {e})")
            continue
        if reward.is_correct(response, got[1], stats):
            ok += 1
        else:
            bad.append(f"{where}: gold {got[1]!r} vs reference box {reward.last_boxed(response)!r}")
    return n, ok, bad


def main(argv=None):
    p = argparse.ArgumentParser(description="check the loader and the grader on the local benchmark files: every "
                                            "row that cannot be used is listed with its file and line")
    p.add_argument("datasets", nargs="*", help=f"benchmarks ({', '.join(BENCHMARKS)}) or .jsonl files "
                                               f"(default: every benchmark in --data-dir)")
    p.add_argument("--check", action="store_true", help="grade each benchmark's reference against its gold")
    p.add_argument("--data-dir", default=DATA_DIR)
    args = p.parse_args(argv)
    todo = [(n, s) for n in (args.datasets or BENCHMARKS)
            for s in (BENCHMARKS[n][0] if n in BENCHMARKS else ["train"])]
    for name, split in todo:
        if name in BENCHMARKS and not os.path.isfile(os.path.join(args.data_dir, BENCHMARKS[name][0][split])):
            print(f"{name} {split}: no file {os.path.join(args.data_dir, BENCHMARKS[name][0][split])}")
            continue
        notes = collections.Counter()
        try:
            problems, skipped = load(name, split, args.data_dir, notes=notes)
        except SystemExit as e:  # a file that is not there: say so and go on with the others
            print(e)
            continue
        label = f"{name} {split}" if name in BENCHMARKS else name
        report(label, problems, skipped, notes, show=None, file=sys.stdout)
        if args.check and split == "test" and name in BENCHMARKS and problems:
            n, ok, bad = check_references(name, args.data_dir)
            print(f"  references graded correct {ok}/{n} = {ok / n:.4f}")
            for s in bad:
                print(f"  {s}")


if __name__ == "__main__":
    main()
