"""--responses: answers made elsewhere (JSON lines of question, answer and response), each checked as it is read
(given_fields: one bad line is skipped and named), then located and scored as one given answer beside a right one
(run_given, scored_batch). They have no group, so only the rules that need none (methods.Rule.needs_group) score them.
"""
import json
import sys

import torch

import data
import epicprm
import methods
import reward
import sample
from tools.attribution.locate import World, blames, exact_step, locate, record


def load_responses(args) -> list:
    """The given answers of --responses in order, their first --limit; a line without a question, an answer
    and a response as text is skipped and named on stderr."""
    rows, skipped, k = [], [], 0
    for k, line in enumerate(open(args.responses), 1):
        why, got = given_fields(line)
        if why is None:  # a lone surrogate: one bad row, as in every loader
            why = next((f"{data.not_unicode(t)} in the {f}" for f, t in got.items() if data.not_unicode(t)), None)
        if why:
            skipped.append(f"{args.responses}:{k}: skipped ({why})")
            print(skipped[-1], file=sys.stderr)
            continue
        rows.append({**got, "where": f"{args.responses}:{k}"})
    if not rows:  # said before the model loads, and nothing written
        sys.exit(f"--responses {args.responses}: no usable line (of {k}; each needs a question, an answer and a "
                 f"response)" + (f": {skipped[0]}" if skipped else ""))
    return rows[:args.limit]


def given_fields(line: str):
    """(why not, fields) of a --responses line: its question, answer and response as text. A number is taken as
    its text (an answer of 42), anything else (null, a list, true) is not: str() made null the answer "None"."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        return f"not JSON: {e}", None
    if not isinstance(row, dict):
        return f"a JSON {type(row).__name__}, not an object with question, answer and response", None
    got = {}
    for f in ("question", "answer", "response"):
        v = row.get(f)
        if f not in row:
            return f"no {f}", None
        if isinstance(v, (int, float)) and not isinstance(v, bool) and f == "answer":
            v = str(v)
        if not isinstance(v, str):
            return f"its {f} is {json.dumps(v)}, not text", None
        got[f] = v
    return None, got


def run_given(world: World, i: int, problem: dict, write, scored: dict) -> dict:
    """--responses: locate the given answer's first wrong step, and score it by the rules that need no group: the
    answer paired with a right one ("\\boxed{gold}") so that its advantage is negative, as in a mixed group."""
    a = world.args
    prompt = world.tok(problem["prompt"])["input_ids"]
    ids = world.tok(problem["response"], add_special_tokens=False)["input_ids"]
    line = {"problem": i, "done": True, "correct": int(reward.is_correct(problem["response"], problem["answer"])
                                                        is True), "group": 1, "given": True}
    if line["correct"]:
        return {**line, "mixed": False}
    if len(epicprm.steps(world.piece_list(ids))) < 2:
        return {**line, "mixed": False, "one_step": 1}
    torch.manual_seed(a.seed * 100_003 + i)
    v0 = world.values([(prompt, problem["answer"])], [[]])[0]
    line.update(mixed=True, v0=v0, wrong=1, one_step=0)
    if v0 == 0:
        return line
    (loc,) = locate(world, [(prompt, problem["answer"], ids, v0)])
    right = world.tok(f"\\boxed{{{problem['answer']}}}", add_special_tokens=False)["input_ids"]
    batch = scored_batch(world, prompt, [ids, right])
    rules = [r for r in a.rules if not methods.RULES[r].needs_group]
    blame = blames(world, batch, problem, [False, True], rules)
    write(record(world, i, 0, problem, ids, loc, v0, {r: b[0] for r, b in blame.items()},
                 exact_step(world, problem, ids, loc.spans)))
    return {**line, "located": 1}


def scored_batch(world: World, prompt: list, responses: list, chunk_tokens: int = 256) -> dict:
    """Given responses (token-id lists) of one prompt in sample.generate()'s layout, each ended by EOS, with the
    log-prob and entropy of each token at the temperature from one forward (what the sampler would have kept).
    The output layer runs chunk_tokens response tokens at a time (a model whose config transforms its logits,
    sample.plain_head: all at once). Whole, the logits of every column and three float32 [rows, response,
    vocabulary] tensors (log-softmax, exp, product) took about 2.9 GB at once for the 1.5B's 2 rows of 300 + 513
    tokens, where a run capped at 20 GB failed (issue 65); a chunk of 256 tokens, about 0.5 GB."""
    eos, pad, T = world.tok.eos_token_id, world.tok.pad_token_id, max(len(r) for r in responses) + 1
    rows = [r + [eos] + [pad] * (T - len(r) - 1) for r in responses]
    ids = torch.tensor([prompt + r for r in rows], device=world.args.device)
    mask = torch.tensor([[1] * (len(r) + 1) + [0] * (T - len(r) - 1) for r in responses], device=ids.device)
    attn = torch.cat([torch.ones(len(rows), len(prompt), dtype=torch.long, device=ids.device), mask], 1)
    model, targets = world.model, ids[:, len(prompt):]  # [N, T]
    with torch.no_grad():
        if sample.plain_head(model):
            h = model.get_decoder()(input_ids=ids, attention_mask=attn).last_hidden_state[:, len(prompt) - 1:-1]
            h, head = h.reshape(-1, h.shape[-1]), model.get_output_embeddings()  # [N*T, H]
            logits = lambda s: head(h[s:s + chunk_tokens])  # noqa: E731  [c, V]
        else:
            whole = model(input_ids=ids, attention_mask=attn).logits[:, len(prompt) - 1:-1]  # [N, T, V]
            logits = lambda s: whole.reshape(-1, whole.shape[-1])[s:s + chunk_tokens]  # noqa: E731
        flat, chosen, ent = targets.reshape(-1), [], []
        for s in range(0, len(flat), chunk_tokens):
            logp = torch.log_softmax(logits(s).float() / world.args.temperature, -1)  # [c, V]
            chosen.append(logp.gather(-1, flat[s:s + chunk_tokens, None]).squeeze(-1))  # [c]
            ent.append(-(logp.exp() * logp).sum(-1))  # [c]
        chosen, ent = torch.cat(chosen).view(targets.shape), torch.cat(ent).view(targets.shape)  # [N, T]
    return {"input_ids": ids, "attention_mask": attn, "response_mask": mask, "prompt_len": len(prompt),
            "truncated": torch.zeros(len(rows), dtype=torch.bool), "logprobs": chosen * mask, "entropy": ent * mask}
