"""A LoRA checkpoint's adapters merged into its base, written as an ordinary model directory (float32), for a tool
that opens models with AutoModelForCausalLM alone. train.py, evaluate.py and the TRL scripts open the checkpoint
itself (infra/models.py merges on load), so this copy is needed only elsewhere.

    python -m tools.merge runs/ktae-seed0/checkpoint runs/ktae-seed0/merged
"""
import os
import shutil
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
    need = sum(p.numel() * p.element_size() for p in model.parameters()) + 32 * 2 ** 20  # the tokenizer and the rest
    checkpoint.check_room(os.path.dirname(os.path.abspath(args.out)), need, "the merged model",
                          advice="free space, or choose another OUT")
    # written beside OUT and renamed when whole: a full disk leaves no folder without weights that blocks the next
    tmp = os.path.abspath(args.out).rstrip(os.sep) + f".tmp{os.getpid()}"
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        checkpoint.usual_modes(tmp)
        if os.path.isdir(args.out):  # the empty folder the user named
            os.rmdir(args.out)
        os.replace(tmp, args.out)
    except Exception as e:  # safetensors and the tokenizer each raise their own kind on a full disk
        shutil.rmtree(tmp, ignore_errors=True)
        sys.exit(f"{args.out}: the merged model could not be written ({type(e).__name__}: "
                 f"{(str(e).strip().splitlines() or [''])[0]}); nothing was left there")
    print(f"wrote {args.out}: {models.adapter_base(args.checkpoint)} with {args.checkpoint}'s adapters merged")


if __name__ == "__main__":
    main()
