"""What :meth:`GPT.make_cache <poslab.nn.model.GPT.make_cache>` builds, by type: one frozen spec per cache kind.

* :class:`DecodeSpec` (the default): the model's own per-layer caches for decoding. A
  preallocated :class:`~poslab.nn.attention.KVCache` of ``capacity`` entries (default: the block
  size) per layer, a rolling ring of ``window`` entries on windowed layers, a compressed
  :class:`~poslab.nn.mla.LatentKVCache` for multi-head latent attention.
* :class:`StreamingSpec`: StreamingLLM caches (:class:`~poslab.nn.streaming.StreamingKVCache`,
  Xiao et al. 2023), the first ``sinks`` tokens plus the last ``window``, positions by place in the
  cache; ``sinks=0`` is plain window attention. Needs a full-attention model.
* :class:`SegmentMemorySpec`: Transformer-XL segment-memory caches
  (:class:`~poslab.nn.attention.SegmentMemoryCache`, rings of ``length`` entries), the KV-cache form
  of :class:`~poslab.nn.memory.SegmentMemory`. Needs standard attention (not MLA).

A spec checks its own values when made; :meth:`build` checks that the model can run that kind of
cache. Both raise one-line errors naming the value and the rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from poslab.checks import int_at_least, positive_int
from poslab.nn.attention import KVCache, SegmentMemoryCache

if TYPE_CHECKING:
    from poslab.nn.model import GPT


@dataclass(frozen=True)
class DecodeSpec:
    """The model's own caches for decoding; ``capacity``: entries per full-attention layer (None = block size)."""

    capacity: int | None = None

    def __post_init__(self) -> None:
        if self.capacity is not None:
            positive_int("capacity", self.capacity, rule="a positive integer (or None = block_size)")

    def build(self, model: GPT, batch_size: int, dtype: torch.dtype, device: torch.device) -> list[KVCache]:
        """One cache per layer: latent for MLA, a rolling ring of ``window`` on windowed layers, else ``capacity``."""
        cfg = model.config
        capacity = self.capacity or cfg.block_size
        if cfg.mla is not None:
            from poslab.nn.mla import LatentKVCache

            rank, rope_dim = cfg.mla["kv_lora_rank"], cfg.mla["qk_rope_head_dim"]
            return [LatentKVCache(batch_size, rank, rope_dim, capacity, dtype, device) for _ in model.blocks]
        caches: list[KVCache] = []
        for block in model.blocks:
            window = block.attn.window  # only the last `window` keys are ever attended: a ring of that size
            size, rolling = (window, True) if window is not None else (capacity, False)
            caches.append(KVCache(batch_size, cfg.kv_heads, cfg.head_dim, size, dtype, device, rolling=rolling))
        return caches


@dataclass(frozen=True)
class StreamingSpec:
    """StreamingLLM caches: the first ``sinks`` tokens (``>= 0``) plus the last ``window`` (``>= 1``)."""

    window: int | None = None
    sinks: int = 0

    def __post_init__(self) -> None:
        if self.window is None:
            raise ValueError(
                f"sinks={self.sinks!r} needs window=W (the StreamingLLM cache keeps the first sinks plus the "
                "last W tokens)"
            )
        int_at_least("streaming cache sinks", self.sinks, 0)
        int_at_least("streaming cache window", self.window, 1)

    def build(self, model: GPT, batch_size: int, dtype: torch.dtype, device: torch.device) -> list[KVCache]:
        """One :class:`~poslab.nn.streaming.StreamingKVCache` per layer; a model with local layers is refused."""
        from poslab.nn.streaming import StreamingKVCache

        cfg = model.config
        local = {
            "mla": cfg.mla,
            "layer_pattern": cfg.layer_pattern,
            "attention.window": cfg.attention.window,
            "attention.chunk": cfg.attention.chunk,
        }
        reason = next((name for name, value in local.items() if value is not None), None)
        if reason is not None:
            raise ValueError(
                f"a streaming cache (window={self.window}) needs a full-attention model; this one sets {reason}"
            )
        assert self.window is not None  # __post_init__
        return [
            StreamingKVCache(batch_size, cfg.kv_heads, cfg.head_dim, self.sinks, self.window, dtype, device)
            for _ in model.blocks
        ]


@dataclass(frozen=True)
class SegmentMemorySpec:
    """Transformer-XL segment-memory caches: each write attends the previous ``length`` tokens plus itself."""

    length: int

    def __post_init__(self) -> None:
        positive_int("memory (the segment memory's length M)", self.length)

    def build(self, model: GPT, batch_size: int, dtype: torch.dtype, device: torch.device) -> list[KVCache]:
        """One :class:`~poslab.nn.attention.SegmentMemoryCache` ring of ``length`` per layer; MLA is refused."""
        cfg = model.config
        if cfg.mla is not None:
            raise ValueError(
                f"a segment-memory cache (length={self.length}) needs standard attention; this one sets mla"
            )
        return [
            SegmentMemoryCache(batch_size, cfg.kv_heads, cfg.head_dim, self.length, dtype, device) for _ in model.blocks
        ]


#: the cache kinds :meth:`GPT.make_cache <poslab.nn.model.GPT.make_cache>` takes
CacheSpec = DecodeSpec | StreamingSpec | SegmentMemorySpec
CACHE_SPECS: tuple[type, ...] = (DecodeSpec, StreamingSpec, SegmentMemorySpec)
