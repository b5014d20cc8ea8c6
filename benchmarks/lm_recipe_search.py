"""Which quick language model uses its context? One training per call, one seed, one thread.

The lab's quick language models must meet two premises (``poslab/lab/premises.py``): a validation
loss at least 0.05 nats below the corpus's bigram baseline (tinyshakespeare val: 2.484), and a
context gain (mean loss at window positions 1-4 minus mean loss at the last quarter of the window,
on every window of the validation split) of at least 0.1 nats. This script trains one model of the
lab's recipe (:func:`poslab.lab.scale.train_config`) with the geometry and
schedule given, and prints the whole-split loss, the context gain and the process CPU time; each
call appends one JSON line (with the per-position curve) to ``benchmarks/results/lm_recipe_search.jsonl``.
``NO_NORM=1`` removes the embedding LayerNorm, ``EMBED_SCALE=s`` multiplies the token embeddings by
``s``, ``DTYPE=bf16`` trains under bf16 autocast::

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python benchmarks/lm_recipe_search.py \\
        SCHEME N_LAYER N_EMBD STEPS LR BATCH L SEED

What the search of the lab's quick recipe measured (seed 1337, batch 16, L = 64, lr 3e-3, width 64;
loss on the whole validation split / context gain, nats): with the embedding norm, 2 layers, 1000
steps: NoPE 2.328 / -0.090, learned 2.301 / -0.054, sinusoidal 2.165 / 0.040, ALiBi 2.097 / 0.094,
RoPE 1.976 / 0.142; NoPE at 4 layers: 2.229 / -0.011 (1000 steps), 2.015 / 0.107 (2000 steps).
Without the norm, token embeddings times 8 (= sqrt(64)), 4 layers, 2000 steps: NoPE 2.011 / 0.078,
learned 1.887 / 0.181; sinusoidal at 1500 steps 2.024 / 0.112. Without the norm or a scale, 2 layers,
1000 steps: learned 2.071 / 0.080, NoPE 2.314 / -0.098. So NoPE is the arm that needs depth and
steps; the lab's quick size takes 4 layers and 3000 steps (``poslab/lab/scale.py``). The JSON lines
hold every run of the search, with its CPU seconds.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results" / "lm_recipe_search.jsonl"


def main(argv: list[str]) -> int:
    from poslab.analysis.eval import loss_by_position
    from poslab.lab.premises import context_gain
    from poslab.lab.scale import SIZES, train_config
    from poslab.runs import load_run
    from poslab.session import train
    from poslab.training.config import TrainConfig
    from poslab.training.data import prepare_data
    from poslab.training.evaluation import evaluate_loss

    if len(argv) != 8:
        print(__doc__)
        return 2
    torch.set_num_threads(1)
    scheme, n_layer, n_embd, steps, lr, batch, length, seed = (
        argv[0],
        int(argv[1]),
        int(argv[2]),
        int(argv[3]),
        float(argv[4]),
        int(argv[5]),
        int(argv[6]),
        int(argv[7]),
    )
    size = dataclasses.replace(
        SIZES["quick"],
        n_layer=n_layer,
        n_embd=n_embd,
        steps=steps,
        lr=lr,
        batch_size=batch,
        train_length=length,
        warmup_steps=max(10, steps // 10),
    )
    name = f"{scheme}-{n_layer}-{n_embd}-{steps}-{lr}-{batch}-{length}-{seed}"
    values = train_config(scheme, size, Path("/tmp/lm_recipe_search"), name=name, seed=seed).to_dict()
    values.update(threads=1, eval_interval=steps, log_interval=steps, dtype=os.environ.get("DTYPE", "fp32"))
    model_cfg = values["model"]
    if os.environ.get("NO_NORM"):
        model_cfg["norm"] = {**model_cfg.get("norm", {}), "embed": False}
        name += "-nonorm"
    else:
        model_cfg["norm"] = {"embed": True, **model_cfg.get("norm", {})}
    model_cfg["embed_scale"] = float(os.environ["EMBED_SCALE"]) if os.environ.get("EMBED_SCALE") else None
    if model_cfg["embed_scale"] is not None:
        name += f"-es{model_cfg['embed_scale']:g}"
    values["name"] = name
    cfg = TrainConfig.from_dict(values)
    cpu = time.process_time()
    train(cfg, overwrite=True, progress=False)
    cpu = time.process_time() - cpu
    model, tokenizer, _ = load_run(cfg.run_dir)
    data = prepare_data(cfg, tokenizer)
    val = float(evaluate_loss(model, data.val, length, max(1, 8192 // length), None))
    curve = loss_by_position(model.eval(), data.val, length, None).tolist()
    row = {"name": name, "val_all": val, "gain": context_gain(curve), "cpu_s": cpu, "dtype": cfg.dtype, "curve": curve}
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items() if k != "curve"}))
    with RESULTS.open("a") as f:
        f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
