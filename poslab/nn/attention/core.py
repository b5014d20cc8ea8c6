"""``attend``: scaled dot-product attention over explicit positions, the core every module here calls."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from poslab.nn.attention.backends import Call, check_backend_name, resolve
from poslab.nn.attention.inputs import check_mask, check_qkv
from poslab.nn.attention.spec import AttentionSpec, BiasFn, check_mechanisms

#: queries per block in the blocked path
DEFAULT_QUERY_CHUNK = 128
#: key count from which the blocked path recomputes float biases in backward instead of keeping them
DEFAULT_RECOMPUTE_THRESHOLD = 2048


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    *,
    causal: bool = True,
    window: int | None = None,
    bias_fn: BiasFn | None = None,
    attn_mask: Tensor | None = None,
    scale: float | None = None,
    dropout: float = 0.0,
    backend: str = "auto",
    need_weights: bool = False,
    score_mod: Callable | None = None,
    query_chunk: int = DEFAULT_QUERY_CHUNK,
    recompute_threshold: int = DEFAULT_RECOMPUTE_THRESHOLD,
    probe: Callable[[Tensor], Tensor] | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
    chunk: int | None = None,
    increasing: bool | None = None,
    spec: AttentionSpec | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Scaled dot-product attention over explicit positions.

    What is computed is an :class:`~poslab.nn.attention.spec.AttentionSpec`: pass one as ``spec``,
    or its fields (``causal`` ... ``chunk``) as keywords, from which one is made. The backend comes
    from the registry (:mod:`poslab.nn.attention.backends`).

    Args:
        q: ``[B, h, Tq, d_k]``; k: ``[B, h_kv, Tk, d_k]``; v: ``[B, h_kv, Tk, d_v]`` (``h_kv`` divides ``h``).
        q_pos: ``[Tq]`` int positions of the queries; k_pos: ``[Tk]`` of the keys.
        causal, window, chunk: the position rule (see :func:`~poslab.nn.attention.spec.position_mask`).
        bias_fn: additive fp32 logit bias, called as ``bias_fn(q, k, q_pos, k_pos)`` on whatever block of
            queries and keys is being computed, returning ``[B|1, h, tq, tk]`` (or ``None``).
        attn_mask: ``[Tq, Tk]`` or ``[B|1, h|1, Tq, Tk]``; bool (True = attend) or float (added; fp32
            or ``q``'s dtype).
        scale: softmax scale (default ``1/sqrt(d_k)``).
        dropout: attention-weight dropout probability (pass 0 at eval).
        backend: ``auto`` or a registered backend (``sdpa``, ``eager``, ``flex``).
        need_weights: also return the ``[B, h, Tq, Tk]`` fp32 weights (forces ``eager``).
        score_mod: FlexAttention score_mod equivalent to ``bias_fn`` (flex backend only).
        query_chunk: the blocked path's query block (it runs when there are more queries than this).
        recompute_threshold: key count from which blocks recompute float biases in backward.
        probe: applied to the eager weights (a hook point for visualisation).
        softcap: logit soft-capping ``c * tanh(s / c)`` of the scaled logits ``s = q k^T * scale``,
            before any bias or mask (Gemma 2). Not expressible in ``sdpa``: ``auto`` picks ``eager``
            (``flex`` on CUDA); an explicit ``sdpa`` raises.
        sinks: ``[h]`` learned sink logits (gpt-oss): one extra logit per head joins every row's
            softmax denominator and is dropped after it (the weights then sum to < 1).
        increasing: the caller knows ``q_pos`` is strictly increasing (``True``: the model made it with
            ``arange``); ``None`` = look at the values. Lets ``torch.compile`` trace the fused causal
            path without a data-dependent branch (a graph break).
        spec: the whole spec at once (then the keywords ``causal`` ... ``chunk`` are not read).

    Returns:
        ``(out [B, h, Tq, d_v], weights or None)``.
    """
    check_qkv(q, k, v, q_pos, k_pos)
    if attn_mask is not None:
        attn_mask = check_mask(attn_mask, q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.device, q.dtype)
    check_backend_name(backend)
    if spec is None:
        check_mechanisms(q.shape[1], softcap, sinks, chunk)
        spec = AttentionSpec(
            causal=causal,
            window=window,
            chunk=chunk,
            sinks=sinks,
            softcap=softcap,
            scale=scale,
            bias_fn=bias_fn,
            score_mod=score_mod,
        )
    else:
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
        dropout=dropout,
        need_weights=need_weights,
        probe=probe,
        query_chunk=query_chunk,
        recompute_threshold=recompute_threshold,
        increasing=increasing,
    )
    return resolve(backend, spec, call).run(spec, call)


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
