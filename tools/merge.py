"""A LoRA checkpoint's adapters merged into its base, written as an ordinary model directory (float32), for a tool
that opens models with AutoModelForCausalLM alone. train.py, evaluate.py and the TRL scripts open the checkpoint
itself (infra/models.py merges on load), so this copy is needed only elsewhere.

    python -m tools.merge runs/ktae-seed0/checkpoint runs/ktae-seed0/merged
"""
import os
import sys

from infra import checkpoint, cli, models


def main(argv=None):
    p = cli.Parser(description="a LoRA checkpoint's adapters merged into its base (tools.merge)")
    p.add_argument("checkpoint", help="a train.py LoRA checkpoint: adapter_config.json and adapter_model.safetensors")
    p.add_argument("out", help="the folder to write the merged model to (new, or empty)")
    args = p.parse_args(argv)
    inside = checkpoint.in_checkpoint(args.out)
    if inside:  # the run's next save, or its --overwrite, would take the merged model with it
        sys.exit(f"{args.out}: inside the run's checkpoint folder {inside}, which the run's saves replace whole: "
                 f"choose a folder outside it")
    if not models.adapter_base(args.checkpoint):
        sys.exit(f"{args.checkpoint}: not a LoRA checkpoint (no adapter_config.json naming its base)")
    if os.path.exists(args.out) and (not os.path.isdir(args.out) or os.listdir(args.out)):
        sys.exit(f"{args.out}: exists and is not an empty folder: choose another")
    checkpoint.writable_dir(args.out, "out")
    models.check_path(args.checkpoint, "checkpoint")
    model, tokenizer, _ = models.load_model(args.checkpoint, "checkpoint")
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    checkpoint.usual_modes(args.out)
    print(f"wrote {args.out}: {models.adapter_base(args.checkpoint)} with {args.checkpoint}'s adapters merged")


if __name__ == "__main__":
    main()
