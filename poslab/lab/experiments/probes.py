"""Probes: synthetic tasks where position decides the answer, trained at L and tested at L, 2L, 4L.

In the full form every registered scheme trains a tiny GPT on each task (:mod:`poslab.analysis.probes`: copy,
reverse, retrieve-at-k, multi-query associative recall, counting, passkey retrieval) with the same recipe, data and
seeds; the quick form trains reverse only, for :data:`QUICK_SCHEMES`, plus the MQAR head-count runs. A scheme that
cannot read a test length (a learned table) is reported as such.

Claims compare accuracies (higher is better), paired by seed: a seed fixes the training and test batches whatever
the scheme or head count. Every seed of an arm must reach :data:`poslab.lab.premises.LENGTH_ACCURACY` at L
(the premise), else the claim is not testable.

* Kazemnejad et al. 2023, "The Impact of Positional Encoding on Length Generalization in
  Transformers" (https://arxiv.org/abs/2305.19466): length generalisation ranks NoPE > T5 > ALiBi >
  RoPE > absolute (the paper's APE is Vaswani et al.'s sinusoidal code), tested pairwise on adjacent ranks on each
  seed's accuracy past L, at the lengths where both arms are above chance (:func:`comparable_factors`).
* Attention needs position (seed 000 §2.1; Haviv et al. 2022 for where NoPE still works): on
  reverse and retrieve-at-k, in length, a positional scheme (RoPE) beats NoPE.
* Seed 000 Q1: more heads carry more relations at once: multi-query associative recall at fixed
  width, several heads beat one (in length).

A probe model is a small GPT trained in memory on generated batches, not a run folder: the plan declares no arms
and the measurement trains the probes (:func:`run_jobs`).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from poslab.analysis.probes import ProbeRecipe, train_probe
from poslab.display import new_figure, save_figure, series_style
from poslab.jobs import runner
from poslab.jobs.runner import check_workers, default_workers, train_many
from poslab.lab import verdicts
from poslab.lab.experiments.common import LAB, scheme_style_index
from poslab.lab.experiments.declaration import Declaration, Plan, Runs, declare, to_json
from poslab.lab.experiments.probes_claims import (  # noqa: F401  (re-exported: the claims of this experiment)
    HEADS_SCHEME,
    HEADS_SENTENCE,
    NEEDS_POSITION_TASKS,
    RANKING,
    comparable_factors,
    past_length_scores,
    probe_claims,
    probe_premise,
)
from poslab.lab.experiments.probes_forms import (  # noqa: F401  (re-exported: the experiment's forms)
    FORMS,
    HEADS_ARM,
    QUICK_SCHEMES,
    Form,
    form_of,
    planned_form,
)
from poslab.lab.experiments.probes_tables import accuracy_tables, mqar_table
from poslab.lab.premises import attach
from poslab.lab.tables import KeyTable
from poslab.nn import positions


@dataclass(frozen=True)
class ProbeArm:
    """One task and scheme over its seeds: accuracy per test length factor (per seed, in seed order), the lengths
    it cannot read and why, its seeds, final training losses, and the task's chance accuracy."""

    accuracy: dict[str, list[float]]
    cannot: dict[str, str]
    seeds: list[int]
    final_loss: list[float]
    chance: float


@dataclass(frozen=True)
class ProbesResult:
    """Every task's arms (task -> scheme -> :class:`ProbeArm`) and MQAR accuracy at L per head count."""

    form: Form
    train_size: int
    factors: list[int]
    lengths: list[int]
    seeds: list[int]
    schemes: list[str]
    accuracy: dict[str, dict[str, ProbeArm]]
    heads_mqar: dict[str, list[float]]
    seconds: float


@dataclass(frozen=True)
class Setting:
    """The form (with the plan's arms and seeds), the schemes, and when the experiment started."""

    form: Form
    schemes: tuple[str, ...]
    started: float


def run_jobs(jobs: list[tuple[str, int, str, int, ProbeRecipe, tuple[int, ...]]], workers: int) -> list[dict[str, Any]]:
    """Train every job (``(task, L, scheme, seed, recipe, factors)``: one probe model,
    :func:`~poslab.analysis.probes.train_probe`), ``workers`` at a time, one process per model, in job order."""
    workers = check_workers(workers)
    alone = workers == 1 or len(jobs) <= 1
    if not alone:
        print(
            f"--- training {len(jobs)} probe models, {min(workers, len(jobs))} at a time (one thread each)", flush=True
        )
    tasks = [runner.Task(f"{job[0]}-{job[2]}-s{job[3]}", train_probe, (*job, None if alone else 1)) for job in jobs]
    finished = []

    def done(task: runner.Task, result: dict[str, Any]) -> None:
        finished.append(task.label)
        if not alone and (len(finished) % 10 == 0 or len(finished) == len(jobs)):
            print(f"--- {len(finished)}/{len(jobs)} trained", flush=True)

    return train_many(tasks, 1 if alone else workers, on_done=done)


def collect(results: list[dict[str, Any]], factors: tuple[int, ...]) -> dict[str, dict[str, ProbeArm]]:
    """task -> scheme -> :class:`ProbeArm` of the trained probes (:func:`poslab.analysis.probes.train_probe`)."""
    table: dict[str, dict[str, ProbeArm]] = {}
    for r in results:
        arm = table.setdefault(r["task"], {}).setdefault(
            r["scheme"], ProbeArm({str(f): [] for f in factors}, {}, [], [], r["chance"])
        )
        arm.seeds.append(r["seed"])
        arm.final_loss.append(r["final_loss"])
        for f in factors:
            value = r["accuracy"][str(f)]
            if value is None:
                arm.cannot[str(f)] = r["cannot"][str(f)]
            else:
                arm.accuracy[str(f)].append(value)
    return table


def plan(
    out: Path,
    quick: bool,
    form: str | None = None,
    schemes: list[str] | None = None,
    seeds: tuple[int, ...] | None = None,
) -> Plan[Setting]:
    """Every (task, scheme, seed) of the form, and the MQAR head-count runs (trained by :func:`measure`). ``form``
    (a :data:`FORMS` name) overrides ``quick``; the quick form takes the quick lab's arms and seeds
    (:func:`planned_form`) unless ``schemes`` or ``seeds`` are given."""
    spec = form_of(quick, form)
    if seeds is not None:
        spec = dataclasses.replace(spec, seeds=tuple(int(s) for s in seeds))
    elif spec.name == "quick" and schemes is None:
        spec = planned_form(spec)
    chosen = (
        tuple(schemes) if schemes is not None else tuple(positions.names() if spec.schemes is None else spec.schemes)
    )
    for scheme in chosen:
        positions.get(scheme)  # an unknown name fails before any training
    return Plan(Setting(spec, chosen, time.perf_counter()), {}, summarise=False, what="probe models")


def _heads_recipe(spec: Form, heads: int) -> tuple[ProbeRecipe, bool]:
    """The MQAR recipe with ``heads`` heads, and whether the form's own MQAR runs are those models."""
    recipe = dataclasses.replace(spec.heads_recipe, n_head=heads)
    return recipe, "mqar" in spec.tasks and recipe == spec.recipe and spec.mqar_size == spec.train_size


def measure(runs: Runs[Setting]) -> ProbesResult:
    """Train every probe (:func:`run_jobs`) and test it at each factor x L; the MQAR accuracy per head count."""
    spec, schemes = runs.setting.form, runs.setting.schemes
    workers = default_workers() if runs.workers is None else check_workers(runs.workers)
    jobs = [
        (t, spec.train_size, s, seed, spec.recipe, spec.factors)
        for t in spec.tasks
        for s in schemes
        for seed in spec.seeds
    ]
    head_jobs = []
    if spec.heads and HEADS_SCHEME in schemes:
        for h in spec.heads:
            recipe, reused = _heads_recipe(spec, h)
            if not reused:
                head_jobs += [("mqar", spec.mqar_size, HEADS_SCHEME, seed, recipe, (1,)) for seed in spec.seeds]
    results = run_jobs(jobs + head_jobs, workers)
    table = collect(results[: len(jobs)], spec.factors)
    heads: dict[int, list[float]] = {}
    for h in spec.heads:
        if _heads_recipe(spec, h)[1] and HEADS_SCHEME in table.get("mqar", {}):
            heads[h] = list(table["mqar"][HEADS_SCHEME].accuracy["1"])
        else:
            heads[h] = [r["accuracy"]["1"] for r in results[len(jobs) :] if r["n_head"] == h]
    return ProbesResult(
        form=spec,
        train_size=spec.train_size,
        factors=list(spec.factors),
        lengths=[f * spec.train_size for f in spec.factors],
        seeds=list(spec.seeds),
        schemes=list(schemes),
        accuracy=table,
        heads_mqar={str(h): v for h, v in heads.items() if v},
        seconds=time.perf_counter() - runs.setting.started,
    )


def claims(r: ProbesResult) -> list[verdicts.ClaimRecord]:
    """:func:`~poslab.lab.experiments.probes_claims.probe_claims`, each with its premise (:func:`probe_premise`)."""
    table = to_json(r)["accuracy"]  # the cells as results.json holds them, what the claims read
    heads = {int(h): v for h, v in r.heads_mqar.items()}
    return attach(probe_claims(table, heads, r.form), lambda record: probe_premise(record, table, heads, r.form))


def plot(table: dict[str, dict[str, ProbeArm]], form: Form, path: Path) -> Path:
    """Accuracy vs test length per scheme (mean line, ± sd band), one panel per task."""
    tasks = list(table)
    cols = min(3, len(tasks))
    rows = -(-len(tasks) // cols)
    fig, axes = new_figure(rows, cols, size=(5.0 * cols, 3.8 * rows))
    flat = list(axes.flat) if hasattr(axes, "flat") else [axes]
    L = form.train_size
    for ax, task in zip(flat, tasks):
        styles = scheme_style_index(list(table[task]))
        for scheme, cell in table[task].items():
            xs, means, lows, highs = [], [], [], []
            for f in form.factors:
                values = cell.accuracy[str(f)]
                if not values:
                    continue
                mean, sd = verdicts.mean_sd(values)
                xs.append(f * L)
                means.append(mean)
                lows.append(mean - (sd or 0.0))
                highs.append(mean + (sd or 0.0))
            label = scheme if len(xs) == len(form.factors) else f"{scheme} (cannot past {xs[-1] if xs else L})"
            style = series_style(styles[scheme])
            ax.plot(xs, means, markersize=3, label=label, **style)
            ax.fill_between(xs, lows, highs, color=style["color"], alpha=0.15)
        ax.axhline(next(iter(table[task].values())).chance, color="grey", linestyle=":", linewidth=1, label="chance")
        ax.axvline(L, color="black", linestyle="--", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks([f * L for f in form.factors], [f"{f}L={f * L}" for f in form.factors])
        ax.set_ylim(0, 1.02)
        ax.set_title(task)
        ax.set_xlabel("test size n")
        ax.set_ylabel("answer accuracy")
        ax.grid(alpha=0.3)
    for ax in flat[len(tasks) :]:
        ax.axis("off")
    flat[0].legend(fontsize=7, ncol=2)
    fig.suptitle(f"probes: trained at L={L}, mean ± sd over {len(form.seeds)} seeds")
    return save_figure(fig, path)


def figures(r: ProbesResult, out: Path) -> dict[str, Path]:
    """Accuracy against test length, one panel per task (:func:`plot`)."""
    return {"figure": plot(r.accuracy, r.form, out / "probes.png")}


def _accuracy(r: ProbesResult) -> dict[str, dict[str, dict[str, list[float]]]]:
    return {task: {scheme: arm.accuracy for scheme, arm in arms.items()} for task, arms in r.accuracy.items()}


TABLES = (
    KeyTable("answer accuracy", lambda r: accuracy_tables(_accuracy(r))),
    KeyTable("MQAR by heads", lambda r: mqar_table(r.heads_mqar)),
)

EXPERIMENT = declare(
    name="probes",
    description=(
        "synthetic position probes (copy, reverse, retrieve-at-k, MQAR, count, passkey) at L/2L/4L for every scheme"
    ),
    tier=LAB,
    declaration=Declaration(ProbesResult, plan, measure, claims, TABLES, figures),
    estimate=(450, 1800),
)
run = EXPERIMENT.run
