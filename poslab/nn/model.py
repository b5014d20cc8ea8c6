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

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from poslab.config_keys import reject_unknown_keys
from poslab.nn import positions
from poslab.nn.attention import BACKENDS, AttentionConfig, KVCache, MultiHeadAttention, validate_geometry
from poslab.nn.memory import SegmentMemory
from poslab.nn.positions.base import PositionScheme

NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu")
#: MLP activations: exact GELU (BERT, GPT-NeoX, MPT), tanh-approximated GELU (GPT-2 ``gelu_new``,
#: GPT-J, Bloom), SiLU (Llama's SwiGLU gate), ReLU.
ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_tanh": functools.partial(F.gelu, approximate="tanh"),
    "silu": F.silu,
    "relu": F.relu,
}
#: How a block combines its two branches: ``x + attn(n1(x))`` then ``+ mlp(n2(.))`` (sequential, GPT-2 /
#: Llama); ``x + attn(n1(x)) + mlp(n2(x))`` (parallel, GPT-NeoX); ``x + attn(n(x)) + mlp(n(x))``
#: (parallel_shared_norm, GPT-J: one norm feeds both branches).
RESIDUALS = ("sequential", "parallel", "parallel_shared_norm", "sandwich")
#: ``GPTConfig`` fields a ``layer_pattern`` entry may override for its layers.
LAYER_KEYS = ("position", "position_config", "window", "attn_chunk", "attn_temperature", "qk_norm")


def _traced(t: Tensor) -> bool:
    """Whether ``t`` is being traced (``torch.compile``) or batched (``torch.vmap``): no data-dependent checks then.

    A value check reads a tensor's contents (``int(t.max())``), which neither transform allows; the
    caller of a vmapped forward checks the stacked ids once.
    """
    return torch.compiler.is_compiling() or torch._C._functorch.is_batchedtensor(t)


def default_activation(mlp: str) -> str:
    """The activation of an MLP kind when none is given: ``silu`` for swiglu, exact ``gelu`` otherwise.

    Exact GELU (nanoGPT's ``nn.GELU()``, BERT) rather than GPT-2's tanh approximation: its CPU kernels
    take less than half the time (profiled: 32 ms vs 14 ms forward at 4/4/128 over 3 steps).
    GPT-2 checkpoints keep ``gelu_tanh``: ``poslab.from_hf`` sets ``activation`` from the checkpoint.
    """
    return "silu" if mlp == "swiglu" else "gelu"


#: the largest ``attn_scale`` / ``embed_scale`` / soft-cap (its inverse the smallest): scores of |q.k| ~ 1e4 and
#: activations squared by the norms stay well inside fp32 (3.4e38, and above its 1.2e-38) between them
MAX_SCALE = 1e6


def check_fp32_factor(key: str, value: float | None) -> None:
    """Raise ``ValueError`` unless a positive factor of scores or activations lies in ``[1/MAX_SCALE, MAX_SCALE]``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not 1 / MAX_SCALE <= value <= MAX_SCALE:
        raise ValueError(
            f"{key} must be at most {MAX_SCALE:g} and at least {1 / MAX_SCALE:g} (a larger factor "
            f"overflows fp32 scores or activations to inf, a smaller one underflows them to 0; "
            f"either gives NaN), got {value!r}"
        )


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
        position: registry name of the position scheme (see ``poslab.nn.positions.names()``).
        position_config: the scheme's config as a dict or its dataclass.
        norm: ``"layernorm"`` or ``"rmsnorm"``.
        mlp: ``"gelu"`` (4x, GPT-2) or ``"swiglu"`` (Llama).
        mlp_hidden: MLP hidden width (default ``4*n_embd`` for gelu, ``int(8/3*n_embd)`` rounded up to 8 for swiglu).
        tie_embeddings: share the token embedding with the LM head.
        backend: attention backend (``auto``, ``sdpa``, ``eager``, ``flex``). ``auto`` (default) is
            ``sdpa`` on CPU and FlexAttention on CUDA (see :mod:`poslab.nn.attention`).
        window: sliding-window size ``W`` (``None`` = full causal).
        causal: causal language model (False gives bidirectional attention).
        norm_eps: epsilon of the norms.
        attn_bias, mlp_bias, norm_bias: biases of the attention projections, the MLP and the
            LayerNorms (``None`` = follow ``bias``); Llama has none, GPT-J has MLP and norm biases only.
        lm_head_bias: a bias on the LM head (GPT-J).
        activation: MLP activation, one of :data:`ACTIVATIONS` (``None``: exact ``gelu`` for the gelu
            MLP, ``silu`` for swiglu; resolved at construction, so a saved config names it). GPT-2's
            ``gelu_tanh`` must be asked for (``from_hf`` does).
        residual: block layout, one of :data:`RESIDUALS` (``sequential`` pre-norm by default).
        embed_norm: a norm right after the token embedding (Bloom's ``word_embeddings_layernorm``).
        attn_scale: softmax scale (``None`` = ``1/sqrt(head_dim)``; MPT's ``softmax_scale``).
        clip_qkv: clamp the fused q/k/v projection to ``[-clip_qkv, clip_qkv]`` (MPT).
        attn_head_dim: per-head width (``None`` = ``n_embd // n_head``; Gemma, Qwen3 decouple it).
        attn_softcap: attention-logit soft-capping ``c * tanh(s / c)`` (Gemma 2: 50); runs in the
            eager/flex backends (``auto`` picks one; ``sdpa`` is refused).
        final_softcap: the same on the final logits (Gemma 2: 30).
        qk_norm: RMSNorm per head on q and k before the rotation (Qwen3, Gemma 3).
        qk_norm_affine: learned gains on the QK-norms (False: Llama 4's weightless L2 norm).
        attn_sinks: a learned per-head sink logit in every softmax denominator (gpt-oss).
        attn_chunk: chunked local attention, ``j // C == i // C`` (Llama 4).
        attn_temperature: ``[floor_scale, attn_scale]``: Llama 4's attention-temperature tuning.
        embed_scale: multiply the token embeddings by this (Gemma: ``sqrt(n_embd)``).
        layer_pattern: per-layer overrides, a list of dicts with keys from :data:`LAYER_KEYS`
            (``position``, ``position_config``, ``window``, ``attn_chunk``, ``attn_temperature``,
            ``qk_norm``); layer
            ``i`` takes entry ``i % len(layer_pattern)``, so ``[{"window": 4096}, {}]`` is Gemma 2's
            local/global alternation and a list of ``n_layer`` entries spells out every layer. A
            per-layer scheme must be one that acts inside attention (no ``embed``).
        mla: multi-head latent attention (DeepSeek-V2/V3) instead of MHA: a dict with
            ``kv_lora_rank``, ``q_lora_rank`` (``None`` = full query projection), ``qk_nope_head_dim``,
            ``qk_rope_head_dim``, ``v_head_dim``, optional ``latent_eps`` (see ``poslab.nn.mla``); the scheme's
            ``head_dim`` is ``qk_rope_head_dim`` and ``make_cache`` returns compressed latent caches.
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
    backend: str = "auto"
    window: int | None = None
    causal: bool = True
    norm_eps: float = 1e-5
    attn_bias: bool | None = None
    mlp_bias: bool | None = None
    norm_bias: bool | None = None
    lm_head_bias: bool = False
    activation: str | None = None
    residual: str = "sequential"
    embed_norm: bool = False
    attn_scale: float | None = None
    clip_qkv: float | None = None
    attn_head_dim: int | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    qk_norm: bool = False
    qk_norm_affine: bool = True
    attn_sinks: bool = False
    attn_chunk: int | None = None
    attn_temperature: list[float] | None = None
    embed_scale: float | None = None
    layer_pattern: list[dict[str, Any]] | None = None
    mla: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for key in ("vocab_size", "n_layer", "block_size"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{key} must be a positive integer, got {value!r}")
        validate_geometry(self.n_embd, self.n_head, self.kv_heads)
        if (
            isinstance(self.dropout, bool)
            or not isinstance(self.dropout, (int, float))
            or not 0.0 <= self.dropout < 1.0
        ):
            raise ValueError(f"dropout must be a number in [0, 1), got {self.dropout!r}")
        if (
            isinstance(self.norm_eps, bool)
            or not isinstance(self.norm_eps, (int, float))
            or not 0.0 < self.norm_eps < math.inf
        ):
            raise ValueError(f"norm_eps must be a positive number (e.g. 1e-5), got {self.norm_eps!r}")
        if self.norm not in NORMS:
            raise ValueError(f"norm={self.norm!r} is not allowed; choose one of {list(NORMS)}")
        if self.mlp not in MLPS:
            raise ValueError(f"mlp={self.mlp!r} is not allowed; choose one of {list(MLPS)}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r} is not allowed; choose one of {list(BACKENDS)}")
        if self.window is not None and (
            isinstance(self.window, bool) or not isinstance(self.window, int) or self.window <= 0
        ):
            raise ValueError(f"window must be a positive integer, got {self.window!r}")
        if self.mlp_hidden is not None and (
            isinstance(self.mlp_hidden, bool) or not isinstance(self.mlp_hidden, int) or self.mlp_hidden <= 0
        ):
            raise ValueError(f"mlp_hidden must be a positive integer or None, got {self.mlp_hidden!r}")
        for key in ("bias", "lm_head_bias", "embed_norm"):
            if not isinstance(getattr(self, key), bool):
                raise TypeError(f"{key} must be a bool, got {getattr(self, key)!r}")
        for key in ("attn_bias", "mlp_bias", "norm_bias"):
            if getattr(self, key) is not None and not isinstance(getattr(self, key), bool):
                raise TypeError(f"{key} must be a bool or None (follow `bias`), got {getattr(self, key)!r}")
        if self.activation is not None and (not isinstance(self.activation, str) or self.activation not in ACTIVATIONS):
            raise ValueError(
                f"activation={self.activation!r} is not allowed; choose one of {list(ACTIVATIONS)} (or None)"
            )
        if self.activation is None:
            self.activation = default_activation(self.mlp)
        if self.residual not in RESIDUALS:
            raise ValueError(f"residual={self.residual!r} is not allowed; choose one of {list(RESIDUALS)}")
        for key in ("attn_scale", "clip_qkv"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
                raise ValueError(f"{key} must be a positive number or None, got {value!r}")
        check_fp32_factor("attn_scale", self.attn_scale)
        if not isinstance(self.causal, bool):
            raise TypeError(f"causal must be a bool (False = bidirectional attention), got {self.causal!r}")
        positions.get(self.position)  # unknown names fail here, listing the known ones
        if dataclasses.is_dataclass(self.position_config):
            self.position_config = dataclasses.asdict(self.position_config)
        if not isinstance(self.position_config, dict):
            raise TypeError(
                f"position_config must be a dict or the scheme's dataclass, got {type(self.position_config).__name__}"
            )
        # validates keys and values now, with the model's dimensions filled in; the throwaway scheme is
        # built on the meta device: no memory for its tables (however large block_size is) and no
        # draw from the global RNG (a config is rebuilt between training steps, e.g. on checkpoints)
        if self.mla is not None:  # the scheme's head_dim is mla's qk_rope_head_dim: check mla first
            from poslab.nn.mla import validate_mla

            self.mla = validate_mla(self.mla)
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            try:
                scheme = positions.build_for_model(self.position, self.position_config, self.position_context())
                scheme.check_layer(self.n_head, self.position_context()["head_dim"], self.causal)
            except (RuntimeError, OverflowError) as err:  # torch refusing a value the scheme did not check
                message = str(err).splitlines()[0] if str(err) else type(err).__name__
                raise ValueError(
                    f"position_config {self.position_config!r} is not usable for {self.position!r}: {message}"
                ) from None
        self._validate_modern()

    def _validate_modern(self) -> None:
        """Checks of the attention-mechanism fields and of ``layer_pattern`` (each names the field)."""
        from poslab.nn.attention import validate_chunk, validate_head_dim, validate_temperature_tuning

        if self.attn_head_dim is not None:
            validate_head_dim(self.attn_head_dim)
        for key in ("attn_softcap", "final_softcap", "embed_scale"):
            value = getattr(self, key)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf
            ):
                raise ValueError(f"{key} must be a positive finite number or None, got {value!r}")
            check_fp32_factor(key, value)
        for key in ("qk_norm", "qk_norm_affine", "attn_sinks"):
            if not isinstance(getattr(self, key), bool):
                raise TypeError(f"{key} must be a bool, got {getattr(self, key)!r}")
        validate_chunk(self.attn_chunk, "attn_chunk")
        validate_temperature_tuning(self.attn_temperature, "attn_temperature")
        if self.attn_temperature is not None:
            self.attn_temperature = [float(x) for x in self.attn_temperature]
        if self.mla is not None:
            self._validate_mla()
        if self.layer_pattern is None:
            return
        if (
            not isinstance(self.layer_pattern, (list, tuple))
            or not self.layer_pattern
            or len(self.layer_pattern) > self.n_layer
        ):
            raise ValueError(
                f"layer_pattern must be a non-empty list of at most n_layer={self.n_layer} dicts (or None), "
                f"got {self.layer_pattern!r}"
            )
        self.layer_pattern = [dict(entry) if isinstance(entry, dict) else entry for entry in self.layer_pattern]
        for i, entry in enumerate(self.layer_pattern):
            if not isinstance(entry, dict):
                raise TypeError(f"layer_pattern[{i}] must be a dict of GPTConfig overrides, got {entry!r}")
            reject_unknown_keys(entry, list(LAYER_KEYS), "layer_pattern key", where=f" in layer_pattern[{i}]")
            if dataclasses.is_dataclass(entry.get("position_config")):
                entry["position_config"] = dataclasses.asdict(entry["position_config"])
            values = {key: entry[key] for key in entry}
            if "position" in entry and "position_config" not in entry:
                values["position_config"] = {}  # another scheme than the global one starts from its defaults
            try:  # the same checks as the global fields, with this entry's values in place
                dataclasses.replace(self, layer_pattern=None, **values)
            except (ValueError, TypeError) as err:
                raise type(err)(f"layer_pattern[{i}]: {err}") from None
            if "position" in entry or "position_config" in entry:
                cls = positions.get(entry.get("position", self.position))
                if cls.embed is not PositionScheme.embed:
                    raise ValueError(
                        f"layer_pattern[{i}]: position {cls.name!r} adds embeddings, which are shared by all "
                        "layers; a per-layer scheme must act inside attention (rotate / score_bias)"
                    )

    def _validate_mla(self) -> None:
        from poslab.nn.mla import validate_mla

        self.mla = validate_mla(self.mla)
        clash = [
            key
            for key in (
                "attn_softcap",
                "qk_norm",
                "attn_sinks",
                "attn_chunk",
                "attn_temperature",
                "clip_qkv",
                "attn_head_dim",
            )
            if getattr(self, key) not in (None, False)
        ]
        if self.n_kv_head not in (None, self.n_head):
            clash.append("n_kv_head")
        if self.layer_pattern is not None and any(
            set(e) - {"window", "position", "position_config"} for e in self.layer_pattern if isinstance(e, dict)
        ):
            clash.append("layer_pattern (beyond window/position)")
        if clash:
            raise ValueError(f"mla (multi-head latent attention) does not combine with {', '.join(clash)}")
        if positions.get(self.position).has_bias:
            raise ValueError(f"mla runs rotary (or no) position schemes; position={self.position!r} adds a bias")

    def layer(self, i: int) -> dict[str, Any]:
        """The ``layer_pattern`` overrides of layer ``i`` (``{}`` without a pattern)."""
        if self.layer_pattern is None:
            return {}
        return self.layer_pattern[i % len(self.layer_pattern)]

    def layer_value(self, i: int, key: str) -> Any:
        """Field ``key`` as layer ``i`` sees it: its ``layer_pattern`` override, else the global value."""
        entry = self.layer(i)
        if key == "position_config" and "position" in entry and "position_config" not in entry:
            return {}  # another scheme than the global one starts from its defaults
        return entry.get(key, getattr(self, key))

    @property
    def kv_heads(self) -> int:
        """``n_kv_head`` or ``n_head``."""
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def head_dim(self) -> int:
        return self.attn_head_dim if self.attn_head_dim is not None else self.n_embd // self.n_head

    @property
    def mlp_activation(self) -> str:
        """``activation`` or the MLP kind's default (``gelu_tanh`` for gelu, ``silu`` for swiglu)."""
        return self.activation if self.activation is not None else default_activation(self.mlp)

    def bias_of(self, part: str) -> bool:
        """Whether ``part`` (``"attn"``, ``"mlp"`` or ``"norm"``) has biases: its flag, else ``bias``."""
        flag = getattr(self, f"{part}_bias")
        return self.bias if flag is None else flag

    def max_positions(self) -> int | None:
        """The position scheme's table size (``None``: unbounded), from the scheme built on the meta device."""
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            return positions.build_for_model(self.position, self.position_config, self.position_context()).max_positions

    def position_context(self) -> dict[str, Any]:
        """The model dimensions a scheme's config may take."""
        return {
            "n_embd": self.n_embd,
            "n_heads": self.n_head,
            "head_dim": self.head_dim if self.mla is None else self.mla["qk_rope_head_dim"],
            "n_layer": self.n_layer,  # per-layer scheme parameters (Transformer-XL's W_R)
            "max_len": self.block_size,
            "original_max_len": self.block_size,  # the context the positions are trained at (RoPE scalings, log-n)
            "bidirectional": not self.causal,
        }

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> GPTConfig:
        """Build from a dict; unknown keys raise ``ValueError`` suggesting the close key."""
        reject_unknown_keys(values, [f.name for f in dataclasses.fields(cls)], "GPTConfig key")
        return cls(**values)


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
        hidden = cfg.mlp_hidden or (4 * cfg.n_embd if cfg.mlp == "gelu" else 8 * math.ceil(8 * cfg.n_embd / 3 / 8))
        norm_bias = cfg.bias_of("norm")
        self.residual = cfg.residual
        self.norm1 = make_norm(cfg.norm, cfg.n_embd, norm_bias, cfg.norm_eps)
        if cfg.mla is not None:
            self.attn = latent_attention(cfg, layer)
        else:
            self.attn = MultiHeadAttention(
                cfg.n_embd,
                cfg.n_head,
                cfg.kv_heads,
                attention_config(cfg, layer),
                bias=cfg.bias_of("attn"),
                head_dim=cfg.attn_head_dim,
            )
        if cfg.clip_qkv is not None:
            fused = self.attn.qkv
            self.attn.qkv = ClippedLinear(fused.in_features, fused.out_features, fused.bias is not None, cfg.clip_qkv)
        if cfg.residual != "parallel_shared_norm":
            self.norm2 = make_norm(cfg.norm, cfg.n_embd, norm_bias, cfg.norm_eps)
        self.mlp = MLP(cfg.n_embd, hidden, cfg.mlp, cfg.bias_of("mlp"), cfg.dropout, cfg.mlp_activation)
        self.resid_drop = nn.Dropout(cfg.dropout)
        if cfg.residual == "sandwich":
            self.post_attn_norm = make_norm(cfg.norm, cfg.n_embd, norm_bias, cfg.norm_eps)
            self.post_mlp_norm = make_norm(cfg.norm, cfg.n_embd, norm_bias, cfg.norm_eps)

    def forward(
        self,
        x: Tensor,
        pos: Tensor,
        position: PositionScheme,
        cache: KVCache | None = None,
        memory: Tensor | None = None,
        memory_pos: Tensor | None = None,
        **attn_kwargs: Any,
    ) -> Tensor:
        """``x [B, T, d]`` -> ``[B, T, d]``; ``memory [B, M, d]`` (this block's earlier inputs) is normed like ``x``."""
        h = self.norm1(x)
        if memory is not None:
            attn_kwargs = {**attn_kwargs, "memory": self.norm1(memory), "memory_pos": memory_pos}
        attn_out = self.resid_drop(self.attn(h, pos, position=position, cache=cache, **attn_kwargs))
        if self.residual == "parallel_shared_norm":
            return x + attn_out + self.mlp(h)
        if self.residual == "parallel":
            return x + attn_out + self.mlp(self.norm2(x))
        if self.residual == "sandwich":
            x = x + self.post_attn_norm(attn_out)
            return x + self.post_mlp_norm(self.mlp(self.norm2(x)))
        x = x + attn_out
        return x + self.mlp(self.norm2(x))


def attention_config(cfg: GPTConfig, layer: int) -> AttentionConfig:
    """Layer ``layer``'s :class:`AttentionConfig` (its ``layer_pattern`` overrides applied): the one
    place where GPTConfig's flat field names meet the attention layer's."""
    temperature = cfg.layer_value(layer, "attn_temperature")
    return AttentionConfig(
        causal=cfg.causal,
        window=cfg.layer_value(layer, "window"),
        chunk=cfg.layer_value(layer, "attn_chunk"),
        softcap=cfg.attn_softcap,
        scale=cfg.attn_scale,
        sinks=cfg.attn_sinks,
        dropout=cfg.dropout,
        qk_norm=cfg.layer_value(layer, "qk_norm"),
        qk_norm_eps=cfg.norm_eps,
        qk_norm_affine=cfg.qk_norm_affine,
        temperature_tuning=tuple(temperature) if temperature is not None else None,
        backend=cfg.backend,
    )


def latent_attention(cfg: GPTConfig, layer: int) -> nn.Module:
    """Layer ``layer``'s :class:`~poslab.nn.mla.MultiHeadLatentAttention` (``cfg.mla`` set)."""
    from poslab.nn.mla import MultiHeadLatentAttention

    return MultiHeadLatentAttention(
        cfg.n_embd, cfg.n_head, attention_config(cfg, layer), bias=cfg.bias_of("attn"), **cfg.mla
    )


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
        if config.embed_norm:
            self.embed_norm = make_norm(config.norm, config.n_embd, config.bias_of("norm"), config.norm_eps)
        self.position = positions.build_for_model(config.position, config.position_config, config.position_context())
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self.layer_positions = build_layer_positions(config)
        for i, block in enumerate(self.blocks):
            block.attn.fit(self.layer_position(i))  # the layer's scheme takes the layer's geometry
        self.norm_f = make_norm(config.norm, config.n_embd, config.bias_of("norm"), config.norm_eps)
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
        return scheme

    def num_params(self, non_embedding: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.tok_emb.weight.numel() if not self.config.tie_embeddings else 0
        return n

    def make_cache(
        self,
        batch_size: int,
        capacity: int | None = None,
        dtype: torch.dtype | None = None,
        *,
        sinks: int | None = None,
        window: int | None = None,
        memory: int | None = None,
    ) -> list[KVCache]:
        """One preallocated :class:`KVCache` per layer.

        ``memory=M`` makes Transformer-XL segment-memory caches (rolling rings of ``M`` entries with
        ``memory=True``): each forward of a segment attends the previous ``M`` tokens plus itself,
        the cached form of :class:`~poslab.nn.memory.SegmentMemory` (``capacity`` is then ignored).

        With a sliding window the caches are rolling ring buffers of ``window`` entries (``capacity``
        is then ignored): decoding runs for any length in constant memory.

        ``window=w`` (with ``sinks=k``, default 0) makes StreamingLLM caches instead
        (:class:`~poslab.nn.streaming.StreamingKVCache`, Xiao et al. 2023): the first ``k`` tokens
        plus the last ``w``, positions by place in the cache; ``sinks=0`` is plain window attention.
        """
        if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0):
            raise ValueError(f"capacity must be a positive integer (or None = block_size), got {capacity!r}")
        cfg = self.config
        device = self.tok_emb.weight.device
        dtype = dtype or self.tok_emb.weight.dtype
        if memory is not None:
            if isinstance(memory, bool) or not isinstance(memory, int) or memory <= 0:
                raise ValueError(f"memory (the segment memory's length M) must be a positive integer, got {memory!r}")
            if window is not None or sinks is not None or cfg.mla is not None:
                raise ValueError(
                    "a segment-memory cache (memory=M) takes no window/sinks and needs standard attention (not mla)"
                )
            return [
                KVCache(batch_size, cfg.kv_heads, cfg.head_dim, memory, dtype, device, rolling=True, memory=True)
                for _ in self.blocks
            ]
        if sinks is not None and window is None:
            raise ValueError(
                f"sinks={sinks!r} needs window=W (the StreamingLLM cache keeps the first sinks plus the last W tokens)"
            )
        if window is not None:
            from poslab.nn.streaming import StreamingKVCache

            reason = (
                "mla"
                if cfg.mla is not None
                else "layer_pattern"
                if cfg.layer_pattern is not None
                else "window"
                if cfg.window is not None
                else "attn_chunk"
                if cfg.attn_chunk is not None
                else None
            )
            if reason is not None:
                raise ValueError(
                    f"a streaming cache (window={window}) needs a full-attention model; this one sets {reason}"
                )
            return [
                StreamingKVCache(batch_size, cfg.kv_heads, cfg.head_dim, sinks or 0, window, dtype, device)
                for _ in self.blocks
            ]
        if cfg.mla is not None:
            from poslab.nn.mla import LatentKVCache

            mla = cfg.mla
            return [
                LatentKVCache(
                    batch_size, mla["kv_lora_rank"], mla["qk_rope_head_dim"], capacity or cfg.block_size, dtype, device
                )
                for _ in self.blocks
            ]
        if cfg.layer_pattern is not None:
            return self._make_layer_caches(batch_size, capacity, dtype, device)
        if cfg.window is not None:  # rolling: only the last `window` keys are ever attended
            return [
                KVCache(batch_size, cfg.kv_heads, cfg.head_dim, cfg.window, dtype, device, rolling=True)
                for _ in self.blocks
            ]
        capacity = capacity or cfg.block_size
        return [KVCache(batch_size, cfg.kv_heads, cfg.head_dim, capacity, dtype, device) for _ in self.blocks]

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

    def _make_layer_caches(
        self, batch_size: int, capacity: int | None, dtype: torch.dtype, device: torch.device
    ) -> list[KVCache]:
        """Per-layer caches: a rolling ring of ``window`` entries on windowed layers, ``capacity`` elsewhere."""
        cfg = self.config
        caches = []
        for block in self.blocks:
            window = block.attn.window
            if window is not None:
                caches.append(KVCache(batch_size, cfg.kv_heads, cfg.head_dim, window, dtype, device, rolling=True))
            else:
                caches.append(
                    KVCache(batch_size, cfg.kv_heads, cfg.head_dim, capacity or cfg.block_size, dtype, device)
                )
        return caches

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
        cache: list[KVCache] | None = None,
        memory: SegmentMemory | None = None,
        **attn_kwargs: Any,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Run the model.

        Args:
            idx: token ids ``[B, T]`` (int64).
            targets: next-token ids ``[B, T]`` (``-1`` ignored) to also return the loss.
            pos: explicit positions ``[T]`` (default: ``arange(T)`` after any cached tokens).
            cache: per-layer KV caches from :meth:`make_cache` (decoding).
            memory: Transformer-XL segment memory (:class:`~poslab.nn.memory.SegmentMemory`): every
                layer also attends its remembered inputs, then ``memory`` is updated in place with
                this segment's (detached); ``pos`` defaults to ``memory.length + arange(T)``.
            attn_kwargs: passed to every attention layer (``attn_mask``, ``backend``).

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
        if cache is not None and len(cache) != len(self.blocks):
            raise ValueError(f"cache has {len(cache)} layers, the model has {len(self.blocks)}")
        if memory is not None:
            if cache is not None:
                raise ValueError(
                    "segment memory and a KV cache cannot be combined: the cache already holds the past "
                    "(make_cache(B, memory=M) is the cached form of the memory)"
                )
            if self.config.mla is not None:
                raise ValueError("segment memory needs standard attention; this model uses mla")
            memory.check(B, len(self.blocks))
        if pos is None:
            start = cache[0].length if cache else memory.length if memory is not None else 0
            pos = torch.arange(start, start + T, device=idx.device)
            if cache is None:  # increasing by construction: attention need not look (no graph break under compile)
                attn_kwargs.setdefault("pos_increasing", True)
        x = self.tok_emb(idx)  # [B, T, d]
        if self.config.embed_scale is not None:
            x = x * torch.tensor(self.config.embed_scale, dtype=x.dtype)  # Gemma: sqrt(d) rounded to the dtype
        if self.config.embed_norm:
            x = self.embed_norm(x)  # [B, T, d]
        x = self.drop(self.position.embed(x, pos))  # [B, T, d]
        inputs: list[Tensor] = []  # each layer's input, for the segment memory
        for i, block in enumerate(self.blocks):
            layer_cache = cache[i] if cache is not None else None
            if memory is not None:
                inputs.append(x)
                mem, mem_pos = memory.layer(i)
                x = block(x, pos, self.layer_position(i), layer_cache, mem, mem_pos, **attn_kwargs)
            else:
                x = block(x, pos, self.layer_position(i), layer_cache, **attn_kwargs)
        if memory is not None:
            memory.update(inputs, pos)
        logits = self.lm_head(self.norm_f(x))  # [B, T, V]
        if self.config.final_softcap is not None:
            logits = torch.tanh(logits / self.config.final_softcap) * self.config.final_softcap
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
        return logits, loss
