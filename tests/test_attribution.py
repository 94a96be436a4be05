"""The first wrong step by Monte Carlo (epicprm.py, F1-F4) and tools/attribution/ at a small size: the bisection
against every prefix tested in turn, the threshold, the steps of a response, the step blame, the prefix values on
the tiny model, and a run of the command that writes, resumes and scores."""
import json
import math

import pytest
import torch

import epicprm
from conftest import THREADS
from toyworld import credit, tiny
from tools import attribution


def test_the_bisection_finds_the_first_failure_in_at_most_log2_n_plus_1_tests():
    # every monotone viability over n units (viable up to some k, not after; the last never) against the scan
    def viable(k, asked, first_bad):
        asked.append(k)
        assert len(asked) <= 64, "the bisection does not end"
        return k < first_bad

    for n in range(1, 40):
        for first_bad in range(n):
            asked = []
            got = credit.first_failure(n, lambda k: viable(k, asked, first_bad))
            assert got == first_bad and len(asked) <= math.floor(math.log2(n)) + 1, (n, first_bad, asked)
            assert n - 1 not in asked  # the whole is known not viable: never tested


def test_f1_steps_are_the_non_empty_lines_as_token_spans():
    # "7+8=15\n" "\n" "15-9=6\n": the blank line joins the step before it; a leading blank line the first step
    assert epicprm.steps(["7", "+", "8", "=", "1", "5", "\n", "\n", "1", "5", "\n"]) == [(0, 8), (8, 11)]
    assert epicprm.steps(["\n", "a", "\n", "b"]) == [(0, 3), (3, 4)]
    # a token that ends a line (".\n\n") ends its step; trailing blanks join the last step
    assert epicprm.steps(["So", " x", ".\n\n", "Then", " y", "\n", "  ", "\n"]) == [(0, 3), (3, 8)]
    assert epicprm.steps(["one line"]) == [(0, 1)] and epicprm.steps([]) == []


def test_f3_locates_the_first_step_below_half_the_question_value_by_bisection():
    # 6 steps of 2 tokens each. v(question) = 0.8 -> threshold 0.4. v through steps 1..k (k = 1..5):
    # 0.9 0.7 0.5 0.3 0.1; the whole response (step 6) is wrong. First below 0.4: step 4 (index 3). Told as counts
    # of 20 continuations (v x 20 right)
    spans = [(2 * k, 2 * k + 2) for k in range(6)]
    v = {2: 0.9, 4: 0.7, 6: 0.5, 8: 0.3, 10: 0.1}  # prefix tokens -> v
    loc = epicprm.Locate(spans, 0.8 / 2)
    while not loc.done():
        loc.tell(round(20 * v[loc.probe()]), 20)
    assert loc.step == 3 and len(loc.tests) <= 3 and loc.token is None  # bisection: 3 tests, not 5
    # half of v(question) is the threshold: at the question's own value (0.8) the first below would be step 2
    loc = epicprm.Locate(spans, 0.8)
    while not loc.done():
        loc.tell(round(20 * v[loc.probe()]), 20)
    assert loc.step == 1
    # refine: inside step 4 (tokens 6, 7), through token 6 is 0.45, so the first wrong token is 7
    v_tok = {**v, 7: 0.45}
    loc = epicprm.Locate(spans, 0.4, refine=True)
    while not loc.done():
        loc.tell(round(20 * v_tok[loc.probe()]), 20)
    assert (loc.step, loc.token) == (3, 7)
    # many at once: locate_all asks each unfinished search's prefix in one round
    rounds = []
    locs = [epicprm.Locate(spans, 0.4), epicprm.Locate(spans[:2], 0.4)]
    epicprm.locate_all(locs, lambda idx, lengths: rounds.append(idx) or [v[n] for n in lengths], n=20)
    assert [x.step for x in locs] == [3, 1] and rounds[0] == [0, 1]  # both asked in the first round


def test_f3b_the_chance_that_a_call_is_wrong_is_the_binomial_tail_at_the_threshold():
    # "below" on 0 of 16 at threshold 1/16: a prefix of v = 1/16 shows none with (15/16)^16 = 0.3561
    assert abs(epicprm.decision_error(0, 16, 1 / 16) - (15 / 16) ** 16) < 1e-12
    # "above" on 1 of 16 (1/16 is not below 1/16): P(X >= 1) = 1 - 0.3561 = 0.6439
    assert abs(epicprm.decision_error(1, 16, 1 / 16) - (1 - (15 / 16) ** 16)) < 1e-12
    # "above" on 8 of 16 at 0.25: P(X >= 8) = sum_{k=8..16} C(16,k) 0.25^k 0.75^(16-k) = 0.0271
    assert abs(epicprm.decision_error(8, 16, 0.25) - 0.027130) < 1e-6
    # "below" on 0 of 48 at 1/16: (15/16)^48 = 0.0451
    assert abs(epicprm.decision_error(0, 48, 1 / 16) - (15 / 16) ** 48) < 1e-12


def test_f3b_draws_more_where_the_counts_cannot_decide_and_flags_what_the_cap_leaves_undecided():
    # 3 steps of 2 tokens, v(question) = 2/16 -> threshold 1/16. The prefix through step 1 (2 tokens) is sound (v
    # 0.5: 8 of 16, error P(X >= 8 | 16, 1/16) = 1.5e-5), through step 2 (4 tokens) no continuation is ever right.
    # Its "below" on 0 of 16 is wrong with 0.356 > 0.1, of 32 with 0.127, of 48 with 0.045: it draws 16 at a time
    # up to 48, and the located step 2 is confident. With a cap of 32 it stops at 0.127: uncertain.
    spans, truth = [(0, 2), (2, 4), (4, 6)], {2: 0.5, 4: 0.0}
    asked = []

    def values(idx, lengths):
        asked.append(lengths)
        return [truth[n] for n in lengths]
    loc = epicprm.Locate(spans, (2 / 16) / 2)
    epicprm.locate_all([loc], values, n=16, cap=64)
    # the bisection asks through step 2 first (the middle of 3), three times (48), then through step 1 once (16)
    assert loc.step == 1 and asked == [[4], [4], [4], [2]]
    assert [(t, m) for t, _, m, _ in loc.tests] == [(4, 48), (2, 16)]
    c = loc.confidence()
    assert c["confident"] and abs(c["error_at"] - (15 / 16) ** 48) < 1e-12 and c["error_before"] < 1e-4
    loc = epicprm.Locate(spans, (2 / 16) / 2)
    epicprm.locate_all([loc], values, n=16, cap=32)
    c = loc.confidence()
    assert loc.step == 1 and not c["confident"] and abs(c["error_at"] - (15 / 16) ** 32) < 1e-12
    assert abs(c["p_wrong"] - (c["error_at"] + c["error_before"])) < 1e-12
    # no cap beyond n: the old behaviour, one batch of n a probe
    loc = epicprm.Locate(spans, (2 / 16) / 2)
    epicprm.locate_all([loc], values, n=16)
    assert [(t, m) for t, _, m, _ in loc.tests] == [(4, 16), (2, 16)] and not loc.confidence()["confident"]


def test_f4_step_blame_is_the_max_or_the_mean_of_its_tokens():
    blame = torch.tensor([0.0, 2.0, 1.0, 5.0, 3.0])
    spans = [(0, 2), (2, 5)]
    assert epicprm.step_blame(blame, spans, "max").tolist() == [2.0, 5.0]
    assert epicprm.step_blame(blame, spans, "mean").tolist() == [1.0, 3.0]  # (0 + 2) / 2, (1 + 5 + 3) / 3


def test_f2_prefix_values_continue_the_prefix_and_grade_the_whole_text(base):
    # n continuations of prompt + prefix, each graded on the prefix's text and its own: every text starts with the
    # prefix (v = 1); none is a thousand characters longer (v = 0); a share in between counts the right ones
    model, tok = base
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompt, prefix = enc(tiny.prompt("7+8-9")), enc("7+8=15\n")
    common = dict(n=6, temperature=1.0, max_new_tokens=24, decode=lambda ids: tok.decode(ids, skip_special_tokens=True),
                  eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, batch=12)
    torch.manual_seed(0)
    starts = [lambda t: t.startswith("7+8=15\n")] * 3
    assert epicprm.prefix_values(model, [prompt] * 3, [prefix] * 3, grades=starts, **common) == [1.0] * 3
    assert epicprm.prefix_values(model, [prompt], [prefix], grades=[lambda t: len(t) > 1000], **common) == [0.0]
    texts = []
    v = epicprm.prefix_values(model, [prompt], [prefix], grades=[lambda t: texts.append(t) or "\\boxed{6}" in t],
                              **common)
    assert len(texts) == 6 and v == [sum("\\boxed{6}" in t for t in texts) / 6]


def test_f2_a_continuation_shares_its_rollouts_budget_and_each_pair_has_its_own_grader(base):
    # two pairs in one call, each graded by its own grader: a prefix as long as the budget leaves its continuations
    # no token (every text is the prefix alone), an empty prefix leaves them the whole budget (texts of their own);
    # the first grader marks all right, the second none
    model, tok = base
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompt, prefix = enc(tiny.prompt("7+8-9")), enc("7+8=15\n")
    texts = ([], [])
    grades = [lambda t: texts[0].append(t) or True, lambda t: texts[1].append(t) and False]
    torch.manual_seed(0)
    v = epicprm.prefix_values(model, [prompt] * 2, [prefix, []], grades=grades, max_new_tokens=len(prefix), n=4,
                              temperature=1.0, decode=lambda ids: tok.decode(ids, skip_special_tokens=True),
                              eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, batch=8)
    assert v == [1.0, 0.0] and texts[0] == ["7+8=15\n"] * 4
    assert len(texts[1]) == 4 and all(texts[1]) and texts[1] != texts[0]


def test_a_wrong_rollout_cut_off_by_the_budget_is_counted_and_not_located(base, tmp_path, monkeypatch):
    # a rollout that ran out of tokens may hold no wrong step, only too many: every wrong rollout marked cut, so
    # the mixed groups count them and nothing is located
    drawn = attribution.locate.sample_groups

    def all_cut(world, first, problems):
        groups = drawn(world, first, problems)
        for _, batch, _, correct in groups.values():
            batch["truncated"] = torch.tensor([not c for c in correct])
        return groups

    monkeypatch.setattr(attribution.locate, "sample_groups", all_cut)
    out = tmp_path / "att"
    attribution.main(["--model", "tiny", "--dataset", "tiny", "--limit", "4", "--n", "4", "--threads", str(THREADS),
                      "--rules", "none", "--group-batch", "2", "--out", str(out)])
    lines = [json.loads(x) for x in open(out / "rollouts.jsonl")]
    mixed = [x for x in lines if x.get("mixed")]
    assert mixed and all(x["truncated"] == x["wrong"] for x in mixed)
    assert any(x["v0"] > 0 for x in mixed)  # there was something to locate against
    assert not [x for x in lines if "rollout" in x]


def test_the_command_locates_scores_and_resumes_on_the_tiny_world(base, tmp_path, capsys):
    # the tiny task's first problems, a few continuations: every located line has its steps, probes and each rule's
    # scores against both truths; a second run finds every problem done and writes the same lines
    out = tmp_path / "att"
    flags = ["--model", "tiny", "--dataset", "tiny", "--limit", "4", "--n", "4", "--threads", str(THREADS),
             "--rules", "none,ktae,grail", "--out", str(out)]
    attribution.main(flags)
    lines = [json.loads(x) for x in open(out / "rollouts.jsonl")]
    rows = [x for x in lines if "rollout" in x]
    assert [x["problem"] for x in lines if x.get("done")] == [0, 1, 2, 3]
    assert rows, "no wrong rollout in a mixed group in these problems: nothing was located"
    for r in rows:
        k, S = r["first_wrong_step"], len(r["steps"])
        assert 0 <= k < S and S >= 2 and r["threshold"] == r["v0"] / 2
        assert set(r["scores"]) == {"position", "surprisal", "none", "ktae", "grail"}
        # (a wrong response that ends before its answer, "9-2=7\n7+2=", is still a viable prefix: no exact error)
        assert set(r.get("scores_exact", r["scores"])) == set(r["scores"])
        assert r["scores"]["none"]["max"]["auc"] == 0.5  # uniform blame: the chance level
        below = [p for p in r["probes"] if p["v"] < r["threshold"]]  # F3: the step's own prefix is below, if tested
        assert all(p["tokens"] >= r["steps"][k]["tokens"][1] for p in below)
    assert (out / "table.md").exists() and (out / "auc.png").exists() and (out / "rollouts.html").exists()
    assert "against the exact first error" in capsys.readouterr().out
    # F3b in every line: --n-max 4 x --n, each probe's draws (n at a time) and its call's error, the verdict
    for r in rows:
        assert r["n_max"] == 16 and all(p["draws"] in (4, 8, 12, 16) for p in r["probes"])
        assert r["confident"] == all(e is None or e <= r["alpha"] for e in (r["error_before"], r["error_at"]))
    attribution.main(flags)
    assert [json.loads(x) for x in open(out / "rollouts.jsonl")] == lines
    # an uncertain rollout is left out of the tables, counted, and marked on the page; a line written before F3b
    # (no verdict) is judged from its probes' counts
    # (which rollouts the run itself found uncertain depends on the CPU's floats: one confident one is marked)
    sure = [r for r in rows if attribution.report.confident(r)]
    assert len(sure) >= 2, "too few confident rollouts on this machine to see one left out"
    at = rows.index(sure[0])
    doubt = rows[:at] + [dict(rows[at], confident=False, p_wrong=0.5, error_at=0.5)] + rows[at + 1:]
    text = attribution.report.report(str(out), doubt, True)
    assert f"| none | {len(sure) - 1} | max |" in text
    assert f"{len(rows) - len(sure) + 1} of them uncertain, left out of the tables" in text
    assert "uncertain: the chance that this step" in (out / "rollouts.html").read_text()
    old = {k: v for k, v in rows[0].items() if k not in ("confident", "p_wrong", "error_before", "error_at")}
    assert attribution.report.confident(old) == epicprm.confidence(
        [tuple(x["tokens"]) for x in old["steps"]], old["first_wrong_step"],
        {p["tokens"]: epicprm.decision_error(round(p["v"] * 4), 4, old["threshold"]) for p in old["probes"]})[
        "confident"]


def test_groups_drawn_in_blocks_are_drawn_again_when_a_killed_run_resumes(base, tmp_path):
    # --group-batch 3: problems 0-2 in one sampling call, 3 alone. A run killed after problem 1 (its lines for
    # problem 2 cut) draws block 0-2 again on resume and must write the lines of the run never stopped
    out = tmp_path / "att"
    flags = ["--model", "tiny", "--dataset", "tiny", "--limit", "4", "--n", "4", "--threads", str(THREADS),
             "--rules", "none,ktae", "--group-batch", "3", "--out", str(out)]
    attribution.main(flags)
    whole = open(out / "rollouts.jsonl").read().splitlines()
    cut = next(k for k, x in enumerate(whole) if json.loads(x)["problem"] == 2)
    (out / "rollouts.jsonl").write_text("\n".join(whole[:cut]) + "\n" + whole[cut][:20])  # and a half-written line
    attribution.main(flags)
    assert open(out / "rollouts.jsonl").read().splitlines() == whole
    assert sum(json.loads(x).get("mixed", False) for x in whole) >= 1  # something was located or scored
    # a smaller --limit reports its problems only and keeps the others' lines for the larger one
    attribution.main(flags[:5] + ["2"] + flags[6:])
    assert open(out / "rollouts.jsonl").read().splitlines() == whole


def killable(monkeypatch):
    """epicprm.prefix_values (every sampling call of F2) counted, the random state at each call kept, and a
    KeyboardInterrupt raised at the call numbered calls["kill"] (a kill while it samples)."""
    calls, values = {"draws": 0, "kill": None, "rng": []}, epicprm.prefix_values

    def counted(*a, **k):
        calls["draws"] += 1
        calls["rng"].append(torch.get_rng_state())
        if calls["draws"] == calls["kill"]:
            raise KeyboardInterrupt
        return values(*a, **k)
    monkeypatch.setattr(epicprm, "prefix_values", counted)
    return calls


def test_a_block_killed_while_sampling_continues_from_its_last_call(base, tmp_path, monkeypatch, capsys):
    # one block of 4 problems, killed in its first sampling call (v(question): the groups kept) or in its last (every
    # call before it kept in OUT/block.pt): the resumed run draws no group again, samples only the calls not kept,
    # each from the random state of the same call in the run never stopped, and writes that run's lines
    flags = ["--model", "tiny", "--dataset", "tiny", "--limit", "4", "--n", "2", "--threads", str(THREADS),
             "--rules", "none", "--group-batch", "4"]
    calls, groups = killable(monkeypatch), {"drawn": 0}
    sample_groups = attribution.locate.sample_groups
    monkeypatch.setattr(attribution.locate, "sample_groups", lambda *a: groups.update(drawn=groups["drawn"] + 1)
                        or sample_groups(*a))
    attribution.main(flags + ["--out", str(tmp_path / "whole")])
    whole, every, drawn = (tmp_path / "whole" / "rollouts.jsonl").read_text(), calls["draws"], calls["rng"][:]
    assert every >= 4 and not (tmp_path / "whole" / "block.pt").exists()  # v(question), then the probes
    for kill in (1, every):
        out = tmp_path / f"killed-{kill}"
        calls.update(draws=0, kill=kill, rng=[])
        with pytest.raises(KeyboardInterrupt):
            attribution.main(flags + ["--out", str(out)])
        saved = torch.load(out / "block.pt", weights_only=True)
        assert saved["block"] == [0, 4] and "groups" in saved and len(saved["calls"]) == kill - 1
        assert not (out / "rollouts.jsonl").read_text()  # nothing of the block written yet
        calls.update(draws=0, kill=None, rng=[])
        groups["drawn"] = 0
        attribution.main(flags + ["--out", str(out)])
        assert (out / "rollouts.jsonl").read_text() == whole
        assert groups["drawn"] == 0 and calls["draws"] == every - kill + 1
        assert all(torch.equal(x, y) for x, y in zip(calls["rng"], drawn[kill - 1:]))
        assert not (out / "block.pt").exists()
    capsys.readouterr()
    # a save that is not one: said, and the block drawn whole
    (out / "rollouts.jsonl").write_text("")
    (out / "block.pt").write_bytes(b"cut short")
    calls["draws"] = 0
    attribution.main(flags + ["--out", str(out)])
    assert "block.pt: not a save of a block" in capsys.readouterr().out
    assert (out / "rollouts.jsonl").read_text() == whole and calls["draws"] == every
    # a save of a block beyond this --limit (a larger one's, under way) is kept for that run
    torch.save({"block": [4, 8], "calls": []}, out / "block.pt")
    attribution.main(flags + ["--out", str(out)])
    assert (out / "block.pt").exists()


def test_a_given_answer_killed_while_sampling_continues_from_its_last_call(base, tmp_path, monkeypatch):
    # --responses: one wrong answer of four steps, killed in its last sampling call, resumes from its kept
    # v(question) and probes, and writes what the run never stopped wrote
    path = given(tmp_path / "given.jsonl", [("1+8-3+8", "14", "1+8=9\n9-3=6\n6+8=15\n\\boxed{15}")])
    flags = ["--model", "tiny", "--dataset", "tiny", "--responses", str(path), "--n", "4", "--threads", str(THREADS),
             "--rules", "none"]
    calls = killable(monkeypatch)
    attribution.main(flags + ["--out", str(tmp_path / "whole")])
    whole, every, drawn = (tmp_path / "whole" / "rollouts.jsonl").read_text(), calls["draws"], calls["rng"][:]
    assert every >= 3 and '"rollout": 0' in whole  # v(question), then at least two probes: located
    calls.update(draws=0, kill=every, rng=[])
    with pytest.raises(KeyboardInterrupt):
        attribution.main(flags + ["--out", str(tmp_path / "killed")])
    assert len(torch.load(tmp_path / "killed" / "block.pt", weights_only=True)["calls"]) == every - 1
    calls.update(draws=0, kill=None, rng=[])
    attribution.main(flags + ["--out", str(tmp_path / "killed")])
    assert (tmp_path / "killed" / "rollouts.jsonl").read_text() == whole and calls["draws"] == 1
    assert len(calls["rng"]) == 1 and torch.equal(calls["rng"][0], drawn[-1])  # the state the unstopped run drew at


def test_rescore_adds_a_rule_to_the_located_lines_as_a_run_with_it_would_have(base, tmp_path, capsys):
    # A run scoring none and grail; its lines with grail taken out, then --rescore with grail again: the groups
    # drawn again give the lines of the first run exactly, nothing located again. Lines that are not what their
    # block draws again (here: one response edited; another problem's count of right answers) are reported and left
    # without the rule.
    out = tmp_path / "att"
    # 12 problems, so that at least three have located lines on any host's tiny base (on 2026-11-28's host the first 4
    # and 6 had two); --n-max 4: F3b's extra draws would change which lines there are to edit
    flags = ["--model", "tiny", "--dataset", "tiny", "--limit", "12", "--n", "4", "--threads", str(THREADS),
             "--rules", "none,grail", "--group-batch", "2", "--out", str(out), "--n-max", "4"]
    attribution.main(flags)
    whole = [json.loads(x) for x in open(out / "rollouts.jsonl")]
    rows = [x for x in whole if "rollout" in x]
    assert len({x["problem"] for x in rows}) >= 3 and all("grail" in x["blame"] for x in rows)
    stripped = json.loads(json.dumps(whole))
    for x in stripped:
        for key in ("blame", "scores", "scores_exact"):
            x.get(key, {}).pop("grail", None)
    first, second = sorted({x["problem"] for x in rows})[:2]
    edited = next(k for k, x in enumerate(stripped) if x.get("problem") == first and "rollout" in x)
    stripped[edited]["response"] += " "
    next(x for x in stripped if x["problem"] == second and x.get("done"))["correct"] += 1
    left = [k for k, x in enumerate(stripped) if k == edited or (x["problem"] == second and "rollout" in x)]
    (out / "rollouts.jsonl").write_text("".join(json.dumps(x) + "\n" for x in stripped))
    capsys.readouterr()
    attribution.main(flags + ["--rescore"])
    again = [json.loads(x) for x in open(out / "rollouts.jsonl")]
    assert capsys.readouterr().out.count("its group drawn again is another; not rescored") == len(left)
    assert [again[k] for k in left] == [stripped[k] for k in left]
    assert [x for k, x in enumerate(again) if k not in left and "rollout" in x] == \
        [x for k, x in enumerate(whole) if k not in left and "rollout" in x]


def test_a_rule_scoring_each_rollout_runs_on_the_wanted_rows_and_the_shortest_right_one(base, monkeypatch):
    # blames() for OAR-P (a forward per reasoning token) with rows=[0] of a group of four, two right answers of
    # different lengths: it perturbs row 0's reasoning and the shorter right one's only (the longer one's weights
    # would not be read), and row 0's blame is the whole group's (a rollout's OAR-P weights are its own)
    import data
    import oar
    p = attribution.parser()
    args = p.parse_args(["--model", "tiny", "--dataset", "tiny", "--threads", str(THREADS), "--rules", "oar-p"])
    args.max_new_tokens = data.dataset("tiny").max_new_tokens
    world = attribution.locate.World(attribution.check(p, args))
    problem = {"question": "1+1+1", "answer": "3"}
    prompt = world.tok(data.dataset("tiny").prompt(world.tok, problem))["input_ids"]
    texts = ["1+1=4\n4+1=6\n\\boxed{6}", "1+1=2\n2+1=3\n2+1=3\n\\boxed{3}", "1+1=1\n1+1=1\n\\boxed{1}",
             "1+1=2\n2+1=3\n\\boxed{3}"]
    responses = [world.tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    batch = attribution.given.scored_batch(world, prompt, responses)
    correct = [False, True, False, True]
    perturbed, scores = [], oar.perturbation_scores  # the reasoning tokens each call perturbs: a[3] is its mask
    monkeypatch.setattr(oar, "perturbation_scores", lambda *a, **k: perturbed.append(int(a[3].sum())) or
                        scores(*a, **k))
    part = attribution.locate.blames(world, batch, problem, correct, ["oar-p"], rows=[0])["oar-p"]
    reasoning = [oar.reasoning_length(world.piece_list(r)) for r in responses]  # [12, 18, 12, 12]: before "\boxed{"
    assert reasoning[1] > reasoning[3] and sum(perturbed) == reasoning[0] + reasoning[3]  # 12 + 12, not + 18
    perturbed.clear()
    whole = attribution.locate.blames(world, batch, problem, correct, ["oar-p"])["oar-p"]
    assert sum(perturbed) == sum(reasoning)  # the whole group: every row, 54
    # to float32's last bits, which the rows batched beside it move: a KL that barely moves the answer is a
    # difference of nearly equal log-probs, and O4's normalisation spreads that (up to 1e-3 here)
    assert (part[0][:reasoning[0]] != 1).any()  # row 0 was scored (an unscored rollout's weights stay 1)
    assert torch.allclose(part[0], whole[0], atol=1e-2)


def test_a_rescore_under_oar_p_limit_stops_drawing_groups_once_the_limit_is_met(base, tmp_path, monkeypatch):
    # rollouts located in two or more problems; --rescore --rules oar-p --oar-p-limit 1: the first problem with one
    # gets OAR-P (all of its located rollouts: a problem is scored whole), and no later block is drawn again
    out = tmp_path / "att"
    # --alpha 0.999: every located rollout confident (F3b's verdict depends on the CPU's floats), so that the
    # figure, which shows the confident ones, has OAR-P's
    flags = ["--model", "tiny", "--dataset", "tiny", "--limit", "4", "--n", "4", "--threads", str(THREADS),
             "--group-batch", "1", "--alpha", "0.999", "--out", str(out)]
    attribution.main(flags + ["--rules", "none"])
    located = sorted({x["problem"] for x in map(json.loads, open(out / "rollouts.jsonl")) if "rollout" in x})
    assert len(located) >= 2
    drawn, draw = [], attribution.locate.sample_groups
    monkeypatch.setattr(attribution.locate, "sample_groups",
                        lambda w, first, ps: drawn.append(first) or draw(w, first, ps))
    ticks, labels = [], attribution.report.tick_labels  # what the figure's x axis was given
    monkeypatch.setattr(attribution.report, "tick_labels", lambda summary: ticks.append(labels(summary)) or ticks[-1])
    attribution.main(flags + ["--rules", "oar-p", "--oar-p-limit", "1", "--rescore"])
    rows = [x for x in map(json.loads, open(out / "rollouts.jsonl")) if "rollout" in x]
    assert drawn == located[:1] and {x["problem"] for x in rows if "oar-p" in x["blame"]} == set(located[:1])
    # the figure names OAR-P's subset under its tick; the rules on every rollout (the baselines) stand bare
    scored = sum("oar-p" in x["blame"] for x in rows)
    assert ticks and f"oar-p\n({scored} rollouts)" in ticks[-1] and "position" in ticks[-1]
    # the report: every rule on all the located rollouts, then every rule again on the ones OAR-P scored
    text = (out / "table.md").read_text()
    assert f"**the same, on the {scored} rollouts every rule scored**" in text and scored < len(rows)
    assert text.split("every rule scored**")[1].count(f"| none | {scored} | max |") == 1
    # none on the rollouts OAR-P scored: no rollout has every rule, and the report says so instead of a table
    lines = [json.loads(x) for x in open(out / "rollouts.jsonl")]
    for x in lines:
        if "oar-p" in x.get("blame", {}):
            del x["blame"]["none"], x["scores"]["none"]
    text = attribution.report.report(str(out), lines, world_task=False)
    assert "no rollout was scored by every rule" in text and "every rule scored**" not in text


def test_the_figure_names_a_rule_scored_on_a_subset_with_its_count():
    # the title counts the most rollouts (29); OAR-P under --oar-p-limit scored 21 of them, its tick says so
    summary = {"none": {"n": 29}, "ktae": {"n": 29}, "oar-p": {"n": 21}}
    assert attribution.report.tick_labels(summary) == ["none", "ktae", "oar-p\n(21 rollouts)"]


def given(path, rows):
    """A --responses file of the tiny task: (question, answer, response) rows, or raw lines (str)."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(dict(zip(("question", "answer", "response"),
                                                                              r)))) + "\n" for r in rows))
    return path


def test_responses_report_what_this_mode_did_on_the_tiny_world(base, tmp_path, capsys):
    # Given answers, not sampled: the cost line counts the continuations only, the head what became of each response
    # (no sampled accuracy, no groups), the exact first error is found for them as for sampled ones (the report
    # divided by zero when none had it), and the seconds are this run's over what it located itself
    rows = [("1+1+1", "3", "1+1=2\n2+1=3\n\\boxed{3}"),  # right: nothing to locate
            ("5+0", "5", "\\boxed{6}"),  # wrong, one step
            ("1+1+1", "3", "1+1=2\n2+1=4\n\\boxed{4}"),
            ("2+2+1", "5", "2+2=5\n5+1=6\n")]  # wrong, without a box
    path, out = given(tmp_path / "given.jsonl", rows), tmp_path / "att"
    flags = ["--model", "tiny", "--dataset", "tiny", "--responses", str(path), "--n", "8", "--threads", str(THREADS),
             "--rules", "none,ktae,grail", "--out", str(out)]
    attribution.main(flags + ["--limit", "3"])
    first = capsys.readouterr().out
    assert "3 given responses (0 done before), n = 8: at most about 6,528 new tokens a wrong response" in first
    assert "G = " not in first and "G rollouts" not in first
    attribution.main(flags)
    text = capsys.readouterr().out
    lines = [json.loads(x) for x in open(out / "rollouts.jsonl")]
    located = [x for x in lines if "rollout" in x]
    assert {x["problem"] for x in located} <= {2, 3} and all(x["exact_step"] is not None for x in located)
    head = text.split("4 given responses (3 done before)")[1].splitlines()[1]
    assert head.startswith(f"4 given responses: {len(located)} located, 1 right (nothing to locate), 1 wrong of one "
                           f"step")
    assert "sampled accuracy" not in text and "mixed groups" not in text
    if 3 in {x["problem"] for x in located}:  # this run's time over this run's one located response
        assert head.endswith("s a located response in this run (1 located)")
    else:
        assert "a located response in this run" not in head  # ("3.0 steps a located response" is the F3 line's)
    assert f"Monte Carlo against the exact first error, the confident " in text  # F3b's, then every located:
    assert f"; every located {len(located)} rollouts: the same step" in text
    # the AUCs of the confident only
    sure = ", auc.png" if any(attribution.report.confident(x) for x in located) else ""
    assert f"wrote {out}/rollouts.jsonl, table.md{sure}, rollouts.html" in text
    # every response right: nothing located, the head says so, and only the files written are named
    right, out2 = given(tmp_path / "right.jsonl", rows[:1]), tmp_path / "att2"
    attribution.main(flags[:5] + [str(right)] + flags[6:-1] + [str(out2)])
    text = capsys.readouterr().out
    assert "1 given responses: 0 located, 1 right" in text and "no located response: no table" in text
    assert f"wrote {out2}/rollouts.jsonl, table.md\n" in text and not (out2 / "auc.png").exists()


@pytest.mark.parametrize("rows, message", [
    ([], r"--responses .*given.jsonl: no usable line \(of 0; each needs a question, an answer and a response\)$"),
    ([{"question": "1+1", "answer": None, "response": "1+1=3\n"}],
     r"no usable line \(of 1; .*\): .*given.jsonl:1: skipped \(its answer is null, not text\)$"),
    (['{"question": "1+1", "response": "1+1=3\\n"}', "[1, 2]"], r"given.jsonl:1: skipped \(no answer\)$"),
])
def test_responses_without_a_usable_line_are_one_line_before_the_model_loads(tmp_path, monkeypatch, rows, message):
    # an empty file loaded the model, then claimed files it had not written; null became the text "None"
    monkeypatch.setattr(attribution.locate, "World", lambda args: pytest.fail("the model was loaded"))
    path = given(tmp_path / "given.jsonl", [r if isinstance(r, str) else json.dumps(r) for r in rows])
    with pytest.raises(SystemExit, match=message):
        attribution.main(["--model", "tiny", "--dataset", "tiny", "--responses", str(path), "--out",
                          str(tmp_path / "att")])
    assert not (tmp_path / "att").exists()


def test_a_response_line_of_other_types_is_skipped_and_a_number_is_its_text(tmp_path, capsys):
    path = given(tmp_path / "given.jsonl", [json.dumps({"question": "1+1", "answer": None, "response": "x"}),
                                            json.dumps({"question": "1+1", "answer": 2, "response": "1+1=2\n"}),
                                            json.dumps({"question": ["1+1"], "answer": "2", "response": "x"})])
    args = attribution.parser().parse_args(["--responses", str(path)])
    rows = attribution.load(args, None)
    assert [(r["answer"], r["where"]) for r in rows] == [("2", f"{path}:2")]
    err = capsys.readouterr().err
    assert f"{path}:1: skipped (its answer is null, not text)" in err
    assert f"{path}:3: skipped (its question is [\"1+1\"], not text)" in err


@pytest.mark.parametrize("edit, message", [
    (lambda lines: [{k: v for k, v in lines[0].items() if k != "steps"}] + lines[1:], r":1: no \"steps\""),
    (lambda lines: lines[:-1] + [{k: v for k, v in lines[-1].items() if k != "correct"}], r":2: no \"correct\""),
    (lambda lines: [{"problem": 0}] + lines, r":1: neither a problem's line"),
    (lambda lines: ["{cut"] + lines, r":1: not JSON .*not the last line"),
    (lambda lines: [dict(lines[0], problem="0")] + lines[1:], r":1: \"problem\" is \"0\""),
])
def test_a_hand_edited_line_of_out_is_one_line_before_the_model_loads(tmp_path, monkeypatch, edit, message):
    # a problem's line and a located rollout's, each edited by hand: a KeyError after the model loaded, before
    out = tmp_path / "att"
    out.mkdir()
    problem = {"problem": 0, "done": True, "correct": 0, "group": 1, "given": True, "mixed": True, "v0": 0.5,
               "wrong": 1, "one_step": 0, "located": 1}
    rollout = {"problem": 0, "rollout": 0, "question": "1+1", "gold": "2", "response": "1+1=3\n3=3\n", "v0": 0.5,
               "steps": [{"tokens": [0, 6], "text": "1+1=3\n"}, {"tokens": [6, 10], "text": "3=3\n"}],
               "first_wrong_step": 0, "blame": {}, "scores": {}}
    lines = edit([rollout, problem])
    monkeypatch.setattr(attribution.locate, "World", lambda args: pytest.fail("the model was loaded"))
    path = given(tmp_path / "given.jsonl", [("1+1", "2", "1+1=3\n3=3\n")])
    # OUT as this command made it (its settings recorded, infra/outfolder.py), then its lines edited by hand
    from infra import outfolder
    p = attribution.parser()
    args = attribution.check(p, p.parse_args(["--model", "tiny", "--dataset", "tiny", "--responses", str(path)]))
    args.max_new_tokens = 48  # main's default for the tiny task, set before check there
    outfolder.claim(str(out), attribution.settings(args), False, False).close()
    (out / "rollouts.jsonl").write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    with pytest.raises(SystemExit, match=f"{out}/rollouts.jsonl{message}.*: mend or delete the line, or pass another "
                                         f"--out$"):
        attribution.main(["--model", "tiny", "--dataset", "tiny", "--responses", str(path), "--out", str(out)])


def test_given_responses_are_scored_in_chunks_with_the_numbers_of_one_forward(base, monkeypatch):
    # scored_batch's log-probs and entropies a chunk of tokens at a time (the whole [rows, tokens, vocabulary] took
    # about 2.9 GB at 1.5B) equal log_softmax over the model's own logits at once
    from conftest import assert_close
    p = attribution.parser()
    args = attribution.check(p, p.parse_args(["--model", "tiny", "--dataset", "tiny", "--threads", str(THREADS),
                                              "--temperature", "0.7"]))
    world = attribution.locate.World(args)
    prompt = world.tok(tiny.prompt("1+1+1"))["input_ids"]
    responses = [world.tok(t, add_special_tokens=False)["input_ids"] for t in ("1+1=2\n2+1=4\n\\boxed{4}", "1+1=2\n")]
    whole = attribution.given.scored_batch(world, prompt, responses, chunk_tokens=10**6)
    for chunk in (1, 5):
        part = attribution.given.scored_batch(world, prompt, responses, chunk_tokens=chunk)
        assert torch.equal(part["response_mask"], whole["response_mask"])
        assert_close(part["logprobs"], whole["logprobs"], rel=1e-5, what="chunked log-probs")
        assert_close(part["entropy"], whole["entropy"], rel=1e-5, what="chunked entropy")
    with torch.no_grad():
        logits = world.model(input_ids=whole["input_ids"], attention_mask=whole["attention_mask"]).logits
    logp = torch.log_softmax(logits[:, len(prompt) - 1:-1] / 0.7, -1)  # [N, T, V]
    m = whole["response_mask"]
    assert_close(whole["logprobs"], logp.gather(-1, whole["input_ids"][:, len(prompt):, None]).squeeze(-1) * m,
                 rel=1e-5, what="log-probs against the model's logits")
    assert_close(whole["entropy"], -(logp.exp() * logp).sum(-1) * m, rel=1e-5, what="entropy against the model's")


def test_each_sampling_call_of_attribution_hands_freed_memory_back(base, monkeypatch):
    # cpu.setup keeps freed memory for the next tensor; the attribution's long sampling calls hand it back as each
    # ends, so that the process holds what is live, not the most its heap ever held (issue 65)
    p = attribution.parser()
    args = p.parse_args(["--model", "tiny", "--dataset", "tiny", "--threads", str(THREADS), "--n", "4"])
    args.max_new_tokens = 48
    world = attribution.locate.World(attribution.check(p, args))
    world.problems = [{"question": "1+1+1", "answer": "3", "prompt": tiny.prompt("1+1+1")}]
    released = []
    monkeypatch.setattr(attribution.locate.memory, "release_freed_memory", lambda: released.append(1))
    prompt = world.tok(tiny.prompt("1+1+1"))["input_ids"]
    world.values([(prompt, "3")] * 2, [[], prompt[:0]])
    assert len(released) == 1
    attribution.locate.sample_groups(world, 0, world.problems)
    assert len(released) == 2


def test_the_memory_benchmark_prints_the_resident_set_after_each_call(base, capsys):
    # tools/perf/memgrowth.py at the tiny size: the model's own and a random one of its widths (the 1.5B's run is a
    # benchmark, docs/LOG.md 2026-11-28; this keeps the script running)
    from tools.perf import memgrowth
    for extra in ([], ["--layers", "2", "--hidden", "64"]):
        memgrowth.main(["--model", "tiny", "--calls", "2", "--max-new-tokens", "8", "--prompt-tokens", "5-9",
                        "--threads", str(THREADS), *extra])
        out = capsys.readouterr().out
        assert "the memory plan's sampling phase at this shape" in out
        assert all(f"call   {k}:" in out and "resident" in out for k in (1, 2))

def test_an_out_of_other_settings_is_refused_in_one_line_and_overwrite_starts_over(base, tmp_path):
    # issue 63: a continuation into an OUT made with another seed (or n, or model) reported the old lines under the
    # new command; now OUT records its settings and refuses another's, naming the setting and the way out
    import pytest
    from infra import outfolder
    out = tmp_path / "att"
    flags = ["--model", "tiny", "--dataset", "tiny", "--limit", "2", "--n", "2", "--threads", str(THREADS),
             "--rules", "none", "--out", str(out)]
    attribution.main(flags)
    lines = (out / "rollouts.jsonl").read_text()
    for other, said in ((["--seed", "1"], "--seed 0, not 1"), (["--n", "3"], "--n 2, not 3"),
                        (["--temperature", "0.5"], "--temperature 1.0, not 0.5")):
        with pytest.raises(SystemExit) as e:
            attribution.main(flags + other)
        assert said in str(e.value.code) and "--overwrite" in str(e.value.code) and "\n" not in str(e.value.code)
        assert (out / "rollouts.jsonl").read_text() == lines
    attribution.main(flags + ["--limit", "3"])  # a larger --limit continues: the lines of 0-1 kept
    assert (out / "rollouts.jsonl").read_text().startswith(lines)
    # another process writing there: refused while it holds the lock
    held = outfolder.claim(str(out), json.loads((out / "settings.json").read_text()), False, True)
    with pytest.raises(SystemExit) as e:
        attribution.main(flags)
    assert "another process is writing there now" in str(e.value.code)
    held.close()
    attribution.main(flags + ["--seed", "1", "--overwrite"])
    assert json.loads((out / "settings.json").read_text())["--seed"] == 1


def test_two_checkpoints_of_the_same_last_name_get_their_own_default_out(tmp_path):
    # issue 63: the default OUT was named after the model path's last part, so every RUN/checkpoint shared one
    for run in ("a", "b"):
        (tmp_path / run / "checkpoint").mkdir(parents=True)
    names = {attribution.short_name(str(tmp_path / run / "checkpoint")) for run in ("a", "b")}
    assert len(names) == 2 and all(n.startswith("checkpoint-") for n in names)
    assert attribution.short_name("tiny") == "tiny" and attribution.short_name("Qwen/Qwen2.5-0.5B") == \
        "Qwen--Qwen2.5-0.5B"


def test_a_model_whose_weights_changed_in_place_is_another_model(tmp_path):
    from infra import models
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.safetensors").write_bytes(b"one")
    before = models.identity(str(tmp_path / "m"))
    (tmp_path / "m" / "model.safetensors").write_bytes(b"two")
    assert models.identity(str(tmp_path / "m")) != before
    assert models.identity("tiny") == {"name": "tiny"}


def test_an_out_that_is_a_file_is_one_line(tmp_path):
    # adversarial pass of issue 63: a file named as --out was "cannot write there (File exists)"
    import pytest
    from infra import outfolder
    (tmp_path / "f").write_text("x")
    with pytest.raises(SystemExit) as e:
        outfolder.claim(str(tmp_path / "f"), {}, False, False)
    assert str(e.value.code) == f"--out {tmp_path / 'f'}: a file, not a folder; choose another --out"


def test_a_block_saved_on_a_full_disk_is_one_line_and_keeps_the_last_whole_save(tmp_path, monkeypatch):
    # round four: block.pt's save on a full disk was a traceback (torch.save's own error) and left a cut .tmp; now
    # one line, the .tmp gone and the last whole save in place, from which the same command continues
    import errno
    import os
    progress = attribution.progress.Progress(str(tmp_path), range(0, 2))
    progress.save(groups=[1, 2])
    whole = (tmp_path / attribution.progress.PROGRESS).read_bytes()
    real = attribution.progress.torch.save

    def full(obj, path):
        real(obj, path)
        with open(path, "r+b") as f:
            f.truncate(10)
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(attribution.progress.torch, "save", full)
    with pytest.raises(SystemExit) as e:
        progress.save(groups=[1, 2, 3])
    said = str(e.value.code)
    saved = tmp_path / attribution.progress.PROGRESS
    assert said.startswith(f"{saved}: the work so far of problems 0-1 could not be saved "
                           f"(") and "No space left on device" in said and "\n" not in said, said
    assert os.listdir(tmp_path) == [attribution.progress.PROGRESS] and saved.read_bytes() == whole
    monkeypatch.setattr(attribution.progress.torch, "save", real)
    assert attribution.progress.Progress(str(tmp_path), range(0, 2)).get("groups") == [1, 2]


@pytest.mark.parametrize("flags, said", [
    (["--prompt-tokens", "300-150"], "'300-150': needs 1 <= LOW <= HIGH"),
    (["--prompt-tokens", "150"], "'150': not a range"), (["--n", "0"], "--n 0: must be at least 1"),
    (["--calls", "0"], "--calls 0: must be at least 1"), (["--hidden", "64"], "--hidden 64: only with --layers"),
    (["--temperature", "0"], "--temperature 0.0: must be at least")])
def test_the_memory_benchmark_refuses_a_bad_value_in_one_line_before_the_model_loads(monkeypatch, capsys, flags,
                                                                                     said):
    # round four: a bad --prompt-tokens range or --n 0 was a traceback after the model loaded
    from tools.perf import memgrowth
    monkeypatch.setattr(memgrowth, "load", lambda args: pytest.fail("the model loaded"))
    with pytest.raises(SystemExit) as e:
        memgrowth.main(["--model", "tiny", "--threads", "1", *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and said in err[0] and "usage" not in err[0], err
