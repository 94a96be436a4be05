"""An independent second opinion on evaluate.py: the same prompts answered by transformers' own `generate` (greedy)
and graded by math-verify directly, then compared with what evaluate.py wrote, problem by problem.

    python evaluate.py --model qwen2.5-coder-1.5b --benchmarks gsm8k,math500 --limit 50 --bf16 --out runs/e.json
    python -m tools.check_eval runs/e.json --threads 2

Nothing here uses the project's sampler (sample.py) or grader (reward.py): what they share with evaluate.py is only
the model's files and the prompts (data.py), so that a verdict that differs points at one of the two paths. The
settings (model, precision, token budget, batch size) are read from evaluate.py's JSON. Grading follows
math-verify's README: the gold answer parsed as `$gold$`, the response with math-verify's own extraction (its
LaTeX and expression matchers, a \\boxed{} first), then verify(gold, prediction).

It prints, per benchmark, how many verdicts agree and how many responses are the same text, then every problem
where the verdicts differ, with both answers' endings; and writes that comparison beside the input
(FILE.check.json).
"""
import json
import os
import time

import torch
from tqdm import tqdm

import data
from infra import cli, cpu, models


def generate(model, tokenizer, prompts: list, max_new_tokens: int, batch_size: int) -> list:
    """Greedy responses of transformers' generate, batched by prompt length as evaluate.py batches them."""
    from transformers import GenerationConfig
    greedy = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id)  # no repetition penalty or other extras
    ids = [tokenizer(p)["input_ids"] for p in prompts]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    texts = [None] * len(ids)
    for s in tqdm(range(0, len(order), batch_size), desc="generate", leave=False):
        idx = order[s:s + batch_size]
        width = max(len(ids[i]) for i in idx)
        batch = torch.tensor([[tokenizer.pad_token_id] * (width - len(ids[i])) + ids[i] for i in idx])
        mask = torch.tensor([[0] * (width - len(ids[i])) + [1] * len(ids[i]) for i in idx])
        with torch.no_grad():
            out = model.generate(input_ids=batch, attention_mask=mask, generation_config=greedy)
        for i, row in zip(idx, tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)):
            texts[i] = row
    return texts


def grade(response: str, gold: str):
    """math-verify's verdict, used as its README shows; None when the gold answer does not parse."""
    from math_verify import parse, verify
    gold_parsed = parse(f"${gold}$")
    if not gold_parsed:
        return None
    return bool(verify(gold_parsed, parse(response)))


def tail(text: str, n: int = 160) -> str:
    return ("..." if len(text) > n else "") + text[-n:].replace("\n", " ")


def main(argv=None):
    p = cli.Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("result", help="the JSON file evaluate.py wrote (its settings are reused)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    p.add_argument("--limit", type=int, default=None,
                   help="check only the first N problems of each benchmark (generate keeps a finished row in its "
                        "batch until the longest one ends, so one runaway answer costs a whole batch its length)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="prompts per generate call (default: evaluate.py's); a different batch pads differently, "
                        "which can move a bf16 greedy answer by a token")
    args = p.parse_args(argv)
    saved = json.load(open(args.result))
    settings = saved["settings"]
    if settings.get("k", 1) != 1:
        p.error(f"{args.result}: evaluated with --k {settings['k']}; this checks the greedy answers only")
    cpu.setup(args.threads)
    model, tokenizer, _ = models.load_model(settings["model"])
    model.to(dtype=torch.bfloat16 if settings.get("bf16") else None).eval()
    report = {}
    for name, row in saved["results"].items():
        if "problems" not in row:  # the average
            continue
        problems = row["problems"][:args.limit]
        rows, _ = data.load(name, "test", settings["data_dir"], settings["limit"])
        by_where = {r["where"]: r for r in rows}
        prompts = [data.dataset(name).prompt(tokenizer, by_where[q["where"]]) for q in problems]
        t0 = time.time()
        texts = generate(model, tokenizer, prompts, settings["max_new_tokens"],
                         args.batch_size or settings["batch_size"])
        seconds = time.time() - t0
        verdicts = [grade(t, q["gold"]) for t, q in zip(texts, problems)]
        differ = [{"where": q["where"], "gold": q["gold"], "ours": q["correct"], "math_verify": v,
                   "same_text": q["greedy"] == t, "ours_tail": tail(q["greedy"]), "generate_tail": tail(t)}
                  for q, t, v in zip(problems, texts, verdicts) if v != q["correct"]]
        report[name] = {"n": len(problems), "agree": len(problems) - len(differ),
                        "same_text": sum(q["greedy"] == t for q, t in zip(problems, texts)),
                        "ours_correct": sum(bool(q["correct"]) for q in problems),
                        "math_verify_correct": sum(bool(v) for v in verdicts), "generate_seconds": seconds,
                        "disagreements": differ}
        r = report[name]
        print(f"{name}: verdicts agree on {r['agree']}/{r['n']}, same text {r['same_text']}/{r['n']}; correct: "
              f"ours {r['ours_correct']}, generate + math-verify {r['math_verify_correct']} "
              f"({seconds / 60:.1f} minutes of generate)")
        for d in differ:
            print(f"  {d['where']}: gold {d['gold']!r}, ours {d['ours']}, math-verify {d['math_verify']}, same text "
                  f"{d['same_text']}\n    ours:     {d['ours_tail']}\n    generate: {d['generate_tail']}")
    out = os.path.splitext(args.result)[0] + ".check.json"
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
