"""Do the quick language models meet the bigram and context premises?

``STEPS LR BATCH SCHEME...``: the lab's quick extrapolation model
(:data:`poslab.lab.scale.SIZES` ``quick``, tinyshakespeare) with ``STEPS`` steps,
peak ``LR`` and ``BATCH`` windows (warmup a tenth of the steps), for each scheme at the lab's three
seeds (:func:`poslab.session.train`, one after another). Printed per seed: the final validation loss
(the run's ``eval_iters`` batches), the mean loss at window positions 1-8 ("early") and at the last
16 positions ("late") of :func:`poslab.analysis.eval.loss_by_position` over 64 validation windows.
The curves go to ``/tmp/lm_STEPS_LR_BATCH.json``; ``--plot JSON PNG`` draws them (mean ± sd over
seeds, with the corpus baselines: tinyshakespeare val unigram 3.35, bigram 2.49, trigram 2.07 nats,
from ``docs/lab.md``). ::

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python benchmarks/lm_context_premise.py 600 3e-3 16 rope none
    PYTHONPATH=. .venv/bin/python benchmarks/lm_context_premise.py --plot /tmp/lm_600_0.003_16.json loss_by_position.png
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

BASELINES = {"unigram": 3.35, "bigram": 2.49, "trigram": 2.07}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--plot"]:
        from poslab.display import plot_loss_by_position
        from poslab.nn import positions

        data = json.loads(Path(argv[1]).read_text())
        names = positions.names()
        plot_loss_by_position(
            {k: v["curves"] for k, v in data.items()},
            Path(argv[2]),
            style_index={k: names.index(k) for k in data if k in names},
            baselines=BASELINES,
            title=f"quick LM, {Path(argv[1]).stem}: loss at each window position (val)",
        )
        print(argv[2])
        return 0
    from poslab.analysis.eval import loss_by_position
    from poslab.lab.scale import SEEDS, SIZES, train_config
    from poslab.runs import load_run
    from poslab.session import train
    from poslab.training.data import prepare_data

    torch.set_num_threads(1)
    steps, lr, bs = int(argv[0]), float(argv[1]), int(argv[2])
    size = dataclasses.replace(SIZES["quick"], steps=steps, lr=lr, batch_size=bs, warmup_steps=max(10, steps // 10))
    out = {}
    for scheme in argv[3:]:
        cfgs = [
            train_config(scheme, size, Path("/tmp/lm_context_premise"), name=f"{scheme}-{s}", seed=s) for s in SEEDS
        ]
        data = prepare_data(cfgs[0])
        start = time.perf_counter()
        res = [{**train(cfg, overwrite=True, progress=False), "model": load_run(cfg.run_dir)[0]} for cfg in cfgs]
        curves = [loss_by_position(r["model"].eval(), data.val, size.train_length, 64).tolist() for r in res]
        early = [sum(c[1:9]) / 8 for c in curves]
        late = [sum(c[-16:]) / 16 for c in curves]
        out[scheme] = {
            "val": [r["final_val_loss"] for r in res],
            "early_1_8": early,
            "late_last16": late,
            "curves": curves,
            "seconds": time.perf_counter() - start,
        }
        print(
            scheme,
            "val",
            [round(v, 3) for v in out[scheme]["val"]],
            "early",
            [round(v, 3) for v in early],
            "late",
            [round(v, 3) for v in late],
            f"{out[scheme]['seconds']:.0f}s",
            flush=True,
        )
    Path(f"/tmp/lm_{steps}_{lr}_{bs}.json").write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
