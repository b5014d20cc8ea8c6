"""Input checks of the attention core: shapes, dtypes, devices, masks, head layouts; mask merging."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from poslab.checks import is_int, is_number, positive_int


def validate_geometry(d_model: int, n_heads: int, n_kv_heads: int) -> None:
    """Raise ``ValueError`` naming the value and the rule for an impossible head layout."""
    for label, value in (("d_model", d_model), ("n_heads", n_heads), ("n_kv_heads", n_kv_heads)):
        if not is_int(value):
            raise TypeError(f"{label} must be an integer, got {value!r}")
        if value <= 0:
            raise ValueError(f"{label} must be > 0, got {value}")
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads} (d_model must equal n_heads * d_k)")
    if n_heads % n_kv_heads:
        raise ValueError(
            f"n_heads={n_heads} is not divisible by n_kv_heads={n_kv_heads} "
            "(each kv head serves n_heads/n_kv_heads query heads)"
        )


def validate_head_dim(head_dim: int) -> int:
    """A positive integer head width (``head_dim=`` of attention), returned."""
    return positive_int("head_dim", head_dim, rule="a positive integer or None (d_model // n_heads)")


def validate_temperature_tuning(
    value: tuple[float, float] | list[float] | None, name: str = "temperature_tuning"
) -> tuple[float, float] | None:
    """``None`` or ``(floor_scale > 0, attn_scale)`` as floats (Llama 4: ``(8192, 0.1)``); errors call it ``name``."""
    if value is None:
        return None
    ok = isinstance(value, (tuple, list)) and len(value) == 2 and all(is_number(x) and math.isfinite(x) for x in value)
    if not ok or value[0] <= 0:
        raise ValueError(f"{name} must be (floor_scale > 0, attn_scale) or None, got {value!r}")
    return float(value[0]), float(value[1])


def check_qkv(q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, k_pos: Tensor) -> None:
    """Raise a clear error unless q/k/v/positions have consistent shapes, dtypes and devices."""
    for label, t in (("q", q), ("k", k), ("v", v), ("q_pos", q_pos), ("k_pos", k_pos)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{label} must be a torch.Tensor, got {type(t).__name__}")
    for label, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{label} must be [B, heads, T, head_dim], got shape {list(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{label} must be floating point, got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape[:3] != v.shape[:3] or q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)} do not fit together")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads ({q.shape[1]}) must be a multiple of key/value heads ({k.shape[1]})")
    if q_pos.shape != (q.shape[2],) or k_pos.shape != (k.shape[2],):
        raise ValueError(
            f"positions must be [Tq]=[{q.shape[2]}] and [Tk]=[{k.shape[2]}], "
            f"got {list(q_pos.shape)} and {list(k_pos.shape)}"
        )
    if q_pos.is_floating_point() or k_pos.is_floating_point():
        raise TypeError(f"positions must be integer tensors, got {q_pos.dtype} and {k_pos.dtype}")
    if q_pos.device != q.device or k_pos.device != q.device:
        raise ValueError(f"positions are on {q_pos.device}/{k_pos.device} but q is on {q.device}")


def check_mask(
    mask: Tensor, B: int, h: int, Tq: int, Tk: int, device: torch.device, dtype: torch.dtype | None = None
) -> Tensor:
    """Validate a user mask and return it broadcastable to ``[B, h, Tq, Tk]``.

    A float mask must be fp32 or ``dtype`` (the queries' dtype); a bool mask means True = attend.
    """
    if not isinstance(mask, Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(f"attn_mask must be bool (True = attend) or floating point (added to logits), got {mask.dtype}")
    if mask.is_floating_point() and dtype is not None and mask.dtype not in (torch.float32, dtype):
        raise TypeError(f"a float attn_mask must be float32 or the queries' dtype {dtype}, got {mask.dtype}")
    if mask.device != torch.device(device) and mask.device.type != torch.device(device).type:
        raise ValueError(f"attn_mask is on {mask.device} but the inputs are on {device}")
    given = list(mask.shape)
    if mask.dim() == 2:
        mask = mask[None, None]
    ok = mask.dim() == 4 and mask.shape[-2:] == (Tq, Tk) and mask.shape[0] in (1, B) and mask.shape[1] in (1, h)
    if not ok:
        raise ValueError(
            f"attn_mask of shape {given} does not fit: expected [{Tq}, {Tk}] or [{B}|1, {h}|1, {Tq}, {Tk}]"
        )
    return mask


def merge_masks(keep: Tensor | None, user: Tensor | None) -> Tensor | None:
    """AND two bool keep-masks, or fold a bool keep-mask into a float user mask."""
    if user is None:
        return keep
    if user.dtype == torch.bool:
        return user if keep is None else keep & user
    return combine_float(keep, user)


def combine_float(mask: Tensor | None, bias: Tensor | None) -> Tensor | None:
    """Merge a mask (bool keep-mask or additive float) and an additive float bias (or pass one through)."""
    if bias is None:
        return mask
    if mask is None:
        return bias
    if mask.dtype == torch.bool:
        return bias.float().masked_fill(~mask, float("-inf"))
    return bias.float() + mask.float()
