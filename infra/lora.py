"""LoRA through peft (optional: requirements/lora.txt): train low-rank adapters on the linear projections and freeze
the rest, for models whose full-parameter training does not fit.

Why: full-parameter AdamW in float32 takes 16 bytes a parameter (weights, gradients, two moments): 25 GB at
1.5B, more than a 24 GB GPU or this project's 24 GB CPU machine holds. With adapters of rank r on every projection
only the adapters (about 1 % of the parameters at r = 32) take gradients and AdamW states, and the frozen base,
which never takes an update, may be held in bf16 (--bf16): half the bytes of float32, and bf16 matrix products.
LoRA for RL on 1.5B models is established: Tina (arXiv 2504.15777) trains rank 32, alpha 128 on all projections;
TRL's "LoRA without regret" guide uses ranks 1-32 on all linear layers, at a learning rate about 10x full
fine-tuning's.

The adapters are put into the model in place (peft's get_peft_model): the model train.py holds is still the
Qwen2ForCausalLM (or any causal LM) it loaded, each projection now computing W x + (alpha / r) B A x. So the sampler,
the scoring forward, fastpath's written-out decode step and OAR's forwards run through the adapted model unchanged,
and every method works as it does without LoRA. A checkpoint holds the adapters as peft saves them
(adapter_config.json naming the base, adapter_model.safetensors: 148 MB at rank 32 on a 1.5B, where the merged
model took 7 GB a checkpoint), which models.load_model opens as base + adapters merged (evaluate.py, TRL, --model),
and tools/merge.py writes as an ordinary model. Resume reloads the base from --model and the adapters from the
checkpoint's file, so it continues bit for bit.
"""
import json
import os

import torch

# every linear projection of a Qwen2 / Llama decoder layer: attention's four and the SwiGLU MLP's three
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTER_CONFIG, ADAPTER_FILE = "adapter_config.json", "adapter_model.safetensors"  # a LoRA checkpoint's, as peft
# beside them, ours: what identifies the base (models.identity: its weights' SHA-256), since peft records its name
# only, and a base replaced in place under that name would take the adapters without a word
BASE_FILE = "adapter_base.json"


def peft():
    """The peft package, or one line saying how to install it."""
    try:
        import peft as p
    except ImportError:
        raise SystemExit("--lora-rank: LoRA needs peft: pip install -r requirements/lora.txt") from None
    return p


def wrap(model, rank: int, alpha: float, targets=TARGETS, bf16_base: bool = False):
    """Adapters of rank `rank` (scale alpha / rank, B initialised to 0: the adapted model starts equal to the base)
    on the `targets` projections of `model`, in place; every other parameter frozen. bf16_base: the frozen
    projections and output layer held in bf16 (the embeddings and norms stay float32, and so does the residual
    stream between them; matrix products then run in bf16 under train.py's --bf16 autocast). Returns the peft
    model, whose get_base_model() is `model`, adapted."""
    linears = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
    unknown = [t for t in targets if t not in linears]
    if unknown or not targets:  # peft's own error is a traceback
        raise SystemExit(f"--lora-targets {','.join(targets)}: {', '.join(map(repr, unknown)) or 'none given'} not a "
                         f"linear layer of this model (its linear layers: {','.join(linears)})")
    config = peft().LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0,
                               bias="none")
    wrapped = peft().get_peft_model(model, config)
    if bf16_base:  # a tied output layer is the embedding: it stays float32 (autocast casts it for its product)
        embedding = model.get_input_embeddings().weight
        for module in model.modules():
            linear = isinstance(module, torch.nn.Linear)
            if linear and not module.weight.requires_grad and module.weight is not embedding:
                module.to(torch.bfloat16)
    return wrapped


def trainable(model) -> dict:
    """{name: parameter} of what trains: the adapters (all parameters when no adapter is in the model)."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def save(path: str, wrapped, tokenizer, base: str, identity: dict = None):
    """A LoRA checkpoint's model files at path, as peft saves them: adapter_config.json (naming `base`, the
    --model the adapters belong to) and adapter_model.safetensors, megabytes where the merged model takes
    gigabytes, and the tokenizer; and BASE_FILE, the base's identity (models.identity) that models.check_base
    holds the base to. models.load_model opens it as base + adapters; tools/merge.py writes the merged model when
    one is wanted."""
    config = wrapped.peft_config[wrapped.active_adapter]
    config.base_model_name_or_path = base
    wrapped.save_pretrained(path)
    tokenizer.save_pretrained(path)
    if identity is not None:
        with open(os.path.join(path, BASE_FILE), "w") as f:
            json.dump({"base": base, "identity": identity}, f, indent=1)


def load_adapters(wrapped, path: str):
    """The adapters a checkpoint saved (save), put into the peft model `wrapped` made with the same rank and
    targets (wrap), for --resume to continue from them."""
    from safetensors.torch import load_file
    peft().set_peft_model_state_dict(wrapped, load_file(os.path.join(path, ADAPTER_FILE)))


def merged(model, path: str):
    """The base `model` with the adapters of the checkpoint at `path` merged into its weights: an ordinary model,
    for evaluate.py, TRL or a merged copy on disk (tools/merge.py)."""
    return peft().PeftModel.from_pretrained(model, path).merge_and_unload()
