"""What a person looks at: token heat maps as HTML (the KTAE paper's case-study figure) and training curves.

token_heatmap() colours every token of every rollout of one group by a per-token value, in pastel backgrounds
with a coloured underline so that the text stays readable: green above the centre, red below, the intensity
proportional to |value - centre| / scale; each token rule says its centre and scale (methods.Rule.heatmap: KTAE's
values around 0, OAR's weights around 1). Hovering a token shows the exact value and the terms of the rule's
equations behind it (methods.TokenAdvantages.terms, each tagged as in EQUATIONS.md); a token whose value is
saturated (a clip or a cap reached) has a dashed box, and the hover text and the legend say why. Each rollout's
header gives its reward and its sequence advantage, and a legend per kind says what the colours mean. A kind whose
values belong to a token id across the group (KTAE) adds a table of every id's terms.

curves() draws one metric over the steps, a line per method: the mean over seeds, smoothed by a moving
average (the raw mean faint behind it) and a band from the lowest to the highest seed.
"""
import html

SATURATED, NOTE = "saturated: ", "note: "  # a term whose name starts so is a 0/1 flag, the rest of the name why
# kinds whose values belong to a token id across the whole group (KTAE's K2-K6): their page adds a table of each id
PER_ID = {"ktae"}
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
        "Colour: the token's SHEAR weight (S4): the largest distance, among the windows of hidden states that hold "
        "it, from its window to the nearest window of this group's rollouts of the other outcome (an entropic "
        "Wasserstein distance), over the group's mean hidden-state norm; 1 is GRPO's weight. <b>Green</b>: above 1 "
        "(full colour at {hi:g}); <b>red</b>: below 1 (full colour at {lo:g}); <b>no colour</b>: 1. A token's "
        "advantage is its rollout's sequence advantage <i>times</i> this weight: <b>in a rollout with reward 0 "
        "green means more of the blame.</b><br>A group all right or all wrong stays uncoloured."),
    "rlsd": (
        "Colour: the teacher's evidence for the token (L2): its log-probability under the same model shown the gold "
        "answer (a frozen copy, re-taken every --rlsd-sync-every steps), minus the sampler's, centre 0, full colour at "
        "&plusmn;{scale:g}. <b>Green</b>: the teacher finds it likelier; <b>red</b>: less likely. A token's advantage "
        "is its rollout's sequence advantage times (1 - lambda) + lambda clip(exp(&plusmn;evidence)) (L3-L5, the "
        "sign the advantage's, lambda decaying to 0): <b>in a rollout with reward 0 red means more of "
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


def _num(x: float) -> str:
    return "n/a" if x != x else f"{x + 0.0:.4g}"  # NaN: a term the rule did not compute for that token; no "-0"


def _shown(text: str) -> str:
    return '"' + text.replace("\n", "\\n") + '"'  # a token's text in the hover text and the table, newline seen


def _tip(text: str, tid, value: float, terms: dict, j: int, width: int) -> str:
    """The hover text of token j: its text, id and value, then each term on its own line, then the reason of each
    flag that is on."""
    lines = [f"{_shown(text)}" + ("" if tid is None else f" (id {tid})") + f": value {value:+.3f}"]
    lines += [f"{k.ljust(width)}  {_num(v[j])}" for k, v in terms.items() if not k.startswith((SATURATED, NOTE))]
    lines += [k for k, v in terms.items() if k.startswith((SATURATED, NOTE)) and v[j]]
    return html.escape("\n".join(lines))


def _flags(rollouts: list) -> dict:
    """{flag name: how many tokens of the page have it on}, for the flags on somewhere, in the rules' order."""
    counts = {}
    for r in rollouts:
        for k, v in ((r[4] if len(r) > 4 else None) or {}).items():
            if k.startswith((SATURATED, NOTE)):
                counts[k] = counts.get(k, 0) + sum(1 for x in v if x)
    return {k: n for k, n in counts.items() if n}


def _id_table(rollouts: list, centre: float, scale: float, flags: dict) -> str:
    """KTAE's per-id table: one row per token id of the group, its text, its positions on the page, its value and
    every term that is the same at each of its positions (K2-K6; K7 differs by rollout), flags as their numbers in
    the legend; terms equal for every id (K1's n_T, n_F) go in the caption. Rows by value, highest first."""
    ids = {}  # id -> (text, [(rollout, position)])
    for i, r in enumerate(rollouts):
        for j, (text, tid) in enumerate(zip(r[0], r[5])):
            ids.setdefault(tid, (text, []))[1].append((i, j))
    names = list(rollouts[0][4])
    same = lambda xs: all(x == xs[0] or (x != x and xs[0] != xs[0]) for x in xs)  # noqa: E731  NaN == NaN here
    at = {k: {tid: [rollouts[i][4][k][j] for i, j in where] for tid, (_, where) in ids.items()} for k in names}
    per_id = [k for k in names if not k.startswith((SATURATED, NOTE)) and all(same(v) for v in at[k].values())]
    everywhere = [k for k in per_id if same([v[0] for v in at[k].values()])]
    columns = [k for k in per_id if k not in everywhere]
    number = {k: n + 1 for n, k in enumerate(flags)}
    value = {tid: rollouts[where[0][0]][1][where[0][1]] for tid, (_, where) in ids.items()}
    rows = []
    for tid in sorted(ids, key=lambda t: -value[t]):
        text, where = ids[tid]
        marks = " ".join(f"({number[k]})" for k in flags if any(rollouts[i][4][k][j] for i, j in where))
        cells = "".join(f"<td>{_num(at[k][tid][0])}</td>" for k in columns)
        rows.append(f'<tr><td class="tok"{_attr(value[tid], centre, scale)}>{html.escape(_shown(text))}</td>'
                    f"<td>{tid}</td><td>{len(where)}</td>{cells}<td>{marks}</td></tr>")
    head = "".join(f"<th>{html.escape(k)}</th>" for k in ["token", "id", "positions here", *columns, "flags"])
    caption = "; ".join(f"{html.escape(k)} = {_num(at[k][next(iter(ids))][0])}" for k in everywhere)
    return (f'<h3 id="ids">Every token id of this group</h3><p>A key-token value belongs to the id: K2-K6 are the '
            f"same wherever it occurs (K7, A<sub>i</sub> + value, differs by rollout: hover a token for it). "
            f"{'Same for every id: ' + caption + '. ' if caption else ''}Flags: the numbers of the legend's list."
            f'</p><table class="ids"><tr>{head}</tr>{"".join(rows)}</table>')


def token_heatmap(path: str, title: str, question: str, rollouts: list, kind: str, centre: float, scale: float = 1.0):
    """Write an HTML page for one group. rollouts: list of (tokens: list[str], values: list[float], reward: float,
    advantage: float[, terms: dict, ids: list[int]]), advantage being the rollout's sequence advantage A_i (G1);
    terms {name: list[float]}, one value per token (methods.TokenAdvantages.terms: shown on hover, names starting
    with SATURATED or NOTE being flags); ids the tokens' ids. kind: which legend (LEGENDS) explains the colours;
    centre: the value left uncoloured; scale: the distance from the centre at full colour. A rule says all three
    of its values (methods.Rule.heatmap)."""
    if kind not in LEGENDS:
        raise ValueError(f"kind must be one of {sorted(LEGENDS)}, got {kind!r}")
    flags = _flags(rollouts)
    rows = []
    for i, (tokens, values, reward, adv, *more) in enumerate(rollouts):
        terms, ids = (more[0] if more else {}) or {}, more[1] if len(more) > 1 else None
        width = max((len(k) for k in terms if not k.startswith((SATURATED, NOTE))), default=0)
        spans = []
        for j, (t, v) in enumerate(zip(tokens, values)):
            sat = any(terms[k][j] for k in terms if k.startswith(SATURATED))
            tip = _tip(t, None if ids is None else ids[j], v, terms, j, width)
            cls = ' class="sat"' if sat else ""
            spans.append(f'<span data-v="{v:+.3f}"{_attr(v, centre, scale)}{cls} data-tip="{tip}">{_token(t)}</span>')
        verdict = "rewarded" if reward > 0 else "not rewarded"
        rows.append(f'<div class="r"><div class="h">rollout {i + 1} &middot; reward {reward:g} ({verdict}) &middot; '
                    f'sequence advantage {adv:+.3f}</div><div class="t">{"".join(spans)}</div></div>')
    swatches = " ".join(f'<span class="sw"{_attr(v, centre, scale)}>{v:+.2f}</span>'
                        for v in (centre + f * scale for f in (-1, -0.5, 0, 0.5, 1)))
    legend = LEGENDS[kind].format(scale=scale, hi=centre + scale, lo=centre - scale, centre=centre)
    table = kind in PER_ID and rollouts and all(len(r) > 5 and r[4] and r[5] is not None for r in rollouts)
    boxed = '<span class="sat sw">dashed box</span> '
    marks = "".join(f"<li>({n}) {boxed if k.startswith(SATURATED) else ''}<b>{c} token{'s' * (c > 1)}</b> "
                    f"{html.escape(k)}</li>" for n, (k, c) in enumerate(flags.items(), 1))
    why = f"<p>Why some values are what they are, on this page:</p><ul>{marks}</ul>" if flags else ""
    explained = any(len(r) > 4 and r[4] for r in rollouts)
    hover = ("hover a token for the terms behind its value, each tagged with its equation in EQUATIONS.md"
             + ("; the table below lists every token id's" if table else "") if explained
             else "hover a token for its exact value")
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>
body {{ font-family: sans-serif; margin: 2em; max-width: 60em; color: #111; }}
.r {{ margin: 1em 0; }} .h {{ color: #444; font-size: 90%; margin-bottom: 0.2em; }}
.q, .t {{ font-family: monospace; font-size: 120%; line-height: 1.8; white-space: pre-wrap; }}
.t span, .sw {{ padding: 1px 0; color: #111; }} .sw {{ font-family: monospace; padding: 1px 4px; }}
.t span {{ border-right: 1px solid rgba(0, 0, 0, 0.15); position: relative; }}
.sp {{ color: #999; font-style: normal; }}
.sat {{ outline: 1.5px dashed #222; outline-offset: -1px; }}
.t span[data-tip]:hover::after {{ content: attr(data-tip); position: absolute; left: 0; top: 1.7em; z-index: 9;
  white-space: pre-wrap; width: max-content; max-width: 46em; background: #fffff4; border: 1px solid #888;
  border-radius: 3px; padding: 0.4em 0.6em; font-size: 11px; line-height: 1.35; box-shadow: 0 2px 6px #0004; }}
.legend {{ background: #f6f6f6; padding: 0.6em 0.9em; border-radius: 4px; font-size: 92%; line-height: 1.5; }}
.legend ul {{ margin: 0.3em 0; padding-left: 1.2em; }}
table.ids {{ border-collapse: collapse; font-size: 80%; }} .ids td, .ids th {{ border: 1px solid #ccc;
  padding: 2px 5px; text-align: right; }} .ids th {{ background: #eee; font-weight: normal; max-width: 7em; }}
.ids td.tok {{ font-family: monospace; text-align: left; white-space: pre; }}
</style></head><body><h2>{html.escape(title)}</h2>
<p><b>Question</b> (the prompt as the model saw it):</p><div class="q">{html.escape(question)}</div>
<div class="legend"><p>{legend}</p><p>Scale: {swatches} &nbsp;({hover}). Each rollout's
header gives its reward and its sequence advantage A<sub>i</sub> (G1: its reward minus the group's mean, over the
group's standard deviation).</p>{why}</div>
{''.join(rows)}{_id_table(rollouts, centre, scale, flags) if table else ''}</body></html>"""
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
