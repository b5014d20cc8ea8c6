"""A small GPT whose position scheme is injected, never special-cased.

Token embedding -> ``position.embed`` -> ``n_layer`` pre-norm blocks (attention with the scheme's
``rotate``/``score_bias`` hooks, then an MLP) -> final norm -> LM head (tied by default).
Field names follow nanoGPT where they exist.

A few fields exist so published model families load exactly (``poslab.from_hf``): parallel residual
blocks (GPT-NeoX, GPT-J), a norm after the token embedding (Bloom), separate attention / MLP / norm /
LM-head bias flags, the MLP activation (exact or tanh GELU, SiLU, ReLU), the softmax scale and MPT's
``clip_qkv``. Their defaults keep the nanoGPT behaviour.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from poslab.nn import positions
from poslab.nn.attention import KVCache, MultiHeadAttention, SegmentInputs
from poslab.nn.attention.module import ClippedLinear  # noqa: F401  (re-exported)
from poslab.nn.caches import CACHE_SPECS, CacheSpec, DecodeSpec
from poslab.nn.gpt_config import (  # noqa: F401  (the config's public names, re-exported)
    ACTIVATIONS,
    LAYER_KEYS,
    MAX_SCALE,
    MLPS,
    NORMS,
    RESIDUALS,
    GPTConfig,
    MLPConfig,
    NormConfig,
    check_fp32_factor,
    default_activation,
)
from poslab.nn.memory import SegmentMemory
from poslab.nn.positions.base import PositionScheme


def _traced(t: Tensor) -> bool:
    """Whether ``t`` is being traced (``torch.compile``) or batched (``torch.vmap``): no data-dependent checks then.

    A value check reads a tensor's contents (``int(t.max())``), which neither transform allows; the
    caller of a vmapped forward checks the stacked ids once.
    """
    return torch.compiler.is_compiling() or torch._C._functorch.is_batchedtensor(t)


class MLP(nn.Module):
    """Two-layer MLP (GPT-2: tanh GELU) or gated SwiGLU (Shazeer 2020, https://arxiv.org/abs/2002.05202).

    ``activation`` names one of :data:`ACTIVATIONS` (default: ``gelu_tanh``, or ``silu`` for swiglu).
    """

    def __init__(
        self, n_embd: int, hidden: int, kind: str, bias: bool, dropout: float, activation: str | None = None
    ) -> None:
        super().__init__()
        self.kind = kind
        self.activation = activation or default_activation(kind)
        self.act = ACTIVATIONS[self.activation]
        if kind == "swiglu":
            self.gate = nn.Linear(n_embd, hidden, bias=bias)
        self.up = nn.Linear(n_embd, hidden, bias=bias)
        self.down = nn.Linear(hidden, n_embd, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        if self.kind == "swiglu":
            hidden = self.act(self.gate(x)) * self.up(x)
        else:
            hidden = self.act(self.up(x))
        return self.drop(self.down(hidden))


def make_norm(kind: str, n_embd: int, bias: bool, eps: float) -> nn.Module:
    if kind == "rmsnorm":
        return nn.RMSNorm(n_embd, eps=eps)
    return nn.LayerNorm(n_embd, eps=eps, bias=bias)


class Block(nn.Module):
    """Pre-norm transformer block.

    ``residual="sequential"``: ``x + attn(norm1(x))``, then ``+ mlp(norm2(.))``;
    ``"parallel"`` (GPT-NeoX): ``x + attn(norm1(x)) + mlp(norm2(x))``;
    ``"parallel_shared_norm"`` (GPT-J): ``x + attn(norm1(x)) + mlp(norm1(x))`` (no ``norm2``);
    ``"sandwich"`` (Gemma 2/3): ``x + post_attn_norm(attn(norm1(x)))``, then
    ``+ post_mlp_norm(mlp(norm2(.)))``.

    ``layer`` picks the layer's ``layer_pattern`` overrides (window, chunk, temperature).
    """

    def __init__(self, cfg: GPTConfig, layer: int = 0) -> None:
        super().__init__()
        norm, norm_bias = cfg.norm, cfg.bias_of("norm")
        self.residual = cfg.residual
        self.norm1 = make_norm(norm.kind, cfg.n_embd, norm_bias, norm.eps)
        if cfg.mla is not None:
            self.attn = latent_attention(cfg, layer)
        else:
            self.attn = MultiHeadAttention(cfg.n_embd, cfg.n_head, cfg.kv_heads, cfg.layer_attention(layer))
        if cfg.residual != "parallel_shared_norm":
            self.norm2 = make_norm(norm.kind, cfg.n_embd, norm_bias, norm.eps)
        mlp = cfg.mlp
        self.mlp = MLP(
            cfg.n_embd, mlp.hidden_width(cfg.n_embd), mlp.kind, cfg.bias_of("mlp"), cfg.dropout, mlp.activation
        )
        self.resid_drop = nn.Dropout(cfg.dropout)
        if cfg.residual == "sandwich":
            self.post_attn_norm = make_norm(norm.kind, cfg.n_embd, norm_bias, norm.eps)
            self.post_mlp_norm = make_norm(norm.kind, cfg.n_embd, norm_bias, norm.eps)

    def forward(
        self,
        x: Tensor,
        pos: Tensor | None,
        cache: KVCache | SegmentInputs | None = None,
        mask: Tensor | None = None,
    ) -> Tensor:
        """``x [B, T, d]`` -> ``[B, T, d]``; a :class:`SegmentInputs` cache (this block's earlier inputs
        ``[B, M, d]``) is normed like ``x``. The attention runs the scheme the model lent it."""
        h = self.norm1(x)
        if isinstance(cache, SegmentInputs):
            cache = SegmentInputs(self.norm1(cache.inputs), cache.pos)
        attn_out = self.resid_drop(self.attn(h, pos, cache=cache, mask=mask))
        if self.residual == "parallel_shared_norm":
            return x + attn_out + self.mlp(h)
        if self.residual == "parallel":
            return x + attn_out + self.mlp(self.norm2(x))
        if self.residual == "sandwich":
            x = x + self.post_attn_norm(attn_out)
            return x + self.post_mlp_norm(self.mlp(self.norm2(x)))
        x = x + attn_out
        return x + self.mlp(self.norm2(x))


def latent_attention(cfg: GPTConfig, layer: int) -> nn.Module:
    """Layer ``layer``'s :class:`~poslab.nn.mla.MultiHeadLatentAttention` (``cfg.mla`` set)."""
    from poslab.nn.mla import MultiHeadLatentAttention

    return MultiHeadLatentAttention(cfg.n_embd, cfg.n_head, cfg.layer_attention(layer), **cfg.mla)


def build_layer_positions(cfg: GPTConfig) -> nn.ModuleDict:
    """One scheme per layer whose ``layer_pattern`` entry names its own (keys ``"0"``, ``"1"``, ...)."""
    schemes = nn.ModuleDict()
    for i in range(cfg.n_layer):
        entry = cfg.layer(i)
        if "position" in entry or "position_config" in entry:
            name, config = cfg.layer_value(i, "position"), cfg.layer_value(i, "position_config")
            # a layer's own scheme serves that layer only: one set of per-layer parameters
            schemes[str(i)] = positions.build_for_model(name, config, {**cfg.position_context(), "n_layer": 1})
    return schemes


class GPT(nn.Module):
    """Decoder-only transformer with an injected position scheme.

    ``model(idx)`` returns logits ``[B, T, V]``; ``model(idx, targets)`` returns ``(logits, loss)``.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        if config.norm.embed:
            self.embed_norm = make_norm(config.norm.kind, config.n_embd, config.bias_of("norm"), config.norm.eps)
        self.position = positions.build_for_model(config.position, config.position_config, config.position_context())
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self.layer_positions = build_layer_positions(config)
        self._lend_positions()  # each layer's scheme is checked against (and fitted to) the layer's geometry
        self.norm_f = make_norm(config.norm.kind, config.n_embd, config.bias_of("norm"), config.norm.eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=config.lm_head_bias)
        if config.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2: scale residual projections by depth
            if name.endswith(("attn.proj.weight", "mlp.down.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear) and not getattr(module, "_keep_init", False):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding) and module.weight.shape[-1] > 1:
            # a position scheme's table states its own std (``init_std``); every other table gets GPT-2's
            nn.init.normal_(module.weight, mean=0.0, std=getattr(module, "_init_std", 0.02))

    def replace_position(
        self, name: str | None = None, config: dict[str, Any] | None = None, **overrides: Any
    ) -> PositionScheme:
        """Swap the position scheme, keeping ``self.config`` and the modules in sync.

        The new scheme is built from ``name`` (default: the current one) and ``config`` (default: the
        current ``position_config`` when the name is unchanged, else ``{}``) updated with
        ``overrides``, with the model's dimensions filled in, on the model's device and dtype. Its
        parameters (if any) are fresh: swapping a trained learned table or T5 bias loses it, swapping
        the rotary schemes' scaling (``position.rescaled_config``) loses nothing.

        Returns:
            The new scheme (also ``self.position``); ``self.config.position`` and
            ``self.config.position_config`` describe it.
        """
        cfg = self.config
        name = cfg.position if name is None else name
        base = dict(config) if config is not None else (dict(cfg.position_config) if name == cfg.position else {})
        base.update(overrides)
        scheme = positions.build_for_model(name, base, cfg.position_context())
        weight = self.tok_emb.weight
        scheme = scheme.to(device=weight.device, dtype=weight.dtype)  # fp32 tables (RoPE frequencies, slopes) stay fp32
        for block in self.blocks:
            block.attn.fit(scheme)
        self.position = scheme
        cfg.position, cfg.position_config = name, base
        self._lend_positions()
        return scheme

    def _lend_positions(self) -> None:
        """Lend layer ``i`` its scheme, :meth:`layer_position` ``(i)`` (held by this model, not by the layer)."""
        for i, block in enumerate(self.blocks):
            block.attn.share_position(self.layer_position(i))

    def num_params(self, non_embedding: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.tok_emb.weight.numel() if not self.config.tie_embeddings else 0
        return n

    def make_cache(
        self, batch_size: int, spec: CacheSpec | None = None, dtype: torch.dtype | None = None
    ) -> list[KVCache]:
        """One preallocated cache per layer, of the kind ``spec`` names (:mod:`poslab.nn.caches`).

        ``DecodeSpec(capacity)`` (also ``spec=None``): the model's own caches for decoding
        (``capacity`` entries, default ``block_size``; rolling rings of ``window`` on windowed layers,
        so decoding runs for any length in constant memory; latent caches for MLA).
        ``StreamingSpec(window, sinks)``: StreamingLLM caches. ``SegmentMemorySpec(length)``:
        Transformer-XL segment-memory rings, the cached form of :class:`~poslab.nn.memory.SegmentMemory`.
        """
        spec = DecodeSpec() if spec is None else spec
        if not isinstance(spec, CACHE_SPECS):
            kinds = ", ".join(kind.__name__ for kind in CACHE_SPECS)
            raise TypeError(f"spec must be one of {kinds}, got {type(spec).__name__} {spec!r}")
        weight = self.tok_emb.weight
        return spec.build(self, batch_size, dtype or weight.dtype, weight.device)

    def _check_targets(self, idx: Tensor, targets: Tensor) -> Tensor:
        """``targets`` as int64 ``[B, T]`` ids in ``[0, vocab_size)`` or ``-1``, else a one-line error."""
        if (
            not isinstance(targets, Tensor)
            or targets.dtype.is_floating_point
            or targets.dtype.is_complex
            or targets.dtype == torch.bool
        ):
            kind = targets.dtype if isinstance(targets, Tensor) else type(targets).__name__
            raise TypeError(f"targets must hold integer token ids (-1 = ignored), got {kind}")
        if targets.shape != idx.shape:
            raise ValueError(f"targets must have the shape of idx {tuple(idx.shape)}, got {tuple(targets.shape)}")
        if targets.device.type == "cpu" and targets.numel() and not _traced(targets):
            low, high = int(targets.min()), int(targets.max())
            if low < -1 or high >= self.config.vocab_size:
                bad = high if high >= self.config.vocab_size else low
                raise ValueError(
                    f"target id {bad} is outside the vocabulary: targets must lie in "
                    f"[0, {self.config.vocab_size}) or be -1 (ignored)"
                )
        return targets.long()

    def layer_position(self, i: int) -> PositionScheme:
        """The scheme layer ``i`` runs: its ``layer_pattern`` one, else the model's ``position.for_layer(i)``."""
        key = str(i)
        return self.layer_positions[key] if key in self.layer_positions else self.position.for_layer(i)

    def forward(
        self,
        idx: Tensor,
        targets: Tensor | None = None,
        *,
        pos: Tensor | None = None,
        cache: list[KVCache] | SegmentMemory | None = None,
        mask: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Run the model.

        Args:
            idx: token ids ``[B, T]`` (int64).
            targets: next-token ids ``[B, T]`` (``-1`` ignored) to also return the loss.
            pos: explicit positions ``[T]`` (default: ``arange(T)`` after any cached tokens).
            cache: the past the tokens attend, by type: per-layer KV caches from :meth:`make_cache`
                (decoding; ``pos`` defaults to ``cache[0].length + arange(T)``), or a Transformer-XL
                segment memory (:class:`~poslab.nn.memory.SegmentMemory`, training and evaluation):
                every layer also attends its remembered inputs, then the memory is updated in place
                with this segment's (detached); ``pos`` defaults to ``memory.length + arange(T)``.
            mask: passed to every attention layer (``[T, Tk]`` or ``[B|1, h|1, T, Tk]``, bool or float;
                see :meth:`~poslab.nn.attention.MultiHeadAttention.forward`). The backend is each
                layer's config's (:func:`~poslab.nn.attention.use_backend` changes it for a block).

        Returns:
            logits ``[B, T, V]``, or ``(logits, loss)`` when ``targets`` is given.
        """
        if not isinstance(idx, Tensor) or idx.dim() != 2:
            raise ValueError(
                f"idx must be a [B, T] tensor of token ids, got {getattr(idx, 'shape', type(idx).__name__)}"
            )
        if idx.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
            raise TypeError(f"idx must hold integer token ids, got dtype {idx.dtype}")
        if idx.dtype in (torch.int16, torch.uint8):
            idx = idx.long()  # the embedding takes int32/int64 indices
        if targets is not None:
            targets = self._check_targets(idx, targets)
        B, T = idx.shape
        checking = not _traced(idx)  # value checks are data-dependent: skipped inside torch.compile and vmap
        if (
            checking
            and idx.device.type == "cpu"
            and idx.numel()
            and (int(idx.max()) >= self.config.vocab_size or int(idx.min()) < 0)
        ):
            # checked on CPU only: on an accelerator this would add a host sync to every forward
            bad = int(idx.max()) if int(idx.max()) >= self.config.vocab_size else int(idx.min())
            raise ValueError(f"token id {bad} is outside the vocabulary: ids must lie in [0, {self.config.vocab_size})")
        memory: SegmentMemory | None = None
        if isinstance(cache, SegmentMemory):
            memory, cache = cache, None
            if self.config.mla is not None:
                raise ValueError("segment memory needs standard attention; this model uses mla")
            memory.check(B, len(self.blocks))
        elif cache is not None:
            if not isinstance(cache, (list, tuple)):
                raise TypeError(
                    "cache must be the per-layer list make_cache returns or a SegmentMemory, "
                    f"got {type(cache).__name__}"
                )
            if len(cache) != len(self.blocks):
                raise ValueError(f"cache has {len(cache)} layers, the model has {len(self.blocks)}")
        layer_pos = pos
        if pos is None:
            start = cache[0].length if cache else memory.length if memory is not None else 0
            pos = torch.arange(start, start + T, device=idx.device)
            # from 0 with nothing before: each layer makes the same arange and knows it increasing (no
            # data-dependent check, no graph break under compile)
            layer_pos = None if cache is None and start == 0 else pos
        x = self.tok_emb(idx)  # [B, T, d]
        if self.config.embed_scale is not None:
            x = x * torch.tensor(self.config.embed_scale, dtype=x.dtype)  # Gemma: sqrt(d) rounded to the dtype
        if self.config.norm.embed:
            x = self.embed_norm(x)  # [B, T, d]
        x = self.drop(self.position.embed(x, pos))  # [B, T, d]
        inputs: list[Tensor] = []  # each layer's input, for the segment memory
        for i, block in enumerate(self.blocks):
            layer_cache = cache[i] if cache is not None else None
            if memory is not None:
                inputs.append(x)
                mem, mem_pos = memory.layer(i)
                layer_cache = SegmentInputs(mem, mem_pos) if mem is not None else None  # None: nothing yet
            x = block(x, layer_pos, layer_cache, mask)
        if memory is not None:
            memory.update(inputs, pos)
        logits = self.lm_head(self.norm_f(x))  # [B, T, V]
        if self.config.final_softcap is not None:
            logits = torch.tanh(logits / self.config.final_softcap) * self.config.final_softcap
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
        return logits, loss
