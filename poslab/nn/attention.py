"""Multi-head attention with fused qkv, GQA/MQA, KV cache, sliding window and three backends.

The head split and merge follow the lessons exactly::

    x [B, T, d] --qkv--> q [B, T, h*d_k] --view--> [B, T, h, d_k] --transpose--> [B, h, T, d_k]
    softmax(q k^T / sqrt(d_k) + bias) v                                        -> [B, h, T, d_k]
    --transpose--> [B, T, h, d_k] --reshape--> [B, T, d] --proj--> [B, T, d]

A position scheme is injected; attention calls its hooks at fixed places with explicit positions
(``rotate`` on q/k, ``score_bias`` on the logits), so offsets, KV-cache decoding and extrapolation
share one code path. Every mask is a function of the positions, never of tensor indices:

* causal: query at position ``i`` sees keys ``j <= i``;
* sliding window ``W`` (Hugging Face / Mistral semantics): ``i - W < j <= i``, i.e. ``W`` keys
  including itself (flash-attn's ``window_size=(W-1, 0)``); without ``causal`` the window is
  symmetric, ``|i - j| < W``.

Backends (``backend=``):
    * ``auto`` (default): ``eager`` when weights are requested, ``flex`` on CUDA (where FlexAttention
      compiles with a backward), ``sdpa`` otherwise.
    * ``sdpa``: ``F.scaled_dot_product_attention``. It picks one of three execution paths:

      - the fused ``is_causal`` kernel when there is no bias, mask or window and the positions are
        one increasing run shared by queries and keys (memory linear in ``T``);
      - the *blocked* path when a bias, a mask or a sliding window meets more than ``query_chunk``
        queries: queries are cut into blocks of ``query_chunk``; each block attends only to the
        keys within its reach (``searchsorted`` on the sorted key positions: the causal past, or
        the window) with its own slice of the float bias, so ``[B, h, T, T]`` is never
        materialised. Causal blocks skip the future keys (about half the work); a sliding window
        ``W`` costs ``O(T (W + chunk))`` instead of ``O(T^2)``. From ``T_k >= recompute_threshold``
        keys, a float bias spanning the whole causal past is not kept for backward: each block is
        checkpointed and recomputes its bias, so memory stays linear in ``T``;
      - one call with the combined mask otherwise (short sequences, unsorted positions).

    * ``eager``: explicit ``softmax(q k^T)`` computed in fp32 even under autocast; returns weights.
    * ``flex``: FlexAttention with the scheme's ``score_mod`` and a positional ``mask_mod`` (CPU:
      compiled, forward only).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from poslab.nn.footprint import check_eager_scores
from poslab.nn.positions.base import PositionScheme

BACKENDS = ("auto", "sdpa", "eager", "flex")

#: queries per block in the blocked path
DEFAULT_QUERY_CHUNK = 128
#: key count from which the blocked path recomputes float biases in backward instead of keeping them
DEFAULT_RECOMPUTE_THRESHOLD = 2048
#: on CPU, a bf16/fp16 fused causal call with at most this many queries runs SDPA's math kernel: at
#: T = 64 and 128 the CPU flash kernel's forward + backward took 2.0-2.3x the math path's in bf16
#: (fp32: flash 1.4x faster; T = 256 bf16: flash 1.1x faster), ``benchmarks/sdpa_small_t.py``
CPU_LOWP_MATH_MAX_T = 128

#: ``bias_fn(q, k, q_pos, k_pos) -> [B|1, h, Tq, Tk]`` fp32 additive bias or ``None``
BiasFn = Callable[[Tensor, Tensor, Tensor, Tensor], "Tensor | None"]


class SplitHeads(nn.Module):
    """``[B, T, n*d_k] -> [B, n, T, d_k]`` (a module so forward hooks can watch the shapes)."""

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        return x.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)  # [B, T, n, d_k] -> [B, n, T, d_k]


class MergeHeads(nn.Module):
    """``[B, h, T, d_k] -> [B, T, h*d_k]``."""

    def forward(self, x: Tensor) -> Tensor:
        B, h, T, dk = x.shape
        return x.transpose(1, 2).reshape(B, T, h * dk)  # [B, h, T, d_k] -> [B, T, h, d_k] -> [B, T, d]


# ------------------------------------------------------------------------------------- KV cache
class KVCache(nn.Module):
    """Preallocated key/value cache indexed by explicit positions (gpt-fast style).

    Stores ``n_kv_heads`` heads (GQA-aware) and keys *after* ``rotate`` (before it for a scheme with
    ``rotate_needs_all_keys``, xPos, which attention then rotates on every call), together with each
    entry's position, so bias schemes (ALiBi, T5, ...) and rotary schemes see the true positions of
    cached keys whatever order they are stored in.

    Two layouts:

    * ``rolling=False``: appends up to ``capacity`` tokens; one more raises ``ValueError``.
    * ``rolling=True`` (sliding-window models): a ring buffer keeping only the most recent
      ``capacity`` tokens, so decoding runs forever in ``O(capacity)`` memory. Attention checks that
      its window fits (``window <= capacity``): older keys are out of every query's reach.
    * ``rolling=True, memory=True`` (Transformer-XL's segment memory at evaluation, Dai et al. 2019):
      every write of ``T`` tokens attends the previous ``capacity`` tokens plus itself (causally), for
      any ``T`` and whatever the attention's window; it is the KV-cache form of
      :class:`~poslab.nn.memory.SegmentMemory` with ``mem_len = capacity``.

    Attributes:
        length: tokens written so far (the default position of the next token).
        size: entries currently held (``min(length, capacity)`` for a rolling cache).

    Args:
        batch_size, n_kv_heads, head_dim: cache geometry.
        capacity: maximum number of tokens held.
        dtype, device: storage (must match the keys written).
        rolling: ring buffer that forgets the oldest tokens instead of overflowing.
        memory: segment-memory semantics (needs ``rolling``): every write attends the previous
            ``capacity`` tokens plus itself, so attention accepts the cache without a window.
    """

    def __init__(
        self,
        batch_size: int,
        n_kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        *,
        rolling: bool = False,
        memory: bool = False,
    ) -> None:
        super().__init__()
        if memory and not rolling:
            raise ValueError("a segment-memory KV cache (memory=True) is a ring buffer: pass rolling=True as well")
        for label, value in (("batch_size", batch_size), ("n_kv_heads", n_kv_heads), ("head_dim", head_dim), ("capacity", capacity)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"KV cache {label} must be an integer, got {value!r}")
            if value <= 0:
                raise ValueError(f"KV cache {label} must be > 0, got {value}")
        shape = (batch_size, n_kv_heads, capacity, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("pos", torch.zeros(capacity, dtype=torch.long, device=device), persistent=False)
        self.capacity = capacity
        self.rolling = rolling
        self.memory = memory
        self.length = 0
        self.size = 0

    def reset(self) -> None:
        """Forget every cached token."""
        self.length = 0
        self.size = 0

    def _check(self, k: Tensor, v: Tensor, pos: Tensor) -> None:
        B, hkv, _, dk = self.k.shape
        if k.dim() != 4 or k.shape[0] != B or k.shape[1] != hkv or k.shape[3] != dk:
            raise ValueError(f"keys of shape {list(k.shape)} do not fit this KV cache: expected [{B}, {hkv}, T, {dk}]")
        if v.shape != k.shape:
            raise ValueError(f"values {list(v.shape)} and keys {list(k.shape)} must have the same shape")
        if k.dtype != self.k.dtype or v.dtype != self.k.dtype:
            raise TypeError(
                f"KV cache holds {self.k.dtype} but keys/values are {k.dtype}/{v.dtype}; "
                f"make the cache with dtype={k.dtype}"
            )
        if k.device != self.k.device or v.device != self.k.device:
            raise ValueError(f"KV cache is on {self.k.device} but keys/values are on {k.device}/{v.device}")
        if pos.shape != (k.shape[2],):
            raise ValueError(f"pos must have shape [{k.shape[2]}] (one position per new key), got {list(pos.shape)}")

    def update(self, k: Tensor, v: Tensor, pos: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Write ``k, v [B, h_kv, T, d_k]`` at positions ``[T]``.

        Returns:
            Every key, value and position the new queries may need: ``[B, h_kv, Tk, d_k]`` twice and
            ``[Tk]``. For a rolling cache that is full, the entries come in ring order (attention masks
            by position, so order does not matter), and a multi-token write returns the previous
            ``capacity`` entries followed by all ``T`` new ones (also for ``T = 1`` with ``memory``).
        """
        self._check(k, v, pos)
        T = k.shape[2]
        pos = pos.to(self.pos.device)
        if not self.rolling or self.size + T <= self.capacity:
            if self.size + T > self.capacity:
                raise ValueError(
                    f"KV cache overflow: {self.size} cached + {T} new tokens > capacity {self.capacity}; "
                    "make a larger cache (or a rolling one for a sliding-window model)"
                )
            end = self.size + T
            self.k[:, :, self.size : end] = k
            self.v[:, :, self.size : end] = v
            self.pos[self.size : end] = pos
            self.size, self.length = end, self.length + T
            return self.k[:, :, :end], self.v[:, :, :end], self.pos[:end]
        # rolling and the ring overflows: slot of the n-th token written is n % capacity
        C = self.capacity
        if T == 1 and not self.memory:  # decode: overwrite the oldest entry, then read the whole ring
            slot = self.length % C
            self.k[:, :, slot : slot + 1] = k
            self.v[:, :, slot : slot + 1] = v
            self.pos[slot : slot + 1] = pos
            self.size, self.length = C, self.length + 1
            return self.k, self.v, self.pos
        # several tokens: the new queries need the old entries too, so return old + new
        k_all = torch.cat((self.k[:, :, : self.size], k), dim=2)  # [B, hkv, size+T, dk]
        v_all = torch.cat((self.v[:, :, : self.size], v), dim=2)  # [B, hkv, size+T, dk]
        pos_all = torch.cat((self.pos[: self.size], pos))  # [size+T]
        keep = min(T, C)
        slots = (torch.arange(self.length + T - keep, self.length + T, device=self.pos.device)) % C  # [keep]
        self.k[:, :, slots] = k[:, :, T - keep :]
        self.v[:, :, slots] = v[:, :, T - keep :]
        self.pos[slots] = pos[T - keep :]
        self.size, self.length = C, self.length + T
        return k_all, v_all, pos_all

    def extra_repr(self) -> str:
        B, hkv, C, dk = self.k.shape
        return f"batch={B}, kv_heads={hkv}, capacity={C}, head_dim={dk}, rolling={self.rolling}, memory={self.memory}, length={self.length}"


# ----------------------------------------------------------------------------- functional core
def position_mask(q_pos: Tensor, k_pos: Tensor, causal: bool, window: int | None, chunk: int | None = None) -> Tensor | None:
    """Boolean keep-mask ``[Tq, Tk]`` (True = attend) from positions, or ``None`` for "keep all".

    Causal: ``j <= i``. Window ``W``: ``i - W < j`` (and ``j < i + W`` when not causal). Chunk ``C``
    (Llama 4's chunked local attention): ``j // C == i // C``.
    """
    keep = None
    if causal:
        keep = k_pos[None, :] <= q_pos[:, None]  # [Tq, Tk]
    if window is not None:
        distance = q_pos[:, None] - k_pos[None, :]  # [Tq, Tk]
        in_window = distance < window if causal else distance.abs() < window
        keep = in_window if keep is None else keep & in_window
    if chunk is not None:
        same = torch.div(k_pos[None, :], chunk, rounding_mode="floor") == torch.div(q_pos[:, None], chunk, rounding_mode="floor")  # [Tq, Tk]
        keep = same if keep is None else keep & same
    return keep


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
) -> tuple[Tensor, Tensor | None]:
    """Scaled dot-product attention over explicit positions (the core every module here calls).

    Args:
        q: ``[B, h, Tq, d_k]``; k: ``[B, h_kv, Tk, d_k]``; v: ``[B, h_kv, Tk, d_v]`` (``h_kv`` divides ``h``).
        q_pos: ``[Tq]`` int positions of the queries; k_pos: ``[Tk]`` of the keys.
        causal, window: positional masks (see :func:`position_mask`).
        bias_fn: additive fp32 logit bias, called as ``bias_fn(q, k, q_pos, k_pos)`` on whatever block of
            queries and keys is being computed, returning ``[B|1, h, tq, tk]`` (or ``None``).
        attn_mask: ``[Tq, Tk]`` or ``[B|1, h|1, Tq, Tk]``; bool (True = attend) or float (added; fp32
            or ``q``'s dtype).
        scale: softmax scale (default ``1/sqrt(d_k)``).
        dropout: attention-weight dropout probability (pass 0 at eval).
        backend: ``auto``/``sdpa``/``eager``/``flex`` (see the module docstring).
        need_weights: also return the ``[B, h, Tq, Tk]`` fp32 weights (forces ``eager``).
        score_mod: FlexAttention score_mod equivalent to ``bias_fn`` (flex backend only).
        query_chunk: the blocked path's query block (it runs when there are more queries than this).
        recompute_threshold: key count from which blocks recompute float biases in backward.
        probe: applied to the eager weights (a hook point for visualisation).
        softcap: logit soft-capping ``c * tanh(s / c)`` of the scaled logits ``s = q k^T * scale``,
            before any bias or mask (Gemma 2). Not expressible in ``sdpa``: ``auto`` picks ``eager``
            (``flex`` on CUDA); an explicit ``sdpa`` raises.
        sinks: ``[h]`` learned sink logits (gpt-oss): one extra logit per head joins every row's
            softmax denominator and is dropped after it (the weights then sum to < 1). ``sdpa`` and
            ``flex`` run it as an extra all-zero key/value whose logit is the sink.
        chunk: chunked local attention ``j // C == i // C`` (Llama 4), on top of ``causal``/``window``.
        increasing: the caller knows ``q_pos`` is strictly increasing (``True``: the model made it with
            ``arange``); ``None`` = look at the values. Lets ``torch.compile`` trace the fused causal
            path without a data-dependent branch (a graph break).

    Returns:
        ``(out [B, h, Tq, d_v], weights or None)``.
    """
    check_qkv(q, k, v, q_pos, k_pos)
    if attn_mask is not None:
        attn_mask = check_mask(attn_mask, q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.device, q.dtype)
    requested = backend
    backend = resolve_backend(backend, q.device, need_weights, has_mask=attn_mask is not None)
    backend = mechanism_backend(requested, backend, softcap)
    check_mechanisms(q.shape[1], softcap, sinks, chunk)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    if backend == "eager" and _blocked_eager_ok(q, q_pos, k_pos, softcap, need_weights, probe, query_chunk):
        # soft-capped attention without weights: eager in query blocks, linear memory in T
        recompute = k.shape[2] >= recompute_threshold and torch.is_grad_enabled()
        out = _blocked_sdpa(q, k, v, q_pos, k_pos, causal, window, bias_fn, attn_mask, scale, dropout, query_chunk, recompute,
                            chunk=chunk, sinks=sinks, softcap=softcap)
        return out, None
    if backend == "eager":
        check_eager_scores(q.shape[0], q.shape[1], q.shape[2], k.shape[2])  # refuse what would exhaust the RAM
        bias = bias_fn(q, k, q_pos, k_pos) if bias_fn is not None else None
        mask = _merge_masks(position_mask(q_pos, k_pos, causal, window, chunk), attn_mask)
        return _eager(q, k, v, _combine_float(mask, bias), scale, dropout, probe, softcap=softcap, sinks=sinks)
    if backend == "flex":
        if attn_mask is not None:
            raise ValueError("the flex backend takes no attn_mask; use sdpa or eager for explicit masks")
        if bias_fn is not None and score_mod is None:
            raise ValueError("the flex backend needs a score_mod for this bias; use sdpa or eager")
        return _flex(q, k, v, q_pos, k_pos, causal, window, score_mod, scale, chunk=chunk, softcap=softcap, sinks=sinks), None
    # sdpa
    Tq, Tk = q.shape[2], k.shape[2]
    gqa = q.shape[1] != k.shape[1]
    plain = bias_fn is None and attn_mask is None and window is None and chunk is None and sinks is None

    def one_run() -> bool:  # q and k share one increasing run of positions: SDPA's is_causal is exact
        return (causal and Tq == Tk and (q_pos is k_pos or torch.equal(q_pos, k_pos))
                and (increasing if increasing is not None else _increasing(q_pos)))

    if plain and one_run():
        # one increasing run of positions shared by q and k: the fused causal kernel is exact
        with _cpu_lowp_kernel(q):
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=scale, enable_gqa=gqa)
        return out, None
    if plain and not causal:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scale, enable_gqa=gqa), None
    sinks_only = (sinks is not None and bias_fn is None and attn_mask is None and window is None and chunk is None)
    if sinks_only and one_run():
        return _fused_causal_sinks(q, k, v, sinks, scale, dropout, gqa), None
    if Tq > query_chunk and _sorted(q_pos) and _sorted(k_pos):
        recompute = Tk >= recompute_threshold and torch.is_grad_enabled()
        out = _blocked_sdpa(q, k, v, q_pos, k_pos, causal, window, bias_fn, attn_mask, scale, dropout, query_chunk, recompute,
                            chunk=chunk, sinks=sinks)
        return out, None
    return _sdpa_block(q, k, v, q_pos, k_pos, causal, window, bias_fn, attn_mask, scale, dropout, chunk=chunk, sinks=sinks), None


def _blocked_eager_ok(q: Tensor, q_pos: Tensor, k_pos: Tensor, softcap: float | None, need_weights: bool,
                      probe: Callable | None, query_chunk: int) -> bool:
    """Whether soft-capped eager attention runs in query blocks (no weights wanted, none watched, sorted positions)."""
    watched = probe is not None and bool(getattr(probe, "_forward_hooks", None) or getattr(probe, "_forward_pre_hooks", None))
    return (softcap is not None and not need_weights and not watched and q.shape[2] > query_chunk
            and _sorted(q_pos) and _sorted(k_pos))


def mechanism_backend(requested: str, resolved: str, softcap: float | None) -> str:
    """The backend that can run the attention mechanisms asked for (never one that would drop them).

    Soft-capping is a ``tanh`` of the logits, which ``F.scaled_dot_product_attention`` cannot apply:
    ``auto`` moves from ``sdpa`` to ``eager``; an explicit ``sdpa`` is refused.
    """
    if softcap is None or resolved != "sdpa":
        return resolved
    if requested == "sdpa":
        raise ValueError(
            f"softcap={softcap} (attention logit soft-capping) cannot run in the sdpa backend; "
            "use backend='eager', 'flex' or 'auto'"
        )
    return "eager"


def check_mechanisms(n_heads: int, softcap: float | None, sinks: Tensor | None, chunk: int | None) -> None:
    """Raise a clear error for a bad soft-cap, sink tensor or chunk size."""
    if softcap is not None and (isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not 0 < softcap < math.inf):
        raise ValueError(f"softcap must be a positive finite number or None, got {softcap!r}")
    if sinks is not None and (not isinstance(sinks, Tensor) or sinks.shape != (n_heads,)):
        raise ValueError(f"sinks must be a tensor of shape [{n_heads}] (one logit per query head), got {getattr(sinks, 'shape', sinks)!r}")
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk <= 0):
        raise ValueError(f"chunk must be a positive integer (tokens per attention chunk) or None, got {chunk!r}")


def _with_sink_column(q: Tensor, k: Tensor, v: Tensor, combined: Tensor | None, sinks: Tensor) -> tuple[Tensor, Tensor, Tensor]:
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
    k = torch.cat((k, k.new_zeros(B, k.shape[1], 1, k.shape[3])), dim=2)  # [B, hkv, Tk+1, dk]
    v = torch.cat((v, v.new_zeros(B, v.shape[1], 1, v.shape[3])), dim=2)  # [B, hkv, Tk+1, dv]
    return k, v, combined


#: zero head dims appended by :func:`_fused_causal_sinks` (one carries the sink; d_k + 8 keeps SDPA's vector widths)
SINK_PAD = 8


def _fused_causal_sinks(q: Tensor, k: Tensor, v: Tensor, sinks: Tensor, scale: float, dropout: float, gqa: bool) -> Tensor:
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
        out = F.scaled_dot_product_attention(q_ext, k_ext, v_ext, dropout_p=dropout, is_causal=True, scale=scale,
                                             enable_gqa=gqa)  # [B, h, 1+T, width]
    return out[:, :, 1:, :dv]  # [B, h, T, d_v]


def _cpu_lowp_kernel(q: Tensor) -> contextlib.AbstractContextManager:
    """SDPA's math kernel for short bf16/fp16 sequences on CPU (see :data:`CPU_LOWP_MATH_MAX_T`), else no change."""
    if q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16) and q.shape[2] <= CPU_LOWP_MATH_MAX_T:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(SDPBackend.MATH)
    return contextlib.nullcontext()


def resolve_backend(backend: str, device: torch.device, need_weights: bool = False, has_mask: bool = False) -> str:
    """The concrete backend ``auto`` stands for (explicit choices pass through, validated)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; choose one of {list(BACKENDS)}")
    if need_weights:
        return "eager"
    if backend != "auto":
        return backend
    if torch.device(device).type == "cuda" and not has_mask:
        return "flex"
    return "sdpa"


def _sorted(pos: Tensor) -> bool:
    return pos.numel() <= 1 or bool((pos[1:] >= pos[:-1]).all())


def _increasing(pos: Tensor) -> bool:
    return pos.numel() <= 1 or bool((pos[1:] > pos[:-1]).all())


def _sdpa_block(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    causal: bool,
    window: int | None,
    bias_fn: BiasFn | None,
    attn_mask: Tensor | None,
    scale: float,
    dropout: float,
    chunk: int | None = None,
    sinks: Tensor | None = None,
) -> Tensor:
    """One SDPA call: positional mask, user mask and bias combined into one (bool or float) mask."""
    keep = position_mask(q_pos, k_pos, causal, window, chunk)
    if keep is not None and q_pos.shape[0] == 1 and bool(keep.all()):
        keep = None  # decoding inside the window: nothing to mask
    mask = _merge_masks(keep, attn_mask)
    bias = bias_fn(q, k, q_pos, k_pos) if bias_fn is not None else None
    combined = _combine_float(mask, bias)
    if combined is not None and combined.dtype != torch.bool:
        combined = combined.to(q.dtype)
    if sinks is not None:
        k, v, combined = _with_sink_column(q, k, v, combined, sinks)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=combined, dropout_p=dropout, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
    )


def _blocked_sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    causal: bool,
    window: int | None,
    bias_fn: BiasFn | None,
    attn_mask: Tensor | None,
    scale: float,
    dropout: float,
    query_chunk: int,
    recompute: bool = False,
    chunk: int | None = None,
    sinks: Tensor | None = None,
    softcap: float | None = None,
) -> Tensor:
    """Attention in query blocks, each over only the keys within its reach (sorted positions).

    Block ``[s, e)`` reads keys with ``q_pos[s] - W < k_pos`` (window) and ``k_pos <= q_pos[e-1]``
    (causal), found by ``searchsorted``; its bias is computed for that ``[tq, tk]`` tile only.
    Cost: ``O(T * reach * d)`` time and ``O(B h chunk reach)`` memory per block, where ``reach`` is
    ``min(T, W + chunk)`` with a window and up to ``T`` without. With ``recompute``, blocks with a
    float bias over the whole past (no window) are checkpointed: backward recomputes the bias, so the
    blocks' biases (``O(h T^2)`` together) are never all alive. With ``softcap`` each block runs the
    eager form (soft-capped fp32 logits; SDPA cannot cap), checkpointed like a float bias.
    """
    Tk, c = k.shape[2], query_chunk
    float_bias = bias_fn is not None or (attn_mask is not None and attn_mask.dtype != torch.bool)
    # a float bias over the whole causal past would be kept for backward by every block (O(T^2)):
    # recompute it in backward instead (a window bounds each block's bias: nothing to gain there)
    recompute = recompute and (float_bias or softcap is not None) and window is None
    # With autograd, slicing a block out of q/k/v costs a full-size zero tensor in backward for every
    # block (O(T^2 / c) traffic); splitting into c-sized blocks and concatenating the key blocks a
    # query block needs keeps backward to views and c-sized additions.
    track = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    q_blocks = q.split(c, dim=2)  # [B, h, c, dk] each
    k_blocks, v_blocks = (k.split(c, dim=2), v.split(c, dim=2)) if track else (None, None)

    def block(qb: Tensor, qp: Tensor, kp: Tensor, mask: Tensor | None, *kv: Tensor) -> Tensor:
        if qb.shape[0] * qb.shape[1] * qb.shape[2] * kp.shape[0] * 4 >= TRIM_TILE_BYTES:
            trim_heap()  # the previous block's tiles (forward, or backward's recompute) go back to the OS
        n = len(kv) // 2
        kb = kv[0] if n == 1 else torch.cat(kv[:n], dim=2)  # [B, hkv, tk, dk]
        vb = kv[n] if n == 1 else torch.cat(kv[n:], dim=2)  # [B, hkv, tk, dv]
        if softcap is not None:
            bias = bias_fn(qb, kb, qp, kp) if bias_fn is not None else None
            combined = _combine_float(_merge_masks(position_mask(qp, kp, causal, window, chunk), mask), bias)
            return _eager(qb, kb, vb, combined, scale, dropout, None, softcap=softcap, sinks=sinks)[0]
        return _sdpa_block(qb, kb, vb, qp, kp, causal, window, bias_fn, mask, scale, dropout, chunk=chunk, sinks=sinks)

    # Blocks run from the last to the first: a causal block's tiles (keys, bias, scores) grow with its
    # reach, so in increasing order each tile is larger than every freed one and glibc's heap (whose
    # dynamic mmap threshold rises to the largest freed block) keeps growing around the live tensors:
    # +37 / +149 / +572 MiB at T = 2048 / 4096 / 8192 for ALiBi (benchmarks/eval_memory.py,
    # --allocator default). Largest first, every later tile fits in a freed one; backward recomputes
    # checkpointed blocks in the other order, which trim_heap() covers: memory stays linear in T for
    # library users and training without any allocator setting.
    outs: list[Tensor] = [q] * len(q_blocks)  # placeholders, filled in block order below
    for i in reversed(range(len(q_blocks))):
        qb = q_blocks[i]
        s, e = i * c, i * c + qb.shape[2]
        qp = q_pos[s:e]
        lo, hi = 0, Tk
        if window is not None:
            lo = int(torch.searchsorted(k_pos, qp[:1] - window, right=True))
            if not causal:
                hi = int(torch.searchsorted(k_pos, qp[-1:] + window - 1, right=True))
        if causal:
            hi = int(torch.searchsorted(k_pos, qp[-1:], right=True))
        if chunk is not None:  # keys before the first query's chunk are out of every query's reach
            lo = max(lo, int(torch.searchsorted(k_pos, torch.div(qp[:1], chunk, rounding_mode="floor") * chunk)))
        hi = max(hi, lo + 1)  # at least one key (a row with none is NaN either way)
        if track:  # whole key blocks [a, b): the extra keys are masked by position
            a, b = lo // c, -(-hi // c)
            lo, hi = a * c, min(b * c, Tk)
            kv = (*k_blocks[a:b], *v_blocks[a:b])  # views; concatenated inside the block
        else:
            kv = (k[:, :, lo:hi], v[:, :, lo:hi])
        mask = None
        if attn_mask is not None:
            mask = attn_mask[..., s:e, lo:hi]  # [B|1, h|1, tq, tk]
        args = (qb, qp, k_pos[lo:hi], mask, *kv)
        if recompute:  # keeps only the views above for backward, never a block's keys or bias
            outs[i] = checkpoint(block, *args, use_reentrant=False)
        else:
            outs[i] = block(*args)
    return torch.cat(outs, dim=2)  # [B, h, Tq, d_v]


#: a block whose fp32 score tile is at least this large returns the freed heap to the OS first
TRIM_TILE_BYTES = 1 << 20
_MALLOC_TRIM: Callable[[int], int] | None | bool = None


def trim_heap() -> None:
    """Return free heap pages to the OS (glibc ``malloc_trim(0)``, about 2 us; a no-op elsewhere).

    The blocked path frees one set of tiles per block. Under glibc's dynamic mmap threshold those
    tiles come from the heap, and tiles of growing sizes (a causal block's reach grows; backward
    recomputes blocks in the other order) fragment it, so the resident peak grew faster than ``T``
    (T5 training: x11.6 from T = 2048 to 8192). Trimming before each large block keeps it linear for
    library users and training, without a process-wide allocator setting.
    """
    global _MALLOC_TRIM
    if _MALLOC_TRIM is None:
        _MALLOC_TRIM = False
        try:
            import ctypes
            import ctypes.util

            _MALLOC_TRIM = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
        except (OSError, AttributeError):
            pass
    if _MALLOC_TRIM:
        _MALLOC_TRIM(0)


def _eager(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    combined: Tensor | None,
    scale: float,
    dropout: float,
    probe: Callable | None,
    *,
    softcap: float | None = None,
    sinks: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``softmax(q k^T * scale + bias) v`` in fp32 (also under autocast); returns the weights.

    ``softcap`` caps the scaled logits before the bias; ``sinks [h]`` join each row's softmax as one
    extra logit that is dropped afterwards.
    """
    if k.shape[1] != q.shape[1]:  # GQA: query head h reads kv head h // (h / h_kv)
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # [B, h, Tk, d]
    blind = None  # [B, h, Tq, 1]: queries that see no key, when there are any
    with torch.autocast(device_type=q.device.type, enabled=False):
        scores = torch.matmul(q.float(), k.float().transpose(-2, -1)) * scale  # [B, h, Tq, Tk] fp32
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        if combined is not None:
            if combined.dtype == torch.bool:
                scores = scores.masked_fill(~combined, float("-inf"))
            else:
                scores = scores + combined.float()
            # a query that sees no key (sliding window + padding): zero weights and output, as SDPA
            # gives, instead of 0/0 = NaN (masked before the softmax so no NaN reaches the backward);
            # one reduction finds such rows, and the two fills run only when there is one
            blind = torch.isneginf(scores.amax(dim=-1, keepdim=True))  # [B, h, Tq, 1]
            if not bool(blind.any()):
                blind = None
            else:
                scores = scores.masked_fill(blind, 0.0)
        if sinks is not None:
            sink = sinks.float().view(1, -1, 1, 1).expand(scores.shape[0], -1, scores.shape[2], 1)  # [B, h, Tq, 1]
            weights = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1]  # fp32, sink column dropped
        else:
            weights = torch.softmax(scores, dim=-1)  # fp32 softmax
        if blind is not None:
            weights = weights.masked_fill(blind, 0.0)
    if probe is not None:
        weights = probe(weights)
    attn = F.dropout(weights, p=dropout) if dropout > 0 else weights
    return torch.matmul(attn.to(v.dtype), v), weights  # [B, h, Tq, d_v]


def _flex(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    causal: bool,
    window: int | None,
    score_mod: Callable | None,
    scale: float,
    *,
    chunk: int | None = None,
    softcap: float | None = None,
    sinks: Tensor | None = None,
) -> Tensor:
    """FlexAttention with a positional ``mask_mod`` (compiled; on CPU forward only).

    ``softcap`` wraps the score_mod (capped first, then the scheme's bias). ``sinks`` append one
    all-zero key/value at index ``Tk`` that every query may see and whose score is the head's sink
    (CPU's compiled flex cannot return the log-sum-exp that would otherwise rescale the output).
    """
    from torch.nn.attention.flex_attention import create_block_mask

    Tk = k.shape[2]
    inner = score_mod

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        qp, kp = q_pos[q_idx], k_pos[kv_idx.clamp(max=Tk - 1)]
        keep = (kp <= qp) if causal else (kp == kp)
        if window is not None:
            keep = keep & ((qp - kp < window) if causal else ((qp - kp).abs() < window))
        if chunk is not None:
            keep = keep & (torch.div(kp, chunk, rounding_mode="floor") == torch.div(qp, chunk, rounding_mode="floor"))
        return keep | (kv_idx == Tk) if sinks is not None else keep

    if softcap is not None or sinks is not None:

        def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            if softcap is not None:
                score = torch.tanh(score / softcap) * softcap
            if inner is not None:
                score = inner(score, b, h, q_idx, kv_idx.clamp(max=Tk - 1) if sinks is not None else kv_idx)
            if sinks is not None:
                score = torch.where(kv_idx == Tk, sinks[h].to(score.dtype), score)
            return score

    if sinks is not None:
        k = torch.cat((k, k.new_zeros(k.shape[0], k.shape[1], 1, k.shape[3])), dim=2)  # [B, hkv, Tk+1, dk]
        v = torch.cat((v, v.new_zeros(v.shape[0], v.shape[1], 1, v.shape[3])), dim=2)  # [B, hkv, Tk+1, dv]
    block_mask = None
    if causal or window is not None or chunk is not None or sinks is not None:
        block_mask = create_block_mask(mask_mod, None, None, q.shape[2], k.shape[2], device=q.device.type)
    run = _compiled_flex()  # eager flex_attention is a slow reference implementation on every device
    return run(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])


_FLEX = None


def _compiled_flex() -> Callable:
    """``torch.compile``d FlexAttention (the only form that runs on CPU, forward only; fused on CUDA)."""
    global _FLEX
    if _FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention

        _FLEX = torch.compile(flex_attention, dynamic=False)
    return _FLEX


# ---------------------------------------------------------------------------------- the module
class MultiHeadAttention(nn.Module):
    """Multi-head attention (Vaswani et al. 2017) with GQA (Ainslie et al. 2023) and position hooks.

    Args:
        d_model: model width ``d``.
        n_heads: query heads ``h``; ``d_k = d_model // n_heads``.
        n_kv_heads: key/value heads (``None`` = ``n_heads``; 1 = MQA); must divide ``n_heads``.
        causal: mask future keys (by position).
        dropout: attention-weight dropout (training only).
        bias: biases on the qkv and output projections.
        position: the position scheme whose ``rotate`` / ``score_bias`` hooks run here (optional;
            a model sharing one scheme across layers passes it to :meth:`forward` instead).
        backend: ``"auto"``, ``"sdpa"``, ``"eager"`` or ``"flex"``.
        window: sliding window ``W``: query ``i`` sees keys ``j`` with ``i - W < j <= i``
            (Mistral; ``|i - j| < W`` when not causal).
        scale: softmax scale (default ``1/sqrt(d_k)``).
        query_chunk: query block size of the blocked path (biases, masks and windows on more
            queries than this run in blocks).
        recompute_threshold: key count from which blocked float biases are recomputed in backward
            (memory linear in ``T``) rather than kept.
        head_dim: per-head width ``d_k`` (default ``d_model // n_heads``; Gemma and Qwen3 decouple it:
            the projections are then ``d -> h*d_k`` and ``h*d_k -> d``).
        softcap: attention-logit soft-capping ``c * tanh(s / c)`` (Gemma 2, https://arxiv.org/abs/2408.00118);
            eager and flex only (``auto`` picks one, an explicit ``sdpa`` is refused).
        qk_norm: RMSNorm over ``d_k`` on every query and key head before ``rotate`` (Qwen3, Gemma 3;
            Dehghani et al. 2023, https://arxiv.org/abs/2302.05442); modules ``q_norm``/``k_norm``.
        qk_norm_eps: epsilon of those norms.
        qk_norm_affine: learned gains on them (False: Llama 4's weightless L2 norm).
        sinks: a learned per-head sink logit in the softmax denominator (gpt-oss; Xiao et al. 2023,
            https://arxiv.org/abs/2309.17453), parameter ``sinks [h]``.
        chunk: chunked local attention: query ``i`` sees keys ``j`` with ``j // C == i // C`` (Llama 4).
        temperature_tuning: ``(floor_scale, attn_scale)``: queries at position ``p`` are multiplied by
            ``log(floor((p + 1) / floor_scale) + 1) * attn_scale + 1`` after ``rotate`` (Llama 4's
            attention-temperature tuning on its NoPE layers).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        *,
        causal: bool = True,
        dropout: float = 0.0,
        bias: bool = True,
        position: PositionScheme | None = None,
        backend: str = "auto",
        window: int | None = None,
        scale: float | None = None,
        query_chunk: int = DEFAULT_QUERY_CHUNK,
        recompute_threshold: int = DEFAULT_RECOMPUTE_THRESHOLD,
        head_dim: int | None = None,
        softcap: float | None = None,
        qk_norm: bool = False,
        qk_norm_eps: float = 1e-6,
        qk_norm_affine: bool = True,
        sinks: bool = False,
        chunk: int | None = None,
        temperature_tuning: tuple[float, float] | None = None,
    ) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        validate_geometry(d_model, n_heads, n_kv_heads)
        if backend not in BACKENDS:
            raise ValueError(f"unknown attention backend {backend!r}; choose one of {list(BACKENDS)}")
        validate_window(window)
        for label, value in (("query_chunk", query_chunk), ("recompute_threshold", recompute_threshold)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{label} must be a positive integer, got {value!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.head_dim = d_model // n_heads if head_dim is None else validate_head_dim(head_dim)
        self.causal, self.dropout, self.backend, self.window = causal, dropout, backend, window
        self.query_chunk, self.recompute_threshold = query_chunk, recompute_threshold
        self.scale = scale if scale is not None else 1.0 / math.sqrt(self.head_dim)
        self.qkv = nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * self.head_dim, bias=bias)  # fused
        self.proj = nn.Linear(n_heads * self.head_dim, d_model, bias=bias)
        self.split_q = SplitHeads(n_heads)
        self.split_kv = SplitHeads(n_kv_heads)
        self.merge = MergeHeads()
        self.scores_probe = nn.Identity()  # sees [B, h, Tq, Tk] weights in the eager backend
        if position is not None:
            self.fit(position)
        self.position = position
        self._init_mechanisms(softcap, qk_norm, qk_norm_eps, qk_norm_affine, sinks, chunk, temperature_tuning)

    def _init_mechanisms(
        self,
        softcap: float | None,
        qk_norm: bool,
        qk_norm_eps: float,
        qk_norm_affine: bool,
        sinks: bool,
        chunk: int | None,
        temperature_tuning: tuple[float, float] | None,
    ) -> None:
        """Validate and build the optional mechanisms (soft-cap, QK-norm, sinks, chunks, temperature)."""
        check_mechanisms(self.n_heads, softcap, None, chunk)
        for label, flag in (("qk_norm", qk_norm), ("qk_norm_affine", qk_norm_affine), ("sinks", sinks)):
            if not isinstance(flag, bool):
                raise TypeError(f"{label} must be a bool, got {flag!r}")
        if isinstance(qk_norm_eps, bool) or not isinstance(qk_norm_eps, (int, float)) or not 0 < qk_norm_eps < math.inf:
            raise ValueError(f"qk_norm_eps must be a positive number, got {qk_norm_eps!r}")
        self.softcap = None if softcap is None else float(softcap)
        self.chunk = chunk
        self.temperature_tuning = validate_temperature_tuning(temperature_tuning)
        self.qk_norm = qk_norm
        if qk_norm:
            self.q_norm = nn.RMSNorm(self.head_dim, eps=float(qk_norm_eps), elementwise_affine=qk_norm_affine)
            self.k_norm = nn.RMSNorm(self.head_dim, eps=float(qk_norm_eps), elementwise_affine=qk_norm_affine)
        self.sinks = nn.Parameter(torch.zeros(self.n_heads)) if sinks else None

    def _mechanism_backend(self, requested: str, backend: str) -> str:
        """``backend`` moved off ``sdpa`` when a mechanism needs it (:func:`mechanism_backend`)."""
        return mechanism_backend(requested, backend, self.softcap)

    def temperature(self, q_pos: Tensor) -> Tensor:
        """Llama 4's per-position query multiplier ``[Tq]`` (fp32) of ``temperature_tuning``."""
        floor_scale, attn_scale = self.temperature_tuning
        return torch.log1p(torch.floor((q_pos.float() + 1.0) / floor_scale)) * attn_scale + 1.0

    def fit(self, scheme: PositionScheme) -> None:
        """Check ``scheme`` against this layer's geometry and causality (see ``PositionScheme.check_layer``).

        A scheme built for other heads (RoPE's default ``head_dim=64`` in 128-wide heads, ALiBi's 8
        slopes in a 4-head layer) raises ``ValueError`` naming both values; layer-dependent defaults
        (T5's ``bidirectional``) are filled in. Runs once per scheme object.
        """
        layer = (self.n_heads, self.head_dim, self.causal)
        fitted = scheme.__dict__.setdefault("_fitted_layers", set())  # layer kinds this scheme already passed
        if layer not in fitted:
            scheme.check_layer(*layer)
            fitted.add(layer)

    def forward(
        self,
        x: Tensor,
        pos: Tensor | None = None,
        *,
        position: PositionScheme | None = None,
        attn_mask: Tensor | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
        backend: str | None = None,
        head_mask: Tensor | None = None,
        pos_increasing: bool | None = None,
        memory: Tensor | None = None,
        memory_pos: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend.

        Args:
            x: ``[B, T, d]``.
            pos: positions of the ``T`` tokens ``[T]`` (default ``cache.length + arange(T)``).
            position: scheme overriding ``self.position`` (how a model shares one scheme).
            attn_mask: ``[Tq, Tk]`` or ``[B|1, h|1, Tq, Tk]``; bool (True = attend) or float (added).
            cache: KV cache to read and extend (``Tk`` = cached + new tokens).
            need_weights: also return the attention weights ``[B, h, Tq, Tk]`` (eager backend).
            backend: per-call backend override.
            head_mask: ``[h]`` multiplier of each head's output before the output projection
                (Michel et al. 2019, https://arxiv.org/abs/1905.10650: 0 prunes a head; the gradient
                at 1 is the head-importance proxy).
            pos_increasing: ``pos`` is known strictly increasing (``None`` = check it; see :func:`attend`).
            memory: Transformer-XL segment memory (Dai et al. 2019): the previous segment's inputs to
                this layer ``[B, M, d]`` (already normed, detached by the caller). Their keys and
                values come from the current ``qkv`` weights and are placed before the segment's
                (``k_pos = cat(memory_pos, pos)``); the causal mask by positions does the rest.
                Not with ``cache``.
            memory_pos: positions of the memory ``[M]`` (int64, before ``pos``).

        Returns:
            ``[B, T, d]`` (and the weights when ``need_weights``).
        """
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"attention input must be [B, T, {self.d_model}], got {list(x.shape)}")
        if not x.is_floating_point():
            raise TypeError(f"attention input must be a floating-point tensor, got {x.dtype}")
        B, T, _ = x.shape
        scheme = position if position is not None else self.position
        if scheme is not None and not torch.compiler.is_compiling():  # checked eagerly, once per scheme and layer kind
            self.fit(scheme)
        if pos is None:
            start = cache.length if cache is not None else 0
            pos = torch.arange(start, start + T, device=x.device)
        elif not isinstance(pos, Tensor) or pos.shape != (T,):
            raise ValueError(f"pos must have shape [{T}] (one position per token), got {list(getattr(pos, 'shape', []))}")
        if memory is not None or memory_pos is not None:
            self._check_memory(x, memory, memory_pos, cache)
        requested = backend or self.backend
        backend = resolve_backend(requested, x.device, need_weights, has_mask=attn_mask is not None)
        if requested == "auto" and backend == "flex" and (self._has_extra_bias() or T == 1):
            backend = "sdpa"  # flex cannot express a subclass's extra bias; one decoded token needs no block mask
        backend = self._mechanism_backend(requested, backend)
        window = self.effective_window()
        segment_cache = getattr(cache, "memory", False)  # Transformer-XL memory: the ring is the context
        if cache is not None and cache.rolling and not segment_cache and (window is None or window > cache.capacity):
            raise ValueError(
                f"a rolling KV cache of capacity {cache.capacity} keeps only the last {cache.capacity} tokens, "
                f"but this attention has window={window}; use window <= {cache.capacity}, a non-rolling cache, "
                "or a segment-memory cache (KVCache(..., rolling=True, memory=True), GPT.make_cache(B, memory=M))"
            )

        h, hkv, dk = self.n_heads, self.n_kv_heads, self.head_dim
        q, k, v = self.qkv(x).split((h * dk, hkv * dk, hkv * dk), dim=-1)  # [B, T, h*dk], [B, T, hkv*dk] x2
        if scheme is not None and scheme.rotates:
            # elementwise rotations run ~1.5x faster (with backward) on dense rows than on views of
            # the fused qkv output; one copy of q and k pays for itself
            q, k = q.contiguous(), k.contiguous()
        q, k, v = self.split_q(q), self.split_kv(k), self.split_kv(v)  # [B, h|hkv, T, dk]
        q_pos = k_pos = pos
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)  # RMSNorm over d_k, per head
        if memory is not None:
            k_mem, v_mem = self._memory_kv(memory)  # [B, hkv, M, dk] x2
            k, v = torch.cat((k_mem, k), dim=2), torch.cat((v_mem, v), dim=2)  # [B, hkv, M+T, dk]
            k_pos = torch.cat((memory_pos.to(pos.device), pos))  # [M+T]
        # a scheme whose key rotation depends on the other positions (xPos's anchor) gets the cached keys
        # unrotated and rotates them with the new queries; the others' keys are cached after rotate
        # a cache that assigns positions by place (StreamingLLM, poslab/nn/streaming.py) also stores keys unrotated
        replaced = cache is not None and getattr(cache, "reassigns_positions", False)
        late = cache is not None and scheme is not None and scheme.rotates and (scheme.rotate_needs_all_keys or replaced)
        if scheme is not None and scheme.rotates and not late:
            q, k = scheme.rotate(q, k, q_pos, k_pos)
        if self.temperature_tuning is not None:
            q = (q * self.temperature(q_pos).view(1, 1, T, 1)).to(q.dtype)  # [B, h, T, dk] * [1, 1, T, 1]
        if cache is not None:
            k, v, k_pos = cache.update(k, v, pos)  # [B, hkv, Tk, dk], [Tk]
            if replaced:
                q_pos = k_pos[-T:]  # the new tokens are the cache's last entries
        if late:
            q, k = scheme.rotate(q, k, q_pos, k_pos)
        out, weights = attend(
            q,
            k,
            v,
            q_pos,
            k_pos,
            causal=self.causal,
            window=window,
            bias_fn=self.bias_fn(scheme),
            attn_mask=attn_mask,
            scale=self.scale,
            dropout=self.dropout if self.training else 0.0,
            backend=backend,
            need_weights=need_weights,
            score_mod=self.score_mod(scheme, q, k, q_pos, k_pos) if backend == "flex" else None,
            query_chunk=self.query_chunk,
            recompute_threshold=self.recompute_threshold,
            probe=self.scores_probe,
            softcap=self.softcap,
            sinks=self.sinks,
            chunk=self.chunk,
            increasing=pos_increasing if q_pos is pos else None,
        )
        if head_mask is not None:
            if not isinstance(head_mask, Tensor) or head_mask.shape != (h,):
                raise ValueError(f"head_mask must be a tensor of shape [{h}] (one factor per head), got {getattr(head_mask, 'shape', head_mask)!r}")
            out = out * head_mask.to(device=out.device, dtype=out.dtype)[None, :, None, None]  # [B, h, T, dk] * [1, h, 1, 1]
        out = self.proj(self.merge(out))  # [B, h, T, dk] -> [B, T, d] -> [B, T, d]
        return (out, weights) if need_weights else out

    def _check_memory(self, x: Tensor, memory: Tensor | None, memory_pos: Tensor | None, cache: KVCache | None) -> None:
        """``ValueError`` unless ``memory [B, M, d]`` and ``memory_pos [M]`` fit ``x`` and no cache is given."""
        if cache is not None:
            raise ValueError("segment memory and a KV cache cannot be combined: the cache already holds the past "
                             "(use GPT.make_cache(B, memory=M) for the cached form of the memory)")
        if memory is None or memory_pos is None:
            raise ValueError("segment memory needs both memory [B, M, d] and memory_pos [M]")
        B, _, d = x.shape
        if not isinstance(memory, Tensor) or memory.dim() != 3 or memory.shape[0] != B or memory.shape[2] != d:
            raise ValueError(f"memory must be [{B}, M, {d}] (the batch and width of x), got {list(getattr(memory, 'shape', []))}")
        if memory.dtype != x.dtype or memory.device != x.device:
            raise ValueError(f"memory is {memory.dtype} on {memory.device} but x is {x.dtype} on {x.device}")
        if not isinstance(memory_pos, Tensor) or memory_pos.shape != (memory.shape[1],) or memory_pos.is_floating_point():
            raise ValueError(f"memory_pos must be an integer tensor of shape [{memory.shape[1]}] (one position per memory "
                             f"entry), got {getattr(memory_pos, 'dtype', None)} {list(getattr(memory_pos, 'shape', []))}")

    def _memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values ``[B, h_kv, M, d_k]`` of memory ``[B, M, d]`` under the current weights (before ``rotate``)."""
        h, hkv, dk = self.n_heads, self.n_kv_heads, self.head_dim
        if type(self.qkv) is nn.Linear:  # only the k, v rows of the fused projection
            bias = self.qkv.bias[h * dk :] if self.qkv.bias is not None else None
            kv = F.linear(memory, self.qkv.weight[h * dk :], bias)  # [B, M, 2*hkv*dk]
        else:  # a wrapped projection (clip_qkv): run it whole, drop the queries
            kv = self.qkv(memory)[..., h * dk :]  # [B, M, 2*hkv*dk]
        k, v = kv.split((hkv * dk, hkv * dk), dim=-1)  # [B, M, hkv*dk] x2
        k, v = self.split_kv(k), self.split_kv(v)  # [B, hkv, M, dk] x2
        if self.qk_norm:
            k = self.k_norm(k)
        return k, v

    # ------------------------------------------------------------------- hooks for subclasses
    def effective_window(self) -> int | None:
        """Keys farther than this are never attended (``self.window``; adaptive span narrows it)."""
        return self.window

    def extra_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """Additive fp32 bias ``[1, h, Tq, Tk]`` added to the scheme's (``None`` here; see sparse.py)."""
        return None

    def _has_extra_bias(self) -> bool:
        return type(self).extra_bias is not MultiHeadAttention.extra_bias

    def bias_fn(self, scheme: PositionScheme | None) -> BiasFn | None:
        """The scheme's ``score_bias`` plus :meth:`extra_bias` as one block-wise callable.

        Whether the scheme has a bias is derived from the hooks it overrides (``has_bias``), never
        from a flag it could forget.
        """
        scheme_bias = scheme is not None and scheme.has_bias
        extra = self._has_extra_bias()
        if not scheme_bias and not extra:
            return None
        scale = self.scale

        def fn(q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
            bias = scheme.score_bias(q, k, q_pos, k_pos, scale) if scheme_bias else None
            more = self.extra_bias(q_pos, k_pos) if extra else None
            if more is None:
                return bias
            return more if bias is None else bias + more

        return fn

    def score_mod(self, scheme: PositionScheme | None, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Callable | None:
        """FlexAttention ``score_mod`` of the scheme (``None`` without a bias)."""
        if self._has_extra_bias():
            raise ValueError(f"{type(self).__name__} adds a bias the flex backend cannot express; use sdpa or eager")
        if scheme is None or not scheme.has_bias:
            return None
        return scheme.score_mod(q, k, q_pos, k_pos, self.scale)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, causal={self.causal}, "
            f"window={self.window}, backend={self.backend!r}"
        )


# -------------------------------------------------------------------------------- validation
def validate_geometry(d_model: int, n_heads: int, n_kv_heads: int) -> None:
    """Raise ``ValueError`` naming the value and the rule for an impossible head layout."""
    for label, value in (("d_model", d_model), ("n_heads", n_heads), ("n_kv_heads", n_kv_heads)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{label} must be an integer, got {value!r}")
        if value <= 0:
            raise ValueError(f"{label} must be > 0, got {value}")
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads} (d_model must equal n_heads * d_k)")
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads={n_heads} is not divisible by n_kv_heads={n_kv_heads} (each kv head serves n_heads/n_kv_heads query heads)")


def validate_head_dim(head_dim: int) -> int:
    """A positive integer head width (``head_dim=`` of attention), returned."""
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0:
        raise ValueError(f"head_dim must be a positive integer or None (d_model // n_heads), got {head_dim!r}")
    return head_dim


def validate_temperature_tuning(value: tuple[float, float] | list[float] | None) -> tuple[float, float] | None:
    """``None`` or ``(floor_scale > 0, attn_scale)`` as floats (Llama 4: ``(8192, 0.1)``)."""
    if value is None:
        return None
    ok = isinstance(value, (tuple, list)) and len(value) == 2 and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in value
    )
    if not ok or value[0] <= 0:
        raise ValueError(f"temperature_tuning must be (floor_scale > 0, attn_scale) or None, got {value!r}")
    return float(value[0]), float(value[1])


def validate_window(window: int | None) -> None:
    """``None`` or a positive integer (keys seen per query, including itself)."""
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window <= 0):
        raise ValueError(f"window must be a positive integer (keys seen per query, including itself) or None, got {window!r}")


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
            f"positions must be [Tq]=[{q.shape[2]}] and [Tk]=[{k.shape[2]}], got {list(q_pos.shape)} and {list(k_pos.shape)}"
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
        raise ValueError(f"attn_mask of shape {given} does not fit: expected [{Tq}, {Tk}] or [{B}|1, {h}|1, {Tq}, {Tk}]")
    return mask


def _merge_masks(keep: Tensor | None, user: Tensor | None) -> Tensor | None:
    """AND two bool keep-masks, or fold a bool keep-mask into a float user mask."""
    if user is None:
        return keep
    if user.dtype == torch.bool:
        return user if keep is None else keep & user
    return _combine_float(keep, user)


def _combine_float(mask: Tensor | None, bias: Tensor | None) -> Tensor | None:
    """Merge a mask (bool keep-mask or additive float) and an additive float bias (or pass one through)."""
    if bias is None:
        return mask
    if mask is None:
        return bias
    if mask.dtype == torch.bool:
        return bias.float().masked_fill(~mask, float("-inf"))
    return bias.float() + mask.float()
