"""``MultiHeadAttention``: the head split, the position hooks, the KV cache and the mechanisms around :func:`attend`.

The head split and merge follow the lessons exactly::

    x [B, T, d] --qkv--> q [B, T, h*d_k] --view--> [B, T, h, d_k] --transpose--> [B, h, T, d_k]
    softmax(q k^T / sqrt(d_k) + bias) v                                        -> [B, h, T, d_k]
    --transpose--> [B, T, h, d_k] --reshape--> [B, T, d] --proj--> [B, T, d]

A position scheme is injected; attention calls its hooks at fixed places with explicit positions
(``rotate`` on q/k, ``score_bias`` on the logits), so offsets, KV-cache decoding and extrapolation
share one code path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from poslab.nn.attention.cache import KVCache, SegmentInputs
from poslab.nn.attention.config import AttendOptions, AttentionConfig, require_config
from poslab.nn.attention.core import attend
from poslab.nn.attention.inputs import validate_geometry
from poslab.nn.attention.rotation import rotate_with_cache
from poslab.nn.attention.spec import AttentionSpec, BiasFn, LazyScoreMod
from poslab.nn.positions.base import PositionScheme

#: the default layer settings (plain causal attention, ``auto`` backend)
DEFAULT_CONFIG = AttentionConfig()


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


class ClippedLinear(nn.Linear):
    """``nn.Linear`` whose output is clamped to ``[-clip, clip]`` (MPT's ``clip_qkv``, Mosaic 2023).

    Same parameters and state-dict keys as the ``nn.Linear`` it replaces.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, clip: float) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.clip = float(clip)

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x).clamp(min=-self.clip, max=self.clip)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, clip={self.clip}"


def check_cache_mask(cache: KVCache, mask: Tensor | None) -> None:
    """``ValueError`` for a ``mask`` with a rolling cache (:class:`SegmentMemoryCache` included): once full, a
    ring returns its keys in ring order, so the mask's ``Tk`` columns would name no fixed keys."""
    if mask is not None and cache.rolling:
        raise ValueError(
            f"mask= cannot be combined with a rolling cache ({type(cache).__name__}, capacity {cache.capacity}): "
            "a full ring returns its keys in ring order, so a [Tq, Tk] mask cannot name them; "
            "use a non-rolling KVCache or mask by positions (window, chunk)"
        )


class ConfigAttribute:
    """A layer attribute that reads one field of the layer's :class:`AttentionConfig`; assigning it
    replaces the config with a copy (validated again), so the config stays the one record."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, layer: MultiHeadAttention | None, owner: type | None = None) -> object:
        if layer is None:
            return self
        return getattr(layer.attention, self.name)

    def __set__(self, layer: MultiHeadAttention, value: object) -> None:
        layer.attention = layer.attention.with_(**{self.name: value})


class AttentionLayer(nn.Module):
    """What every attention layer offers besides ``forward(x, pos, *, cache=None, mask=None)``.

    * :meth:`forward_with_weights`: the output and the attention weights of one call (eager backend),
      the documented way to read weights.
    * :meth:`share_position`: the position scheme a model lends the layer. A model shares one scheme
      across its layers; lent (not registered as a submodule), it stays in the model's
      ``state_dict`` once. A scheme the layer was built with (its own ``position``) comes first.
    * :func:`use_backend` finds the layers of a model by this type.
    """

    position: PositionScheme | None
    _shared_position: PositionScheme | None = None  # what share_position lent (an instance attribute once set)

    def fit(self, scheme: PositionScheme) -> None:
        raise NotImplementedError

    def _attend(
        self, x: Tensor, pos: Tensor | None, cache: object, mask: Tensor | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        raise NotImplementedError

    def share_position(self, scheme: PositionScheme | None) -> None:
        """Run ``scheme`` when the layer has no scheme of its own (``None``: lend none); checked by :meth:`fit`."""
        if scheme is not None:
            self.fit(scheme)
        object.__setattr__(self, "_shared_position", scheme)  # a plain attribute: not a submodule of this layer

    @property
    def position_scheme(self) -> PositionScheme | None:
        """The scheme the layer runs: its own ``position``, else the one a model lent (:meth:`share_position`)."""
        own = self.position
        return own if own is not None else self._shared_position

    def forward_with_weights(
        self, x: Tensor, pos: Tensor | None = None, *, cache: object = None, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """:meth:`forward` that also returns the attention weights ``[B, h, Tq, Tk]`` (fp32; computed by the
        eager backend, whatever the layer's ``backend``). Forward hooks on the layer itself do not run;
        those on its submodules (``scores_probe``) do."""
        out, weights = self._attend(x, pos, cache, mask, True)
        assert weights is not None  # the eager backend returns them when asked
        return out, weights


@contextlib.contextmanager
def use_backend(module: nn.Module, backend: str) -> Iterator[None]:
    """Inside the block, every attention layer in ``module`` (a layer or a whole model) runs ``backend``.

    Each layer's ``attention`` config is replaced by a copy with that backend (validated: an unknown
    name raises ``ValueError`` naming it) and restored on exit. The layers are changed in place, so
    the block applies to every caller of ``module`` meanwhile (as :func:`poslab.analysis.heads.masked_heads`
    does); ``torch.compile`` sees the changed config as any other.
    """
    layers = [m for m in module.modules() if isinstance(m, AttentionLayer)]
    saved = [layer.attention for layer in layers]
    changed = [config.with_(backend=backend) for config in saved]  # every copy validated before any is set
    try:
        for layer, config in zip(layers, changed):
            layer.attention = config
        yield
    finally:
        for layer, config in zip(layers, saved):
            layer.attention = config


class MultiHeadAttention(AttentionLayer):
    """Multi-head attention (Vaswani et al. 2017) with GQA (Ainslie et al. 2023) and position hooks.

    Args:
        d_model: model width ``d``.
        n_heads: query heads ``h``; ``d_k = d_model // n_heads``.
        n_kv_heads: key/value heads (``None`` = ``n_heads``; 1 = MQA); must divide ``n_heads``.
        attention: the attention settings (:class:`~poslab.nn.attention.config.AttentionConfig`:
            causal, window, chunk, soft-cap, scale, sinks, dropout, QK-norm, temperature tuning,
            head width, biases, ``clip_qkv``, backend, blocking thresholds), validated when it is
            made. The layer exposes each field as
            an attribute (``layer.window``); assigning one replaces ``layer.attention`` with a copy.
        position: the position scheme whose ``rotate`` / ``score_bias`` hooks run here (optional;
            a model sharing one scheme across layers lends it with :meth:`share_position` instead).
    """

    causal = ConfigAttribute()
    window = ConfigAttribute()
    chunk = ConfigAttribute()
    softcap = ConfigAttribute()
    dropout = ConfigAttribute()
    qk_norm = ConfigAttribute()
    temperature_tuning = ConfigAttribute()
    backend = ConfigAttribute()
    query_chunk = ConfigAttribute()
    recompute_threshold = ConfigAttribute()

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        attention: AttentionConfig = DEFAULT_CONFIG,
        position: PositionScheme | None = None,
    ) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        validate_geometry(d_model, n_heads, n_kv_heads)
        bias = require_config(attention).resolved().bias  # None: a bare layer has biases
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.head_dim = d_model // n_heads if attention.head_dim is None else attention.head_dim
        qkv_width = (n_heads + 2 * n_kv_heads) * self.head_dim
        if attention.clip_qkv is not None:
            self.qkv = ClippedLinear(d_model, qkv_width, bias, attention.clip_qkv)  # fused, clamped
        else:
            self.qkv = nn.Linear(d_model, qkv_width, bias=bias)  # fused
        self.proj = nn.Linear(n_heads * self.head_dim, d_model, bias=bias)
        self.split_q = SplitHeads(n_heads)
        self.split_kv = SplitHeads(n_kv_heads)
        self.merge = MergeHeads()
        self.scores_probe = nn.Identity()  # sees [B, h, Tq, Tk] weights in the eager backend
        # [h] multiplier of each head's output before the output projection (Michel et al. 2019,
        # https://arxiv.org/abs/1905.10650: 0 prunes a head; the gradient at 1 is the head-importance
        # proxy); poslab.analysis.heads.masked_heads sets it for the duration of a block
        self.head_mask: Tensor | None = None
        self.attention = attention
        if position is not None:
            self.fit(position)
        self.position = position
        if attention.qk_norm:
            eps, affine = float(attention.resolved().qk_norm_eps), attention.qk_norm_affine
            self.q_norm = nn.RMSNorm(self.head_dim, eps=eps, elementwise_affine=affine)
            self.k_norm = nn.RMSNorm(self.head_dim, eps=eps, elementwise_affine=affine)
        self.sinks = nn.Parameter(torch.zeros(self.n_heads)) if attention.sinks else None

    @property
    def attention(self) -> AttentionConfig:
        """The layer's settings (assigning a new config also rebuilds the calls' :class:`AttendOptions`)."""
        return self._attention

    @attention.setter
    def attention(self, config: AttentionConfig) -> None:
        self._attention = require_config(config)
        # the options of the usual calls, made once (each takes microseconds to validate):
        # keyed by (training, increasing); a call for the weights makes its own
        self._options = {
            (training, increasing): AttendOptions(
                backend=config.backend,
                dropout=(config.dropout or 0.0) if training else 0.0,
                query_chunk=config.query_chunk,
                recompute_threshold=config.recompute_threshold,
                probe=self.scores_probe,
                increasing=increasing,
            )
            for training in (False, True)
            for increasing in (None, False, True)
        }

    @property
    def scale(self) -> float:
        """The softmax scale: ``attention.scale``, or ``1/sqrt(d_k)`` when it is ``None``."""
        scale = self._attention.scale
        return scale if scale is not None else 1.0 / math.sqrt(self.head_dim)

    def options(self, need_weights: bool, increasing: bool | None) -> AttendOptions:
        """The :class:`AttendOptions` of one call in the current mode."""
        usual = self._options.get((self.training, increasing))
        fresh = usual is not None and usual.probe is self.scores_probe  # a probe assigned later is used too
        if fresh and not need_weights:
            return usual
        base = self._options[(self.training, None)]
        return dataclasses.replace(
            base,
            need_weights=need_weights,
            increasing=increasing,
            probe=self.scores_probe,
        )

    def temperature(self, q_pos: Tensor) -> Tensor:
        """Llama 4's per-position query multiplier ``[Tq]`` (fp32) of ``temperature_tuning``."""
        floor_scale, attn_scale = self.temperature_tuning
        return torch.log1p(torch.floor((q_pos.float() + 1.0) / floor_scale)) * attn_scale + 1.0

    def fit(self, scheme: PositionScheme) -> None:
        """Check ``scheme`` against this layer's geometry and causality (see ``PositionScheme.check_layer``).

        A scheme built for other heads (RoPE's default ``head_dim=64`` in 128-wide heads, ALiBi's 8
        slopes in a 4-head layer) raises ``ValueError`` naming both values; layer-dependent defaults
        (T5's ``bidirectional``) are filled in. Runs once per scheme object.
        """
        layer = (self.n_heads, self.head_dim, self.causal)
        fitted = scheme.__dict__.setdefault("_fitted_layers", set())  # layer kinds this scheme already passed
        if layer not in fitted:
            scheme.check_layer(*layer)
            fitted.add(layer)

    def forward(
        self,
        x: Tensor,
        pos: Tensor | None = None,
        *,
        cache: KVCache | SegmentInputs | None = None,
        mask: Tensor | None = None,
    ) -> Tensor:
        """Attend: ``x [B, T, d]`` -> ``[B, T, d]``.

        The position scheme is the layer's (:attr:`position_scheme`), the backend its config's
        (:func:`use_backend` changes it for a block); :meth:`forward_with_weights` also returns the
        weights.

        Args:
            x: ``[B, T, d]``.
            pos: positions of the ``T`` tokens ``[T]`` (default ``cache.length + arange(T)``; without a
                cache the layer then knows them increasing and need not look, so ``torch.compile``
                traces the fused causal path without a graph break).
            cache: what the layer attends besides ``x``, by type: a :class:`KVCache` to read and
                extend (``Tk`` = cached + new tokens; its subclasses :class:`SegmentMemoryCache` and
                :class:`~poslab.nn.streaming.StreamingKVCache` declare their layout), or
                Transformer-XL segment memory (:class:`SegmentInputs`: the previous segment's inputs
                to this layer and their positions, keyed with the current ``qkv`` weights and placed
                before the segment's keys).
            mask: ``[Tq, Tk]`` or ``[B|1, h|1, Tq, Tk]``; bool (True = attend) or float (added). Not
                with a rolling cache: a full ring returns its keys in ring order, which a mask's
                columns cannot name.
        """
        return self._attend(x, pos, cache, mask, False)[0]

    def _attend(
        self,
        x: Tensor,
        pos: Tensor | None,
        cache: KVCache | SegmentInputs | None,
        mask: Tensor | None,
        need_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """:meth:`forward`, returning ``(out, weights)`` (``weights`` only when ``need_weights``)."""
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"attention input must be [B, T, {self.d_model}], got {list(x.shape)}")
        if not x.is_floating_point():
            raise TypeError(f"attention input must be a floating-point tensor, got {x.dtype}")
        B, T, _ = x.shape
        scheme = self.position_scheme
        if scheme is not None and not torch.compiler.is_compiling():  # checked eagerly, once per scheme and layer kind
            self.fit(scheme)
        memory = cache if isinstance(cache, SegmentInputs) else None
        if memory is not None:
            memory.check(x)
            cache = None
        increasing = None  # ``pos`` strictly increasing: None = attend looks at the values
        if pos is None:
            start = cache.length if cache is not None else 0
            pos = torch.arange(start, start + T, device=x.device)
            increasing = True if cache is None and memory is None else None
        elif not isinstance(pos, Tensor) or pos.shape != (T,):
            raise ValueError(
                f"pos must have shape [{T}] (one position per token), got {list(getattr(pos, 'shape', []))}"
            )
        if x.dtype != self.qkv.weight.dtype and not torch.is_autocast_enabled(x.device.type):
            raise TypeError(
                f"attention input is {x.dtype} but the layer's weights are {self.qkv.weight.dtype}; "
                f"convert one (x.to({self.qkv.weight.dtype}) or layer.to({x.dtype}))"
            )
        window = self.effective_window()
        if cache is not None:
            if not isinstance(cache, KVCache):
                raise TypeError(
                    f"cache must be a KVCache, got {type(cache).__name__} (segment memory is passed as SegmentInputs)"
                )
            cache.check_window(window)  # a ring narrower than the window is refused (not a SegmentMemoryCache)
            check_cache_mask(cache, mask)

        h, hkv, dk = self.n_heads, self.n_kv_heads, self.head_dim
        q, k, v = self.qkv(x).split((h * dk, hkv * dk, hkv * dk), dim=-1)  # [B, T, h*dk], [B, T, hkv*dk] x2
        if scheme is not None and scheme.rotates:
            # elementwise rotations run ~1.5x faster (with backward) on dense rows than on views of
            # the fused qkv output; one copy of q and k pays for itself
            q, k = q.contiguous(), k.contiguous()
        q, k, v = self.split_q(q), self.split_kv(k), self.split_kv(v)  # [B, h|hkv, T, dk]
        k_pos = pos
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)  # RMSNorm over d_k, per head
        if memory is not None:
            k_mem, v_mem = self._memory_kv(memory.inputs)  # [B, hkv, M, dk] x2
            k, v = torch.cat((k_mem, k), dim=2), torch.cat((v_mem, v), dim=2)  # [B, hkv, M+T, dk]
            k_pos = torch.cat((memory.pos.to(pos.device), pos))  # [M+T]
        update = None
        # a cache that assigns positions by place (StreamingLLM, poslab/nn/streaming.py) stores keys unrotated
        replaced = cache is not None and cache.reassigns_positions
        if cache is not None:

            def update(k_new: Tensor) -> tuple[Tensor, Tensor, Tensor]:
                nonlocal v
                k_all, v, k_pos_all = cache.update(k_new, v, pos)  # [B, hkv, Tk, dk] x2, [Tk]
                return k_all, (k_pos_all[-T:] if replaced else pos), k_pos_all  # new tokens: the cache's last entries

        q, k, q_pos, k_pos = rotate_with_cache(scheme, q, k, pos, k_pos, update, keys_unrotated=replaced)
        if self.temperature_tuning is not None:
            q = (q * self.temperature(q_pos).view(1, 1, T, 1)).to(q.dtype)  # [B, h, T, dk] * [1, 1, T, 1]
        spec = AttentionSpec(
            causal=self.causal,
            window=window,
            chunk=self.chunk,
            sinks=self.sinks,
            softcap=self.softcap,
            scale=self.scale,
            bias_fn=self.bias_fn(scheme),
            score_mod=self._lazy_score_mod(scheme, q, k, q_pos, k_pos),
        )
        out, weights = attend(
            q,
            k,
            v,
            q_pos,
            k_pos,
            spec,
            attn_mask=mask,
            options=self.options(need_weights, increasing if q_pos is pos else None),
        )
        head_mask = self.head_mask
        if head_mask is not None:
            if not isinstance(head_mask, Tensor) or head_mask.shape != (h,):
                raise ValueError(
                    f"head_mask must be a tensor of shape [{h}] (one factor per head), "
                    f"got {getattr(head_mask, 'shape', head_mask)!r}"
                )
            out = (
                out * head_mask.to(device=out.device, dtype=out.dtype)[None, :, None, None]
            )  # [B, h, T, dk] * [1, h, 1, 1]
        out = self.proj(self.merge(out))  # [B, h, T, dk] -> [B, T, d] -> [B, T, d]
        return out, weights

    def _memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values ``[B, h_kv, M, d_k]`` of memory ``[B, M, d]`` under the current weights (before
        ``rotate``)."""
        h, hkv, dk = self.n_heads, self.n_kv_heads, self.head_dim
        if type(self.qkv) is nn.Linear:  # only the k, v rows of the fused projection
            bias = self.qkv.bias[h * dk :] if self.qkv.bias is not None else None
            kv = F.linear(memory, self.qkv.weight[h * dk :], bias)  # [B, M, 2*hkv*dk]
        else:  # a wrapped projection (clip_qkv): run it whole, drop the queries
            kv = self.qkv(memory)[..., h * dk :]  # [B, M, 2*hkv*dk]
        k, v = kv.split((hkv * dk, hkv * dk), dim=-1)  # [B, M, hkv*dk] x2
        k, v = self.split_kv(k), self.split_kv(v)  # [B, hkv, M, dk] x2
        if self.qk_norm:
            k = self.k_norm(k)
        return k, v

    # ------------------------------------------------------------------- hooks for subclasses
    def effective_window(self) -> int | None:
        """Keys farther than this are never attended (``self.window``; adaptive span narrows it)."""
        return self.window

    def extra_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """Additive fp32 bias ``[1, h, Tq, Tk]`` added to the scheme's (``None`` here; see sparse.py)."""
        return None

    def _has_extra_bias(self) -> bool:
        return type(self).extra_bias is not MultiHeadAttention.extra_bias

    def bias_fn(self, scheme: PositionScheme | None) -> BiasFn | None:
        """The scheme's ``score_bias`` plus :meth:`extra_bias` as one block-wise callable.

        Whether the scheme has a bias is derived from the hooks it overrides (``has_bias``), never
        from a flag it could forget.
        """
        scheme_bias = scheme is not None and scheme.has_bias
        extra = self._has_extra_bias()
        if not scheme_bias and not extra:
            return None
        scale = self.scale

        def fn(q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
            bias = scheme.score_bias(q, k, q_pos, k_pos, scale) if scheme_bias else None
            more = self.extra_bias(q_pos, k_pos) if extra else None
            if more is None:
                return bias
            return more if bias is None else bias + more

        return fn

    def _lazy_score_mod(
        self, scheme: PositionScheme | None, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor
    ) -> LazyScoreMod | None:
        """The flex form of :meth:`bias_fn`, built only if flex runs (``None``: a bias flex cannot express)."""
        if self._has_extra_bias():
            return None

        def build(qp: Tensor, kp: Tensor) -> Callable | None:
            if scheme is None or type(scheme).score_mod is not PositionScheme.score_mod:
                return self.score_mod(scheme, q, k, qp, kp)  # a closed form of the (padded) positions
            # the default form materialises score_bias on the real q, k and positions (a q- or k-dependent
            # bias, CoPE's gates, would change with padded keys): clamp flex's padded indices into it
            mod, q_last, k_last = self.score_mod(scheme, q, k, q_pos, k_pos), q.shape[2] - 1, k.shape[2] - 1
            if mod is None:
                return None
            return lambda score, b, h, qi, ki: mod(score, b, h, qi.clamp(max=q_last), ki.clamp(max=k_last))

        return LazyScoreMod(build)

    def score_mod(
        self, scheme: PositionScheme | None, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor
    ) -> Callable | None:
        """FlexAttention ``score_mod`` of the scheme (``None`` without a bias)."""
        if self._has_extra_bias():
            raise ValueError(f"{type(self).__name__} adds a bias the flex backend cannot express; use sdpa or eager")
        if scheme is None or not scheme.has_bias:
            return None
        return scheme.score_mod(q, k, q_pos, k_pos, self.scale)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, causal={self.causal}, "
            f"window={self.window}, backend={self.backend!r}"
        )
