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

    Stores ``n_kv_heads`` heads (GQA-aware) and keys *after* ``rotate``, together with each entry's
    position, so bias schemes (ALiBi, T5, ...) and rotary schemes see the true positions of cached
    keys whatever order they are stored in.

    Two layouts:

    * ``rolling=False``: appends up to ``capacity`` tokens; one more raises ``ValueError``.
    * ``rolling=True`` (sliding-window models): a ring buffer keeping only the most recent
      ``capacity`` tokens, so decoding runs forever in ``O(capacity)`` memory. Attention checks that
      its window fits (``window <= capacity``): older keys are out of every query's reach.

    Attributes:
        length: tokens written so far (the default position of the next token).
        size: entries currently held (``min(length, capacity)`` for a rolling cache).

    Args:
        batch_size, n_kv_heads, head_dim: cache geometry.
        capacity: maximum number of tokens held.
        dtype, device: storage (must match the keys written).
        rolling: ring buffer that forgets the oldest tokens instead of overflowing.
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
    ) -> None:
        super().__init__()
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
            ``capacity`` entries followed by all ``T`` new ones.
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
        if T == 1:  # decode: overwrite the oldest entry, then read the whole ring
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
        return f"batch={B}, kv_heads={hkv}, capacity={C}, head_dim={dk}, rolling={self.rolling}, length={self.length}"


# ----------------------------------------------------------------------------- functional core
def position_mask(q_pos: Tensor, k_pos: Tensor, causal: bool, window: int | None) -> Tensor | None:
    """Boolean keep-mask ``[Tq, Tk]`` (True = attend) from positions, or ``None`` for "keep all".

    Causal: ``j <= i``. Window ``W``: ``i - W < j`` (and ``j < i + W`` when not causal).
    """
    keep = None
    if causal:
        keep = k_pos[None, :] <= q_pos[:, None]  # [Tq, Tk]
    if window is not None:
        distance = q_pos[:, None] - k_pos[None, :]  # [Tq, Tk]
        in_window = distance < window if causal else distance.abs() < window
        keep = in_window if keep is None else keep & in_window
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

    Returns:
        ``(out [B, h, Tq, d_v], weights or None)``.
    """
    check_qkv(q, k, v, q_pos, k_pos)
    if attn_mask is not None:
        attn_mask = check_mask(attn_mask, q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.device, q.dtype)
    backend = resolve_backend(backend, q.device, need_weights, has_mask=attn_mask is not None)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    if backend == "eager":
        bias = bias_fn(q, k, q_pos, k_pos) if bias_fn is not None else None
        mask = _merge_masks(position_mask(q_pos, k_pos, causal, window), attn_mask)
        return _eager(q, k, v, _combine_float(mask, bias), scale, dropout, probe)
    if backend == "flex":
        if attn_mask is not None:
            raise ValueError("the flex backend takes no attn_mask; use sdpa or eager for explicit masks")
        if bias_fn is not None and score_mod is None:
            raise ValueError("the flex backend needs a score_mod for this bias; use sdpa or eager")
        return _flex(q, k, v, q_pos, k_pos, causal, window, score_mod, scale), None
    # sdpa
    Tq, Tk = q.shape[2], k.shape[2]
    gqa = q.shape[1] != k.shape[1]
    plain = bias_fn is None and attn_mask is None and window is None
    if plain and causal and Tq == Tk and (q_pos is k_pos or torch.equal(q_pos, k_pos)) and _increasing(q_pos):
        # one increasing run of positions shared by q and k: the fused causal kernel is exact
        with _cpu_lowp_kernel(q):
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=scale, enable_gqa=gqa)
        return out, None
    if plain and not causal:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scale, enable_gqa=gqa), None
    if Tq > query_chunk and _sorted(q_pos) and _sorted(k_pos):
        recompute = Tk >= recompute_threshold and torch.is_grad_enabled()
        out = _blocked_sdpa(q, k, v, q_pos, k_pos, causal, window, bias_fn, attn_mask, scale, dropout, query_chunk, recompute)
        return out, None
    return _sdpa_block(q, k, v, q_pos, k_pos, causal, window, bias_fn, attn_mask, scale, dropout), None


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
) -> Tensor:
    """One SDPA call: positional mask, user mask and bias combined into one (bool or float) mask."""
    keep = position_mask(q_pos, k_pos, causal, window)
    if keep is not None and q_pos.shape[0] == 1 and bool(keep.all()):
        keep = None  # decoding inside the window: nothing to mask
    mask = _merge_masks(keep, attn_mask)
    bias = bias_fn(q, k, q_pos, k_pos) if bias_fn is not None else None
    combined = _combine_float(mask, bias)
    if combined is not None and combined.dtype != torch.bool:
        combined = combined.to(q.dtype)
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
) -> Tensor:
    """Attention in query blocks, each over only the keys within its reach (sorted positions).

    Block ``[s, e)`` reads keys with ``q_pos[s] - W < k_pos`` (window) and ``k_pos <= q_pos[e-1]``
    (causal), found by ``searchsorted``; its bias is computed for that ``[tq, tk]`` tile only.
    Cost: ``O(T * reach * d)`` time and ``O(B h chunk reach)`` memory per block, where ``reach`` is
    ``min(T, W + chunk)`` with a window and up to ``T`` without. With ``recompute``, blocks with a
    float bias over the whole past (no window) are checkpointed: backward recomputes the bias, so the
    blocks' biases (``O(h T^2)`` together) are never all alive.
    """
    Tk, c = k.shape[2], query_chunk
    float_bias = bias_fn is not None or (attn_mask is not None and attn_mask.dtype != torch.bool)
    # a float bias over the whole causal past would be kept for backward by every block (O(T^2)):
    # recompute it in backward instead (a window bounds each block's bias: nothing to gain there)
    recompute = recompute and float_bias and window is None
    # With autograd, slicing a block out of q/k/v costs a full-size zero tensor in backward for every
    # block (O(T^2 / c) traffic); splitting into c-sized blocks and concatenating the key blocks a
    # query block needs keeps backward to views and c-sized additions.
    track = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    q_blocks = q.split(c, dim=2)  # [B, h, c, dk] each
    k_blocks, v_blocks = (k.split(c, dim=2), v.split(c, dim=2)) if track else (None, None)

    def block(qb: Tensor, qp: Tensor, kp: Tensor, mask: Tensor | None, *kv: Tensor) -> Tensor:
        n = len(kv) // 2
        kb = kv[0] if n == 1 else torch.cat(kv[:n], dim=2)  # [B, hkv, tk, dk]
        vb = kv[n] if n == 1 else torch.cat(kv[n:], dim=2)  # [B, hkv, tk, dv]
        return _sdpa_block(qb, kb, vb, qp, kp, causal, window, bias_fn, mask, scale, dropout)

    outs = []
    for i, qb in enumerate(q_blocks):
        s, e = i * c, i * c + qb.shape[2]
        qp = q_pos[s:e]
        lo, hi = 0, Tk
        if window is not None:
            lo = int(torch.searchsorted(k_pos, qp[:1] - window, right=True))
            if not causal:
                hi = int(torch.searchsorted(k_pos, qp[-1:] + window - 1, right=True))
        if causal:
            hi = int(torch.searchsorted(k_pos, qp[-1:], right=True))
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
            outs.append(checkpoint(block, *args, use_reentrant=False))
        else:
            outs.append(block(*args))
    return torch.cat(outs, dim=2)  # [B, h, Tq, d_v]


def _eager(
    q: Tensor, k: Tensor, v: Tensor, combined: Tensor | None, scale: float, dropout: float, probe: Callable | None
) -> tuple[Tensor, Tensor]:
    """``softmax(q k^T * scale + bias) v`` in fp32 (also under autocast); returns the weights."""
    if k.shape[1] != q.shape[1]:  # GQA: query head h reads kv head h // (h / h_kv)
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # [B, h, Tk, d]
    blind = None  # [B, h, Tq, 1]: queries that see no key, when there are any
    with torch.autocast(device_type=q.device.type, enabled=False):
        scores = torch.matmul(q.float(), k.float().transpose(-2, -1)) * scale  # [B, h, Tq, Tk] fp32
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
) -> Tensor:
    """FlexAttention with a positional ``mask_mod`` (compiled; on CPU forward only)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        qp, kp = q_pos[q_idx], k_pos[kv_idx]
        keep = (kp <= qp) if causal else (kp == kp)
        if window is not None:
            keep = keep & ((qp - kp < window) if causal else ((qp - kp).abs() < window))
        return keep

    block_mask = None
    if causal or window is not None:
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
        self.head_dim = d_model // n_heads
        self.causal, self.dropout, self.backend, self.window = causal, dropout, backend, window
        self.query_chunk, self.recompute_threshold = query_chunk, recompute_threshold
        self.scale = scale if scale is not None else 1.0 / math.sqrt(self.head_dim)
        self.qkv = nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * self.head_dim, bias=bias)  # fused
        self.proj = nn.Linear(n_heads * self.head_dim, d_model, bias=bias)
        self.split_q = SplitHeads(n_heads)
        self.split_kv = SplitHeads(n_kv_heads)
        self.merge = MergeHeads()
        self.scores_probe = nn.Identity()  # sees [B, h, Tq, Tk] weights in the eager backend
        self.position = position

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

        Returns:
            ``[B, T, d]`` (and the weights when ``need_weights``).
        """
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"attention input must be [B, T, {self.d_model}], got {list(x.shape)}")
        if not x.is_floating_point():
            raise TypeError(f"attention input must be a floating-point tensor, got {x.dtype}")
        B, T, _ = x.shape
        scheme = position if position is not None else self.position
        if pos is None:
            start = cache.length if cache is not None else 0
            pos = torch.arange(start, start + T, device=x.device)
        elif not isinstance(pos, Tensor) or pos.shape != (T,):
            raise ValueError(f"pos must have shape [{T}] (one position per token), got {list(getattr(pos, 'shape', []))}")
        requested = backend or self.backend
        backend = resolve_backend(requested, x.device, need_weights, has_mask=attn_mask is not None)
        if requested == "auto" and backend == "flex" and (self._has_extra_bias() or T == 1):
            backend = "sdpa"  # flex cannot express a subclass's extra bias; one decoded token needs no block mask
        window = self.effective_window()
        if cache is not None and cache.rolling and (window is None or window > cache.capacity):
            raise ValueError(
                f"a rolling KV cache of capacity {cache.capacity} keeps only the last {cache.capacity} tokens, "
                f"but this attention has window={window}; use window <= {cache.capacity} or a non-rolling cache"
            )

        h, hkv, dk = self.n_heads, self.n_kv_heads, self.head_dim
        q, k, v = self.qkv(x).split((h * dk, hkv * dk, hkv * dk), dim=-1)  # [B, T, h*dk], [B, T, hkv*dk] x2
        if scheme is not None and type(scheme).rotate is not PositionScheme.rotate:
            # elementwise rotations run ~1.5x faster (with backward) on dense rows than on views of
            # the fused qkv output; one copy of q and k pays for itself
            q, k = q.contiguous(), k.contiguous()
        q, k, v = self.split_q(q), self.split_kv(k), self.split_kv(v)  # [B, h|hkv, T, dk]
        q_pos = k_pos = pos
        if scheme is not None:
            q, k = scheme.rotate(q, k, q_pos, k_pos)
        if cache is not None:
            k, v, k_pos = cache.update(k, v, pos)  # [B, hkv, Tk, dk], [Tk]
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
        )
        if head_mask is not None:
            if not isinstance(head_mask, Tensor) or head_mask.shape != (h,):
                raise ValueError(f"head_mask must be a tensor of shape [{h}] (one factor per head), got {getattr(head_mask, 'shape', head_mask)!r}")
            out = out * head_mask.to(device=out.device, dtype=out.dtype)[None, :, None, None]  # [B, h, T, dk] * [1, h, 1, 1]
        out = self.proj(self.merge(out))  # [B, h, T, dk] -> [B, T, d] -> [B, T, d]
        return (out, weights) if need_weights else out

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
        """The scheme's ``score_bias`` plus :meth:`extra_bias` as one block-wise callable."""
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
