"""``GPTConfig``: the settings of :class:`~poslab.nn.model.GPT`, validated once when it is made.

Its defaults are nanoGPT's. The settings of one part live in one frozen group, validated in the
group's ``__post_init__``: ``attention`` (:class:`~poslab.nn.attention.config.AttentionConfig`, the
type every attention layer takes, so a setting has one name at every layer), ``norm``
(:class:`NormConfig`) and ``mlp`` (:class:`MLPConfig`). The fields beyond nanoGPT's let published
families load exactly (``poslab.from_hf``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from poslab.checks import is_number, positive_int, positive_number
from poslab.config_keys import reject_unknown_keys
from poslab.nn import positions
from poslab.nn.attention import AttentionConfig, validate_geometry
from poslab.nn.attention.config import MAX_SCALE, check_fp32_factor
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
#: the :class:`AttentionConfig` fields a ``layer_pattern`` entry may override for its layers
LAYER_ATTENTION_KEYS = ("window", "chunk", "temperature_tuning", "qk_norm")
#: the keys of a ``layer_pattern`` entry: the layer's own position scheme and attention overrides
LAYER_KEYS = ("position", "position_config", *LAYER_ATTENTION_KEYS)
#: the grouped fields of :class:`GPTConfig` and their types
GROUPS: dict[str, type] = {}

__all__ = [
    "ACTIVATIONS",
    "GROUPS",
    "LAYER_ATTENTION_KEYS",
    "LAYER_KEYS",
    "MAX_SCALE",
    "MLPS",
    "NORMS",
    "RESIDUALS",
    "GPTConfig",
    "MLPConfig",
    "NormConfig",
    "check_fp32_factor",
    "default_activation",
]


def default_activation(mlp: str) -> str:
    """The activation of an MLP kind when none is given: ``silu`` for swiglu, exact ``gelu`` otherwise.

    Exact GELU (nanoGPT's ``nn.GELU()``, BERT) rather than GPT-2's tanh approximation: its CPU kernels
    take less than half the time (profiled: 32 ms vs 14 ms forward at 4/4/128 over 3 steps).
    GPT-2 checkpoints keep ``gelu_tanh``: ``poslab.from_hf`` sets ``mlp.activation`` from the checkpoint.
    """
    return "silu" if mlp == "swiglu" else "gelu"


def _check_optional_flag(key: str, value: Any) -> None:
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{key} must be a bool or None (follow the model's `bias`), got {value!r}")


@dataclass(frozen=True)
class NormConfig:
    """The model's norms (before each branch, the final one, and Bloom's after the embedding).

    Attributes:
        kind: ``"layernorm"`` or ``"rmsnorm"``.
        eps: epsilon of the norms (also of the QK-norms unless ``attention.qk_norm_eps`` is set).
        bias: LayerNorm biases (``None``: the model's ``bias``).
        embed: a norm right after the token embedding (Bloom's ``word_embeddings_layernorm``).
    """

    kind: str = "layernorm"
    eps: float = 1e-5
    bias: bool | None = None
    embed: bool = False

    def __post_init__(self) -> None:
        if self.kind not in NORMS:
            raise ValueError(f"norm.kind={self.kind!r} is not allowed; choose one of {list(NORMS)}")
        eps = self.eps
        positive_number("norm.eps", eps, rule="a positive number (e.g. 1e-5)")
        _check_optional_flag("norm.bias", self.bias)
        if not isinstance(self.embed, bool):
            raise TypeError(f"norm.embed must be a bool, got {self.embed!r}")


@dataclass(frozen=True)
class MLPConfig:
    """The blocks' MLP.

    Attributes:
        kind: ``"gelu"`` (4x, GPT-2) or ``"swiglu"`` (Llama).
        hidden: hidden width (default ``4*n_embd`` for gelu, ``int(8/3*n_embd)`` rounded up to 8 for swiglu).
        activation: one of :data:`ACTIVATIONS` (``None``: exact ``gelu`` for the gelu MLP, ``silu`` for
            swiglu; resolved when the config is made, so a saved config names it). GPT-2's
            ``gelu_tanh`` must be asked for (``from_hf`` does).
        bias: biases of the MLP's linear layers (``None``: the model's ``bias``).
    """

    kind: str = "gelu"
    hidden: int | None = None
    activation: str | None = None
    bias: bool | None = None

    def __post_init__(self) -> None:
        if self.kind not in MLPS:
            raise ValueError(f"mlp.kind={self.kind!r} is not allowed; choose one of {list(MLPS)}")
        hidden = self.hidden
        if hidden is not None:
            positive_int("mlp.hidden", hidden, rule="a positive integer or None")
        if self.activation is not None and (not isinstance(self.activation, str) or self.activation not in ACTIVATIONS):
            raise ValueError(
                f"mlp.activation={self.activation!r} is not allowed; choose one of {list(ACTIVATIONS)} (or None)"
            )
        if self.activation is None:
            object.__setattr__(self, "activation", default_activation(self.kind))
        _check_optional_flag("mlp.bias", self.bias)

    def hidden_width(self, n_embd: int) -> int:
        """``hidden``, or the kind's default for a model of width ``n_embd``."""
        if self.hidden is not None:
            return self.hidden
        return 4 * n_embd if self.kind == "gelu" else 8 * math.ceil(8 * n_embd / 3 / 8)


GROUPS.update(attention=AttentionConfig, norm=NormConfig, mlp=MLPConfig)


@dataclass
class GPTConfig:
    """Configuration of :class:`GPT` (validated at construction).

    Attributes:
        vocab_size: number of tokens.
        n_layer, n_head, n_embd: depth, query heads, width (``n_embd % n_head == 0``).
        block_size: training context; also the default ``max_len`` of bounded schemes.
        dropout: dropout on embeddings, residual branches and (unless ``attention.dropout`` is set)
            attention weights.
        bias: biases in linear layers and LayerNorm (each group's ``bias=None`` follows it).
        n_kv_head: key/value heads for GQA/MQA (``None`` = ``n_head``).
        position: registry name of the position scheme (see ``poslab.nn.positions.names()``).
        position_config: the scheme's config as a dict or its dataclass.
        attention, norm, mlp: each group is given as its dataclass or a mapping of its fields.
        attention: every attention layer's settings (:class:`AttentionConfig`: causal, window,
            chunk, soft-cap, scale, sinks, QK-norm, temperature tuning, head_dim, bias, clip_qkv,
            backend). ``backend="auto"`` is ``sdpa`` on CPU and FlexAttention on CUDA.
        norm: the norms (:class:`NormConfig`: kind, eps, bias, embed).
        mlp: the MLP (:class:`MLPConfig`: kind, hidden, activation, bias).
        residual: block layout, one of :data:`RESIDUALS` (``sequential`` pre-norm by default).
        tie_embeddings: share the token embedding with the LM head.
        lm_head_bias: a bias on the LM head (GPT-J).
        embed_scale: multiply the token embeddings by this (Gemma: ``sqrt(n_embd)``).
        final_softcap: soft-capping ``c * tanh(s / c)`` of the final logits (Gemma 2: 30).
        layer_pattern: per-layer overrides, a list of dicts with keys from :data:`LAYER_KEYS`
            (``position``, ``position_config`` and the attention fields ``window``, ``chunk``,
            ``temperature_tuning``, ``qk_norm``); layer ``i`` takes entry ``i % len(layer_pattern)``,
            so ``[{"window": 4096}, {}]`` is Gemma 2's local/global alternation and a list of
            ``n_layer`` entries spells out every layer. A per-layer scheme must be one that acts
            inside attention (no ``embed``).
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
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    norm: NormConfig = field(default_factory=NormConfig)
    mlp: MLPConfig = field(default_factory=MLPConfig)
    residual: str = "sequential"
    tie_embeddings: bool = True
    lm_head_bias: bool = False
    embed_scale: float | None = None
    final_softcap: float | None = None
    layer_pattern: list[dict[str, Any]] | None = None
    mla: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for key in ("vocab_size", "n_layer", "block_size"):
            positive_int(key, getattr(self, key))
        for key, cls in GROUPS.items():
            value = getattr(self, key)
            if isinstance(value, dict):
                setattr(self, key, _group_from_dict(cls, value, key))
            elif isinstance(value, str):  # the flat form's kind name (norm="rmsnorm")
                from poslab.nn.config_migration import flat_key_message

                raise ValueError(flat_key_message(key))
            elif not isinstance(value, cls):
                raise TypeError(f"{key} must be a {cls.__name__} or a mapping of its fields, got {value!r}")
        validate_geometry(self.n_embd, self.n_head, self.kv_heads)
        if not is_number(self.dropout) or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be a number in [0, 1), got {self.dropout!r}")
        for key in ("bias", "lm_head_bias", "tie_embeddings"):
            if not isinstance(getattr(self, key), bool):
                raise TypeError(f"{key} must be a bool, got {getattr(self, key)!r}")
        if self.residual not in RESIDUALS:
            raise ValueError(f"residual={self.residual!r} is not allowed; choose one of {list(RESIDUALS)}")
        for key in ("final_softcap", "embed_scale"):
            value = getattr(self, key)
            if value is not None:
                positive_number(key, value, rule="a positive finite number or None")
            check_fp32_factor(key, value)
        positions.get(self.position)  # unknown names fail here, listing the known ones
        if dataclasses.is_dataclass(self.position_config):
            self.position_config = dataclasses.asdict(self.position_config)
        if not isinstance(self.position_config, dict):
            raise TypeError(
                f"position_config must be a dict or the scheme's dataclass, got {type(self.position_config).__name__}"
            )
        if self.mla is not None:  # the scheme's head_dim is mla's qk_rope_head_dim: check mla first
            self._validate_mla()
        # validates keys and values now, with the model's dimensions filled in; the throwaway scheme is
        # built on the meta device: no memory for its tables (however large block_size is) and no
        # draw from the global RNG (a config is rebuilt between training steps, e.g. on checkpoints)
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            try:
                scheme = positions.build_for_model(self.position, self.position_config, self.position_context())
                scheme.check_layer(self.n_head, self.position_context()["head_dim"], self.attention.causal)
            except (RuntimeError, OverflowError) as err:  # torch refusing a value the scheme did not check
                message = str(err).splitlines()[0] if str(err) else type(err).__name__
                raise ValueError(
                    f"position_config {self.position_config!r} is not usable for {self.position!r}: {message}"
                ) from None
        if self.layer_pattern is not None:
            self._validate_layer_pattern()

    def _validate_layer_pattern(self) -> None:
        """Each ``layer_pattern`` entry's keys and values (errors name the entry)."""
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
                raise TypeError(f"layer_pattern[{i}] must be a dict of layer overrides, got {entry!r}")
            reject_unknown_keys(entry, list(LAYER_KEYS), "layer_pattern key", where=f" in layer_pattern[{i}]")
            if dataclasses.is_dataclass(entry.get("position_config")):
                entry["position_config"] = dataclasses.asdict(entry["position_config"])
            overrides = {key: entry[key] for key in LAYER_ATTENTION_KEYS if key in entry}
            scheme = {key: entry[key] for key in ("position", "position_config") if key in entry}
            if "position" in entry and "position_config" not in entry:
                scheme["position_config"] = {}  # another scheme than the global one starts from its defaults
            try:  # the same checks as the global fields, with this entry's values in place
                dataclasses.replace(self, layer_pattern=None, attention=self.attention.with_(**overrides), **scheme)
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
        """MLA's dimensions, and no setting MLA does not compute (it declares them in ``UNSUPPORTED``)."""
        from poslab.nn.mla import MultiHeadLatentAttention, validate_mla

        self.mla = validate_mla(self.mla)
        clash = [
            f"attention.{key}"
            for key in MultiHeadLatentAttention.UNSUPPORTED
            if getattr(self.attention, key) not in (None, False)
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
        """Key ``key`` of :data:`LAYER_KEYS` as layer ``i`` sees it: its ``layer_pattern`` override, else
        the model's value (``position``/``position_config`` of the config, the others of ``attention``)."""
        entry = self.layer(i)
        if key == "position_config" and "position" in entry and "position_config" not in entry:
            return {}  # another scheme than the global one starts from its defaults
        if key in entry:
            return entry[key]
        return getattr(self, key) if key in ("position", "position_config") else getattr(self.attention, key)

    def layer_attention(self, i: int) -> AttentionConfig:
        """Layer ``i``'s :class:`AttentionConfig`: ``attention`` with the layer's overrides and the
        model's dropout, norm epsilon and bias filled in where it leaves them ``None``."""
        overrides = {key: self.layer(i)[key] for key in LAYER_ATTENTION_KEYS if key in self.layer(i)}
        attention = self.attention.with_(**overrides) if overrides else self.attention
        return attention.resolved(dropout=self.dropout, qk_norm_eps=self.norm.eps, bias=self.bias_of("attn"))

    @property
    def kv_heads(self) -> int:
        """``n_kv_head`` or ``n_head``."""
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def head_dim(self) -> int:
        """``attention.head_dim`` or ``n_embd // n_head``."""
        return self.attention.head_dim if self.attention.head_dim is not None else self.n_embd // self.n_head

    def bias_of(self, part: str) -> bool:
        """Whether ``part`` (``"attention"``/``"attn"``, ``"mlp"`` or ``"norm"``) has biases: its group's
        ``bias``, else the model's ``bias``."""
        group = {"attn": self.attention, "attention": self.attention, "mlp": self.mlp, "norm": self.norm}[part]
        return self.bias if group.bias is None else group.bias

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
            "bidirectional": not self.attention.causal,
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values; each group is a nested mapping."""
        out = dataclasses.asdict(self)
        out["attention"] = self.attention.to_dict()
        return out

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> GPTConfig:
        """Build from a dict (each group a nested mapping); unknown keys raise ``ValueError`` suggesting
        the close key. A saved config in the flat form is read by
        :func:`poslab.nn.config_migration.migrate_model_config` first."""
        from poslab.nn.config_migration import check_not_flat

        check_not_flat(values)
        reject_unknown_keys(values, [f.name for f in dataclasses.fields(cls)], "GPTConfig key")
        built = dict(values)
        for key, group in GROUPS.items():
            if key in built and isinstance(built[key], dict):
                built[key] = _group_from_dict(group, built[key], key)
        return cls(**built)


def _group_from_dict(group: type, values: dict[str, Any], key: str) -> Any:
    """Group ``key`` built from a mapping; its errors name the field as ``key.FIELD``."""
    if group is not AttentionConfig:
        reject_unknown_keys(values, [f.name for f in dataclasses.fields(group)], f"{key} key", prefix=f"{key}.")
        return group(**values)
    try:
        return AttentionConfig.from_dict(values, prefix=f"{key}.")
    except (ValueError, TypeError) as err:
        message = str(err)
        if message.startswith(tuple(f.name for f in dataclasses.fields(AttentionConfig))):
            message = f"{key}.{message}"
        raise type(err)(message) from None
