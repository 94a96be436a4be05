"""OAR-P's weights (O1-O5, O2 a forward per reasoning token) of rollouts of train.py's first prompt, through
oar.batch_weights as methods.outcome_grounded calls it, in its two ways, taking turns: each perturbed copy from its
token on over its row's cache (share_rows, what train.py runs) and each over every column after its prompt;
seconds, the ratio, and how far apart their weights are. In float32, as train.py scores OAR."""
import time

from tools.perf.benchparts.machine import sync
from tools.perf.benchparts.table import Table, median, progress
from tools.perf.benchparts.workload import Workload


def oar_p_settings(w: Workload) -> dict:
    """OAR-P's own settings for this model and data (its rule's presets): oar_probe, oar_cue, oar_chunk."""
    import data
    import methods
    return methods.RULES["oar-p"].defaults(data.dataset(w.args.dataset), w.args.model)


def oar_p_rows(table: Table, w: Workload, repeat: int, rollouts: int = 2):
    """The two ways, taking turns `repeat` times (every other round in reverse order; no warm-up round: at a real
    length one run is minutes, and its first-call costs are not): median seconds and their ratio."""
    import torch
    import oar
    import sample
    a, s, tok = w.args, oar_p_settings(w), w.tok
    torch.manual_seed(0)
    with sample.autocast(a.device, a.bf16):
        batch = sample.generate(w.model, w.prompts[:1], n=rollouts, max_new_tokens=a.max_new_tokens,
                                temperature=a.temperature, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    _, _, texts = oar.rollouts(batch, tok, {})
    copies = sum(oar.reasoning_length(t) for t in texts)
    progress(f"oar-p: {rollouts} rollouts of the first prompt, {copies} reasoning tokens (copies), chunk "
             f"{s['oar_chunk']}")

    def weights(share_rows: bool):  # A_i = 1 for each: every rollout scored
        with sample.float32(w.model):
            return oar.batch_weights(w.model, batch, [enc(w.golds[0] + "}")] * rollouts, enc(s["oar_cue"]),
                                     torch.ones(rollouts, device=a.device), tok, {}, scorer="perturb",
                                     probe=s["oar_probe"], q=a.oar_q, beta=a.oar_beta, sigma=a.oar_sigma,
                                     chunk=s["oar_chunk"], share_rows=share_rows)  # [N, T]
    seconds, got = {False: [], True: []}, {}
    for r in range(repeat):
        for share in ((False, True) if r % 2 == 0 else (True, False)):
            sync(a.device)
            t0 = time.perf_counter()
            got[share] = weights(share)
            sync(a.device)
            seconds[share].append(time.perf_counter() - t0)
    plain, rows = median(seconds[False]), median(seconds[True])
    diff = (got[True] - got[False]).abs().max().item()
    table.row("oar-p", f"{rollouts} rollouts, {copies} copies from their token on, against from their prompt's end "
                       f"(weights apart {diff:.1e})", f"{rows:.1f} s", f"{plain:.1f} s", f"{plain / rows:.2f}x")
