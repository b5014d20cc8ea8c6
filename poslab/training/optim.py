"""nanoGPT's optimizer and learning-rate schedule: AdamW with weight-decay groups, warmup + cosine."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from poslab.training.config import TrainConfig


def lr_at(step: int, cfg: TrainConfig) -> float:
    """nanoGPT's schedule: linear warmup over ``warmup_steps``, cosine to ``min_lr`` at ``decay_steps``.

    With ``cooldown_steps > 0``, warmup-stable-decay instead (Hu et al. 2024, MiniCPM): ``lr`` held
    after the warmup, then a linear decay to ``min_lr`` over the last ``cooldown_steps`` before
    ``decay_steps``.

    Args:
        step: optimizer steps already taken (0 for the first update).
    """
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / (cfg.warmup_steps + 1)
    if step > cfg.decay_steps:
        return cfg.min_lr
    if cfg.cooldown_steps:
        left = cfg.decay_steps - step  # steps until min_lr
        return cfg.lr if left >= cfg.cooldown_steps else cfg.min_lr + (cfg.lr - cfg.min_lr) * left / cfg.cooldown_steps
    span = max(cfg.decay_steps - cfg.warmup_steps, 1)
    ratio = (step - cfg.warmup_steps) / span
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return cfg.min_lr + coeff * (cfg.lr - cfg.min_lr)


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """The optimizer ``cfg.optimizer`` names, with nanoGPT's weight-decay groups.

    ``adamw``: AdamW with weight decay on every parameter with 2+ dims (matmul weights and
    embedding tables), none on biases, norm gains and other 1-D or scalar parameters. Uses the
    fused kernel where torch has one for the parameters' device (CPU included): same fp32 math,
    one launch instead of one per tensor.

    ``muon``: see :func:`make_muon`.
    """
    if cfg.optimizer == "muon":
        return make_muon(model, cfg)
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return _adamw(groups, cfg)


def _adamw(groups: list[dict], cfg: TrainConfig) -> torch.optim.AdamW:
    kwargs: dict[str, Any] = {"lr": cfg.lr, "betas": (cfg.beta1, cfg.beta2)}
    try:
        return torch.optim.AdamW(groups, fused=True, **kwargs)
    except (RuntimeError, ValueError):  # a device without a fused kernel
        return torch.optim.AdamW(groups, **kwargs)


# ---- Muon (TrainConfig.optimizer = "muon"): make_muon + ChainedOptimizer; self-contained for optim.py
def make_muon(model: nn.Module, cfg: TrainConfig) -> ChainedOptimizer:
    """Muon (Jordan et al. 2024, ``torch.optim.Muon``) for the blocks' 2-D weights, AdamW for the rest.

    Muon orthogonalises the momentum of each hidden matrix (Newton-Schulz) and is meant for those
    only; the token embedding (tied to the LM head), other embeddings and 1-D parameters keep
    AdamW with nanoGPT's groups. ``adjust_lr_fn="match_rms_adamw"`` (Moonshot's scaling, Liu et al.
    2025) gives Muon's update AdamW's RMS, so one ``lr`` and schedule drive both. Muon keeps its
    default Nesterov momentum 0.95 and takes ``weight_decay``.
    """
    params = {id(p): p for p in model.parameters() if p.requires_grad}
    blocks = getattr(model, "blocks", None)
    matrices = [p for p in (blocks.parameters() if blocks is not None else []) if p.requires_grad and p.dim() == 2]
    taken = {id(p) for p in matrices}
    rest = [p for p in params.values() if id(p) not in taken]
    adamw = _adamw(
        [
            {"params": [p for p in rest if p.dim() >= 2], "weight_decay": cfg.weight_decay},
            {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0},
        ],
        cfg,
    )
    if not matrices:
        return ChainedOptimizer([adamw])
    muon = torch.optim.Muon(matrices, lr=cfg.lr, weight_decay=cfg.weight_decay, adjust_lr_fn="match_rms_adamw")
    return ChainedOptimizer([muon, adamw])


class ChainedOptimizer(torch.optim.Optimizer):
    """Several optimizers over disjoint parameters behind one optimizer's interface.

    ``param_groups`` is the concatenation of theirs (the same dicts: setting ``group["lr"]`` reaches
    the owner), ``step``/``zero_grad`` call each, and ``state_dict`` is one standard state dict with
    parameter indices numbered across the parts in order, so checkpoints and resume treat it as one
    optimizer.
    """

    def __init__(self, optimizers: list[torch.optim.Optimizer]) -> None:  # no super().__init__: the parts own the state
        self.optimizers = optimizers
        self.param_groups = [g for opt in optimizers for g in opt.param_groups]
        self.defaults = {}
        self.state = {}

    @torch.no_grad()
    def step(self, closure: Callable | None = None) -> None:
        for opt in self.optimizers:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        state, groups, offset = {}, [], 0
        for opt in self.optimizers:
            sd = opt.state_dict()
            n = sum(len(g["params"]) for g in sd["param_groups"])
            state.update({offset + int(i): v for i, v in sd["state"].items()})
            groups.extend({**g, "params": [offset + i for i in g["params"]]} for g in sd["param_groups"])
            offset += n
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        groups, state, offset = list(state_dict["param_groups"]), state_dict["state"], 0
        for opt in self.optimizers:
            mine = groups[: len(opt.param_groups)]
            groups = groups[len(opt.param_groups) :]
            n = sum(len(g["params"]) for g in mine)
            opt.load_state_dict(
                {
                    "state": {int(i) - offset: v for i, v in state.items() if offset <= int(i) < offset + n},
                    "param_groups": [{**g, "params": [i - offset for i in g["params"]]} for g in mine],
                }
            )
            offset += n
        self.param_groups = [g for opt in self.optimizers for g in opt.param_groups]


__all__ = ["ChainedOptimizer", "lr_at", "make_muon", "make_optimizer"]
