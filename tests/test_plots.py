"""plots.py: the heat-map page a student reads (rewards, advantages, legend, readable colours, the question's
newlines) and the curves (smoothed, titled, one PNG)."""
import html
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


def test_ktae_page_shows_each_tokens_terms_on_hover_marks_saturation_and_tables_every_id(tmp_path):
    # The worked example of tests/test_methods.py through the rule, logbook.write_heatmap and the page. By hand:
    # id 9 is in both wrong rollouts (a = 0, b = 2), once in o_3 and twice in o_4 (count in wrong 3), p = 1/3,
    # F = exp(-2/3) = 0.5134, IG = 1; in one class only, so saturated at -1: ids 6 (2 positions), 7 (1) and 9 (3)
    # are the page's 6 saturated tokens
    from test_methods import ktae_worked_example
    from infra import logbook
    batch, rewards, mask, ctx = ktae_worked_example()
    adv = methods.RULES["ktae"].advantages(batch, rewards, mask, ctx)
    tok = SimpleNamespace(decode=lambda ids: {99: "<eos>"}.get(ids[0], str(ids[0])))
    path = tmp_path / "heatmaps" / "step1.html"
    logbook.write_heatmap(str(path), "ktae", 1, methods.RULES["ktae"].heatmap(adv, batch, mask, ctx.args), tok,
                          [{"prompt": "Q:?\nA:"}], batch, mask, rewards, adv)
    page = path.read_text()
    body = page[page.index('<div class="r">'):page.index('<h3 id="ids">')]
    tips = re.findall(r'<span data-v="[^"]*"(?: style="[^"]*")?( class="sat")? data-tip="([^"]*)">', body)
    assert len(tips) == 16  # 4 rollouts x 4 tokens
    sat, tip = tips[13]  # rollout 4, token 1: id 9
    lines = html.unescape(tip).split("\n")
    assert lines[0] == '"9" (id 9): value -1.000' and sat == ' class="sat"'
    got = {ln[:30].strip(): ln[30:].strip() for ln in lines[1:] if not ln.startswith(("saturated", "note"))}
    assert (got["K2 a (right rollouts with it)"], got["K2 b (wrong rollouts with it)"]) == ("0", "2")
    assert (got["K5 count in right"], got["K5 count in wrong"]) == ("0", "3")
    assert (got["K3 Fisher p"], got["K3 strength F"], got["K4 information gain IG"]) == ("0.3333", "0.5134", "1")
    assert (got["K6 value"], got["K7 A_i + value"]) == ("-1", "-1.866")  # A_4 = -0.8660, plus -1
    assert lines[-1].startswith("saturated: the id occurs in one class only")
    assert [s for s, _ in tips].count(' class="sat"') == 6
    assert "<b>6 tokens</b> saturated: the id occurs in one class only" in page  # the legend says why, and how many
    assert "<b>4 tokens</b> note: pad or EOS" in page
    # the per-id table (flags numbered as the legend lists the ones on: (1) one class, (2) S = 0, (3) EOS): a row
    # per id (5 to 9, EOS), highest value first; id 9: 3 positions, a 0, b 2, p, F,
    # IG, counts 0 and 3, and K1's n_T and n_F, the same for every id, in its caption
    table = page[page.index('<h3 id="ids">'):]
    rows = re.findall(r"<tr>(.*?)</tr>", table)[1:]
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", r) for r in rows]
    assert [c[1] for c in cells] == ["6", "7", "5", "99", "8", "9"]  # ties as first seen
    assert cells[-1][:10] == ["&quot;9&quot;", "9", "3", "0", "2", "0.3333", "0.5134", "1", "0", "3"]
    assert cells[-1][-2:] == ["-1", "(1)"] and cells[3][-2:] == ["0", "(3)"] and cells[4][-2:] == ["0", "(2)"]
    assert "K1 n_T (right rollouts) = 2; K1 n_F (wrong rollouts) = 2" in table
