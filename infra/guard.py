"""The optimizer step that never puts a NaN or an infinity into the weights or AdamW's moments: such an update is
skipped (a loss or a gradient that is not finite) or undone bit for bit (a finite gradient that still overflows),
and counted by the loop (nonfinite_updates). Bookkeeping, not RL: train.py calls step() where the paper says
"update"."""
import math

import torch


def step(model, optimizer, grad_clip: float, loss) -> tuple:
    """The update of an accumulated gradient: its global norm clipped to grad_clip, then optimizer.step() unless the
    loss or the gradient is not finite, undone if it leaves a weight or a moment that is not finite. Returns (the
    gradient's norm before clipping, why the update was not kept, or None when it was)."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip).item()
    if not (math.isfinite(norm) and torch.isfinite(loss)):
        return norm, "the loss or the gradient is not finite; this update is skipped"
    if not step_if_finite(optimizer, bound=norm):  # an L2 norm is at least the largest |g|
        return norm, "the update left a weight or an AdamW moment that is not finite; it is undone"
    return norm, None


def step_if_finite(optimizer, bound: float = None) -> bool:
    """optimizer.step(), undone bit for bit when it leaves a weight or an AdamW moment that is not finite: whether
    the update was kept. A finite gradient can still overflow: its square in the second moment (above 1.8e19 in
    float32), or a learning rate so large that the step passes float32's range (unfused AdamW then raises, having
    already updated the moments; fused AdamW writes the infinity, which the check below finds). What such a step
    changes is copied to the CPU first, so GPU memory does not double. bound: a number at least the largest |g| of
    any gradient (step() passes the gradient's norm); None: read from the gradients."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    # The usual case needs no copy: AdamW moves a weight by at most about lr (Kingma & Ba's bound, with betas
    # (0.9, 0.99)), and its moments stay below the largest gradient (squared). Only a gradient or a step size near
    # float32's range can overflow, and only then is the state copied (12 bytes a trained parameter).
    if bound is None:  # aminmax: no temporary |g| of each gradient's size (a 0.5B's embeddings': 544 MB)
        ends = [torch.aminmax(p.grad) for p in params if p.grad is not None]
        bound = torch.stack([torch.maximum(-lo, hi) for lo, hi in ends]).max().item() if ends else 0.0
    if bound < 1e18 and all(group["lr"] <= 1 for group in optimizer.param_groups):
        optimizer.step()
        return True
    copy = lambda t: t.detach().to("cpu", copy=True) if torch.is_tensor(t) else t  # noqa: E731
    saved = {p: (copy(p), {k: copy(v) for k, v in optimizer.state[p].items()} if p in optimizer.state else None)
             for p in params}
    try:
        optimizer.step()
        changed = params + [v for p in params if p in optimizer.state for v in optimizer.state[p].values()
                            if torch.is_tensor(v)]
        if all(torch.isfinite(t).all() for t in changed):
            return True
    except RuntimeError as e:  # "value cannot be converted to type float without overflow"
        if "overflow" not in str(e):
            raise
    with torch.no_grad():
        for p, (weights, state) in saved.items():
            p.copy_(weights)
            if state is None:  # the first step made this state: there was none before it
                optimizer.state.pop(p, None)
            for k, v in (state or {}).items():  # copied into place: each tensor stays on its device
                optimizer.state[p][k] = optimizer.state[p][k].copy_(v) if torch.is_tensor(v) else v
    return False
