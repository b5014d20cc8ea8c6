"""Context extension of a RoPE model: inference-time scalings, then fine-tuning at 4x L; perplexity and passkey.

Claims tested (every test fixed before any run: :mod:`poslab.lab.experiments.context_extension_claims`):

* Chen et al. 2023, "Extending Context Window of Large Language Models via Positional Interpolation"
  (PI, https://arxiv.org/abs/2306.15595); bloc97 2023 (NTK-aware); emozilla 2023 (dynamic NTK);
  Peng et al. 2023, "YaRN" (https://arxiv.org/abs/2309.00071): without fine-tuning, each scaling
  reads 4x L better than plain RoPE; a short fine-tune at the new length brings PI and YaRN close to
  the base model's in-window perplexity, YaRN at least as well as PI, and both better than
  fine-tuning plain RoPE.
* Seed 000 §3.5 and Q4: "YaRN or NTK-aware first, much better than PI"; YaRN "currently the best";
  continued pre-training "slow but the most reliable": plain fine-tuning at 4x L against each scaling read
  on the control (the same extra steps and tokens at ``L``), and its spread across seeds.
* Passkey retrieval (Mohtashami & Jaggi 2023, https://arxiv.org/abs/2305.16300; the test the PI,
  YaRN and LongRoPE papers report): accuracy on a key of capital letters hidden in validation text, at 1x-8x L,
  for each scaling without and with fine-tuning; fine-tuning at 4x L should retrieve there better.
* Seed 000 Q4's Llama 3 recipe, checkpoint averaging "avoids catastrophic forgetting": the mean of the
  YaRN fine-tune's last k checkpoints, and base ⊕ fine-tuned, against the plain fine-tune (below).

The base models are the lab's RoPE models, one per seed (:mod:`poslab.lab.experiments.lab_models`). Each scaling
is applied at inference by :func:`scale_rope` (factor 4, ``original_max_len = L``); the fine-tunes start from each
seed's base model (``TrainConfig.init_from``) with the scaling set and ``block_size = 4 L``, at the same tokens per
step. A control trains the same extra steps at ``L`` without scaling, to separate what more training alone buys;
read at ``4 L`` with each scaling, it is the inference-only arm at the fine-tune's token budget.

Checkpoint averaging (seed 000 Q4: 「LLaMA3 的做法：8K 预训练 → 分阶段扩展到 128K，中间用 NTK-aware + 继续预训练 +
平均检查点（averaging checkpoints）避免灾难性遗忘。」, "Llama 3: pre-train at 8K, extend to 128K in stages, with
NTK-aware + continued pre-training + averaging checkpoints to avoid catastrophic forgetting"). The
:data:`AVERAGED` fine-tune keeps its last :data:`AVERAGE_LAST` checkpoints; four models of each seed are compared at
``L`` (forgetting), at ``4 L`` and on the passkey: the base model, the plain fine-tune, the mean of its last ``k``
checkpoints (:meth:`poslab.runs.RunFolder.averaged_model`), and base ⊕ fine-tune (weights :data:`BASE_WEIGHT` /
``1 - BASE_WEIGHT``). Where the Llama 3 paper (Dubey et al. 2024, arXiv:2407.21783) puts checkpoint averaging:
:data:`~poslab.lab.experiments.context_extension_claims.LLAMA3_NOTE`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from poslab.analysis.eval import parse_rope_scaling
from poslab.jobs.runner import check_workers, default_workers
from poslab.lab import verdicts
from poslab.lab.experiments.cells import MeanEvaluation
from poslab.lab.experiments.common import LAB, Baselines, baselines_field, corpus_baselines
from poslab.lab.experiments.context_extension_claims import (
    AVERAGED,
    AVERAGING,
    FACTOR,
    FINETUNE,
    INFERENCE,
    Budget,
)
from poslab.lab.experiments.context_extension_display import plot, plot_averaging
from poslab.lab.experiments.context_extension_measure import aggregate, averaging_summary, measure_seed, scale_rope
from poslab.lab.experiments.context_extension_passkey import (
    KEY_ALPHABET,
    KEY_LETTERS,
    PASSKEY_FACTORS,
    PASSKEY_PROMPTS,
    passkey_prompts,
)
from poslab.lab.experiments.context_extension_result import (
    Averaging,
    EqualBudget,
    MeanTuned,
    PasskeyResult,
    SeedReadings,
)
from poslab.lab.experiments.context_extension_tables import TABLES
from poslab.lab.experiments.context_extension_verdicts import all_claims, attach_premises, premise_of
from poslab.lab.experiments.declaration import Declaration, Plan, Runs, declare
from poslab.lab.experiments.lab_models import LabModel
from poslab.lab.experiments.training import planned_seeds
from poslab.lab.scale import CORPUS, SEED, Overrides, Scale, size_of, train_config

#: what the experiment's claims and tests read from here (their owners are the claims and passkey modules)
__all__ = ["AVERAGING", "FINETUNE", "INFERENCE", "KEY_ALPHABET", "KEY_LETTERS", "PASSKEY_FACTORS", "passkey_prompts"]
__all__ += ["EXPERIMENT", "ContextResult", "run", "scale_rope"]

#: checkpoints of the :data:`AVERAGED` fine-tune that are kept and averaged, per lab size
AVERAGE_LAST = {"smoke": 3, "quick": 3, "full": 5}
#: the arm of the control runs (the same extra steps at ``L``); the fine-tunes' arms are :data:`FINETUNE`'s labels
CONTROL = "control"
#: the arm of the RoPE base models
BASE = "rope"


# ------------------------------------------------------------------------------------ runs
def with_seed(cfg: Any, seed: int, name: str) -> Any:
    """``cfg`` with another seed and run name."""
    from poslab.training.config import TrainConfig

    return TrainConfig.from_dict({**cfg.to_dict(), "seed": seed, "name": name})


def _seeded_name(name: str, seed: int) -> str:
    return name if seed == SEED else f"{name}-seed{seed}"


def runs_dir(out: Path, lab: Scale) -> Path:
    """Where the experiment keeps its own runs (the fine-tunes and controls): ``OUT/runs/SIZE``."""
    return Path(out) / "runs" / lab.name


def finetune_config(label: str, spec: str, lab: Any, base_run: Path, out: Path, seed: int = SEED) -> Any:
    """The fine-tuning run of one variant: ``block_size = 4 L``, the scaling set, initialised from ``base_run``."""
    scaling = parse_rope_scaling(spec)
    position_config = {} if scaling["scaling"] is None else {**scaling, "original_max_len": lab.train_length}
    batch = max(1, lab.batch_size // FACTOR)  # the same tokens per step as the base run
    changes = Overrides(
        block_size=FACTOR * lab.train_length,
        position_config=position_config,
        steps=lab.finetune_steps,
        batch_size=batch,
        lr=lab.lr / 3,
        warmup_steps=max(1, lab.finetune_steps // 10),
        init_from=str(base_run),
    )
    cfg = train_config("rope", lab, runs_dir(out, lab), name=f"rope-finetune-{spec.split(':')[0]}", changes=changes)
    if label == AVERAGED:  # its last k checkpoints are averaged: keep them (saving costs no step)
        from poslab.training.config import TrainConfig

        cfg = TrainConfig.from_dict(
            {**cfg.to_dict(), "ckpt_interval": max(1, lab.finetune_steps // 10), "keep_checkpoints": average_last(lab)}
        )
    return with_seed(cfg, seed, _seeded_name(cfg.name, seed))


def average_last(lab: Any) -> int:
    """How many checkpoints of the :data:`AVERAGED` fine-tune are averaged at this size (:data:`AVERAGE_LAST`)."""
    return AVERAGE_LAST.get(lab.name, 3)


def control_config(lab: Any, base_run: Path, out: Path, seed: int = SEED) -> Any:
    """The control: the same number of extra steps at the original length ``L``, no scaling, to separate what
    more training alone buys (the base model is small and still learning) from what training at 4x L buys."""
    changes = Overrides(
        steps=lab.finetune_steps, lr=lab.lr / 3, warmup_steps=max(1, lab.finetune_steps // 10), init_from=str(base_run)
    )
    cfg = train_config("rope", lab, runs_dir(out, lab), name="rope-control-more-steps-at-L", changes=changes)
    return with_seed(cfg, seed, _seeded_name(cfg.name, seed))


def budget_of(lab: Any) -> Budget:
    """The extra training of each arm of the continued-training claim (:func:`finetune_config` at ``4 L``,
    :func:`control_config` at ``L``): the same steps; tokens per step from their batch sizes."""
    batch = max(1, lab.batch_size // FACTOR)
    return Budget(lab.finetune_steps, batch * FACTOR * lab.train_length, lab.batch_size * lab.train_length)


# ------------------------------------------------------------------------------------ the declaration
@dataclass(frozen=True)
class Setting:
    """The size, the RoPE models' seeds, the checkpoints averaged, and when the experiment started."""

    lab: Scale
    seeds: tuple[int, ...]
    last: int
    started: float


@dataclass(frozen=True)
class ContextResult:
    """The means over seeds of every reading (:mod:`.context_extension_result`'s types), and each seed's."""

    size: Scale
    train_length: int
    eval_length: int
    factor: int
    n_targets: int
    seeds: list[int]
    base_run: str
    base_runs: list[str]
    base: dict[str, MeanEvaluation]
    inference: dict[str, MeanEvaluation]
    finetune_runs: dict[str, list[str]]
    finetuned: dict[str, MeanTuned]
    control_more_steps_at_L: MeanTuned
    equal_budget: EqualBudget
    passkey: PasskeyResult
    averaging: Averaging
    per_seed: list[SeedReadings]
    baselines: Baselines = baselines_field()
    seconds: float
    workers: int


def plan(
    out: Path, quick: bool, size: str | Scale | None = None, seeds: tuple[int, ...] | None = None
) -> Plan[Setting]:
    """The RoPE base model of each seed (a lab model of the store), then every fine-tune and control initialised
    from its seed's base. ``size`` overrides ``quick``; ``seeds`` default to the plan's
    (:func:`~poslab.lab.experiments.training.planned_seeds`); with fewer than
    :data:`~poslab.lab.verdicts.MIN_SEEDS` every claim is inconclusive."""
    lab = size_of(quick, size)
    chosen = planned_seeds(EXPERIMENT.name, ("rope",), lab.name == "quick", seeds).get("rope", ())
    if not chosen:
        raise ValueError("seeds must name at least one seed")

    def tuned(bases: Any) -> Plan[None]:
        base_runs = {seed: run.path for seed, run in bases[BASE].items()}
        arms = {
            label: {s: finetune_config(label, spec, lab, base_runs[s], out, s).to_dict() for s in chosen}
            for label, spec in FINETUNE.items()
        }
        arms[CONTROL] = {s: control_config(lab, base_runs[s], out, s).to_dict() for s in chosen}
        return Plan(None, arms, summarise=False)

    return Plan(
        Setting(lab, chosen, average_last(lab), time.perf_counter()),
        {BASE: {s: LabModel("rope", lab, s) for s in chosen}},
        summarise=False,
        follow=tuned,
    )


def measure(runs: Runs[Setting]) -> ContextResult:
    """Every seed's readings (:func:`~.context_extension_measure.measure_seed`) and their means over seeds."""
    s, lab, by_arm = runs.setting, runs.setting.lab, runs.by_arm
    labels = [*FINETUNE, CONTROL]
    per_seed = [
        measure_seed(lab, seed, by_arm[BASE][seed].path, {k: by_arm[k][seed].path for k in labels}, s.last)
        for seed in s.seeds
    ]
    means = aggregate(per_seed)
    base_runs = [str(by_arm[BASE][seed].path) for seed in s.seeds]
    return ContextResult(
        size=lab,
        train_length=lab.train_length,
        eval_length=FACTOR * lab.train_length,
        factor=FACTOR,
        n_targets=lab.n_targets,
        seeds=list(s.seeds),
        base_run=base_runs[0],
        base_runs=base_runs,
        base=means["base"],
        inference=means["inference"],
        finetune_runs={label: [e.finetuned[label].run for e in per_seed] for label in labels},
        finetuned=means["finetuned"],
        control_more_steps_at_L=means["control"],
        equal_budget=EqualBudget(budget_of(lab), means["finetuned"]["none"].at_4L, means["control_inference"]),
        passkey=PasskeyResult(
            means["passkey"], list(PASSKEY_FACTORS), PASSKEY_PROMPTS, KEY_LETTERS, 1 / len(KEY_ALPHABET)
        ),
        averaging=averaging_summary(per_seed, lab, s.last),
        per_seed=per_seed,
        baselines=corpus_baselines(CORPUS),
        seconds=time.perf_counter() - s.started,
        workers=default_workers() if runs.workers is None else check_workers(runs.workers),
    )


def claims(r: ContextResult) -> list[verdicts.ClaimRecord]:
    """:func:`~.context_extension_claims.all_claims`, each with its premise (:func:`premise_of`)."""
    bigram = r.baselines.bigram
    made = all_claims(r.per_seed, r.averaging.last, r.size.finetune_steps, budget_of(r.size))
    return attach_premises(made, premise_of(r.per_seed, bigram))


def figures(r: ContextResult, out: Path) -> dict[str, Path]:
    """Perplexity and passkey against length per scaling and fine-tune; checkpoint averaging per seed."""
    base = r.base["L"].ppl()
    path = out / "context_extension.png"
    figure = plot(r.inference, r.finetuned, base, r.size, path, r.passkey.seeds, r.baselines.ngram_baselines)
    averaging = plot_averaging(r.per_seed, r.size, r.averaging.last, out / "checkpoint_averaging.png")
    return {"figure": figure, "averaging_figure": averaging}


EXPERIMENT = declare(
    name="context-extension",
    description="RoPE at 4x L with PI / NTK / dynamic / YaRN / Llama3, fine-tuning at 4x L, checkpoint averaging; "
    "perplexity + passkey, 3 seeds (seed 000 §3.5, Q4)",
    tier=LAB,
    declaration=Declaration(ContextResult, plan, measure, claims, TABLES, figures),
    after=("extrapolation", "position-training"),
    estimate=(65, 600),
)
run = EXPERIMENT.run
