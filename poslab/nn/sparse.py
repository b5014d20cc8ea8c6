"""Sparse attention from seed 002 §3.1 and §7.1: axial, LSH (Reformer) and adaptive attention span.

Dense causal attention costs ``O(T^2 d)`` time and ``O(T^2)`` memory per head. Seed 002 §3.1 lists
three ways around it; the first, the sliding window, is ``window=`` of
:class:`~poslab.nn.attention.MultiHeadAttention` (blocked, ``O(T W d)``). This module adds the other two
and §7.1's adaptive span:

* :class:`AxialAttention` (Ho et al. 2019, https://arxiv.org/abs/1912.12180): a 2-D input
  ``[B, H, W, d]`` attends along rows, then along columns. Each pass is dense attention restricted to
  one row (column) neighbourhood; two passes connect every pair of cells.
  Cost: ``O(B H W (H + W) d)`` time, ``O(B h H W max(H, W))`` memory, vs ``O(B (H W)^2 d)`` dense.
* :func:`lsh_attention` / :class:`LSHAttention` (Reformer, Kitaev et al. 2020,
  https://arxiv.org/abs/2001.04451): shared query/key, random-rotation hashing into buckets, a sort
  by (bucket, position), and attention inside chunks of the sorted sequence plus the previous chunk.
  Cost per hash round: hashing ``O(T d n_buckets)``, sort ``O(T log T)``, attention ``O(T 2c d)``
  time and ``O(T 2c)`` memory for chunk size ``c``, vs ``O(T^2 d)`` dense.
* :class:`AdaptiveSpanAttention` (Sukhbaatar et al. 2019, "Adaptive Attention Span in
  Transformers", https://arxiv.org/abs/1905.07799): each head learns a span ``z`` through the soft
  mask ``m_z(x) = clamp((R + z - x) / R, 0, 1)`` on the distance ``x = i - j``, and an L1 penalty on
  the spans shrinks them. Keys beyond the widest head's ``z + R`` are skipped (the blocked path of
  poslab/nn/attention/blocked.py), so cost is ``O(T min(T, z_max + R) d)``.

Seed 002 §7.1's code for the adaptive span is wrong in several ways (see
:class:`AdaptiveSpanAttention`); §3.1's local mask keeps the far tokens and masks the window (see
``tests/test_window.py``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from poslab.checks import positive_int
from poslab.nn.attention import AttentionConfig, MergeHeads, MultiHeadAttention, SplitHeads, validate_geometry
from poslab.nn.attention.config import require_config
from poslab.nn.attention.module import DEFAULT_CONFIG
from poslab.nn.positions.base import PositionScheme

#: the logit Reformer gives a token attending to itself (only used when nothing else is visible)
SELF_LOGIT = -1e5


# --------------------------------------------------------------------------------------- axial
class AxialAttention(nn.Module):
    """Axial attention over a 2-D grid: rows, then columns (Ho et al. 2019, https://arxiv.org/abs/1912.12180).

    Each pass is a :class:`~poslab.nn.attention.MultiHeadAttention` over one axis, so it equals dense
    attention over the flattened grid with a "same row" (then "same column") mask. With
    ``causal=True`` each pass is causal along its axis, so cell ``(r, c)`` depends only on cells
    ``(r', c')`` with ``r' <= r`` and ``c' <= c`` (a subset of raster order: never the future).

    Cost: ``O(B H W (H + W) d)`` time and ``O(B h H W max(H, W))`` memory, vs ``O(B (HW)^2 d)``.

    Args:
        d_model, n_heads, n_kv_heads: geometry of both passes.
        causal: causal along each axis.
        row_position, col_position: position schemes of the row pass (positions = column index)
            and the column pass (positions = row index).
        backend: attention backend of both passes.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        *,
        causal: bool = False,
        row_position: PositionScheme | None = None,
        col_position: PositionScheme | None = None,
        backend: str = "auto",
        bias: bool = True,
    ) -> None:
        super().__init__()
        attention = AttentionConfig(causal=causal, backend=backend, bias=bias)
        self.row = MultiHeadAttention(d_model, n_heads, n_kv_heads, attention, row_position)
        self.col = MultiHeadAttention(d_model, n_heads, n_kv_heads, attention, col_position)
        self.d_model = d_model

    def forward(self, x: Tensor) -> Tensor:
        """``x [B, H, W, d] -> [B, H, W, d]`` (row pass, then column pass; no residual)."""
        if x.dim() != 4 or x.shape[-1] != self.d_model:
            raise ValueError(f"axial attention input must be [B, H, W, {self.d_model}], got {list(x.shape)}")
        return self.column_pass(self.row_pass(x))

    def row_pass(self, x: Tensor) -> Tensor:
        """Every row attends within itself: ``[B, H, W, d] -> [B, H, W, d]``."""
        B, H, W, d = x.shape
        rows = self.row(x.reshape(B * H, W, d), torch.arange(W, device=x.device))  # [B*H, W, d]
        return rows.view(B, H, W, d)  # [B*H, W, d] -> [B, H, W, d]

    def column_pass(self, x: Tensor) -> Tensor:
        """Every column attends within itself: ``[B, H, W, d] -> [B, H, W, d]``."""
        B, H, W, d = x.shape
        cols = x.transpose(1, 2).reshape(B * W, H, d)  # [B, H, W, d] -> [B, W, H, d] -> [B*W, H, d]
        cols = self.col(cols, torch.arange(H, device=x.device))  # [B*W, H, d]
        return cols.view(B, W, H, d).transpose(1, 2)  # [B*W, H, d] -> [B, W, H, d] -> [B, H, W, d]


# ----------------------------------------------------------------------------------------- LSH
def random_rotations(
    head_dim: int,
    n_buckets: int,
    n_hashes: int = 1,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """Random projections ``[d_k, n_hashes, n_buckets // 2]`` for angular LSH (Andoni et al. 2015)."""
    check_lsh(n_buckets=n_buckets, n_hashes=n_hashes)
    return torch.randn(head_dim, n_hashes, max(n_buckets // 2, 1), generator=generator, device=device)


def lsh_buckets(qk: Tensor, n_buckets: int, rotations: Tensor) -> Tensor:
    """Angular LSH: ``h(x) = argmax([x R ; -x R])``.

    Args:
        qk: ``[B, h, T, d_k]``; rotations: ``[d_k, n_hashes, n_buckets // 2]``.

    Returns:
        ``[B, h, n_hashes, T]`` int64 buckets in ``[0, n_buckets)`` (all 0 when ``n_buckets == 1``).
    """
    B, h, T, _ = qk.shape
    n_hashes = rotations.shape[1]
    if n_buckets == 1:
        return torch.zeros(B, h, n_hashes, T, dtype=torch.long, device=qk.device)
    rotated = torch.einsum("bhtd,dnr->bhntr", qk.float(), rotations.float())  # [B, h, n, T, nb/2]
    return torch.cat((rotated, -rotated), dim=-1).argmax(dim=-1)  # [B, h, n, T]


def check_lsh(T: int | None = None, n_buckets: int = 2, chunk_size: int | None = None, n_hashes: int = 1) -> None:
    """Raise ``ValueError`` naming the value for an impossible LSH configuration."""
    for label, value in (("n_buckets", n_buckets), ("n_hashes", n_hashes), ("chunk_size", chunk_size)):
        if value is not None:
            positive_int(label, value)
    if n_buckets != 1 and n_buckets % 2:
        raise ValueError(f"n_buckets must be 1 or even (angular LSH splits +-xR), got {n_buckets}")
    if T is not None and chunk_size is not None and T % chunk_size:
        raise ValueError(
            f"chunk_size={chunk_size} must divide the sequence length T={T} (LSH attention chunks the sorted "
            f"sequence); pad T to a multiple of {chunk_size} or pick a divisor of {T}"
        )


def lsh_attention(
    qk: Tensor,
    v: Tensor,
    *,
    n_buckets: int,
    chunk_size: int,
    rotations: Tensor | None = None,
    n_hashes: int = 1,
    causal: bool = True,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Reformer's LSH attention (Kitaev et al. 2020, https://arxiv.org/abs/2001.04451).

    Queries are ``qk``; keys are ``qk / |qk|`` (shared-QK). For each hash round: bucket every token
    (:func:`lsh_buckets`), sort by ``(bucket, position)``, cut the sorted sequence into chunks of
    ``chunk_size``; each chunk attends to itself and the previous chunk (wrapping around), masked to
    the same bucket and, if ``causal``, to keys at earlier positions. A token attends to itself with
    logit ``-1e5`` (only when nothing else is visible, as in the paper). Rounds are combined with
    weights ``softmax(logsumexp_r)`` (the paper's §2.2 normaliser weighting); a pair that meets in
    several rounds counts once per round (the paper's optional duplicate correction is not applied).

    With one bucket and ``chunk_size == T`` this is exactly dense shared-QK attention.

    Causality: no query attends to a later key, so ``out[i]`` never depends on ``v[j > i]``. The
    chunk boundaries, however, depend on every token's bucket, so changing a *future* token's ``qk``
    can move an earlier query's chunk (as in the paper).

    Cost per round: ``O(T d n_buckets)`` hashing, ``O(T log T)`` sort, ``O(T 2c d)`` attention and
    ``O(T 2c)`` logits memory (``c = chunk_size``), vs ``O(T^2 d)`` and ``O(T^2)`` dense.

    The logits are scaled by ``1/sqrt(d_k)``, as in dense attention.

    Args:
        qk: shared queries/keys ``[B, h, T, d_k]``; v: ``[B, h, T, d_v]``.
        n_buckets: 1 or an even number of buckets.
        chunk_size: must divide ``T``.
        rotations: ``[d_k, n_hashes, n_buckets // 2]`` (default: fresh from ``generator``).
        n_hashes: hash rounds when ``rotations`` is not given.
        causal: mask later positions.
        generator: draws the rotations when ``rotations`` is not given.

    Returns:
        ``[B, h, T, d_v]`` in ``v``'s dtype.
    """
    if qk.dim() != 4 or v.dim() != 4 or qk.shape[:3] != v.shape[:3]:
        raise ValueError(
            "qk must be [B, h, T, d_k] and v [B, h, T, d_v] with the same B, h, T; "
            f"got {list(qk.shape)}, {list(v.shape)}"
        )
    B, h, T, dk = qk.shape
    dv = v.shape[-1]
    check_lsh(T, n_buckets, chunk_size, n_hashes)
    if rotations is None:
        rotations = random_rotations(dk, n_buckets, n_hashes, generator, qk.device)
    if rotations.dim() != 3 or rotations.shape[0] != dk or rotations.shape[2] != max(n_buckets // 2, 1):
        raise ValueError(f"rotations must be [{dk}, n_hashes, {max(n_buckets // 2, 1)}], got {list(rotations.shape)}")
    n = rotations.shape[1]
    scale = 1.0 / math.sqrt(dk)
    c, n_chunks = chunk_size, T // chunk_size

    buckets = lsh_buckets(qk, n_buckets, rotations)  # [B, h, n, T]
    positions = torch.arange(T, device=qk.device)
    order = (buckets * T + positions).argsort(dim=-1)  # [B, h, n, T]: sorted slot -> position
    undo = order.argsort(dim=-1)  # [B, h, n, T]: position -> sorted slot

    def sort(x: Tensor) -> Tensor:  # [B, h, T, e] -> [B, h, n, n_chunks, c, e] in sorted order
        e = x.shape[-1]
        gathered = (
            x[:, :, None].expand(B, h, n, T, e).gather(3, order[..., None].expand(B, h, n, T, e))
        )  # [B, h, n, T, e]
        return gathered.view(B, h, n, n_chunks, c, e)  # [B, h, n, T, e] -> [B, h, n, C, c, e]

    qf = qk.float()
    q_s = sort(qf)  # [B, h, n, C, c, dk]
    k_s = sort(F.normalize(qf, dim=-1))  # [B, h, n, C, c, dk]
    v_s = sort(v.float())  # [B, h, n, C, c, dv]
    pos_s = order.view(B, h, n, n_chunks, c)  # positions in sorted order
    bkt_s = buckets.gather(-1, order).view(B, h, n, n_chunks, c)

    def look_back(x: Tensor) -> Tensor:  # each chunk plus the previous one (wrapping): [..., C, 2c, ...]
        if n_chunks == 1:
            return x
        return torch.cat((x, x.roll(1, dims=3)), dim=4)

    k_ctx, v_ctx = look_back(k_s), look_back(v_s)  # [B, h, n, C, 2c, d]
    kpos_ctx, kbkt_ctx = look_back(pos_s), look_back(bkt_s)  # [B, h, n, C, 2c]
    logits = torch.matmul(q_s, k_ctx.transpose(-1, -2)) * scale  # [B, h, n, C, c, 2c] fp32
    qpos, kpos = pos_s[..., :, None], kpos_ctx[..., None, :]  # [.., c, 1], [.., 1, 2c]
    logits = logits.masked_fill(qpos == kpos, SELF_LOGIT)
    hidden = bkt_s[..., :, None] != kbkt_ctx[..., None, :]  # other bucket
    if causal:
        hidden = hidden | (kpos > qpos)
    logits = logits.masked_fill(hidden, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)  # [B, h, n, C, c, 1]
    out = torch.matmul(torch.exp(logits - lse), v_ctx)  # [B, h, n, C, c, dv]

    out = out.view(B, h, n, T, dv).gather(3, undo[..., None].expand(B, h, n, T, dv))  # back to positions
    lse = lse.view(B, h, n, T).gather(3, undo)  # [B, h, n, T]
    if n == 1:
        return out[:, :, 0].to(v.dtype)
    weights = torch.softmax(lse, dim=2)[..., None]  # [B, h, n, T, 1]: each round by its normaliser
    return (weights * out).sum(dim=2).to(v.dtype)  # [B, h, T, dv]


class LSHAttention(nn.Module):
    """Multi-head LSH self-attention layer (Reformer, Kitaev et al. 2020, https://arxiv.org/abs/2001.04451).

    A shared query/key projection and a value projection, :func:`lsh_attention`, and an output
    projection. Fresh random rotations are drawn every forward (as in the paper) unless passed in.

    Args:
        d_model, n_heads: geometry (``d_k = d_model // n_heads``).
        n_buckets: 1 or even; chunk_size: divides every ``T`` the layer sees; n_hashes: rounds.
        causal: mask later positions.
        bias: biases on the projections.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        n_buckets: int = 8,
        chunk_size: int = 64,
        n_hashes: int = 1,
        causal: bool = True,
        bias: bool = True,
    ) -> None:
        super().__init__()
        validate_geometry(d_model, n_heads, n_heads)
        check_lsh(None, n_buckets, chunk_size, n_hashes)
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.n_buckets, self.chunk_size, self.n_hashes, self.causal = n_buckets, chunk_size, n_hashes, causal
        self.qkv = nn.Linear(d_model, 2 * d_model, bias=bias)  # shared qk | v
        self.proj = nn.Linear(d_model, d_model, bias=bias)
        self.split = SplitHeads(n_heads)
        self.merge = MergeHeads()

    def forward(self, x: Tensor, rotations: Tensor | None = None, generator: torch.Generator | None = None) -> Tensor:
        """``x [B, T, d] -> [B, T, d]``; ``T`` must be a multiple of ``chunk_size``."""
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"LSH attention input must be [B, T, {self.d_model}], got {list(x.shape)}")
        qk, v = self.qkv(x).split(self.d_model, dim=-1)  # [B, T, d] x2
        qk, v = self.split(qk), self.split(v)  # [B, h, T, dk]
        out = lsh_attention(
            qk,
            v,
            n_buckets=self.n_buckets,
            chunk_size=self.chunk_size,
            rotations=rotations,
            n_hashes=self.n_hashes,
            causal=self.causal,
            generator=generator,
        )
        return self.proj(self.merge(out))  # [B, h, T, dk] -> [B, T, d] -> [B, T, d]


# ------------------------------------------------------------------------------ adaptive span
class AdaptiveSpanAttention(MultiHeadAttention):
    """Causal attention whose heads learn their span (Sukhbaatar et al. 2019, https://arxiv.org/abs/1905.07799).

    Head ``h`` has a span ``z_h = ratio_h * max_span`` (``ratio`` a parameter in ``[0, 1]``) and the
    soft mask ``m_z(x) = clamp((R + z - x) / R, 0, 1)`` on the distance ``x = i - j >= 0``: 1 up to
    ``z``, a linear ramp of width ``R`` (``ramp``), then 0. Weights are ``m exp(s) / sum m exp(s)``,
    computed as ``softmax(s + log m)`` (an additive bias, so the fast SDPA / blocked paths apply and
    keys at ``x >= z_max + R`` are skipped). Add :meth:`span_loss` to the training loss (the paper's
    ``lambda / h * sum_h z_h``) and call :meth:`clamp_` after each optimizer step.

    Cost: ``O(T min(T, z_max + R) d)`` per head, ``z_max`` the widest head's span.

    Seed 002 §7.1's ``get_attention_mask`` is wrong in several ways:

    1. ``torch.triu(ones, diagonal=-span)`` is a hard 0/1 mask of an integer ``span``: it has no
       gradient with respect to the span, so nothing can be learned. The paper's point is the soft
       ramp ``m_z`` that makes ``z`` differentiable.
    2. ``triu(diagonal=-span)`` keeps ``j >= i - span``, which includes every *future* key: the mask
       is not causal (the paper's model is a causal LM).
    3. The mask starts as ``torch.ones`` and the heads' masks are *added* into one ``[L, L]``
       tensor: entries end up 1 .. h+1, so nothing is ever masked, and the heads do not get separate
       spans.
    4. There is no span penalty, so nothing pushes spans to shrink and no compute is saved.
    5. ``span_predicter[h](x)`` on ``x [batch, seq_len]`` token ids returns a tensor, not the int
       ``triu`` needs; the paper's learned span is a per-head parameter (its "dynamic" variant
       predicts it per token from the hidden state, ``S * sigmoid(v.x + b)``).
    6. The prose is off too: the paper is from Facebook AI Research (not Google), adapts the span,
       not the number of heads, and reports text8 / enwik8 results (PG-19 appeared later).

    Args:
        d_model, n_heads, n_kv_heads: geometry (see :class:`MultiHeadAttention`).
        max_span: ``S``, the largest span.
        ramp: ``R``, the width of the soft ramp.
        init_ratio: initial ``z / S`` of every head.
        span_loss_coef: ``lambda`` of :meth:`span_loss`.
        kwargs: passed to :class:`MultiHeadAttention` (``attention``, ``position``, ``bias``, ``head_dim``;
            ``attention.causal`` must be True and its backend not ``flex``).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        *,
        max_span: int,
        ramp: int = 32,
        init_ratio: float = 0.0,
        span_loss_coef: float = 2e-6,
        **kwargs,
    ) -> None:
        attention = require_config(kwargs.get("attention", DEFAULT_CONFIG))
        if attention.causal is not True:
            raise ValueError("adaptive span is defined for causal attention (distances i - j >= 0); got causal=False")
        if attention.backend == "flex":
            raise ValueError(
                "adaptive span adds a learned bias the flex backend cannot express; use auto, sdpa or eager"
            )
        super().__init__(d_model, n_heads, n_kv_heads, **kwargs)
        for label, value in (("max_span", max_span), ("ramp", ramp)):
            positive_int(label, value)
        if not 0.0 <= init_ratio <= 1.0:
            raise ValueError(f"init_ratio must be in [0, 1] (the span as a fraction of max_span), got {init_ratio!r}")
        if span_loss_coef < 0:
            raise ValueError(f"span_loss_coef must be >= 0, got {span_loss_coef!r}")
        self.max_span, self.ramp, self.span_loss_coef = max_span, ramp, span_loss_coef
        self.span_ratio = nn.Parameter(torch.full((n_heads,), float(init_ratio)))

    def spans(self) -> Tensor:
        """Current spans ``z`` ``[h]`` (fp32, in ``[0, max_span]``)."""
        return self.span_ratio.float().clamp(0.0, 1.0) * self.max_span

    def soft_mask(self, distance: Tensor) -> Tensor:
        """``m_z(x) = clamp((R + z - x) / R, 0, 1)`` for distances ``[..]`` -> ``[h, ..]`` fp32."""
        z = self.spans().view(-1, *([1] * distance.dim()))  # [h, 1, ...]
        return ((self.ramp + z - distance.float()[None]) / self.ramp).clamp(0.0, 1.0)

    def extra_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """``log m_z(i - j)`` as ``[1, h, Tq, Tk]`` (``-inf`` where the mask is 0, with a zero gradient)."""
        mask = self.soft_mask(q_pos[:, None] - k_pos[None, :])  # [h, Tq, Tk]
        log_mask = torch.log(mask.clamp_min(1e-30))  # finite everywhere: no inf * 0 in backward
        return log_mask.masked_fill(mask == 0, float("-inf"))[None]  # [1, h, Tq, Tk]

    def effective_window(self) -> int | None:
        """Keys at distance ``>= z_max + R`` have mask 0: at most ``ceil(z_max + R)`` keys per query."""
        reach = math.ceil(float(self.spans().max().detach()) + self.ramp)
        return reach if self.window is None else min(reach, self.window)

    def span_loss(self) -> Tensor:
        """``span_loss_coef * mean_h z_h`` (the paper's L1 penalty, averaged over heads)."""
        return self.span_loss_coef * self.spans().mean()

    @torch.no_grad()
    def clamp_(self) -> None:
        """Keep the span ratios in ``[0, 1]`` (call after each optimizer step, as the paper's code does)."""
        self.span_ratio.clamp_(0.0, 1.0)
