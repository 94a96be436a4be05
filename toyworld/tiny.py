"""The tiny world: a synthetic arithmetic task, its tokenizer and its ~1M-parameter Qwen2 model.

Why it exists: every method in this project should be seen working on a laptop CPU in minutes, with no
download. So the project builds its own model of the same class as Qwen2.5 (Qwen2ForCausalLM), tiny, and
warm-starts it with a short supervised pass until it is *partly* right (RL needs groups that mix right and
wrong answers: an all-right or all-wrong group has zero advantage, see grpo.py G1).

A problem is a chain of 2-4 single-digit operands joined by + and -; the solution is worked left to right,
one step a line, and ends in \\boxed{answer} like a real math model's would:

    prompt:    "Q:7+8-9=?\\nA:"
    solution:  "7+8=15\\n15-9=6\\n\\boxed{6}<|endoftext|>"

The model has to carry two-digit intermediate results: that is where it errs, and where RL helps.

The tokenizer is one token per character. It is a byte-level BPE with no merges, because a checkpoint
directory must open with AutoTokenizer: in a directory whose config.json says model_type qwen2,
AutoTokenizer rebuilds the Qwen2 tokenizer pipeline (byte-level pre-tokenisation) from the saved vocabulary,
and a WordLevel character vocabulary lost every space and newline there. Byte-level
symbols survive that rebuild. As in Qwen2.5 base models, pad == eos ("<|endoftext|>"): the response mask
must therefore never be computed as `ids != pad` (that would drop the real EOS; see sample.py).
"""
import contextlib
import os
import random
import shutil

try:
    import fcntl  # POSIX: the build's lock (load_or_build)
except ImportError:  # Windows: no lock; two processes may both build, and the first copy is kept
    fcntl = None

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

EOS = "<|endoftext|>"
ALPHABET = "0123456789+-=?:\nQA \\boxed{}"  # every character a prompt or a solution uses
N_EVAL = 256  # held-out evaluation problems, never used for training
NAME = "tiny"  # this world's name: of its task, its dataset and its model (--dataset tiny, --model tiny)
# the repository's .cache/ (beside toyworld/): built models, reused by every later run
CACHE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache")


# --------------------------------------------------------------------------------------------------
# The task

def make_problem(rng: random.Random) -> str:
    """A random chain such as '7+8-9': 2 to 4 single-digit operands."""
    n = rng.randint(2, 4)
    q = str(rng.randint(0, 9))
    for _ in range(n - 1):
        q += rng.choice("+-") + str(rng.randint(0, 9))
    return q


def _steps(q: str):
    """Yield (left, op, right, result) for each step of the left-to-right evaluation of q."""
    value, i = int(q[0]), 1
    while i < len(q):
        op, right = q[i], int(q[i + 1])
        result = value + right if op == "+" else value - right
        yield value, op, right, result
        value, i = result, i + 2


def answer(q: str) -> str:
    """The gold answer, as a string: answer('7+8-9') == '6'."""
    return str(list(_steps(q))[-1][3])


def prompt(q: str) -> str:
    return f"Q:{q}=?\nA:"


def teacher_prompt(q: str, gold: str) -> str:
    """The prompt with the gold answer given as privileged context (RLSD's teacher, rlsd.py), in the world's own
    characters: the question line, then the answer as a solution ends it. teacher_prompt('7+8-9', '6') ==
    'Q:7+8-9=?\\boxed{6}\nA:'."""
    return f"Q:{q}=?\\boxed{{{gold}}}\nA:"


def solution(q: str) -> str:
    """The worked solution the warm start imitates (without EOS): '7+8=15\\n15-9=6\\n\\boxed{6}'."""
    lines = [f"{a}{op}{b}={c}" for a, op, b, c in _steps(q)]
    return "\n".join(lines) + "\n\\boxed{" + answer(q) + "}"


def eval_problems(seed: int = 1234, n: int = N_EVAL, make=make_problem) -> list:
    """The fixed held-out set: n distinct problems drawn with their own seed (make: another task's problem maker,
    tasks.py)."""
    rng, seen = random.Random(seed), []
    while len(seen) < n:
        q = make(rng)
        if q not in seen:
            seen.append(q)
    return seen


def train_problems(rng: random.Random, n: int, held_out: set, make=make_problem) -> list:
    """n training problems, none of them in the held-out set (rejection sampling; make: as eval_problems)."""
    out = []
    while len(out) < n:
        q = make(rng)
        if q not in held_out:
            out.append(q)
    return out


# --------------------------------------------------------------------------------------------------
# Tokenizer and model

def build_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character, as a byte-level BPE without merges, wrapped for transformers."""
    to_symbol = _byte_level_symbols()
    vocab = {EOS: 0}
    for ch in ALPHABET:
        vocab.setdefault(to_symbol[ch], len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS, padding_side="left")


def _byte_level_symbols() -> dict:
    """The GPT-2 byte-to-unicode table (the symbols ByteLevel writes), for the characters we use."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
          + list(range(ord("\xae"), ord("\xff") + 1)))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = {chr(b): chr(c) for b, c in zip(bs, cs)}
    return {ch: table[ch] for ch in ALPHABET}


def build_model(tokenizer, seed: int = 0) -> Qwen2ForCausalLM:
    """A Qwen2ForCausalLM (the Qwen2.5 class) with ~0.8M parameters, randomly initialised from seed."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=384, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    return Qwen2ForCausalLM(config)


# --------------------------------------------------------------------------------------------------
# Warm start: a short supervised pass, so that the model starts partly right

def sft_batch(tokenizer, problems: list, solutions: list = None):
    """Teacher-forcing batch: ids [B, L] (right-padded), labels [B, L] with -100 on the prompt and padding.
    solutions: the targets (default: solution(q) of each problem)."""
    rows = []
    for i, q in enumerate(problems):
        p = tokenizer(prompt(q))["input_ids"]
        s = tokenizer(solutions[i] if solutions else solution(q))["input_ids"] + [tokenizer.eos_token_id]
        rows.append((p + s, [-100] * len(p) + s))
    L = max(len(r[0]) for r in rows)
    ids = torch.full((len(rows), L), tokenizer.pad_token_id, dtype=torch.long)  # [B, L]
    labels = torch.full((len(rows), L), -100, dtype=torch.long)  # [B, L]
    for i, (x, y) in enumerate(rows):
        ids[i, :len(x)], labels[i, :len(y)] = torch.tensor(x), torch.tensor(y)
    return ids, labels


def warm_start(model, tokenizer, steps: int = 250, batch_size: int = 64, lr: float = 1e-3, seed: int = 0,
               progress=None, task=None) -> float:
    """Supervised next-token training on worked solutions of training problems (held-out set excluded).

    AdamW, 30 warm-up steps, then a constant learning rate. The defaults leave the model partly right (about half
    of the held-out set greedily): longer warm starts leave RL too little to do. The rate is left constant on
    purpose: a warm start annealed to 0 sat in a sharp spot that RL knocked down (docs/LOG.md, up to 2026-11-21).

    task: another task of tasks.py (its problems, and its solutions, drawn with their own RNG); None: this world.
    """
    make, solve = (task.make_problem, task.solution) if task else (make_problem, lambda q, rng: solution(q))
    rng, held_out = random.Random(seed), set(task.eval_problems() if task else eval_problems())
    style_rng = random.Random(seed + 1)  # the task's choice of solution style (the tiny world has one)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = lambda s: min(1.0, (s + 1) / 30)  # noqa: E731
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    model.train()
    for _ in (progress or (lambda x: x))(range(steps)):
        qs = train_problems(rng, batch_size, held_out, make)
        ids, labels = sft_batch(tokenizer, qs, [solve(q, style_rng) for q in qs])
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return loss.item()


def load_or_build(cache_dir: str = CACHE_DIR, seed: int = 0, task=None):
    """The tiny base model and tokenizer: built and warm-started on first use, then read from disk. task: another
    task of tasks.py, warm-started with its settings into its own directory (.cache/NAME-base-seedS).

    The directory is an ordinary HF checkpoint (AutoModelForCausalLM / AutoTokenizer open it). It is written
    to a temporary name and renamed, so a run killed while building leaves no half-written model behind.
    """
    path = os.path.join(cache_dir, f"{task.name if task else NAME}-base-seed{seed}")
    with one_builder(path):
        if not os.path.exists(os.path.join(path, "model.safetensors")):
            build(path, cache_dir, seed, task)
    model = Qwen2ForCausalLM.from_pretrained(path)
    return model, AutoTokenizer.from_pretrained(path), path


@contextlib.contextmanager
def one_builder(path: str):
    """Held while a process checks for, and if missing builds, the cached directory `path` (PATH.lock, flock): a
    process beside it (the suite's two workers, tools.compare --jobs 2) waits and then reads the finished copy,
    instead of building its own and replacing the first one's while that one is being read."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open_lock(path + ".lock") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process ends however it ends
        yield


def open_lock(file: str):
    """The lock file, opened to write, or else to read (another user's lock in a shared .cache: flock takes a file
    open to read as well, so the two still take turns); one that cannot be opened at all is one line naming it and
    its owner, not a PermissionError traceback."""
    try:
        return open(file, "a")
    except OSError as first:
        try:
            return open(file, "r")
        except OSError:
            pass
        raise SystemExit(f"{file}: the lock of a shared model build cannot be opened ({first.strerror or first}; "
                         f"{owner(file)}): ask its owner to make it readable (chmod a+r {file}), or work in a clone "
                         f"of your own (its .cache is yours)") from None


def owner(file: str) -> str:
    """Whose the file is, as a phrase."""
    try:
        uid = os.stat(file).st_uid
    except OSError:
        return "its owner unknown"
    try:
        import pwd
        return f"owned by {pwd.getpwuid(uid).pw_name}"
    except (ImportError, KeyError):
        return f"owned by user id {uid}"


def build(path: str, cache_dir: str, seed: int, task):
    """Build, warm-start and write the base model to path (load_or_build's first use)."""
    from tqdm import tqdm
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed)
    what = f"the {task.name} task's" if task else "the tiny"
    print(f"building {what} base model (once, cached in {path})")
    settings = dict(steps=task.warm_steps, batch_size=task.warm_batch, lr=task.warm_lr, task=task) if task else {}
    warm_start(model, tokenizer, seed=seed, progress=lambda r: tqdm(r, desc="warm start", leave=False), **settings)
    tmp = path + f".tmp{os.getpid()}"
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    umask = os.umask(0)
    os.umask(umask)
    for name in os.listdir(tmp):  # safetensors writes 0600: the mode of the user's other files instead
        os.chmod(os.path.join(tmp, name), 0o666 & ~umask)
    os.makedirs(cache_dir, exist_ok=True)
    if not os.path.exists(path):
        os.replace(tmp, path)
    else:  # a run beside this one built the same model first: its copy is kept, this one goes
        shutil.rmtree(tmp, ignore_errors=True)
