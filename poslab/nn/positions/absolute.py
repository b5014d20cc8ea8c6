"""Absolute position embeddings added to the token embeddings.

* ``learned``: a trainable table, as in GPT-2 (Radford et al. 2019,
  https://cdn.openai.com/better-language-models/language_models_are_unsupervised_multitask_learners.pdf).
* ``sinusoidal``: the fixed sin/cos code of Vaswani et al. 2017, "Attention Is All You Need"
  (https://arxiv.org/abs/1706.03762): ``PE[p, 2i] = sin(p / base^(2i/d))``,
  ``PE[p, 2i+1] = cos(p / base^(2i/d))``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from poslab.nn.positions import register
from poslab.nn.positions.base import (
    PositionScheme,
    check_init_std,
    check_positions,
    check_positive,
    check_wavelength_base,
)

#: positions the sinusoidal table may reach: fp32 represents every integer exactly below 2^24
MAX_SINUSOID_POSITIONS = 2**24


def sinusoid_table(pos: Tensor, dim: int, base: float = 10000.0) -> Tensor:
    """Vaswani sin/cos code for arbitrary (possibly negative) positions, computed in fp32.

    Args:
        pos: positions ``[N]`` (any integer or float dtype).
        dim: code width (even).
        base: wavelength base.

    Returns:
        ``[N, dim]`` float32 with ``sin`` at even and ``cos`` at odd columns.
    """
    if dim % 2:
        raise ValueError(f"sinusoidal dim must be even, got {dim}")
    div_term = torch.exp(
        torch.arange(0, dim, 2, dtype=torch.float32, device=pos.device) * (-math.log(base) / dim)
    )  # [dim/2]
    angles = pos.to(torch.float32)[:, None] * div_term[None, :]  # [N, dim/2]
    table = torch.stack((angles.sin(), angles.cos()), dim=-1)  # [N, dim/2, 2]
    return table.flatten(-2)  # [N, dim]: sin, cos, sin, cos, ...


@dataclass
class LearnedConfig:
    """Config of the learned absolute table.

    Attributes:
        n_embd: embedding width (filled in by the model).
        max_len: number of rows; positions must lie in ``[0, max_len)`` (model: ``block_size``).
        init_std: standard deviation of the normal initialisation.
    """

    n_embd: int = 128
    max_len: int = 128
    init_std: float = 0.02

    def __post_init__(self) -> None:
        check_positive("n_embd", self.n_embd)
        check_positive("max_len", self.max_len)
        check_init_std(self.init_std)


@register
class LearnedPositions(PositionScheme):
    """GPT-2's learned absolute position table (Radford et al. 2019).

    A position past the table is an error, never a silent clamp.
    """

    name = "learned"
    config_class = LearnedConfig
    paper = "Radford et al. 2019 (GPT-2); Devlin et al. 2019, https://arxiv.org/abs/1810.04805"

    def __init__(self, config: LearnedConfig) -> None:
        super().__init__(config)
        self.table = nn.Embedding(config.max_len, config.n_embd)
        self.table._init_std = config.init_std  # the std a model's weight initialisation keeps (GPT._init_weights)
        nn.init.normal_(self.table.weight, std=config.init_std)

    @property
    def max_positions(self) -> int:
        return self.config.max_len

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        check_positions(pos, x.shape[1])
        if (
            pos.numel()
            and not torch.compiler.is_compiling()
            and (int(pos.max()) >= self.config.max_len or int(pos.min()) < 0)
        ):
            bad = int(pos.max()) if int(pos.max()) >= self.config.max_len else int(pos.min())
            raise ValueError(
                f"position {bad} is outside the learned position table: it has max_len="
                f"{self.config.max_len} rows, so positions must lie in [0, {self.config.max_len})"
            )
        return x + self.table(pos).to(x.dtype)  # [B, T, d] + [T, d]


@dataclass
class SinusoidalConfig:
    """Config of the fixed sinusoidal code.

    Attributes:
        n_embd: code width (even; filled in by the model).
        base: wavelength base (10000 in the paper).
        max_len: rows precomputed at construction; the cache grows on demand.
    """

    n_embd: int = 128
    base: float = 10000.0
    max_len: int = 128

    def __post_init__(self) -> None:
        check_positive("n_embd", self.n_embd)
        if self.n_embd % 2:
            raise ValueError(f"sinusoidal n_embd must be even, got {self.n_embd}")
        check_wavelength_base("base", self.base, self.n_embd)
        check_positive("max_len", self.max_len)


@register
class SinusoidalPositions(PositionScheme):
    """Vaswani et al. 2017 sinusoidal absolute code with a precomputed fp32 cache that extends on demand."""

    name = "sinusoidal"
    config_class = SinusoidalConfig
    fp32_buffers = ("cache",)
    paper = "Vaswani et al. 2017, https://arxiv.org/abs/1706.03762"

    def __init__(self, config: SinusoidalConfig) -> None:
        super().__init__(config)
        self.register_buffer("cache", self._table(config.max_len), persistent=False)

    def _table(self, n: int, device: torch.device | None = None) -> Tensor:
        return sinusoid_table(torch.arange(n, device=device), self.config.n_embd, self.config.base)

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        check_positions(pos, x.shape[1])
        if pos.numel() and int(pos.min()) < 0:
            raise ValueError(f"sinusoidal positions must be >= 0, got {int(pos.min())}")
        needed = int(pos.max()) + 1 if pos.numel() else 0
        if needed > MAX_SINUSOID_POSITIONS:
            raise ValueError(
                f"sinusoidal positions must be < 2^24 = {MAX_SINUSOID_POSITIONS:,} (its table holds one row "
                f"per position, and fp32 holds every integer exactly only below 2^24), got {needed - 1}"
            )
        if needed > self.cache.shape[0]:
            # grow geometrically so a long decode does not rebuild the table every step
            self.cache = self._table(max(needed, 2 * self.cache.shape[0]), self.cache.device)
        return x + self.cache[pos].to(x.dtype)  # [B, T, d] + [T, d]
