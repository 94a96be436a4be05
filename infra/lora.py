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
and every method works as it does without LoRA. A checkpoint stays an ordinary Hugging Face directory: the
adapters merged into float32 weights (merged_state_dict), which AutoModelForCausalLM opens, with peft's own adapter
files beside it in adapter/ (PeftModel.from_pretrained(base, DIR/adapter) opens those). Resume reloads the base
from --model and the adapters from state.pt, so it continues bit for bit.
"""
import torch

# every linear projection of a Qwen2 / Llama decoder layer: attention's four and the SwiGLU MLP's three
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTER_DIR = "adapter"  # inside a checkpoint: peft's adapter_config.json and adapter_model.safetensors


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


def merged_state_dict(model) -> dict:
    """The adapted model's weights as an ordinary model's: each adapted projection's W + (alpha / r) B A in float32
    under its own name, the adapters' own entries left out. The model is not changed (peft's merge would change
    its weights in place, and an unmerge does not give them back bit for bit)."""
    from peft.tuners.lora import LoraLayer
    state = {}
    lora = {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}
    for name, tensor in model.state_dict().items():
        owner = next((m for m in lora if name.startswith(m + ".")), None)
        if owner is None:
            state[name] = tensor
        elif name.startswith(f"{owner}.base_layer."):
            plain = owner + name[len(f"{owner}.base_layer"):]  # q_proj.base_layer.weight -> q_proj.weight
            layer = lora[owner]
            state[plain] = tensor.float()
            if plain.endswith(".weight"):
                state[plain] = state[plain] + sum(layer.get_delta_weight(a).float() for a in layer.active_adapters)
    return state


def save(path: str, wrapped, tokenizer):
    """A checkpoint's model files at path: the merged model (config, weights, tokenizer) and the adapter in
    path/adapter."""
    import os
    model = wrapped.get_base_model()
    model.save_pretrained(path, state_dict=merged_state_dict(model))
    tokenizer.save_pretrained(path)
    wrapped.save_pretrained(os.path.join(path, ADAPTER_DIR))
