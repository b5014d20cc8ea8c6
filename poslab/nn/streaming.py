"""StreamingLLM's KV cache: attention sinks plus a rolling window (Xiao et al. 2023).

Xiao, Tian, Chen, Han, Lewis, "Efficient Streaming Language Models with Attention Sinks" (ICLR 2024,
https://arxiv.org/abs/2309.17453). Keeping only the last ``w`` keys (window attention) breaks a
model as soon as the first tokens leave the cache: trained models park surplus attention on the
first tokens ("attention sinks"). StreamingLLM keeps the first ``k`` tokens (4 in the paper) plus
the last ``w`` and decodes forever in ``O(k + w)`` memory.

Positions follow the paper (§3.2): a key's position is its *place in the cache*, not in the text.
The cache hands attention positions ``0 .. size-1`` (sinks first, then the window in order; the new
token last), and keys are stored before ``rotate`` so a rotary scheme re-rotates every key with its
current cache position on every step (the late-rotation path of
:class:`~poslab.nn.attention.MultiHeadAttention`, the one xPos uses). Bias schemes (ALiBi, T5)
see the same cache positions, as in the paper's ALiBi runs.

With ``sinks=0`` the same class is plain window attention with the same positions, the paper's
"window attention" baseline.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from poslab.checks import int_at_least
from poslab.nn.attention import KVCache


class StreamingKVCache(KVCache):
    """First ``sinks`` tokens plus the last ``window`` ones, positions by place in the cache.

    Attention recognises it by the class attribute ``reassigns_positions`` it declares (keys stored
    unrotated, rotated with the positions :meth:`update` returns; queries take the positions of their
    own entries); not rolling, it serves every window (:meth:`KVCache.check_window`).

    Once the cache is full, tokens are written one at a time (decode); a multi-token write that
    would evict raises ``ValueError`` (each of its queries would need a different key set).

    Attributes:
        sinks, window: the two parts (``capacity = sinks + window``).
        length: tokens written so far. ``size``: entries held (``min(length, capacity)``).
        pos: each held entry's position in the *text* (for inspection; attention uses cache places).

    Args:
        batch_size, n_kv_heads, head_dim: cache geometry.
        sinks: first tokens kept forever (``>= 0``; 4 in the paper).
        window: most recent tokens kept (``>= 1``).
        dtype, device: storage.
    """

    reassigns_positions: ClassVar[bool] = True

    def __init__(
        self,
        batch_size: int,
        n_kv_heads: int,
        head_dim: int,
        sinks: int,
        window: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        for label, value, low in (("sinks", sinks, 0), ("window", window, 1)):
            int_at_least(f"streaming cache {label}", value, low)
        super().__init__(batch_size, n_kv_heads, head_dim, sinks + window, dtype, device)
        self.sinks, self.window = sinks, window

    def update(self, k: Tensor, v: Tensor, pos: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Write ``k, v [B, h_kv, T, d_k]`` (unrotated) and return the held entries with cache positions.

        Returns:
            keys and values ``[B, h_kv, n, d_k]`` (sinks, then the window, oldest first, the new
            tokens last) and their cache positions ``arange(n)`` ``[n]``.
        """
        self._check(k, v, pos)
        T, C, S = k.shape[2], self.capacity, self.sinks
        pos = pos.to(self.pos.device)
        if self.size + T <= C:
            end = self.size + T
            self.k[:, :, self.size : end] = k
            self.v[:, :, self.size : end] = v
            self.pos[self.size : end] = pos
        elif T == 1:  # full: evict the oldest window entry (shift the window left by one)
            self.k[:, :, S : C - 1] = self.k[:, :, S + 1 : C].clone()
            self.v[:, :, S : C - 1] = self.v[:, :, S + 1 : C].clone()
            self.pos[S : C - 1] = self.pos[S + 1 : C].clone()
            self.k[:, :, C - 1 :] = k
            self.v[:, :, C - 1 :] = v
            self.pos[C - 1 :] = pos
            end = C
        else:
            raise ValueError(
                f"a streaming cache holding {self.size} of {C} entries takes {T} new tokens only one at a time "
                "once it would evict; feed the stream token by token past the first sinks+window tokens"
            )
        self.size, self.length = end, self.length + T
        return self.k[:, :, :end], self.v[:, :, :end], torch.arange(end, device=self.pos.device)

    def extra_repr(self) -> str:
        B, hkv, _, dk = self.k.shape
        return (
            f"batch={B}, kv_heads={hkv}, sinks={self.sinks}, window={self.window}, head_dim={dk}, length={self.length}"
        )
