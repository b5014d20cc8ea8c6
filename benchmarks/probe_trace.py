"""One probe training traced: accuracy at sizes 2, L//2 and L every few steps, appended to the JSON.

A copy of :func:`poslab.analysis.probes.train_probe`'s loop (same model, optimiser, schedule, batches
and seed) that also scores the model on 64 fixed sequences per size every ``every`` steps; not the
256-sequence test of ``probe_recipes.py``. One recipe argument as in ``probe_recipes.py`` (one seed)::

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/probe_trace.py \\
        task=mqar,L=8,heads=8,steps=1000,curriculum=100000,lr=1.5e-3,warmup=100,seeds=0 250

(``curriculum`` larger than ``steps`` keeps the smallest sizes for the whole run.) The record goes to
``benchmarks/results/probe_recipes.json`` with ``"script"`` and ``"trace"``.
"""

import json
import sys
import time

import torch
import torch.nn.functional as F

from poslab.analysis.probes import accuracy, build_model, probe_lr, training_batch

sys.path.insert(0, "benchmarks")
from probe_recipes import RESULTS, parse, recipe_of  # noqa: E402

SCRIPT = (
    "benchmarks/probe_trace.py: a copy of train_probe's loop, accuracy at sizes 2, L//2, L on 64 sequences "
    "every few steps during training; not the 256-sequence test"
)


def main(argv: list[str]) -> int:
    torch.set_num_threads(1)
    spec_s = argv[0]
    every = int(argv[1]) if len(argv) > 1 else 200
    spec = parse(spec_s)
    recipe = recipe_of(spec)
    L, seed = int(spec["L"]), int(spec["seeds"])
    task = recipe.task(spec["task"], L)
    model = build_model(task, spec["scheme"], recipe, seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.98), weight_decay=0.0)
    g = torch.Generator().manual_seed(10_000 + seed)
    t0, trace = time.process_time(), []
    sizes = sorted({2, max(2, L // 2), L})
    for step in range(recipe.steps + 1):
        if step % every == 0 or step == recipe.steps:
            with torch.no_grad():
                accs = {n: round(accuracy(model, task, n, 64, seed=1_000_000 + n), 3) for n in sizes}
            trace.append({"step": step, "high": recipe.size_range(task, step)[1], "acc": accs})
            print(step, recipe.size_range(task, step), accs, flush=True)
            if step == recipe.steps:
                break
        for group in opt.param_groups:
            group["lr"] = probe_lr(step, recipe)
        idx, targets = training_batch(task, recipe, step, g)
        logits = model(idx)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    cpu = round(time.process_time() - t0, 1)
    record = {
        "spec": spec_s,
        "script": SCRIPT,
        "task": spec["task"],
        "L": L,
        "scheme": spec["scheme"],
        "recipe": recipe.__dict__,
        "seeds": [seed],
        "trace": trace,
        "cpu_seconds": [cpu],
        "when": time.strftime("%Y-%m-%d %H:%M"),
    }
    done = json.loads(RESULTS.read_text())
    RESULTS.write_text(json.dumps(done + [record], indent=1) + "\n")
    print("cpu", cpu)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
