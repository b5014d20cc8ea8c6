"""The position-scheme interface: three hooks with identity defaults.

Every position encoding in poslab is a :class:`PositionScheme`. Attention calls the hooks at fixed
places and always hands them explicit integer positions, so training, offsets, KV-cache decoding and
extrapolation share one code path:

* ``embed(x, pos)`` -- absolute schemes add a vector to the token embeddings (called once, by the model).
* ``rotate(q, k, q_pos, k_pos)`` -- the rotary family rotates queries and keys (called in every layer).
* ``score_bias(q, k, q_pos, k_pos, scale)`` -- additive bias on the scaled attention logits
  (ALiBi, T5, KERPLE, FIRE, Transformer-XL). ``score_mod`` returns the same bias as a FlexAttention
  ``score_mod`` function.

Shapes used throughout: ``B`` batch, ``h`` query heads, ``h_kv`` key/value heads, ``Tq``/``Tk`` query/key
lengths, ``d_k`` head dim, ``d`` model width. Positions are 1-D ``int64`` tensors: ``q_pos [Tq]``,
``k_pos [Tk]``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from poslab.checks import is_number, positive_number

ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


class PositionScheme(nn.Module):
    """Base class of every position scheme; all hooks default to the identity.

    Class attributes describe the scheme to the contract tests and to the experiments:

    * ``name``: registry name.
    * ``config_class``: the dataclass holding the scheme's typed configuration.
    * ``relative``: attention is unchanged when every position is shifted by a constant.
    * ``paper``: citation shown in docs and reports.
    * ``rotate_needs_all_keys``: ``rotate`` of a key depends on the other positions of the call (xPos
      anchors its scale there), so a KV cache stores keys *before* ``rotate`` and attention rotates
      every cached key on each call.

    Derived, never declared (set for every subclass from the hooks it overrides, so a scheme cannot
    forget a flag and silently become NoPE): ``embeds``, ``rotates``, ``has_bias`` (overrides
    ``score_bias``) and ``encodes_position`` (any of the three; False only for a scheme that
    overrides no hook, i.e. NoPE).
    """

    name: ClassVar[str] = ""
    config_class: ClassVar[type] = object
    relative: ClassVar[bool] = False
    paper: ClassVar[str] = ""
    rotate_needs_all_keys: ClassVar[bool] = False
    # derived in __init_subclass__ from the overridden hooks
    embeds: ClassVar[bool] = False
    rotates: ClassVar[bool] = False
    has_bias: ClassVar[bool] = False
    encodes_position: ClassVar[bool] = False
    #: buffers that stay fp32 when the module is cast (``model.to(torch.bfloat16)``, ``.half()``):
    #: RoPE frequencies, ALiBi slopes, ... (angles and biases are computed in fp32).
    fp32_buffers: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.embeds = overrides(cls, "embed")
        cls.rotates = overrides(cls, "rotate")
        cls.has_bias = overrides(cls, "score_bias")
        cls.encodes_position = cls.embeds or cls.rotates or cls.has_bias
        if overrides(cls, "score_mod") and not cls.has_bias:
            raise TypeError(
                f"{cls.__name__} overrides score_mod but not score_bias: the sdpa and eager backends call "
                "score_bias, so they would drop its bias; define score_bias (score_mod is the flex form of it)"
            )

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> PositionScheme:
        """``nn.Module._apply`` (behind ``.to``/``.half``/``.cuda``) that keeps :attr:`fp32_buffers` in fp32.

        The buffers follow device moves but never a dtype cast: a bf16 copy of RoPE's ``inv_freq``
        or of ALiBi's slopes would silently bend every angle and bias.
        """
        kept = {name: self._buffers[name] for name in self.fp32_buffers if self._buffers.get(name) is not None}
        super()._apply(fn, recurse)
        for name, original in kept.items():
            moved = self._buffers[name]
            if moved is not None and moved.dtype != original.dtype:
                self._buffers[name] = original.to(device=moved.device)  # exact fp32 values, new device
        return self

    # ----------------------------------------------------------------------------------------- hooks
    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        """Add absolute position information to token embeddings.

        Args:
            x: token embeddings ``[B, T, d]``.
            pos: positions ``[T]``.

        Returns:
            ``[B, T, d]``, same dtype as ``x``.
        """
        return x

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """Rotate (or otherwise transform) queries ``[B, h, Tq, d_k]`` and keys ``[B, h_kv, Tk, d_k]``."""
        return q, k

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float) -> Tensor | None:
        """Additive bias on the scaled logits, ``[B or 1, h, Tq, Tk]`` in fp32, or ``None``.

        Args:
            q: queries ``[B, h, Tq, d_k]`` (after ``rotate``).
            k: keys ``[B, h_kv, Tk, d_k]`` (after ``rotate``, including cached keys).
            q_pos: ``[Tq]``; k_pos: ``[Tk]``.
            scale: the softmax scale attention applies to ``q @ k^T`` (schemes with q-dependent
                terms, such as Transformer-XL, apply it to their own terms).
        """
        return None

    def score_mod(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float) -> ScoreMod | None:
        """The bias as a FlexAttention ``score_mod(score, b, h, q_idx, kv_idx)``; ``None`` if no bias.

        The default materialises :meth:`score_bias` and indexes it; schemes whose bias is a closed
        form of the positions override this with that closed form.
        """
        bias = self.score_bias(q, k, q_pos, k_pos, scale)
        if bias is None:
            return None
        batch_of = 0 if bias.shape[0] == 1 else None

        def mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            bb = b * 0 if batch_of == 0 else b
            return score + bias[bb, h, q_idx, kv_idx]

        return mod

    # --------------------------------------------------------------------------- optional hooks
    def for_layer(self, i: int) -> PositionScheme:
        """The scheme layer ``i`` of a model runs: ``self`` by default (one scheme shared by all layers).

        A scheme with per-layer parameters (Transformer-XL's ``W_R``) returns a view that uses layer
        ``i``'s; :meth:`poslab.nn.model.GPT.layer_position` calls this.
        """
        return self

    def check_layer(self, n_heads: int, head_dim: int, causal: bool) -> None:
        """Check (or complete) the scheme for an attention layer of this geometry; ``ValueError`` if it cannot serve it.

        Called by :class:`~poslab.nn.attention.MultiHeadAttention` when a scheme is attached. The
        default compares the config's ``n_heads``/``head_dim`` (where the config has them) with the
        layer's: a RoPE table for 64-wide heads in 128-wide heads would leave half of each head
        unrotated, ALiBi slopes for 8 heads in a 4-head layer fail later with a raw size error.
        Schemes with layer-dependent defaults (T5's ``bidirectional``) override this and call it.
        """
        for key, layer_value in (("n_heads", n_heads), ("head_dim", head_dim)):
            value = getattr(self.config, key, None)
            if value is not None and value != layer_value:
                raise ValueError(
                    f"position scheme {self.name!r} was built with {key}={value} but the attention layer has "
                    f"{key}={layer_value}; build it with {key}={layer_value} (or let GPT fill it in)"
                )

    def describe(self, T: int, n_heads: int | None = None, causal: bool = True) -> list[dict[str, Any]]:
        """What this scheme does to ``T`` positions, as named matrices for the explorer and analyses.

        Each entry is ``{"title", "data" [rows, cols] fp32, "rows", "cols", "diverging", "note"}``.
        The default shows what the hooks produce with neutral inputs: the position vector ``embed``
        adds (zero tokens) and the bias ``score_bias`` adds (zero queries and keys, at most 4 heads,
        future keys NaN when ``causal``). Schemes add their own views (RoPE's angles, T5's buckets).

        Args:
            T: positions ``0 .. T-1``.
            n_heads: heads of the layer (default: the config's ``n_heads``, else 1).
            causal: blank the future keys of the bias views.
        """
        views: list[dict[str, Any]] = []
        pos = torch.arange(T)
        with torch.no_grad():
            width = getattr(self.config, "n_embd", None)
            if self.embeds and width is not None:
                views.append(
                    view(
                        f"{self.name}: position vector added to each token",
                        self.embed(torch.zeros(1, T, width), pos)[0],
                        "position",
                        "dimension",
                        True,
                    )
                )
            if self.has_bias:
                h = n_heads or getattr(self.config, "n_heads", None) or 1
                dk = getattr(self.config, "head_dim", None) or 8
                zeros = torch.zeros(1, h, T, dk)
                bias = self.score_bias(zeros, zeros, pos, pos, 1.0 / math.sqrt(dk))
                if bias is not None:
                    bias = bias[0].float()  # [h, T, T]
                    if causal:
                        bias = bias.masked_fill(pos[None, :] > pos[:, None], float("nan"))
                    for head in range(min(h, 4)):
                        views.append(
                            view(
                                f"{self.name} bias, head {head}",
                                bias[head],
                                "query",
                                "key",
                                True,
                                "added to q·k/√d_k before the softmax" + self.bias_note(),
                            )
                        )
        return views

    def bias_note(self) -> str:
        """Caveat appended to the bias views (a bias that depends on q/k is shown with q = k = 0)."""
        return ""

    @classmethod
    def check_config_keys(cls, given: dict[str, Any]) -> None:
        """Check the keys given for a config as a whole (RoPE: a scaling's required keys); no-op by default."""

    @classmethod
    def rescaled_config(
        cls,
        config: dict[str, Any],
        scaling: Any = None,
        *,
        logn_scaling: bool | None = None,
        original_max_len: int | None = None,
    ) -> dict[str, Any]:
        """``config`` with a context-extension scaling replaced (RoPE family); others raise ``ValueError``."""
        raise ValueError(f"position scheme {cls.name!r} has no context-extension scaling (the RoPE family has)")

    @classmethod
    def rescalable(cls) -> bool:
        """Whether :meth:`rescaled_config` is implemented (RoPE-family schemes)."""
        return overrides(cls, "rescaled_config")

    @property
    def max_positions(self) -> int | None:
        """Largest position count the scheme can encode, or ``None`` if unbounded."""
        return None

    def extra_repr(self) -> str:
        fields = dataclasses.asdict(self.config) if dataclasses.is_dataclass(self.config) else {}
        return ", ".join(f"{k}={v!r}" for k, v in fields.items())


def overrides(cls: type, hook: str) -> bool:
    """Whether scheme class ``cls`` defines ``hook`` itself rather than inheriting the identity default."""
    mine = getattr(cls, hook, None)
    base = getattr(PositionScheme, hook)
    return getattr(mine, "__func__", mine) is not getattr(base, "__func__", base)


def view(title: str, data: Tensor, rows: str, cols: str, diverging: bool, note: str = "") -> dict[str, Any]:
    """One :meth:`PositionScheme.describe` entry (``data`` detached, fp32)."""
    return {
        "title": title,
        "data": data.detach().float(),
        "rows": rows,
        "cols": cols,
        "diverging": diverging,
        "note": note,
    }


def relative_distance(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """``q_pos[i] - k_pos[j]`` as ``[Tq, Tk]`` int64 (positive for keys in the past)."""
    return q_pos[:, None] - k_pos[None, :]


def check_positions(pos: Tensor, length: int) -> None:
    """Raise ``TypeError``/``ValueError`` unless ``pos`` is an integer tensor of shape ``[length]``."""
    if not isinstance(pos, Tensor):
        raise TypeError(f"positions must be a torch.Tensor of integers, got {type(pos).__name__}")
    if pos.is_floating_point() or pos.is_complex() or pos.dtype == torch.bool:
        raise TypeError(f"positions must be an integer tensor (int64 indices), got dtype {pos.dtype}")
    if pos.shape != (length,):
        raise ValueError(f"positions must have shape [{length}] (one per token), got {list(pos.shape)}")


def check_positive(name: str, value: float | int) -> None:
    """``TypeError`` unless ``value`` is a number, ``ValueError`` unless it is ``> 0`` (infinity passes)."""
    if not is_number(value):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    positive_number(name, value, finite=False, rule="> 0")


#: the largest ``init_std`` of a scheme's table: entries up to ~1e4, squared by the norms and added to scores,
#: stay well inside fp32 (3.4e38)
MAX_INIT_STD = 1e3


def check_init_std(value: float | int) -> None:
    """Raise unless a table's initialisation std is a number in ``[0, MAX_INIT_STD]``."""
    if not is_number(value):
        raise TypeError(f"init_std must be a number, got {value!r} ({type(value).__name__})")
    if not 0 <= value <= MAX_INIT_STD:
        raise ValueError(
            f"init_std must lie in [0, {MAX_INIT_STD:g}] (a larger table overflows fp32 in the norms and scores), "
            f"got {value!r}"
        )


#: the largest frequency (radians per position) a rotation or sinusoid may have: angles of every
#: position below 2^31 stay finite in fp32 (and a frequency past pi radians per position aliases anyway)
MAX_FREQUENCY = 1e6


def check_wavelength_base(name: str, base: float, dim: int) -> None:
    """Raise ``ValueError`` unless the frequencies ``base^(-2i/dim)`` stay at most :data:`MAX_FREQUENCY`.

    A base below 1 makes the frequencies grow with ``i`` (up to ``base^(-(dim-2)/dim)``); far below,
    they overflow fp32 to inf and every angle, cosine and score becomes NaN.
    """
    check_positive(name, base)
    if not math.isfinite(base):
        raise ValueError(f"{name} must be finite, got {base!r}")
    exponent = (dim - 2) / dim if dim > 2 else 0.0
    if base < 1 and -exponent * math.log(base) > math.log(MAX_FREQUENCY):
        lowest = MAX_FREQUENCY ** (-1 / exponent)
        raise ValueError(
            f"{name}={base!r} gives frequencies base^(-2i/d) above {MAX_FREQUENCY:g} radians per position "
            f"(they overflow fp32 to NaN); with d={dim} {name} must be >= {lowest:.3g}"
        )


def check_choice(name: str, value: Any, allowed: tuple[Any, ...]) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not allowed; choose one of {list(allowed)}")
