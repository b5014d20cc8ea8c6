"""T5 relative position bias: a learned scalar per head and per log-spaced distance bucket.

Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a Unified Text-to-Text
Transformer" (https://arxiv.org/abs/1910.10683). Distances below ``num_buckets/2`` (of each half in
the bidirectional case) get their own bucket; larger ones share log-spaced buckets up to
``max_distance``, beyond which they all share the last bucket.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from poslab.nn.positions import register
from poslab.nn.positions.base import PositionScheme, ScoreMod, check_init_std, check_positive, view


def relative_position_bucket(
    relative_position: Tensor, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128
) -> Tensor:
    """Bucket index of ``relative_position = key_pos - query_pos`` (same convention as T5/Mesh TF).

    Args:
        relative_position: int tensor of any shape.
        bidirectional: split the buckets by sign (encoder); else future keys all map to bucket 0.
        num_buckets: total buckets.
        max_distance: distances at or beyond it share the last bucket.

    Returns:
        int64 tensor of the same shape with values in ``[0, num_buckets)``.
    """
    buckets = torch.zeros_like(relative_position, dtype=torch.long)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0).to(torch.long) * num_buckets
        distance = relative_position.abs()
    else:
        distance = -torch.clamp(relative_position, max=0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    # log-spaced buckets from max_exact to max_distance (log(0) for small distances is discarded below)
    large = max_exact + (
        torch.log(distance.float() / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).to(torch.long)
    large = torch.clamp(large, max=num_buckets - 1)
    return buckets + torch.where(is_small, distance.to(torch.long), large)


@dataclass
class T5Config:
    """Config of :class:`T5Bias`.

    Attributes:
        n_heads: number of query heads (filled in by the model).
        num_buckets: bucket count (32 in T5).
        max_distance: distance sharing the last bucket (128 in T5).
        bidirectional: split buckets by sign (T5's encoder) or not (its decoder). ``None`` (default)
            follows the attention layer: ``not causal`` (a causal layer never sees future keys, so
            splitting would spend half the buckets on distances it never meets). ``True`` in a causal
            layer is refused. A bare scheme used outside a layer reads ``None`` as ``True``.
        init_std: normal initialisation of the bias table.
    """

    n_heads: int = 8
    num_buckets: int = 32
    max_distance: int = 128
    bidirectional: bool | None = None
    init_std: float = 0.02

    def __post_init__(self) -> None:
        check_positive("n_heads", self.n_heads)
        check_positive("num_buckets", self.num_buckets)
        check_positive("max_distance", self.max_distance)
        if self.num_buckets < 4:
            raise ValueError(f"num_buckets must be >= 4, got {self.num_buckets}")
        check_init_std(self.init_std)


@register
class T5Bias(PositionScheme):
    """T5's bucketed relative bias (Raffel et al. 2020, https://arxiv.org/abs/1910.10683).

    One table shared by every layer, as in T5 (only its first layer owns the table).
    """

    name = "t5"
    config_class = T5Config
    relative = True
    paper = "Raffel et al. 2020, https://arxiv.org/abs/1910.10683"

    def __init__(self, config: T5Config) -> None:
        super().__init__(config)
        self.relative_attention_bias = nn.Embedding(config.num_buckets, config.n_heads)
        self.relative_attention_bias._init_std = config.init_std  # kept by a model's initialisation
        nn.init.normal_(self.relative_attention_bias.weight, std=config.init_std)

    @property
    def bidirectional(self) -> bool:
        """Whether buckets are split by sign (``config.bidirectional``, ``None`` read as ``True``)."""
        return self.config.bidirectional is not False

    def check_layer(self, n_heads: int, head_dim: int, causal: bool) -> None:
        """Geometry as every scheme, then ``bidirectional``: ``None`` follows the layer, ``True`` in a causal layer is
        refused."""
        super().check_layer(n_heads, head_dim, causal)
        if self.config.bidirectional is None:
            self.config.bidirectional = not causal
        elif self.config.bidirectional and causal:
            raise ValueError(
                "t5 bidirectional=True in a causal attention layer would spend half of its buckets on future keys "
                "the layer never sees; use bidirectional=False (or leave it None to follow the layer)"
            )

    def buckets(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Bucket of every (query, key) pair, ``[Tq, Tk]``."""
        c = self.config
        return relative_position_bucket(
            k_pos[None, :] - q_pos[:, None], self.bidirectional, c.num_buckets, c.max_distance
        )

    def describe(self, T: int, n_heads: int | None = None, causal: bool = True) -> list[dict[str, Any]]:
        pos = torch.arange(T)
        return super().describe(T, n_heads, causal) + [
            view(
                "T5 bucket of each (query, key)",
                self.buckets(pos, pos).float(),
                "query",
                "key",
                False,
                "nearby offsets get their own bucket, far ones share log-spaced buckets",
            )
        ]

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float) -> Tensor:
        buckets = self.buckets(q_pos, k_pos)  # [Tq, Tk]
        # index the [h, num_buckets] transpose along its bucket axis: the result is laid out
        # [h, Tq, Tk] already, and the backward is one index_add into the table (an embedding
        # lookup's backward sorts all Tq*Tk indices first; benchmarks/README.md has the effect on T5)
        table = self.relative_attention_bias.weight.t()  # [h, num_buckets]
        values = torch.index_select(table, 1, buckets.reshape(-1)).view(-1, *buckets.shape)  # [h, Tq, Tk]
        return values[None].to(torch.float32)  # [1, h, Tq, Tk]

    def score_mod(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float) -> ScoreMod:
        c, bidirectional = self.config, self.bidirectional
        table = self.relative_attention_bias.weight.to(torch.float32)  # [num_buckets, h]

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            bucket = relative_position_bucket(
                k_pos[kv_idx] - q_pos[q_idx], bidirectional, c.num_buckets, c.max_distance
            )
            return score + table[bucket, h]

        return mod
