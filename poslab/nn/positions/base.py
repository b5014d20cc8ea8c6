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
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


class PositionScheme(nn.Module):
    """Base class of every position scheme; all hooks default to the identity.

    Class attributes describe the scheme to the contract tests and to the experiments:

    * ``name``: registry name.
    * ``config_class``: the dataclass holding the scheme's typed configuration.
    * ``relative``: attention is unchanged when every position is shifted by a constant.
    * ``encodes_position``: the scheme breaks permutation equivariance (False only for NoPE).
    * ``paper``: citation shown in docs and reports.
    """

    name: ClassVar[str] = ""
    config_class: ClassVar[type] = object
    relative: ClassVar[bool] = False
    encodes_position: ClassVar[bool] = True
    has_bias: ClassVar[bool] = False
    paper: ClassVar[str] = ""
    #: buffers that stay fp32 when the module is cast (``model.to(torch.bfloat16)``, ``.half()``):
    #: RoPE frequencies, ALiBi slopes, ... (angles and biases are computed in fp32).
    fp32_buffers: ClassVar[tuple[str, ...]] = ()

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

    def score_bias(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float
    ) -> Tensor | None:
        """Additive bias on the scaled logits, ``[B or 1, h, Tq, Tk]`` in fp32, or ``None``.

        Args:
            q: queries ``[B, h, Tq, d_k]`` (after ``rotate``).
            k: keys ``[B, h_kv, Tk, d_k]`` (after ``rotate``, including cached keys).
            q_pos: ``[Tq]``; k_pos: ``[Tk]``.
            scale: the softmax scale attention applies to ``q @ k^T`` (schemes with q-dependent
                terms, such as Transformer-XL, apply it to their own terms).
        """
        return None

    def score_mod(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, scale: float
    ) -> ScoreMod | None:
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

    @property
    def max_positions(self) -> int | None:
        """Largest position count the scheme can encode, or ``None`` if unbounded."""
        return None

    def extra_repr(self) -> str:
        fields = dataclasses.asdict(self.config) if dataclasses.is_dataclass(self.config) else {}
        return ", ".join(f"{k}={v!r}" for k, v in fields.items())


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
    """Raise ``ValueError`` unless ``value > 0``."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")


def check_choice(name: str, value: Any, allowed: tuple[Any, ...]) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not allowed; choose one of {list(allowed)}")
