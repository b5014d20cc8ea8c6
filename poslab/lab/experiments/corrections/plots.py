"""The corrections' figure: the ALiBi bias (lesson vs paper) and NTK-aware's frequency ratios."""

from __future__ import annotations

from pathlib import Path

import torch

from poslab.display import new_figure, save_figure
from poslab.lab.experiments.corrections.lesson000_heads import alibi_matrices
from poslab.lab.experiments.corrections.lesson000_rope import NTK_D, NTK_S, ntk_ratios


def plot_evidence(path: Path) -> Path:
    """ALiBi: the lesson's bias vs poslab's (one head); NTK: scaled/unscaled frequency per pair."""
    mats = alibi_matrices()
    r = ntk_ratios()
    fig, axes = new_figure(1, 3, size=(17.0, 4.8))
    fig.subplots_adjust(wspace=0.35)
    vmax = float(mats["poslab"][0].abs().max())
    T = mats["poslab"].shape[-1]
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    shown = {"lesson": mats["lesson"][0], "poslab": mats["poslab"][0].masked_fill(future, float("nan"))}
    for ax, key, title in (
        (axes[0], "lesson", "seed 000 §4's ALiBi bias (head 1)"),
        (axes[1], "poslab", "poslab = Press et al. (head 1; future masked)"),
    ):
        image = ax.imshow(shown[key].numpy(), cmap="coolwarm", vmin=-vmax, vmax=vmax)
        ax.set_xlabel("key j")
        ax.set_ylabel("query i")
        ax.set_title(title)
        fig.colorbar(image, ax=ax, fraction=0.046)
    ax = axes[2]
    ax.plot(range(len(r["ratio"])), r["ratio"], marker=".", label="static NTK-aware (poslab rope)")
    ax.axhline(1 / NTK_S, color="tab:red", linestyle=":", label=f"1/s = {1 / NTK_S:g} (PI everywhere)")
    ax.set_xlabel("pair i (0 = highest frequency)")
    ax.set_ylabel("scaled / unscaled frequency")
    ax.set_title(f"NTK-aware, d_k {NTK_D}, s {NTK_S:g}: high kept, low interpolated")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)
