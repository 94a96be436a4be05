"""tools/perf/bench.py at a tiny size: every part of the default benchmark and of --gpu (on the CPU, at small shapes)
runs and prints its rows, so that none of it can crash unseen (its default path once did, after its first part).
No timing is asserted: the numbers are the machine's."""
import importlib.machinery
import importlib.util
import sys
import types

import pytest
import torch

import reward
from conftest import THREADS, assert_close
from tools.perf import bench
from tools.perf.benchparts import gpu, llamacpp, sampler, steps, table as tables, workload
from tools.perf.benchparts import machine as machine_part

FEW = ["--threads", str(THREADS), "--steps", "2", "--warmup", "1", "--rounds", "1", "--repeat", "1"]


def rows(table, part: str) -> list:
    return [r for r in table.rows if r[0] == part]


def test_the_default_path_prints_every_part(base, capsys):
    # the tiny default, every part; TRL at a smaller size; the steps part for grpo and OAR-P, whose row differs (each
    # method's step is train.py in its own process: all eleven made it 181 s, two 60 s; test_train.py runs each)
    table = bench.main(FEW + ["--trl", "--trl-prompts", "4", "--methods", "grpo,oar-p"])
    captured = capsys.readouterr()
    out = captured.out
    assert out.splitlines()[0].startswith("bench: --model tiny") and "TRL GRPOTrainer" in out
    machine = rows(table, "machine")
    assert len(machine) == 9 and all(r[2].endswith("FLOP/s") or r[2].endswith("B/s") for r in machine)
    distinct = [r for r in machine if "weights in turn" in r[1]]  # the decode shape again, in each precision
    layers = base[0].config.num_hidden_layers  # one weight a layer, as a decode step reads them
    assert [r[1] for r in distinct] == [f"{p} matmul, decode shape, {layers} weights in turn" for p in
                                        ("float32", "bfloat16")] and all(r[4].endswith("x") for r in distinct)
    # the train-shape product in the run's precision (float32 on the tiny default) read again after the steps
    first = next(r for r in machine if r[1].startswith("float32 matmul, train shape ["))
    assert machine[-1][1:4] == ("float32 matmul, train shape, after the steps", machine[-1][2], f"before {first[2]}")
    sampler = rows(table, "sampler")
    assert [r[1].split(":")[0] for r in sampler] == ["greedy", "sampled at 1", "sampled at 1, one sequence at a time",
                                                     "decoding", "decoding", "decoding"]
    # both shares of the same decoding: over the one-weight product, then over the distinct weights' (float32 here)
    assert sampler[4][1].endswith(f"float32 matmul, {layers} weights") and sampler[4][2] == sampler[3][2]
    assert sampler[4][3] == distinct[0][2] and sampler[3][3] == next(
        r[2] for r in machine if r[1].startswith("float32 matmul, decode shape ["))
    assert all(r[4].endswith("x") for r in sampler[:2]) and float(sampler[2][2].replace(",", "")) > 0
    assert all(r[4].endswith("%") for r in sampler[3:])
    # OAR-P's two ways: their seconds, and the same weights. O4's min-max enlarges the scores' float differences
    # (1.7e-6 here) to about 1e-3 in the weights; a copy started one column late moves them by 1.0 (tried)
    (oar,) = rows(table, "oar-p")
    assert oar[4].endswith("x") and float(oar[1].split("apart ")[1].rstrip(")")) < 0.05
    step = rows(table, "step")
    names = [r[1].split(":")[0] for r in step]
    assert names[0] == "grpo" and names[1].rstrip("*") == "oar-p"
    assert all(float(r[2]) > 0 for r in step[:len(names) - 1]) and "training MFU" in step[-1][1]
    scale = {"T": 1e12, "G": 1e9, "M": 1e6, "k": 1e3}
    flop_s = lambda cell: float(cell.split()[0]) * scale[cell.split()[1][0]]  # "33.9 GFLOP/s" -> 3.39e10  # noqa
    assert step[-1][1].endswith(", float32") and step[-1][3] == max([first[2], machine[-1][2]], key=flop_s)
    trl = rows(table, "trl")
    installed = importlib.util.find_spec("trl") is not None  # a skip row only where TRL is not installed
    assert len(trl) == 1 and (trl[0][4].startswith("ours/TRL") if installed else trl[0][1].startswith("skipped"))
    # ours ran again at TRL's size, in its own train.py, and the row compares that run's step with TRL's
    assert "bench: grpo at 4 prompts x 8, for TRL's comparison: " in captured.err
    assert not installed or trl[0][1].startswith("TRL GRPOTrainer, 4 prompts x 8")
    llama = rows(table, "llama.cpp")  # a skip row: llama-cpp-python is not installed, or the tiny model has no GGUF
    assert len(llama) == 1 and llama[0][1].startswith("skipped: --model tiny has no GGUF file"
                                                       if importlib.util.find_spec("llama_cpp")
                                                       else "skipped: llama_cpp is not installed")


def test_a_run_that_fails_is_a_row(base):
    table = tables.Table("t")
    got = steps.step_rows(table, ("--model", "tiny", "--lr", "-1"), ["grpo"], workload.Setting(()), THREADS)
    assert got == {} and "grpo: failed" in table.rows[0][1] and "--lr" in table.rows[0][1]


@pytest.mark.parametrize("flags, named", [
    (["--parts", ""], "--parts: unknown part ''"), (["--threads", "0"], "--threads 0: must be at least 1"),
    (["--threads", "99999"], "--threads 99999: must be at least 1 and at most this machine's"),
    (["--trl-prompts", "0"], "--trl-prompts 0: TRL's prompts a step, at least 1"),
])
def test_bad_flags_are_one_line_before_any_part_runs(monkeypatch, capsys, flags, named):
    monkeypatch.setattr(bench, "run_cpu", lambda *a, **k: pytest.fail("a part ran"))
    with pytest.raises(SystemExit) as e:
        bench.main(flags)
    assert e.value.code == 2 and named in capsys.readouterr().err.splitlines()[-1]


def test_a_failed_part_makes_bench_exit_nonzero(base, monkeypatch, tmp_path, capsys):
    script = tmp_path / "train.py"  # train.py as it ends on a flag it refuses only once running
    script.write_text("import sys\nsys.exit('--something: refused')\n")
    monkeypatch.setattr(steps, "TRAIN", str(script))
    with pytest.raises(SystemExit) as e:
        bench.main(FEW + ["--parts", "steps", "--methods", "grpo"])
    assert str(e.value.code).startswith("bench: failed after ") and \
        str(e.value.code).endswith("s: step: grpo: failed: --something: refused (exit 1)")
    assert "bench: done" not in capsys.readouterr().err


def test_a_run_killed_mid_line_is_a_row_not_a_crash(monkeypatch, tmp_path):
    script = tmp_path / "train.py"  # train.py as the kernel's OOM killer leaves it: a partial last metrics line
    script.write_text("import os, sys\nd = sys.argv[sys.argv.index('--run-dir') + 1]\nos.makedirs(d)\n"
                      "open(os.path.join(d, 'metrics.jsonl'), 'w').write('{\"step\": 1, \"time_step\": 2.0}\\n{\"st')\n"
                      "sys.exit('Killed')\n")
    monkeypatch.setattr(steps, "TRAIN", str(script))
    records, why = steps.train_run((), "grpo", 2)
    assert records == [{"step": 1, "time_step": 2.0}] and why == "Killed (exit 1)"


def test_a_trl_step_that_fails_is_a_failure_and_a_missing_trl_a_skip(monkeypatch):
    from tools.perf.benchparts import trl_step
    for raised, failed in ((trl_step.TRLMissing("No module named 'trl'"), False),
                           (RuntimeError("[enforce fail at alloc_cpu.cpp:119] can't allocate memory"), True)):
        def trl_seconds(*args, raised=raised):
            raise raised
        monkeypatch.setattr(trl_step, "trl_seconds", trl_seconds)
        table = tables.Table("t")
        w = types.SimpleNamespace(args=types.SimpleNamespace(prompts_per_step=2, group_size=2))
        trl_step.trl_rows(table, w, workload.Setting(()), {}, lambda: None, (), "grpo", THREADS)
        what = table.rows[0][1]
        assert what.startswith("failed: RuntimeError: [enforce fail" if failed else "skipped: No module named 'trl'")
        assert bool(table.failures) == failed  # before, a torch error in TRL's step was a skip, and bench passed


def test_trl_is_compared_with_ours_at_its_own_size(monkeypatch):
    # TRL at fewer prompts than the steps part: ours runs again at TRL's size and the row holds that run's median
    # step (after the warm-up), not the steps part's; at the same size the steps part's step is the one compared
    from tools.perf.benchparts import trl_step
    calls = []

    def train_run(flags, method, steps, threads=None, what=""):
        calls.append(flags)  # steps 1-3 of the rerun: step 1 is the warm-up, the median of 6 and 8 is 7
        return [{"time_step": t, "time_sample": 1.0, "time_advantage": 0.0, "time_train": t - 1, "response_len": 4,
                 "zero_adv_groups": 0.0} for t in (50.0, 6.0, 8.0)], None
    monkeypatch.setattr(trl_step, "train_run", train_run)
    monkeypatch.setattr(trl_step, "trl_modules", lambda: None)
    monkeypatch.setattr(trl_step, "trl_seconds", lambda w, steps, warmup, prompts: 14.0 * prompts / 2)
    w = types.SimpleNamespace(args=types.SimpleNamespace(prompts_per_step=8, group_size=8))
    ours = {"grpo": {"time_step": 99.0}}  # the steps part's, at 8 prompts
    for trl_prompts, against, ratio in ((2, "ours grpo 7.000", "ours/TRL 0.50"), (0, "ours grpo 99.000",
                                                                                   "ours/TRL 1.77")):
        table, loaded = tables.Table("t"), []
        trl_step.trl_rows(table, w, workload.Setting((), steps=3, warmup=1, trl_prompts=trl_prompts), ours,
                          lambda: loaded.append(1), ("--model", "m"), "grpo", THREADS)
        (row,) = table.rows
        assert row[1].startswith(f"TRL GRPOTrainer, {trl_prompts or 8} prompts x 8: s/step (median of steps 2-3)")
        assert (row[3], row[4]) == (against, ratio) and loaded == [1]
    assert calls == [("--model", "m", "--prompts-per-step", "2")]  # one rerun: at 2 prompts, none at the same size


def test_a_memory_run_that_runs_out_of_memory_is_a_measurement_and_any_other_end_a_failure(monkeypatch):
    from tools.perf import memcheck
    monkeypatch.setattr(memcheck, "compare", lambda run_dir: [])
    oom = [{"step": 1, "out_of_memory": "optimizer step"}]
    for records, failed in ((oom, False), ([], True)):
        monkeypatch.setattr(gpu, "train_run", lambda *a, **k: (records, "it ended (exit 1)"))
        table = tables.Table("t")
        gpu.memory_rows(table, "recipe", (), "ktae", 1)
        assert table.rows == [("memory", "recipe: it ended (exit 1)", "", "", "")]
        assert table.failures == (["memory: recipe: it ended (exit 1)"] if failed else [])


class StandInLlamaCpp(types.ModuleType):
    """llama-cpp-python's low-level API, as far as benchparts/llamacpp.decode uses it: sequence s draws token 7
    until it has END[s % 2] tokens, then the end-of-generation token 0 (None: never, so the length limit ends it).
    Every llama_decode call's rows are kept (token, position, sequence ids, logits)."""
    END = (3, None)

    def __init__(self):
        super().__init__("llama_cpp")
        self.__spec__ = importlib.machinery.ModuleSpec("llama_cpp", None)
        self.calls, self.drawn = [], {}

        class Llama:
            def __init__(self, model_path, **kwargs):
                self.path, self._model = model_path, types.SimpleNamespace(model="model")

            def close(self):
                pass
        self.Llama = Llama

    def llama_context_default_params(self):
        return types.SimpleNamespace()

    def llama_init_from_model(self, model, params):
        self.params = params
        return "ctx"

    def llama_model_get_vocab(self, model):
        return "vocab"

    def llama_batch_init(self, n_tokens, embd, n_seq_max):
        return types.SimpleNamespace(token=[0] * n_tokens, pos=[0] * n_tokens, n_seq_id=[0] * n_tokens,
                                     logits=[False] * n_tokens, seq_id=[[0] * n_seq_max for _ in range(n_tokens)])

    def llama_decode(self, ctx, b):
        self.calls.append([(b.token[j], b.pos[j], tuple(b.seq_id[j][:b.n_seq_id[j]]), b.logits[j])
                           for j in range(b.n_tokens)])
        return 0

    def llama_sampler_chain_default_params(self):
        return None

    def llama_sampler_chain_init(self, params):
        return types.SimpleNamespace(parts=[])

    def llama_sampler_chain_add(self, chain, part):
        chain.parts.append(part)

    def llama_sampler_init_temp(self, t):
        return ("temp", t)

    def llama_sampler_init_dist(self, seed):
        return ("dist", seed)

    def llama_sampler_init_greedy(self):
        return ("greedy",)

    def llama_sampler_sample(self, chain, ctx, idx):
        s = chain.parts[-1][1] if chain.parts[-1][0] == "dist" else 0  # the sequence, from its seed (seed 0)
        self.drawn[s] = self.drawn.get(s, 0) + 1
        return 0 if self.drawn[s] == self.END[s % 2] else 7

    def llama_vocab_is_eog(self, vocab, tok):
        return tok == 0

    def llama_sampler_free(self, chain):
        pass

    def llama_batch_free(self, b):
        pass

    def llama_free(self, ctx):
        pass


def test_llama_cpp_batched_decode_with_a_stand_in_module(monkeypatch, tmp_path):
    # two prompts x 2 sequences, at most 5 tokens: each prompt evaluated once for its two sequences (logits at its
    # last token only), then one row a still-running sequence a call; the even ones end with their third token (the
    # end token counted, as our sampler counts it), the odd ones at the limit
    L = StandInLlamaCpp()
    monkeypatch.setitem(sys.modules, "llama_cpp", L)
    seqs, seconds = llamacpp.decode(L.Llama("m"), [[1, 2], [3]], 2, 5, 0.5, 0, 1)
    assert seqs == [[7, 7, 0], [7] * 5, [7, 7, 0], [7] * 5] and seconds >= 0
    assert L.calls[0] == [(1, 0, (0, 1), False), (2, 1, (0, 1), True)] and L.calls[1] == [(3, 0, (2, 3), True)]
    assert L.calls[2] == [(7, 2, (0,), True), (7, 2, (1,), True), (7, 1, (2,), True), (7, 1, (3,), True)]
    assert [len(c) for c in L.calls[2:]] == [4, 4, 2, 2]  # the even ones gone after their third token
    assert L.params.n_seq_max == 4 and L.params.kv_unified and L.params.n_ctx >= 3 + 4 * 5


def test_llama_cpp_rows_with_a_stand_in_module(monkeypatch, tmp_path):
    L = StandInLlamaCpp()
    monkeypatch.setitem(sys.modules, "llama_cpp", L)
    monkeypatch.setattr(llamacpp.models, "gguf_location", lambda name: (str(tmp_path), "m-q4_k_m.gguf"))
    args = types.SimpleNamespace(model="m", seed=0, max_new_tokens=5, temperature=0.5, group_size=2)
    w = types.SimpleNamespace(args=args, prompts=[[1, 2], [3]], texts=["a", "b"])
    table = tables.Table("t")
    llamacpp.llama_rows(table, w, 1, {"tps": 100.0, "one_tps": 30.0})
    one, both = table.rows
    assert "one sequence at a time, q4_k_m GGUF" in one[1] and "2 prompts x 2 together" in both[1]
    assert one[3] == "ours 30" and one[4].startswith("ours/llama")
    assert float(both[2].replace(",", "")) > 0 and both[4].startswith("ours/llama")


def test_sdpa_decode_attention_equals_the_two_matmuls():
    from infra import fastpath
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=g) for shape in ((3, 4, 1, 8), (3, 2, 6, 8), (3, 2, 6, 8)))
    bias = torch.zeros(3, 6)
    bias[0, :2] = float("-inf")  # a padded prompt
    # margin: the two paths used 0.016 of the tolerance at worst (this project's CPU, 2026-11-25; TEST_MARGINS)
    assert_close(sampler.sdpa_decode_attention(q, k, v, bias, 0.35), fastpath.decode_attention(q, k, v, bias, 0.35))


def test_the_gpu_models_tokenizer_covers_its_vocabulary(tmp_path):
    from transformers import AutoTokenizer
    gpu.write_tokenizer(str(tmp_path), 1024, 1000)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert len(tok) == 1024 and tok.eos_token_id == tok.pad_token_id == 1000
    assert len(tok("ab c\n")["input_ids"]) == 5 and tok.decode(tok("x + 1?\n")["input_ids"]) == "x + 1?\n"
    assert tok.decode([500]) == "<500>" and tok.decode([1023]) == "<1023>"  # whatever is sampled decodes to text


def test_length_parity_grader():
    stats = reward.new_stats()
    assert [reward.GRADERS["length-parity"](t, "7", stats) for t in ("ab", "abc", "")] == [True, False, True]
    assert stats["graded"] == 3 and reward.GRADERS["math"]("so \\boxed{7}", "7") is True


def test_matmul_rate_counts_every_weight(monkeypatch):
    # over 5 distinct weights a call runs 5 products of 2 x 2 x 3 x 4 FLOPs: a "second" of them is 240 FLOP/s
    calls = []
    monkeypatch.setattr(machine_part, "seconds_per_call", lambda fn, device: (fn(), 1.0)[1])
    monkeypatch.setattr(torch.nn.functional, "linear", lambda x, w: calls.append((w.shape, w.data_ptr())))
    assert machine_part.matmul_rate(2, 3, 4, torch.float32, "cpu", weights=5) == 2 * 2 * 3 * 4 * 5
    assert [shape for shape, _ in calls] == [(4, 3)] * 5 and len({ptr for _, ptr in calls}) == 5  # 5 distinct


def test_decoding_shares_divide_one_rate_by_each_product():
    # a 2-layer model, H 4, I 8, V 10, 2 heads of 2, 1 key/value head: a layer's projections q 16, k 8, v 8, o 16,
    # gate 32, up 32, down 32 = 144 weights, 288 in all; the output layer 10 x 4 = 40. Prompts of 3 and 2 tokens, 10
    # useful tokens in 1 s over 4 decode steps: 2 x (288 x (10 + 5) + 40 x 10) = 9,440 FLOP/s, 25 % of a one-weight
    # product of 37,760 and 50 % of a distinct-weights one of 18,880; weights read 4 x 328 x 4 bytes = 5,248 B/s, 10 %
    # of a 52,480 B/s read
    from transformers import LlamaConfig
    cfg = LlamaConfig(vocab_size=10, hidden_size=4, intermediate_size=8, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1)
    w = types.SimpleNamespace(config=cfg, args=types.SimpleNamespace(bf16=False), prompts=[[1, 2, 3], [4, 5]])
    limits = {"float32": {"decode": 37760.0, "decode, distinct": 18880.0}, "distinct": 2, "read": 52480.0}
    table = tables.Table("t")
    sampler.decoding_shares(table, w, {"tokens": 10, "seconds": 1.0, "steps": 4}, limits)
    assert [r[1:] for r in table.rows] == [
        ("decoding: model FLOP/s over the float32 decode matmul", "9.4 kFLOP/s", "37.8 kFLOP/s", "25 %"),
        ("decoding: model FLOP/s over the float32 matmul, 2 weights", "9.4 kFLOP/s", "18.9 kFLOP/s", "50 %"),
        ("decoding: weights read a second over the read bandwidth", "5.2 kB/s", "52.5 kB/s", "10 %")]


def test_profile_step_prints_the_pass_and_its_top_operators(base, capsys):
    # tools/perf/profile_step on the tiny model: one warm-up and one profiled pass of train.py's forward and backward
    from tools.perf import profile_step
    profile_step.main(["--model", "tiny", "--threads", "1", "--repeat", "1", "--top", "5"])
    out = capsys.readouterr().out
    head = out.splitlines()[0]
    assert head.startswith("tiny, float32, sdpa attention, 1 thread(s): 64 rows x (") and "GFLOP/s of model" in head
    assert "aten::mm" in out  # the products are among the top operators
    # --attention picks the pass's kernel: SDPA's flash operator in the profile, or eager's softmax and none of it
    profile_step.main(["--model", "tiny", "--threads", "1", "--repeat", "1", "--top", "80"])
    assert "scaled_dot_product_flash_attention" in capsys.readouterr().out
    profile_step.main(["--model", "tiny", "--threads", "1", "--repeat", "1", "--top", "80", "--attention", "eager"])
    out = capsys.readouterr().out
    assert out.startswith("tiny, float32, eager attention") and "aten::_softmax_backward_data" in out
    assert "scaled_dot_product" not in out
    # --numerics: sampled responses' log-probs by kernel and precision against float32 sdpa's: float32 eager agrees
    # to float32's last bits, bf16's rounding moves them by orders of magnitude more
    got = {what: v for what, *v in profile_step.main(["--model", "tiny", "--threads", "1", "--numerics"])}
    assert list(got) == ["float32, eager", "bf16 autocast, sdpa (train.py's)", "bf16 autocast, eager",
                         "the sampler's own"]
    # eager ran: its sums run in another order than SDPA's, so its float32 log-probs differ in the last bits
    assert 0 < got["float32, eager"][3] < 1e-4 and min(got["bf16 autocast, sdpa (train.py's)"][0],
                                                       got["bf16 autocast, eager"][0]) > 100 * got["float32, eager"][0]


def test_training_flops_counts_six_a_weight_a_token_and_prompts_without_the_output_layer():
    # one layer, hidden 8, FFN 16, 2 heads of 4, 1 KV head: q 8x8 + k 8x4 + v 8x4 + o 8x8 + gate, up 8x16 + down
    # 16x8 = 64 + 32 + 32 + 64 + 128 + 128 + 128 = 576 weights that multiply; output layer 10 x 8 = 80.
    # 3 response tokens and 2 prompt tokens: 6 x (576 x 5 + 80 x 3) = 6 x 3120 = 18720
    import transformers
    cfg = transformers.Qwen2Config(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, vocab_size=10)
    assert workload.training_flops(cfg, 3, 2) == 18720


def test_training_mfu_counts_the_timed_steps_own_prompts(monkeypatch):
    # the model of the test above: 576 multiplying weights, an output layer of 80. 2 prompts x 2 rollouts, every
    # group mixed, responses of 3 tokens: 12 response tokens. The timed steps' prompts 5 tokens each: 6 x (576 x
    # (12 + 2 x 5) + 80 x 12) = 6 x 13,632 = 81,792 FLOP in 1 s, 50 % of 163,584. A record without them takes the
    # workload's first-step prompts, 2 tokens each: 6 x (576 x 16 + 960) = 61,056 FLOP, 37 %.
    import transformers
    cfg = transformers.Qwen2Config(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, vocab_size=10)
    w = types.SimpleNamespace(config=cfg, prompt_tokens=2, args=types.SimpleNamespace(
        prompts_per_step=2, group_size=2, bf16=False))
    monkeypatch.setattr(steps, "again", lambda *a: 163584.0)  # the reading after the steps, the higher one
    limits = {"float32": {"train": 1.0}}
    table = tables.Table("t")
    record = {"zero_adv_groups": 0.0, "response_len": 3, "time_train": 1.0}
    steps.training_mfu(table, w, "grpo", {**record, "prompt_tokens": 5.0}, limits)
    steps.training_mfu(table, w, "grpo", {**record, "prompt_tokens": float("nan")}, limits)
    assert [r[2:] for r in table.rows] == [("81.8 kFLOP/s", "163.6 kFLOP/s", "50 %"),
                                           ("61.1 kFLOP/s", "163.6 kFLOP/s", "37 %")]


def test_a_length_given_after_the_dashes_is_oar_ps_too():
    # on the CPU, OAR-P's step runs at the setting's short length unless a length is given for every method (its
    # cost at 128 tokens against grpo's, issue 39), in any form argparse takes
    for flags in (["--max-new-tokens", "128"], ["--max-new-tokens=128"], ["--bf16", "--max-new", "128"]):
        assert workload.gives_length(flags), flags
    for flags in (["--bf16"], ["--max-sampling-rounds", "4"], ["--max-", "4"], []):
        assert not workload.gives_length(flags), flags
