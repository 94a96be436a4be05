"""Which model runs: the tiny default (built here), a local Hugging Face directory, or a hub name (online only).

train.py and evaluate.py both load through load_model(), so an offline machine gets the same one-line error from
either: the directory is missing, or the hub cannot be reached.
"""
import os
import sys

import tiny


def load_model(name: str, flag: str = "--model"):
    """(model, tokenizer, name). The tokenizer pads on the left (the sampler's layout) and has a pad token (its
    EOS when the model has none, as for Qwen2.5 base)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    if name == "tiny":
        return tiny.load_or_build()
    path = os.path.expanduser(name)
    hub_like = not name.startswith((".", "/", "~")) and name.count("/") <= 1  # "Qwen/Qwen2.5-Math-1.5B"
    if not os.path.isdir(path) and not hub_like:
        sys.exit(f"{flag} {name}: no such directory")
    try:
        tok = AutoTokenizer.from_pretrained(path, padding_side="left")
        model = AutoModelForCausalLM.from_pretrained(path)
    except OSError as e:
        sys.exit(f"{flag} {name}: not a local directory, and it could not be loaded from the hub "
                 f"(offline machine?): {str(e).splitlines()[0]}")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return model, tok, name
