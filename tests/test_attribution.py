"""The first wrong step by Monte Carlo (epicprm.py, F1-F4) and tools/attribution.py at a small size: the bisection
against every prefix tested in turn, the threshold, the steps of a response, the step blame, the prefix values on
the tiny model, and a run of the command that writes, resumes and scores."""
import json
import math

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
    # 0.9 0.7 0.5 0.3 0.1; the whole response (step 6) is wrong. First below 0.4: step 4 (index 3).
    spans = [(2 * k, 2 * k + 2) for k in range(6)]
    v = {2: 0.9, 4: 0.7, 6: 0.5, 8: 0.3, 10: 0.1}  # prefix tokens -> v
    loc = epicprm.Locate(spans, 0.8 / 2)
    while not loc.done():
        loc.tell(v[loc.probe()])
    assert loc.step == 3 and len(loc.tests) <= 3 and loc.token is None  # bisection: 3 tests, not 5
    # half of v(question) is the threshold: at the question's own value (0.8) the first below would be step 2
    loc = epicprm.Locate(spans, 0.8)
    while not loc.done():
        loc.tell(v[loc.probe()])
    assert loc.step == 1
    # refine: inside step 4 (tokens 6, 7), through token 6 is 0.45, so the first wrong token is 7
    v_tok = {**v, 7: 0.45}
    loc = epicprm.Locate(spans, 0.4, refine=True)
    while not loc.done():
        loc.tell(v_tok[loc.probe()])
    assert (loc.step, loc.token) == (3, 7)
    # many at once: locate_all asks each unfinished search's prefix in one round
    rounds = []
    locs = [epicprm.Locate(spans, 0.4), epicprm.Locate(spans[:2], 0.4)]
    epicprm.locate_all(locs, lambda idx, lengths: rounds.append(idx) or [v[n] for n in lengths])
    assert [x.step for x in locs] == [3, 1] and rounds[0] == [0, 1]  # both asked in the first round


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
    drawn = attribution.sample_groups

    def all_cut(world, first, problems):
        groups = drawn(world, first, problems)
        for _, batch, _, correct in groups.values():
            batch["truncated"] = torch.tensor([not c for c in correct])
        return groups

    monkeypatch.setattr(attribution, "sample_groups", all_cut)
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
        assert set(r["scores"]) == {"position", "surprisal", "none", "ktae", "grail"} == set(r["scores_exact"])
        assert r["scores"]["none"]["max"]["auc"] == 0.5  # uniform blame: the chance level
        below = [p for p in r["probes"] if p["v"] < r["threshold"]]  # F3: the step's own prefix is below, if tested
        assert all(p["tokens"] >= r["steps"][k]["tokens"][1] for p in below)
    assert (out / "table.md").exists() and (out / "auc.png").exists() and (out / "rollouts.html").exists()
    assert "against the exact first error" in capsys.readouterr().out
    attribution.main(flags)
    assert [json.loads(x) for x in open(out / "rollouts.jsonl")] == lines


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


def test_rescore_adds_a_rule_to_the_located_lines_as_a_run_with_it_would_have(base, tmp_path, capsys):
    # A run scoring none and grail; its lines with grail taken out, then --rescore with grail again: the groups
    # drawn again give the lines of the first run exactly, nothing located again. Lines that are not what their
    # block draws again (here: one response edited; another problem's count of right answers) are reported and left
    # without the rule.
    out = tmp_path / "att"
    flags = ["--model", "tiny", "--dataset", "tiny", "--limit", "4", "--n", "4", "--threads", str(THREADS),
             "--rules", "none,grail", "--group-batch", "2", "--out", str(out)]
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
    world = attribution.World(attribution.check(p, args))
    problem = {"question": "1+1+1", "answer": "3"}
    prompt = world.tok(data.dataset("tiny").prompt(world.tok, problem))["input_ids"]
    texts = ["1+1=4\n4+1=6\n\\boxed{6}", "1+1=2\n2+1=3\n2+1=3\n\\boxed{3}", "1+1=1\n1+1=1\n\\boxed{1}",
             "1+1=2\n2+1=3\n\\boxed{3}"]
    responses = [world.tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    batch = attribution.scored_batch(world, prompt, responses)
    correct = [False, True, False, True]
    perturbed, scores = [], oar.perturbation_scores  # the reasoning tokens each call perturbs: a[3] is its mask
    monkeypatch.setattr(oar, "perturbation_scores", lambda *a, **k: perturbed.append(int(a[3].sum())) or
                        scores(*a, **k))
    part = attribution.blames(world, batch, problem, correct, ["oar-p"], rows=[0])["oar-p"]
    reasoning = [oar.reasoning_length(world.piece_list(r)) for r in responses]  # [12, 18, 12, 12]: before "\boxed{"
    assert reasoning[1] > reasoning[3] and sum(perturbed) == reasoning[0] + reasoning[3]  # 12 + 12, not + 18
    perturbed.clear()
    whole = attribution.blames(world, batch, problem, correct, ["oar-p"])["oar-p"]
    assert sum(perturbed) == sum(reasoning)  # the whole group: every row, 54
    # to float32's last bits, which the rows batched beside it move: a KL that barely moves the answer is a
    # difference of nearly equal log-probs, and O4's normalisation spreads that (up to 1e-3 here)
    assert (part[0][:reasoning[0]] != 1).any()  # row 0 was scored (an unscored rollout's weights stay 1)
    assert torch.allclose(part[0], whole[0], atol=1e-2)


def test_a_rescore_under_oar_p_limit_stops_drawing_groups_once_the_limit_is_met(base, tmp_path, monkeypatch):
    # rollouts located in two or more problems; --rescore --rules oar-p --oar-p-limit 1: the first problem with one
    # gets OAR-P (all of its located rollouts: a problem is scored whole), and no later block is drawn again
    out = tmp_path / "att"
    flags = ["--model", "tiny", "--dataset", "tiny", "--limit", "4", "--n", "4", "--threads", str(THREADS),
             "--group-batch", "1", "--out", str(out)]
    attribution.main(flags + ["--rules", "none"])
    located = sorted({x["problem"] for x in map(json.loads, open(out / "rollouts.jsonl")) if "rollout" in x})
    assert len(located) >= 2
    drawn, draw = [], attribution.sample_groups
    monkeypatch.setattr(attribution, "sample_groups", lambda w, first, ps: drawn.append(first) or draw(w, first, ps))
    ticks, labels = [], attribution.tick_labels  # what the figure's x axis was given
    monkeypatch.setattr(attribution, "tick_labels", lambda summary: ticks.append(labels(summary)) or ticks[-1])
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
    text = attribution.report(str(out), lines, world_task=False)
    assert "no rollout was scored by every rule" in text and "every rule scored**" not in text


def test_the_figure_names_a_rule_scored_on_a_subset_with_its_count():
    # the title counts the most rollouts (29); OAR-P under --oar-p-limit scored 21 of them, its tick says so
    summary = {"none": {"n": 29}, "ktae": {"n": 29}, "oar-p": {"n": 21}}
    assert attribution.tick_labels(summary) == ["none", "ktae", "oar-p\n(21 rollouts)"]


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
