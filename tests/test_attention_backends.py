"""Backend x mechanism x path: every backend that claims a spec computes what eager computes.

The matrix runs every registered backend whose ``supports(spec, call)`` accepts the call, on every
mechanism (plain, bidirectional, window, chunk, sinks, soft-cap, bias, user masks bool and float, all
at once) and every execution path (one shot, query blocks, checkpointed query blocks, one decoded
token, offset and unsorted positions), against a brute-force reference built here from the rule's
definition. The same equality through :class:`MultiHeadAttention` runs every position scheme, the
layer-level mechanisms (QK-norm, temperature) and random geometries (hypothesis), values and
gradients. A toy mechanism registered from this file (a spec field and its ``keep`` term, no backend
edited) runs through the same matrix. Flex on CPU is compared with eager at every length 1-300 and
with every scheme, masking and mechanism (slow; a fast subset in the default run), and with sdpa
through a rolling KV cache (slow). ``auto`` resolves to the backend the device and the call allow.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import test_contract as contract
import test_modern_attention as modern
import test_properties as properties
import torch
from conftest import D_MODEL, N_HEADS, VARIANT_IDS, VARIANTS, VOCAB, Variant, make_attention, make_gpt, on_backend
from hypothesis import given
from hypothesis import strategies as st
from torch.testing import assert_close

from poslab import AttentionConfig
from poslab.nn import attention
from poslab.nn.attention import (
    DEFAULT_RECOMPUTE_THRESHOLD,
    AttendOptions,
    AttentionSpec,
    Call,
    MaskTerm,
    MultiHeadAttention,
    attend,
    resolve_backend,
    use_backend,
)

TIGHT = {"atol": 1e-5, "rtol": 1e-5}
H, HKV, D = 4, 2, 8
SLOPES = torch.tensor([0.5, 0.25, 0.125, 0.0625])


def _bias_fn(q, k, q_pos, k_pos):  # [1, h, tq, tk]: ALiBi-like distance bias
    return -SLOPES.view(1, H, 1, 1) * (q_pos[:, None] - k_pos[None, :]).abs().float()


def _score_mod_for(q_pos, k_pos):
    def score_mod(score, b, h, q_idx, kv_idx):
        return score - SLOPES[h] * (q_pos[q_idx] - k_pos[kv_idx]).abs().float()

    return score_mod


#: mechanism -> AttentionSpec keywords (``bias`` and ``mask`` are filled in per call)
MECHANISMS = {
    "causal": {},
    "bidirectional": {"causal": False},
    "window": {"window": 5},
    "window-1": {"window": 1},
    "window-bidir": {"causal": False, "window": 5},
    "chunk": {"chunk": 7},
    "sinks": {"sinks": True},
    "softcap": {"softcap": 2.0},
    "bias": {"bias": True},
    "mask": {"mask": "bool"},
    "mask-batch": {"mask": "bool-batch"},
    "bias-mask-float": {"bias": True, "mask": "float-batch"},
    "all": {"window": 9, "chunk": 16, "sinks": True, "softcap": 3.0, "bias": True},
}
#: path -> (Tq, Tk, query_chunk, recompute_threshold, positions): one shot, query blocks, checkpointed
#: query blocks, one decoded token, offset positions, unsorted positions
PATHS = {
    "one-shot": (24, 24, 128, DEFAULT_RECOMPUTE_THRESHOLD, "arange"),
    "blocked": (70, 70, 16, DEFAULT_RECOMPUTE_THRESHOLD, "arange"),
    "recompute": (70, 70, 16, 1, "arange"),
    "decode": (1, 30, 128, DEFAULT_RECOMPUTE_THRESHOLD, "last"),
    "offset": (24, 24, 128, DEFAULT_RECOMPUTE_THRESHOLD, "offset"),
    "unsorted": (24, 24, 16, DEFAULT_RECOMPUTE_THRESHOLD, "perm"),
}


def _positions(kind: str, Tq: int, Tk: int) -> tuple[torch.Tensor, torch.Tensor]:
    k_pos = torch.arange(Tk)
    if kind == "arange":
        return k_pos, k_pos
    if kind == "last":
        return k_pos[-1:], k_pos
    if kind == "offset":
        return k_pos + 1000, k_pos + 1000
    perm = torch.randperm(Tk, generator=torch.Generator().manual_seed(1))
    return k_pos[perm], k_pos[perm]


def _user_mask(kind: str, q_pos: torch.Tensor, k_pos: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A random user mask: ``[Tq, Tk]`` bool, or per batch ``[2, 1, Tq, Tk]`` bool or float (0 / -inf)."""
    shape = (len(q_pos), len(k_pos)) if kind == "bool" else (2, 1, len(q_pos), len(k_pos))
    keep = torch.rand(shape, generator=gen) > 0.2
    keep[..., 0] = True  # every query keeps one key
    if kind != "bool":
        keep |= q_pos[:, None] == k_pos[None, :]  # and itself (causal rows keep a key under any order)
    if kind.startswith("float"):
        return torch.zeros(shape).masked_fill(~keep, -math.inf)
    return keep


def _case(mechanism: str, path: str, seed: int = 0):
    """``(spec, q, k, v, q_pos, k_pos, attn_mask, blocking)`` of one matrix cell.

    ``blocking`` holds ``attend``'s ``query_chunk`` and ``recompute_threshold`` for the path.
    """
    Tq, Tk, chunk, recompute, kind = PATHS[path]
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (
        torch.randn(2, H, Tq, D, generator=gen),
        torch.randn(2, HKV, Tk, D, generator=gen),
        torch.randn(2, HKV, Tk, D, generator=gen),
    )
    q_pos, k_pos = _positions(kind, Tq, Tk)
    opts = dict(MECHANISMS[mechanism])
    bias, mask = opts.pop("bias", False), opts.pop("mask", False)
    if opts.pop("sinks", False):
        opts["sinks"] = torch.randn(H, generator=gen)
    if bias:
        opts["bias_fn"], opts["score_mod"] = _bias_fn, _score_mod_for(q_pos, k_pos)
    if mask == "bool":
        attn_mask = torch.rand(Tq, Tk, generator=gen) > 0.2
        attn_mask[:, 0] = True  # every query keeps one key
    else:
        attn_mask = _user_mask(mask, q_pos, k_pos, gen) if mask else None
    blocking = {"query_chunk": chunk, "recompute_threshold": recompute}
    return AttentionSpec(**opts), q, k, v, q_pos, k_pos, attn_mask, blocking


def reference(spec: AttentionSpec, q, k, v, q_pos, k_pos, attn_mask=None) -> torch.Tensor:
    """Brute force in float64 from the definitions (no code of the package but the spec's fields)."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(rep, 1), v.double().repeat_interleave(rep, 1)
    s = q.double() @ k.transpose(-1, -2) * (spec.scale or 1 / math.sqrt(q.shape[-1]))
    if spec.softcap is not None:
        s = spec.softcap * torch.tanh(s / spec.softcap)
    if spec.bias_fn is not None:
        s = s + spec.bias_fn(q, k, q_pos, k_pos).double()
    i, j = q_pos[:, None], k_pos[None, :]
    keep = torch.ones(len(q_pos), len(k_pos), dtype=torch.bool)
    if spec.causal:
        keep &= j <= i
    if spec.window is not None:
        keep &= (i - j < spec.window) if spec.causal else ((i - j).abs() < spec.window)
    if spec.chunk is not None:
        keep &= (i // spec.chunk) == (j // spec.chunk)
    for name, term in attention.MASK_TERMS.items():  # toy terms registered by a test
        if name not in ("causal", "window", "chunk") and getattr(spec, name, None) is not None:
            keep &= term.keep(spec, i, j)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        keep = keep & attn_mask
    elif attn_mask is not None:
        s = s + attn_mask.double()
    s = s.masked_fill(~keep, -math.inf)
    if spec.sinks is not None:
        s = torch.cat((s, spec.sinks.double().view(1, -1, 1, 1).expand(*s.shape[:3], 1)), dim=-1)
    w = torch.softmax(s, dim=-1)[..., : k.shape[2]]
    return (w @ v).float()


def _supported(spec, q, k, v, q_pos, k_pos, attn_mask) -> list[str]:
    mask = None if attn_mask is None else attn_mask if attn_mask.dim() == 4 else attn_mask[None, None]
    call = Call(q, k, v, q_pos, k_pos, attn_mask=mask)
    return [name for name, b in attention.REGISTRY.items() if b.supports(spec, call) is None]


CHEAP = [name for name in attention.REGISTRY if name != "flex"]  # flex compiles: its own tests below


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("mechanism", list(MECHANISMS))
def test_every_supporting_backend_equals_the_reference(mechanism: str, path: str) -> None:
    spec, q, k, v, q_pos, k_pos, mask, blocking = _case(mechanism, path)
    want = reference(spec, q, k, v, q_pos, k_pos, mask)
    ran = []
    for name in _supported(spec, q, k, v, q_pos, k_pos, mask):
        if name not in CHEAP:
            continue
        out, _ = attend(q, k, v, q_pos, k_pos, spec, attn_mask=mask, options=AttendOptions(backend=name, **blocking))
        assert_close(out, want, **TIGHT, msg=lambda m, n=name: f"{n}: {m}")
        ran.append(name)
    assert "eager" in ran  # eager supports every mechanism
    assert ("sdpa" in ran) == (spec.softcap is None)  # sdpa refuses exactly what it cannot compute
    got, _ = attend(q, k, v, q_pos, k_pos, spec, attn_mask=mask, options=AttendOptions(**blocking))  # auto
    assert_close(got, want, **TIGHT)


@pytest.mark.parametrize("mechanism", ["window", "sinks", "bias"])
def test_gradients_agree_across_backends(mechanism: str) -> None:
    """sdpa's fused, blocked, checkpointed and one-call paths backpropagate like eager."""
    for path in ("one-shot", "blocked", "recompute"):
        spec, q, k, v, q_pos, k_pos, mask, blocking = _case(mechanism, path)
        grads = {}
        for name in ("eager", "sdpa"):
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            out, _ = attend(*leaves, q_pos, k_pos, spec, options=AttendOptions(backend=name, **blocking))
            grads[name] = torch.autograd.grad(out.square().sum(), leaves)
        for got, want in zip(grads["sdpa"], grads["eager"]):
            assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_sdpa_refuses_softcap_and_auto_moves_to_eager() -> None:
    spec, q, k, v, q_pos, k_pos, _, _ = _case("softcap", "one-shot")
    call = Call(q, k, v, q_pos, k_pos)
    assert "cannot run in the sdpa backend" in attention.REGISTRY["sdpa"].supports(spec, call)
    assert attention.resolve("auto", spec, call).name == "eager"
    with pytest.raises(ValueError, match="cannot run in the sdpa backend"):
        attend(q, k, v, q_pos, k_pos, spec, options=AttendOptions(backend="sdpa"))


# ------------------------------------------------ every scheme through MultiHeadAttention: sdpa = eager
# (n_kv_heads, causal, window): every GQA ratio, both maskings and a window, in 4 runs per scheme
_FAST_GEOMETRIES = [(N_HEADS, True, None), (2, False, None), (1, True, 3), (2, False, 3)]
_ALL_GEOMETRIES = [(n, c, w) for n in (N_HEADS, 2, 1) for c in (True, False) for w in (None, 3)]


def _geometry_id(g: tuple) -> str:
    n_kv, causal, window = g
    return f"kv{n_kv}-{'causal' if causal else 'bidir'}" + (f"-w{window}" if window else "")


@pytest.mark.parametrize("geometry", _FAST_GEOMETRIES, ids=_geometry_id)
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_sdpa_equals_eager(variant: Variant, geometry: tuple) -> None:
    _sdpa_vs_eager(variant, *geometry)


@pytest.mark.slow
@pytest.mark.parametrize("geometry", _ALL_GEOMETRIES, ids=_geometry_id)
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_sdpa_equals_eager_full_sweep(variant: Variant, geometry: tuple) -> None:
    _sdpa_vs_eager(variant, *geometry)


def _sdpa_vs_eager(variant: Variant, n_kv_heads: int, causal: bool, window: int | None) -> None:
    attn = make_attention(variant, n_kv_heads=n_kv_heads, causal=causal, window=window)
    x = contract._x()
    sdpa = on_backend(attn, "sdpa", x)
    eager, weights = attn.forward_with_weights(x)
    assert_close(sdpa, eager, **TIGHT)
    assert weights.shape == (contract.B, N_HEADS, contract.T, contract.T)
    if causal:
        assert (weights.triu(1) == 0).all()
    if window is not None:
        assert (weights.tril(-window) == 0).all()


@pytest.mark.parametrize("mechanism", modern.SDPA_OK)
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_sdpa_equals_eager_with_every_mechanism(variant: Variant, mechanism: str) -> None:
    attn = modern.make(variant, mechanism, window=4)
    x = modern._x()
    with torch.no_grad():
        assert_close(on_backend(attn, "sdpa", x), on_backend(attn, "eager", x), **TIGHT)


@pytest.mark.parametrize("mechanism", modern.SDPA_OK)
@pytest.mark.parametrize("name", ["none", "rope", "alibi", "t5"])
@pytest.mark.parametrize(
    ("causal", "window"), [(True, None), (True, 37), (False, 37)], ids=["causal", "causal-w37", "bidir-w37"]
)
def test_blocked_sdpa_equals_eager_forward_and_backward(
    name: str, mechanism: str, causal: bool, window: int | None
) -> None:
    """Past ``query_chunk`` queries the sdpa path runs in blocks; sinks ride along as an extra key per block."""
    attn = modern.make(Variant(name, name), mechanism, window=window, causal=causal)
    attn.query_chunk = 16
    x = modern._x(70).requires_grad_()
    out_s = on_backend(attn, "sdpa", x)
    grads_s = torch.autograd.grad(out_s.square().sum(), [x, *attn.parameters()], allow_unused=True)
    out_e = on_backend(attn, "eager", x)
    grads_e = torch.autograd.grad(out_e.square().sum(), [x, *attn.parameters()], allow_unused=True)
    assert_close(out_s, out_e, **TIGHT)
    for gs, ge in zip(grads_s, grads_e):
        assert (gs is None) == (ge is None)
        if gs is not None:
            assert_close(gs, ge, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("name", "window", "query_chunk"), [("t5", 5, 4)])
def test_blocked_sdpa_gradients_equal_eager_to_fp32_rounding(name: str, window: int, query_chunk: int) -> None:
    """A windowed bias scheme in blocks of 4: every gradient (input and scheme parameters) within 1e-5 of eager."""
    x = torch.randn(2, 24, D_MODEL, requires_grad=True)
    attn = make_attention(Variant(name, name), window=window)
    on_backend(attn, "eager", x).square().sum().backward()
    grad_eager = x.grad.clone()
    grads_eager = [p.grad.clone() for p in attn.parameters()]
    x.grad = None
    attn.zero_grad()
    attn.query_chunk, attn.recompute_threshold = query_chunk, 1
    on_backend(attn, "sdpa", x).square().sum().backward()
    assert_close(x.grad, grad_eager, **TIGHT)
    for p, g in zip(attn.parameters(), grads_eager):
        assert_close(p.grad, g, **TIGHT)


@pytest.mark.usefixtures("single_thread")
@given(g=properties.geometries(), causal=st.booleans(), window=st.one_of(st.none(), st.integers(1, 8)))
def test_property_sdpa_equals_eager(g: dict, causal: bool, window: int | None) -> None:
    """Random geometries (every scheme and rotary config, any GQA ratio, head width, batch, length)."""
    if not causal and window is not None:
        window = None  # a one-sided window without the causal mask can leave a row empty
    attn = properties._attention(g, causal=causal, window=window)
    x = properties._inputs(g)
    with torch.no_grad():
        assert_close(on_backend(attn, "sdpa", x), on_backend(attn, "eager", x), **TIGHT)


# ----------------------------------------------------------------------------- a toy mechanism
@dataclasses.dataclass(frozen=True, eq=False)
class StrideSpec(AttentionSpec):
    """A toy mechanism: query ``i`` sees keys ``j`` with ``(i - j) % stride == 0`` (on top of the rest)."""

    stride: int | None = None


@pytest.fixture
def stride_term():
    attention.register_mask_term(MaskTerm("stride", lambda s, qp, kp: (qp - kp) % s.stride == 0, interval=False))
    yield
    attention.unregister_mask_term("stride")


@pytest.mark.parametrize("path", ["one-shot", "blocked", "decode", "unsorted"])
def test_a_toy_mechanism_runs_on_every_backend_that_supports_it(stride_term, path: str) -> None:
    """One spec field and one keep term, no backend edited: every supporting backend equals the reference."""
    _, q, k, v, q_pos, k_pos, _, blocking = _case("causal", path)
    spec = StrideSpec(stride=3)
    assert spec.term_names() == {"causal", "stride"}
    want = reference(spec, q, k, v, q_pos, k_pos)
    plain = reference(AttentionSpec(), q, k, v, q_pos, k_pos)
    if path != "decode" or q_pos.item() % 3:
        assert (want - plain).abs().max() > 1e-3  # the term changed the output
    supported = _supported(spec, q, k, v, q_pos, k_pos, None)
    assert set(supported) == set(attention.REGISTRY)  # a mask term needs no supports rule
    with torch.no_grad():  # flex has no backward on CPU
        for name in supported:
            if name == "flex" and path != "blocked":
                continue  # one compiled flex run (T = 70) is enough here
            out, _ = attend(q, k, v, q_pos, k_pos, spec, options=AttendOptions(backend=name, **blocking))
            assert_close(out, want, **TIGHT, msg=lambda m, n=name: f"{n}: {m}")


def test_a_toy_term_that_is_not_an_interval_bounds_blocks_by_the_whole_rule(stride_term) -> None:
    """key_reach evaluates every row for a non-interval term; the interval shortcut would be wrong here."""
    k_pos = torch.tensor([0, 1, 2, 3, 20, 21, 22, 23, 40])
    qp = torch.tensor([3, 23])  # first and last query of a block
    spec = AttentionSpec(window=2)
    assert attention.key_reach(spec, qp, k_pos) == (2, 8)  # keys 2..23
    rows = torch.tensor([3, 5, 23])  # query 5 keeps nothing with window 2: its neighbours decide
    assert attention.key_reach(AttentionSpec(window=2), rows[[0, 2]], k_pos) == (2, 8)
    spec = StrideSpec(causal=True, stride=20)
    assert attention.key_reach(spec, torch.tensor([20, 21]), k_pos) == (0, 6)  # keys 0, 1 and 20, 21


# ----------------------------------------------------------------------------- flex on CPU
def test_flex_is_refused_for_training_on_cpu_and_never_auto() -> None:
    spec, q, k, v, q_pos, k_pos, _, _ = _case("causal", "one-shot")
    q = q.requires_grad_()
    call = Call(q, k, v, q_pos, k_pos)
    assert "no backward on CPU" in attention.REGISTRY["flex"].supports(spec, call)
    with pytest.raises(ValueError, match="the flex backend has no backward on CPU"):
        attend(q, k, v, q_pos, k_pos, options=AttendOptions(backend="flex"))
    with torch.no_grad():
        assert attention.resolve("auto", spec, Call(q, k, v, q_pos, k_pos)).name == "sdpa"
    attn = make_attention(Variant("rope", "rope"))
    with pytest.raises(ValueError, match="no backward on CPU"):
        on_backend(attn.train(), "flex", torch.randn(1, 5, 32))


def _flex_vs_eager(variant: Variant, lengths, causal: bool = True, window: int | None = None) -> None:
    attn = make_attention(variant, n_kv_heads=2, max_len=512, causal=causal, window=window)
    for T in lengths:
        x = torch.randn(1, T, 32, generator=torch.Generator().manual_seed(T))
        with torch.no_grad():
            got, want = on_backend(attn, "flex", x), on_backend(attn, "eager", x)
        assert torch.isfinite(got).all(), f"{variant.id} T={T}: flex gave a non-finite value"
        assert_close(got, want, **TIGHT, msg=lambda m, t=T: f"{variant.id} T={t}: {m}")


def test_flex_on_cpu_equals_eager_where_it_broke() -> None:
    """The lengths where unpadded CPU flex returns NaN (24) or wrong values (40, 56), a short one, and block edges."""
    _flex_vs_eager(Variant("alibi", "alibi"), (16, 24, 40, 56, 129))


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS, ids=[v.id for v in VARIANTS])
def test_flex_on_cpu_equals_eager_at_every_length(variant: Variant) -> None:
    _flex_vs_eager(variant, range(1, 301))


@pytest.mark.slow
@pytest.mark.parametrize(("causal", "window"), [(False, None), (True, 5)], ids=["bidir", "causal-w5"])
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_flex_on_cpu_equals_eager_bidirectional_and_windowed(
    variant: Variant, causal: bool, window: int | None
) -> None:
    _flex_vs_eager(variant, (16,), causal=causal, window=window)


@pytest.mark.slow
def test_flex_equals_eager_with_every_mechanism() -> None:
    """One compiled FlexAttention run (CPU, forward only): soft-cap + ALiBi score_mod, QK-norm, sinks via lse, chunk,
    window."""
    attn = modern.make(Variant("alibi", "alibi"), "all", window=7)
    x = modern._x(16)
    with torch.no_grad():
        assert_close(on_backend(attn, "flex", x), on_backend(attn, "eager", x), **TIGHT)


# ----------------------------------------------------------------------------- input dtypes
def test_a_float64_input_to_a_float32_layer_is_one_line() -> None:
    layer = MultiHeadAttention(8, 2)
    x = torch.randn(1, 3, 8)
    with pytest.raises(TypeError, match=r"attention input is torch.float64 but the layer's weights are torch.float32"):
        layer(x.double())
    assert layer.double()(x.double()).dtype == torch.float64  # converting the layer is the fix


# ---------------------------------------------------------------------------------------- auto
def test_auto_resolution() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_backend("auto", cpu) == "sdpa"
    assert resolve_backend("auto", cuda) == "flex"  # FlexAttention compiles with a backward there
    assert resolve_backend("auto", cuda, has_mask=True) == "sdpa"  # flex takes no explicit mask
    assert resolve_backend("auto", cpu, need_weights=True) == "eager"
    assert resolve_backend("sdpa", cuda, need_weights=True) == "eager"  # weights need the eager form
    for explicit in ("sdpa", "eager", "flex"):
        assert resolve_backend(explicit, cpu) == explicit
    with pytest.raises(
        ValueError, match=r"unknown attention backend 'fast'; choose one of \['auto', 'sdpa', 'eager', 'flex'\]"
    ):
        resolve_backend("fast", cpu)
    with pytest.raises(ValueError, match="unknown attention backend"):
        MultiHeadAttention(D_MODEL, N_HEADS, attention=AttentionConfig(backend="cudnn"))


def test_auto_is_the_default_and_matches_explicit_backends() -> None:
    attn = MultiHeadAttention(D_MODEL, N_HEADS).eval()
    assert attn.backend == "auto"
    x = torch.randn(2, 9, D_MODEL)
    with torch.no_grad():
        auto = attn(x)
        out, weights = attn.forward_with_weights(x)
        assert_close(auto, on_backend(attn, "sdpa", x), atol=0, rtol=0)
    assert_close(out, auto, **TIGHT)
    assert weights.shape == (2, N_HEADS, 9, 9)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["alibi", "t5", "rope"])
def test_flex_with_rolling_cache_equals_sdpa(name: str) -> None:
    from poslab import KVCache

    attn = make_attention(Variant(name, name), n_kv_heads=2, window=4)
    x = torch.randn(2, 12, D_MODEL)
    cache = KVCache(2, 2, D_MODEL // N_HEADS, capacity=4, rolling=True)
    with torch.no_grad():
        full = on_backend(attn, "sdpa", x)
        got = [on_backend(attn, "flex", x[:, :5], cache=cache)]
        got += [on_backend(attn, "flex", x[:, t : t + 1], cache=cache) for t in range(5, 12)]
    assert_close(torch.cat(got, 1), full, **TIGHT)


def test_use_backend_switches_every_layer_for_a_block_and_restores_their_configs() -> None:
    """The backend of a call comes from each layer's config; ``use_backend`` swaps it for a block (an
    unknown name is refused before any layer changes) and puts the same config objects back."""
    model = make_gpt(Variant("alibi", "alibi")).eval()
    idx = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    configs = [block.attn.attention for block in model.blocks]
    seen: list[tuple[int, ...]] = []
    hooks = [b.attn.scores_probe.register_forward_hook(lambda _m, _i, o: seen.append(o.shape)) for b in model.blocks]
    with torch.no_grad():
        with use_backend(model, "eager"):
            assert [block.attn.backend for block in model.blocks] == ["eager", "eager"]
            eager = model(idx)
        assert len(seen) == 2  # the eager backend materialises the weights the probe sees
        seen.clear()
        sdpa = model(idx)
    assert not seen  # back on the config's sdpa: no weights materialised
    for hook in hooks:
        hook.remove()
    assert all(block.attn.attention is config for block, config in zip(model.blocks, configs))
    assert_close(eager, sdpa, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="unknown attention backend 'bogus'"):
        with use_backend(model, "bogus"):
            pass
    assert all(block.attn.attention is config for block, config in zip(model.blocks, configs))
