"""Context extension of a RoPE model: inference-time scalings, then fine-tuning at 4x L; perplexity and passkey.

Claims tested (verdicts computed from the measured values over seeds, never typed in; every claim is a
:class:`poslab.lab.verdicts.ClaimRecord`; which test decides each, fixed before any run, is
:mod:`poslab.lab.experiments.context_extension_claims`'s: the scalings are the same base models read
differently and the fine-tunes start from their seed's base model with its seed, so both are paired by
seed, on ln-perplexity):

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
  YaRN and LongRoPE papers report): a random key of capital letters is hidden in validation text and
  asked for at the end; accuracy of the model's argmax on the key's letters at 1x/2x/4x/8x L for each
  scaling, without and with fine-tuning. Fine-tuning at 4x L should retrieve there better than the
  same scaling without it.
* Seed 000 Q4's Llama 3 recipe, checkpoint averaging "avoids catastrophic forgetting": the mean of the
  YaRN fine-tune's last k checkpoints, and base ⊕ fine-tuned, against the plain fine-tune (below).

The RoPE models are the extrapolation experiment's, one per seed (at least :data:`MIN_SEEDS`): the
seeds are read from that experiment's ``results.json`` when it lists them, completed identical runs
anywhere under its ``models/SIZE`` folder are reused, and missing seeds are trained here. Each scaling
is applied at inference by :func:`scale_rope` (factor 4, ``original_max_len = L``); the fine-tunes are
new runs initialised from each seed's RoPE run (``TrainConfig.init_from``) with the scaling set and
``block_size = 4 L``, trained at the same tokens per step. A control run trains the same number of
extra steps at ``L`` without scaling, to separate what more training alone buys; read at ``4 L`` with
each scaling, it is the inference-only arm at the fine-tune's token budget.

Checkpoint averaging (seed 000 Q4: 「LLaMA3 的做法：8K 预训练 → 分阶段扩展到 128K，中间用 NTK-aware + 继续预训练 +
平均检查点（averaging checkpoints）避免灾难性遗忘。」, "Llama 3: pre-train at 8K, extend to 128K in stages, with
NTK-aware + continued pre-training + averaging checkpoints to avoid catastrophic forgetting"). The
:data:`AVERAGED` fine-tune keeps its last :data:`AVERAGE_LAST` checkpoints (every
``finetune_steps // 10`` steps); four models of each seed are compared at ``L`` (forgetting), at
``4 L`` and on the passkey: the base model (no scaling at ``L``; the fine-tune's scaling at inference
at ``4 L``), the plain fine-tune (its final checkpoint), the mean of its last ``k`` checkpoints
(:meth:`poslab.runs.RunFolder.averaged_model`), and base ⊕ fine-tune, the mean with weights
:data:`BASE_WEIGHT` / ``1 - BASE_WEIGHT`` of the base's and the final fine-tune's weights (the same shapes:
RoPE has no weights; the average uses the fine-tune's position config). Averaging costs no training
step. In the Llama 3 paper (Dubey et al. 2024, "The Llama 3 Herd of Models", arXiv:2407.21783)
checkpoint averaging belongs to the annealing stage of pre-training (§3.4.3) and to post-training
(§4.1.5, averaging models across RM / SFT / DPO runs), not to the long-context stage (§3.4.2) the lesson
ties it to.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from poslab.analysis.eval import apply_rope_scaling, evaluate_length, loss_by_position, parse_rope_scaling
from poslab.jobs.runner import check_workers, default_workers
from poslab.lab import verdicts
from poslab.lab.experiments import context_extension_tables, read_results
from poslab.lab.experiments.common import LAB, Experiment, baseline_line, ngram_baselines
from poslab.lab.experiments.context_extension_claims import (
    AVERAGED,
    AVERAGING,
    BASE_WEIGHT,
    FACTOR,
    FINETUNE,
    INFERENCE,
    LLAMA3_NOTE,
    PASSKEY_TOLERANCE,
    PPL_TOLERANCE,
    SCALINGS,
    SOURCE_AVERAGING,
    SOURCE_WISE,
    Budget,
    all_claims,
    attach_premises,
    premise_of,
)
from poslab.lab.experiments.context_extension_display import plot, plot_averaging, report
from poslab.lab.experiments.context_extension_passkey import (
    KEY_ALPHABET,
    KEY_LETTERS,
    PASSKEY_FACTORS,
    PASSKEY_PROMPTS,
    passkey_prompts,
    passkey_row,
)
from poslab.lab.experiments.lab_models import EXTRAPOLATION, POSITION_TRAINING, model_root, models_dir, reused
from poslab.lab.experiments.training import CONTEXT_WINDOWS, ensure_many, planned_seeds
from poslab.lab.scale import CORPUS, SEED, Scale, size_of, train_config
from poslab.runs import RunFolder, load_run
from poslab.training.averaging import average_state_dicts

#: what the experiment's claims and tests read from here (their owners are the claims and passkey modules)
__all__ = [
    "AVERAGED",
    "AVERAGING",
    "BASE_WEIGHT",
    "FACTOR",
    "FINETUNE",
    "INFERENCE",
    "KEY_ALPHABET",
    "KEY_LETTERS",
    "PASSKEY_FACTORS",
    "PASSKEY_PROMPTS",
    "SOURCE_AVERAGING",
    "SOURCE_WISE",
    "EXPERIMENT",
    "passkey_prompts",
    "run",
]

#: fewest seeds the experiment runs (a comparison needs this many to be conclusive)
MIN_SEEDS = verdicts.MIN_SEEDS
#: checkpoints of the :data:`AVERAGED` fine-tune that are kept and averaged, per lab size
AVERAGE_LAST = {"smoke": 3, "quick": 3, "full": 5}


def scale_rope(model: Any, spec: str, original_max_len: int) -> Any:
    """Apply RoPE scaling ``spec`` (``"linear:4"``, ``"none"``, ...) to ``model`` at inference, in place.

    The one place this experiment changes a trained model's positions (today
    :func:`poslab.analysis.eval.apply_rope_scaling`).
    """
    apply_rope_scaling(model, parse_rope_scaling(spec), original_max_len=original_max_len)
    return model


def _cell(model: Any, tokens: torch.Tensor, length: int, n_targets: int) -> dict[str, Any]:
    return evaluate_length(model, tokens, length, n_targets, stride=length // 2)


def _ppl(cell: dict[str, Any], mode: str = "nonoverlapping") -> float:
    return cell[mode]["ppl"]


# ------------------------------------------------------------------------------------ runs
def seeds_of(out: Path) -> list[int]:
    """The seeds of the RoPE models: the extrapolation experiment's (its ``results.json``) when it
    lists them, topped up to :data:`MIN_SEEDS` with ``SEED, SEED + 1, ...``."""
    seeds: list[int] = []
    results = read_results(reused(out, EXTRAPOLATION, EXPERIMENT.reuses))
    listed = results.get("seeds", [results["seed"]] if isinstance(results.get("seed"), int) else [])
    for seed in listed if isinstance(listed, list) else []:
        if isinstance(seed, int) and not isinstance(seed, bool) and seed not in seeds:
            seeds.append(seed)
    candidate = SEED
    while len(seeds) < MIN_SEEDS:
        if candidate not in seeds:
            seeds.append(candidate)
        candidate += 1
    return seeds


def with_seed(cfg: Any, seed: int, name: str) -> Any:
    """``cfg`` with another seed and run name."""
    from poslab.training.config import TrainConfig

    return TrainConfig.from_dict({**cfg.to_dict(), "seed": seed, "name": name})


def _seeded_name(name: str, seed: int) -> str:
    return name if seed == SEED else f"{name}-seed{seed}"


def _run_folders(root: Path, depth: int = 3) -> list[Path]:
    """Run folders (holding ``config.json``) under ``root``, at most ``depth`` levels down."""
    if not root.is_dir():
        return []
    found, level = [], [root]
    for _ in range(depth):
        level = [p for d in level for p in sorted(d.iterdir()) if p.is_dir()]
        found += [p for p in level if (p / "config.json").is_file()]
    return found


def base_config(lab: Any, out: Path, seed: int) -> Any:
    return with_seed(train_config("rope", lab, models_dir(out, lab)), seed, _seeded_name("rope", seed))


def finetune_config(label: str, spec: str, lab: Any, base_run: Path, out: Path, seed: int = SEED) -> Any:
    """The fine-tuning run of one variant: ``block_size = 4 L``, the scaling set, initialised from ``base_run``."""
    scaling = parse_rope_scaling(spec)
    position_config = {} if scaling["scaling"] is None else {**scaling, "original_max_len": lab.train_length}
    batch = max(1, lab.batch_size // FACTOR)  # the same tokens per step as the base run
    cfg = train_config(
        "rope",
        lab,
        models_dir(out, lab),
        name=f"rope-finetune-{spec.split(':')[0]}",
        block_size=FACTOR * lab.train_length,
        position_config=position_config,
        steps=lab.finetune_steps,
        batch_size=batch,
        lr=lab.lr / 3,
        warmup_steps=max(1, lab.finetune_steps // 10),
        init_from=str(base_run),
    )
    if label == AVERAGED:  # its last k checkpoints are averaged: keep them (saving costs no step)
        from poslab.training.config import TrainConfig

        cfg = TrainConfig.from_dict(
            {**cfg.to_dict(), "ckpt_interval": max(1, lab.finetune_steps // 10), "keep_checkpoints": average_last(lab)}
        )
    return with_seed(cfg, seed, _seeded_name(cfg.name, seed))


def average_last(lab: Any) -> int:
    """How many checkpoints of the :data:`AVERAGED` fine-tune are averaged at this size (:data:`AVERAGE_LAST`)."""
    return AVERAGE_LAST.get(lab.name, 3)


def averaging_models(base: Any, run_dir: Path, last: int, base_weight: float = BASE_WEIGHT) -> dict[str, Any]:
    """The two averaged models of one seed: the mean of the fine-tune's last ``last`` checkpoints, and
    base ⊕ fine-tuned (``base_weight`` on the base model's weights, the rest on the final fine-tune's).

    Args:
        base: the base model (its weights only are read).
        run_dir: the fine-tune's run folder.
        last: checkpoints averaged.
        base_weight: the base model's weight in base ⊕ fine-tuned.

    Returns:
        ``{"last-k average": model, "base ⊕ fine-tuned": model, "steps": averaged steps}``; both models
        carry the fine-tune's position config (its scaling).
    """
    averaged, steps = RunFolder(run_dir).averaged_model(last)
    mixed, _, _ = load_run(run_dir)
    mixed.load_state_dict(average_state_dicts([base.state_dict(), mixed.state_dict()], [base_weight, 1 - base_weight]))
    return {"last-k average": averaged, "base ⊕ fine-tuned": mixed.eval(), "steps": steps}


def control_config(lab: Any, base_run: Path, out: Path, seed: int = SEED) -> Any:
    """The control: the same number of extra steps at the original length ``L``, no scaling.

    It separates what more training alone buys (the base model is small and still learning) from
    what training at 4x L buys.
    """
    cfg = train_config(
        "rope",
        lab,
        models_dir(out, lab),
        name="rope-control-more-steps-at-L",
        steps=lab.finetune_steps,
        lr=lab.lr / 3,
        warmup_steps=max(1, lab.finetune_steps // 10),
        init_from=str(base_run),
    )
    return with_seed(cfg, seed, _seeded_name(cfg.name, seed))


def budget_of(lab: Any) -> Budget:
    """The extra training of each arm of the continued-training claim (:func:`finetune_config` at ``4 L``,
    :func:`control_config` at ``L``): the same steps; tokens per step from their batch sizes."""
    batch = max(1, lab.batch_size // FACTOR)
    return Budget(lab.finetune_steps, batch * FACTOR * lab.train_length, lab.batch_size * lab.train_length)


# ------------------------------------------------------------------------------------ measurements
def weight_distance(model: Any, reference: Any) -> float:
    """``||w - w_ref|| / ||w_ref||`` over every floating tensor of two models' state dicts (same keys)."""
    a, b = model.state_dict(), reference.state_dict()
    num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in b if b[k].is_floating_point())
    den = sum(float(b[k].double().pow(2).sum()) for k in b if b[k].is_floating_point())
    return (num / den) ** 0.5 if den else 0.0


# ------------------------------------------------------------------------------------ tables
def _mean_cell(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """A cell of mean perplexities over seeds (the shape of one seed's cell), with the per-seed values."""
    out: dict[str, Any] = {"length": cells[0]["length"]}
    for mode in ("nonoverlapping", "sliding"):
        if all(c.get(mode) for c in cells):
            values = [c[mode]["ppl"] for c in cells]
            out[mode] = {
                "ppl": statistics.fmean(values),
                "ppl_sd": statistics.stdev(values) if len(values) > 1 else None,
                "ppl_per_seed": values,
            }
    return out


# ------------------------------------------------------------------------------------ run
def base_reuse(lab: Any, out: Path) -> tuple[Path, ...]:
    """Where the lab's RoPE base models may already be: the extrapolation experiment's models, and the
    runs of position-training's quick form (which extrapolation itself reuses, so its own models folder
    may hold none)."""
    return tuple(
        _run_folders(model_root(out, EXTRAPOLATION, lab, EXPERIMENT.reuses))
        + _run_folders(model_root(out, POSITION_TRAINING, lab, EXPERIMENT.reuses), depth=1)
    )


def train_models(lab: Any, out: Path, seeds: list[int], workers: int) -> tuple[list[Path], list[Path]]:
    """Train (or reuse) the RoPE base model of each seed, then every fine-tune and control of each base.

    Returns:
        ``(base_runs, tuned_runs)``: one base run per seed; the fine-tunes seed by seed in the order of
        :data:`FINETUNE`, then one control run per seed.
    """
    reuse = base_reuse(lab, out)
    base_runs = ensure_many([(base_config(lab, out, s), reuse) for s in seeds], workers)
    tuned = [
        finetune_config(label, spec, lab, base_runs[i], out, seed)
        for i, seed in enumerate(seeds)
        for label, spec in FINETUNE.items()
    ]
    tuned += [control_config(lab, base_runs[i], out, seed) for i, seed in enumerate(seeds)]
    return base_runs, ensure_many([(cfg, ()) for cfg in tuned], workers)


def measure_seed(lab: Any, seed: int, base_run: Path, tuned_runs: dict[str, Path], last: int) -> dict[str, Any]:
    """Every measurement of one seed: the base at L, each inference-time scaling and fine-tune at 4 L
    and back at L, passkey retrieval of each, and the checkpoint-averaging variants.

    Args:
        lab: the size.
        seed: the seed (recorded).
        base_run: the seed's RoPE run.
        tuned_runs: fine-tune label (and ``"control"``) -> its run.
        last: checkpoints averaged (:func:`average_last`).
    """
    long_length = FACTOR * lab.train_length
    model, tokenizer, _ = load_run(base_run)
    tokens = RunFolder(base_run).split_tokens("val", tokenizer)
    entry: dict[str, Any] = {
        "seed": seed,
        "base_run": str(base_run),
        "base": {"L": _cell(model, tokens, lab.train_length, lab.n_targets)},
        "inference": {},
        "finetuned": {},
        "passkey": {"inference": {}, "finetuned": {}},
    }
    entry["passkey"]["base"] = passkey_row(model, tokens, tokenizer, lab.train_length)
    entry["loss_by_position"] = [float(v) for v in loss_by_position(model, tokens, lab.train_length, CONTEXT_WINDOWS)]
    for label, spec in INFERENCE.items():  # scale_rope changes the model: every measurement at L comes first
        scale_rope(model, spec, lab.train_length)
        entry["inference"][label] = {**_cell(model, tokens, long_length, lab.n_targets), "rope_scaling": spec}
        entry["passkey"]["inference"][label] = passkey_row(model, tokens, tokenizer, lab.train_length)
    for label, spec in [*FINETUNE.items(), ("control", "none")]:
        tuned, _, _ = load_run(tuned_runs[label])
        entry["finetuned"][label] = {
            "rope_scaling": spec,
            "run": str(tuned_runs[label]),
            "4L": _cell(tuned, tokens, long_length, lab.n_targets),
            "L": _cell(tuned, tokens, lab.train_length, lab.n_targets),
        }
        entry["passkey"]["finetuned"][label] = passkey_row(tuned, tokens, tokenizer, lab.train_length)
        if label == AVERAGED:
            final = tuned
    control, _, _ = load_run(tuned_runs["control"])
    entry["control_inference"] = {}
    for label in SCALINGS:  # the control read at 4 L with each scaling: inference-only at the fine-tune's budget
        scale_rope(control, INFERENCE[label], lab.train_length)
        entry["control_inference"][label] = {
            **_cell(control, tokens, long_length, lab.n_targets),
            "rope_scaling": INFERENCE[label],
        }
    made = averaging_models(model, tuned_runs[AVERAGED], last)
    entry["averaging"] = {
        "steps": made["steps"],
        "base": {
            "L": entry["base"]["L"],
            "4L": entry["inference"][AVERAGED],
            "passkey": entry["passkey"]["inference"][AVERAGED],
        },
        "fine-tuned": {
            "L": entry["finetuned"][AVERAGED]["L"],
            "4L": entry["finetuned"][AVERAGED]["4L"],
            "passkey": entry["passkey"]["finetuned"][AVERAGED],
        },
        "weight_distance_to_fine_tuned": {"base": weight_distance(model, final)},
    }
    for label in ("last-k average", "base ⊕ fine-tuned"):
        averaged = made[label]
        entry["averaging"][label] = {
            "L": _cell(averaged, tokens, lab.train_length, lab.n_targets),
            "4L": _cell(averaged, tokens, long_length, lab.n_targets),
            "passkey": passkey_row(averaged, tokens, tokenizer, lab.train_length),
        }
        entry["averaging"]["weight_distance_to_fine_tuned"][label] = weight_distance(averaged, final)
    return entry


def aggregate(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """The per-seed measurements as means over seeds: ``base``, ``inference``, ``finetuned``, ``control``,
    ``passkey``."""

    def mean_of(get: Any) -> dict[str, Any]:
        return _mean_cell([get(e) for e in per_seed])

    return {
        "base": {"L": mean_of(lambda e: e["base"]["L"])},
        "inference": {
            label: {**mean_of(lambda e, k=label: e["inference"][k]), "rope_scaling": spec}
            for label, spec in INFERENCE.items()
        },
        "finetuned": {
            label: {
                "rope_scaling": spec,
                "4L": mean_of(lambda e, k=label: e["finetuned"][k]["4L"]),
                "L": mean_of(lambda e, k=label: e["finetuned"][k]["L"]),
            }
            for label, spec in FINETUNE.items()
        },
        "control": {
            "4L": mean_of(lambda e: e["finetuned"]["control"]["4L"]),
            "L": mean_of(lambda e: e["finetuned"]["control"]["L"]),
        },
        "control_inference": {
            label: {**mean_of(lambda e, k=label: e["control_inference"][k]), "rope_scaling": INFERENCE[label]}
            for label in SCALINGS
        },
        "passkey": {
            "base": {str(f): [e["passkey"]["base"][str(f)] for e in per_seed] for f in PASSKEY_FACTORS},
            "inference": {
                k: {str(f): [e["passkey"]["inference"][k][str(f)] for e in per_seed] for f in PASSKEY_FACTORS}
                for k in INFERENCE
            },
            "finetuned": {
                k: {str(f): [e["passkey"]["finetuned"][k][str(f)] for e in per_seed] for f in PASSKEY_FACTORS}
                for k in [*FINETUNE, "control"]
            },
        },
    }


def averaging_summary(per_seed: list[dict[str, Any]], lab: Any, last: int, figure: Path) -> dict[str, Any]:
    """The checkpoint-averaging block of results.json."""
    return {
        "fine_tune": AVERAGED,
        "rope_scaling": FINETUNE[AVERAGED],
        "last": last,
        "base_weight": BASE_WEIGHT,
        "ckpt_interval": max(1, lab.finetune_steps // 10),
        "steps": [e["averaging"]["steps"] for e in per_seed],
        "variants": {
            name: {
                "what": what,
                "L": _mean_cell([e["averaging"][name]["L"] for e in per_seed]),
                "4L": _mean_cell([e["averaging"][name]["4L"] for e in per_seed]),
                "passkey": {
                    str(f): [e["averaging"][name]["passkey"][str(f)] for e in per_seed] for f in PASSKEY_FACTORS
                },
                "weight_distance_to_fine_tuned": [
                    e["averaging"]["weight_distance_to_fine_tuned"].get(name, 0.0) for e in per_seed
                ],
            }
            for name, what in AVERAGING.items()
        },
        "tolerances": {"ppl_ratio": PPL_TOLERANCE, "passkey": PASSKEY_TOLERANCE},
        "note": LLAMA3_NOTE,
        "figure": str(figure),
    }


def run(
    out: Path,
    quick: bool = False,
    size: str | Scale | None = None,
    workers: int | None = None,
    seeds: tuple[int, ...] | None = None,
) -> dict:
    """Inference-time scalings and fine-tunes of the lab's RoPE models (one per seed); tables, plot, claims.

    Args:
        out: output folder.
        quick: the lab's quick size (else full).
        size: a size name overriding ``quick`` (``smoke`` for tests).
        workers: trainings at a time (default: one per core, at most two).
        seeds: the RoPE models' seeds (default: the quick lab's seeds of its RoPE arm at the quick size,
            :data:`poslab.lab.plan.QUICK_SEEDS`, else :func:`seeds_of`: the extrapolation experiment's, at
            least :data:`MIN_SEEDS`); with fewer than :data:`MIN_SEEDS` every claim is inconclusive.
    """
    lab = size_of(quick, size)
    out = Path(out)
    start = time.perf_counter()
    workers = default_workers() if workers is None else check_workers(workers)
    if seeds is None and lab.name == "quick":
        seeds = planned_seeds(EXPERIMENT.name, ("rope",), quick=True)["rope"]
    seeds = list(seeds) if seeds is not None else seeds_of(out)
    last = average_last(lab)
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    base_runs, tuned_runs = train_models(lab, out, seeds, workers)
    labels = [*FINETUNE, "control"]
    per_seed = [
        measure_seed(
            lab,
            seed,
            base_runs[i],
            {
                label: tuned_runs[i * len(FINETUNE) + j]
                if label != "control"
                else tuned_runs[len(seeds) * len(FINETUNE) + i]
                for j, label in enumerate(labels)
            },
            last,
        )
        for i, seed in enumerate(seeds)
    ]
    means = aggregate(per_seed)
    budget = budget_of(lab)
    report(per_seed, means, lab, last, budget)
    ngrams = ngram_baselines(CORPUS)
    bigram = ngrams["bigram"]
    print(baseline_line(CORPUS))
    claims = attach_premises(
        all_claims(per_seed, last, lab.finetune_steps, budget), lambda record: premise_of(record, per_seed, bigram)
    )
    figure = plot(
        means["inference"],
        means["finetuned"],
        _ppl(means["base"]["L"]),
        lab,
        out / "context_extension.png",
        means["passkey"],
        ngrams,
    )
    averaging_figure = plot_averaging(per_seed, lab, last, out / "checkpoint_averaging.png")
    return {
        "experiment": EXPERIMENT.name,
        "size": dataclasses.asdict(lab),
        "train_length": lab.train_length,
        "eval_length": FACTOR * lab.train_length,
        "factor": FACTOR,
        "n_targets": lab.n_targets,
        "seeds": seeds,
        "base_run": str(base_runs[0]),
        "base_runs": [str(p) for p in base_runs],
        "base": means["base"],
        "inference": means["inference"],
        "finetune_runs": {label: [e["finetuned"][label]["run"] for e in per_seed] for label in labels},
        "finetuned": means["finetuned"],
        "control_more_steps_at_L": means["control"],
        "equal_budget": {
            "budget": dataclasses.asdict(budget),
            "continued_training": means["finetuned"]["none"]["4L"],
            "control_inference": means["control_inference"],
        },
        "passkey": {
            **means["passkey"],
            "factors": list(PASSKEY_FACTORS),
            "prompts": PASSKEY_PROMPTS,
            "key_letters": KEY_LETTERS,
            "chance": 1 / len(KEY_ALPHABET),
        },
        "averaging": averaging_summary(per_seed, lab, last, averaging_figure),
        "per_seed": per_seed,
        "claims": claims,
        "ngram_baselines": ngrams,
        "figure": str(figure),
        "figures": [str(figure), str(averaging_figure)],
        "seconds": time.perf_counter() - start,
        "workers": workers,
    }


EXPERIMENT = Experiment(
    name="context-extension",
    description="RoPE at 4x L with PI / NTK / dynamic / YaRN / Llama3, fine-tuning at 4x L, checkpoint averaging; "
    "perplexity + passkey, 3 seeds (seed 000 §3.5, Q4)",
    tier=LAB,
    run=run,
    reuses=("extrapolation", "position-training"),
    estimate=(65, 600),
    tables=context_extension_tables.TABLES,
)
