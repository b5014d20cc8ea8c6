"""The whole-process table of ``benchmarks/README.md`` ("Time to quality"), in Markdown, from the JSON
that ``time_to_loss.py --whole-process --out FILE`` writes: one row per seed (nanoGPT's process and each
variant's, wall / CPU with the training steps' time in brackets, the crossing's step and val loss, the
speed-ups against nanoGPT's process of the same seed) and the mean ± sd of the speed-ups. A seed whose process
never reached the target has no time to quality, so no speed-up: its row says so and the mean leaves it out.

    .venv/bin/python benchmarks/time_to_loss_table.py benchmarks/results/time_to_loss_whole_process.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def _times(row: dict[str, Any]) -> str:
    return f"{row['process_wall_s']:.1f} s / {row['process_cpu_s']:.1f} s ({row['train_time_s']:.1f} s)"


def _speedups(nano: dict[str, Any], row: dict[str, Any]) -> tuple[float, float, float]:
    keys = ("process_wall_s", "process_cpu_s", "train_time_s")
    return tuple(nano[key] / row[key] for key in keys)  # type: ignore[return-value]


def _mean_sd(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.2f} ± {sd:.2f}x"


def table(report: dict[str, Any]) -> str:
    """The Markdown table of a ``--whole-process`` report (every seed with a nanoGPT process)."""
    processes = report["processes"]
    nano = {r["seed"]: r for r in processes if r["contender"] == "nanoGPT"}
    names = [n for n in dict.fromkeys(r["contender"] for r in processes) if n != "nanoGPT"]
    if not nano or not names:
        raise SystemExit("the report has no nanoGPT process or no poslab process: run with --whole-process")
    dtypes = {n: "/".join(sorted({r["dtype"] for r in processes if r["contender"] == n})) for n in names}
    head = ["seed", "nanoGPT process: wall / CPU (training steps)"]
    for name in names:
        head += [f"`{name}` ({dtypes[name]}): wall / CPU (training), crossing", "speed-up wall / CPU (training)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    ratios: dict[str, list[tuple[float, float, float]]] = {name: [] for name in names}
    for seed in report["seeds"]:
        if seed not in nano:
            continue
        cells = [str(seed), _times(nano[seed])]
        for name in names:
            (row,) = [r for r in processes if r["contender"] == name and r["seed"] == seed]
            cross = row["crossing"]
            reach = (
                f"step {cross['step']}, {cross['val_loss']:.4f}" if cross else f"missed ({row['final_val_loss']:.4f})"
            )
            if not cross:  # a process that never reached the target has no time to quality
                cells += [f"{_times(row)}, {reach}", "none: missed the target"]
                continue
            wall, cpu, steps = _speedups(nano[seed], row)
            ratios[name].append((wall, cpu, steps))
            cells += [f"{_times(row)}, {reach}", f"{wall:.2f}x / {cpu:.2f}x ({steps:.2f}x)"]
        lines.append("| " + " | ".join(cells) + " |")
    last = ["mean ± sd", ""]
    for name in names:
        if not ratios[name]:
            last += ["", "none: every seed missed the target"]
            continue
        wall, cpu, steps = (list(column) for column in zip(*ratios[name], strict=True))
        missed = sum(1 for r in processes if r["contender"] == name and r["seed"] in nano and not r["crossing"])
        over = f", over the {len(wall)} seeds that reached it ({missed} missed)" if missed else ""
        last += ["", f"**{_mean_sd(wall)}** / {_mean_sd(cpu)} ({statistics.fmean(steps):.2f}x){over}"]
    lines.append("| " + " | ".join(last) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", type=Path, help="time_to_loss.py --whole-process --out FILE")
    args = parser.parse_args()
    report = json.loads(args.report.read_text(encoding="utf-8"))
    print(table(report))
    load = report.get("load_average")
    if load:
        print(f"\n(load average at the end of the run: {', '.join(f'{x:.2f}' for x in load)})")


if __name__ == "__main__":
    main()
