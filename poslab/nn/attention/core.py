"""``attend``: scaled dot-product attention over explicit positions, the core every module here calls."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from poslab.nn.attention.backends import check_backend_name, resolve
from poslab.nn.attention.call import Call
from poslab.nn.attention.config import AttendOptions
from poslab.nn.attention.inputs import check_mask, check_qkv
from poslab.nn.attention.spec import AttentionSpec, check_mechanisms

#: plain causal attention, the default spec
CAUSAL = AttentionSpec()
#: the default run-time options (``auto`` backend, no dropout, no weights)
DEFAULT_OPTIONS = AttendOptions()


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    spec: AttentionSpec = CAUSAL,
    *,
    attn_mask: Tensor | None = None,
    options: AttendOptions = DEFAULT_OPTIONS,
) -> tuple[Tensor, Tensor | None]:
    """Scaled dot-product attention over explicit positions.

    What is computed is ``spec`` (:class:`~poslab.nn.attention.spec.AttentionSpec`: the position rule
    ``causal``/``window``/``chunk``, ``softcap``, ``sinks``, ``scale``, the bias as ``bias_fn`` and
    its flex form ``score_mod``); how the call runs is ``options``
    (:class:`~poslab.nn.attention.config.AttendOptions`: backend, dropout, weights, blocking, probe).
    The backend comes from the registry (:mod:`poslab.nn.attention.backends`).

    Args:
        q: ``[B, h, Tq, d_k]``; k: ``[B, h_kv, Tk, d_k]``; v: ``[B, h_kv, Tk, d_v]`` (``h_kv`` divides ``h``).
        q_pos: ``[Tq]`` int positions of the queries; k_pos: ``[Tk]`` of the keys.
        spec: what is computed (default: plain causal attention, scale ``1/sqrt(d_k)``). Its
            ``bias_fn`` is called as ``bias_fn(q, k, q_pos, k_pos)`` on whatever block of queries and
            keys is being computed, returning ``[B|1, h, tq, tk]`` (or ``None``); its ``sinks`` must be
            ``[h]`` (one logit per query head); its ``softcap`` is not expressible in ``sdpa``: ``auto``
            picks ``eager`` (``flex`` on CUDA), an explicit ``sdpa`` raises.
        attn_mask: ``[Tq, Tk]`` or ``[B|1, h|1, Tq, Tk]``; bool (True = attend) or float (added; fp32
            or ``q``'s dtype).
        options: how the call runs.

    Returns:
        ``(out [B, h, Tq, d_v], weights or None)``.
    """
    check_qkv(q, k, v, q_pos, k_pos)
    if attn_mask is not None:
        attn_mask = check_mask(attn_mask, q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.device, q.dtype)
    if not isinstance(spec, AttentionSpec):
        raise TypeError(f"spec must be an AttentionSpec, got {type(spec).__name__}")
    if not isinstance(options, AttendOptions):
        raise TypeError(f"options must be AttendOptions, got {type(options).__name__}")
    check_backend_name(options.backend)  # a backend may have been unregistered since the options were made
    check_mechanisms(q.shape[1], None, spec.sinks, None)
    scale = spec.scale if spec.scale is not None else 1.0 / math.sqrt(q.shape[-1])
    call = Call(
        q,
        k,
        v,
        q_pos,
        k_pos,
        attn_mask=attn_mask,
        scale=scale,
        dropout=options.dropout,
        need_weights=options.need_weights,
        probe=options.probe,
        query_chunk=options.query_chunk,
        recompute_threshold=options.recompute_threshold,
        increasing=options.increasing,
    )
    return resolve(options.backend, spec, call).run(spec, call)


def resolve_backend(backend: str, device: torch.device, need_weights: bool = False, has_mask: bool = False) -> str:
    """The concrete backend ``auto`` stands for on ``device`` for plain causal attention of several
    queries (explicit choices pass through, validated); :func:`attend` resolves each call by its spec."""
    check_backend_name(backend)
    if need_weights:
        return "eager"
    if backend != "auto":
        return backend
    x = torch.empty(1, 1, 2, 1, device="meta")
    pos = torch.empty(2, dtype=torch.long, device="meta")
    call = Call(
        x,
        x,
        x,
        pos,
        pos,
        attn_mask=torch.empty(1, 1, 2, 2, device="meta") if has_mask else None,
        device_type=torch.device(device).type,
    )
    return resolve("auto", AttentionSpec(), call).name
