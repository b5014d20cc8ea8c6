"""A small GPT whose position scheme is injected, never special-cased.

Token embedding -> ``position.embed`` -> ``n_layer`` pre-norm blocks (attention with the scheme's
``rotate``/``score_bias`` hooks, then an MLP) -> final norm -> LM head (tied by default).
Field names follow nanoGPT where they exist.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from poslab import positions
from poslab.attention import BACKENDS, KVCache, MultiHeadAttention, validate_geometry
from poslab.positions.base import PositionScheme

NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu")


@dataclass
class GPTConfig:
    """Configuration of :class:`GPT` (validated at construction).

    Attributes:
        vocab_size: number of tokens.
        n_layer, n_head, n_embd: depth, query heads, width (``n_embd % n_head == 0``).
        block_size: training context; also the default ``max_len`` of bounded schemes.
        dropout: dropout on embeddings, attention weights and residual branches.
        bias: biases in linear layers and LayerNorm.
        n_kv_head: key/value heads for GQA/MQA (``None`` = ``n_head``).
        position: registry name of the position scheme (see ``poslab.positions.names()``).
        position_config: the scheme's config as a dict or its dataclass.
        norm: ``"layernorm"`` or ``"rmsnorm"``.
        mlp: ``"gelu"`` (4x, GPT-2) or ``"swiglu"`` (Llama).
        mlp_hidden: MLP hidden width (default ``4*n_embd`` for gelu, ``int(8/3*n_embd)`` rounded up to 8 for swiglu).
        tie_embeddings: share the token embedding with the LM head.
        backend: attention backend (``sdpa``, ``eager``, ``flex``).
        window: sliding-window size ``W`` (``None`` = full causal).
        causal: causal language model (False gives bidirectional attention).
        norm_eps: epsilon of the norms.
    """

    vocab_size: int = 65
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 128
    dropout: float = 0.0
    bias: bool = True
    n_kv_head: int | None = None
    position: str = "learned"
    position_config: Any = field(default_factory=dict)
    norm: str = "layernorm"
    mlp: str = "gelu"
    mlp_hidden: int | None = None
    tie_embeddings: bool = True
    backend: str = "sdpa"
    window: int | None = None
    causal: bool = True
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for key in ("vocab_size", "n_layer", "block_size"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{key} must be a positive integer, got {value!r}")
        validate_geometry(self.n_embd, self.n_head, self.kv_heads)
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if self.norm not in NORMS:
            raise ValueError(f"norm={self.norm!r} is not allowed; choose one of {list(NORMS)}")
        if self.mlp not in MLPS:
            raise ValueError(f"mlp={self.mlp!r} is not allowed; choose one of {list(MLPS)}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r} is not allowed; choose one of {list(BACKENDS)}")
        if self.window is not None and (isinstance(self.window, bool) or not isinstance(self.window, int) or self.window <= 0):
            raise ValueError(f"window must be a positive integer, got {self.window!r}")
        if self.mlp_hidden is not None and self.mlp_hidden <= 0:
            raise ValueError(f"mlp_hidden must be > 0, got {self.mlp_hidden}")
        positions.get(self.position)  # unknown names fail here, listing the known ones
        if dataclasses.is_dataclass(self.position_config):
            self.position_config = dataclasses.asdict(self.position_config)
        if not isinstance(self.position_config, dict):
            raise TypeError(f"position_config must be a dict or the scheme's dataclass, got {type(self.position_config).__name__}")
        # validates keys and values now, with the model's dimensions filled in
        positions.build_for_model(self.position, self.position_config, self.position_context())

    @property
    def kv_heads(self) -> int:
        """``n_kv_head`` or ``n_head``."""
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def position_context(self) -> dict[str, Any]:
        """The model dimensions a scheme's config may take."""
        return {
            "n_embd": self.n_embd,
            "n_heads": self.n_head,
            "head_dim": self.head_dim,
            "max_len": self.block_size,
            "bidirectional": not self.causal,
        }

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> GPTConfig:
        """Build from a dict; unknown keys raise ``ValueError`` suggesting the close key."""
        allowed = [f.name for f in dataclasses.fields(cls)]
        for key in values:
            if key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"unknown GPTConfig key {key!r}{hint}; allowed: {', '.join(allowed)}")
        return cls(**values)


class MLP(nn.Module):
    """GELU MLP (GPT-2) or SwiGLU (Shazeer 2020, https://arxiv.org/abs/2002.05202)."""

    def __init__(self, n_embd: int, hidden: int, kind: str, bias: bool, dropout: float) -> None:
        super().__init__()
        self.kind = kind
        if kind == "swiglu":
            self.gate = nn.Linear(n_embd, hidden, bias=bias)
        self.up = nn.Linear(n_embd, hidden, bias=bias)
        self.down = nn.Linear(hidden, n_embd, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        if self.kind == "swiglu":
            hidden = F.silu(self.gate(x)) * self.up(x)
        else:
            hidden = F.gelu(self.up(x), approximate="tanh")
        return self.drop(self.down(hidden))


def make_norm(kind: str, n_embd: int, bias: bool, eps: float) -> nn.Module:
    if kind == "rmsnorm":
        return nn.RMSNorm(n_embd, eps=eps)
    return nn.LayerNorm(n_embd, eps=eps, bias=bias)


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        hidden = cfg.mlp_hidden or (4 * cfg.n_embd if cfg.mlp == "gelu" else 8 * math.ceil(8 * cfg.n_embd / 3 / 8))
        self.norm1 = make_norm(cfg.norm, cfg.n_embd, cfg.bias, cfg.norm_eps)
        self.attn = MultiHeadAttention(
            cfg.n_embd,
            cfg.n_head,
            cfg.kv_heads,
            causal=cfg.causal,
            dropout=cfg.dropout,
            bias=cfg.bias,
            backend=cfg.backend,
            window=cfg.window,
        )
        self.norm2 = make_norm(cfg.norm, cfg.n_embd, cfg.bias, cfg.norm_eps)
        self.mlp = MLP(cfg.n_embd, hidden, cfg.mlp, cfg.bias, cfg.dropout)
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, pos: Tensor, position: PositionScheme, cache: KVCache | None = None, **attn_kwargs: Any) -> Tensor:
        x = x + self.resid_drop(self.attn(self.norm1(x), pos, position=position, cache=cache, **attn_kwargs))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """Decoder-only transformer with an injected position scheme.

    ``model(idx)`` returns logits ``[B, T, V]``; ``model(idx, targets)`` returns ``(logits, loss)``.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.position = positions.build_for_model(config.position, config.position_config, config.position_context())
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm_f = make_norm(config.norm, config.n_embd, config.bias, config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
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
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.tok_emb.weight.numel() if not self.config.tie_embeddings else 0
        return n

    def make_cache(self, batch_size: int, capacity: int | None = None, dtype: torch.dtype | None = None) -> list[KVCache]:
        """One preallocated :class:`KVCache` per layer."""
        cfg = self.config
        device = self.tok_emb.weight.device
        dtype = dtype or self.tok_emb.weight.dtype
        capacity = capacity or cfg.block_size
        return [KVCache(batch_size, cfg.kv_heads, cfg.head_dim, capacity, dtype, device) for _ in self.blocks]

    def forward(
        self,
        idx: Tensor,
        targets: Tensor | None = None,
        *,
        pos: Tensor | None = None,
        cache: list[KVCache] | None = None,
        **attn_kwargs: Any,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Run the model.

        Args:
            idx: token ids ``[B, T]`` (int64).
            targets: next-token ids ``[B, T]`` (``-1`` ignored) to also return the loss.
            pos: explicit positions ``[T]`` (default: ``arange(T)`` after any cached tokens).
            cache: per-layer KV caches from :meth:`make_cache` (decoding).
            attn_kwargs: passed to every attention layer (``attn_mask``, ``backend``).

        Returns:
            logits ``[B, T, V]``, or ``(logits, loss)`` when ``targets`` is given.
        """
        if not isinstance(idx, Tensor) or idx.dim() != 2:
            raise ValueError(f"idx must be a [B, T] tensor of token ids, got {getattr(idx, 'shape', type(idx).__name__)}")
        if idx.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
            raise TypeError(f"idx must hold integer token ids, got dtype {idx.dtype}")
        B, T = idx.shape
        if cache is not None and len(cache) != len(self.blocks):
            raise ValueError(f"cache has {len(cache)} layers, the model has {len(self.blocks)}")
        if pos is None:
            start = cache[0].length if cache else 0
            pos = torch.arange(start, start + T, device=idx.device)
        x = self.tok_emb(idx)  # [B, T, d]
        x = self.drop(self.position.embed(x, pos))  # [B, T, d]
        for i, block in enumerate(self.blocks):
            x = block(x, pos, self.position, cache[i] if cache is not None else None, **attn_kwargs)
        logits = self.lm_head(self.norm_f(x))  # [B, T, V]
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
        return logits, loss
