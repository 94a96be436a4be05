"""plots.py: the heat-map page a student reads (rewards, advantages, legend, readable colours, the question's
newlines) and the curves (smoothed, titled, one PNG)."""
import re
from types import SimpleNamespace

import pytest

import methods
from infra import plots

GREEN_FULL = "background:rgba(0,160,0,0.450);border-bottom:3px solid rgba(0,160,0,1.000)"
RED_HALF = "background:rgba(220,0,0,0.225);border-bottom:3px solid rgba(220,0,0,0.500)"


def spans(page):
    """(title, style or None, text) of every token span inside the rollouts (the legend's swatches left out)."""
    body = page[page.index('<div class="r">'):]
    return re.findall(r'<span data-v="([^"]*)"(?: style="([^"]*)")?(?: class="sat")? data-tip="[^"]*">(.*?)</span>',
                      body, re.S)


def test_ktae_page_shows_rewards_advantages_legend_and_pastel_colours(tmp_path):
    path = tmp_path / "k.html"
    rollouts = [(["1", "+", "\n", "7"], [1.0, 0.0, 0.0, -0.5], 1.0, 0.866),
                (["9", "<|endoftext|>"], [-0.5, 0.0], 0.0, -0.866)]
    hm = methods.RULES["ktae"].heatmap(None, None, None, None)  # the rule says how its values are coloured: around 0
    assert (hm.kind, hm.centre, hm.scale) == ("ktae", 0.0, 1.0)
    plots.token_heatmap(str(path), "ktae: key-token values, step 3", "Q:1+6=?\nA:", rollouts, *hm[:1], *hm[2:])
    page = path.read_text()
    assert "reward 1 (rewarded) &middot; sequence advantage +0.866" in page
    assert "reward 0 (not rewarded) &middot; sequence advantage -0.866" in page
    assert "belongs to a token id across the whole group" in page  # why a harmless digit can be green
    assert "white-space: pre-wrap" in page and '<div class="q">Q:1+6=?\nA:</div>' in page  # newline kept
    got = spans(page)
    assert got[0] == ("+1.000", GREEN_FULL, "1")  # the exact style: pastel background, coloured underline
    assert got[1] == ("+0.000", "", "+")  # the centre: no colour at all
    assert got[2] == ("+0.000", "", "&#8629;\n")  # a newline token is visible and breaks the line
    assert got[3] == ("-0.500", RED_HALF, "7") and got[4] == ("-0.500", RED_HALF, "9")
    assert got[5][2] == "&lt;|endoftext|&gt;" and len(got) == 6
    assert "color: #111" in page  # dark text on every background


def test_oar_page_explains_the_uncoloured_answer_and_green_in_a_wrong_rollout(tmp_path):
    path = tmp_path / "o.html"
    hm = methods.RULES["oar-g"].heatmap(None, None, None, SimpleNamespace(oar_beta=2.0))  # around 1, at most 1 + beta
    assert (hm.kind, hm.centre, hm.scale) == ("oar", 1.0, 2.0)
    plots.token_heatmap(str(path), "oar-g: OAR weights", "Q:2+2=?\nA:", [(["4", "}"], [3.0, 1.0], 0.0, -1.5)],
                        kind=hm.kind, centre=hm.centre, scale=hm.scale)
    page = path.read_text()
    assert "boxed answer and EOS keep weight 1" in page and "reward 0 (negative advantage) green means" in page
    assert "full colour at 3" in page and "full colour at -1" in page  # the scale: 1 +- beta
    assert spans(page) == [("+3.000", GREEN_FULL, "4"), ("+1.000", "", "}")]
    assert "sequence advantage -1.500" in page
    with pytest.raises(ValueError, match="kind"):
        plots.token_heatmap(str(path), "t", "q", [], kind="ppo", centre=0.0)


def test_moving_average():
    assert plots.moving_average([1, 3, 5, 7], 2) == [1, 2, 4, 6]
    assert plots.moving_average([1, 3], 1) == [1, 3]


def test_curves_draw_a_titled_png(tmp_path):
    runs = {m: [[{"step": s, "reward_mean": (s * k) % 7 / 7} for s in range(1, 41)] for k in (1, 2)]
            for m in ("grpo", "ktae", "oar-g")}
    runs["grpo"][0][3]["reward_mean"] = None  # metrics.jsonl writes NaN (a step with no advantage) as null
    path = tmp_path / "reward.png"
    plots.curves(str(path), "reward_mean", runs, "sampled reward", title="sampled reward, 3 methods x 40 steps")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
