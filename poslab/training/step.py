"""A training step (layer 2): forward, loss, backward, gradient clipping and the optimizer's update.

The one owner of "a training step": the training loop (:mod:`poslab.training.loop`), the position
probes (:func:`poslab.analysis.probes.train_probe`) and the lab's experiments that train their own
small models all step through :func:`train_step`. What differs between them (the model, the loss,
the optimizer, the schedule) is handed in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from poslab.training.precision import autocast


@dataclass(frozen=True)
class StepSettings:
    """How a step computes its update.

    Attributes:
        grad_clip: clip the gradient to this global norm (> 0); 0: measure the norm without clipping;
            ``None``: neither (no norm measured).
        grad_accum: micro-batches per step; each one's loss is divided by it before its backward.
        dtype: ``"fp32"`` or ``"bf16"`` (autocast around each forward and loss).
        device_type: the autocast device (``"cpu"``, ``"cuda"``).
        finite_only: apply the update only when the step's loss and gradient norm are finite (else the
            gradients are dropped and nothing changes); ``False``: always apply it.
    """

    grad_clip: float | None = 0.0
    grad_accum: int = 1
    dtype: str = "fp32"
    device_type: str = "cpu"
    finite_only: bool = False


@dataclass(frozen=True)
class StepResult:
    """The step's loss (the mean over its micro-batches), gradient norm (before clipping; ``None`` when not
    measured) and whether the update was applied."""

    loss: float
    grad_norm: float | None
    applied: bool


def train_step(
    optimizer: torch.optim.Optimizer,
    params: Sequence[Tensor],
    loss_of: Callable[[int], Tensor],
    settings: StepSettings,
    *,
    lr: float | None = None,
    reduce: Callable[[float], float] | None = None,
) -> StepResult:
    """One optimizer step.

    For each micro-batch ``i`` in ``range(settings.grad_accum)``: ``loss_of(i)`` (the forward and the
    scalar loss, under autocast), then the backward of ``loss / grad_accum``. Then the gradient norm
    (clipped to ``grad_clip``), the update and cleared gradients.

    Args:
        optimizer: the optimizer of ``params``.
        params: the trained parameters (those the norm and the clipping cover).
        loss_of: the loss of micro-batch ``i`` (draws its batch, runs the model).
        settings: see :class:`StepSettings`.
        lr: set as every parameter group's learning rate first (``None``: left as it is).
        reduce: turns the step's mean loss into the reported one (the mean over processes under torchrun).

    Returns:
        The :class:`StepResult`.
    """
    if lr is not None:
        for group in optimizer.param_groups:
            group["lr"] = lr
    loss_sum = 0.0
    for micro in range(settings.grad_accum):
        with autocast(settings.dtype, settings.device_type):
            loss = loss_of(micro)
        (loss / settings.grad_accum).backward()
        loss_sum += loss.item()
    step_loss = loss_sum / settings.grad_accum
    if reduce is not None:
        step_loss = reduce(step_loss)
    grad_norm = gradient_norm(params, settings.grad_clip)
    applied = not settings.finite_only or (math.isfinite(step_loss) and math.isfinite(grad_norm or 0.0))
    if applied:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return StepResult(step_loss, grad_norm, applied)


def gradient_norm(params: Sequence[Tensor], grad_clip: float | None) -> float | None:
    """The global gradient norm of ``params``, clipped to ``grad_clip`` when it is > 0 (``None``: not measured)."""
    if grad_clip is None:
        return None
    if grad_clip > 0:
        return float(torch.nn.utils.clip_grad_norm_(params, grad_clip))
    return float(torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None]))


__all__ = ["StepResult", "StepSettings", "gradient_norm", "train_step"]
