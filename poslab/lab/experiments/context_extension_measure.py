"""The context-extension experiment's measurements of one seed's models (perplexity, passkey, checkpoint
averaging) and their means over seeds; :mod:`poslab.lab.experiments.context_extension` declares the experiment.

A seed's entry (:func:`measure_seed`) and the means (:func:`aggregate`) hold evaluation cells of
:func:`poslab.analysis.eval.evaluate_length` (``{"length": n, mode: {"ppl": ...}}``), the shape the claims
(:mod:`poslab.lab.experiments.context_extension_claims`) read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from poslab.analysis.eval import apply_rope_scaling, evaluate_length, loss_by_position, parse_rope_scaling
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
)
from poslab.lab.experiments.context_extension_passkey import PASSKEY_FACTORS, passkey_row
from poslab.lab.experiments.training import CONTEXT_WINDOWS
from poslab.lab.tables import mean_cell
from poslab.runs import RunFolder, load_run
from poslab.training.averaging import average_state_dicts


def scale_rope(model: Any, spec: str, original_max_len: int) -> Any:
    """Apply RoPE scaling ``spec`` (``"linear:4"``, ``"none"``, ...) to ``model`` at inference, in place.

    The one place this experiment changes a trained model's positions (today
    :func:`poslab.analysis.eval.apply_rope_scaling`).
    """
    apply_rope_scaling(model, parse_rope_scaling(spec), original_max_len=original_max_len)
    return model


def _cell(model: Any, tokens: torch.Tensor, length: int, n_targets: int) -> dict[str, Any]:
    return evaluate_length(model, tokens, length, n_targets, stride=length // 2)


def weight_distance(model: Any, reference: Any) -> float:
    """``||w - w_ref|| / ||w_ref||`` over every floating tensor of two models' state dicts (same keys)."""
    a, b = model.state_dict(), reference.state_dict()
    num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in b if b[k].is_floating_point())
    den = sum(float(b[k].double().pow(2).sum()) for k in b if b[k].is_floating_point())
    return (num / den) ** 0.5 if den else 0.0


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
        return mean_cell([get(e) for e in per_seed])

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


def averaging_summary(per_seed: list[dict[str, Any]], lab: Any, last: int) -> dict[str, Any]:
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
                "L": mean_cell([e["averaging"][name]["L"] for e in per_seed]),
                "4L": mean_cell([e["averaging"][name]["4L"] for e in per_seed]),
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
    }
