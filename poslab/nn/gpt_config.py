"""``GPTConfig``: the settings of :class:`~poslab.nn.model.GPT`, validated once when it is made.

Its defaults are nanoGPT's; the fields beyond nanoGPT's let published families load exactly
(``poslab.from_hf``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from poslab.config_keys import reject_unknown_keys
from poslab.nn import positions
from poslab.nn.attention import BACKENDS, validate_geometry
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
