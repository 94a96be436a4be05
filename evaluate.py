"""Evaluation: greedy pass@1 (and the unbiased pass@k estimator) with the project's one sampler and grader.

evaluation.md: pass@1 from one greedy sample; pass@k unbiased, 1 - C(n-c, k) / C(n, k). train.py's held-out
evaluation of the tiny world goes through greedy_eval() here.
"""
from math import comb

import torch

import reward
import sample


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k).

    n = 5, c = 2, k = 2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7. If n - c < k every k-subset holds a correct one: 1.
    """
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got n = {n}")
    return 1.0 if n - c < k else 1.0 - comb(n - c, k) / comb(n, k)


@torch.no_grad()
def greedy_eval(model, tokenizer, prompts: list, golds: list, max_new_tokens: int, batch_size: int = 256) -> dict:
    """Greedy (temperature 0) pass@1 over prompts (strings) with gold answers. Returns accuracy, the mean
    response length in tokens, the share of responses with a \\boxed answer, the checker's counters, and the
    responses themselves."""
    stats, correct, lengths, texts = reward.new_stats(), [], [], []
    for i in range(0, len(prompts), batch_size):
        ids = [tokenizer(p)["input_ids"] for p in prompts[i:i + batch_size]]
        out = sample.generate(model, ids, n=1, max_new_tokens=max_new_tokens, temperature=0.0,
                              eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id)
        resp = out["input_ids"][:, out["prompt_len"]:]  # [n, T]
        texts += tokenizer.batch_decode(resp, skip_special_tokens=True)
        lengths += out["response_mask"].sum(-1).tolist()
    for text, gold in zip(texts, golds):
        ok = reward.is_correct(text, gold, stats)
        if ok is not None:  # an unparseable gold answer is counted in stats and left out
            correct.append(float(ok))
    return {
        "accuracy": sum(correct) / max(len(correct), 1),
        "n": len(correct),
        "response_len": sum(lengths) / max(len(lengths), 1),
        "boxed": 1 - stats["no_box"] / max(stats["graded"], 1),
        "checker": stats,
        "responses": texts,
    }
