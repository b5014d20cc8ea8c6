"""nanoGPT's CPU shakespeare_char recipe, run with poslab, per position scheme.

nanoGPT's README (CPU section): ``--block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128
--max_iters=2000 --lr_decay_iters=2000 --dropout=0.0 --eval_iters=20`` on top of
``config/train_shakespeare_char.py`` (lr 1e-3 -> min_lr 1e-4, warmup 100, beta2 0.99, weight decay
0.1, grad clip 1.0, no bias) "gets us a loss of only 1.88". poslab's ``shakespeare-char`` preset is
that recipe; the goal is val loss <= 1.88 with learned positions. RoPE and ALiBi are reported with
the same recipe.

Two validation figures are printed: nanoGPT's kind (the mean over 20 random val batches, here the
same 20 batches at every evaluation) and the loss over the whole validation split (111,540
characters in non-overlapping 64-character windows), which is the steadier number.

    .venv/bin/python benchmarks/nanogpt_recipe.py                       # learned, rope, alibi
    .venv/bin/python benchmarks/nanogpt_recipe.py --schemes learned     # just the anchor
    .venv/bin/python benchmarks/nanogpt_recipe.py --steps 300           # a short smoke run
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from poslab import presets
from poslab.train import TrainConfig, evaluate_loss, load_run, prepare_data, train

NANOGPT_VAL_LOSS = 1.88


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schemes", nargs="+", default=["learned", "rope", "alibi"])
    parser.add_argument("--steps", type=int, default=2000, help="iterations (the recipe: 2000, decayed to the end)")
    parser.add_argument("--out", type=Path, default=Path("runs/nanogpt-recipe"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    args = parser.parse_args()

    rows = []
    for scheme in args.schemes:
        values = presets.preset_config("shakespeare-char")
        values["model"] = {**values["model"], "position": scheme, "position_config": {}}
        values.update(name=f"{scheme}-{args.dtype}-s{args.seed}", out_dir=str(args.out), max_steps=args.steps,
                      lr_decay_steps=args.steps, threads=args.threads, seed=args.seed, dtype=args.dtype,
                      ckpt_interval=0, keep_checkpoints=1)
        cfg = TrainConfig.from_dict(values)
        print(f"\n=== {scheme}: {args.steps} iterations, {args.dtype}, seed {args.seed}")
        results = train(cfg, overwrite=True)
        model, _, _ = load_run(cfg.run_dir)
        data = prepare_data(cfg, tokenizer=None)
        full_val = evaluate_loss(model, data.val, model.config.block_size, 64, None)
        row = {
            "scheme": scheme, "val_loss_20_batches": results["final_val_loss"], "val_loss_full_split": full_val,
            "train_loss": results["final_train_loss"], "tokens_per_s": results["tokens_per_s"], "mfu": results["mfu"],
            "wall_time_s": results["wall_time_s"], "steps": args.steps, "dtype": args.dtype, "seed": args.seed,
        }
        rows.append(row)
        (cfg.run_dir / "recipe.json").write_text(json.dumps(row, indent=2))

    print(f"\nnanoGPT shakespeare_char CPU recipe ({args.steps} iterations; nanoGPT reports val {NANOGPT_VAL_LOSS})")
    print(f"  {'scheme':10s} {'val (20 batches)':>17s} {'val (full split)':>17s} {'train':>8s} {'tokens/s':>9s} "
          f"{'MFU':>6s} {'wall':>7s}  goal")
    for r in rows:
        goal = ""
        if r["scheme"] == "learned" and args.steps == 2000:
            ok = r["val_loss_full_split"] <= NANOGPT_VAL_LOSS and r["val_loss_20_batches"] <= NANOGPT_VAL_LOSS
            goal = f"<= {NANOGPT_VAL_LOSS}: {'met' if ok else 'NOT met'}"
        print(f"  {r['scheme']:10s} {r['val_loss_20_batches']:>17.4f} {r['val_loss_full_split']:>17.4f} "
              f"{r['train_loss']:>8.4f} {r['tokens_per_s']:>9,.0f} {r['mfu']:>6.1%} {r['wall_time_s']:>6.0f}s  {goal}")


if __name__ == "__main__":
    main()
