"""Helpers shared by the lab's training experiments: the corpus's unigram baseline and seeded curves.

Not an experiment (the registry in ``__init__`` lists the experiment modules by name).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from pathlib import Path
from typing import Any

from poslab.data import load_text, split_text


@functools.lru_cache(maxsize=8)
def unigram_entropy(corpus: str, val_fraction: float = 0.1) -> float:
    """Entropy (nats per character) of the character frequencies of ``corpus``'s training split.

    The loss of a model that learned nothing but how often each character occurs: a trained model's
    validation loss is only evidence of learned structure well below it. Same units as the loss
    (natural log, per token of a character tokenizer).
    """
    train, _ = split_text(load_text(corpus), val_fraction)
    counts = Counter(train)
    total = sum(counts.values())
    return -sum(c / total * math.log(c / total) for c in counts.values())


def baseline_line(corpus: str, val_fraction: float = 0.1) -> str:
    """The line printed under every loss table."""
    return (f"  unigram-entropy baseline of {corpus!r} (character frequencies only): "
            f"{unigram_entropy(corpus, val_fraction):.3f} nats/token; a model that learned structure sits well below it")


def plot_seeded_curves(runs: dict[str, list[dict[str, Any]]], path: Path, title: str, baseline: float | None = None) -> Path:
    """Validation-loss curves, mean over seeds (line) and min..max over seeds (band), one colour per arm.

    Args:
        runs: arm label -> one summary per seed, each with ``val_curve`` ``[(step, val_loss), ...]``.
        path: the PNG.
        title: the figure title.
        baseline: the unigram-entropy baseline (drawn dashed) or ``None``.
    """
    from poslab.display import new_figure, save_figure

    fig, ax = new_figure(size=(8.0, 5.0))
    finals = []
    for label, seeds in runs.items():
        curves = [dict((int(s), float(v)) for s, v in run["val_curve"]) for run in seeds if run.get("val_curve")]
        if not curves:
            continue
        steps = sorted(set.intersection(*(set(c) for c in curves)))
        if not steps:
            continue
        means = [sum(c[s] for c in curves) / len(curves) for s in steps]
        lows = [min(c[s] for c in curves) for s in steps]
        highs = [max(c[s] for c in curves) for s in steps]
        line = ax.plot(steps, means, marker="o", markersize=3, label=f"{label}: {means[-1]:.3f} (n={len(curves)})")[0]
        ax.fill_between(steps, lows, highs, color=line.get_color(), alpha=0.2, linewidth=0)
        finals.append(means[-1])
    if baseline is not None:
        ax.axhline(baseline, color="black", linestyle="--", linewidth=1, label=f"unigram baseline {baseline:.3f}")
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_title(f"{title}\nline: mean over seeds; band: min..max over seeds")
    if finals:
        top = max(max(finals) + 0.5, (baseline or 0) + 0.2)
        ax.set_ylim(min(finals) - 0.2, top)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return save_figure(fig, path)


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman rank correlation (average ranks for ties)."""
    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=lambda i: values[i])
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out

    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return cov / var if var > 0 else float("nan")
