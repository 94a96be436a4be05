"""Evaluation (EQUATIONS.md#evaluation-protocol): greedy pass@1, avg@k and unbiased pass@k on the papers' benchmarks.

    python evaluate.py --model DIR --benchmarks math500,aime24,aime25,amc23,minerva,olympiadbench,gsm8k
    python evaluate.py --model runs/ktae-seed0/checkpoint --benchmarks tiny --k 8 --temperature 1.0 --threads 2

Each evaluation writes its own JSON file, named after the model, the benchmarks and the settings that change the
numbers (runs/eval-MODEL-BENCHMARKS-SETTINGS.json, e.g. runs/eval-tiny-tiny-greedy-t48.json); an existing
file is never replaced: a second one gets -2, -3, ... (or pass --out, and --overwrite to replace it).

Responses come from the project's one sampler (sample.py, as in train.py) and are graded by reward.py. The
table is printed and a JSON file written with, per benchmark and on average: the number of problems, greedy
pass@1, avg@k and pass@k (when --k > 1), the mean response length, the share of responses with a \\boxed answer,
the checker's timeouts and parse failures, and the settings. train.py's held-out evaluation of the tiny world
calls score() below.
"""
import collections
import json
import os
import sys
import time
from math import comb

import torch
from tqdm import tqdm

import data
import reward
import sample
from config import shared
from infra import checkpoint, cli, cpu, models

# the papers' seven benchmarks, in the order they report them
BENCHMARKS = ["math500", "aime24", "aime25", "amc23", "minerva", "olympiadbench", "gsm8k"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k).

    n = 5, c = 2, k = 2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7. If n - c < k every k-subset holds a correct one: 1.
    """
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got n = {n}")
    return 1.0 if n - c < k else 1.0 - comb(n - c, k) / comb(n, k)


@torch.no_grad()
def score(model, tokenizer, prompts: list, golds: list, *, k: int = 1, temperature: float = 0.0,
          max_new_tokens: int, batch_size: int = 64, desc: str = None) -> dict:
    """k responses per prompt (greedy when temperature is 0), graded against the gold answers.

    Returns accuracy (the mean share of correct responses per problem: pass@1 when greedy, avg@k when sampled),
    pass@k (unbiased, equal to the share of problems with any correct response when k = n), n (problems graded;
    one whose gold answer the checker cannot parse is counted in checker['gold_unparseable'] and left out), the
    mean response length in tokens, the share of responses with a \\boxed answer, the checker's counters, how
    often the model's context shortened a prompt or the token budget, and the responses in prompt order (k each)
    with their verdicts (True, False; None where the gold answer cannot be parsed) and lengths in tokens.
    """
    if temperature == 0 and k > 1:
        raise ValueError("greedy decoding gives the same response k times: use --temperature > 0 with --k > 1")
    ids = [tokenizer(p)["input_ids"] for p in prompts]
    # A model is not asked to go past the context it was built for (Qwen2.5-Math: 4096 positions, room for the
    # protocol's 3000 new tokens; the tiny model: 256). A prompt longer than half of it keeps its end (the
    # instruction and the question's last part); both cuts are counted and reported.
    ctx = getattr(model.config, "max_position_embeddings", None) or 10**9
    cut = sum(len(i) > ctx // 2 for i in ids)
    ids = [i[-(ctx // 2):] for i in ids]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # similar lengths share a batch: less padding
    texts, lengths, capped = [None] * len(ids), [0] * len(ids), 0
    # a batch of a real model may decode for half an hour: the bar counts problems, and the tokens decoded a second
    # while a batch runs (each decode step adds a token to each of its rows)
    bar = tqdm(total=len(order), desc=desc, disable=desc is None, leave=False, unit="problem")
    t0, decoded = time.time(), 0
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        budget = min(max_new_tokens, ctx - max(len(ids[i]) for i in idx))
        capped += budget < max_new_tokens

        def step(rows=len(idx) * k):
            nonlocal decoded
            decoded += rows
            bar.set_postfix_str(f"~{decoded / max(time.time() - t0, 1e-9):.0f} tokens/s", refresh=False)
            bar.refresh()
        out = sample.generate(model, [ids[i] for i in idx], n=k, max_new_tokens=budget, temperature=temperature,
                              eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
                              on_token=step if desc is not None else None)
        bar.update(len(idx))
        resp = tokenizer.batch_decode(out["input_ids"][:, out["prompt_len"]:], skip_special_tokens=True)
        n_tok = out["response_mask"].sum(-1).tolist()  # [len(idx) * k]
        for j, i in enumerate(idx):
            texts[i], lengths[i] = resp[j * k:(j + 1) * k], n_tok[j * k:(j + 1) * k]
    bar.close()
    stats, per_problem, all_verdicts = reward.new_stats(), [], []
    for responses, gold in zip(texts, golds):
        verdicts = [reward.is_correct(r, gold, stats) for r in responses]
        all_verdicts += verdicts
        if None not in verdicts:  # None: the gold answer itself is unparseable (counted in stats)
            per_problem.append(sum(verdicts))
    n = max(len(per_problem), 1)
    return {
        "accuracy": sum(c / k for c in per_problem) / n,
        f"pass@{k}": sum(pass_at_k(k, c, k) for c in per_problem) / n,
        "n": len(per_problem),
        "response_len": sum(sum(l) for l in lengths) / max(k * len(lengths), 1),
        "boxed": 1 - stats["no_box"] / max(stats["graded"], 1),
        "checker": stats,
        "prompts_cut": cut,  # prompts longer than half the model's context, kept from their end
        "batches_capped": capped,  # batches whose new-token budget the context shortened
        "responses": [r for rs in texts for r in rs],
        "verdicts": all_verdicts,
        "lengths": [n for ns in lengths for n in ns],
    }


def load_benchmark(name: str, args):
    """A benchmark's problems, read before the model loads: (problems, skipped, notes) as data.load gives them. A
    row that cannot be read or used is skipped and reported with its file and line; a benchmark left with none
    fails here in one line (an evaluation of nothing would print a table of zeros and exit 0)."""
    notes = collections.Counter()
    problems, skipped = data.load(name, "test", args.data_dir, args.limit, notes=notes, flag="--benchmarks")
    if not problems:
        no_problem(name, "usable problem", skipped)
    return problems, skipped, notes


def encodable(name: str, loaded: tuple, tokenizer) -> tuple:
    """loaded (load_benchmark's) without the rows whose text the tokenizer cannot encode (the tiny model's small
    alphabet): they are skipped and reported like unusable rows; what was filled in is counted (data.report)."""
    data.check_prompts(data.dataset(name), tokenizer, f"--benchmarks {name}")
    problems, skipped, notes = loaded
    problems, unencodable = data.drop_unencodable(problems, tokenizer)
    if not problems:
        no_problem(name, "problem the tokenizer can encode", unencodable)
    return problems, skipped + unencodable, notes


def no_problem(name: str, what: str, skipped: list):
    more = f" (and {len(skipped) - 1} more rows skipped)" if len(skipped) > 1 else ""
    sys.exit(f"--benchmarks {name}: no {what}" + (f": {skipped[0]}{more}" if skipped else ""))


def run_benchmark(model, tokenizer, name: str, loaded: tuple, args) -> dict:
    """One benchmark: greedy pass@1, and avg@k / pass@k from k samples at --temperature when --k > 1. loaded:
    encodable()'s problems, skipped rows and notes."""
    problems, skipped, notes = loaded
    summary = data.report(name, problems, skipped, notes)
    prompts = [data.dataset(name).prompt(tokenizer, p) for p in problems]
    golds = [p["answer"] for p in problems]
    t0 = time.time()
    greedy = score(model, tokenizer, prompts, golds, max_new_tokens=args.max_new_tokens,
                   batch_size=args.batch_size, desc=f"{name} greedy")
    row = {"n": greedy["n"], "rows_skipped": len(skipped), "pass@1": greedy["accuracy"],
           "response_len": greedy["response_len"], "boxed": greedy["boxed"],
           "timeouts": greedy["checker"]["timeouts"], "malformed": greedy["checker"]["malformed"],
           "prompts_cut": greedy["prompts_cut"], "batches_capped": greedy["batches_capped"],
           "parse_failures": greedy["checker"]["gold_unparseable"] + greedy["checker"]["errors"]}
    # every problem's greedy response and verdict, for a reader to look at and a second grader to check
    # (tools/check_eval.py)
    per_problem = [{"where": p["where"], "gold": g, "greedy": r, "correct": v, "tokens": n}
                   for p, g, r, v, n in zip(problems, golds, greedy["responses"], greedy["verdicts"],
                                            greedy["lengths"])]
    if args.k > 1:
        torch.manual_seed(args.seed)
        sampled = score(model, tokenizer, prompts, golds, k=args.k, temperature=args.temperature,
                        max_new_tokens=args.max_new_tokens, batch_size=max(1, args.batch_size // args.k),
                        desc=f"{name} {args.k} samples")
        row[f"avg@{args.k}"], row[f"pass@{args.k}"] = sampled["accuracy"], sampled[f"pass@{args.k}"]
        row["timeouts"] += sampled["checker"]["timeouts"]
        row["malformed"] += sampled["checker"]["malformed"]
        row["parse_failures"] += sampled["checker"]["gold_unparseable"] + sampled["checker"]["errors"]
    row["seconds"] = time.time() - t0
    row["problems"] = per_problem
    row["loaded"] = summary  # data.report's line: rows loaded, skipped (and why), fallbacks taken
    return row


def table(results: dict, k: int) -> str:
    """The printed table: one line per benchmark and the unweighted average over them (as the papers report)."""
    cols = (["n", "pass@1"] + ([f"avg@{k}", f"pass@{k}"] if k > 1 else [])
            + ["response_len", "boxed", "timeouts", "malformed", "parse_failures"])
    lines = [f"{'benchmark':15s}" + "".join(f"{c:>15s}" for c in cols)]
    for name, row in results.items():
        cells = [f"{row[c]:15d}" if isinstance(row[c], int) else f"{row[c]:15.3f}" for c in cols]
        lines.append(f"{name:15s}" + "".join(cells))
    return "\n".join(lines)


def _slug(text: str) -> str:
    """A file-name-safe piece: 'runs/ktae-seed0/checkpoint/' -> 'runs_ktae-seed0_checkpoint'."""
    keep = "".join(c if c.isalnum() or c in "-_." else "_" for c in text.strip("/").replace(os.sep, "_"))
    return keep.strip("._") or "x"


def default_out(args, names: list) -> str:
    """runs/eval-MODEL-BENCHMARKS-SETTINGS.json: every setting that changes the numbers is in the name (k,
    temperature and seed when sampled, the token budget, --limit), a .jsonl benchmark by its file name."""
    bench = "+".join(_slug(os.path.splitext(os.path.basename(b))[0]) if b.endswith(".jsonl") else b for b in names)
    if len(bench) > 60:
        bench = bench[:60]
    parts = [_slug(args.model), bench, f"k{args.k}-temp{args.temperature:g}-seed{args.seed}" if args.k > 1
             else "greedy", f"t{args.max_new_tokens}"] + ([f"limit{args.limit}"] if args.limit else [])
    return os.path.join("runs", "eval-" + "-".join(parts) + ".json")


def free_path(path: str) -> str:
    """path, or path with -2, -3, ... before .json if it exists: an evaluation never replaces another."""
    stem, ext = os.path.splitext(path)
    n = 2
    while os.path.exists(path):
        path, n = f"{stem}-{n}{ext}", n + 1
    return path


def check_args(p, args) -> list:
    """Every flag checked before the model loads, each in one argparse line: the shared ones (config/shared.py), the
    counts, a sampling temperature when --k > 1, the benchmarks (an unknown name, a file that is not there), and
    a place the results can be written (an evaluation that ran an hour must not fail at its last line). Returns
    the benchmark names."""
    with shared.as_errors_of(p):
        shared.check_shared(args)
        shared.check_seed(args.seed)
        shared.at_least(args, {"limit": 1, "batch_size": 1, "max_new_tokens": 1, "k": 1})
    if args.k > 1 and not args.temperature >= shared.MIN_TEMPERATURE:
        p.error(f"--temperature {args.temperature}: must be at least {shared.MIN_TEMPERATURE} with --k {args.k} "
                f"(the k samples; greedy pass@1 is always reported)")
    names = [b.strip() for b in args.benchmarks.split(",") if b.strip()]
    if not names:
        p.error(f"--benchmarks {args.benchmarks!r}: names no benchmark")
    twice = sorted({b for b in names if names.count(b) > 1})
    if twice:  # results are keyed by name: a repeat would print one row but weigh twice in the average
        p.error(f"--benchmarks {args.benchmarks}: {', '.join(twice)} given twice")
    for b in names:
        try:  # an unknown name or a file that is not there fails now, in one line, before the model is loaded
            data.locate(b, "test", args.data_dir, "--benchmarks")
        except SystemExit as e:
            p.error(str(e))
    if args.out and os.path.isdir(args.out):
        p.error(f"--out {args.out}: a folder; name a .json file")
    if args.out and os.path.exists(args.out) and not args.overwrite:
        p.error(f"--out {args.out} exists: pass --overwrite to replace it, or choose another file")
    try:
        checkpoint.writable_dir(os.path.dirname(args.out or default_out(args, names)) or ".", "--out")
        # a disk too full for the results file is said now, not after the whole benchmark has run
        checkpoint.check_room(os.path.dirname(args.out or default_out(args, names)) or ".", RESULTS_ROOM,
                              "--out's results file", advice="free space, or choose another --out")
    except SystemExit as e:
        p.error(str(e))
    return names


RESULTS_ROOM = 1 << 20  # bytes of free disk the results file needs (a few KiB: their counts, not the responses)


def main(argv=None):
    p = cli.Parser(description="greedy pass@1, avg@k and pass@k on the math benchmarks")
    shared.add_shared_flags(p)  # --model, --data-dir, --device, --bf16, --threads: as train.py's
    p.add_argument("--benchmarks", default=",".join(BENCHMARKS),
                   help=f"comma-separated: {', '.join(data.DATASETS)} (tiny, chain and arith: their held-out sets), "
                        f"or .jsonl files")
    p.add_argument("--limit", type=int, default=None, help="first N problems of each benchmark")
    p.add_argument("--out", default=None, help="JSON file (default: runs/eval-MODEL-BENCHMARKS-SETTINGS.json, "
                                               "never replacing an existing one: -2, -3, ... is added)")
    p.add_argument("--overwrite", action="store_true", help="replace the --out file if it exists")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="response token budget (default: 3000, the papers' protocol; 48 for the tiny model and "
                        "its checkpoints, as in train.py: their context is 256 positions, an answer about 30 tokens)")
    p.add_argument("--batch-size", type=int, default=64, help="responses generated together")
    # sampled answers, besides the greedy one
    p.add_argument("--k", type=int, default=1, help="samples per problem for avg@k and pass@k (1: greedy only)")
    p.add_argument("--temperature", type=shared.number, default=0.6, help="for the k samples (greedy pass@1 uses 0)")
    p.add_argument("--seed", type=int, default=0, help="of the k samples")
    args = p.parse_args(argv)
    names = check_args(p, args)
    cpu.setup(args.threads)
    # the benchmarks are read, and checked against the tokenizer, before the model's minutes of loading
    tokenizer = models.load_tokenizer(args.model)
    loaded = {name: encodable(name, load_benchmark(name, args), tokenizer) for name in names}
    model, tokenizer, _ = models.load_model(args.model)
    models.check_finite(model, args.model)
    # --bf16: nothing trains here, so the weights themselves are held in bf16 (config/shared.py)
    model.to(args.device, dtype=torch.bfloat16 if args.bf16 else None).eval()
    if args.max_new_tokens is None:  # the tiny world's context (256) has no room for 3000
        args.max_new_tokens = 48 if (getattr(model.config, "max_position_embeddings", 0) or 10**9) <= 256 else 3000
    results = {}
    for name in names:
        results[name] = run_benchmark(model, tokenizer, name, loaded[name], args)
    counts = ("n", "rows_skipped", "timeouts", "malformed", "parse_failures", "prompts_cut", "batches_capped",
              "seconds")
    rates = [c for c in results[names[0]] if c not in counts + ("problems", "loaded")]
    results["average"] = {c: sum(results[b][c] for b in names) / len(names) for c in rates}  # unweighted
    results["average"].update({c: sum(results[b][c] for b in names) for c in counts})  # totals
    print(table(results, args.k))
    for b in names:
        if results[b]["prompts_cut"] or results[b]["batches_capped"]:
            print(f"note: {b}: the model's context ({model.config.max_position_embeddings} positions) is shorter "
                  f"than prompt + --max-new-tokens {args.max_new_tokens}: it cut {results[b]['prompts_cut']} "
                  f"prompts (kept from their end) and gave {results[b]['batches_capped']} batches a smaller token "
                  f"budget (responses may end early; a smaller --max-new-tokens removes this note)")
    out = args.out or free_path(default_out(args, names))
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    settings = dict(vars(args))
    settings["template"] = "chat template" if getattr(tokenizer, "chat_template", None) else "plain + instruction"
    worlds = [b for b in names if data.dataset(b).world is not None]
    settings["template"] += f"; {', '.join(worlds)}: the tiny world's own Q:/A: prompt" if worlds else ""
    tmp = out + f".tmp{os.getpid()}"  # whole or not at all: a cut file would block the rerun (--out exists)
    try:
        with open(tmp, "w") as f:
            json.dump({"settings": settings, "results": results}, f, indent=1)
        os.replace(tmp, out)
    except OSError as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        sys.exit(f"--out {out}: cannot be written ({e.strerror or e}); nothing was written there, the table above "
                 f"holds the results")
    print(f"wrote {out}")
    return results


if __name__ == "__main__":
    main()
