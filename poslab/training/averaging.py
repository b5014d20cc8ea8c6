"""Weight averaging: a weighted mean of state dicts (checkpoint averaging, model soups).

:func:`average_state_dicts` is the one place poslab averages weights. It checks that every state
dict has the same keys, shapes and dtypes, averages floating tensors in float32 (so that a bf16 or
fp16 average does not round at every partial sum) and casts the result back to each tensor's dtype;
integer and bool tensors (step counters, masks, index buffers) are not averaged: they must be equal
in every state dict, and are copied. Reading the checkpoints of a run is
:meth:`poslab.runs.RunFolder.averaged_model`'s job.

Uses: the mean of the last ``k`` checkpoints of one run (Polyak averaging; the Llama 3 paper,
Dubey et al. 2024, averages checkpoints in the annealing stage of pre-training and across
post-training runs), and the interpolation ``w * base + (1 - w) * fine-tuned`` of two models of the
same shapes (Wortsman et al. 2022, "Robust fine-tuning of zero-shot models", WiSE-FT).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from poslab.checks import is_number


def normalised_weights(n: int, weights: Sequence[float] | None) -> list[float]:
    """Validated averaging weights, normalised to sum 1 (default: uniform)."""
    if weights is None:
        return [1.0 / n] * n
    weights = list(weights)
    if len(weights) != n:
        raise ValueError(f"weights has {len(weights)} values for {n} state dicts; give one weight per state dict")
    values = []
    for i, w in enumerate(weights):
        try:
            value = float(w) if is_number(w) else math.nan
        except OverflowError:  # an integer past float's range
            value = math.inf
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"weights[{i}] = {w!r}: each weight must be a finite number >= 0")
        values.append(value)
    largest = max(values)
    if largest <= 0:
        raise ValueError(f"weights {weights} sum to 0.0: at least one weight must be > 0")
    # divided by the largest first: 1e308 + 1e308 overflows to inf (and every weight would become 0),
    # the scaled weights sum to at most n
    scaled = [v / largest for v in values]
    total = sum(scaled)
    return [v / total for v in scaled]


def average_state_dicts(
    state_dicts: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float] | None = None
) -> dict[str, torch.Tensor]:
    """The weighted mean of ``state_dicts``, key by key.

    Args:
        state_dicts: at least one mapping name -> tensor, all with the same keys, and for each key
            the same shape and dtype (e.g. ``model.state_dict()`` of checkpoints of one run, or of
            a base model and its fine-tune).
        weights: one finite weight >= 0 per state dict, not all 0; normalised to sum 1
            (default: uniform, the plain mean).

    Returns:
        A new dict (fresh CPU tensors, keys in the first state dict's order): floating tensors are
        ``sum_i w_i * t_i`` computed in float32 (float64 stays float64) and cast back to their dtype;
        integer and bool tensors are copied from the first state dict.

    Raises:
        ValueError: no state dicts; a weight that is negative, not finite, or the wrong count; keys that
            differ (the missing and extra keys named, with the state dict's index); a key whose shape or
            dtype differs (the key, both shapes or dtypes named); an integer or bool tensor whose values
            differ between state dicts (the key named: such buffers cannot be averaged).
    """
    if len(state_dicts) == 0:
        raise ValueError("average_state_dicts needs at least one state dict; got none")
    w = normalised_weights(len(state_dicts), weights)
    first = state_dicts[0]
    keys = list(first)
    for i, sd in enumerate(state_dicts[1:], start=1):
        missing, extra = sorted(set(keys) - set(sd)), sorted(set(sd) - set(keys))
        if missing or extra:
            raise ValueError(
                f"state dict {i} has other keys than state dict 0: missing {missing[:8]}, extra {extra[:8]}"
            )
    out: dict[str, torch.Tensor] = {}
    for key in keys:
        tensors = [sd[key] for sd in state_dicts]
        ref = tensors[0]
        for i, t in enumerate(tensors[1:], start=1):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"key {key!r}: state dict {i} holds a {type(t).__name__}, not a tensor")
            if tuple(t.shape) != tuple(ref.shape):
                raise ValueError(
                    f"key {key!r}: shape {list(t.shape)} in state dict {i} "
                    f"differs from {list(ref.shape)} in state dict 0"
                )
            if t.dtype != ref.dtype:
                raise ValueError(
                    f"key {key!r}: dtype {t.dtype} in state dict {i} differs from {ref.dtype} in state dict 0"
                )
        if ref.is_floating_point() or ref.is_complex():
            acc_dtype = (
                ref.dtype
                if ref.dtype in (torch.float64, torch.complex128)
                else (torch.complex64 if ref.is_complex() else torch.float32)
            )
            acc = torch.zeros(ref.shape, dtype=acc_dtype)
            for weight, t in zip(w, tensors):
                acc += weight * t.detach().to("cpu", acc_dtype)
            out[key] = acc.to(ref.dtype)
        else:
            for i, t in enumerate(tensors[1:], start=1):
                if not torch.equal(t.detach().cpu(), ref.detach().cpu()):
                    raise ValueError(
                        f"key {key!r}: the {ref.dtype} tensor differs between state dict 0 and state dict {i}; "
                        "integer and bool buffers are not averaged, they must be equal"
                    )
            out[key] = ref.detach().to("cpu").clone()
    return out


__all__ = ["average_state_dicts", "normalised_weights"]
