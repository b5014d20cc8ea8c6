"""RoPE's geometric frequencies and what each context-extension scaling does to them (seed 000 exp. 4, §3.5).

Seed 000 experiment 4 prints, for 8 frequencies at base 10000, ``inv_freq_i = 1 / 10000^(i/8)``, the
angle turned per position and the period ``2π / inv_freq_i``: low dimensions turn fast (short
periods, near relations), high ones slowly (long periods, far relations). §3.5 lists the fixes for
running past the training length (PI, NTK-aware, YaRN). The second part takes a realistic head
(d_k = 128, base 10000, trained length L0 = 2048, extension factor s = 4) and reads, from poslab's
``rope`` scheme, the frequencies each scaling uses, printed as wavelengths per dimension pair and
plotted (log scale) with YaRN's low/high ramp bounds marked.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from poslab.display import new_figure, print_table, save_figure
from poslab.lab.experiments.common import FOUNDATION, Experiment
from poslab.lab.verdicts import ClaimRecord, at_least, get, num
from poslab.nn import positions
from poslab.nn.positions.rope import RopeConfig, default_inv_freq, yarn_correction_range

BASE = 10000
HEAD_DIM, FACTOR, L0 = 128, 4.0, 2048
SHOWN_PAIRS = (0, 8, 16, 24, 32, 40, 48, 56, 63)
PLOT_FILE = "rope_scaling_spectrum.png"


def lesson_table() -> list[dict[str, float]]:
    """Seed 000 experiment 4: ``d = 8`` frequencies ``1 / base^(i/8)`` (the lesson's ``arange(0, d) / d``)."""
    d = 8
    inv_freq = 1.0 / (BASE ** (torch.arange(0, d).float() / d))
    return [
        {
            "dim": i,
            "inv_freq": f,
            "angle_per_position_rad": f,
            "angle_at_position_1000_rad": f * 1000,
            "period_positions": 2 * math.pi / f,
        }
        for i, f in enumerate(inv_freq.tolist())
    ]


def scalings() -> list[tuple[str, dict[str, Any], int | None]]:
    """``(label, rope config, sequence length)`` for each scaling compared (d_k 128, s 4, L0 2048)."""
    half = HEAD_DIM // 2
    # illustrative LongRoPE factors (LongRoPE searches them per model; none ship with poslab): a
    # quadratic ramp from 1 at the highest frequency to s at the lowest; short factors all 1
    long_factor = [1.0 + (FACTOR - 1.0) * (i / (half - 1)) ** 2 for i in range(half)]
    common = {"head_dim": HEAD_DIM, "base": float(BASE), "factor": FACTOR, "original_max_len": L0}
    return [
        ("none", {"head_dim": HEAD_DIM, "base": float(BASE)}, None),
        ("linear (PI)", {**common, "scaling": "linear"}, None),
        ("ntk (static)", {**common, "scaling": "ntk"}, None),
        ("dynamic (at 4·L0)", {**common, "scaling": "dynamic"}, int(FACTOR * L0)),
        ("yarn", {**common, "scaling": "yarn"}, None),
        ("llama3", {**common, "scaling": "llama3"}, None),
        (
            "longrope (illustrative, at 4·L0)",
            {**common, "scaling": "longrope", "short_factor": [1.0] * half, "long_factor": long_factor},
            int(FACTOR * L0),
        ),
    ]


def plot(spectra: list[dict[str, Any]], yarn_low: float, yarn_high: float, path: Path) -> Path:
    """Two panels: wavelength per pair (log) and the stretch factor relative to unscaled RoPE."""
    fig, (ax_wl, ax_ratio) = new_figure(1, 2, size=(13.0, 5.0))
    pairs = list(range(HEAD_DIM // 2))
    styles = ["-", "--", "-.", ":", "-", "--", "-."]
    for spec, style in zip(spectra, styles):
        ax_wl.plot(pairs, spec["wavelength"], style, label=spec["label"], linewidth=1.6)
        ax_ratio.plot(pairs, spec["stretch"], style, label=spec["label"], linewidth=1.6)
    for ax in (ax_wl, ax_ratio):
        ax.set_yscale("log")
        ax.set_xlabel("dimension pair i (frequency base^(-2i/d))")
        ax.axvspan(yarn_low, yarn_high, color="0.9", zorder=0)
        ax.axvline(yarn_low, color="0.4", linewidth=0.8)
        ax.axvline(yarn_high, color="0.4", linewidth=0.8)
        ax.grid(True, which="both", alpha=0.3)
    ax_wl.axhline(L0, color="k", linewidth=0.8, linestyle=":")
    ax_wl.axhline(FACTOR * L0, color="k", linewidth=0.8, linestyle="--")
    ax_wl.text(1, L0 * 1.15, f"L0 = {L0}", fontsize=8)
    ax_wl.text(1, FACTOR * L0 * 1.15, f"s·L0 = {int(FACTOR * L0)}", fontsize=8)
    ax_wl.set_ylabel("wavelength 2π / inv_freq (positions)")
    ax_wl.set_title(f"RoPE wavelengths, d_k={HEAD_DIM}, base {BASE}, s={FACTOR:g}, L0={L0}")
    ax_ratio.set_ylabel("stretch: scaled wavelength / original")
    ax_ratio.set_title(f"YaRN ramp (shaded): pairs < {yarn_low:g} kept, > {yarn_high:g} interpolated by s")
    ax_ratio.text(yarn_low, FACTOR * 1.25, " yarn low", fontsize=8)
    ax_ratio.text(yarn_high, FACTOR * 1.25, " yarn high", fontsize=8)
    ax_wl.legend(fontsize=8, loc="upper left")
    return save_figure(fig, path)


def run(out: Path, quick: bool = False) -> dict:
    """Print the lesson's table and the scaling comparison; write the PNG plot into ``out``."""
    table = lesson_table()
    print_table(
        ["dim", "inv_freq", "angle per position (rad)", "angle at position 1000 (rad)", "period (positions)"],
        [
            [
                r["dim"],
                f"{r['inv_freq']:.4f}",
                f"{r['angle_per_position_rad']:.4f}",
                f"{r['angle_at_position_1000_rad']:.1f}",
                f"{r['period_positions']:.1f}",
            ]
            for r in table
        ],
        title=f"seed 000 exp. 4: 8 frequencies at base {BASE} (inv_freq = 1/base^(i/8), period = 2π/inv_freq)",
    )
    # the 8 frequencies are those of a d_k = 16 head: check poslab's rope uses the same ones
    rope16 = positions.build("rope", head_dim=16, base=float(BASE))
    lesson_freqs = torch.tensor([r["inv_freq"] for r in table])
    rope_vs_lesson = (rope16.inv_freq - lesson_freqs).abs().max().item()
    print(f"  poslab rope(head_dim=16).inv_freq vs these 8 frequencies: max |diff| = {rope_vs_lesson:.1e}")
    print(
        "  low dimensions: high frequency, short period (near relations); "
        "high dimensions: low frequency, long period (far relations)"
    )

    original = default_inv_freq(float(BASE), HEAD_DIM)
    spectra = []
    for label, config, seq_len in scalings():
        scheme = positions.build("rope", **config)
        inv_freq, attention_factor = scheme.frequencies(seq_len or L0)
        wavelength = (2 * math.pi / inv_freq).tolist()
        stretch = (original / inv_freq).tolist()
        spectra.append(
            {
                "label": label,
                "config": {k: v for k, v in config.items() if not k.endswith("_factor")},
                "seq_len": seq_len,
                "attention_factor": float(attention_factor),
                "wavelength": wavelength,
                "stretch": stretch,
            }
        )
    yarn_low, yarn_high = yarn_correction_range(
        RopeConfig(head_dim=HEAD_DIM, base=float(BASE), scaling="yarn", factor=FACTOR, original_max_len=L0)
    )
    rows = [
        [s["label"], f"{s['attention_factor']:.4f}"] + [f"{s['stretch'][i]:.2f}" for i in SHOWN_PAIRS] for s in spectra
    ]
    rows.insert(0, ["(unscaled wavelength)", ""] + [f"{spectra[0]['wavelength'][i]:.3g}" for i in SHOWN_PAIRS])
    print_table(
        ["scaling", "attn factor"] + [f"i={i}" for i in SHOWN_PAIRS],
        rows,
        title=(
            f"d_k={HEAD_DIM}, s={FACTOR:g}, L0={L0}: wavelength stretch (scaled / original) per dimension pair; "
            f"YaRN keeps pairs < {yarn_low:g}, interpolates pairs > {yarn_high:g}"
        ),
    )
    path = plot(spectra, yarn_low, yarn_high, Path(out) / PLOT_FILE)
    print(f"  plot: {path}")
    results = {
        "lesson_table_d8_base10000": table,
        "poslab_rope_head16_vs_lesson_max_abs_diff": rope_vs_lesson,
        "realistic_head": {"head_dim": HEAD_DIM, "base": BASE, "factor": FACTOR, "original_max_len": L0},
        "yarn_low_pair": yarn_low,
        "yarn_high_pair": yarn_high,
        "scalings": spectra,
        "plot": str(path),
    }
    return {**results, "claims": [c.to_dict() for c in claims(results)]}


# ------------------------------------------------------------------------------------ claims


def _frequencies(r: dict) -> ClaimRecord:
    table = get(r, "lesson_table_d8_base10000")
    periods = [row["period_positions"] for row in table]
    measured = "period per dimension: " + ", ".join(num(p, 3) for p in periods) + " positions"
    ratios = [b / a for a, b in zip(periods, periods[1:])]
    return at_least(
        "低维度频率高、周期短；高维度频率低、周期长 — RoPE periods grow geometrically with the dimension",
        "seed 000 exp. 4",
        "each dimension pair's period is longer than the previous one "
        "(smallest ratio of consecutive periods ≥ 1 + 1e-6)",
        measured,
        value=float(min(ratios)),
        floor=1.0 + 1e-6,
    )


def claims(results: dict) -> list[ClaimRecord]:
    """The lesson's claims this experiment tests, decided from its results (what ``run`` returns under ``claims``)."""
    return [_frequencies(results)]


EXPERIMENT = Experiment(
    name="frequencies",
    description="RoPE frequencies and periods per dimension; how each scaling changes them (seed 000 exp. 4)",
    tier=FOUNDATION,
    run=run,
)
