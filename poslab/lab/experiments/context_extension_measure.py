"""The context-extension experiment's measurements of one seed's models (perplexity, passkey, checkpoint
averaging) and their means over seeds."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import torch

from poslab.analysis.eval import apply_rope_scaling, evaluate_length, loss_by_position, parse_rope_scaling
from poslab.lab.experiments.cells import Evaluation, MeanEvaluation
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
from poslab.lab.experiments.context_extension_passkey import passkey_row
from poslab.lab.experiments.context_extension_result import (
    Averaging,
    MeanTuned,
    MeanVariant,
    Passkeys,
    SeedAveraging,
    SeedPasskey,
    SeedReadings,
    SeedTuned,
    SeedVariant,
)
from poslab.lab.experiments.training import CONTEXT_WINDOWS
from poslab.runs import RunFolder, load_run
from poslab.training.averaging import average_state_dicts


def scale_rope(model: Any, spec: str, original_max_len: int) -> Any:
    """Apply RoPE scaling ``spec`` (``"linear:4"``, ``"none"``, ...) to ``model`` at inference, in place: the one
    place this experiment changes a trained model's positions."""
    apply_rope_scaling(model, parse_rope_scaling(spec), original_max_len=original_max_len)
    return model


def _cell(model: Any, tokens: torch.Tensor, length: int, n_targets: int, rope_scaling: str | None = None) -> Evaluation:
    return Evaluation.of(evaluate_length(model, tokens, length, n_targets, stride=length // 2), rope_scaling)


def weight_distance(model: Any, reference: Any) -> float:
    """``||w - w_ref|| / ||w_ref||`` over every floating tensor of two models' state dicts (same keys)."""
    a, b = model.state_dict(), reference.state_dict()
    num = sum(float((a[k].double() - b[k].double()).pow(2).sum()) for k in b if b[k].is_floating_point())
    den = sum(float(b[k].double().pow(2).sum()) for k in b if b[k].is_floating_point())
    return (num / den) ** 0.5 if den else 0.0


class Averaged(NamedTuple):
    """One seed's two averaged models by label (``"last-k average"``, ``"base ⊕ fine-tuned"``) and the fine-tune's
    checkpoint steps the first averages."""

    models: dict[str, Any]
    steps: list[int]


def averaging_models(base: Any, run_dir: Path, last: int, base_weight: float = BASE_WEIGHT) -> Averaged:
    """The two averaged models of one seed: the mean of the fine-tune's (``run_dir``) last ``last`` checkpoints, and
    ``base_weight`` on the ``base`` model's weights with the rest on the final fine-tune's; both carry the fine-tune's
    scaling."""
    averaged, steps = RunFolder(run_dir).averaged_model(last)
    mixed, _, _ = load_run(run_dir)
    mixed.load_state_dict(average_state_dicts([base.state_dict(), mixed.state_dict()], [base_weight, 1 - base_weight]))
    return Averaged({"last-k average": averaged, "base ⊕ fine-tuned": mixed.eval()}, steps)


def measure_seed(lab: Any, seed: int, base_run: Path, tuned_runs: dict[str, Path], last: int) -> SeedReadings:
    """Every measurement of one seed: the base at L, each inference-time scaling and fine-tune (``tuned_runs``:
    label, and ``"control"``, -> run) at 4 L and back at L, passkey retrieval of each, and the checkpoint-averaging
    variants (``last`` checkpoints averaged)."""
    long_length, length, n = FACTOR * lab.train_length, lab.train_length, lab.n_targets
    model, tokenizer, _ = load_run(base_run)
    tokens = RunFolder(base_run).split_tokens("val", tokenizer)
    base, passkey = _cell(model, tokens, length, n), SeedPasskey({}, {}, passkey_row(model, tokens, tokenizer, length))
    by_position = [float(v) for v in loss_by_position(model, tokens, length, CONTEXT_WINDOWS)]
    inference = {}  # passkey's dicts fill as each model is read
    for label, spec in INFERENCE.items():  # scale_rope changes the model: every measurement at L comes first
        scale_rope(model, spec, length)
        inference[label] = _cell(model, tokens, long_length, n, spec)
        passkey.inference[label] = passkey_row(model, tokens, tokenizer, length)
    finetuned = {}
    for label, spec in [*FINETUNE.items(), ("control", "none")]:
        tuned, _, _ = load_run(tuned_runs[label])
        at_4L, at_L = _cell(tuned, tokens, long_length, n), _cell(tuned, tokens, length, n)
        finetuned[label] = SeedTuned(spec, str(tuned_runs[label]), at_4L, at_L)
        passkey.finetuned[label] = passkey_row(tuned, tokens, tokenizer, length)
        if label == AVERAGED:
            final = tuned
    control, _, _ = load_run(tuned_runs["control"])
    control_inference = {}
    for label in SCALINGS:  # the control read at 4 L with each scaling: inference-only at the fine-tune's budget
        scale_rope(control, INFERENCE[label], length)
        control_inference[label] = _cell(control, tokens, long_length, n, INFERENCE[label])
    made = averaging_models(model, tuned_runs[AVERAGED], last)
    plain = finetuned[AVERAGED]
    kept = {
        "base": SeedVariant(base, inference[AVERAGED], passkey.inference[AVERAGED]),
        "fine-tuned": SeedVariant(plain.at_L, plain.at_4L, passkey.finetuned[AVERAGED]),
    }
    distance = {"base": weight_distance(model, final)}
    for label in ("last-k average", "base ⊕ fine-tuned"):
        averaged = made.models[label]
        at_L, at_4L = _cell(averaged, tokens, length, n), _cell(averaged, tokens, long_length, n)
        kept[label] = SeedVariant(at_L, at_4L, passkey_row(averaged, tokens, tokenizer, length))
        distance[label] = weight_distance(averaged, final)
    averaging = SeedAveraging(
        made.steps,
        base=kept["base"],
        fine_tuned=kept["fine-tuned"],
        weight_distance_to_fine_tuned=distance,
        last_k=kept["last-k average"],
        mixed=kept["base ⊕ fine-tuned"],
    )
    return SeedReadings(
        seed, str(base_run), {"L": base}, inference, finetuned, passkey, by_position, control_inference, averaging
    )


def aggregate(per_seed: list[SeedReadings]) -> dict[str, Any]:
    """The per-seed measurements as means over seeds: ``base`` (at ``L``), ``inference``, ``finetuned``,
    ``control``, ``control_inference``, ``passkey``."""

    def mean(get: Any, rope_scaling: str | None = None) -> MeanEvaluation:
        return MeanEvaluation.of([get(e) for e in per_seed], rope_scaling)

    def tuned(label: str, rope_scaling: str | None = None) -> MeanTuned:
        at_4L, at_L = mean(lambda e: e.finetuned[label].at_4L), mean(lambda e: e.finetuned[label].at_L)
        return MeanTuned(rope_scaling=rope_scaling, at_4L=at_4L, at_L=at_L)

    return {
        "base": {"L": mean(lambda e: e.base["L"])},
        "inference": {k: mean(lambda e, k=k: e.inference[k], spec) for k, spec in INFERENCE.items()},
        "finetuned": {label: tuned(label, spec) for label, spec in FINETUNE.items()},
        "control": tuned("control"),
        "control_inference": {k: mean(lambda e, k=k: e.control_inference[k], INFERENCE[k]) for k in SCALINGS},
        "passkey": Passkeys.of(per_seed),
    }


def averaging_summary(per_seed: list[SeedReadings], lab: Any, last: int) -> Averaging:
    """The checkpoint-averaging block of results.json."""

    def variant(name: str, what: str) -> MeanVariant:
        kept = [e.averaging.variants()[name] for e in per_seed]
        return MeanVariant(
            what,
            MeanEvaluation.of([v.at_L for v in kept]),
            MeanEvaluation.of([v.at_4L for v in kept]),
            {f: [v.passkey[f] for v in kept] for f in kept[0].passkey},
            [0.0 if name == "fine-tuned" else e.averaging.weight_distance_to_fine_tuned[name] for e in per_seed],
        )

    return Averaging(
        fine_tune=AVERAGED,
        rope_scaling=FINETUNE[AVERAGED],
        last=last,
        base_weight=BASE_WEIGHT,
        ckpt_interval=max(1, lab.finetune_steps // 10),
        steps=[e.averaging.steps for e in per_seed],
        variants={name: variant(name, what) for name, what in AVERAGING.items()},
        tolerances={"ppl_ratio": PPL_TOLERANCE, "passkey": PASSKEY_TOLERANCE},
        note=LLAMA3_NOTE,
    )
