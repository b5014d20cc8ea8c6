"""The training loop's throughput in two or more source trees, side by side in one run.

Each round trains a preset (default ``tang-demo``'s quick config, fp32, one thread) for ``--steps``
steps with ``poslab.session.train`` once per tree, in a fresh process with that tree first on
``PYTHONPATH``, the order of the trees reversed every other round. A step's cost is the process
CPU time between two calls of the training's per-step callback (:func:`time.process_time`: time spent
waiting for a core on a shared machine does not count), the median over the steps after the first 5;
a round's figure is training tokens per CPU second at that median. Printed: the median over rounds
per tree and its ratio to the first tree's, with every round's figures. A third tree that is a copy of
the first (an A/A control) shows how far two identical trees differ on the machine at the time. ::

    OMP_NUM_THREADS=1 python benchmarks/loop_ab.py OLD_TREE NEW_TREE [COPY_OF_OLD_TREE] --steps 30 --rounds 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import json, statistics, sys, time
from poslab.session import train
from poslab.training.config import TrainConfig
from poslab.training.presets import preset_config

preset, steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cfg = preset_config(preset, quick=True)
cfg.update(name="ab", out_dir=out, max_steps=steps, lr_decay_steps=steps, eval_interval=steps, eval_iters=1,
           ckpt_interval=0, dtype="fp32", threads=1)
marks = []
mark = lambda step, record: marks.append(time.process_time())
train(TrainConfig.from_dict(cfg), overwrite=True, progress=False, callback=mark)
step_s = statistics.median(b - a for a, b in zip(marks[5:-2], marks[6:-1]))  # the last step checkpoints
print(json.dumps({"tokens_per_cpu_s": cfg["batch_size"] * cfg["model"]["block_size"] / step_s}))
"""


def one(tree: Path, preset: str, steps: int) -> float:
    """Training tokens per CPU second of one training in a fresh process running ``tree``'s code."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, preset, str(steps), out],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    return float(json.loads(done.stdout.strip().splitlines()[-1])["tokens_per_cpu_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", type=Path, nargs="+", help="two or more source trees (each holding poslab/)")
    parser.add_argument("--preset", default="tang-demo")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if len(args.trees) < 2:
        parser.error("give at least two trees")
    trees = [t.resolve() for t in args.trees]
    rates: dict[Path, list[float]] = {t: [] for t in trees}
    for r in range(args.rounds):
        for tree in trees if r % 2 == 0 else trees[::-1]:
            rates[tree].append(one(tree, args.preset, args.steps))
    median = {t: statistics.median(v) for t, v in rates.items()}
    for tree in trees:
        rounds = [round(v) for v in rates[tree]]
        ratio = median[tree] / median[trees[0]]
        print(f"{str(tree):28s} median {median[tree]:7,.0f} tokens per CPU second (x{ratio:.3f})  rounds {rounds}")


if __name__ == "__main__":
    main()
