"""Sliding-window attention against a brute-force reference, for every scheme, backend and path.

The reference decides each (query, key) pair with an explicit Python loop over ``(i, j)`` from the
definition (Hugging Face / Mistral): query ``i`` sees key ``j`` iff ``i - W < j <= i``. Seed 002
§3.1's local-attention mask is run through the same harness to show that it fails it.
"""

from __future__ import annotations

import pytest
import torch
from conftest import D_MODEL, N_HEADS, VARIANT_IDS, VARIANTS, Variant, make_attention, make_gpt, on_backend
from torch.testing import assert_close

from poslab import AttentionConfig, GPTConfig, MultiHeadAttention
from poslab.nn.attention import position_mask

B, T = 2, 10
TIGHT = {"atol": 1e-5, "rtol": 1e-5}
WINDOWS = [1, 2, T - 1, T, T + 5]


# -------------------------------------------------------------------------------- the reference
def brute_force_keep(q_pos: list[int], k_pos: list[int], window: int | None, causal: bool = True) -> torch.Tensor:
    """Keep-mask from the definition, one pair at a time."""
    keep = torch.zeros(len(q_pos), len(k_pos), dtype=torch.bool)
    for a, i in enumerate(q_pos):
        for b, j in enumerate(k_pos):
            ok = True
            if causal and j > i:
                ok = False
            if window is not None:
                ok = ok and (i - window < j <= i if causal else abs(i - j) < window)
            keep[a, b] = ok
    return keep


def reference_attention(
    attn: MultiHeadAttention, x: torch.Tensor, keep: torch.Tensor, pos: torch.Tensor
) -> torch.Tensor:
    """The layer's output computed densely in fp64 with an explicit keep-mask ``[T, T]``."""
    h, hkv, dk = attn.n_heads, attn.n_kv_heads, attn.head_dim
    with torch.no_grad():
        q, k, v = attn.qkv(x).split((h * dk, hkv * dk, hkv * dk), dim=-1)
        q = q.view(B, -1, h, dk).transpose(1, 2)  # [B, T, h, dk] -> [B, h, T, dk]
        k = k.view(B, -1, hkv, dk).transpose(1, 2)  # [B, T, hkv, dk] -> [B, hkv, T, dk]
        v = v.view(B, -1, hkv, dk).transpose(1, 2)
        scheme = attn.position
        if scheme is not None:
            q, k = scheme.rotate(q, k, pos, pos)
        bias = scheme.score_bias(q, k, pos, pos, attn.scale) if scheme is not None and scheme.has_bias else None
        k, v = k.repeat_interleave(h // hkv, 1), v.repeat_interleave(h // hkv, 1)  # [B, h, T, dk]
        logits = q.double() @ k.double().transpose(-1, -2) * attn.scale  # [B, h, T, T]
        if bias is not None:
            logits = logits + bias.double()
        logits = logits.masked_fill(~keep, float("-inf"))
        out = torch.softmax(logits, -1) @ v.double()  # [B, h, T, dk]
        out = out.transpose(1, 2).reshape(B, -1, h * dk).to(x.dtype)  # [B, h, T, dk] -> [B, T, d]
        return attn.proj(out)


def window_harness(mask_fn, T: int = 8, windows: tuple[int, ...] = (1, 2, 3, 7, 8, 12)) -> list[str]:
    """Run ``mask_fn(T, W) -> keep [T, T]`` against the definition; return the failures (empty = pass)."""
    failures = []
    for W in windows:
        expected = brute_force_keep(list(range(T)), list(range(T)), W)
        got = mask_fn(T, W)
        if not torch.equal(got, expected):
            bad = (got != expected).nonzero()[0].tolist()
            failures.append(f"W={W}: pair {bad} is {'kept' if got[bad[0], bad[1]] else 'masked'}")
    return failures


def lesson_local_mask(L: int, window_size: int) -> torch.Tensor:
    """Seed 002 §3.1 verbatim, returned as the keep-mask its ``masked_fill(mask == 0, -1e9)`` implies."""
    mask = torch.ones(L, L).tril(-window_size) + torch.ones(L, L).triu(window_size)
    return mask != 0  # masked_fill(mask == 0, ...) keeps exactly the non-zero entries


def off_by_one_mask(L: int, window_size: int) -> torch.Tensor:
    """``i - j <= W`` (W + 1 keys): the x-transformers / attention-gym convention (transformers#39408)."""
    i = torch.arange(L)
    return (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] <= window_size)


# ------------------------------------------------------------------------------------- masks
def test_poslab_mask_passes_the_harness() -> None:
    assert window_harness(lambda L, W: position_mask(torch.arange(L), torch.arange(L), True, W)) == []


def test_the_harness_catches_the_lessons_local_mask() -> None:
    """Seed 002's mask keeps the far tokens and masks the window (the query itself included)."""
    failures = window_harness(lesson_local_mask)
    assert len(failures) == 6  # wrong for every window tried
    keep = lesson_local_mask(6, 2)
    assert not keep.diagonal().any()  # no query may attend to itself
    assert keep[0, 5] and keep[5, 0]  # the farthest pairs, past and future, are kept
    assert not keep[3, 2]  # the neighbour inside the window is masked


def test_the_harness_catches_an_off_by_one_window() -> None:
    assert len(window_harness(off_by_one_mask)) == 4  # W = 1, 2, 3, 7 < T: W + 1 keys instead of W


@pytest.mark.parametrize("W", [1, 3, 100])
def test_bidirectional_window_is_symmetric(W: int) -> None:
    pos = torch.arange(9)
    assert torch.equal(position_mask(pos, pos, False, W), brute_force_keep(pos.tolist(), pos.tolist(), W, causal=False))


def test_mask_follows_positions_not_indices() -> None:
    q_pos, k_pos = torch.tensor([40, 41]), torch.tensor([38, 41, 39, 40, 37])  # a ring-buffer order
    assert torch.equal(position_mask(q_pos, k_pos, True, 3), brute_force_keep(q_pos.tolist(), k_pos.tolist(), 3))


# ----------------------------------------------------------------------- layer vs reference
# The mask depends on positions only, never on the scheme: every scheme runs one window (W=2, inside
# T); every window runs on one bias scheme and one rotary scheme, which is where the mask meets a
# scheme's hook (the bias is added before masking, the rotation before the logits).
WINDOW_CASES = [(v, 2) for v in VARIANTS] + [(Variant(n, n), W) for n in ("alibi", "rope") for W in WINDOWS if W != 2]


@pytest.mark.parametrize(("variant", "W"), WINDOW_CASES, ids=[f"{v.id}-W{w}" for v, w in WINDOW_CASES])
def test_window_equals_brute_force(variant: Variant, W: int) -> None:
    """sdpa (one call), sdpa (blocked path) and eager all equal the reference (GQA 4:2)."""
    attn = make_attention(variant, n_kv_heads=2, window=W)
    x = torch.randn(B, T, D_MODEL)
    pos = torch.arange(T)
    expected = reference_attention(attn, x, brute_force_keep(pos.tolist(), pos.tolist(), W), pos)
    with torch.no_grad():
        assert_close(on_backend(attn, "sdpa", x), expected, **TIGHT)
        assert_close(on_backend(attn, "eager", x), expected, **TIGHT)
        attn.query_chunk = 3  # force the blocked path: 4 query blocks
        assert_close(on_backend(attn, "sdpa", x), expected, **TIGHT)


@pytest.mark.parametrize("W", [2, 5])
def test_window_with_offset_positions_equals_brute_force(W: int) -> None:
    attn = make_attention(Variant("alibi", "alibi"), window=W)
    x = torch.randn(B, T, D_MODEL)
    pos = torch.arange(100, 100 + T)
    expected = reference_attention(attn, x, brute_force_keep(pos.tolist(), pos.tolist(), W), pos)
    with torch.no_grad():
        assert_close(attn(x, pos), expected, **TIGHT)


def test_window_at_least_T_equals_plain_causal() -> None:
    x = torch.randn(B, T, D_MODEL)
    full = make_attention(Variant("rope", "rope"), seed=3)
    for W in (T, T + 5):
        windowed = make_attention(Variant("rope", "rope"), window=W, seed=3)
        with torch.no_grad():
            assert_close(windowed(x), full(x), **TIGHT)


def test_window_1_attends_only_to_itself() -> None:
    attn = make_attention(None, window=1)
    _, weights = attn.forward_with_weights(torch.randn(B, T, D_MODEL))
    assert_close(weights, torch.eye(T).expand(B, N_HEADS, T, T), atol=0, rtol=0)


FLEX_CASES = [(v, 3) for v in VARIANTS] + [(Variant("rope", "rope"), 1), (Variant("alibi", "alibi"), T + 5)]


@pytest.mark.slow
@pytest.mark.parametrize(("variant", "W"), FLEX_CASES, ids=[f"{v.id}-W{w}" for v, w in FLEX_CASES])
def test_window_flex_equals_brute_force(variant: Variant, W: int) -> None:
    """FlexAttention (compiled on CPU: ~20 s per case) against the brute-force reference."""
    attn = make_attention(variant, n_kv_heads=2, window=W)
    x = torch.randn(B, 16, D_MODEL)
    pos = torch.arange(16)
    expected = reference_attention(attn, x, brute_force_keep(pos.tolist(), pos.tolist(), W), pos)
    with torch.no_grad():
        assert_close(on_backend(attn, "flex", x), expected, **TIGHT)


# ---------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "4"])
def test_bad_window_is_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match="window must be a positive integer"):
        MultiHeadAttention(D_MODEL, N_HEADS, attention=AttentionConfig(window=bad))
    with pytest.raises(ValueError, match="window"):
        GPTConfig(attention=AttentionConfig(window=bad))


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_gpt_with_window_sees_exactly_its_receptive_field(variant: Variant) -> None:
    """Every scheme: with window W and L layers, the logit at t depends on tokens t-L(W-1) .. t only."""
    W, layers, T_long = 3, 2, 12
    reach = layers * (W - 1)  # 4: each layer looks W-1 tokens further back
    model = make_gpt(variant, n_layer=layers, attention={"window": W})
    idx = torch.randint(0, 10, (B, T_long))
    changed = idx.clone()
    changed[:, 0] = (changed[:, 0] + 1) % 10
    with torch.no_grad():
        diff = (model(changed) - model(idx)).abs().amax(dim=(0, 2))  # [T]: per position
    assert (diff[reach + 1 :] == 0).all(), variant.id  # out of reach: bitwise unchanged
    assert diff[0] > 1e-4, variant.id
