"""Does a probe recipe learn its task? Accuracy at L and 2L of each seed, the seeds trained stacked.

Each argument after the task and ``L`` is one recipe, ``scheme,steps,lr,n_layer,n_embd,batch``
(4 heads, warmup a tenth of the steps, 256 test sequences), trained for seeds 0, 1, 2 with
:func:`poslab.analysis.probes.train_probes_stacked` (each seed equal to its training alone). ::

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/probe_recipes.py reverse 8 rope,1000,3e-3,2,64,64
"""

from __future__ import annotations

import sys
import time

import torch

from poslab.analysis.probes import ProbeRecipe, train_probes_stacked


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    task, L = argv[0], int(argv[1])
    torch.set_num_threads(1)
    for spec in argv[2:]:
        parts = spec.split(",")
        if len(parts) != 6:
            print(f"recipe {spec!r} must be scheme,steps,lr,n_layer,n_embd,batch", file=sys.stderr)
            return 2
        scheme, steps, lr, layers, width, batch = parts
        recipe = ProbeRecipe(n_layer=int(layers), n_head=4, n_embd=int(width), steps=int(steps), batch_size=int(batch),
                             lr=float(lr), warmup_steps=int(steps) // 10, eval_batch=256)
        start = time.perf_counter()
        out = train_probes_stacked(task, L, scheme, (0, 1, 2), recipe, (1, 2))
        at_l = [round(o["accuracy"]["1"], 3) for o in out]
        past = [None if o["accuracy"]["2"] is None else round(o["accuracy"]["2"], 3) for o in out]
        print(f"{task} L={L} {spec}: accuracy at L {at_l}, at 2L {past}, {time.perf_counter() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
