"""Multi-head attention with fused qkv, GQA/MQA, KV cache, sliding window and three backends.

The head split and merge follow the lessons exactly::

    x [B, T, d] --qkv--> q [B, T, h*d_k] --view--> [B, T, h, d_k] --transpose--> [B, h, T, d_k]
    softmax(q k^T / sqrt(d_k) + bias) v                                        -> [B, h, T, d_k]
    --transpose--> [B, T, h, d_k] --reshape--> [B, T, d] --proj--> [B, T, d]

A position scheme is injected; attention calls its hooks at fixed places with explicit positions
(``rotate`` on q/k, ``score_bias`` on the logits), so offsets, KV-cache decoding and extrapolation
share one code path.

Backends:
    * ``sdpa`` (default): ``F.scaled_dot_product_attention``; the ``is_causal`` fast path when there
      is no bias, mask or cache, a float mask otherwise.
    * ``eager``: explicit ``softmax(q k^T)`` computed in fp32 even under autocast; returns weights.
    * ``flex``: FlexAttention with the scheme's ``score_mod`` and a positional ``mask_mod``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from poslab.positions.base import PositionScheme

BACKENDS = ("sdpa", "eager", "flex")


class SplitHeads(nn.Module):
    """``[B, T, n*d_k] -> [B, n, T, d_k]`` (a module so forward hooks can watch the shapes)."""

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        return x.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)  # [B, T, n, d_k] -> [B, n, T, d_k]


class MergeHeads(nn.Module):
    """``[B, h, T, d_k] -> [B, T, h*d_k]``."""

    def forward(self, x: Tensor) -> Tensor:
        B, h, T, dk = x.shape
        return x.transpose(1, 2).reshape(B, T, h * dk)  # [B, h, T, d_k] -> [B, T, h, d_k] -> [B, T, d]


class KVCache(nn.Module):
    """Preallocated key/value cache indexed by explicit positions (gpt-fast style).

    Stores ``n_kv_heads`` heads (GQA-aware). Keys are stored after ``rotate``.

    Args:
        batch_size, n_kv_heads, head_dim: cache geometry.
        capacity: maximum number of cached tokens.
        dtype, device: storage.
    """

    def __init__(
        self,
        batch_size: int,
        n_kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if capacity <= 0:
            raise ValueError(f"KV cache capacity must be > 0, got {capacity}")
        shape = (batch_size, n_kv_heads, capacity, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("pos", torch.zeros(capacity, dtype=torch.long, device=device), persistent=False)
        self.capacity = capacity
        self.length = 0

    def reset(self) -> None:
        """Forget every cached token."""
        self.length = 0

    def update(self, k: Tensor, v: Tensor, pos: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Append ``k, v [B, h_kv, T, d_k]`` at positions ``[T]``; return every cached k, v, pos."""
        T = k.shape[2]
        if self.length + T > self.capacity:
            raise ValueError(
                f"KV cache overflow: {self.length} cached + {T} new tokens > capacity {self.capacity}"
            )
        end = self.length + T
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        self.pos[self.length : end] = pos
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end], self.pos[:end]


class MultiHeadAttention(nn.Module):
    """Multi-head attention (Vaswani et al. 2017) with GQA (Ainslie et al. 2023) and position hooks.

    Args:
        d_model: model width ``d``.
        n_heads: query heads ``h``; ``d_k = d_model // n_heads``.
        n_kv_heads: key/value heads (``None`` = ``n_heads``; 1 = MQA); must divide ``n_heads``.
        causal: mask future keys (by position).
        dropout: attention-weight dropout (training only).
        bias: biases on the qkv and output projections.
        position: the position scheme whose ``rotate`` / ``score_bias`` hooks run here (optional;
            a model sharing one scheme across layers passes it to :meth:`forward` instead).
        backend: ``"sdpa"``, ``"eager"`` or ``"flex"``.
        window: sliding window ``W``: query ``i`` sees keys ``j`` with ``i - W < j <= i``.
        scale: softmax scale (default ``1/sqrt(d_k)``).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        *,
        causal: bool = True,
        dropout: float = 0.0,
        bias: bool = True,
        position: PositionScheme | None = None,
        backend: str = "sdpa",
        window: int | None = None,
        scale: float | None = None,
    ) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        validate_geometry(d_model, n_heads, n_kv_heads)
        if backend not in BACKENDS:
            raise ValueError(f"unknown attention backend {backend!r}; choose one of {list(BACKENDS)}")
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window <= 0):
            raise ValueError(f"window must be a positive integer (keys seen per query), got {window!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.causal, self.dropout, self.backend, self.window = causal, dropout, backend, window
        self.scale = scale if scale is not None else 1.0 / math.sqrt(self.head_dim)
        self.qkv = nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * self.head_dim, bias=bias)  # fused
        self.proj = nn.Linear(n_heads * self.head_dim, d_model, bias=bias)
        self.split_q = SplitHeads(n_heads)
        self.split_kv = SplitHeads(n_kv_heads)
        self.merge = MergeHeads()
        self.scores_probe = nn.Identity()  # sees [B, h, Tq, Tk] weights in the eager backend
        self.position = position

    def forward(
        self,
        x: Tensor,
        pos: Tensor | None = None,
        *,
        position: PositionScheme | None = None,
        attn_mask: Tensor | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
        backend: str | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend.

        Args:
            x: ``[B, T, d]``.
            pos: positions of the ``T`` tokens ``[T]`` (default ``cache.length + arange(T)``).
            position: scheme overriding ``self.position`` (how a model shares one scheme).
            attn_mask: ``[Tq, Tk]`` or ``[B|1, h|1, Tq, Tk]``; bool (True = attend) or float (added).
            cache: KV cache to read and extend.
            need_weights: also return the attention weights ``[B, h, Tq, Tk]`` (eager backend).
            backend: per-call backend override.

        Returns:
            ``[B, T, d]`` (and the weights when ``need_weights``).
        """
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"attention input must be [B, T, {self.d_model}], got {list(x.shape)}")
        if not x.is_floating_point():
            raise TypeError(f"attention input must be a floating-point tensor, got {x.dtype}")
        B, T, _ = x.shape
        scheme = position if position is not None else self.position
        if pos is None:
            start = cache.length if cache is not None else 0
            pos = torch.arange(start, start + T, device=x.device)
        elif pos.shape != (T,):
            raise ValueError(f"pos must have shape [{T}] (one position per token), got {list(pos.shape)}")
        backend = backend or ("eager" if need_weights else self.backend)
        if backend not in BACKENDS:
            raise ValueError(f"unknown attention backend {backend!r}; choose one of {list(BACKENDS)}")

        h, hkv, dk = self.n_heads, self.n_kv_heads, self.head_dim
        q, k, v = self.qkv(x).split((h * dk, hkv * dk, hkv * dk), dim=-1)  # [B, T, h*dk], [B, T, hkv*dk] x2
        q, k, v = self.split_q(q), self.split_kv(k), self.split_kv(v)  # [B, h|hkv, T, dk]
        q_pos = k_pos = pos
        if scheme is not None:
            q, k = scheme.rotate(q, k, q_pos, k_pos)
        if cache is not None:
            k, v, k_pos = cache.update(k, v, pos)  # [B, hkv, Tk, dk], [Tk]
        bias = scheme.score_bias(q, k, q_pos, k_pos, self.scale) if scheme is not None and scheme.has_bias else None
        mask = self._mask(q_pos, k_pos, attn_mask, B, T, k.shape[2], x.device)

        dropout = self.dropout if self.training else 0.0
        weights = None
        if backend == "eager":
            out, weights = self._eager(q, k, v, bias, mask, dropout)
        elif backend == "flex":
            out = self._flex(q, k, v, scheme, q_pos, k_pos, attn_mask)
        else:
            out = self._sdpa(q, k, v, bias, mask, dropout, fast_causal=cache is None and attn_mask is None)
        out = self.proj(self.merge(out))  # [B, h, T, dk] -> [B, T, d] -> [B, T, d]
        return (out, weights) if need_weights else out

    # ------------------------------------------------------------------------------------ masks
    def _mask(
        self, q_pos: Tensor, k_pos: Tensor, attn_mask: Tensor | None, B: int, Tq: int, Tk: int, device: torch.device
    ) -> Tensor | None:
        """Boolean keep-mask broadcastable to ``[B, h, Tq, Tk]`` (``None`` = keep everything)."""
        keep = None
        if self.causal:
            keep = k_pos[None, :] <= q_pos[:, None]  # [Tq, Tk]
        if self.window is not None:
            in_window = k_pos[None, :] > q_pos[:, None] - self.window  # [Tq, Tk]
            keep = in_window if keep is None else keep & in_window
        if attn_mask is not None:
            user = check_mask(attn_mask, B, self.n_heads, Tq, Tk, device)
            if user.dtype == torch.bool:
                keep = user if keep is None else keep & user
            else:
                return _combine_float(keep, user)
        return keep

    # --------------------------------------------------------------------------------- backends
    def _sdpa(self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, mask: Tensor | None, dropout: float, fast_causal: bool) -> Tensor:
        gqa = self.n_kv_heads != self.n_heads
        if bias is None and fast_causal and self.causal and self.window is None and q.shape[2] == k.shape[2]:
            # the fused causal kernel; positions are contiguous because there is no cache
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=self.scale, enable_gqa=gqa)
        float_mask = _combine_float(mask, bias)
        if float_mask is not None and float_mask.dtype != torch.bool:
            float_mask = float_mask.to(q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask, dropout_p=dropout, scale=self.scale, enable_gqa=gqa)

    def _eager(self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, mask: Tensor | None, dropout: float) -> tuple[Tensor, Tensor]:
        if self.n_kv_heads != self.n_heads:  # each query head reads kv head h // (h / h_kv)
            rep = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        with torch.autocast(device_type=q.device.type, enabled=False):
            scores = torch.matmul(q.float(), k.float().transpose(-2, -1)) * self.scale  # [B, h, Tq, Tk] fp32
            combined = _combine_float(mask, bias)
            if combined is not None:
                if combined.dtype == torch.bool:
                    scores = scores.masked_fill(~combined, float("-inf"))
                else:
                    scores = scores + combined
            weights = torch.softmax(scores, dim=-1)  # fp32 softmax
        weights = self.scores_probe(weights)
        attn = F.dropout(weights, p=dropout) if dropout > 0 else weights
        return torch.matmul(attn.to(v.dtype), v), weights  # [B, h, Tq, dk]

    def _flex(self, q: Tensor, k: Tensor, v: Tensor, scheme: PositionScheme | None, q_pos: Tensor, k_pos: Tensor, attn_mask: Tensor | None) -> Tensor:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        if attn_mask is not None:
            raise ValueError("the flex backend takes no attn_mask; use sdpa or eager for explicit masks")
        score_mod = scheme.score_mod(q, k, q_pos, k_pos, self.scale) if scheme is not None and scheme.has_bias else None
        causal, window = self.causal, self.window

        def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            qp, kp = q_pos[q_idx], k_pos[kv_idx]
            keep = (kp <= qp) if causal else (kp == kp)
            if window is not None:
                keep = keep & (kp > qp - window)
            return keep

        block_mask = None
        if causal or window is not None:
            block_mask = create_block_mask(mask_mod, None, None, q.shape[2], k.shape[2], device=q.device.type)
        run = _compiled_flex() if q.device.type == "cpu" else flex_attention
        return run(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=self.scale, enable_gqa=self.n_kv_heads != self.n_heads)


_FLEX = None


def _compiled_flex():
    """FlexAttention runs on CPU only compiled (forward only)."""
    global _FLEX
    if _FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention

        _FLEX = torch.compile(flex_attention, dynamic=False)
    return _FLEX


def validate_geometry(d_model: int, n_heads: int, n_kv_heads: int) -> None:
    """Raise ``ValueError`` naming the value and the rule for an impossible head layout."""
    for label, value in (("d_model", d_model), ("n_heads", n_heads), ("n_kv_heads", n_kv_heads)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{label} must be an integer, got {value!r}")
        if value <= 0:
            raise ValueError(f"{label} must be > 0, got {value}")
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads} (d_model must equal n_heads * d_k)")
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads={n_heads} is not divisible by n_kv_heads={n_kv_heads} (each kv head serves n_heads/n_kv_heads query heads)")


def check_mask(mask: Tensor, B: int, h: int, Tq: int, Tk: int, device: torch.device) -> Tensor:
    """Validate a user mask and return it broadcastable to ``[B, h, Tq, Tk]``."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(f"attn_mask must be bool (True = attend) or floating point (added to logits), got {mask.dtype}")
    if mask.device != device and mask.device.type != torch.device(device).type:
        raise ValueError(f"attn_mask is on {mask.device} but the inputs are on {device}")
    if mask.dim() == 2:
        mask = mask[None, None]
    ok = mask.dim() == 4 and mask.shape[-2:] == (Tq, Tk) and mask.shape[0] in (1, B) and mask.shape[1] in (1, h)
    if not ok:
        raise ValueError(f"attn_mask of shape {list(mask.shape)} does not fit: expected [{Tq}, {Tk}] or [{B}|1, {h}|1, {Tq}, {Tk}]")
    return mask


def _combine_float(mask: Tensor | None, bias: Tensor | None) -> Tensor | None:
    """Merge a mask (bool keep-mask or additive float) and an additive float bias (or pass one through)."""
    if bias is None:
        return mask
    if mask is None:
        return bias
    if mask.dtype == torch.bool:
        return bias.float().masked_fill(~mask, float("-inf"))
    return bias.float() + mask.float()
