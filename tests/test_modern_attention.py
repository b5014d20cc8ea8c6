"""Modern attention mechanisms under the contract: soft-capping, QK-norm, sinks, chunks, temperature, layer patterns.

Each mechanism runs with every registered position scheme (``conftest.VARIANTS``, so a new scheme is
covered automatically) through the attention contract: causality, KV-cache decoding = a full pass at
offset positions, explicit positions = default. Backend equality (``sdpa`` = ``eager`` for every
mechanism sdpa can express, ``flex`` = ``eager`` for all at once) is in
``tests/test_attention_backends.py``; soft-capping sdpa cannot express: ``auto`` moves to eager and
an explicit ``sdpa`` is refused.

The mechanisms themselves are checked against their defining formulas (written out here from the
papers / transformers sources, not taken from poslab), and ``GPTConfig.layer_pattern`` through a GPT.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from conftest import D_MODEL, N_HEADS, VARIANT_IDS, VARIANTS, VOCAB, Variant, make_scheme, merged, on_backend
from torch.testing import assert_close

from poslab import GPT, AttentionConfig, GPTConfig, KVCache, MultiHeadAttention
from poslab.nn.attention import AttendOptions, AttentionSpec, attend
from poslab.nn.caches import DecodeSpec

pytestmark = pytest.mark.usefixtures("single_thread")
B, T = 2, 12
TIGHT = {"atol": 1e-5, "rtol": 1e-5}
HEAD_DIM = 8  # the schemes' head_dim (longrope's factors fit it) ...
WIDTH = 40  # ... decoupled from the attention's width (40 // 4 = 10): exercises head_dim too

#: id -> AttentionConfig fields
MECHANISMS: dict[str, dict[str, Any]] = {
    "softcap": {"softcap": 2.0},
    "qk-norm": {"qk_norm": True},
    "qk-norm-weightless": {"qk_norm": True, "qk_norm_affine": False},
    "sinks": {"sinks": True},
    "chunk": {"chunk": 5},
    "temperature": {"temperature_tuning": (3.0, 0.5)},
    "all": {"softcap": 2.0, "qk_norm": True, "sinks": True, "chunk": 5, "temperature_tuning": (3.0, 0.5)},
}
SDPA_OK = [m for m, opts in MECHANISMS.items() if "softcap" not in opts]


def make(
    variant: Variant | None,
    mechanism: str,
    *,
    n_kv_heads: int = 2,
    window: int | None = None,
    causal: bool = True,
    backend: str = "auto",
    seed: int = 0,
) -> MultiHeadAttention:
    """A seeded attention with the mechanism, random sinks / norm gains, and the variant's scheme."""
    torch.manual_seed(seed)
    scheme = (
        None if variant is None else make_scheme(variant, d_model=N_HEADS * HEAD_DIM, n_heads=N_HEADS, causal=causal)
    )
    attn = MultiHeadAttention(
        WIDTH,
        N_HEADS,
        n_kv_heads,
        AttentionConfig(window=window, causal=causal, backend=backend, head_dim=HEAD_DIM, **MECHANISMS[mechanism]),
        position=scheme,
    )
    with torch.no_grad():
        for name, p in attn.named_parameters():
            if name == "sinks" or name.endswith("norm.weight"):
                p.copy_(torch.randn_like(p) * 0.5 + (1.0 if name.endswith("norm.weight") else 0.0))
            elif "position" in name:
                p.add_(torch.randn_like(p) * 0.5)
    return attn.eval()


def _x(T: int = T) -> torch.Tensor:
    return torch.randn(B, T, WIDTH)


# ------------------------------------------------------------------------------------ contract
@pytest.mark.parametrize("mechanism", list(MECHANISMS))
@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
def test_causal_and_cache_equals_full_pass(variant: Variant, mechanism: str) -> None:
    """Causality, and prefill + one-token decoding at positions 20.. equal to a full pass (eager path)."""
    attn = make(variant, mechanism)
    x = _x()
    pos = torch.arange(20, 20 + T)
    with torch.no_grad():
        base = on_backend(attn, "eager", x, pos)
        changed = x.clone()
        changed[:, 7] += torch.randn(B, WIDTH)
        out = on_backend(attn, "eager", changed, pos)
        assert_close(out[:, :7], base[:, :7], atol=1e-6, rtol=0)
        assert (out[:, 7:] - base[:, 7:]).abs().max() > 1e-4
        cache = KVCache(B, 2, HEAD_DIM, capacity=T)
        steps = [on_backend(attn, "eager", x[:, :4], pos[:4], cache=cache)]
        steps += [on_backend(attn, "eager", x[:, t : t + 1], pos[t : t + 1], cache=cache) for t in range(4, T)]
        assert_close(torch.cat(steps, dim=1), base, **TIGHT)
        assert_close(attn(x, torch.arange(T)), attn(x), atol=0, rtol=0)  # explicit positions = default


def test_softcap_picks_a_backend_that_can_run_it() -> None:
    attn = make(Variant("rope", "rope"), "softcap")
    x = _x()
    with torch.no_grad():
        assert_close(attn(x), on_backend(attn, "eager", x), atol=0, rtol=0)  # auto on CPU: eager, not sdpa
    with pytest.raises(
        ValueError, match=r"softcap=2.0 .* cannot run in the sdpa backend; use backend='eager', 'flex' or 'auto'"
    ):
        on_backend(attn, "sdpa", x)
    q = torch.randn(1, 4, 3, 8)
    with pytest.raises(ValueError, match="cannot run in the sdpa backend"):
        attend(
            q, q, q, torch.arange(3), torch.arange(3), AttentionSpec(softcap=1.0), options=AttendOptions(backend="sdpa")
        )


# ------------------------------------------------------------------------------------ oracles
def _qkv(h: int = 4, hkv: int = 4, Tq: int = 6, Tk: int = 6, dk: int = 8) -> tuple[torch.Tensor, ...]:
    return torch.randn(B, h, Tq, dk), torch.randn(B, hkv, Tk, dk), torch.randn(B, hkv, Tk, dk)


def test_softcap_weights_follow_the_gemma2_formula() -> None:
    q, k, v = _qkv()
    q = q * 4  # large logits: the cap bends them
    pos = torch.arange(6)
    cap, scale = 1.5, 8**-0.5
    _, weights = attend(q, k, v, pos, pos, AttentionSpec(softcap=cap), options=AttendOptions(need_weights=True))
    logits = cap * torch.tanh((q @ k.transpose(-1, -2)) * scale / cap)
    logits = logits.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    assert_close(weights, torch.softmax(logits, -1), **TIGHT)
    _, plain = attend(q, k, v, pos, pos, options=AttendOptions(need_weights=True))
    assert (plain - weights).abs().max() > 1e-2  # the cap changed something


def test_sink_weights_follow_the_gpt_oss_formula() -> None:
    """``softmax([logits, sink])`` with the sink column dropped: rows sum to ``1 - p_sink``."""
    q, k, v = _qkv(hkv=2)
    pos = torch.arange(6)
    sinks = torch.tensor([0.0, 1.0, -2.0, 3.0])
    out, weights = attend(q, k, v, pos, pos, AttentionSpec(sinks=sinks), options=AttendOptions(need_weights=True))
    kk = k.repeat_interleave(2, dim=1)
    logits = (q @ kk.transpose(-1, -2)) * 8**-0.5
    logits = logits.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    denom = logits.exp().sum(-1, keepdim=True) + sinks.view(1, 4, 1, 1).exp()
    assert_close(weights, logits.exp() / denom, **TIGHT)
    assert_close(out, weights @ v.repeat_interleave(2, dim=1), **TIGHT)
    assert (weights.sum(-1) < 1).all()
    assert_close(
        attend(q, k, v, pos, pos, AttentionSpec(sinks=sinks), options=AttendOptions(backend="sdpa"))[0], out, **TIGHT
    )


@pytest.mark.parametrize("hkv,dv", [(4, 16), (2, 16), (2, 24)])
def test_causal_sinks_run_in_one_fused_call_equal_to_eager(monkeypatch, hkv: int, dv: int) -> None:
    """A causal layer with sinks and no window is one fused SDPA call (linear memory), equal to eager, gradients too."""
    import poslab.nn.attention.backends as attention_module

    def no_blocks(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the blocked path ran: its per-block float masks are O(T^2) saved for backward")

    gen = torch.Generator().manual_seed(5)
    T = 300  # past query_chunk (128): the blocked path would have run before
    q = torch.randn(2, 4, T, 16, generator=gen, requires_grad=True)
    k = torch.randn(2, hkv, T, 16, generator=gen, requires_grad=True)
    v = torch.randn(2, hkv, T, dv, generator=gen, requires_grad=True)
    sinks = (torch.randn(4, generator=gen) * 2).requires_grad_()
    pos = torch.arange(T)
    ref, _ = attend(q, k, v, pos, pos, AttentionSpec(sinks=sinks), options=AttendOptions(backend="eager"))
    grads_ref = torch.autograd.grad(ref.square().sum(), (q, k, v, sinks))
    monkeypatch.setattr(attention_module, "_blocked_sdpa", no_blocks)
    monkeypatch.setattr(attention_module, "_sdpa_block", no_blocks)
    out, _ = attend(q, k, v, pos, pos, AttentionSpec(sinks=sinks), options=AttendOptions(backend="sdpa"))
    grads = torch.autograd.grad(out.square().sum(), (q, k, v, sinks))
    assert_close(out, ref, atol=1e-5, rtol=1e-4)
    for got, want in zip(grads, grads_ref):
        assert_close(got, want, atol=1e-4, rtol=1e-4)
    no_sinks, _ = attend(q, k, v, pos, pos, options=AttendOptions(backend="sdpa"))
    assert (no_sinks - out).abs().max() > 1e-2  # the sinks changed the output


def test_chunk_mask_is_same_chunk_and_causal() -> None:
    q, k, v = _qkv(Tq=11, Tk=11)
    pos = torch.arange(11)
    _, weights = attend(q, k, v, pos, pos, AttentionSpec(chunk=4), options=AttendOptions(need_weights=True))
    i, j = pos[:, None], pos[None, :]
    allowed = (j <= i) & (j // 4 == i // 4)
    assert (weights[..., ~allowed] == 0).all() and (weights[..., allowed] > 0).all()


def test_temperature_tuning_follows_llama4() -> None:
    """Queries times ``log(floor((p + 1) / floor_scale) + 1) * attn_scale + 1`` (1 below ``floor_scale - 1``)."""
    attn = make(Variant("none", "none"), "temperature")
    pos = torch.tensor([0, 1, 2, 5, 8, 100])
    expected = torch.tensor([math.log(math.floor((p + 1) / 3) + 1) * 0.5 + 1 for p in pos.tolist()])
    assert_close(attn.temperature(pos), expected, **TIGHT)
    plain = make(Variant("none", "none"), "qk-norm")  # same seed, same projections, no temperature
    plain.qk_norm = False
    x = _x()
    with torch.no_grad():
        assert_close(attn(x)[:, :2], plain(x)[:, :2], **TIGHT)  # positions 0, 1: factor 1
        assert (attn(x)[:, 5:] - plain(x)[:, 5:]).abs().max() > 1e-3


def test_qk_norm_normalises_each_head() -> None:
    attn = make(None, "qk-norm-weightless")
    seen = []
    attn.q_norm.register_forward_hook(lambda m, i, o: seen.append(o))
    with torch.no_grad():
        attn(_x() * 7)
    assert_close(seen[0].pow(2).mean(-1), torch.ones(B, N_HEADS, T), atol=1e-4, rtol=0)
    assert not any(True for _ in attn.q_norm.parameters())


def test_mechanism_parameters_train() -> None:
    attn = make(Variant("rope", "rope"), "all").train()
    attn(_x()).square().sum().backward()
    for name in ("sinks", "q_norm.weight", "k_norm.weight"):
        grad = attn.get_parameter(name).grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().max() > 0, name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_every_mechanism_keeps_shape_and_dtype(dtype: torch.dtype, backend: str) -> None:
    for mechanism in MECHANISMS:
        if backend == "sdpa" and mechanism not in SDPA_OK:
            continue
        attn = make(Variant("rope", "rope"), mechanism).to(dtype)
        out = on_backend(attn, backend, _x().to(dtype))
        assert out.shape == (B, T, WIDTH) and out.dtype == dtype and torch.isfinite(out).all()


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"softcap": 0.0}, "softcap must be a positive finite number"),
        ({"chunk": 0}, "chunk must be a positive integer"),
        ({"temperature_tuning": (0.0, 0.1)}, r"temperature_tuning must be \(floor_scale > 0, attn_scale\)"),
        ({"head_dim": 0}, "head_dim must be a positive integer"),
        ({"qk_norm_eps": -1.0}, "qk_norm_eps must be a positive number"),
    ],
)
def test_bad_mechanism_options_are_named(options: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        MultiHeadAttention(D_MODEL, N_HEADS, attention=AttentionConfig(**options))
    with pytest.raises(TypeError, match="sinks must be a bool"):
        MultiHeadAttention(D_MODEL, N_HEADS, attention=AttentionConfig(sinks=1))
    q = torch.randn(1, 4, 3, 8)
    with pytest.raises(ValueError, match=r"sinks must be a tensor of shape \[4\]"):
        attend(q, q, q, torch.arange(3), torch.arange(3), AttentionSpec(sinks=torch.zeros(3)))


def test_layer_settings_are_one_validated_config() -> None:
    """A layer attribute reads its ``AttentionConfig``; assigning one checks it like the constructor does."""
    attn = MultiHeadAttention(D_MODEL, N_HEADS, attention=AttentionConfig(window=4, chunk=3))
    assert (attn.window, attn.chunk, attn.query_chunk) == (4, 3, 128)
    attn.query_chunk = 8
    assert attn.attention == AttentionConfig(window=4, chunk=3, query_chunk=8)
    for field, bad in (("query_chunk", 0), ("window", -1), ("backend", "cudnn"), ("dropout", 1.0)):
        with pytest.raises(ValueError, match=field if field != "backend" else "unknown attention backend"):
            setattr(attn, field, bad)
    assert attn.attention.query_chunk == 8  # a refused value leaves the layer as it was
    attn.attention = attn.attention.with_(scale=0.5)
    assert attn.scale == 0.5 and MultiHeadAttention(D_MODEL, N_HEADS).scale == pytest.approx(
        (D_MODEL // N_HEADS) ** -0.5
    )
    with pytest.raises(TypeError, match="attention must be an AttentionConfig, got dict"):
        MultiHeadAttention(D_MODEL, N_HEADS, attention={"window": 4})
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\)"):
        AttendOptions(dropout=1.5)
    with pytest.raises(TypeError, match="spec must be an AttentionSpec"):
        attend(q := torch.randn(1, 4, 3, 8), q, q, torch.arange(3), torch.arange(3), {"causal": True})


def test_a_scores_probe_assigned_after_construction_sees_the_weights() -> None:
    """The layer's calls use its current ``scores_probe``, also one assigned after it was built."""

    class Recorder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.shapes: list[tuple[int, ...]] = []

        def forward(self, weights: torch.Tensor) -> torch.Tensor:
            self.shapes.append(tuple(weights.shape))
            return weights

    attn = MultiHeadAttention(D_MODEL, N_HEADS, attention=AttentionConfig(backend="eager")).eval()
    attn.scores_probe = recorder = Recorder()
    attn(torch.randn(2, 5, D_MODEL))
    assert recorder.shapes == [(2, N_HEADS, 5, 5)]


# ------------------------------------------------------------------------------------ GPT and layer_pattern
def _gpt(**overrides: Any) -> GPT:
    torch.manual_seed(0)
    sizes = {"vocab_size": VOCAB, "n_layer": 4, "n_head": N_HEADS, "n_embd": D_MODEL, "n_kv_head": 2, "block_size": 64}
    cfg = GPTConfig(
        **merged(merged(sizes, overrides), {"attention": {"backend": "auto"}})
    )  # the GPT's head_dim is 8 unless attention.head_dim is set
    model = GPT(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("sinks"):
                p.normal_()
    return model.eval()


PATTERNS: dict[str, dict[str, Any]] = {
    "gemma2-like": dict(
        position="rope",
        layer_pattern=[{"window": 4}, {}],
        final_softcap=4.0,
        residual="sandwich",
        embed_scale=D_MODEL**0.5,
        attention={"softcap": 3.0, "head_dim": 12},
        norm={"kind": "rmsnorm"},
    ),
    "gemma3-like": dict(
        position="rope",
        position_config={"base": 1e6},
        residual="sandwich",
        layer_pattern=[{"window": 3, "position_config": {"base": 1e4}}] * 3 + [{}],
        attention={"qk_norm": True},
        norm={"kind": "rmsnorm"},
    ),
    "gpt-oss-like": dict(position="rope", layer_pattern=[{"window": 5}, {}], attention={"sinks": True}),
    "llama4-like": dict(
        position="rope",
        layer_pattern=[{"chunk": 4, "qk_norm": True}] * 3 + [{"position": "none", "temperature_tuning": [2.0, 0.3]}],
        attention={"qk_norm_affine": False},
    ),
    "mixed-schemes": dict(
        position="none", layer_pattern=[{"position": "alibi", "window": 6}, {"position": "rope"}, {"position": "t5"}]
    ),
}


@pytest.mark.parametrize("case", list(PATTERNS))
def test_layer_pattern_gpt_contract(case: str) -> None:
    """Causal; prefill + decode through ``make_cache`` (rolling rings on windowed layers) = full pass; explicit
    positions."""
    model = _gpt(**PATTERNS[case])
    idx = torch.randint(0, VOCAB, (B, 20))
    with torch.no_grad():
        full = model(idx)
        changed = idx.clone()
        changed[:, 9] = (changed[:, 9] + 1) % VOCAB
        out = model(changed)
        assert_close(out[:, :9], full[:, :9], atol=1e-6, rtol=0)
        assert (out[:, 9:] - full[:, 9:]).abs().max() > 1e-4
        cache = model.make_cache(B, DecodeSpec(capacity=20))
        steps = [model(idx[:, :6], cache=cache)] + [model(idx[:, t : t + 1], cache=cache) for t in range(6, 20)]
        assert_close(torch.cat(steps, dim=1), full, **TIGHT)
        assert_close(model(idx, pos=torch.arange(20)), full, atol=0, rtol=0)


def test_layer_pattern_repeats_and_builds_per_layer_schemes() -> None:
    model = _gpt(position="rope", layer_pattern=[{"window": 4, "position_config": {"base": 500.0}}, {}])
    cfg = model.config
    assert [cfg.layer_value(i, "window") for i in range(4)] == [4, None, 4, None]
    assert [model.layer_position(i).config.base for i in range(4)] == [500.0, 10000.0, 500.0, 10000.0]
    assert [(c.capacity, c.rolling) for c in model.make_cache(1, DecodeSpec(capacity=32))] == [
        (4, True),
        (32, False),
    ] * 2
    again = GPT(GPTConfig.from_dict(cfg.to_dict()))
    again.load_state_dict(model.state_dict())
    idx = torch.randint(0, VOCAB, (1, 10))
    with torch.no_grad():
        assert_close(again.eval()(idx), model(idx), atol=0, rtol=0)


def test_final_softcap_follows_the_gemma2_formula() -> None:
    """``c * tanh(logits / c)`` of the uncapped model's logits (same seed, same weights)."""
    idx = torch.randint(0, VOCAB, (B, 8))
    with torch.no_grad():
        raw, capped = _gpt()(idx), _gpt(final_softcap=0.5)(idx)
    assert_close(capped, torch.tanh(raw / 0.5) * 0.5, **TIGHT)
    assert capped.abs().max() < 0.5 < raw.abs().max()


@pytest.mark.parametrize(
    ("overrides", "error", "needle"),
    [
        (
            {"layer_pattern": [{"windw": 3}]},
            ValueError,
            r"unknown layer_pattern key 'windw' in layer_pattern\[0\] \(did you mean 'window'\?\)",
        ),
        ({"layer_pattern": [{"window": 0}]}, ValueError, r"layer_pattern\[0\]: window must be a positive integer"),
        (
            {"layer_pattern": [{"position": "learned"}]},
            ValueError,
            r"layer_pattern\[0\]: position 'learned' adds embeddings",
        ),
        (
            {"layer_pattern": [{"position": "rope", "position_config": {"bse": 1.0}}]},
            ValueError,
            r"layer_pattern\[0\]: unknown config key 'bse'",
        ),
        ({"layer_pattern": [{}] * 5}, ValueError, "at most n_layer=4"),
        ({"layer_pattern": ["window"]}, TypeError, r"layer_pattern\[0\] must be a dict"),
        ({"attention": {"softcap": -1.0}}, ValueError, "attention.softcap must be a positive finite number"),
        ({"final_softcap": float("inf")}, ValueError, "final_softcap must be a positive finite number"),
        ({"attention": {"chunk": 1.5}}, ValueError, "attention.chunk must be a positive integer"),
        ({"attention": {"temperature_tuning": [1.0]}}, ValueError, "attention.temperature_tuning must be"),
        ({"attention": {"sinks": "yes"}}, TypeError, "attention.sinks must be a bool"),
        ({"attention": {"head_dim": -3}}, ValueError, "attention.head_dim must be a positive integer"),
        ({"residual": "sandwiches"}, ValueError, "residual='sandwiches' is not allowed"),
    ],
)
def test_gptconfig_mechanism_fields_are_validated(overrides: dict, error: type, needle: str) -> None:
    with pytest.raises(error, match=needle):
        GPTConfig(n_layer=4, **overrides)


# ------------------------------------------------------------------------------------ new schemes
def test_prope_frequencies_equal_transformers_proportional_rope() -> None:
    """p-RoPE's frequencies are transformers' ``rope_type="proportional"``; p = 1 is RoPE, p = 0 is NoPE."""
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from poslab.nn import positions

    for fraction in (0.0, 0.25, 0.5, 0.75, 1.0):
        ours = positions.build("prope", head_dim=16, base=5000.0, fraction=fraction)
        params = {"rope_type": "proportional", "rope_theta": 5000.0, "partial_rotary_factor": fraction}
        config = SimpleNamespace(
            rope_parameters=params,
            head_dim=16,
            hidden_size=64,
            num_attention_heads=4,
            standardize_rope_params=lambda: None,
        )
        theirs, _ = ROPE_INIT_FUNCTIONS["proportional"](config, None)
        assert_close(ours.inv_freq, theirs, atol=0, rtol=0)
    q, k = torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16)
    pos = torch.arange(3, 8)
    full, rope = positions.build("prope", head_dim=16, fraction=1.0), positions.build("rope", head_dim=16)
    assert all(torch.equal(a, b) for a, b in zip(full.rotate(q, k, pos, pos), rope.rotate(q, k, pos, pos)))
    none = positions.build("prope", head_dim=16, fraction=0.0)
    assert all(torch.equal(a, b) for a, b in zip(none.rotate(q, k, pos, pos), (q, k)))
    half = positions.build("prope", head_dim=16, fraction=0.5).rotate(q, k, pos, pos)[0]
    assert torch.equal(half[..., 4:8], q[..., 4:8]) and torch.equal(half[..., 12:], q[..., 12:])  # low pairs stay
    assert not torch.equal(half[..., :4], q[..., :4])
    with pytest.raises(ValueError, match=r"fraction must be a number in \[0, 1\]"):
        positions.build("prope", head_dim=16, fraction=1.5)


def test_cope_bias_follows_the_paper_loop() -> None:
    """``p_ij = sum_{t=j..i} sigmoid(q_i.k_t * scale)``; bias = interpolation of ``q_i . e[p]`` (a plain loop here)."""
    from poslab.nn import positions

    torch.manual_seed(3)
    scheme = positions.build("cope", head_dim=4, npos_max=3)  # small table: the clip at npos_max-1 is reached
    with torch.no_grad():
        scheme.pos_emb.normal_()
    q, k = torch.randn(1, 2, 5, 4), torch.randn(1, 1, 5, 4)
    pos = torch.arange(5)
    scale = 0.5
    got = scheme.score_bias(q, k, pos, pos, scale)
    want = torch.zeros(1, 2, 5, 5)
    for h in range(2):
        for i in range(5):
            logits = q[0, h, i] @ scheme.pos_emb  # [npos_max]
            for j in range(i + 1):
                p = min(sum(torch.sigmoid(q[0, h, i] @ k[0, 0, t] * scale) for t in range(j, i + 1)).item(), 2.0)
                lo, hi = math.floor(p), math.ceil(p)
                want[0, h, i, j] = logits[lo] * (1 - (p - lo)) + logits[hi] * (p - lo)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    assert_close(got[..., causal], want[..., causal], **TIGHT)
    perm = torch.tensor([3, 0, 4, 1, 2])  # keys stored out of order (a rolling cache): same bias per position
    assert_close(scheme.score_bias(q, k[:, :, perm], pos, pos[perm], scale), got[..., perm], **TIGHT)


def test_fox_bias_follows_the_paper_sum() -> None:
    """``D_ij = sum_{l=j+1..i} log f_l`` with ``f_l = sigmoid(w_h . k_l + b_h)`` (a plain loop here)."""
    from poslab.nn import positions

    torch.manual_seed(4)
    scheme = positions.build("fox", n_heads=2, head_dim=4, bias_init=0.5)
    q, k = torch.randn(1, 2, 6, 4), torch.randn(1, 1, 6, 4)
    pos = torch.arange(10, 16)
    got = scheme.score_bias(q, k, pos, pos, 0.5)
    for h in range(2):
        log_f = [
            torch.nn.functional.logsigmoid(scheme.gate_weight[h] @ k[0, 0, t] + scheme.gate_bias[h]) for t in range(6)
        ]
        for i in range(6):
            for j in range(i + 1):
                want = sum((log_f[t] for t in range(j + 1, i + 1)), torch.tensor(0.0))
                assert_close(got[0, h, i, j], want, **TIGHT)
    assert (got[..., torch.ones(6, 6, dtype=torch.bool).tril(-1)] < 0).all()  # a decay: older keys weigh less
    decode = scheme.score_bias(q[:, :, -1:], k, pos[-1:], pos, 0.5)  # one cached query sees the same row
    assert_close(decode, got[:, :, -1:], **TIGHT)


@pytest.mark.parametrize("name", ["rope", "alibi"])
@pytest.mark.parametrize("window", [None, 37])
def test_softcap_runs_in_linear_memory_blocks_equal_to_one_shot(name: str, window: int | None, monkeypatch) -> None:
    """Past ``query_chunk`` queries soft-capped eager attention runs in checkpointed blocks: values and grads equal."""
    import poslab.nn.attention.backends as attention

    tiles = []
    eager = attention._eager
    monkeypatch.setattr(
        attention,
        "_eager",
        lambda q, k, *a, **kw: tiles.append(tuple(q.shape[2:3] + k.shape[2:3])) or eager(q, k, *a, **kw),
    )
    attn = make(Variant(name, name), "all", window=window)
    x = _x(70).requires_grad_()
    attn.query_chunk, attn.recompute_threshold = 16, 32
    blocked = attn(x)
    assert len(tiles) == 5 and max(tq for tq, _ in tiles) == 16  # five query blocks of <= 16, never [70, 70]
    grads_b = torch.autograd.grad(blocked.square().sum(), [x, *attn.parameters()], allow_unused=True)
    attn.query_chunk = 10_000  # one shot
    one_shot = attn(x)
    grads_o = torch.autograd.grad(one_shot.square().sum(), [x, *attn.parameters()], allow_unused=True)
    assert_close(blocked, one_shot, **TIGHT)
    for gb, go in zip(grads_b, grads_o):
        assert (gb is None) == (go is None)
        if gb is not None:
            assert_close(gb, go, atol=1e-4, rtol=1e-4)


def test_cli_overrides_take_the_list_fields() -> None:
    from poslab.config import parse_overrides

    parsed = parse_overrides(
        [
            "--model.layer_pattern",
            "[{window: 4}, {}]",
            "--model.attention.temperature_tuning=[8192, 0.1]",
            "--model.attention.softcap",
            "50",
        ]
    )
    assert parsed == {
        "model": {
            "layer_pattern": [{"window": 4}, {}],
            "attention": {"temperature_tuning": [8192, 0.1], "softcap": 50.0},
        }
    }
    assert GPTConfig(n_layer=2, **parsed["model"]).layer_value(0, "window") == 4
    with pytest.raises(ValueError, match="--model.layer_pattern expects a list"):
        parse_overrides(["--model.layer_pattern", "4"])


def test_bench_mechanism_cases_build_and_run() -> None:
    """``poslab bench`` mechanism cases run one forward+backward (timing lives in benchmarks/, never in tests)."""
    from poslab import bench

    cases = bench.mechanism_cases()
    assert [c.name for c in cases] == [
        "poslab:rope+softcap",
        "poslab:rope+qknorm",
        "poslab:rope+sinks",
        "poslab:rope+chunk",
        "poslab:none+temperature",
        "poslab:mla",
    ]
    for case in bench.find_cases([c.name for c in cases]):  # the names --cases takes
        bench.build_case(case, 16)()
    with pytest.raises(ValueError, match="unknown mechanism 'capped'"):
        bench.build_case(bench.Case("poslab:rope+capped", "poslab", (("scheme", "rope"), ("mechanism", "capped"))), 16)
    with pytest.raises(ValueError, match="unknown benchmark case"):
        bench.find_cases(["poslab:rope+capped"])
