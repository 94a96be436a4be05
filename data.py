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
import codecs
import collections
import json
import math
import os
import random
import sys
import unicodedata
from dataclasses import dataclass
from typing import Callable

import reward
from infra import cli
from toyworld import tasks, tiny

# the local copies of the benchmarks: $MATH_DATA_DIR, else ../shared/data beside the project
DATA_DIR = os.environ.get("MATH_DATA_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                                           "shared", "data")
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."

# OAR's conclude cue, appended after a rollout's reasoning (EQUATIONS.md#oar-spans): the paper's sentence
OAR_CUE = "\nTherefore, the final answer is \\boxed{"


@dataclass(frozen=True)
class Dataset:
    """Everything a set of problems decides about itself, in one record (DATASETS): no other module tests a
    dataset's name. A .jsonl file or a hub name gets the default record (dataset())."""
    name: str
    files: dict = None  # split -> file under the data directory (the published benchmarks)
    hub: tuple = None  # (hub name, config): where a benchmark missing from the data directory is read from
    make: Callable = None  # (split, limit) -> problems, for a set made here (no file, no hub)
    world: object = None  # a task of the tiny world (toyworld/tasks.py): its own model (--model tiny), prompt and
    # fresh training problems, and it knows where a wrong rollout first goes wrong (toyworld/credit.py)
    max_new_tokens: int = 48  # the default --max-new-tokens
    cue: str = OAR_CUE  # OAR's conclude cue (--oar-cue)
    prompt_tokens: int = 512  # the prompt length --dry-run plans for
    held_out: str = "math500"  # the held-out set when --eval-dataset is not given
    reference: Callable = None  # (row) -> the benchmark's own reference answer, for `data.py --check`
    @property
    def made_here(self) -> bool:
        return self.world is not None or self.make is not None

    def prompt(self, tokenizer, problem: dict) -> str:
        """The prompt the model sees: the world's own ("Q:7+8-9=?\\nA:"), else the chat template (build_prompt)."""
        if self.world is not None:
            return self.world.prompt(problem["question"])
        return build_prompt(tokenizer, problem["question"], problem.get("shots", ()))

    def teacher_prompt(self, tokenizer, problem: dict, wording: str) -> str:
        """A teacher's prompt (RLSD's L1, SDPG's P2): the problem with its gold answer as privileged context. The
        method owns the wording (a format string of {question} and {answer}), the dataset how a prompt is put: the
        tiny world's own characters ("Q:7+8-9=?\\boxed{6}\\nA:", whatever the wording: its model reads no English),
        else the worded question in the question's place of the chat template. A problem without a gold answer is
        refused in one line (ValueError): the loaders skip such rows, so only a caller's own problem gets here."""
        answer = problem.get("answer")
        if not isinstance(answer, str) or not answer.strip():
            raise ValueError(f"{problem.get('where', problem.get('question'))}: no reference answer for the teacher's "
                             f"prompt (its privileged context is the gold answer)")
        if self.world is not None:
            return self.world.teacher_prompt(problem["question"], problem["answer"])
        question = wording.format(question=problem["question"], answer=problem["answer"])
        return build_prompt(tokenizer, question, problem.get("shots", ()))


def _world(task) -> Dataset:
    """A task of the tiny world as a dataset: its own held-out set and budget; the cue is its own '\\boxed{' (its
    reasoning ends with a newline, not a sentence); its prompts are about 16 tokens."""
    return Dataset(task.name, world=task, max_new_tokens=task.max_new_tokens, cue="\\boxed{", prompt_tokens=16,
                   held_out=task.name)


def _benchmark(name: str, files: dict, hub: str, config: str = None, reference=None) -> Dataset:
    return Dataset(name, files=files, hub=(hub, config), reference=reference or answer_reference)


# `arith`: "What is 59 + 63?", sized so that a small real model gets some right and some wrong (its groups then mix,
# and G1 has something to learn from). Its prompt shows one worked exchange first (ARITH_SHOT), the papers'
# instruction after each question, because a small model asked with the instruction alone may never write a box
# (the trials are in docs/LOG.md). 256 of the 8,100 pairs are held out; training draws from the other 7,844.
ARITH_SHOT = ("What is 3 + 4?", "3 + 4 = 7. The final answer is \\boxed{7}.")
ARITH_HELD_OUT = 256


def arith_problems(split: str, limit: int = None) -> list:
    """The `arith` set: split "test" is the 256 held-out additions, "train" the other 7,844 (a fixed shuffle)."""
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    random.Random(1234).shuffle(pairs)
    pairs = pairs[:ARITH_HELD_OUT] if split == "test" else pairs[ARITH_HELD_OUT:]
    return [{"question": f"What is {a} + {b}?", "answer": str(a + b), "shots": [ARITH_SHOT],
             "where": f"arith[{split}][{i}]"} for i, (a, b) in enumerate(pairs[:limit])]


def solution_reference(row: dict) -> str:
    """MATH500's and Minerva's reference: their worked solution, which ends in a box."""
    return row["solution"]


def gsm8k_reference(row: dict) -> str:
    """GSM8K's reference: the number after its "#### ", in a box."""
    return f"So the answer is \\boxed{{{row['answer'].rsplit('####', 1)[1].strip()}}}."


def answer_reference(row: dict) -> str:
    """The others': the published answer field in a box inside a sentence (a list joined by ", ")."""
    gold = row["final_answer"] if "final_answer" in row else row["answer"]
    gold = ", ".join(g.replace("$", "") for g in gold) if isinstance(gold, list) else gold
    return f"Therefore, the final answer is \\boxed{{{gold}}}."


# The hub names are the ones the papers' evaluation code uses; this machine cannot reach the hub to check them.
DATASETS = {d.name: d for d in [
    *(_world(t) for t in tasks.TASKS.values()),
    # two-digit additions in words, the real-model recipe's task
    Dataset("arith", make=arith_problems, held_out="arith"),
    _benchmark("gsm8k", {"test": "gsm8k/test.jsonl", "train": "gsm8k/train.jsonl"}, "openai/gsm8k", "main",
               gsm8k_reference),
    _benchmark("math500", {"test": "math500/test.jsonl"}, "HuggingFaceH4/MATH-500", None, solution_reference),
    _benchmark("aime24", {"test": "aime24/test.jsonl"}, "HuggingFaceH4/aime_2024"),
    _benchmark("aime25", {"test": "aime25/test.jsonl"}, "math-ai/aime25"),
    _benchmark("amc23", {"test": "amc23/test.jsonl"}, "math-ai/amc23"),
    _benchmark("minerva", {"test": "minerva_math/test.jsonl"}, "math-ai/minervamath", None, solution_reference),
    _benchmark("olympiadbench", {"test": "olympiadbench/test.jsonl"}, "Hothan/OlympiadBench", "OE_TO_maths_en_COMP"),
]}
BENCHMARKS = [n for n, d in DATASETS.items() if d.files]  # the published sets
DEFAULT = tiny.NAME  # --dataset's default: the tiny world's task


def dataset(name: str) -> Dataset:
    """The record of --dataset / --eval-dataset / --benchmarks NAME: a known set's, or the default one for a .jsonl
    file or a hub name."""
    return DATASETS.get(name) or Dataset(name)


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
           "characters the tokenizer cannot encode": "unencodable", "not valid Unicode": "not unicode"}


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
        parts = [number_answer(a) if _is_number(a) else a for a in answer]
        if any(isinstance(a, float) for a in parts):
            return NOT_FINITE
        answer = ", ".join(str(a).replace("$", "").strip() for a in parts if str(a).strip())
    elif _is_number(answer):
        answer = number_answer(answer)
    elif answer is None:
        if "final_answer" in row and row.get("answer") is not None:
            taken.append(ANSWER_FROM_ANSWER)
        answer = row.get("answer")
        if isinstance(answer, bool):
            answer = None
        elif _is_number(answer):  # AMC23 publishes 27.0
            answer = number_answer(answer)
        elif isinstance(answer, str) and "####" in answer:  # GSM8K: reasoning, then "#### 1,080"
            answer = answer.rsplit("####", 1)[1].strip().replace(",", "")
        elif answer is None and isinstance(row.get("solution"), str):  # Minerva: only inside the solution
            answer = reward.last_boxed(row["solution"])
            taken.append(FILLED_FROM_BOX)
    if isinstance(answer, float):  # number_answer's verdict on NaN, Infinity or 1e400
        return NOT_FINITE
    if not isinstance(answer, str) or not answer.strip():
        return "no answer (fields `answer`, `final_answer`, or a \\boxed{} in `solution`)"
    for what, text in (("question", question), ("answer", answer)):
        why = not_unicode(text)
        if why:
            return f"{why} in the {what}"
    notes.update(taken)
    return question.strip(), answer.strip()


def not_unicode(text: str):
    """Why a string cannot be a model's text (None if it can): JSON's \\ud800 escapes decode to a lone surrogate,
    which no encoding writes and every tokenizer refuses with a traceback."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"text that is not valid Unicode (a lone surrogate, {ascii(text[e.start])}, at character {e.start + 1})"
    return None


NOT_FINITE = "no answer (the gold answer is NaN or infinite: Python's JSON reads NaN, Infinity and 1e400 so)"


def number_answer(value):
    """A gold answer published as a JSON number, as the string a model would box: 27.0 -> "27", 0.5 -> "0.5",
    an integer of 400 digits as its digits. NaN and infinity (JSON's NaN, Infinity, or 1e400, which overflows a
    float) come back as the float itself, for normalise() to refuse the row."""
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        return value
    # beyond 2^53 a float is not an exact integer: int(1e300) would invent 300 digits
    return str(int(value)) if value.is_integer() and abs(value) < 2 ** 53 else repr(value)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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
    except RecursionError:  # Python's parser recurses once per level: [[[[...]]]] of depth ~1000 is enough
        return None, "broken JSON (nested too deeply to read)"
    except ValueError as e:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        return None, f"broken JSON ({str(e).split(':')[0]})"
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
    """Where `name` will be read from, found without reading it (call it before loading any model): a set made
    here (its name), a local .jsonl file, or a hub name "owner/dataset[:config]" (a known benchmark that is not in
    data_dir, or a hub name as given). Anything that cannot be found raises SystemExit with one line naming the
    flag and the path: an unknown name, a .jsonl file that does not exist, a split the set does not have, or a
    benchmark missing from data_dir while the hub is switched off (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE)."""
    ds = dataset(name)
    if ds.made_here:
        return name
    if name.endswith(".jsonl"):
        if not os.path.isfile(name):
            raise SystemExit(f"{flag} {name}: not found (no file {os.path.abspath(name)})")
        return name
    if ds.files:
        files, (hub, config) = ds.files, ds.hub
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
    raise SystemExit(f"{flag} {name}: unknown (known: {', '.join(DATASETS)}, a .jsonl file, or a hub name)")


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
    texts = [unicodedata.normalize("NFC", text) for text in texts]
    if isinstance(tok_or_alphabet, (str, set, frozenset)):
        backs = ["".join(ch for ch in text if ch in tok_or_alphabet) for text in texts]
    elif texts:  # one call for all: a training set of thousands of rows is encoded at once, not row by row
        ids = tok_or_alphabet(texts, add_special_tokens=False)["input_ids"]
        backs = tok_or_alphabet.batch_decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    out = []
    for text, back in zip(texts, backs if texts else []):
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


def check_encodable(tokenizer, text: str, what: str):
    """One line if the tokenizer cannot write `text`: the words a dataset puts around each question (the papers'
    instruction), or OAR's cue. The tiny model's 28 characters would drop every letter of them without a word."""
    lost = encoding_loss([text], tokenizer)[0]
    if lost:
        sys.exit(f"{what}: the tokenizer cannot encode {ascii(lost)[1:-1][:40]!r} of {text[:60]!r} (the tiny model "
                 f"writes its own tasks only: give --model a real model)")


def check_prompts(ds: Dataset, tokenizer, what: str):
    """check_encodable for what ds writes around a question (its questions' own characters: drop_unencodable)."""
    check_encodable(tokenizer, ds.prompt(tokenizer, {"question": "1+1"}), what)


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


def world_problem(task, q: str, where: str) -> dict:
    """A problem of a tiny-world task (toyworld/tasks.py) in the loader's layout."""
    return {"question": q, "answer": task.answer(q), "where": where}


def train_split(name: str) -> str:
    """The split to train on: "train" where the set has one (GSM8K), else its only split, "test" (MATH500:
    then do not evaluate on it). Files and hub names: "train"."""
    files = dataset(name).files
    return "test" if files and "train" not in files else "train"


def load(name: str, split: str = "test", data_dir: str = DATA_DIR, limit: int = None, notes=None,
         flag: str = "dataset"):
    """(problems, skipped): problems are dicts with question, answer and where ('file:line'); skipped lists
    'file:line: why' for every line or row that could not be used, in file order. `notes` (a
    collections.Counter), when given, counts what was filled in or passed over (see normalise and read_jsonl);
    report() prints both. `limit` keeps the first N usable problems. A tiny-world task's held-out set is its 256
    fixed problems, whatever the split."""
    ds = dataset(name)
    if ds.world is not None:
        qs = ds.world.eval_problems()[:limit]
        return [world_problem(ds.world, q, f"{name}[{i}]") for i, q in enumerate(qs)], []
    if ds.make is not None:
        return ds.make(split, limit), []
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


@dataclass
class Problems:
    """The problems of a run: where training problems come from (draw) and the held-out ones with their prompts.
    A held-out question is never drawn for training."""
    dataset: Dataset
    pool: list  # the training problems, with their prompts; None: fresh problems of the tiny world each step
    held_out: set  # the held-out questions
    eval_prompts: list
    eval_golds: list

    def draw(self, rng: random.Random, n: int) -> list:
        """n training problems with their prompts: from the pool, or fresh ones of the world."""
        if self.pool:
            return [rng.choice(self.pool) for _ in range(n)]
        world = self.dataset.world
        return [{**world_problem(world, q, world.name), "prompt": world.prompt(q)}
                for q in world.train_problems(rng, n, self.held_out)]


def run_problems(name: str, eval_name: str, tokenizer, *, data_dir: str = DATA_DIR, eval_limit: int = None,
                 pool_size: int = 0, seed: int = 0, eval_flag: str = "--eval-dataset",
                 flag: str = "--dataset", room: int = None) -> Problems:
    """A run's problems (train.py, scaling/trl_train.py): the held-out set eval_name (its first eval_limit usable
    problems), and the training set name; each row that cannot be used is reported with its file and line.
    A tiny-world task trains on fresh problems each step, or on a fixed pool of pool_size drawn with seed.
    room: the most prompt tokens the model's context leaves beside the response budget; a training prompt longer
    is skipped and reported (evaluate.score cuts a held-out one, and says so)."""
    ds, eval_ds = dataset(name), dataset(eval_name)
    check_prompts(eval_ds, tokenizer, f"{eval_flag} {eval_name}")
    check_prompts(ds, tokenizer, f"{flag} {name}")
    notes = collections.Counter()  # the loader's fallbacks (an answer taken from the solution's box, ...), counted
    held, skipped = load(eval_name, "test", data_dir, eval_limit, notes=notes, flag=eval_flag)
    held, lost = drop_unencodable(held, tokenizer)  # before the prompts add their instruction
    report(f"{eval_flag} {eval_name}", held, skipped + lost, notes)
    if not held:  # every evaluation would be of nothing, its accuracy a 0 of 0
        sys.exit(f"{eval_flag} {eval_name}: no usable problem")
    questions = {p["question"] for p in held}
    if ds.world is not None:
        pool = None
        if pool_size:
            qs = ds.world.train_problems(random.Random(seed), pool_size, questions)
            pool = [world_problem(ds.world, q, name) for q in qs]
    else:
        notes = collections.Counter()
        pool, skipped = load(name, train_split(name), data_dir, notes=notes, flag=flag)
        pool, lost = drop_unencodable(pool, tokenizer)
        report(f"{flag} {name}", pool, skipped + lost, notes)
        kept = [p for p in pool if p["question"] not in questions]  # math500 has one split: it would train on its test
        if len(kept) < len(pool):
            print(f"{flag} {name}: {len(pool) - len(kept)} problems left out of training, held out by {eval_flag} "
                  f"{eval_name}")
        if pool and not kept:
            sys.exit(f"{flag} {name}: no usable problem: every one is held out by {eval_flag} {eval_name}")
        pool = kept
        if not pool:
            sys.exit(f"{flag} {name}: no usable problem")
        print(f"{len(pool)} training problems from {name}, {len(held)} held out from {eval_name}")
    for p in pool or []:
        p["prompt"] = ds.prompt(tokenizer, p)
    if pool and room is not None:  # sampled past its context, a model's positions mean nothing it has learned
        lengths = [len(ids) for ids in tokenizer([p["prompt"] for p in pool])["input_ids"]]
        long = [f"{p['where']}: a prompt of {n} tokens, more than the {room} the model's context leaves beside the "
                f"response budget" for p, n in zip(pool, lengths) if n > room]
        if long:
            pool = [p for p, n in zip(pool, lengths) if n <= room]
            report(f"{flag} {name} (prompt lengths)", pool, long)
            if not pool:
                sys.exit(f"{flag} {name}: no usable problem: {long[0]}")
    return Problems(ds, pool, questions, [eval_ds.prompt(tokenizer, p) for p in held], [p["answer"] for p in held])


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


def check_references(name: str, data_dir: str = DATA_DIR, split: str = "test"):
    """Grade every reference of a benchmark (Dataset.reference: its own, written as a model would answer) against
    its normalised gold: (n, n_correct, disagreements). Rows that cannot be read or used are left out here; load()
    reports them."""
    stats, n, ok, bad = reward.new_stats(), 0, 0, []
    for where, row in read_rows(name, split, data_dir)[0]:
        got = normalise(row)
        if isinstance(got, str):
            continue
        n += 1
        try:
            response = dataset(name).reference(row)
        except (KeyError, IndexError, TypeError, AttributeError) as e:
            bad.append(f"{where}: no reference to grade ({type(e).__name__}: {e})")
            continue
        if reward.is_correct(response, got[1], stats):
            ok += 1
        else:
            bad.append(f"{where}: gold {got[1]!r} vs reference box {reward.last_boxed(response)!r}")
    return n, ok, bad


def main(argv=None):
    p = cli.Parser(description="check the loader and the grader on the local benchmark files: every "
                                            "row that cannot be used is listed with its file and line")
    p.add_argument("datasets", nargs="*", help=f"benchmarks ({', '.join(BENCHMARKS)}) or .jsonl files "
                                               f"(default: every benchmark in --data-dir)")
    p.add_argument("--check", action="store_true", help="grade each benchmark's reference against its gold")
    p.add_argument("--data-dir", default=DATA_DIR)
    args = p.parse_args(argv)
    todo = [(n, s) for n in (args.datasets or BENCHMARKS) for s in (dataset(n).files or ["train"])]
    for name, split in todo if args.datasets else ():  # a name that is no set, a file that is not there
        try:
            locate(name, split, args.data_dir, "dataset")
        except SystemExit as e:
            p.error(str(e))
    # what was asked about and not checked; a benchmark missing from --data-dir counts only when it was named
    failed, checked = [], 0
    for name, split in todo:
        files = dataset(name).files
        label = f"{name} {split}" if files else name
        if files and not os.path.isfile(os.path.join(args.data_dir, files[split])):
            print(f"{label}: no file {os.path.join(args.data_dir, files[split])}")
            failed += [label] if args.datasets else []
            continue
        notes = collections.Counter()
        try:
            problems, skipped = load(name, split, args.data_dir, notes=notes)
        except SystemExit as e:  # a file that cannot be read: say so and go on with the others
            print(e)
            failed.append(label)
            continue
        report(label, problems, skipped, notes, show=None, file=sys.stdout)
        checked += 1
        if not problems:
            failed.append(f"{label}: no usable problem")
        if args.check and split == "test" and files and problems:
            n, ok, bad = check_references(name, args.data_dir)
            print(f"  references graded correct {ok}/{n} = {ok / n:.4f}")
            for s in bad:
                print(f"  {s}")
    if not checked:  # every file missing: a check of nothing must not pass as a clean one
        sys.exit(f"data.py: nothing checked: no benchmark file in --data-dir {args.data_dir}" if not args.datasets
                 else f"data.py: nothing checked: {', '.join(failed)}")
    if failed:
        sys.exit(f"data.py: {len(failed)} of {len(todo)} failed: {', '.join(failed)} (said above)")


if __name__ == "__main__":
    main()
