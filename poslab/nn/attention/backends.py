"""Attention backends in one registry: each says what it supports, ``auto`` takes the first that does.

A backend is a :class:`Backend` with a ``supports(spec, call)`` rule (``None``, or the one-line
reason it cannot run this call) and a ``run(spec, call)``. :data:`REGISTRY` holds them in ``auto``'s
order of preference; ``auto`` picks the first one that is preferred on the call's device
(:meth:`Backend.auto_ok`) and supports the call. An explicit backend that does not support the
call raises ``ValueError`` with its reason, so no backend ever drops a mechanism silently.

* ``flex``: FlexAttention with the spec's rule as ``mask_mod`` and its score transform as
  ``score_mod`` (compiled; ``auto`` on CUDA, where it compiles with a backward). On CPU torch 2.13's
  compiled kernel returns NaN or wrong values at lengths that are not a multiple of its 128 block
  and has no backward: it runs padded to a multiple of 128 (padded keys masked out, padded query
  rows dropped; ``tests/test_attention_backends.py`` checks every length 1-300 against eager) and is
  refused when gradients would be recorded.
* ``sdpa``: ``F.scaled_dot_product_attention``, in one of four forms: the fused ``is_causal`` kernel
  (plain causal attention over one increasing run of positions, linear memory), the fused causal
  kernel with sinks (:func:`_fused_causal_sinks`), query blocks (:mod:`~poslab.nn.attention.blocked`)
  when a mask or bias meets more than ``query_chunk`` sorted queries, or one call with the combined
  mask. It cannot soft-cap.
* ``eager``: explicit ``softmax(q k^T)`` in fp32 even under autocast; returns the weights. With a
  score transform and no weights wanted it runs in query blocks (linear memory).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from poslab.nn.attention.blocked import blocked
from poslab.nn.attention.call import Call
from poslab.nn.attention.inputs import combine_float, merge_masks
from poslab.nn.attention.spec import AttentionSpec, LazyScoreMod, register, unregister
from poslab.nn.footprint import check_eager_scores

#: on CPU, a bf16/fp16 fused causal call with at most this many queries runs SDPA's math kernel: at
#: T = 64 and 128 the CPU flash kernel's forward + backward took 2.0-2.3x the math path's in bf16
#: (fp32: flash 1.4x faster; T = 256 bf16: flash 1.1x faster), ``benchmarks/sdpa_small_t.py``
CPU_LOWP_MATH_MAX_T = 128
#: zero head dims appended by :func:`_fused_causal_sinks` (one carries the sink; d_k + 8 keeps SDPA's vector widths)
SINK_PAD = 8
#: the block of CPU FlexAttention: inputs are padded to a multiple of it there
FLEX_CPU_BLOCK = 128


class Backend:
    """One way to compute attention. Subclasses set ``name`` and override ``supports`` and ``run``."""

    name = ""
    #: ``auto`` tries backends in increasing priority
    priority = 100
    #: devices on which ``auto`` may pick this backend (``None``: every device)
    auto_devices: tuple[str, ...] | None = None

    def supports(self, spec: AttentionSpec, call: Call) -> str | None:
        """``None`` if this backend computes ``spec`` exactly for ``call``; else the one-line reason."""
        return None

    def auto_ok(self, spec: AttentionSpec, call: Call) -> bool:
        """Whether ``auto`` may pick this backend for ``call`` (a preference, not a correctness rule)."""
        return self.auto_devices is None or call.device in self.auto_devices

    def no_backward(self, device: str) -> str | None:
        """Why this backend cannot run a backward pass on ``device`` (``"has no backward on ..."``), or ``None``."""
        return None

    def run(self, spec: AttentionSpec, call: Call) -> tuple[Tensor, Tensor | None]:
        """``(out [B, h, Tq, d_v], weights or None)``."""
        raise NotImplementedError


# ----------------------------------------------------------------------------------- eager
def _eager(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    combined: Tensor | None,
    scale: float,
    dropout: float,
    probe: Callable | None,
    spec: AttentionSpec,
) -> tuple[Tensor, Tensor]:
    """``softmax(transform(q k^T * scale) + mask) v`` in fp32 (also under autocast); returns the weights.

    ``spec.transform`` soft-caps the scaled logits before the bias and mask in ``combined``;
    ``spec.sinks [h]`` join each row's softmax as one extra logit that is dropped afterwards.
    """
    if k.shape[1] != q.shape[1]:  # GQA: query head h reads kv head h // (h / h_kv)
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # [B, h, Tk, d]
    blind = None  # [B, h, Tq, 1]: queries that see no key, when there are any
    with torch.autocast(device_type=q.device.type, enabled=False):
        scores = torch.matmul(q.float(), k.float().transpose(-2, -1)) * scale  # [B, h, Tq, Tk] fp32
        if combined is not None and combined.dtype == torch.bool:
            scores = spec.transform(scores).masked_fill(~combined, float("-inf"))
        else:
            scores = spec.transform(scores, combined.float() if combined is not None else None)
        if combined is not None:
            # a query that sees no key (sliding window + padding): zero weights and output, as SDPA
            # gives, instead of 0/0 = NaN (masked before the softmax so no NaN reaches the backward);
            # one reduction finds such rows, and the two fills run only when there is one
            blind = torch.isneginf(scores.amax(dim=-1, keepdim=True))  # [B, h, Tq, 1]
            if not bool(blind.any()):
                blind = None
            else:
                scores = scores.masked_fill(blind, 0.0)
        if spec.sinks is not None:
            sink = spec.sinks.float().view(1, -1, 1, 1).expand(scores.shape[0], -1, scores.shape[2], 1)  # [B, h, Tq, 1]
            weights = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1]  # fp32, sink column dropped
        else:
            weights = torch.softmax(scores, dim=-1)  # fp32 softmax
        if blind is not None:
            weights = weights.masked_fill(blind, 0.0)
    if probe is not None:
        weights = probe(weights)
    attn = F.dropout(weights, p=dropout) if dropout > 0 else weights
    return torch.matmul(attn.to(v.dtype), v), weights  # [B, h, Tq, d_v]


def _eager_tile(
    spec: AttentionSpec, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, attn_mask: Tensor | None
) -> Tensor | None:
    """The rule, the user mask and the bias of one ``[tq, tk]`` tile as one bool or float tensor."""
    bias = spec.bias_fn(q, k, q_pos, k_pos) if spec.bias_fn is not None else None
    return combine_float(merge_masks(spec.keep(q_pos[:, None], k_pos[None, :]), attn_mask), bias)


class Eager(Backend):
    """Explicit fp32 softmax; the only backend that returns weights."""

    name = "eager"
    priority = 30

    def run(self, spec: AttentionSpec, call: Call) -> tuple[Tensor, Tensor | None]:
        q, k, v = call.q, call.k, call.v
        watched = call.probe is not None and bool(
            getattr(call.probe, "_forward_hooks", None) or getattr(call.probe, "_forward_pre_hooks", None)
        )
        if (
            spec.reshapes_scores()
            and not call.need_weights
            and not watched
            and q.shape[2] > call.query_chunk
            and call.sorted()
        ):
            # a score transform SDPA cannot apply, no weights wanted: eager in query blocks, linear memory in T

            def run_block(qb: Tensor, kb: Tensor, vb: Tensor, qp: Tensor, kp: Tensor, mask: Tensor | None) -> Tensor:
                return _eager(
                    qb, kb, vb, _eager_tile(spec, qb, kb, qp, kp, mask), call.scale, call.dropout, None, spec
                )[0]

            return blocked(run_block, spec, call, keeps_tiles=True), None
        check_eager_scores(q.shape[0], q.shape[1], q.shape[2], k.shape[2])  # refuse what would exhaust the RAM
        combined = _eager_tile(spec, q, k, call.q_pos, call.k_pos, call.attn_mask)
        return _eager(q, k, v, combined, call.scale, call.dropout, call.probe, spec)


# ------------------------------------------------------------------------------------ sdpa
def _append_zero_key(k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """One more key and value, both zero: ``[B, h_kv, Tk+1, d]`` each (where a sink's logit goes)."""
    k = torch.cat((k, k.new_zeros(k.shape[0], k.shape[1], 1, k.shape[3])), dim=2)  # [B, hkv, Tk+1, dk]
    v = torch.cat((v, v.new_zeros(v.shape[0], v.shape[1], 1, v.shape[3])), dim=2)  # [B, hkv, Tk+1, dv]
    return k, v


def _with_sink_column(
    q: Tensor, k: Tensor, v: Tensor, combined: Tensor | None, sinks: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Sinks for SDPA: one more key and value, both zero, whose float-mask entry is the head's sink.

    Its logit is ``0 * scale + sink``, so ``exp(sink)`` joins the denominator and nothing the output.
    """
    B, h, Tq, _ = q.shape
    Tk = k.shape[2]
    if combined is None:
        combined = torch.zeros(1, 1, Tq, Tk, dtype=q.dtype, device=q.device)
    elif combined.dtype == torch.bool:
        combined = torch.zeros(combined.shape, dtype=q.dtype, device=q.device).masked_fill(~combined, float("-inf"))
    if combined.dim() == 2:
        combined = combined[None, None]  # [Tq, Tk] -> [1, 1, Tq, Tk]
    combined = combined.expand(combined.shape[0], h, Tq, Tk)  # [B|1, h, Tq, Tk]
    sink = sinks.to(combined.dtype).view(1, h, 1, 1).expand(combined.shape[0], h, Tq, 1)  # [B|1, h, Tq, 1]
    combined = torch.cat((combined, sink), dim=-1)  # [B|1, h, Tq, Tk+1]
    k, v = _append_zero_key(k, v)
    return k, v, combined


def _fused_causal_sinks(
    q: Tensor, k: Tensor, v: Tensor, sinks: Tensor, scale: float, dropout: float, gqa: bool
) -> Tensor:
    """Causal attention with a learned sink logit per head, in one fused SDPA call (linear memory in ``T``).

    The sink becomes a key in front of the sequence, and the queries get :data:`SINK_PAD` more head
    dims: query head ``h`` carries ``sink_h / scale`` in the first of them, the sink key a 1 and every
    real key a 0, so the sink's logit is ``sink_h`` and every other logit is unchanged. An all-zero
    query row in front keeps SDPA's top-left causal mask aligned (query ``i`` then sees the sink and
    keys ``0 .. i``); its output row is dropped. Values get a zero row for the sink (so it joins the
    denominator only) and are padded to the query width, which SDPA's fused CPU kernels require.

    Args:
        q: ``[B, h, T, d_k]``; k: ``[B, h_kv, T, d_k]``; v: ``[B, h_kv, T, d_v]`` (same positions, increasing).
        sinks: ``[h]`` sink logits.

    Returns:
        ``[B, h, T, d_v]``.
    """
    B, h, T, dk = q.shape
    hkv, dv = k.shape[1], v.shape[3]
    width = max(dk + SINK_PAD, dv)
    sink_q = (sinks.to(q.dtype) / scale).view(1, h, 1, 1).expand(B, h, T, 1)  # [B, h, T, 1]
    q_ext = torch.cat((q, sink_q, q.new_zeros(B, h, T, width - dk - 1)), dim=-1)  # [B, h, T, width]
    q_ext = torch.cat((q_ext.new_zeros(B, h, 1, width), q_ext), dim=2)  # [B, h, 1+T, width]: a dropped row in front
    sink_key = k.new_zeros(B, hkv, 1, width)
    sink_key[..., dk] = 1.0  # the sink's dot product with query head h: sink_h / scale
    k_ext = torch.cat((sink_key, F.pad(k, (0, width - dk))), dim=2)  # [B, hkv, 1+T, width]
    v_ext = F.pad(v, (0, width - dv, 1, 0))  # [B, hkv, 1+T, width]: a zero value for the sink, zero-padded
    with _cpu_lowp_kernel(q_ext):
        out = F.scaled_dot_product_attention(
            q_ext, k_ext, v_ext, dropout_p=dropout, is_causal=True, scale=scale, enable_gqa=gqa
        )  # [B, h, 1+T, width]
    return out[:, :, 1:, :dv]  # [B, h, T, d_v]


def _cpu_lowp_kernel(q: Tensor) -> contextlib.AbstractContextManager:
    """SDPA's math kernel for short bf16/fp16 sequences on CPU (see :data:`CPU_LOWP_MATH_MAX_T`), else no change."""
    if q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16) and q.shape[2] <= CPU_LOWP_MATH_MAX_T:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(SDPBackend.MATH)
    return contextlib.nullcontext()


def _sdpa_mask(
    spec: AttentionSpec, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, attn_mask: Tensor | None
) -> Tensor | None:
    """The position rule, user mask and bias of one SDPA call combined into one (bool or float) mask."""
    keep = spec.keep(q_pos[:, None], k_pos[None, :])  # [Tq, Tk] or None
    if keep is not None and q_pos.shape[0] == 1 and bool(keep.all()):
        keep = None  # decoding inside the window: nothing to mask
    bias = spec.bias_fn(q, k, q_pos, k_pos) if spec.bias_fn is not None else None
    combined = combine_float(merge_masks(keep, attn_mask), bias)
    if combined is not None and combined.dtype != torch.bool:
        combined = combined.to(q.dtype)
    return combined


def _sdpa_block(
    q: Tensor, k: Tensor, v: Tensor, combined: Tensor | None, spec: AttentionSpec, scale: float, dropout: float
) -> Tensor:
    """One SDPA call under the mask :func:`_sdpa_mask` combined (the spec's sinks joined as a key column)."""
    if spec.sinks is not None:
        k, v, combined = _with_sink_column(q, k, v, combined, spec.sinks)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=combined, dropout_p=dropout, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
    )


def _blocked_sdpa(spec: AttentionSpec, call: Call) -> Tensor:
    """SDPA in query blocks (:func:`~poslab.nn.attention.blocked.blocked`), each over only its reach."""

    def run_block(qb: Tensor, kb: Tensor, vb: Tensor, qp: Tensor, kp: Tensor, mask: Tensor | None) -> Tensor:
        return _sdpa_block(qb, kb, vb, _sdpa_mask(spec, qb, kb, qp, kp, mask), spec, call.scale, call.dropout)

    mask = call.attn_mask
    float_bias = spec.bias_fn is not None or (mask is not None and mask.dtype != torch.bool)
    return blocked(run_block, spec, call, keeps_tiles=float_bias)


class Sdpa(Backend):
    """``F.scaled_dot_product_attention`` (fused kernels where the spec allows them)."""

    name = "sdpa"
    priority = 20

    def supports(self, spec: AttentionSpec, call: Call) -> str | None:
        if spec.softcap is not None:
            return (
                f"softcap={spec.softcap} (attention logit soft-capping) cannot run in the sdpa backend; "
                "use backend='eager', 'flex' or 'auto'"
            )
        return None

    def run(self, spec: AttentionSpec, call: Call) -> tuple[Tensor, Tensor | None]:
        q, k, v = call.q, call.k, call.v
        gqa = q.shape[1] != k.shape[1]
        terms = spec.term_names()
        plain = spec.bias_fn is None and call.attn_mask is None
        if plain and spec.sinks is None and terms == {"causal"} and call.one_run(spec):
            # one increasing run of positions shared by q and k: the fused causal kernel is exact
            with _cpu_lowp_kernel(q):
                out = F.scaled_dot_product_attention(
                    q, k, v, dropout_p=call.dropout, is_causal=True, scale=call.scale, enable_gqa=gqa
                )
            return out, None
        if plain and spec.sinks is None and not terms:
            return F.scaled_dot_product_attention(
                q, k, v, dropout_p=call.dropout, scale=call.scale, enable_gqa=gqa
            ), None
        if plain and spec.sinks is not None and terms == {"causal"} and call.one_run(spec):
            return _fused_causal_sinks(q, k, v, spec.sinks, call.scale, call.dropout, gqa), None
        if q.shape[2] > call.query_chunk and call.sorted():
            return _blocked_sdpa(spec, call), None
        combined = _sdpa_mask(spec, q, k, call.q_pos, call.k_pos, call.attn_mask)
        return _sdpa_block(q, k, v, combined, spec, call.scale, call.dropout), None


# ------------------------------------------------------------------------------------ flex
_FLEX = None


def _compiled_flex() -> Callable:
    """``torch.compile``d FlexAttention (the only form that runs on CPU, forward only; fused on CUDA)."""
    global _FLEX
    if _FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention

        _FLEX = torch.compile(flex_attention, dynamic=False)
    return _FLEX


def _pad_len(n: int, block: int) -> int:
    return -(-n // block) * block


class Flex(Backend):
    """FlexAttention: the spec's rule as ``mask_mod``, its score transform as ``score_mod``."""

    name = "flex"
    priority = 10
    auto_devices = ("cuda",)

    def supports(self, spec: AttentionSpec, call: Call) -> str | None:
        if call.attn_mask is not None:
            return "the flex backend takes no attn_mask; use sdpa or eager for explicit masks"
        if spec.bias_fn is not None and spec.score_mod is None:
            return "the flex backend cannot express this bias (it has no score_mod); use sdpa or eager"
        reason = self.no_backward(call.device)
        if reason is not None and call.records_grad(spec):
            return f"the flex backend {reason}; use sdpa or eager to train on CPU, or run under torch.no_grad()"
        return None

    def no_backward(self, device: str) -> str | None:
        return f"has no backward on CPU (torch {torch.__version__}'s FlexAttention)" if device == "cpu" else None

    def auto_ok(self, spec: AttentionSpec, call: Call) -> bool:
        # one decoded token has no block to skip: SDPA needs no block mask
        return super().auto_ok(spec, call) and call.q.shape[2] > 1

    def run(self, spec: AttentionSpec, call: Call) -> tuple[Tensor, Tensor | None]:
        from torch.nn.attention.flex_attention import create_block_mask

        q, k, v, q_pos, k_pos = call.q, call.k, call.v, call.q_pos, call.k_pos
        Tq, Tk = q.shape[2], k.shape[2]
        sinks = spec.sinks
        if sinks is not None:  # one all-zero key/value at index Tk that every query may see, scored as the sink
            k, v = _append_zero_key(k, v)
        # CPU: pad to a multiple of the kernel's block (padded keys masked, padded query rows dropped)
        pad = q.device.type == "cpu" and bool(Tq % FLEX_CPU_BLOCK or k.shape[2] % FLEX_CPU_BLOCK)
        if pad:
            P_q, P_k = _pad_len(Tq, FLEX_CPU_BLOCK), _pad_len(k.shape[2], FLEX_CPU_BLOCK)
            q = F.pad(q, (0, 0, 0, P_q - Tq))  # [B, h, P_q, dk]
            k, v = F.pad(k, (0, 0, 0, P_k - k.shape[2])), F.pad(v, (0, 0, 0, P_k - v.shape[2]))  # [B, hkv, P_k, d]
        # positions of every (padded) row and column, the last one repeated: the rule and the scheme's
        # score_mod index them directly, and their shapes depend on the padded lengths only, so one
        # compiled kernel serves every length that pads to the same size
        qp_all = torch.cat((q_pos, q_pos[-1:].expand(q.shape[2] - Tq)))  # [P_q]
        kp_all = torch.cat((k_pos, k_pos[-1:].expand(k.shape[2] - Tk)))  # [P_k]
        n_real = torch.tensor(Tk, device=q.device)  # index of the sink key; keys at or past it are padding
        if isinstance(spec.score_mod, LazyScoreMod):
            inner, qi_max, ki_max = spec.score_mod(qp_all, kp_all), None, None
        else:  # a score_mod made for the unpadded positions: clamp its indices into them
            inner, qi_max, ki_max = spec.score_mod, Tq - 1, Tk - 1

        def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            qp, kp = qp_all[q_idx], kp_all[kv_idx]
            keep = spec.keep(qp, kp)
            keep = (kp == kp) if keep is None else keep
            if sinks is not None or pad:
                keep = keep & (kv_idx < n_real)
            if sinks is not None:
                keep = keep | (kv_idx == n_real)
            return keep

        score_mod = None
        if spec.reshapes_scores() or inner is not None or sinks is not None:

            def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
                qi = q_idx if qi_max is None else q_idx.clamp(max=qi_max)
                ki = kv_idx if ki_max is None else kv_idx.clamp(max=ki_max)
                score = spec.transform(score, (lambda s: inner(s, b, h, qi, ki)) if inner is not None else None)
                if sinks is not None:
                    score = torch.where(kv_idx == n_real, sinks[h].to(score.dtype), score)
                return score

        block_mask = None
        if spec.terms() or sinks is not None or pad:
            block_mask = create_block_mask(mask_mod, None, None, q.shape[2], k.shape[2], device=q.device.type)
        run = _compiled_flex()  # eager flex_attention is a slow reference implementation on every device
        out = run(
            q, k, v, score_mod=score_mod, block_mask=block_mask, scale=call.scale, enable_gqa=q.shape[1] != k.shape[1]
        )
        return (out[:, :, :Tq] if pad else out), None  # [B, h, Tq, d_v]


#: the backends by name (``auto`` tries them in increasing :attr:`Backend.priority`; :func:`register_backend` adds one)
REGISTRY: dict[str, Backend] = {b.name: b for b in (Sdpa(), Eager(), Flex())}
#: the built-in backend names (``auto`` first); :func:`backend_names` also lists registered ones
BACKENDS: tuple[str, ...] = ("auto", *REGISTRY)


def register_backend(backend: Backend) -> None:
    """Add ``backend`` to the registry (``auto`` then tries it by its ``priority``)."""
    if not isinstance(backend, Backend) or not backend.name or backend.name == "auto":
        raise ValueError(f"a backend is a Backend instance with a name other than 'auto', got {backend!r}")
    register(REGISTRY, backend.name, backend, "backend")


def unregister_backend(name: str) -> None:
    """Remove a backend added by :func:`register_backend`."""
    unregister(REGISTRY, name, BACKENDS, "backend")


def backend_names() -> tuple[str, ...]:
    """``("auto", ...)`` followed by every registered backend."""
    return ("auto", *REGISTRY)


def check_backend_name(backend: str) -> None:
    """``ValueError`` naming the choices unless ``backend`` is ``auto`` or a registered backend."""
    if backend not in backend_names():
        raise ValueError(f"unknown attention backend {backend!r}; choose one of {list(backend_names())}")


def backend_trains(backend: str, device: str) -> str | None:
    """``None`` if ``backend`` can run a backward pass on ``device`` (``auto`` always picks one that
    can), else the backend's reason (:meth:`Backend.no_backward`): what training asks before it starts."""
    check_backend_name(backend)
    return None if backend == "auto" else REGISTRY[backend].no_backward(device)


def resolve(requested: str, spec: AttentionSpec, call: Call) -> Backend:
    """The backend that runs ``call``: ``eager`` for weights, the explicit one if it supports the call
    (else ``ValueError`` with its reason), or ``auto``'s first preferred backend that supports it."""
    check_backend_name(requested)
    if call.need_weights:
        return REGISTRY["eager"]
    if requested != "auto":
        backend = REGISTRY[requested]
        reason = backend.supports(spec, call)
        if reason is not None:
            raise ValueError(reason)
        return backend
    for backend in sorted(REGISTRY.values(), key=lambda b: b.priority):
        if backend.auto_ok(spec, call) and backend.supports(spec, call) is None:
            return backend
    raise ValueError(f"no attention backend supports this call: {[b.supports(spec, call) for b in REGISTRY.values()]}")
