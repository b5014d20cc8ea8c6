"""Property tests (hypothesis): the contract's invariants on random geometries, lengths and offsets.

Each property draws a scheme variant (every registered scheme plus RoPE/xPos variants), a head count,
a GQA ratio (``n_kv_heads`` dividing ``n_heads``), a head width, a batch, a length and an offset.
The number of examples is bounded by the ``poslab`` hypothesis profile in ``conftest.py``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import ALL_VARIANTS as VARIANTS  # draws cost the same whatever the pool: every rotary config too
from conftest import Variant, make_attention
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

from poslab import KVCache

TIGHT = {"atol": 1e-5, "rtol": 1e-5}

pytestmark = pytest.mark.usefixtures("single_thread")


def _fit(variant: Variant, head_dim: int) -> Variant:
    """Resize per-frequency config lists (longrope factors) and partial rotary dims to ``head_dim``."""
    config = dict(variant.config)
    rot = config.get("rotary_dim") or head_dim
    if "rotary_dim" in config:
        rot = config["rotary_dim"] = max(2, head_dim // 2 // 2 * 2)
    for key in ("short_factor", "long_factor"):
        if key in config:
            config[key] = [config[key][i % len(config[key])] for i in range(rot // 2)]
    return dataclasses.replace(variant, config=config)


@st.composite
def geometries(draw: st.DrawFn, relative_only: bool = False) -> dict:
    """A scheme variant with a compatible attention geometry and inputs."""
    pool = [v for v in VARIANTS if v.cls.relative] if relative_only else VARIANTS
    variant = draw(st.sampled_from(pool))
    n_heads = draw(st.sampled_from([1, 2, 3, 4, 6, 8]))
    n_kv_heads = draw(st.sampled_from([d for d in range(1, n_heads + 1) if n_heads % d == 0]))
    head_dim = draw(st.sampled_from([4, 8, 16]))
    return {
        "variant": _fit(variant, head_dim),
        "n_heads": n_heads,
        "n_kv_heads": n_kv_heads,
        "d_model": n_heads * head_dim,
        "batch": draw(st.integers(1, 3)),
        "T": draw(st.integers(1, 20)),
        "seed": draw(st.integers(0, 2**16)),
    }


def _attention(g: dict, **kwargs) -> torch.nn.Module:
    return make_attention(
        g["variant"], g["d_model"], g["n_heads"], g["n_kv_heads"], max_len=256, seed=g["seed"], **kwargs
    )


def _inputs(g: dict) -> torch.Tensor:
    return torch.randn(g["batch"], g["T"], g["d_model"], generator=torch.Generator().manual_seed(g["seed"]))


@given(g=geometries(), backend=st.sampled_from(["sdpa", "eager"]), data=st.data())
def test_property_causality(g: dict, backend: str, data: st.DataObject) -> None:
    attn = _attention(g, backend=backend)
    x = _inputs(g)
    t = data.draw(st.integers(0, g["T"] - 1), label="t")
    changed = x.clone()
    changed[:, t] += 1.0
    with torch.no_grad():
        before, after = attn(x), attn(changed)
    assert_close(after[:, :t], before[:, :t], atol=1e-6, rtol=0)


@given(g=geometries(relative_only=True), backend=st.sampled_from(["sdpa", "eager"]), data=st.data())
def test_property_relative_schemes_are_shift_invariant(g: dict, backend: str, data: st.DataObject) -> None:
    limit = g["variant"].window_len or 10_000  # stay inside the window of length-dependent variants
    shift = data.draw(st.integers(0, limit - g["T"] - 1), label="shift")
    start = data.draw(st.integers(0, limit - g["T"] - 1 - shift), label="start")
    attn = _attention(g, backend=backend)
    x = _inputs(g)
    pos = torch.arange(start, start + g["T"])
    with torch.no_grad():
        assert_close(attn(x, pos + shift), attn(x, pos), atol=5e-5, rtol=5e-5)


@given(g=geometries(), backend=st.sampled_from(["sdpa", "eager"]), data=st.data())
def test_property_kv_cache_equals_full_forward(g: dict, backend: str, data: st.DataObject) -> None:
    limit = g["variant"].window_len or 200
    start = data.draw(st.integers(0, limit - g["T"] - 1), label="start")
    prefill = data.draw(st.integers(1, g["T"]), label="prefill")
    attn = _attention(g, backend=backend)
    x = _inputs(g)
    pos = torch.arange(start, start + g["T"])
    cache = KVCache(g["batch"], g["n_kv_heads"], g["d_model"] // g["n_heads"], capacity=g["T"] + 3)
    with torch.no_grad():
        full = attn(x, pos)
        steps = [attn(x[:, :prefill], pos[:prefill], cache=cache)]
        steps += [attn(x[:, t : t + 1], pos[t : t + 1], cache=cache) for t in range(prefill, g["T"])]
    assert_close(torch.cat(steps, dim=1), full, **TIGHT)


@given(g=geometries(), data=st.data())
def test_property_permuting_keys_matters_only_with_positions(g: dict, data: st.DataObject) -> None:
    """Non-causal attention without positions is permutation-equivariant; every position scheme breaks it."""
    if g["T"] < 3:
        return
    attn = _attention(g, causal=False)
    x = _inputs(g)
    perm = torch.roll(torch.arange(g["T"]), 1)
    with torch.no_grad():
        out, out_perm = attn(x), attn(x[:, perm])
    if not g["variant"].cls.encodes_position or g["variant"].name in ("learned", "sinusoidal"):
        # absolute schemes act in the model's embedding, not in the attention layer
        assert_close(out_perm, out[:, perm], **TIGHT)
    else:
        assert (out_perm - out[:, perm]).abs().max() > 1e-5
