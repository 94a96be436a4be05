"""Which model runs: the tiny default (built here), a local Hugging Face directory, or a hub name (online only).

train.py and evaluate.py both load through load_model(), so an offline machine gets the same one-line error from
either: the directory is missing, or the hub cannot be reached.
"""
import os
import sys

import torch

import tasks
import tiny


def is_hub_name(name: str) -> bool:
    """'Qwen/Qwen2.5-Math-1.5B' or 'gpt2': not a path, and not an existing directory."""
    return (not name.startswith((".", "/", "~")) and name.count("/") <= 1
            and not os.path.isdir(os.path.expanduser(name)))


def check_path(name: str, flag: str = "--model", config_only: bool = False):
    """Before anything heavy: a local model directory must hold a config, weights and a tokenizer (--dry-run: the
    config alone). One line naming what is missing (a hub name is checked when it loads)."""
    if name == "tiny" or is_hub_name(name):
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
    path = os.path.expanduser(name)
    try:
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
