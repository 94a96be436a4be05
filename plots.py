"""What a person looks at: token heat maps as HTML (the KTAE paper's case-study figure).

token_heatmap() colours every token of every rollout of one group by a per-token value: green for positive,
red for negative, the intensity proportional to |value| / scale, the exact value on hover. KTAE colours by the
key-token value (scale 1, centre 0); OAR by its weight (centre 1).
"""
import html


def _colour(value: float, centre: float, scale: float) -> str:
    x = max(-1.0, min(1.0, (value - centre) / scale))
    return f"rgba(0,160,0,{x:.3f})" if x >= 0 else f"rgba(220,0,0,{-x:.3f})"


def token_heatmap(path: str, title: str, question: str, rollouts: list, centre: float = 0.0, scale: float = 1.0):
    """Write an HTML page. rollouts: list of (tokens: list[str], values: list[float], reward: float)."""
    rows = []
    for i, (tokens, values, r) in enumerate(rollouts):
        spans = "".join(
            f'<span title="{v:+.3f}" style="background:{_colour(v, centre, scale)}">'
            f'{html.escape(t).replace(chr(10), "&#8629;<br>") or "&nbsp;"}</span>'
            for t, v in zip(tokens, values))
        rows.append(f'<div class="r"><div class="h">rollout {i + 1} &middot; reward {r:g}</div>'
                    f'<div class="t">{spans}</div></div>')
    legend = (f'<span style="background:{_colour(centre - scale, centre, scale)}">{centre - scale:+g}</span> '
              f'<span>{centre:+g}</span> '
              f'<span style="background:{_colour(centre + scale, centre, scale)}">{centre + scale:+g}</span>')
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>
body {{ font-family: sans-serif; margin: 2em; }} .r {{ margin: 1em 0; }} .h {{ color: #555; font-size: 90%; }}
.t {{ font-family: monospace; font-size: 120%; line-height: 1.6; }} .t span {{ padding: 1px 0; }}
</style></head><body><h2>{html.escape(title)}</h2>
<p><b>Question:</b> <code>{html.escape(question)}</code></p><p>scale: {legend} (hover a token for its value)</p>
{''.join(rows)}</body></html>"""
    with open(path, "w") as f:
        f.write(page)


def curves(path: str, key: str, runs: dict, ylabel: str = None):
    """One PNG: `key` over steps, a line per method (the mean over its seeds) and a band from the lowest to the
    highest seed. runs: {method: [records of seed 0, records of seed 1, ...]}, records as in metrics.jsonl;
    steps where a seed has no value are left out of that seed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for method, seeds in runs.items():
        series = [{r["step"]: r[key] for r in recs if key in r and r[key] == r[key]} for recs in seeds]  # no NaN
        steps = sorted(set.intersection(*(set(s) for s in series))) if series else []
        if not steps:
            continue
        values = [[s[x] for s in series] for x in steps]
        ax.plot(steps, [sum(v) / len(v) for v in values], label=method)
        ax.fill_between(steps, [min(v) for v in values], [max(v) for v in values], alpha=0.2)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel or key)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
