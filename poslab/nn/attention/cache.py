"""What a layer attends besides its own tokens: the preallocated key/value cache (:class:`KVCache`:
plain or rolling), its segment-memory form (:class:`SegmentMemoryCache`) and Transformer-XL's
remembered inputs of one segment (:class:`SegmentInputs`)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch
from torch import Tensor, nn

from poslab.checks import is_int, positive_int


@dataclasses.dataclass(frozen=True)
class SegmentInputs:
    """Transformer-XL segment memory (Dai et al. 2019) as a layer's ``cache`` for one forward.

    The layer computes keys and values of ``inputs`` with its current weights and places them before
    the segment's own (``k_pos = cat(pos, segment positions)``); the causal mask by positions does the
    rest. Nothing is written back: :class:`~poslab.nn.memory.SegmentMemory` keeps the inputs between
    segments, :class:`SegmentMemoryCache` is the cached form at evaluation.

    Attributes:
        inputs: the previous segment's inputs to this layer ``[B, M, d]`` (normed like the layer's
            input, detached by the caller).
        pos: their positions ``[M]`` (integers, before the segment's).
    """

    inputs: Tensor
    pos: Tensor

    def check(self, x: Tensor) -> None:
        """``ValueError`` unless ``inputs [B, M, d]`` and ``pos [M]`` fit the layer input ``x [B, T, d]``."""
        memory, memory_pos = self.inputs, self.pos
        B, _, d = x.shape
        if not isinstance(memory, Tensor) or memory.dim() != 3 or memory.shape[0] != B or memory.shape[2] != d:
            raise ValueError(
                f"memory must be [{B}, M, {d}] (the batch and width of x), got {list(getattr(memory, 'shape', []))}"
            )
        if memory.dtype != x.dtype or memory.device != x.device:
            raise ValueError(f"memory is {memory.dtype} on {memory.device} but x is {x.dtype} on {x.device}")
        if (
            not isinstance(memory_pos, Tensor)
            or memory_pos.shape != (memory.shape[1],)
            or memory_pos.is_floating_point()
        ):
            raise ValueError(
                f"memory_pos must be an integer tensor of shape [{memory.shape[1]}] (one position per memory "
                f"entry), got {getattr(memory_pos, 'dtype', None)} {list(getattr(memory_pos, 'shape', []))}"
            )


class KVCache(nn.Module):
    """Preallocated key/value cache indexed by explicit positions (gpt-fast style).

    Stores ``n_kv_heads`` heads (GQA-aware) and keys *after* ``rotate`` (before it for a scheme with
    ``rotate_needs_all_keys``, xPos, which attention then rotates on every call), together with each
    entry's position, so bias schemes (ALiBi, T5, ...) and rotary schemes see the true positions of
    cached keys whatever order they are stored in.

    Two layouts:

    * ``rolling=False``: appends up to ``capacity`` tokens; one more raises ``ValueError``.
    * ``rolling=True`` (sliding-window models): a ring buffer keeping only the most recent
      ``capacity`` tokens, so decoding runs forever in ``O(capacity)`` memory. Attention checks that
      its window fits (:meth:`check_window`: ``window <= capacity``): older keys are out of every
      query's reach.

    Transformer-XL's segment memory is its own type, :class:`SegmentMemoryCache`; StreamingLLM's
    sinks-plus-window cache is :class:`~poslab.nn.streaming.StreamingKVCache`.

    The protocol attention relies on: :meth:`update`, :attr:`length`, :meth:`check_window` and
    :attr:`reassigns_positions`.

    Attributes:
        length: tokens written so far (the default position of the next token).
        size: entries currently held (``min(length, capacity)`` for a rolling cache).
        rolling: the layout (see Args).
        reassigns_positions: a class attribute, False here: the cache stores keys after ``rotate``
            at their own positions. A subclass that gives entries positions by their place in the
            cache (:class:`~poslab.nn.streaming.StreamingKVCache`) sets it True; attention then
            stores keys unrotated and rotates them with the positions :meth:`update` returns.

    Args:
        batch_size, n_kv_heads, head_dim: cache geometry.
        capacity: maximum number of tokens held.
        dtype, device: storage (must match the keys written).
        rolling: ring buffer that forgets the oldest tokens instead of overflowing.
    """

    reassigns_positions: ClassVar[bool] = False

    def __init__(
        self,
        batch_size: int,
        n_kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        *,
        rolling: bool = False,
    ) -> None:
        super().__init__()
        for label, value in (
            ("batch_size", batch_size),
            ("n_kv_heads", n_kv_heads),
            ("head_dim", head_dim),
            ("capacity", capacity),
        ):
            if not is_int(value):
                raise TypeError(f"KV cache {label} must be an integer, got {value!r}")
            if value <= 0:
                raise ValueError(f"KV cache {label} must be > 0, got {value}")
        shape = (batch_size, n_kv_heads, capacity, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("pos", torch.zeros(capacity, dtype=torch.long, device=device), persistent=False)
        self.capacity = capacity
        self.rolling = rolling
        self.length = 0
        self.size = 0

    def reset(self) -> None:
        """Forget every cached token."""
        self.length = 0
        self.size = 0

    def _check(self, k: Tensor, v: Tensor, pos: Tensor) -> None:
        B, hkv, _, dk = self.k.shape
        if k.dim() != 4 or k.shape[0] != B or k.shape[1] != hkv or k.shape[3] != dk:
            raise ValueError(f"keys of shape {list(k.shape)} do not fit this KV cache: expected [{B}, {hkv}, T, {dk}]")
        if v.shape != k.shape:
            raise ValueError(f"values {list(v.shape)} and keys {list(k.shape)} must have the same shape")
        if k.dtype != self.k.dtype or v.dtype != self.k.dtype:
            raise TypeError(
                f"KV cache holds {self.k.dtype} but keys/values are {k.dtype}/{v.dtype}; "
                f"make the cache with dtype={k.dtype}"
            )
        if k.device != self.k.device or v.device != self.k.device:
            raise ValueError(f"KV cache is on {self.k.device} but keys/values are on {k.device}/{v.device}")
        if pos.shape != (k.shape[2],):
            raise ValueError(f"pos must have shape [{k.shape[2]}] (one position per new key), got {list(pos.shape)}")

    def check_window(self, window: int | None) -> None:
        """``ValueError`` unless attention with this ``window`` (``None``: unlimited) only needs keys the
        cache keeps: a rolling ring of ``capacity`` entries serves a window of at most ``capacity``."""
        if self.rolling and (window is None or window > self.capacity):
            raise ValueError(
                f"a rolling KV cache of capacity {self.capacity} keeps only the last {self.capacity} tokens, "
                f"but this attention has window={window}; use window <= {self.capacity}, a non-rolling cache, "
                "or a segment-memory cache (SegmentMemoryCache, GPT.make_cache(B, SegmentMemorySpec(M)))"
            )

    def update(self, k: Tensor, v: Tensor, pos: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Write ``k, v [B, h_kv, T, d_k]`` at positions ``[T]``.

        Returns:
            Every key, value and position the new queries may need: ``[B, h_kv, Tk, d_k]`` twice and
            ``[Tk]``. For a rolling cache that is full, the entries come in ring order (attention masks
            by position, so order does not matter), and a multi-token write returns the previous
            ``capacity`` entries followed by all ``T`` new ones.
        """
        self._check(k, v, pos)
        pos = pos.to(self.pos.device)
        if not self.rolling or self.size + k.shape[2] <= self.capacity:
            return self._append(k, v, pos)
        if k.shape[2] == 1:  # decode: overwrite the oldest entry, then read the whole ring
            return self._overwrite_oldest(k, v, pos)
        return self._write_ring(k, v, pos)

    def _append(self, k: Tensor, v: Tensor, pos: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Write ``T`` tokens after the held ones (``ValueError`` past ``capacity``); return all held."""
        T = k.shape[2]
        if self.size + T > self.capacity:
            raise ValueError(
                f"KV cache overflow: {self.size} cached + {T} new tokens > capacity {self.capacity}; "
                "make a larger cache (or a rolling one for a sliding-window model)"
            )
        end = self.size + T
        self.k[:, :, self.size : end] = k
        self.v[:, :, self.size : end] = v
        self.pos[self.size : end] = pos
        self.size, self.length = end, self.length + T
        return self.k[:, :, :end], self.v[:, :, :end], self.pos[:end]

    def _overwrite_oldest(self, k: Tensor, v: Tensor, pos: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One token into a full ring (slot of the n-th token written: ``n % capacity``); return the ring."""
        slot = self.length % self.capacity
        self.k[:, :, slot : slot + 1] = k
        self.v[:, :, slot : slot + 1] = v
        self.pos[slot : slot + 1] = pos
        self.size, self.length = self.capacity, self.length + 1
        return self.k, self.v, self.pos

    def _write_ring(self, k: Tensor, v: Tensor, pos: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``T`` tokens into a ring that overflows: the new queries need the old entries too, so return
        the held entries followed by the new ones; keep the last ``capacity``."""
        T, C = k.shape[2], self.capacity
        k_all = torch.cat((self.k[:, :, : self.size], k), dim=2)  # [B, hkv, size+T, dk]
        v_all = torch.cat((self.v[:, :, : self.size], v), dim=2)  # [B, hkv, size+T, dk]
        pos_all = torch.cat((self.pos[: self.size], pos))  # [size+T]
        keep = min(T, C)
        slots = (torch.arange(self.length + T - keep, self.length + T, device=self.pos.device)) % C  # [keep]
        self.k[:, :, slots] = k[:, :, T - keep :]
        self.v[:, :, slots] = v[:, :, T - keep :]
        self.pos[slots] = pos[T - keep :]
        self.size, self.length = C, self.length + T
        return k_all, v_all, pos_all

    def extra_repr(self) -> str:
        B, hkv, C, dk = self.k.shape
        return f"batch={B}, kv_heads={hkv}, capacity={C}, head_dim={dk}, rolling={self.rolling}, length={self.length}"


class SegmentMemoryCache(KVCache):
    """Transformer-XL's segment memory at evaluation (Dai et al. 2019): a ring of the last ``mem_len``
    keys and values that every write attends besides itself.

    Every write of ``T`` tokens attends the previous ``mem_len`` tokens plus itself (causally), for
    any ``T`` (a single decoded token too) and whatever the attention's window: the ring is the
    context, so :meth:`check_window` accepts every window. It is the KV-cache form of
    :class:`~poslab.nn.memory.SegmentMemory` with the same ``mem_len`` (``GPT.make_cache(B, SegmentMemorySpec(M))``).

    Args:
        batch_size, n_kv_heads, head_dim: cache geometry.
        mem_len: ``M``, tokens remembered (the ring's ``capacity``).
        dtype, device: storage.
    """

    def __init__(
        self,
        batch_size: int,
        n_kv_heads: int,
        head_dim: int,
        mem_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        positive_int("mem_len (the segment memory's length M)", mem_len)
        super().__init__(batch_size, n_kv_heads, head_dim, mem_len, dtype, device, rolling=True)

    @property
    def mem_len(self) -> int:
        """``M``, the tokens remembered (the ring's capacity)."""
        return self.capacity

    def check_window(self, window: int | None) -> None:
        """Accept every window: each write attends the remembered tokens plus itself by definition."""

    def update(self, k: Tensor, v: Tensor, pos: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Write ``k, v [B, h_kv, T, d_k]`` at positions ``[T]``; return the remembered entries (ring
        order once full) followed by the ``T`` new ones, also for ``T = 1``."""
        self._check(k, v, pos)
        pos = pos.to(self.pos.device)
        if self.size + k.shape[2] <= self.capacity:
            return self._append(k, v, pos)
        return self._write_ring(k, v, pos)

    def extra_repr(self) -> str:
        B, hkv, C, dk = self.k.shape
        return f"batch={B}, kv_heads={hkv}, mem_len={C}, head_dim={dk}, length={self.length}"
