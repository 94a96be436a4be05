"""What a person looks at: token heat maps as HTML (the KTAE paper's case-study figure) and training curves.

token_heatmap() colours every token of every rollout of one group by a per-token value, in pastel backgrounds
with a coloured underline so that the text stays readable: green above the centre, red below, the intensity
proportional to |value - centre| / scale, the exact value on hover; each token rule says its centre and scale
(methods.Rule.heatmap: KTAE's values around 0, OAR's weights around 1). Each rollout's header gives its reward and
its sequence advantage, and a legend per kind says what the colours mean.

curves() draws one metric over the steps, a line per method: the mean over seeds, smoothed by a moving
average (the raw mean faint behind it) and a band from the lowest to the highest seed.
"""
import html

GREEN, RED = (0, 160, 0), (220, 0, 0)  # backgrounds at most 45 % opaque (pastel), underlines up to the full colour
MAX_ALPHA = 0.45

# What the colours mean, per kind: shown on the page above the rollouts.
LEGENDS = {
    "ktae": (
        "Colour: the token's KTAE key-token value (K6), centre 0, full colour at &plusmn;{scale:g}. "
        "<b>Green</b>: the token id is found more in this group's rewarded rollouts; <b>red</b>: more in the "
        "unrewarded ones; <b>no colour</b>: 0 (as common in both, or a special token such as EOS). "
        "A token's advantage is its rollout's sequence advantage plus this value.<br>"
        "<b>A KTAE value belongs to a token id across the whole group, not to this position:</b> the same digit "
        "has the same colour in every rollout, so a wrong rollout's real mistake can stay unmarked while a "
        "harmless digit is green."),
    "oar": (
        "Colour: the token's OAR weight (O5): how much the token moves the model's own distribution over the "
        "final answer, relative to the rollout's average of 1. <b>Green</b>: weight above 1 (full colour at "
        "{hi:g}); <b>red</b>: below 1 (full colour at {lo:g}); <b>no colour</b>: 1. A token's advantage is its "
        "rollout's sequence advantage <i>times</i> this weight, so green marks where the rollout's advantage "
        "is concentrated, not what is good: <b>in a rollout with reward 0 (negative advantage) green means "
        "more of the blame.</b><br>Only the reasoning is scored: the boxed answer and EOS keep weight 1 and stay "
        "uncoloured, and so does every token of a rollout whose advantage is 0 (its group all right or all "
        "wrong)."),
    "grail": (
        "Colour: the token's GRAIL weight (R5): how strongly the rollout's own boxed answer depends on the input "
        "that predicts the token (the gradient of the answer's log-likelihood times the embedding), standardised "
        "within the rollout and clipped to 0.5..5. <b>Green</b>: above 1 (full colour at {hi:g}); <b>red</b>: below "
        "1 (full colour at {lo:g}); <b>no colour</b>: 1. A token's advantage is its rollout's sequence advantage "
        "<i>times</i> this weight: <b>in a rollout with reward 0 green means more of the blame.</b><br>By default only "
        "rollouts of negative advantage are weighted; in every rollout with a box, the box's content has weight 5 and "
        "its marker, closing brace and what follows 1."),
    "shear": (
        "Colour: the token's SHEAR weight (S4): how far the hidden states of its span lie, as a distribution, from "
        "the same span of this group's rollouts of the other outcome (a Wasserstein distance), relative to the "
        "rollout's mean of 1. <b>Green</b>: above 1 (full colour at {hi:g}); <b>red</b>: below 1 (full colour at "
        "{lo:g}); <b>no colour</b>: 1. A token's advantage is its rollout's sequence advantage <i>times</i> this "
        "weight: <b>in a rollout with reward 0 green means more of the blame.</b><br>Every token of a span has its "
        "span's weight; a group all right or all wrong stays uncoloured."),
    "rlsd": (
        "Colour: the teacher's evidence for the token (L2): its log-probability under the same model shown the gold "
        "answer, minus the sampler's, centre 0, full colour at &plusmn;{scale:g}. <b>Green</b>: the teacher finds "
        "it likelier; <b>red</b>: less likely. A token's advantage is its rollout's sequence advantage times "
        "clip(exp(&plusmn;evidence)) (L3, the sign the advantage's): <b>in a rollout with reward 0 red means more of "
        "the blame</b>, in a rewarded one green more of the credit. A group all right or all wrong stays uncoloured."),
    "entropy": (
        "Colour: the entropy of the distribution the token was sampled from (nats), centred on the batch's "
        "threshold {centre:.3g} (E1), full colour at &plusmn;{scale:g} from it. <b>Green</b>: at or above the "
        "threshold, one of the batch's high-entropy minority: only these tokens learn, with their rollout's "
        "sequence advantage; <b>red</b>: below it, no gradient."),
    "surprisal": (
        "Colour: the token's surprisal weight (U1): its -log p when sampled over its rollout's mean. <b>Green</b>: "
        "above 1 (full colour at {hi:g}), a token the model found surprising; <b>red</b>: below 1 (full colour at "
        "{lo:g}); <b>no colour</b>: 1. Only a rollout with reward 0 (negative advantage) is weighted: its token's "
        "advantage is the sequence advantage <i>times</i> this weight, so <b>green means more of the blame</b>; a "
        "rewarded rollout's tokens all keep its sequence advantage whatever their colour."),
}


def style(value: float, centre: float, scale: float) -> str:
    """The inline style of a token: '' near the centre, else a pastel background and a 3px underline, both as
    strong as |value - centre| / scale (the underline's opacity that ratio itself, so weak values are not underlined
    as if they mattered). style(1.0, 0, 1) == 'background:rgba(0,160,0,0.450);border-bottom:3px solid
    rgba(0,160,0,1.000)'; style(-0.5, 0, 1) == 'background:rgba(220,0,0,0.225);border-bottom:3px solid
    rgba(220,0,0,0.500)'."""
    x = max(-1.0, min(1.0, (value - centre) / scale))
    if abs(x) < 0.01:
        return ""
    r, g, b = GREEN if x > 0 else RED
    return (f"background:rgba({r},{g},{b},{MAX_ALPHA * abs(x):.3f});"
            f"border-bottom:3px solid rgba({r},{g},{b},{abs(x):.3f})")


def _attr(value: float, centre: float, scale: float) -> str:
    css = style(value, centre, scale)
    return f' style="{css}"' if css else ""


def _token(text: str) -> str:
    """A token as HTML: a newline shows as a visible mark and then breaks the line (the page is pre-wrap); a space
    shows as a faint dot, so that a BPE token's leading space (" the", " \\boxed") is seen as part of it."""
    return (html.escape(text).replace(" ", '<i class="sp">&middot;</i>&#8203;').replace("\n", "&#8629;\n")
            or "&nbsp;")


def token_heatmap(path: str, title: str, question: str, rollouts: list, kind: str, centre: float, scale: float = 1.0):
    """Write an HTML page for one group. rollouts: list of (tokens: list[str], values: list[float], reward: float,
    advantage: float), advantage being the rollout's sequence advantage A_i (G1). kind: which legend (LEGENDS)
    explains the colours; centre: the value left uncoloured; scale: the distance from the centre at full colour.
    A rule says all three of its values (methods.Rule.heatmap)."""
    if kind not in LEGENDS:
        raise ValueError(f"kind must be one of {sorted(LEGENDS)}, got {kind!r}")
    rows = []
    for i, (tokens, values, reward, adv) in enumerate(rollouts):
        spans = "".join(f'<span title="{v:+.3f}"{_attr(v, centre, scale)}>{_token(t)}</span>'
                        for t, v in zip(tokens, values))
        verdict = "rewarded" if reward > 0 else "not rewarded"
        rows.append(f'<div class="r"><div class="h">rollout {i + 1} &middot; reward {reward:g} ({verdict}) &middot; '
                    f'sequence advantage {adv:+.3f}</div><div class="t">{spans}</div></div>')
    swatches = " ".join(f'<span class="sw"{_attr(v, centre, scale)}>{v:+.2f}</span>'
                        for v in (centre + f * scale for f in (-1, -0.5, 0, 0.5, 1)))
    legend = LEGENDS[kind].format(scale=scale, hi=centre + scale, lo=centre - scale, centre=centre)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>
body {{ font-family: sans-serif; margin: 2em; max-width: 60em; color: #111; }}
.r {{ margin: 1em 0; }} .h {{ color: #444; font-size: 90%; margin-bottom: 0.2em; }}
.q, .t {{ font-family: monospace; font-size: 120%; line-height: 1.8; white-space: pre-wrap; }}
.t span, .sw {{ padding: 1px 0; color: #111; }} .sw {{ font-family: monospace; padding: 1px 4px; }}
.t span {{ border-right: 1px solid rgba(0, 0, 0, 0.15); }} .sp {{ color: #999; font-style: normal; }}
.legend {{ background: #f6f6f6; padding: 0.6em 0.9em; border-radius: 4px; font-size: 92%; line-height: 1.5; }}
</style></head><body><h2>{html.escape(title)}</h2>
<p><b>Question</b> (the prompt as the model saw it):</p><div class="q">{html.escape(question)}</div>
<div class="legend"><p>{legend}</p><p>Scale: {swatches} &nbsp;(hover a token for its exact value). Each rollout's
header gives its reward and its sequence advantage A<sub>i</sub> (G1: its reward minus the group's mean, over the
group's standard deviation).</p></div>
{''.join(rows)}</body></html>"""
    with open(path, "w") as f:
        f.write(page)


def moving_average(values: list, window: int) -> list:
    """Trailing mean over the last `window` values (fewer at the start): moving_average([1, 3, 5], 2) == [1, 2, 4]."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


STYLES = ["-", "--", "-.", ":"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]


def curves(path: str, key: str, runs: dict, ylabel: str = None, title: str = None, smooth: int = None):
    """One PNG: `key` over steps, a line per method (the mean over its seeds) and a band from the lowest to the
    highest seed. runs: {method: [records of seed 0, records of seed 1, ...]}, records as in metrics.jsonl;
    steps where a seed has no value are left out of that seed. smooth: the moving-average window (default: a
    tenth of the points when there are more than 20, else none; the raw mean is drawn faint behind the smoothed
    mean, and the band is smoothed alike). Each method has its own colour, line style and marker; the legend sits
    outside the axes."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.2))
    n_seeds, windows = set(), set()
    for j, (method, seeds) in enumerate(runs.items()):
        series = [{r["step"]: r[key] for r in recs if r.get(key) is not None and r[key] == r[key]}
                  for recs in seeds]  # no NaN, nor the null that metrics.jsonl writes for one
        steps = sorted(set.intersection(*(set(s) for s in series))) if series else []
        if not steps:
            continue
        n_seeds.add(len(seeds))
        values = [[s[x] for s in series] for x in steps]
        mean, low, high = ([f(v) for v in values] for f in (lambda v: sum(v) / len(v), min, max))
        window = smooth if smooth is not None else (max(2, len(steps) // 10) if len(steps) > 20 else 1)
        windows.add(window)
        colour = f"C{j % 10}"
        look = dict(color=colour, linestyle=STYLES[j % len(STYLES)], marker=MARKERS[j % len(MARKERS)],
                     markevery=max(1, len(steps) // 8), markersize=5, linewidth=1.8)
        if window > 1:
            ax.plot(steps, mean, color=colour, alpha=0.3, linewidth=0.8)  # raw, faint
            mean, low, high = (moving_average(x, window) for x in (mean, low, high))
        ax.plot(steps, mean, label=method, **look)
        if len(seeds) > 1:
            ax.fill_between(steps, low, high, color=colour, alpha=0.12)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel or key)
    most = max(n_seeds, default=1)
    note = [f"mean of {'/'.join(map(str, sorted(n_seeds))) or 0} seed{'s' * (most > 1)}"]
    note += ["band: lowest to highest seed (as in tools.paired's curves)"] if most > 1 else []
    if max(windows, default=1) > 1:
        note += [f"moving average over {'/'.join(map(str, sorted(windows)))} steps, raw mean faint"]
    ax.set_title(f"{title or ylabel or key}\n({'; '.join(note)})", fontsize=10)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
