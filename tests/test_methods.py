"""methods.py: --method as a base and a token rule, each rule through the table; config.py's presets; D2's
fill_batch on a hand-made batch."""
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from config import training
import dapo
import ktae
import methods
import oar
import sample
import train

SMALL = ["--prompts-per-step", "4", "--group-size", "4", "--eval-limit", "16", "--eval-every", "1000"]


def test_the_six_names_and_every_base_with_every_rule():
    assert [methods.parse(m) for m in ("grpo", "dapo", "ktae", "dapo+ktae", "oar-p", "oar-g")] == [
        ("grpo", "none", None), ("dapo", "none", None), ("grpo", "ktae", None), ("dapo", "ktae", None),
        ("grpo", "oar-p", None), ("grpo", "oar-g", None)]
    assert methods.parse("dapo+oar-g") == ("dapo", "oar-g", None) and "dapo+oar-g" in methods.names()
    with pytest.raises(ValueError, match="--method grpo\\+nope"):
        methods.parse("grpo+nope")


def test_method_dapo_sets_its_preset_and_a_flag_given_wins():
    a = training.parse_args(["--method", "dapo", "--max-new-tokens", "48"])
    assert (a.eps_high, a.agg, a.dynamic_sampling, a.keep_surplus, a.signed_reward) == (
        0.28, "token-mean", True, True, True)
    assert a.overlong_buffer == 8  # a sixth of --max-new-tokens: 48 // 6
    g = training.parse_args(["--method", "ktae"])
    assert (g.eps_high, g.agg, g.dynamic_sampling, g.overlong_buffer, g.signed_reward) == (
        None, "seq-mean-token-mean", False, 0, False)
    b = training.parse_args(["--method", "dapo", "--eps-high", "0.3", "--no-dynamic-sampling", "--agg",
                           "seq-mean-token-mean"])
    assert (b.eps_high, b.dynamic_sampling, b.agg, b.signed_reward) == (0.3, False, "seq-mean-token-mean", True)
    # a rule's defaults: OAR-P probes the last position, OAR-G the teacher-forced answer (O1)
    assert training.parse_args(["--method", "dapo+oar-p"]).oar_probe == "last"
    assert training.parse_args(["--method", "oar-g"]).oar_probe == "answer_mean"


def _ctx(args_list, model=None, tok=None, problems=None):
    return methods.Context(training.parse_args(args_list), model, tok, problems or [])


def test_rule_none_broadcasts_g1():
    # r = [1, 1, 0, 0]: mean 0.5, unbiased std sqrt(1/3) = 0.57735 -> A = +-0.5 / 0.57735 = +-0.86603
    rewards = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]]).float()
    got = methods.RULES["none"].advantages({}, rewards, mask, _ctx(["--group-size", "4"]))
    a = 0.5 / (1 / 3) ** 0.5
    assert torch.allclose(got.seq, torch.tensor([a, a, -a, -a]), rtol=1e-5)
    assert torch.allclose(got.tokens, torch.tensor([[a, a, 0], [a, 0, 0], [-a, -a, -a], [-a, -a, 0]]), rtol=1e-5)
    assert got.values is None


class _Tok:
    pad_token_id, eos_token_id = 0, 9


def test_rule_ktae_adds_key_token_values_to_g1():
    # group r = [1, 1, 0, 0]; token 5 occurs in both right rollouts only, token 7 in both wrong ones only, token 3
    # everywhere. K7: A_{i,t} = A_i + KTV: 5 gets a positive value, 7 a negative one, 3 (no information) 0.
    resp = torch.tensor([[3, 5, 9], [5, 3, 9], [3, 7, 9], [7, 3, 9]])
    batch = {"input_ids": torch.cat([torch.ones(4, 2, dtype=torch.long), resp], 1), "prompt_len": 2}
    mask = torch.ones(4, 3)
    rewards = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    got = methods.RULES["ktae"].advantages(batch, rewards, mask, _ctx(["--method", "ktae", "--group-size", "4"],
                                                                        tok=_Tok()))
    v = got.values
    assert v[0, 1] > 0 and v[2, 1] < 0 and v[0, 0] == 0 and v[0, 2] == 0  # 5 +, 7 -, 3 none, EOS never
    assert torch.allclose(v[0, 1], -v[2, 1])  # symmetric table: same strength, opposite direction
    direct, _ = ktae.token_values(resp, mask, rewards, special_ids=(0, 9))
    assert torch.equal(got.tokens, ktae.token_advantages(got.seq, direct, mask))


class _TokEos:
    pad_token_id, eos_token_id = 0, 99


def ktae_worked_example():
    """EQUATIONS.md's KTAE worked example, r = [1, 1, 0, 0], each response ending in EOS (99): (batch, rewards, mask,
    ctx) for the rule."""
    resp = torch.tensor([[5, 6, 7, 99], [5, 6, 8, 99], [5, 9, 8, 99], [5, 9, 9, 99]])
    batch = {"input_ids": torch.cat([torch.ones(4, 2, dtype=torch.long), resp], 1), "prompt_len": 2}
    ctx = _ctx(["--method", "ktae", "--group-size", "4"], tok=_TokEos())
    return batch, torch.tensor([[1.0, 1.0, 0.0, 0.0]]), torch.ones(4, 4), ctx


def test_rule_ktae_terms_are_the_worked_examples_k1_to_k7_and_say_why_a_value_saturates():
    # By hand (EQUATIONS.md#ktae-worked-example; n_T = n_F = 2):
    #   id 5: in every rollout            a=2 b=2  p=1  F=0  IG=0        S=0 -> KTV 0
    #   id 6: in both right ones only     a=2 b=0  p=1/3 (P(k) = 1/6, 4/6, 1/6)  F=exp(-2/3)=0.5134  IG=1
    #         S=(F+IG)/2=0.7567, TF_F=0 so D = h + TF_T/1e-5, huge           -> KTV +1, saturated
    #   id 7: in rollout 1 only           a=1 b=0  p=1  F=0  IG=0.3113  S=0.1556, D huge again -> +1, saturated
    #   id 8: in rollouts 2 and 3         a=1 b=1  p=1  IG=0  S=0        -> 0
    #   id 9: in both wrong ones, once in o_3 and twice in o_4: a=0 b=2, count in wrong 3, the mirror of 6 -> -1
    #   EOS (99): in every rollout, never a key token -> 0
    batch, rewards, mask, ctx = ktae_worked_example()
    got = methods.RULES["ktae"].advantages(batch, rewards, mask, ctx)
    t = got.terms
    assert t["K1 n_T (right rollouts)"].eq(2).all() and t["K1 n_F (wrong rollouts)"].eq(2).all()
    assert t["K2 a (right rollouts with it)"][:, :3].tolist() == [[2, 2, 1], [2, 2, 1], [2, 0, 1], [2, 0, 0]]
    assert t["K2 b (wrong rollouts with it)"][:, :3].tolist() == [[2, 0, 0], [2, 0, 1], [2, 2, 1], [2, 2, 2]]
    assert t["K2 a (right rollouts with it)"][0, 3] == 2 and t["K2 b (wrong rollouts with it)"][0, 3] == 2  # EOS
    assert t["K5 count in wrong"][3, 1] == 3 and t["K5 count in right"][3, 1] == 0  # id 9: 1 + 2 occurrences
    assert torch.allclose(t["K3 Fisher p"][0, 1], torch.tensor(1 / 3)) and t["K3 Fisher p"][0, 2] == 1
    assert torch.allclose(t["K3 strength F"][0, 1], torch.tensor(0.513417), atol=1e-6) and t["K3 strength F"][0, 2] == 0
    assert t["K4 information gain IG"][0, 1] == 1 and torch.allclose(t["K4 information gain IG"][0, 2],
                                                                    torch.tensor(0.311278), atol=1e-6)
    assert torch.allclose(t["K6 strength S"][0, 1], torch.tensor(0.756709), atol=1e-6)
    assert t["K5 direction D"][0, 1] > 1e4 and t["K5 direction D"][3, 1] < -1e4  # the 1e-5 in K5
    assert torch.equal(t["K6 value"], got.values) and torch.equal(t["K7 A_i + value"], got.tokens)
    assert got.values[:, :3].tolist() == [[0, 1, 1], [0, 1, 0], [0, -1, 0], [0, -1, -1]]
    assert (got.values[:, 3] == 0).all()
    flag = lambda start: next(v for k, v in t.items() if k.startswith(start))  # noqa: E731
    one_class = flag("saturated: the id occurs in one class only")
    assert one_class[:, :3].tolist() == [[0, 1, 1], [0, 1, 0], [0, 1, 0], [0, 1, 1]] and (one_class[:, 3] == 0).all()
    assert (t["K6 S*D"][one_class.bool()].abs() >= 7.6).all()  # what the reason says
    assert flag("note: S = 0")[:, :3].tolist() == [[1, 0, 0], [1, 0, 1], [1, 0, 1], [1, 0, 0]]
    assert flag("note: pad or EOS")[:, 3].eq(1).all() and flag("note: pad or EOS")[:, :3].eq(0).all()
    part = got.rows(slice(2, 4))  # what TRL's path takes of a rule's advantages (scaling/trl_grpo.py)
    assert torch.equal(part.terms["K5 count in wrong"], t["K5 count in wrong"][2:4]) and part.values.shape == (2, 4)


def test_rules_entropy_and_surprisal_terms_by_hand():
    # E1: one rollout of entropies [0.1, 0.2, 0.3, 0.4, 0.5], share 0.2: tau = 0.42, only the last kept (entropy.py)
    # U1: a wrong rollout (A_i < 0) of log-probs [-0.1, -2.0, -0.9]: s = [0.1, 2.0, 0.9], mean 1, w = s (surprisal.py);
    # its partner, right, keeps A_i on every token and says so
    rewards = torch.tensor([[1.0, 0.0]])
    ent = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5], [0.0] * 5])
    e = methods.RULES["entropy"].advantages({"entropy": ent}, rewards, torch.tensor([[1.0] * 5, [0.0] * 5]),
                                            _ctx(["--method", "entropy", "--group-size", "2"]))
    assert torch.allclose(e.terms["E1 tau (the batch's 0.8-quantile)"][0], torch.tensor(0.42))
    assert e.terms["E1 kept (H >= tau)"][0].tolist() == [0, 0, 0, 0, 1]
    assert torch.equal(e.terms["E1 A_i if kept, else 0"], e.tokens) and torch.equal(e.terms["E1 entropy H (nats)"],
                                                                                   e.values)
    lp = torch.tensor([[-0.5, -0.5, -0.5], [-0.1, -2.0, -0.9]])
    u = methods.RULES["surprisal"].advantages({"logprobs": lp}, rewards, torch.ones(2, 3),
                                              _ctx(["--method", "surprisal", "--group-size", "2"]))
    assert torch.allclose(u.terms["U1 surprisal s = -log p"][1], torch.tensor([0.1, 2.0, 0.9]))
    assert torch.allclose(u.terms["U1 rollout's mean s"][1], torch.tensor([1.0] * 3))
    assert torch.allclose(u.terms["U1 weight s / mean"][1], torch.tensor([0.1, 2.0, 0.9]))
    unused = next(v for k, v in u.terms.items() if k.startswith("note: A_i >= 0"))
    assert unused.tolist() == [[1, 1, 1], [0, 0, 0]]


@pytest.mark.parametrize("rule", ["oar-p", "oar-g"])
def test_rule_oar_reweights_the_reasoning_and_keeps_its_total(base, rule):
    # O5 keeps the sum of the weights over the R reasoning tokens equal to R, and O6 scales A_i by them; the
    # answer after "\boxed{" and the EOS keep weight 1
    model, tok = base
    torch.manual_seed(0)
    problems = [{"prompt": "Q:7+8-9=?\nA:", "answer": "6"}]
    batch = sample.generate(model, [tok(problems[0]["prompt"])["input_ids"]], n=4, max_new_tokens=30,
                            temperature=1.0, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    rewards = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    mask = batch["response_mask"].float()
    ctx = methods.Context(training.parse_args(["--method", rule, "--group-size", "4"]), model, tok, problems)
    got = methods.RULES[rule].advantages(batch, rewards, mask, ctx)
    assert torch.allclose(got.tokens, oar.token_advantages(got.seq, got.values, mask))
    resp = batch["input_ids"][:, batch["prompt_len"]:]
    for i in range(4):
        n = int(mask[i].sum()) - (0 if batch["truncated"][i] else 1)  # without the EOS
        pieces = [tok.decode([t]) for t in resp[i, :n].tolist()]
        R = oar.reasoning_length(pieces)
        w = got.values[i]
        assert torch.allclose(w[:R].sum(), torch.tensor(float(R)), rtol=1e-4)
        assert torch.all(w[R:] == 1)
        # the terms behind it: O4's Ihat on the R reasoning tokens only, min-max so its top is 1; O5's floor is the
        # row's lowest weight; the rest are flagged unscored
        t = {k.split(" (")[0] if k.startswith("O5 tau") else k: v[i] for k, v in got.terms.items()}
        ihat, scored = t["O4 normalised Ihat"], ~t["O4 normalised Ihat"].isnan()
        assert scored[:R].all() and not scored[R:].any() and ihat[:R].max() == 1
        assert torch.equal(t["O5 Bi-Level weight"], w * mask[i])
        assert (~t[("O2 perturbation" if rule == "oar-p" else "O3 gradient") + " score I"][:R].isnan()).all()
        floored = next(v for k, v in t.items() if k.startswith("saturated: O5 floors")).bool()
        assert floored.any() and torch.allclose(w[floored], w[:R].min().expand(int(floored.sum())))
        assert (ihat[floored] / t["O5 tau"][floored] < 0.1).all()
        unscored = next(v for k, v in t.items() if k.startswith("note: not scored"))
        assert torch.equal(unscored, (~scored).float() * mask[i])


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_blocks(title: str = "Adding a token rule") -> list:
    """The indented blocks of a README section: "Adding a token rule" holds the rule file and the command that runs
    it, "A quick ablation" a variant's command, the ablation's file and its command."""
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
    blocks, block = [], []
    for line in section.splitlines() + ["end"]:
        if line.startswith("    ") or (block and not line.strip()):
            block.append(line[4:])
        elif block:
            blocks, block = blocks + ["\n".join(block).strip() + "\n"], []
    return blocks


@pytest.fixture
def readme_rules(tmp_path):
    """The README's rule file, written as the README says, loaded; its rule taken out of the table afterwards."""
    source, command = readme_blocks()[:2]
    path = tmp_path / "my_rules.py"
    path.write_text(source)
    yield path, command
    methods.RULES.pop("no-eos", None)
    methods._LOADED.pop(str(path), None)


def test_the_readme_rule_runs_as_written(base, readme_rules, tmp_path):
    # the README's no_eos and its command, as they stand there, so that neither can drift from the code
    path, command = readme_rules
    assert methods.load_rules(str(path)) == ["no-eos"]
    # by hand: one group, r = [1, 0] -> G1 = [+0.7071, -0.7071]; the EOS column (id eos) keeps --eos-share 0.5
    eos = base[1].eos_token_id
    batch = {"input_ids": torch.tensor([[9, 5, eos], [9, 6, 7]]), "prompt_len": 1}
    mask = torch.ones(2, 2)
    ctx = methods.Context(SimpleNamespace(no_std_scale=False, device="cpu", eos_share=0.5), None, base[1], [])
    adv = methods.RULES["no-eos"].advantages(batch, torch.tensor([[1.0, 0.0]]), mask, ctx)
    a = 0.5 / (0.5 ** 0.5 + 1e-6)
    assert torch.allclose(adv.tokens, torch.tensor([[a, 0.5 * a], [-a, -a]]), atol=1e-6)
    # the README's command line, from the folder that holds my_rules.py, with a short run's flags after it
    words = command.split()
    assert words[:4] == ["python", "train.py", "--rules-file", "my_rules.py"] and "--eos-share" in words
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *words[2:], "--steps", "1", "--run-dir",
                           str(run_dir), "--threads", "1", "--save-every", "0", *SMALL], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    info = json.load(open(run_dir / "run.json"))
    assert info["method"] == "no-eos" and info["args"]["eos_share"] == 0.5 and info["args"]["rules_file"]
    record = [json.loads(line) for line in open(run_dir / "metrics.jsonl") if '"accuracy"' in line][0]
    assert record["groups_kept"] == 4


def test_a_rule_file_that_cannot_serve_is_one_line(tmp_path):
    bad = {"broken.py": "import methods\nmethods.RULES['x'] = methods.Rule(nope)\n",
           "empty.py": "import methods\n",
           "clash.py": "import methods\nmethods.RULES['ktae'] = methods.Rule(methods.none)\n"}
    why = {"broken.py": "does not import \\(NameError: name 'nope' is not defined, line 2 of broken.py\\)",
           "empty.py": "adds no rule", "clash.py": "replaces the rule ktae"}
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=why[name]):
            methods.load_rules(str(tmp_path / name))
        assert "x" not in methods.RULES and methods.RULES["ktae"].advantages is methods.key_tokens
    with pytest.raises(ValueError, match="no such file"):
        methods.load_rules(str(tmp_path / "missing.py"))
    # a knob that is another rule's with another default, and an equation replaced for every rule (the original of a
    # comparison too): refused, the table as it was
    knob = ("import methods\ndef mine(b, r, m, c):\n    return methods.none(b, r, m, c)\n"
            "methods.RULES['mine'] = methods.Rule(mine, knobs=(methods.Knob('--ktae-alpha', 5.0, 'mine'),))\n")
    patch = ("import ktae, methods, torch\nold = ktae.direction\nktae.direction = lambda *a, **k: torch.sign(old(*a, "
             "**k))\nmethods.RULES['ktae-sign2'] = methods.Rule(methods.key_tokens)\n")
    for name, text, said in (("knob.py", knob, "its knob --ktae-alpha is a flag of ktae already"),
                             ("patch.py", patch, "replaces ktae.direction for every rule")):
        (tmp_path / name).write_text(text)
        original = ktae.direction
        with pytest.raises(ValueError, match=said):
            methods.load_rules(str(tmp_path / name))
        ktae.direction = original  # the refused file's import already ran
        assert "mine" not in methods.RULES and "ktae-sign2" not in methods.RULES
    # a knob named like one of train.py's own flags: one line, not argparse's traceback
    (tmp_path / "lr.py").write_text(knob.replace("'--ktae-alpha', 5.0", "'--lr', 5.0").replace("mine", "mine2"))
    try:
        with pytest.raises(SystemExit, match="a knob of its is a flag of train.py already"):
            training.parse_args_one_line(["--rules-file", str(tmp_path / "lr.py"), "--method", "grpo"])
    finally:
        methods.RULES.pop("mine2", None)
    done = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--rules-file", str(tmp_path / "empty.py"),
                           "--method", "grpo"], capture_output=True, text=True)
    assert done.returncode != 0 and done.stderr.strip().count("\n") == 0 and "adds no rule" in done.stderr


def test_a_rule_file_edited_before_resume_is_refused(base, readme_rules, tmp_path):
    path, _ = readme_rules
    run_dir = str(tmp_path / "run")
    flags = ["--rules-file", str(path), "--method", "no-eos", "--run-dir", run_dir, "--save-every", "1", *SMALL]
    train.main(flags + ["--steps", "1", "--no-final-eval"])
    path.write_text(path.read_text().replace("(1 - ctx.args.eos_share))", "(1 - ctx.args.eos_share)) * -5"))
    with pytest.raises(SystemExit, match="--resume: .* is a run with --rules-file-sha256 "):
        train.main(flags + ["--steps", "2", "--resume", "--no-final-eval"])


def test_a_knob_belongs_to_its_rule():
    # given to a method whose rule does not read it: refused, not recorded and ignored
    with pytest.raises(SystemExit, match="--ktae-alpha 0.0: a flag of ktae, which --method grpo does not use"):
        training.parse_args_one_line(["--method", "grpo", "--ktae-alpha", "0"])
    with pytest.raises(SystemExit, match="--oar-chunk 4: a flag of oar-p, oar-g, grail, which --method ktae"):
        training.parse_args_one_line(["--method", "ktae", "--oar-chunk", "4"])
    # the rule's default for the data or model fills a knob left out; a knob given wins; others keep their default
    a = training.parse_args_one_line(["--method", "oar-g"])
    assert (a.oar_probe, a.oar_chunk, a.ktae_alpha) == ("answer_mean", 64, 1.0)
    assert training.parse_args_one_line(["--method", "oar-g", "--oar-probe", "last"]).oar_probe == "last"
    # a knob's own range, checked where its rule runs
    with pytest.raises(SystemExit, match="--oar-q 1.5: O5's quantile level must lie strictly between 0 and 1"):
        training.parse_args_one_line(["--method", "dapo+oar-p", "--oar-q", "1.5"])
    # --help lists each rule's knobs under its name
    text = training.parser().format_help()
    assert "rule ktae:\n  --ktae-alpha" in text and "rules oar-p, oar-g, grail:\n  --oar-chunk" in text


def _round(correct: list, tag: int, G: int = 2, T: int = 3):
    """A batch in generate()'s layout whose rows are recognisable: input_ids = tag * 10 + row."""
    n = len(correct) * G
    ids = (tag * 10 + torch.arange(n))[:, None].repeat(1, 1 + T)  # prompt width 1
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "response_mask": torch.ones(n, T),
            "logprobs": torch.zeros(n, T), "entropy": torch.zeros(n, T), "truncated": torch.zeros(n, dtype=torch.bool),
            "correct": torch.tensor([c for group in correct for c in group]), "prompt_len": 1}


def test_d2_fill_batch_keeps_b_mixed_groups_and_buffers_the_rest():
    # B = 2, G = 2. Round 1: groups [mixed, all right] -> 1 kept (rows 10, 11). Round 2: [mixed, mixed] -> 3 in
    # all: the batch is round 1's group and round 2's first (rows 20, 21); round 2's second (rows 22, 23) waits.
    rounds = iter([(["a", "b"], _round([[True, False], [True, True]], 1)),
                   (["c", "d"], _round([[False, True], [True, False]], 2))])
    got = dapo.fill_batch(lambda: next(rounds), B=2, G=2, max_rounds=10, buffer=([], []), keep_surplus=True, pad_id=0)
    assert got.problems == ["a", "c"] and got.batch["input_ids"][:, 0].tolist() == [10, 11, 20, 21]
    assert got.buffer[0] == ["d"] and got.buffer[1][0]["input_ids"][:, 0].tolist() == [22, 23]
    assert (got.generated, got.rounds, got.carried, got.mixed) == (4, 2, 0, 3)
    # the next step starts from the buffer: one more mixed group fills it, and nothing is left over
    rounds = iter([(["e", "f"], _round([[True, True], [False, True]], 3))])
    nxt = dapo.fill_batch(lambda: next(rounds), 2, 2, 10, got.buffer, True, 0)
    assert nxt.problems == ["d", "f"] and nxt.batch["input_ids"][:, 0].tolist() == [22, 23, 32, 33]
    assert (nxt.carried, nxt.mixed, nxt.buffer) == (1, 1, ([], []))
    # without the buffer (verl) the surplus is dropped; with no mixed group after max_rounds there is no batch
    rounds = iter([(["a", "b"], _round([[True, False], [True, True]], 1)),
                   (["c", "d"], _round([[False, True], [True, False]], 2))])
    dropped = dapo.fill_batch(lambda: next(rounds), 2, 2, 10, ([], []), False, 0)
    assert dropped.problems == ["a", "c"] and dropped.buffer == ([], []) and dropped.mixed == 3
    rounds = iter([(["a"], _round([[True, True]], 1))] * 3)
    empty = dapo.fill_batch(lambda: next(rounds), 1, 2, 3, ([], []), True, 0)
    assert empty.batch is None and (empty.rounds, empty.generated) == (3, 3)


def test_dual_clip_reaches_the_loss_and_is_logged(base, tmp_path):
    # --mu 2 at a high learning rate: the second update sees ratios far from 1, so with c = 1.01 some
    # negative-advantage token has rho > c and the bound binds (clip_dual > 0); without the flag nothing is logged
    run_dir = tmp_path / "dual"
    train.main(["--steps", "1", "--mu", "2", "--lr", "1e-2", "--warmup-steps", "0", "--dual-clip", "1.01",
                "--run-dir", str(run_dir), *SMALL])
    record = [json.loads(line) for line in open(run_dir / "metrics.jsonl") if '"accuracy"' in line][0]
    assert 0 < record["clip_dual"] <= 1
    plain = tmp_path / "plain"
    train.main(["--steps", "1", "--run-dir", str(plain), *SMALL])
    assert "clip_dual" not in [json.loads(line) for line in open(plain / "metrics.jsonl") if '"accuracy"' in line][0]


def test_the_readme_quick_ablation_runs_as_written(base, tmp_path, monkeypatch):
    # the README's one-line ablation of K5 and its compare command, as they stand there
    variant_command, source, command = readme_blocks("A quick ablation")[:3]
    assert variant_command.startswith('python -m tools.compare --methods "ktae,ktae[ktae-alpha=0]"')
    (tmp_path / "ablation.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    try:
        assert methods.load_rules("ablation.py") == ["ktae-sign"]
        # one group, r = [1, 0, 0]: ids 5 in every rollout, 6 in the right one only, 7 and 8 in one wrong one each
        ids = torch.tensor([[5, 6], [5, 7], [5, 8]])
        batch, mask, rewards = {"input_ids": ids, "prompt_len": 0}, torch.ones(3, 2), torch.tensor([[1.0, 0, 0]])
        args = training.parse_args_one_line(["--method", "ktae"])
        ctx = methods.Context(args, None, SimpleNamespace(pad_token_id=0, eos_token_id=1), [])
        plain = methods.RULES["ktae"].advantages(batch, rewards, mask, ctx).values
        sign = methods.RULES["ktae-sign"].advantages(batch, rewards, mask, ctx).values
        _, t = ktae.token_values(ids, mask, rewards)
        # K6 of the variant: tanh-shaped in S * sign(D), S = alpha F + beta IG (ktae.key_token_values)
        want = ktae.key_token_values(t["F"], t["IG"], torch.sign(t["D"]))[t["inv"]]  # [U] -> per position
        assert torch.allclose(sign[mask.bool()], want.float()) and not torch.allclose(sign, plain)
        assert ktae.direction is not None and methods.RULES["ktae"].advantages(batch, rewards, mask, ctx).values \
            .equal(plain)  # the original's equation back in place
        words = command.replace("\\\n", " ").split()  # a line continued with a backslash
        assert words[:5] == ["python", "-m", "tools.compare", "--rules-file", "ablation.py"]
        assert "ktae,ktae-sign" in command
        from tools import compare
        compare.main([w.strip('"') for w in words[3:]] + ["--seeds", "0", "--steps", "2", "--eval-every", "2",
                                                          "--jobs", "1", "--out", str(tmp_path / "out"), "--",
                                                          *SMALL[:-2]])
        assert "| ktae-sign | 1 |" in (tmp_path / "out" / "paired.md").read_text()
    finally:
        methods.RULES.pop("ktae-sign", None)
        methods._LOADED.pop(str(tmp_path / "ablation.py"), None)
