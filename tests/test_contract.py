"""Contract every registered position scheme must honour, on a tiny GPT and on a bare attention layer.

Parametrized over ``poslab.nn.positions.names()`` (``conftest.scheme_variants``), so a newly
registered scheme is covered without touching this file. The RoPE layouts/scalings and xPos's
interleaved layout change only the rotation: :func:`test_rotary_variant_contract` runs on each of
them the checks a rotation can break.
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import (
    ABSOLUTE_VARIANTS,
    BIAS_VARIANTS,
    D_MODEL,
    N_HEADS,
    RELATIVE_VARIANTS,
    ROTARY_VARIANTS,
    VARIANT_IDS,
    VARIANTS,
    VOCAB,
    Variant,
    make_attention,
    make_gpt,
    make_scheme,
    scheme_variants,
)
from torch.testing import assert_close

from poslab import MultiHeadAttention, positions
from poslab.nn.attention import AttentionLayer
from poslab.nn.caches import DecodeSpec
from poslab.nn.positions.base import PositionScheme

B, T = 2, 12
pytestmark = pytest.mark.usefixtures("single_thread")

TIGHT = {"atol": 1e-5, "rtol": 1e-5}


def _ids(variants: list[Variant]) -> list[str]:
    return [v.id for v in variants]


def _x(T: int = T, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(B, T, D_MODEL, dtype=dtype)


def _idx(T: int = T) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T))


def test_the_builtin_schemes_are_registered() -> None:
    assert {"none", "learned", "sinusoidal", "rope", "xpos", "alibi", "t5", "kerple", "fire", "xl"} <= set(
        positions.names()
    )


def test_a_newly_registered_scheme_joins_the_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registering a scheme (one file + one registry line) puts it in the contract's parametrization."""
    from dataclasses import dataclass

    from poslab.nn.positions import _REGISTRY

    @dataclass
    class _Config:
        pass

    cls = type("ContractProbe", (PositionScheme,), {"name": "contract-probe", "config_class": _Config})
    monkeypatch.setitem(_REGISTRY, "contract-probe", cls)
    assert "contract-probe" in [v.name for v in scheme_variants()]


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v.cls.encodes_position], ids=lambda v: v.id)
def test_every_scheme_that_encodes_position_changes_attention_vs_none(variant: Variant) -> None:
    """Embed + attention with the scheme differ from the same layer with ``none``.

    Catches a scheme whose hook is never called (e.g. a bias that is not dispatched): it would pass every
    other contract test as NoPE.
    """
    scheme = make_scheme(variant)
    torch.manual_seed(0)
    attn = MultiHeadAttention(D_MODEL, N_HEADS, 2).eval()
    x, pos = _x(), torch.arange(T)
    with torch.no_grad():
        attn.share_position(positions.build("none"))
        plain = attn(x, pos)
        attn.share_position(scheme)
        encoded = attn(scheme.embed(x, pos), pos)
    assert (encoded - plain).abs().max() > 1e-3, variant.id


# ------------------------------------------------------------------------------- shape and dtype
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_gpt_keeps_shape_and_dtype(variant: Variant, dtype: torch.dtype) -> None:
    model = make_gpt(variant).to(dtype)
    idx = _idx()
    logits, loss = model(idx, idx)
    assert logits.shape == (B, T, VOCAB)
    assert logits.dtype == dtype
    assert torch.isfinite(logits).all() and torch.isfinite(loss)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_attention_keeps_shape_and_dtype(variant: Variant, dtype: torch.dtype, backend: str) -> None:
    attn = make_attention(variant, n_kv_heads=2, backend=backend).to(dtype)
    out = attn(_x(dtype=dtype))
    assert out.shape == (B, T, D_MODEL)
    assert out.dtype == dtype
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_cast_keeps_fp32_buffers(variant: Variant) -> None:
    """``model.to(bf16)`` must not round frequencies, slopes or tables: they stay fp32."""
    model = make_gpt(variant)
    reference = {name: buf.clone() for name, buf in model.position.named_buffers()}
    model.to(torch.bfloat16)
    for name, buf in model.position.named_buffers():
        if reference[name].is_floating_point():
            assert buf.dtype == torch.float32, f"{variant.id}: buffer {name} was cast to {buf.dtype}"
            assert torch.equal(buf, reference[name])


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_every_position_parameter_gets_a_gradient(variant: Variant) -> None:
    """Learned tables, biases, slopes and MLPs of a scheme train: each gets a finite, non-zero gradient."""
    model = make_gpt(variant).train()
    idx = _idx()
    _, loss = model(idx, idx)
    loss.backward()
    for name, p in model.position.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), f"{variant.id}: {name}"
        assert p.grad.abs().max() > 0, f"{variant.id}: {name} gets no gradient"


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_state_dict_round_trip_restores_the_model(variant: Variant) -> None:
    model = make_gpt(variant)
    fresh = make_gpt(variant, seed=99)
    fresh.load_state_dict(model.state_dict())
    idx = _idx()
    assert_close(fresh(idx), model(idx), atol=0, rtol=0)


# ------------------------------------------------------------------------------------- causality
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_gpt_is_causal(variant: Variant) -> None:
    """Changing token t never changes the logits before t (and does change them at t)."""
    model = make_gpt(variant)
    idx = _idx()
    base = model(idx)
    for t in (0, 5, T - 1):
        changed = idx.clone()
        changed[:, t] = (changed[:, t] + 1) % VOCAB
        out = model(changed)
        assert_close(out[:, :t], base[:, :t], atol=1e-6, rtol=0)
        assert (out[:, t] - base[:, t]).abs().max() > 1e-4


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_attention_is_causal(variant: Variant, backend: str) -> None:
    attn = make_attention(variant, n_kv_heads=2, backend=backend)
    x = _x()
    base = attn(x)
    t = 7
    changed = x.clone()
    changed[:, t] += torch.randn(B, D_MODEL)
    out = attn(changed)
    assert_close(out[:, :t], base[:, :t], atol=1e-6, rtol=0)
    assert (out[:, t:] - base[:, t:]).abs().max() > 1e-4


# ---------------------------------------------------------------------------- explicit positions
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_explicit_positions_equal_default(variant: Variant) -> None:
    model = make_gpt(variant)
    idx = _idx()
    assert_close(model(idx, pos=torch.arange(T)), model(idx), atol=0, rtol=0)
    attn = make_attention(variant, n_kv_heads=2)
    x = _x()
    assert_close(attn(x, torch.arange(T)), attn(x), atol=0, rtol=0)


# --------------------------------------------------------------------------------------- KV cache
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_kv_cache_decode_equals_full_forward(variant: Variant) -> None:
    """Prefill 5 tokens, decode the rest one by one: the logits equal one full forward (GQA 4:2)."""
    model = make_gpt(variant)
    idx = _idx(T=16)
    full = model(idx)
    cache = model.make_cache(B, DecodeSpec(capacity=32))
    steps = [model(idx[:, :5], cache=cache)]
    steps += [model(idx[:, t : t + 1], cache=cache) for t in range(5, 16)]
    assert cache[0].length == 16
    assert_close(torch.cat(steps, dim=1), full, **TIGHT)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_attention_kv_cache_with_offset_positions(variant: Variant, backend: str) -> None:
    """Cache decoding at positions 20.. equals a full forward at the same explicit positions."""
    from poslab import KVCache

    attn = make_attention(variant, n_kv_heads=2, backend=backend)
    x = _x(T=10)
    pos = torch.arange(20, 30)
    full = attn(x, pos)
    cache = KVCache(B, 2, D_MODEL // N_HEADS, capacity=10)
    steps = [attn(x[:, :4], pos[:4], cache=cache)]
    steps += [attn(x[:, t : t + 1], pos[t : t + 1], cache=cache) for t in range(4, 10)]
    assert_close(torch.cat(steps, dim=1), full, **TIGHT)


# ---------------------------------------------------------------------------- shift (in)variance
SHIFT = 37


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("variant", RELATIVE_VARIANTS, ids=_ids(RELATIVE_VARIANTS))
def test_relative_attention_is_shift_invariant(variant: Variant, backend: str) -> None:
    attn = make_attention(variant, n_kv_heads=2, backend=backend)
    x = _x()
    pos = torch.arange(T)
    assert_close(attn(x, pos + SHIFT), attn(x, pos), **TIGHT)


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_gpt_shift_invariance_matches_the_scheme_class(variant: Variant) -> None:
    """Relative schemes: the whole model is shift-invariant. Absolute (learned, sinusoidal): it is not."""
    model = make_gpt(variant)
    idx = _idx()
    base, shifted = model(idx), model(idx, pos=torch.arange(T) + SHIFT)
    if variant.cls.relative:
        assert_close(shifted, base, **TIGHT)
    else:
        assert (shifted - base).abs().max() > 1e-2


def test_absolute_schemes_exist_and_are_not_relative() -> None:
    assert {"learned", "sinusoidal"} <= {v.name for v in ABSOLUTE_VARIANTS}


@pytest.mark.parametrize(
    ("variant", "shift"),
    [
        (Variant("rope-dynamic-past", "rope", {"scaling": "dynamic", "factor": 4.0, "original_max_len": 16}), 37),
        (
            Variant(
                "rope-longrope-past",
                "rope",
                {
                    "scaling": "longrope",
                    "factor": 4.0,
                    "original_max_len": 16,
                    "short_factor": [1.0, 1.25, 1.5, 2.0],
                    "long_factor": [1.0, 2.0, 4.0, 8.0],
                },
            ),
            37,
        ),
        (Variant("rope-logn-past", "rope", {"logn_scaling": True, "original_max_len": 16}), 37),
        (Variant("fire-past-L", "fire", {"threshold_init": 8.0}), 37),
    ],
    ids=lambda v: v.id if isinstance(v, Variant) else str(v),
)
def test_length_dependent_schemes_lose_shift_invariance_past_their_window(variant: Variant, shift: int) -> None:
    """The flip side of the test above: past ``original_max_len`` (or FIRE's L) positions matter."""
    attn = make_attention(variant, n_kv_heads=2)
    x = _x()
    pos = torch.arange(T)
    assert (attn(x, pos + shift) - attn(x, pos)).abs().max() > 1e-4


# -------------------------------------------------------------------------------------- backends
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_eager_softmax_is_fp32_under_bf16_autocast(variant: Variant) -> None:
    attn = make_attention(variant, n_kv_heads=2, backend="eager")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, weights = attn.forward_with_weights(_x())
    assert out.dtype == torch.bfloat16
    assert weights.dtype == torch.float32
    assert_close(weights.sum(-1), torch.ones(B, N_HEADS, T), atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------- score_mod
@pytest.mark.parametrize("variant", BIAS_VARIANTS, ids=_ids(BIAS_VARIANTS))
def test_score_mod_equals_score_bias(variant: Variant) -> None:
    """Evaluate the Flex ``score_mod`` on broadcast index grids: it must equal the materialized bias."""
    scheme = make_attention(variant, n_kv_heads=2).position
    dk = D_MODEL // N_HEADS
    Tq, Tk = 5, 14
    q = torch.randn(B, N_HEADS, Tq, dk)
    k = torch.randn(B, 2, Tk, dk)
    q_pos, k_pos = torch.arange(9, 9 + Tq), torch.arange(Tk)  # the last 5 queries of a cache-like layout
    scale = dk**-0.5
    bias = scheme.score_bias(q, k, q_pos, k_pos, scale)
    mod = scheme.score_mod(q, k, q_pos, k_pos, scale)
    b = torch.arange(B).view(B, 1, 1, 1)
    h = torch.arange(N_HEADS).view(1, N_HEADS, 1, 1)
    q_idx = torch.arange(Tq).view(1, 1, Tq, 1)
    kv_idx = torch.arange(Tk).view(1, 1, 1, Tk)
    score = torch.randn(B, N_HEADS, Tq, Tk)
    modded = mod(score, b, h, q_idx, kv_idx)
    assert_close(modded - score, bias.expand(B, -1, -1, -1), **TIGHT)
    assert bias.dtype == torch.float32
    assert bias.abs().max() > 1e-3  # the bias is not trivially zero


def test_make_scheme_fills_model_dimensions() -> None:
    scheme = make_scheme(Variant("rope", "rope"), d_model=48, n_heads=6)
    assert scheme.config.head_dim == 8


# ---------------------------------------------------------------------- rotary layouts and scalings
@pytest.mark.parametrize("variant", ROTARY_VARIANTS, ids=_ids(ROTARY_VARIANTS))
def test_rotary_variant_contract(variant: Variant) -> None:
    """Each RoPE layout/scaling and xPos layout: the contract checks a rotation can break.

    bf16 keeps shape, dtype and finiteness; the cast keeps frequencies fp32; the GPT is causal and
    decoding with a KV cache equals the full forward; attention is shift invariant inside the
    variant's window (past it, see the length-dependent test above).
    """
    model = make_gpt(variant)
    idx = _idx(T=16)
    full = model(idx)
    base = model(idx[:, :T])
    changed = idx[:, :T].clone()
    changed[:, 5] = (changed[:, 5] + 1) % VOCAB
    assert_close(model(changed)[:, :5], base[:, :5], atol=1e-6, rtol=0)
    cache = model.make_cache(B, DecodeSpec(capacity=16))
    steps = [model(idx[:, :5], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(5, 16)]
    assert_close(torch.cat(steps, dim=1), full, **TIGHT)
    attn = make_attention(variant, n_kv_heads=2)
    x, pos = _x(), torch.arange(T)
    assert_close(attn(x, pos + SHIFT), attn(x, pos), **TIGHT)
    reference = {name: buf.clone() for name, buf in model.position.named_buffers()}
    model.to(torch.bfloat16)
    for name, buf in model.position.named_buffers():
        if reference[name].is_floating_point():
            assert buf.dtype == torch.float32 and torch.equal(buf, reference[name]), name
    logits = model(idx)
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()


def test_a_model_lends_each_layer_its_scheme_without_registering_it() -> None:
    """Every layer runs :meth:`GPT.layer_position` (its ``position_scheme``), the ``state_dict`` holds each
    scheme once, a copied model's layers run the copy's scheme, and ``replace_position`` lends the new one."""
    model = make_gpt(Variant("t5", "t5"), n_layer=3)
    layers = [block.attn for block in model.blocks]
    assert all(isinstance(a, AttentionLayer) for a in layers)
    assert [a.position_scheme for a in layers] == [model.layer_position(i) for i in range(3)]
    assert not [key for key in model.state_dict() if ".attn.position" in key]
    twin = copy.deepcopy(model)
    assert all(block.attn.position_scheme is twin.position for block in twin.blocks)
    scheme = model.replace_position("alibi")
    assert all(a.position_scheme is scheme for a in layers)
