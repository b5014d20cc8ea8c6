"""Which RoPE frequencies a trained model uses: per-frequency q/k norms (Barbero et al. 2024).

Barbero, Vitvitskyi, Perivolaropoulos, Pascanu, Veličković, "Round and Round We Go! What makes
Rotary Positional Encodings useful?" (https://arxiv.org/abs/2410.06205), §4–5: in Gemma 7B the
queries and keys put most of their norm on the *lowest* frequencies (pairs that barely turn over
the context: they carry semantic content), while the highest frequencies are used by a few heads
to build positional patterns (diagonal / previous-token heads).

For small RoPE GPTs trained on tinyshakespeare (one per seed) it takes each rotary pair's 2-D norm
``||(q_a, q_b)||`` of q and k entering the rotation, averaged over tokens, per layer x head x pair (pair 0 = the
highest frequency), against each seed's untrained model. The claims are paired by seed on the ln of the norms:
the lowest-frequency quarter carries larger norms than the highest, and training, not initialisation, moves norm
there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from poslab.display import new_figure, save_figure
from poslab.lab.experiments.common import FULL_ONLY, Baselines, baselines_field, corpus_baselines, even_windows
from poslab.lab.experiments.declaration import Declaration, Plan, Runs, declare
from poslab.lab.experiments.training import SEEDS, preset_arms
from poslab.lab.premises import attach, below_bigram
from poslab.lab.scale import STREAM_SCALES, Scale, ScaleTable
from poslab.lab.tables import KeyTable, Table
from poslab.lab.verdicts import Arm, Metric, paired
from poslab.nn.model import GPT
from poslab.runs import RunFolder, load_run
from poslab.training.loop import evaluate_loss

#: the streaming experiments' models (:data:`~poslab.lab.scale.STREAM_SCALES`) at window 64 with 2 heads (d_k 32:
#: 16 pairs), each reading 4 (quick) or 32 (full) validation windows
SCALES = ScaleTable(
    dataclasses.replace(STREAM_SCALES["quick"], train_length=64, n_head=2, eval_windows=4),
    dataclasses.replace(STREAM_SCALES["full"], train_length=64, n_head=2, eval_windows=32),
)
PLOT_FILE = "rope_frequency_usage.png"


@contextlib.contextmanager
def captured_qk(model: GPT) -> Iterator[list[tuple[Tensor, Tensor]]]:
    """Inside the block, every rotation call appends ``(q [B, h, T, d_k], k [B, h_kv, T, d_k])`` as they enter it."""
    seen: list[tuple[Tensor, Tensor]] = []
    schemes = {id(model.layer_position(i)): model.layer_position(i) for i in range(len(model.blocks))}
    for scheme in schemes.values():
        if not scheme.rotates:
            raise ValueError(
                f"position scheme {scheme.name!r} does not rotate q/k: frequency usage needs a rotary model"
            )
        original = scheme.rotate

        def wrapper(q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, _original=original):
            seen.append((q.detach().float(), k.detach().float()))
            return _original(q, k, q_pos, k_pos)

        scheme.rotate = wrapper  # instance attribute shadows the method
    try:
        yield seen
    finally:
        for scheme in schemes.values():
            del scheme.rotate


def pair_norms(x: Tensor, layout: str, rotary_dim: int | None = None) -> Tensor:
    """Mean 2-D norm of each rotary pair, ``[h, r/2]``, from ``x [B, h, T, d_k]`` (``half`` pairs ``(i, i + r/2)``,
    ``interleaved`` pairs ``(2i, 2i + 1)``: poslab's RoPE layouts)."""
    r = rotary_dim or x.shape[-1]
    rot = x[..., :r]
    if layout == "half":
        a, b = rot[..., : r // 2], rot[..., r // 2 :]  # [B, h, T, r/2] each
    elif layout == "interleaved":
        a, b = rot[..., 0::2], rot[..., 1::2]
    else:
        raise ValueError(f"unknown RoPE layout {layout!r}; expected 'half' or 'interleaved'")
    return (a * a + b * b).sqrt().mean(dim=(0, 2))  # [B, h, T, r/2] -> [h, r/2]


@torch.no_grad()
def frequency_norms(model: GPT, idx: Tensor) -> dict[str, Tensor]:
    """Per layer x head x pair mean q and k norms (``[L, h, r/2]`` and ``[L, h_kv, r/2]``) on ``idx [B, T]``."""
    model.eval()
    with captured_qk(model) as seen:
        model(idx)
    if len(seen) != len(model.blocks):
        raise RuntimeError(f"captured {len(seen)} rotations for {len(model.blocks)} layers")
    q, k = [], []
    for i, (qi, ki) in enumerate(seen):
        cfg = model.layer_position(i).config
        q.append(pair_norms(qi, cfg.layout, cfg.rotary_dim))
        k.append(pair_norms(ki, cfg.layout, cfg.rotary_dim))
    return {"q": torch.stack(q), "k": torch.stack(k)}


def quarter_means(norms: Tensor) -> tuple[float, float]:
    """Mean norm of the highest-frequency quarter of pairs and of the lowest-frequency quarter (``[..., r/2]``)."""
    n = norms.shape[-1]
    quarter = max(1, n // 4)
    return float(norms[..., :quarter].mean()), float(norms[..., n - quarter :].mean())


@dataclass(frozen=True)
class Norms:
    """One model's mean q and k pair norms (layer x head x pair) and its quarters' means: the highest-frequency
    quarter of the pairs, the lowest, and their ratio."""

    q: list[list[list[float]]]
    k: list[list[list[float]]]
    high_quarter: float
    low_quarter: float
    low_over_high: float


@dataclass(frozen=True)
class SeedReading:
    """One seed's trained model and its own initialisation, with the frequencies and the trained loss."""

    seed: int
    inv_freq: list[float]
    corpus: str
    val_loss: float
    trained: Norms
    untrained: Norms


@dataclass(frozen=True)
class UsageResult:
    """Every seed's readings."""

    seeds: list[int]
    n_pairs: int
    per_seed: list[SeedReading]
    quick: bool
    baselines: Baselines = baselines_field()


@dataclass(frozen=True)
class Setting:
    scale: Scale
    quick: bool


def read_seed(seed: int, run_dir: Path, n_windows: int) -> SeedReading:
    """Trained and untrained per-frequency norms of one run; the untrained model is the run's own
    initialisation (its config built after ``torch.manual_seed(seed)``, as the training loop builds it),
    so the control pairs with the trained model by seed."""
    run = RunFolder(run_dir)
    model, tokenizer, _ = load_run(run)
    tokens = run.split_tokens("val", tokenizer)
    T = model.config.block_size
    idx = even_windows(tokens, n_windows, T)  # [n, T]
    torch.manual_seed(int(run.config()["train"]["seed"]))
    untrained = GPT(model.config).eval()
    val_loss = evaluate_loss(model.eval(), tokens, T, max(1, 8192 // T), None)
    read = {}
    for label, m in (("trained", model), ("untrained", untrained)):
        norms = frequency_norms(m, idx)
        qk = torch.cat([norms["q"].mean(1), norms["k"].mean(1)])  # [2L, r/2]: per layer, heads averaged
        high, low = quarter_means(qk)
        read[label] = Norms(norms["q"].tolist(), norms["k"].tolist(), high, low, low / high)
    inv_freq = model.layer_position(0).inv_freq.tolist()
    return SeedReading(seed, inv_freq, run.config()["train"]["corpus"], val_loss, **read)


def plan(out: Path, quick: bool, seeds: tuple[int, ...] = SEEDS, scale: Scale | None = None) -> Plan[Setting]:
    """One RoPE GPT per seed. ``scale``: the models and the validation windows read (``eval_windows``; default
    :data:`SCALES` ``quick`` or ``full``; tests use a tiny one)."""
    scale = scale or SCALES["quick" if quick else "full"]
    return Plan(Setting(scale, quick), preset_arms(out, scale, seeds), summarise=False)


def measure(runs: Runs[Setting]) -> UsageResult:
    """Every seed's trained and untrained per-frequency norms."""
    windows = runs.setting.scale.eval_windows
    per_seed = [read_seed(seed, run.path, windows) for seed, run in runs.by_arm["rope"].items()]
    return UsageResult(
        [r.seed for r in per_seed],
        len(per_seed[0].inv_freq),
        per_seed,
        runs.setting.quick,
        corpus_baselines(per_seed[0].corpus),
    )


def figures(r: UsageResult, out: Path) -> dict[str, Path]:
    """Mean q and k norm per pair (over layers, heads, seeds), trained vs untrained; seed 1's q per head."""
    per_seed = r.per_seed
    fig, (ax_line, ax_map) = new_figure(1, 2, size=(13.0, 4.8))
    wavelengths = [2 * math.pi / f for f in per_seed[0].inv_freq]
    pairs = list(range(len(wavelengths)))
    for label, style in (("trained", "-"), ("untrained", ":")):
        for part, marker in (("q", "o"), ("k", "s")):
            curves = [torch.tensor(getattr(getattr(s, label), part)).mean(dim=(0, 1)) for s in per_seed]  # [r/2] each
            mean = torch.stack(curves).mean(0)
            ax_line.plot(pairs, mean.tolist(), style, marker=marker, label=f"{part}, {label}")
    ax_line.set_xlabel("rotary pair i (0 = highest frequency; wavelength 2π/θ_i grows →)")
    ax_line.set_ylabel("mean 2-D norm of the pair")
    ax_line.set_title(f"per-frequency q/k norm, mean over layers, heads and {len(per_seed)} seeds")
    ax_line.grid(alpha=0.3)
    ax_line.legend(fontsize=8)
    q = torch.tensor(per_seed[0].trained.q)  # [L, h, r/2]
    grid = q.reshape(-1, q.shape[-1])  # [L*h, r/2]
    image = ax_map.imshow(grid.tolist(), aspect="auto", cmap="viridis")
    fig.colorbar(image, ax=ax_map, fraction=0.05)
    ax_map.set_yticks(range(grid.shape[0]), [f"L{i // q.shape[1]}H{i % q.shape[1]}" for i in range(grid.shape[0])])
    ax_map.set_xlabel("rotary pair i")
    ax_map.set_title(f"trained q norm per head (seed {per_seed[0].seed})")
    save_figure(fig, out / PLOT_FILE)
    return {"plot": Path(PLOT_FILE)}  # results.json names the figure inside the experiment's folder


def seed_claims(per_seed: list[SeedReading]) -> list[dict[str, Any]]:
    """Low-frequency quarter vs high-frequency quarter of the trained models, and the untrained control, paired by
    seed (two readings of one model; a model and its own initialisation), on the ln of the norms and ratios."""
    seeds = [r.seed for r in per_seed]
    low = [r.trained.low_quarter for r in per_seed]
    high = [r.trained.high_quarter for r in per_seed]
    main = paired(
        "the lowest frequencies carry the largest q/k norms (semantic channels); the highest ones less",
        "Barbero et al. 2024 (Round and Round We Go), §4-5",
        Arm("lowest-frequency quarter", low, seeds),
        Arm("highest-frequency quarter", high, seeds),
        Metric("mean q/k pair norm of trained models", lower_is_better=False, log=True),
    )
    ratio_trained = [r.trained.low_over_high for r in per_seed]
    ratio_untrained = [r.untrained.low_over_high for r in per_seed]
    control = paired(
        "training, not initialisation, moves q/k norm to the low frequencies",
        "Barbero et al. 2024, §4 (control)",
        Arm("trained", ratio_trained, seeds),
        Arm("untrained (the seed's initialisation)", ratio_untrained, seeds),
        Metric("low/high quarter norm ratio", lower_is_better=False, log=True),
    )
    return [main.to_dict(), control.to_dict()]


def claims(r: UsageResult) -> list[dict[str, Any]]:
    """:func:`seed_claims` with their premise: which frequencies a model's content uses is a question about a model
    that learned the language: every seed's model (a per-model capability) below the bigram baseline."""
    premise = below_bigram({"rope": [s.val_loss for s in r.per_seed]}, r.baselines.bigram)
    return attach(seed_claims(r.per_seed), lambda record: premise)


def norms_table(r: UsageResult) -> Table:
    """Each seed's mean q/k pair norm on the highest- and lowest-frequency quarters, trained and untrained."""
    return Table(
        f"RoPE frequency usage: mean q/k pair norm ({r.n_pairs} pairs per head, quarters of {max(1, r.n_pairs // 4)})",
        ("seed", "high-freq quarter", "low-freq quarter", "low/high trained", "low/high untrained"),
        tuple(
            (s.seed, s.trained.high_quarter, s.trained.low_quarter, s.trained.low_over_high, s.untrained.low_over_high)
            for s in r.per_seed
        ),
    )


EXPERIMENT = declare(
    name="rope-frequency-usage",
    description="per-frequency q/k norms of trained RoPE GPTs: which frequencies carry content (Barbero et al. 2024)",
    tier=FULL_ONLY,
    declaration=Declaration(UsageResult, plan, measure, claims, (KeyTable("norms per seed", norms_table),), figures),
    estimate=(30, 300),
)
run = EXPERIMENT.run
