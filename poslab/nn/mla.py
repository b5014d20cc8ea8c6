"""Multi-head latent attention (MLA) with decoupled RoPE and its compressed KV cache.

DeepSeek-AI 2024, "DeepSeek-V2" (https://arxiv.org/abs/2405.04434), Sec. 2.1; DeepSeek-V3
(https://arxiv.org/abs/2412.19437). Keys and values are compressed into one latent per token::

    x [B, T, d] --kv_a--> [latent c (r) | k_rot (d_r)]        c = RMSNorm(c)   (the cache holds c, k_rot)
    c  --kv_b--> [B, T, h, d_n + d_v] -> k_nope [B, h, T, d_n], v [B, h, T, d_v]
    x  --q (or q_a -> RMSNorm -> q_b)--> [B, T, h, d_n + d_r] -> q_nope, q_rot
    rotate(q_rot, k_rot): one rotary key shared by every head ("decoupled RoPE")
    softmax([q_rot | q_nope] . [k_rot | k_nope] * scale) v

The position scheme's ``rotate`` sees only the ``d_r`` rotary dims (its ``head_dim`` is ``d_r``);
putting them first in q and k changes no dot product. The cache (:class:`LatentKVCache`) stores
``r + d_r`` numbers per token and layer instead of ``2 h d_k``.

Decoding can *absorb* ``kv_b`` (the "absorbed-projection" path, ``absorb=True``): with
``W_uk [h, d_n, r]`` and ``W_uv [h, d_v, r]`` the slices of ``kv_b``,
``q_nope . (W_uk c) = (W_uk^T q_nope) . c`` and ``softmax(.) (W_uv c) = W_uv (softmax(.) c)``, so
attention runs directly on the latents and no per-head key or value is ever built.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from poslab.checks import positive_int, positive_number
from poslab.nn.attention import AttendOptions, AttentionConfig, AttentionSpec, attend, rotate_with_cache
from poslab.nn.attention.config import require_config
from poslab.nn.attention.module import DEFAULT_CONFIG, AttentionLayer, ConfigAttribute
from poslab.nn.positions.base import PositionScheme

#: keys of ``GPTConfig.mla``
MLA_KEYS = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "latent_eps")


def validate_mla(values: Any) -> dict[str, int | None]:
    """The MLA dimensions as a dict (``q_lora_rank`` may be ``None``; ``latent_eps``, the epsilon of the
    latent RMSNorms, defaults to DeepSeek's 1e-6); bad keys or values raise ``ValueError``."""
    if not isinstance(values, dict):
        raise TypeError(f"mla must be a dict with keys {list(MLA_KEYS)} (or None), got {values!r}")
    unknown = sorted(set(values) - set(MLA_KEYS))
    missing = sorted(set(MLA_KEYS) - {"q_lora_rank", "latent_eps"} - set(values))
    if unknown or missing:
        raise ValueError(f"mla keys: unknown {unknown}, missing {missing}; allowed: {list(MLA_KEYS)}")
    out: dict[str, int | None] = {}
    eps = values.get("latent_eps", 1e-6)
    positive_number("mla latent_eps", eps, rule="a positive number")
    for key in MLA_KEYS[:-1]:
        value = values.get(key)
        if key == "q_lora_rank" and value is None:
            out[key] = None
            continue
        out[key] = positive_int(f"mla {key}", value)
    if out["qk_rope_head_dim"] % 2:
        raise ValueError(f"mla qk_rope_head_dim must be even (RoPE rotates pairs), got {out['qk_rope_head_dim']}")
    out["latent_eps"] = float(eps)
    return out


class LatentKVCache(nn.Module):
    """MLA's compressed cache: per token the normalised latent ``[r]`` and the rotated shared key ``[d_r]``.

    Args:
        batch_size, kv_lora_rank, rope_dim: geometry; capacity: tokens held (appending past it raises).
        dtype, device: storage.
    """

    def __init__(
        self,
        batch_size: int,
        kv_lora_rank: int,
        rope_dim: int,
        capacity: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        for label, value in (
            ("batch_size", batch_size),
            ("kv_lora_rank", kv_lora_rank),
            ("rope_dim", rope_dim),
            ("capacity", capacity),
        ):
            positive_int(f"latent KV cache {label}", value)
        self.register_buffer(
            "latent", torch.zeros(batch_size, capacity, kv_lora_rank, dtype=dtype, device=device), persistent=False
        )
        self.register_buffer(
            "k_rot", torch.zeros(batch_size, 1, capacity, rope_dim, dtype=dtype, device=device), persistent=False
        )
        self.register_buffer("pos", torch.zeros(capacity, dtype=torch.long, device=device), persistent=False)
        self.capacity, self.length, self.size, self.rolling = capacity, 0, 0, False

    def reset(self) -> None:
        self.length = self.size = 0

    def bytes_per_token(self) -> int:
        """Bytes one token costs this cache (latent + rotary key, every batch row)."""
        return (self.latent[:, 0].numel() + self.k_rot[:, :, 0].numel()) * self.latent.element_size()

    def update(self, latent: Tensor, k_rot: Tensor, pos: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Append ``latent [B, T, r]``, ``k_rot [B, 1, T, d_r]`` at positions ``[T]``; return everything held."""
        T = latent.shape[1]
        if (
            latent.shape[0] != self.latent.shape[0]
            or latent.shape[2] != self.latent.shape[2]
            or k_rot.shape[-1] != self.k_rot.shape[-1]
        ):
            raise ValueError(
                f"latent {list(latent.shape)} / k_rot {list(k_rot.shape)} do not fit this cache "
                f"(batch {self.latent.shape[0]}, rank {self.latent.shape[2]}, rope dim {self.k_rot.shape[-1]})"
            )
        if latent.dtype != self.latent.dtype:
            raise TypeError(
                f"latent KV cache holds {self.latent.dtype} but got {latent.dtype}; make it with dtype={latent.dtype}"
            )
        end = self.size + T
        if end > self.capacity:
            raise ValueError(
                f"KV cache overflow: {self.size} cached + {T} new tokens > capacity {self.capacity}; "
                "make a larger cache"
            )
        self.latent[:, self.size : end] = latent
        self.k_rot[:, :, self.size : end] = k_rot
        self.pos[self.size : end] = pos.to(self.pos.device)
        self.size = self.length = end
        return self.latent[:, :end], self.k_rot[:, :, :end], self.pos[:end]

    def extra_repr(self) -> str:
        B, C, r = self.latent.shape
        return f"batch={B}, capacity={C}, kv_lora_rank={r}, rope_dim={self.k_rot.shape[-1]}, length={self.length}"


class MultiHeadLatentAttention(AttentionLayer):
    """DeepSeek-V2/V3 multi-head latent attention (see the module docstring).

    Args:
        d_model, n_heads: width and heads.
        attention: the layer's :class:`~poslab.nn.attention.AttentionConfig`, as for
            :class:`~poslab.nn.attention.MultiHeadAttention`; MLA refuses a config that switches on
            a mechanism in :attr:`UNSUPPORTED`. Its ``bias`` (on ``q_a``/``kv_a`` and the output
            projection, DeepSeek's ``attention_bias``) is off unless set.
        position: the rotary (or no) position scheme.
        absorb: decode single tokens with the absorbed projections (equal to the naive path).
        dims: the MLA dimensions ``kv_lora_rank``, ``q_lora_rank`` (``None``: one full query
            projection), ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim`` and ``latent_eps``
            (the epsilon of the latent RMSNorms), checked by :func:`validate_mla`.
    """

    #: the :class:`AttentionConfig` mechanisms MLA does not compute (each must be off: ``None``/``False``)
    UNSUPPORTED = ("chunk", "softcap", "sinks", "qk_norm", "temperature_tuning", "head_dim", "clip_qkv")

    causal = ConfigAttribute()
    window = ConfigAttribute()
    dropout = ConfigAttribute()
    backend = ConfigAttribute()

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        attention: AttentionConfig = DEFAULT_CONFIG,
        position: PositionScheme | None = None,
        *,
        absorb: bool = False,
        **dims: Any,
    ) -> None:
        super().__init__()
        dims = validate_mla(dims)
        attention = require_config(attention).resolved(bias=False)  # DeepSeek's attention_bias default
        bias = attention.bias
        for name in self.UNSUPPORTED:
            if getattr(attention, name) not in (None, False):
                raise ValueError(
                    f"multi-head latent attention does not compute {name}={getattr(attention, name)!r}; "
                    f"leave {', '.join(self.UNSUPPORTED)} off"
                )
        self.attention = attention
        self.d_model, self.n_heads = d_model, n_heads
        self.n_kv_heads = n_heads
        self.r, self.dn = dims["kv_lora_rank"], dims["qk_nope_head_dim"]
        self.dr, self.dv = dims["qk_rope_head_dim"], dims["v_head_dim"]
        self.head_dim = self.dn + self.dr
        self.q_lora_rank = dims["q_lora_rank"]
        self.absorb = absorb
        self.head_mask: Tensor | None = None  # [h] factors of the heads' outputs (head-importance analyses)
        self.scale = attention.scale if attention.scale is not None else 1.0 / math.sqrt(self.head_dim)
        self.position = position
        if self.q_lora_rank is None:
            self.q = nn.Linear(d_model, n_heads * self.head_dim, bias=False)
        else:
            self.q_a = nn.Linear(d_model, self.q_lora_rank, bias=bias)
            self.q_a_norm = nn.RMSNorm(self.q_lora_rank, eps=dims["latent_eps"])
            self.q_b = nn.Linear(self.q_lora_rank, n_heads * self.head_dim, bias=False)
        self.kv_a = nn.Linear(d_model, self.r + self.dr, bias=bias)
        self.kv_a_norm = nn.RMSNorm(self.r, eps=dims["latent_eps"])
        self.kv_b = nn.Linear(self.r, n_heads * (self.dn + self.dv), bias=False)
        self.proj = nn.Linear(n_heads * self.dv, d_model, bias=bias)
        self.scores_probe = nn.Identity()

    def fit(self, scheme: PositionScheme) -> None:
        """Check ``scheme`` against this layer: it rotates the ``qk_rope_head_dim`` part of each head."""
        scheme.check_layer(self.n_heads, self.dr, self.causal)

    def _queries(self, x: Tensor) -> tuple[Tensor, Tensor]:
        B, T, _ = x.shape
        q = self.q(x) if self.q_lora_rank is None else self.q_b(self.q_a_norm(self.q_a(x)))
        q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # [B, T, h, dn+dr] -> [B, h, T, dn+dr]
        return q.split((self.dn, self.dr), dim=-1)  # q_nope [B, h, T, dn], q_rot [B, h, T, dr]

    def forward(
        self, x: Tensor, pos: Tensor | None = None, *, cache: LatentKVCache | None = None, mask: Tensor | None = None
    ) -> Tensor:
        """``x [B, T, d]`` -> ``[B, T, d]`` (:meth:`forward_with_weights` also returns the weights ``[B, h, Tq, Tk]``).

        ``pos=None`` is ``cache.length + arange(T)``, known increasing without a cache; ``mask`` and
        the scheme and backend in use are as in :class:`~poslab.nn.attention.MultiHeadAttention`.
        :attr:`head_mask` (``[h]``, set by :func:`poslab.analysis.heads.masked_heads`) multiplies each
        head's output, as in :class:`~poslab.nn.attention.MultiHeadAttention`.
        """
        return self._attend(x, pos, cache, mask, False)[0]

    def _attend(
        self, x: Tensor, pos: Tensor | None, cache: LatentKVCache | None, mask: Tensor | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """:meth:`forward`, returning ``(out, weights)`` (``weights`` only when ``need_weights``)."""
        head_mask = self.head_mask
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"attention input must be [B, T, {self.d_model}], got {list(x.shape)}")
        if cache is not None and not isinstance(cache, LatentKVCache):
            raise TypeError(f"multi-head latent attention needs a LatentKVCache, got {type(cache).__name__}")
        B, T, _ = x.shape
        scheme = self.position_scheme
        increasing = None
        if pos is None:
            start = cache.length if cache is not None else 0
            pos = torch.arange(start, start + T, device=x.device)
            increasing = True if cache is None else None
        q_nope, q_rot = self._queries(x)
        latent, k_rot = self.kv_a(x).split((self.r, self.dr), dim=-1)  # [B, T, r], [B, T, dr]
        latent = self.kv_a_norm(latent)
        k_rot = k_rot.view(B, 1, T, self.dr)  # [B, T, dr] -> [B, 1, T, dr]: one rotary key for all heads
        update = None
        if cache is not None:

            def update(k_new: Tensor) -> tuple[Tensor, Tensor, Tensor]:
                nonlocal latent
                latent, k_all, k_pos_all = cache.update(latent, k_new, pos)  # [B, Tk, r], [B, 1, Tk, dr], [Tk]
                return k_all, pos, k_pos_all

        q_rot, k_rot, _, k_pos = rotate_with_cache(scheme, q_rot.contiguous(), k_rot, pos, pos, update)
        Tk = latent.shape[1]
        if scheme is not None and scheme.has_bias:
            raise ValueError(
                f"multi-head latent attention runs rotary (or no) position schemes; {scheme.name!r} adds a bias"
            )
        spec = AttentionSpec(causal=self.causal, window=self.window, scale=self.scale)  # both paths read its rule
        weights = None
        if self.absorb and T == 1 and not need_weights and mask is None:
            out = self._absorbed(spec, q_nope, q_rot, latent, k_rot, pos, k_pos)
        else:
            kv = self.kv_b(latent).view(B, Tk, self.n_heads, self.dn + self.dv).transpose(1, 2)  # [B, h, Tk, dn+dv]
            k_nope, v = kv.split((self.dn, self.dv), dim=-1)
            q = torch.cat((q_rot, q_nope), dim=-1)  # [B, h, T, dr+dn]: rotary dims first (dot products unchanged)
            k = torch.cat((k_rot.expand(B, self.n_heads, Tk, self.dr), k_nope), dim=-1)  # [B, h, Tk, dr+dn]
            # SDPA's fused CPU kernels need one head width for q, k and v (else the O(T^2) math path runs):
            # zero-pad the narrower side (zeros change no dot product and no output column), slice after
            width = max(self.head_dim, self.dv)
            q, k = F.pad(q, (0, width - self.head_dim)), F.pad(k, (0, width - self.head_dim))
            v = F.pad(v, (0, width - self.dv))  # [B, h, Tk, width]
            out, weights = attend(
                q,
                k,
                v.contiguous(),
                pos,
                k_pos,
                spec,
                attn_mask=mask,
                options=AttendOptions(
                    backend=self.backend,
                    dropout=(self.dropout or 0.0) if self.training else 0.0,
                    need_weights=need_weights,
                    query_chunk=self.attention.query_chunk,
                    recompute_threshold=self.attention.recompute_threshold,
                    probe=self.scores_probe,
                    increasing=increasing,
                ),
            )
            out = out[..., : self.dv]  # [B, h, T, dv]
        if head_mask is not None:
            out = out * head_mask.to(out.dtype)[None, :, None, None]  # [B, h, T, dv] * [1, h, 1, 1]
        out = self.proj(
            out.transpose(1, 2).reshape(B, T, self.n_heads * self.dv)
        )  # [B, h, T, dv] -> [B, T, h*dv] -> [B, T, d]
        return out, weights

    def _absorbed(
        self,
        spec: AttentionSpec,
        q_nope: Tensor,
        q_rot: Tensor,
        latent: Tensor,
        k_rot: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
    ) -> Tensor:
        """One query per row against the latents directly (``kv_b`` folded into q and the output)."""
        w = self.kv_b.weight.view(self.n_heads, self.dn + self.dv, self.r)  # [h, dn+dv, r]
        w_uk, w_uv = w.split((self.dn, self.dv), dim=1)  # [h, dn, r], [h, dv, r]
        with torch.autocast(device_type=q_nope.device.type, enabled=False):
            q_lat = torch.einsum("bhtn,hnr->bhtr", q_nope.float(), w_uk.float())  # [B, h, T, r]
            scores = torch.einsum("bhtr,bkr->bhtk", q_lat, latent.float())  # [B, h, T, Tk]
            scores = scores + torch.einsum("bhtd,bkd->bhtk", q_rot.float(), k_rot[:, 0].float())  # + rotary part
            scores = scores * spec.scale
            keep = spec.keep(q_pos[:, None], k_pos[None, :])  # [T, Tk] or None
            if keep is not None:
                scores = scores.masked_fill(~keep, float("-inf"))
            weights = torch.softmax(scores, dim=-1)  # [B, h, T, Tk] fp32
            ctx = torch.einsum("bhtk,bkr->bhtr", weights, latent.float())  # [B, h, T, r]
            out = torch.einsum("bhtr,hvr->bhtv", ctx, w_uv.float())  # [B, h, T, dv]
        return out.to(q_nope.dtype)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, n_heads={self.n_heads}, kv_lora_rank={self.r}, q_lora_rank={self.q_lora_rank}, "
            f"qk_nope={self.dn}, qk_rope={self.dr}, v={self.dv}, absorb={self.absorb}"
        )
