"""OAR-P's scoring (O2: one forward per reasoning token) of rollouts of train.py's first prompt, in its two ways,
taking turns: each perturbed copy over every column after its prompt (the prompt-sharing forward), and each copy
from its perturbed token on over its row's cache (oar.perturbation_scores with share_rows, what train.py runs);
seconds, the ratio, and how far apart their scores are. In float32, as train.py scores OAR."""
import time

from tools.benchparts.machine import sync
from tools.benchparts.table import Table, median, progress
from tools.benchparts.workload import Workload


def oar_p_settings(w: Workload) -> dict:
    """OAR-P's own settings for this model and data (its rule's presets): oar_probe, oar_cue, oar_chunk."""
    import data
    import methods
    return methods.RULES["oar-p"].defaults(data.dataset(w.args.dataset), w.args.model)


def oar_p_inputs(w: Workload, rollouts: int):
    """OAR's scoring rows (oar.build_inputs) of `rollouts` responses sampled from the first prompt at the setting's
    length and temperature, as methods.outcome_grounded builds them: the reasoning, the cue, the gold answer."""
    import torch
    import oar
    import sample
    a, tok = w.args, w.tok
    torch.manual_seed(0)
    with sample.autocast(a.device, a.bf16):
        batch = sample.generate(w.model, w.prompts[:1], n=rollouts, max_new_tokens=a.max_new_tokens,
                                temperature=a.temperature, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    prompts, responses, texts = oar.rollouts(batch, tok, {})
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    answer = enc(w.golds[0] + "}")  # O1's teacher-forced answer
    lengths = [oar.reasoning_length(t) for t in texts]
    ids, attn, reason, probe, P = oar.build_inputs(prompts, responses, lengths, enc(oar_p_settings(w)["oar_cue"]),
                                                   [answer] * rollouts, tok.pad_token_id)
    dev = a.device
    return ids.to(dev), attn.to(dev), reason.to(dev), probe.to(dev), P


def oar_p_rows(table: Table, w: Workload, repeat: int, rollouts: int = 2):
    """The two ways of OAR-P's scoring, taking turns `repeat` times (every other round in reverse order; no warm-up
    round: at a real length one run is minutes, and its first-call costs are not): median seconds, their ratio."""
    import torch
    import oar
    import sample
    from infra import fastpath
    a, s = w.args, oar_p_settings(w)
    ids, attn, reason, probe, P = oar_p_inputs(w, rollouts)
    progress(f"oar-p: {rollouts} rollouts of the first prompt, {int(reason.sum())} reasoning tokens (copies), "
             f"{ids.shape[1]} columns, chunk {s['oar_chunk']}")
    groups = torch.zeros(len(ids), dtype=torch.long, device=ids.device)  # one prompt

    def score(share_rows: bool):
        with sample.float32(w.model):
            fast = fastpath.prompt_sharing(w.model, ids, attn, sample.position_ids(attn), P, groups)
            return oar.perturbation_scores(w.model, ids, attn, reason, probe, w.tok.pad_token_id, s["oar_probe"],
                                           s["oar_chunk"], fast, share_rows=share_rows)
    w.model.eval()
    seconds, scores = {False: [], True: []}, {}
    for r in range(repeat):
        for share in ((False, True) if r % 2 == 0 else (True, False)):
            sync(a.device)
            t0 = time.perf_counter()
            scores[share] = score(share)
            sync(a.device)
            seconds[share].append(time.perf_counter() - t0)
    plain, rows = median(seconds[False]), median(seconds[True])
    diff = (scores[True] - scores[False]).abs().max().item() / max(scores[False].abs().max().item(), 1e-30)
    table.row("oar-p", f"{rollouts} rollouts, {int(reason.sum())} copies from their token on, against from their "
                       f"prompt's end (scores apart {diff:.1e})", f"{rows:.1f} s", f"{plain:.1f} s",
              f"{plain / rows:.2f}x")
