"""KV cache contract: prefill + decode equals the full forward for every scheme (plain, GQA,
chunked, rolling window, eager), and bad input gets a clear error."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import D_MODEL, N_HEADS, VARIANT_IDS, VARIANTS, VOCAB, Variant, make_attention, make_gpt, on_backend
from torch.testing import assert_close

from poslab import KVCache
from poslab.nn.attention import attend
from poslab.nn.caches import DecodeSpec, SegmentMemorySpec, StreamingSpec

B = 2
TIGHT = {"atol": 1e-5, "rtol": 1e-5}
DK = D_MODEL // N_HEADS


def _decode(model, idx: torch.Tensor, steps: list[int], cache) -> torch.Tensor:
    """Feed ``idx`` through the cache in chunks of the given sizes; concatenated logits."""
    outs, t = [], 0
    for n in steps:
        outs.append(model(idx[:, t : t + n], cache=cache))
        t += n
    assert t == idx.shape[1]
    return torch.cat(outs, dim=1)


HEAD_LAYOUTS = [(v, 2) for v in VARIANTS] + [
    (Variant(n, n), kv) for n in ("rope", "alibi", "xl") for kv in (N_HEADS, 1)
]


@pytest.mark.parametrize(("variant", "n_kv_head"), HEAD_LAYOUTS, ids=[f"{v.id}-kv{kv}" for v, kv in HEAD_LAYOUTS])
def test_prefill_and_decode_equal_full_forward(variant: Variant, n_kv_head: int) -> None:
    """Prefill 5, then single tokens and chunks: every logit equals one full forward (1e-5).

    Every scheme with GQA (2 kv heads for 4 query heads); MHA and MQA for three scheme families.
    """
    model = make_gpt(variant, n_kv_head=n_kv_head)
    idx = torch.randint(0, VOCAB, (B, 16))
    with torch.no_grad():
        full = model(idx)
        cache = model.make_cache(B, DecodeSpec(capacity=16))
        assert cache[0].k.shape == (B, n_kv_head, 16, DK)  # stores the kv heads only
        got = _decode(model, idx, [5, 1, 1, 3, 1, 2, 3], cache)
    assert cache[0].length == 16
    assert_close(got, full, **TIGHT)


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_rolling_cache_with_window_equals_full_forward(variant: Variant) -> None:
    """A sliding-window model keeps W=4 cache entries; prefill 6 (> W), singles, a 3-chunk."""
    model = make_gpt(variant, attention={"window": 4})
    idx = torch.randint(0, VOCAB, (B, 20))
    with torch.no_grad():
        full = model(idx)
        cache = model.make_cache(B)
        got = _decode(model, idx, [6, 1, 1, 3, 1, 1, 1, 2, 1, 1, 1, 1], cache)
    assert cache[0].rolling and cache[0].k.shape[2] == 4  # memory: W entries, whatever the length
    assert cache[0].length == 20 and cache[0].size == 4
    assert_close(got, full, **TIGHT)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("name", ["rope", "alibi", "t5", "xl"])
def test_rolling_cache_decodes_far_past_its_capacity(name: str, backend: str) -> None:
    """60 tokens through a 5-entry ring at positions 1000.. equal one windowed forward (GQA)."""
    attn = make_attention(Variant(name, name), n_kv_heads=2, window=5, backend=backend, max_len=2048)
    x = torch.randn(B, 60, D_MODEL)
    pos = torch.arange(1000, 1060)
    cache = KVCache(B, 2, DK, capacity=5, rolling=True)
    with torch.no_grad():
        full = attn(x, pos)
        outs = [attn(x[:, :7], pos[:7], cache=cache)]
        outs += [attn(x[:, t : t + 1], pos[t : t + 1], cache=cache) for t in range(7, 60)]
    assert_close(torch.cat(outs, 1), full, **TIGHT)
    assert sorted(cache.pos.tolist()) == list(range(1055, 1060))


def test_rolling_cache_larger_than_the_window_is_exact() -> None:
    attn = make_attention(Variant("alibi", "alibi"), window=3)
    x = torch.randn(B, 12, D_MODEL)
    cache = KVCache(B, N_HEADS, DK, capacity=5, rolling=True)
    with torch.no_grad():
        full = attn(x)
        got = torch.cat([attn(x[:, :4], cache=cache)] + [attn(x[:, t : t + 1], cache=cache) for t in range(4, 12)], 1)
    assert_close(got, full, **TIGHT)


def test_long_prefill_through_the_blocked_path_then_decode() -> None:
    """A prefill long enough for the blocked path (threshold lowered) followed by decoding."""
    attn = make_attention(Variant("t5", "t5"), n_kv_heads=2)
    attn.query_chunk = 8
    x = torch.randn(B, 40, D_MODEL)
    cache = KVCache(B, 2, DK, capacity=40)
    with torch.no_grad():
        full = on_backend(attn, "eager", x)
        got = torch.cat([attn(x[:, :33], cache=cache)] + [attn(x[:, t : t + 1], cache=cache) for t in range(33, 40)], 1)
    assert_close(got, full, **TIGHT)


def test_reset_forgets_everything() -> None:
    model = make_gpt(Variant("rope", "rope"))
    idx = torch.randint(0, VOCAB, (B, 6))
    cache = model.make_cache(B)
    with torch.no_grad():
        first = model(idx, cache=cache)
        for c in cache:
            c.reset()
        again = model(idx, cache=cache)
    assert cache[0].length == 6
    assert_close(again, first, atol=0, rtol=0)


# --------------------------------------------------------------------------------- bad input
def test_overflow_is_a_clear_error() -> None:
    model = make_gpt(Variant("rope", "rope"))
    cache = model.make_cache(B, DecodeSpec(capacity=8))
    with torch.no_grad():
        model(torch.randint(0, VOCAB, (B, 6)), cache=cache)
        with pytest.raises(ValueError, match=r"KV cache overflow: 6 cached \+ 3 new tokens > capacity 8"):
            model(torch.randint(0, VOCAB, (B, 3)), cache=cache)


def test_rolling_cache_needs_a_window_that_fits() -> None:
    too_wide = make_attention(None, window=6)
    no_window = make_attention(None)
    x = torch.randn(B, 3, D_MODEL)
    for attn in (too_wide, no_window):
        with pytest.raises(ValueError, match="rolling KV cache of capacity 4"):
            attn(x, cache=KVCache(B, N_HEADS, DK, capacity=4, rolling=True))


def test_a_cache_is_a_kvcache() -> None:
    """The layer reads the cache's declared layout (``check_window``, ``reassigns_positions``): another object
    is refused."""
    attn = make_attention(None)

    class Ring:
        rolling, memory, capacity, length = True, True, 4, 0

    with pytest.raises(TypeError, match="cache must be a KVCache, got Ring"):
        attn(torch.randn(B, 3, D_MODEL), cache=Ring())


def test_a_mask_with_a_rolling_cache_is_refused_and_with_a_plain_cache_applies() -> None:
    """A full ring returns its keys in ring order, so a ``[Tq, Tk]`` mask could name no fixed keys: refused,
    naming the cache and the rule. With a plain cache the mask's columns are the cached keys then the new ones."""
    attn = make_attention(None, window=4)
    x = torch.randn(B, 3, D_MODEL)
    with pytest.raises(ValueError, match=r"mask= cannot be combined with a rolling cache \(KVCache, capacity 4\)"):
        attn(x, cache=KVCache(B, N_HEADS, DK, capacity=4, rolling=True), mask=torch.ones(3, 3, dtype=torch.bool))
    full = make_attention(None)
    x = torch.randn(B, 6, D_MODEL)
    keep = torch.ones(6, 6, dtype=torch.bool)
    keep[:, 1] = False  # no query attends key 1
    with torch.no_grad():
        want = full(x, mask=keep)
        cache = KVCache(B, N_HEADS, DK, capacity=8)
        first = full(x[:, :4], cache=cache, mask=keep[:4, :4])
        rest = full(x[:, 4:], cache=cache, mask=keep[4:, :6])
    assert_close(torch.cat((first, rest), 1), want, atol=1e-6, rtol=0)
    assert (want - full(x)).abs().max() > 1e-3  # the mask changed something


def test_cache_dtype_and_device_mismatch_are_clear_errors() -> None:
    attn = make_attention(None)
    x = torch.randn(B, 3, D_MODEL)
    with pytest.raises(TypeError, match="KV cache holds torch.bfloat16 but keys/values are torch.float32"):
        attn(x, cache=KVCache(B, N_HEADS, DK, capacity=8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="KV cache is on meta"):
        attn(x, cache=KVCache(B, N_HEADS, DK, capacity=8, device="meta"))
    with pytest.raises(ValueError, match=r"do not fit this KV cache: expected \[2, 2, T, 8\]"):
        attn(x, cache=KVCache(B, 2, DK, capacity=8))  # the layer has 4 kv heads


@pytest.mark.parametrize(("field", "value", "error"), [("capacity", 0, ValueError), ("batch_size", 1.5, TypeError)])
def test_bad_cache_geometry(field: str, value: object, error: type) -> None:
    args = {"batch_size": B, "n_kv_heads": 2, "head_dim": DK, "capacity": 8, field: value}
    with pytest.raises(error, match=field):
        KVCache(**args)


def _qkv(dtype_k: torch.dtype = torch.float32, device_v: str = "cpu") -> tuple[torch.Tensor, ...]:
    q = torch.randn(1, 4, 5, 8)
    k = torch.randn(1, 2, 5, 8, dtype=dtype_k)
    v = torch.randn(1, 2, 5, 8, device=device_v)
    return q, k, v, torch.arange(5), torch.arange(5)


def test_attend_rejects_mismatched_qkv_dtypes_and_devices() -> None:
    with pytest.raises(TypeError, match="q, k, v must share one dtype"):
        attend(*_qkv(dtype_k=torch.float64))
    with pytest.raises(ValueError, match="q, k, v must be on one device"):
        attend(*_qkv(device_v="meta"))
    q, k, v, qp, kp = _qkv()
    with pytest.raises(ValueError, match=r"query heads \(4\) must be a multiple of key/value heads \(3\)"):
        attend(q, torch.randn(1, 3, 5, 8), torch.randn(1, 3, 5, 8), qp, kp)
    with pytest.raises(ValueError, match="positions must be"):
        attend(q, k, v, qp[:4], kp)


def test_attend_rejects_bad_masks() -> None:
    q, k, v, qp, kp = _qkv()
    with pytest.raises(
        TypeError, match="float attn_mask must be float32 or the queries' dtype torch.float32, got torch.float64"
    ):
        attend(q, k, v, qp, kp, attn_mask=torch.zeros(5, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="attn_mask is on meta"):
        attend(q, k, v, qp, kp, attn_mask=torch.ones(5, 5, dtype=torch.bool, device="meta"))
    with pytest.raises(ValueError, match=r"attn_mask of shape \[4, 5\] does not fit"):
        attend(q, k, v, qp, kp, attn_mask=torch.ones(4, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="attn_mask must be bool"):
        attend(q, k, v, qp, kp, attn_mask=torch.ones(5, 5, dtype=torch.long))


def test_layer_rejects_a_mask_on_another_device() -> None:
    attn = make_attention(None)
    with pytest.raises(ValueError, match="attn_mask is on meta"):
        attn(torch.randn(B, 5, D_MODEL), mask=torch.ones(5, 5, dtype=torch.bool, device="meta"))


def test_the_cache_kind_is_a_typed_spec() -> None:
    """``make_cache`` takes one of the frozen specs: anything else (an int, a keyword) is a one-line
    error naming it; a spec a model cannot serve is refused by its ``build``."""
    model = make_gpt(Variant("rope", "rope"))
    assert [c.capacity for c in model.make_cache(1, DecodeSpec(capacity=6))] == [6, 6]
    assert [c.capacity for c in model.make_cache(1)] == [model.config.block_size] * 2
    rule = "spec must be one of DecodeSpec, StreamingSpec, SegmentMemorySpec, got int 16"
    with pytest.raises(TypeError, match=rule):
        model.make_cache(1, 16)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="capacity"):
        model.make_cache(1, capacity=16)  # type: ignore[call-arg]
    with pytest.raises(dataclasses.FrozenInstanceError):
        DecodeSpec(4).capacity = 8  # type: ignore[misc]
    mla = {"kv_lora_rank": 12, "q_lora_rank": 10, "qk_nope_head_dim": 6, "qk_rope_head_dim": 4, "v_head_dim": 5}
    latent = make_gpt(Variant("rope", "rope"), n_kv_head=None, mla=mla)
    for spec, kind in ((SegmentMemorySpec(4), "segment-memory"), (StreamingSpec(window=4), "streaming")):
        with pytest.raises(ValueError, match=f"a {kind} cache .* needs .*; this (model|one) sets mla"):
            latent.make_cache(1, spec)
