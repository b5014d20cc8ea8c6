"""Sparse attention: axial, LSH (Reformer) and adaptive span, each against a brute-force reference
and the invariants that apply (causality, equality to dense attention in the covering limit)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import D_MODEL, N_HEADS, VARIANT_IDS, VARIANTS, Variant, make_attention, make_scheme, on_backend
from torch.testing import assert_close

from poslab import AttentionConfig, MultiHeadAttention
from poslab.nn.sparse import (
    SELF_LOGIT,
    AdaptiveSpanAttention,
    AxialAttention,
    LSHAttention,
    lsh_attention,
    lsh_buckets,
    random_rotations,
)

TIGHT = {"atol": 1e-5, "rtol": 1e-5}


# ======================================================================================== axial
def _axial(causal: bool = False, seed: int = 0) -> AxialAttention:
    torch.manual_seed(seed)
    rope = make_scheme(Variant("rope", "rope"))
    return AxialAttention(D_MODEL, N_HEADS, causal=causal, row_position=rope, col_position=rope).eval()


def _same(index: torch.Tensor) -> torch.Tensor:
    return index[:, None] == index[None, :]


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_axial_passes_equal_dense_attention_restricted_to_rows_and_columns(causal: bool) -> None:
    """Row pass = dense attention over the row-major flattening with a same-row mask; column pass =
    dense attention over the column-major flattening with a same-column mask (RoPE on both)."""
    axial = _axial(causal)
    B, H, W = 2, 3, 5
    x = torch.randn(B, H, W, D_MODEL)
    n = torch.arange(H * W)
    with torch.no_grad():
        rows = axial.row_pass(x)
        dense_rows = on_backend(axial.row, "eager", x.reshape(B, H * W, D_MODEL), n, mask=_same(n // W))  # row-major
        assert_close(rows, dense_rows.view(B, H, W, D_MODEL), **TIGHT)
        cols = axial.column_pass(x)
        col_major = x.transpose(1, 2).reshape(B, W * H, D_MODEL)  # [B, W, H, d] -> [B, W*H, d]
        dense_cols = on_backend(axial.col, "eager", col_major, n, mask=_same(n // H))
        assert_close(cols, dense_cols.view(B, W, H, D_MODEL).transpose(1, 2), **TIGHT)
        assert_close(axial(x), axial.column_pass(axial.row_pass(x)), atol=0, rtol=0)


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_axial_receptive_field(causal: bool) -> None:
    """Two passes reach every cell; causal passes reach exactly the cells above-left (inclusive)."""
    axial = _axial(causal)
    H, W = 4, 5
    x = torch.randn(1, H, W, D_MODEL, requires_grad=True)
    r, c = 2, 3
    axial(x)[0, r, c].sum().backward()
    reached = x.grad[0].abs().sum(-1) > 0  # [H, W]
    expected = torch.ones(H, W, dtype=torch.bool)
    if causal:
        expected = (torch.arange(H)[:, None] <= r) & (torch.arange(W)[None, :] <= c)
    assert torch.equal(reached, expected)


def test_axial_rejects_a_sequence() -> None:
    with pytest.raises(ValueError, match=r"axial attention input must be \[B, H, W, 32\]"):
        _axial()(torch.randn(2, 7, D_MODEL))


# ========================================================================================== LSH
def brute_force_lsh(
    qk: torch.Tensor, v: torch.Tensor, buckets: torch.Tensor, chunk: int, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """One hash round for one head, pair by pair. qk [T, d], v [T, dv], buckets [T] -> (out [T, dv], lse [T])."""
    T, d = qk.shape
    keys = torch.nn.functional.normalize(qk.double(), dim=-1)
    order = sorted(range(T), key=lambda t: (int(buckets[t]), t))
    chunk_of = {t: slot // chunk for slot, t in enumerate(order)}
    n_chunks = T // chunk
    out, lse = torch.zeros(T, v.shape[1], dtype=torch.float64), torch.zeros(T, dtype=torch.float64)
    for i in range(T):
        logits, values = [], []
        for j in range(T):
            if buckets[i] != buckets[j] or (causal and j > i):
                continue
            near = chunk_of[j] == chunk_of[i] or (n_chunks > 1 and chunk_of[j] == (chunk_of[i] - 1) % n_chunks)
            if not near:
                continue
            logits.append(SELF_LOGIT if i == j else float(qk[i].double() @ keys[j]) / math.sqrt(d))
            values.append(v[j].double())
        logits_t = torch.tensor(logits, dtype=torch.float64)
        out[i] = torch.softmax(logits_t, 0) @ torch.stack(values)
        lse[i] = torch.logsumexp(logits_t, 0)
    return out, lse


def _lsh_inputs(T: int = 16, d: int = 8, h: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, h, T, d, generator=g), torch.randn(1, h, T, d, generator=g)


def test_lsh_buckets_are_the_argmax_of_the_rotations() -> None:
    qk, _ = _lsh_inputs()
    rot = random_rotations(8, n_buckets=6, n_hashes=2, generator=torch.Generator().manual_seed(1))
    buckets = lsh_buckets(qk, 6, rot)
    assert buckets.shape == (1, 2, 2, 16)
    for head in range(2):
        for r in range(2):
            for t in range(16):
                proj = [float(qk[0, head, t] @ rot[:, r, b]) for b in range(3)]
                assert int(buckets[0, head, r, t]) == max(range(6), key=lambda b: proj[b] if b < 3 else -proj[b - 3])


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidir"])
def test_lsh_one_bucket_one_chunk_equals_dense_shared_qk_attention(causal: bool) -> None:
    """The covering limit: one bucket and one chunk of T is dense shared-QK attention (n_hashes 1 and 2)."""
    qk, v = _lsh_inputs()
    T = qk.shape[2]
    keys = torch.nn.functional.normalize(qk, dim=-1)
    logits = qk @ keys.transpose(-1, -2) / math.sqrt(qk.shape[-1])  # [1, h, T, T]
    logits = logits.masked_fill(torch.eye(T, dtype=torch.bool), SELF_LOGIT)
    if causal:
        logits = logits.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    dense = torch.softmax(logits, -1) @ v
    for n_hashes in (1, 2):
        rot = random_rotations(8, 1, n_hashes)
        assert_close(lsh_attention(qk, v, n_buckets=1, chunk_size=T, rotations=rot, causal=causal), dense, **TIGHT)


@pytest.mark.parametrize(("n_buckets", "chunk", "causal"), [(1, 4, True), (4, 4, True), (4, 2, False), (8, 8, True)])
def test_lsh_equals_brute_force(n_buckets: int, chunk: int, causal: bool) -> None:
    """Buckets, sort, chunk + previous chunk, bucket/causal/self masks: pair by pair (one round)."""
    qk, v = _lsh_inputs()
    rot = random_rotations(8, n_buckets, 1, generator=torch.Generator().manual_seed(2))
    got = lsh_attention(qk, v, n_buckets=n_buckets, chunk_size=chunk, rotations=rot, causal=causal)
    buckets = lsh_buckets(qk, n_buckets, rot)
    for head in range(2):
        expected, _ = brute_force_lsh(qk[0, head], v[0, head], buckets[0, head, 0], chunk, causal)
        assert_close(got[0, head], expected.float(), **TIGHT)


def test_lsh_hash_rounds_combine_by_their_normalisers() -> None:
    qk, v = _lsh_inputs()
    rot = random_rotations(8, 4, 3, generator=torch.Generator().manual_seed(3))
    got = lsh_attention(qk, v, n_buckets=4, chunk_size=4, rotations=rot)
    buckets = lsh_buckets(qk, 4, rot)
    for head in range(2):
        rounds = [brute_force_lsh(qk[0, head], v[0, head], buckets[0, head, r], 4, True) for r in range(3)]
        lse = torch.stack([lse for _, lse in rounds])  # [n, T]
        weights = torch.softmax(lse, 0)[..., None]  # [n, T, 1]
        expected = (weights * torch.stack([out for out, _ in rounds])).sum(0)
        assert_close(got[0, head], expected.float(), **TIGHT)


def test_lsh_is_causal_in_the_values() -> None:
    """Changing the values of later tokens never changes an earlier output (buckets stay put)."""
    qk, v = _lsh_inputs(T=32)
    rot = random_rotations(8, 4, 2)
    base = lsh_attention(qk, v, n_buckets=4, chunk_size=4, rotations=rot)
    t = 13
    changed = v.clone()
    changed[:, :, t + 1 :] += torch.randn_like(changed[:, :, t + 1 :])
    out = lsh_attention(qk, changed, n_buckets=4, chunk_size=4, rotations=rot)
    assert_close(out[:, :, : t + 1], base[:, :, : t + 1], atol=0, rtol=0)
    assert (out[:, :, t + 1 :] - base[:, :, t + 1 :]).abs().max() > 1e-3


def test_lsh_layer_runs_and_learns_through_backward() -> None:
    layer = LSHAttention(D_MODEL, N_HEADS, n_buckets=4, chunk_size=8, n_hashes=2)
    x = torch.randn(2, 32, D_MODEL, requires_grad=True)
    out = layer(x, generator=torch.Generator().manual_seed(0))
    assert out.shape == x.shape
    out.square().sum().backward()
    assert x.grad.abs().sum() > 0 and layer.qkv.weight.grad.abs().sum() > 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"chunk_size": 5}, r"chunk_size=5 must divide the sequence length T=16"),
        ({"n_buckets": 3}, r"n_buckets must be 1 or even"),
        ({"n_buckets": 0}, r"n_buckets must be a positive integer, got 0"),
        ({"n_hashes": -1}, r"n_hashes must be a positive integer, got -1"),
    ],
)
def test_lsh_bad_input(kwargs: dict, message: str) -> None:
    qk, v = _lsh_inputs()
    args = {"n_buckets": 4, "chunk_size": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        lsh_attention(qk, v, **args)


def test_lsh_layer_rejects_a_length_its_chunks_do_not_divide() -> None:
    with pytest.raises(ValueError, match="chunk_size=8 must divide the sequence length T=20"):
        LSHAttention(D_MODEL, N_HEADS, chunk_size=8)(torch.randn(1, 20, D_MODEL))
    with pytest.raises(ValueError, match="n_buckets must be 1 or even"):
        LSHAttention(D_MODEL, N_HEADS, n_buckets=5)


# =============================================================================== adaptive span
def _span(variant: Variant | None = None, seed: int = 0, **kwargs) -> AdaptiveSpanAttention:
    torch.manual_seed(seed)
    scheme = make_scheme(variant) if variant is not None else None
    args = {"max_span": 8, "ramp": 4, "init_ratio": 0.5, **kwargs}
    return AdaptiveSpanAttention(D_MODEL, N_HEADS, 2, position=scheme, **args).eval()


def test_soft_mask_is_the_papers_ramp() -> None:
    attn = _span(max_span=10, ramp=3)
    with torch.no_grad():
        attn.span_ratio.copy_(torch.tensor([0.0, 0.25, 0.5, 1.0]))
    x = torch.arange(16)
    mask = attn.soft_mask(x).detach()
    for head, z in enumerate([0.0, 2.5, 5.0, 10.0]):
        for d in range(16):
            assert abs(float(mask[head, d]) - min(1.0, max(0.0, (3 + z - d) / 3))) < 1e-6


def _copy_into_plain(span: AdaptiveSpanAttention) -> MultiHeadAttention:
    plain = MultiHeadAttention(D_MODEL, N_HEADS, 2, position=span.position).eval()
    state = {k: v for k, v in span.state_dict().items() if k != "span_ratio"}
    plain.load_state_dict(state)
    return plain


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_adaptive_span_covering_everything_equals_dense(variant: Variant) -> None:
    span = _span(variant, max_span=16, init_ratio=1.0)  # z = 16 >= T - 1: the mask is all ones
    plain = _copy_into_plain(span)
    x = torch.randn(2, 12, D_MODEL)
    with torch.no_grad():
        assert_close(span(x), plain(x), **TIGHT)


def test_adaptive_span_weights_are_the_masked_renormalised_softmax() -> None:
    """``a = m exp(s) / sum m exp(s)``: the paper's (and its code's) form, from the plain weights."""
    span = _span(Variant("rope", "rope"), init_ratio=0.3)
    with torch.no_grad():
        span.span_ratio.copy_(torch.tensor([0.0, 0.3, 0.6, 1.0]))
    plain = _copy_into_plain(span)
    x = torch.randn(2, 20, D_MODEL)
    pos = torch.arange(20)
    with torch.no_grad():
        _, weights = span.forward_with_weights(x)
        _, dense = plain.forward_with_weights(x)
        m = span.soft_mask((pos[:, None] - pos[None, :]).clamp(min=0))[None]  # [1, h, T, T]
    expected = dense * m
    assert_close(weights, expected / expected.sum(-1, keepdim=True), **TIGHT)
    assert (weights[0, 0].tril(-4) == 0).all()  # head 0 (z=0, R=4): nothing at distance >= 4


def test_adaptive_span_blocked_path_equals_one_shot_and_skips_far_keys() -> None:
    span = _span(Variant("alibi", "alibi"))
    assert span.effective_window() == math.ceil(0.5 * 8 + 4)
    x = torch.randn(2, 64, D_MODEL)
    with torch.no_grad():
        eager = on_backend(span, "eager", x)
        span.query_chunk = 8
        assert_close(span(x), eager, **TIGHT)


def test_adaptive_span_is_causal() -> None:
    span = _span(Variant("t5", "t5"), init_ratio=1.0)
    x = torch.randn(2, 12, D_MODEL)
    t = 6
    changed = x.clone()
    changed[:, t] += 1.0
    with torch.no_grad():
        assert_close(span(changed)[:, :t], span(x)[:, :t], atol=1e-6, rtol=0)


def test_span_is_learned_and_penalised() -> None:
    """The span gets a gradient from the task (through the ramp) and from the L1 penalty."""
    span = _span(init_ratio=0.25, span_loss_coef=0.1).train()
    x = torch.randn(2, 24, D_MODEL)
    span(x).square().sum().backward()
    assert (span.span_ratio.grad.abs() > 0).all()
    span.zero_grad()
    span.span_loss().backward()
    assert_close(span.span_ratio.grad, torch.full((N_HEADS,), 0.1 * 8 / N_HEADS), **TIGHT)
    optimizer = torch.optim.SGD([span.span_ratio], lr=1.0)
    for _ in range(5):
        optimizer.zero_grad()
        span.span_loss().backward()
        optimizer.step()
        span.clamp_()
    assert (span.span_ratio == 0).all()  # the penalty alone shrinks every span to 0, clamped


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"max_span": 0}, ValueError, "max_span must be a positive integer, got 0"),
        ({"ramp": -2}, ValueError, "ramp must be a positive integer, got -2"),
        ({"init_ratio": 1.5}, ValueError, r"init_ratio must be in \[0, 1\]"),
        ({"attention": AttentionConfig(causal=False)}, ValueError, "adaptive span is defined for causal attention"),
        ({"attention": AttentionConfig(backend="flex")}, ValueError, "flex backend cannot express"),
    ],
)
def test_adaptive_span_bad_input(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        _span(**kwargs)


def lesson_adaptive_mask(seq_len: int, spans: list[int]) -> torch.Tensor:
    """Seed 002 §7.1's ``get_attention_mask`` with the span predictor replaced by given integer spans."""
    mask = torch.ones(seq_len, seq_len)
    for span in spans:
        mask += torch.triu(torch.ones(seq_len, seq_len), diagonal=-span)
    return mask


def test_the_lessons_adaptive_mask_masks_nothing_and_is_not_causal() -> None:
    mask = lesson_adaptive_mask(8, [1, 3])
    assert (mask != 0).all()  # masked_fill(mask == 0, ...) would hide nothing: no span at all
    assert mask[0, 7] == 3  # the future key (0 -> 7) counts in both heads' "spans"
    assert set(mask.unique().tolist()) == {1.0, 2.0, 3.0}  # one summed mask, not one per head
    with pytest.raises(TypeError):
        torch.triu(torch.ones(8, 8), diagonal=-torch.tensor(2.0, requires_grad=True))  # a learned span cannot go here


def test_make_attention_window_matches_span_semantics() -> None:
    """Sanity link with window attention: z = 0, R = 1 sees only itself, like window=1."""
    span = _span(max_span=4, ramp=1, init_ratio=0.0)
    windowed = make_attention(None, n_kv_heads=2, window=1)
    windowed.load_state_dict({k: v for k, v in span.state_dict().items() if k != "span_ratio"})
    x = torch.randn(2, 9, D_MODEL)
    with torch.no_grad():
        assert_close(span(x), windowed(x), **TIGHT)
