"""The context-extension experiment's console tables and figures: perplexity at 4x L per scaling and fine-tune,
the equal-budget comparison, passkey accuracy by length, and checkpoint averaging."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from poslab.display import new_figure, save_figure
from poslab.lab import verdicts
from poslab.lab.experiments.cells import NONOVERLAPPING, MeanEvaluation
from poslab.lab.experiments.common import draw_perplexity_baselines
from poslab.lab.experiments.context_extension_claims import (
    AVERAGED,
    AVERAGING,
    BASE_WEIGHT,
    FACTOR,
)
from poslab.lab.experiments.context_extension_passkey import KEY_ALPHABET, PASSKEY_FACTORS
from poslab.lab.experiments.context_extension_result import MeanTuned, Passkeys, SeedReadings, SeedVariant


def plot(
    inference: dict[str, MeanEvaluation],
    finetuned: dict[str, MeanTuned],
    base_L: float | None,
    lab: Any,
    path: Path,
    passkey: Passkeys | None = None,
    baselines: dict[str, float] | None = None,
) -> Path:
    """Perplexity at 4x L per scaling (bars, ± sd over seeds), fine-tuned at 4x L and at L, and passkey accuracy vs
    length; ``baselines`` (the corpus's n-gram count models, nats) are drawn as perplexity lines."""
    fig, axes = new_figure(1, 3, size=(18.0, 4.8))
    names = list(inference)

    def sd(cell: MeanEvaluation) -> float:
        return cell.score(NONOVERLAPPING).ppl_sd or 0.0

    axes[0].bar(
        names,
        [inference[n].ppl() for n in names],
        yerr=[sd(inference[n]) for n in names],
        color="tab:blue",
        capsize=3,
    )
    axes[0].axhline(base_L, color="black", linestyle="--", linewidth=1, label=f"base model at L={lab.train_length}")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("perplexity (non-overlapping)")
    axes[0].set_title(f"RoPE model at 4x L = {FACTOR * lab.train_length}, no fine-tuning")
    labels = list(finetuned)
    x = list(range(len(labels)))
    for shift, cells, where in (
        (-0.2, [finetuned[k].at_4L for k in labels], f"at 4x L = {FACTOR * lab.train_length}"),
        (0.2, [finetuned[k].at_L for k in labels], f"back at L = {lab.train_length}"),
    ):
        xs = [i + shift for i in x]
        axes[1].bar(xs, [c.ppl() for c in cells], yerr=[sd(c) for c in cells], width=0.4, capsize=3, label=where)
    axes[1].axhline(base_L, color="black", linestyle="--", linewidth=1, label="base model at L")
    axes[1].set_xticks(x, labels)
    axes[1].set_title(f"after {lab.finetune_steps} fine-tuning steps at 4x L")
    for ax in axes[:2]:
        draw_perplexity_baselines(ax, baselines)
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    ax = axes[2]
    if passkey is not None:
        rows = [(f"{k} (inference)", v, "-") for k, v in passkey.inference.items()]
        rows += [(f"{k} fine-tuned", v, "--") for k, v in passkey.finetuned.items()]
        for label, per_factor, style in rows:
            xs, ms, ss = [], [], []
            for f in PASSKEY_FACTORS:
                values = [v for v in per_factor[f] if v is not None]
                if values:
                    m, s = verdicts.mean_sd(values)
                    xs.append(f * lab.train_length)
                    ms.append(m)
                    ss.append(s or 0.0)
            line = ax.plot(xs, ms, marker="o", markersize=3, linestyle=style, label=label)[0]
            ax.fill_between(
                xs, [m - s for m, s in zip(ms, ss)], [m + s for m, s in zip(ms, ss)], color=line.get_color(), alpha=0.12
            )
        ax.axhline(1 / len(KEY_ALPHABET), color="grey", linestyle=":", linewidth=1, label="chance (1/26)")
        ax.axvline(lab.train_length, color="black", linestyle="--", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("prompt length (tokens)")
        ax.set_ylabel("passkey letter accuracy")
        ax.set_title("passkey retrieval (mean ± sd over seeds)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    else:
        ax.axis("off")
    return save_figure(fig, path)


def plot_averaging(per_seed: list[SeedReadings], lab: Any, last: int, path: Path) -> Path:
    """Checkpoint averaging: perplexity at L, at 4x L and passkey accuracy at 4x L of each variant
    (:data:`AVERAGING`), one dot per seed, mean ± sd."""
    fig, axes = new_figure(1, 3, size=(16.0, 4.6))
    names = list(AVERAGING)
    panels: list[tuple[str, str, Callable[[SeedVariant], float | None]]] = [
        ("L", f"perplexity at L = {lab.train_length} (forgetting)", lambda v: v.at_L.ppl()),
        ("4L", f"perplexity at 4x L = {FACTOR * lab.train_length}", lambda v: v.at_4L.ppl()),
        ("passkey", f"passkey letter accuracy at 4x L = {FACTOR * lab.train_length}", lambda v: v.passkey[FACTOR]),
    ]
    for ax, (key, title, read) in zip(axes, panels):
        for x, name in enumerate(names):
            found = [read(e.averaging.variants()[name]) for e in per_seed]
            values = [v for v in found if v is not None]
            if not values:
                continue
            mean, sd = verdicts.mean_sd(values)
            ax.bar(x, mean, yerr=sd or 0.0, width=0.6, capsize=4, color=f"C{x}", alpha=0.55)
            ax.scatter(
                [x + 0.12 * (j - (len(values) - 1) / 2) for j in range(len(values))],
                values,
                color="black",
                s=10,
                zorder=3,
                label="one seed" if x == 0 else None,
            )
        ax.set_xticks(range(len(names)), [n.replace("last-k", f"last-{last}") for n in names], fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
        if key != "passkey":  # zoom on the differences
            kept = [v for e in per_seed for n in names if (v := read(e.averaging.variants()[n])) is not None]
            low, high = min(kept), max(kept)
            ax.set_ylim(low - 0.1 * (high - low + 1e-9), high + 0.1 * (high - low + 1e-9))
            ax.set_ylabel("perplexity (non-overlapping)")
        else:
            ax.axhline(1 / len(KEY_ALPHABET), color="grey", linestyle=":", linewidth=1, label="chance (1/26)")
            ax.set_ylim(0, 1.02)
        ax.legend(fontsize=7)
    fig.suptitle(
        f"checkpoint averaging of the {AVERAGED} fine-tune ({lab.finetune_steps} steps at 4x L): mean ± sd over "
        f"{len(per_seed)} seeds; base ⊕ fine-tuned = {BASE_WEIGHT:g} base + {1 - BASE_WEIGHT:g} final",
        fontsize=10,
    )
    return save_figure(fig, path)
