"""The same GPT trained with every position scheme: seed 001 exercise 3, generalised.

Seed 001 keeps GPT-2's learned position table and, as a challenge (exercise 3), asks to add RoPE
(Su et al. 2021, https://arxiv.org/abs/2104.09864), drop ``pos_emb`` and compare training. poslab
trains its ``tang-small`` GPT once per registered scheme — ``none`` (NoPE, Haviv et al. 2022),
``learned``, ``sinusoidal``, ``rope``, ``xpos``, ``alibi``, ``t5``, ``kerple``, ``fire``, ``xl`` and any
scheme registered later — with the same seed, data, batches and schedule, and reports the final
validation loss, the curves and the training speed. Seed 001 predicts that NoPE still learns
(the causal mask leaks position) but somewhat worse than explicit positions; the table says by how
much at this scale.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from poslab.display import print_table
from poslab.lab.experiments.head_count import base_config, plot_curves, train_variants
from poslab.nn import positions

NAME = "position-training"
DESCRIPTION = "train the same GPT with every registered position scheme; curves and final val loss (seed 001 ex. 3)"
IN_ALL = False  # it trains: run it by name


def run(out: Path, quick: bool = False, schemes: list[str] | None = None, base: dict[str, Any] | None = None,
        workers: int | None = None) -> dict:
    """Train one GPT per scheme, print the table, plot the curves.

    Args:
        out: output folder (runs in ``out/runs/SCHEME``, plot ``out/position_training_curves.png``).
        quick: the short form (200 steps of 8 x 64 tokens).
        schemes: scheme names (default: every registered one).
        base: a config mapping replacing the ``tang-small`` base (tests use a tiny one).
        workers: trainings at a time (see :func:`poslab.lab.experiments.head_count.train_variants`).
    """
    out = Path(out)
    schemes = list(schemes) if schemes is not None else positions.names()
    base = base if base is not None else base_config(quick)
    variants = {name: {"model": {"position": name, "position_config": {}}} for name in schemes}
    summary = train_variants(out, base, variants, workers)
    ranked = sorted(schemes, key=lambda s: summary[s]["final_val_loss"])
    reference = summary["learned"]["final_val_loss"] if "learned" in summary else None
    rows = []
    for name in ranked:
        run_summary = summary[name]
        delta = f"{run_summary['final_val_loss'] - reference:+.4f}" if reference is not None else "-"
        rows.append([name, f"{run_summary['final_val_loss']:.4f}", delta, f"{run_summary['best_val_loss']:.4f}",
                     f"{run_summary['tokens_per_s']:,.0f}"])
    print_table(["scheme", "final val loss", "vs learned", "best val loss", "tokens/s"], rows,
                title=f"seed 001 exercise 3: one GPT, every position scheme, {base['max_steps']} steps")
    plot = plot_curves(summary, out / "position_training_curves.png",
                       f"position schemes, same GPT ({base['max_steps']} steps)")
    return {
        "steps": base["max_steps"],
        "quick": quick,
        "runs": summary,
        "final_val_loss": {name: summary[name]["final_val_loss"] for name in schemes},
        "ranking": ranked,
        "plot": str(plot),
    }
