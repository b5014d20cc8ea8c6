"""Query blocking with recompute: a wrapper that runs any per-block attention over sorted positions.

Queries are cut into blocks of ``query_chunk``; each block attends only to the keys within its reach,
found from the spec's position rule (:func:`key_reach`), with its own slice of the float bias, so
``[B, h, T, T]`` is never materialised. Causal blocks skip the future keys (about half the work); a
sliding window ``W`` costs ``O(T (W + chunk))`` instead of ``O(T^2)``. From the call's
``recompute_threshold`` keys (with gradients on), blocks whose tiles would be kept for backward (a
float bias, or the eager form's fp32 scores) over an unbounded reach are checkpointed: backward
recomputes them, so memory stays linear in ``T``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from poslab.nn.attention.call import Call
from poslab.nn.attention.spec import AttentionSpec

#: ``run_block(q_block, k_block, v_block, q_pos_block, k_pos_block, mask_block) -> out [B, h, tq, d_v]``
BlockFn = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, "Tensor | None"], Tensor]

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


def key_reach(spec: AttentionSpec, qp: Tensor, k_pos: Tensor) -> tuple[int, int]:
    """The key index range ``[lo, hi)`` holding every key some query of a block keeps.

    ``qp [tq]`` and ``k_pos [Tk]`` are sorted. When every active term keeps one interval per query
    with non-decreasing ends (:meth:`AttentionSpec.intervals`), the block's keys lie between the
    first key its first query keeps and the last key its last query keeps, so only those two rows
    of the rule are evaluated (``O(Tk)``); otherwise, or when one of those rows keeps nothing, the
    whole block's rule is. At least one key is returned (a row that keeps none is masked anyway).
    """
    Tk = k_pos.shape[0]
    if not spec.terms():
        return 0, Tk
    idx = torch.arange(Tk, device=k_pos.device)

    def ends(rows: Tensor) -> list[list[int]]:
        keep = spec.keep(rows[:, None], k_pos[None, :])  # [n, Tk]
        first = torch.where(keep, idx, Tk).amin(dim=1)  # [n]
        last = torch.where(keep, idx, -1).amax(dim=1)  # [n]
        return torch.stack((first, last)).tolist()  # one device sync

    if spec.intervals():
        (f0, _), (_, l1) = zip(*ends(qp[[0, -1]]))  # first key of the first query, last key of the last
        if f0 < Tk and l1 >= 0:
            return f0, l1 + 1
    first, last = ends(qp)
    lo, hi = min(first), max(last) + 1
    lo = min(lo, Tk - 1)
    return lo, max(hi, lo + 1)


def blocked(run_block: BlockFn, spec: AttentionSpec, call: Call, *, keeps_tiles: bool) -> Tensor:
    """Run ``run_block`` over query blocks of ``call.query_chunk``, each over only the keys within its reach.

    Args:
        run_block: the per-block attention (any backend's kernel).
        spec: the attention's spec (its position rule bounds each block's keys).
        call: the call's tensors: ``q [B, h, Tq, d_k]``, ``k [B, h_kv, Tk, d_k]``, ``v [B, h_kv, Tk, d_v]``,
            sorted positions ``q_pos [Tq]`` and ``k_pos [Tk]``, ``attn_mask`` ``[B|1, h|1, Tq, Tk]`` or
            ``None`` (each block gets its slice); ``query_chunk`` queries per block; from
            ``recompute_threshold`` keys, with gradients on, blocks whose tiles would be kept for
            backward are checkpointed (when no active term bounds the reach, :meth:`AttentionSpec.local`).
        keeps_tiles: ``run_block`` keeps ``O(tq tk)`` tensors for backward (a float bias, fp32 scores).

    Returns:
        ``[B, h, Tq, d_v]``.
    """
    q, k, v, q_pos, k_pos, attn_mask = call.q, call.k, call.v, call.q_pos, call.k_pos, call.attn_mask
    Tk, c = k.shape[2], call.query_chunk
    recompute = Tk >= call.recompute_threshold and torch.is_grad_enabled() and keeps_tiles and not spec.local()
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
        return run_block(qb, kb, vb, qp, kp, mask)

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
        lo, hi = key_reach(spec, qp, k_pos)
        if track:  # whole key blocks [a, b): the extra keys are masked by position
            a, b = lo // c, -(-hi // c)
            lo, hi = a * c, min(b * c, Tk)
            kv = (*k_blocks[a:b], *v_blocks[a:b])  # views; concatenated inside the block
        else:
            kv = (k[:, :, lo:hi], v[:, :, lo:hi])
        mask = attn_mask[..., s:e, lo:hi] if attn_mask is not None else None  # [B|1, h|1, tq, tk]
        args = (qb, qp, k_pos[lo:hi], mask, *kv)
        if recompute:  # keeps only the views above for backward, never a block's keys or bias
            outs[i] = checkpoint(block, *args, use_reentrant=False)
        else:
            outs[i] = block(*args)
    return torch.cat(outs, dim=2)  # [B, h, Tq, d_v]
