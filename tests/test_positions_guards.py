"""Position schemes at their limits and against the layer they sit in: the right number or a clear error.

xPos at large positions and spans, a scheme's geometry checked against its layer at construction, T5's
direction following the layer's causality, hook dispatch derived from the overridden methods, and each
context-extension scaling's own keys.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import D_MODEL, N_HEADS, VOCAB
from torch.testing import assert_close

from poslab import GPT, AttentionConfig, GPTConfig, KVCache, MultiHeadAttention, positions
from poslab.nn.caches import DecodeSpec
from poslab.nn.positions.base import PositionScheme, relative_distance

pytestmark = pytest.mark.usefixtures("single_thread")


# ------------------------------------------------------------------------------ 1. xPos overflow
def _xpos_expected(xpos, rope, q, k, q_pos, k_pos) -> torch.Tensor:
    """The paper's xPos scores from RoPE's rotated pairs times ``zeta_i^((n - m)/scale_base)``, in fp64.

    Uses RoPE's own fp32 angles at the same positions, so only the decay is under test.
    """
    d, sb = xpos.config.dim, xpos.config.scale_base
    zeta = (torch.arange(0, d, 2, dtype=torch.float64) / d + xpos.config.gamma) / (1 + xpos.config.gamma)  # [d/2]
    Qr, Kr = rope.rotate(q, k, q_pos, k_pos)  # [1, 1, Tq, d], [1, 1, Tk, d]
    Qr, Kr = Qr[0, 0].double(), Kr[0, 0].double()
    pairs = Qr[:, None, :] * Kr[None, :, :]  # [Tq, Tk, d]
    per_pair = pairs[..., : d // 2] + pairs[..., d // 2 :]  # half layout: pair i = (i, i + d/2)
    distance = relative_distance(q_pos, k_pos).double()  # [Tq, Tk]
    return (zeta[None, None, :] ** (distance[..., None] / sb) * per_pair).sum(-1)  # [Tq, Tk]


@pytest.mark.parametrize(
    ("dtype", "start", "tol"),
    [
        (torch.float32, 40_000, 1e-4),
        (torch.float32, 1_000_000, 1e-4),
        (torch.bfloat16, 1_000_000, 3e-2),
        (torch.float16, 100_000, 3e-3),
    ],
    ids=["fp32-4e4", "fp32-1e6", "bf16-1e6", "fp16-1e5"],
)
def test_xpos_scores_stay_finite_and_exact_at_large_positions(dtype, start, tol) -> None:
    """The key scale (1/zeta)^(m/512) anchored at 0 would give non-finite keys from ~36,000 (fp32) / ~4,500 (fp16)."""
    d = 32
    xpos, rope = positions.build("xpos", head_dim=d), positions.build("rope", head_dim=d)
    q, k = torch.randn(1, 1, 4, d), torch.randn(1, 1, 6, d)
    q_pos, k_pos = torch.arange(start + 2, start + 6), torch.arange(start, start + 6)
    Q, K = xpos.rotate(q.to(dtype), k.to(dtype), q_pos, k_pos)
    assert torch.isfinite(Q).all() and torch.isfinite(K).all()
    scores = Q[0, 0].double() @ K[0, 0].double().T  # [4, 6]
    expected = _xpos_expected(xpos, rope, q.to(dtype).float(), k.to(dtype).float(), q_pos, k_pos)
    assert (scores - expected).abs().max() <= tol * expected.abs().max()


def test_xpos_span_beyond_the_dtype_is_a_clear_error() -> None:
    """Where the split into query and key scales cannot be finite, a one-line error names positions and dtype."""
    xpos = positions.build("xpos", head_dim=16)
    q = torch.randn(1, 1, 1, 16)
    limit = xpos.max_span(torch.float16)
    xpos.rotate(q.half(), q.half(), torch.tensor([limit]), torch.tensor([0]))  # at the limit: fine
    with pytest.raises(ValueError, match=rf"positions 0\.\.{limit + 1} .* torch\.float16") as info:
        xpos.rotate(q.half(), q.half(), torch.tensor([limit + 1]), torch.tensor([0]))
    assert "\n" not in str(info.value)
    assert xpos.max_span(torch.float32) > 60_000  # one fp32 call may span a long context


def test_xpos_decode_equals_full_pass_across_the_anchor() -> None:
    """The anchor moves with every call (the middle of its positions); cached keys stay valid.

    Keys cached scaled by their own call would break decoding under a moving anchor, and a fixed anchor
    at 0 overflows at these positions.
    """
    torch.manual_seed(0)
    scheme = positions.build("xpos", head_dim=D_MODEL // N_HEADS)
    attn = MultiHeadAttention(D_MODEL, N_HEADS, 2, position=scheme).eval()
    x = torch.randn(2, 12, D_MODEL)
    pos = torch.arange(999_990, 1_000_002)  # across 10^6
    with torch.no_grad():
        full = attn(x, pos)
        cache = KVCache(2, 2, D_MODEL // N_HEADS, capacity=12)
        steps = [attn(x[:, :3], pos[:3], cache=cache)] + [
            attn(x[:, t : t + 1], pos[t : t + 1], cache=cache) for t in range(3, 12)
        ]
    assert torch.isfinite(full).all()
    assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


def test_xpos_gpt_decodes_at_large_offsets() -> None:
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(vocab_size=VOCAB, n_layer=2, n_head=N_HEADS, n_embd=D_MODEL, block_size=16, position="xpos")
    ).eval()
    idx = torch.randint(0, VOCAB, (1, 10))
    pos = torch.arange(200_000, 200_010)
    with torch.no_grad():
        full = model(idx, pos=pos)
        cache = model.make_cache(1, DecodeSpec(capacity=10))
        steps = [model(idx[:, :4], pos=pos[:4], cache=cache)] + [
            model(idx[:, t : t + 1], pos=pos[t : t + 1], cache=cache) for t in range(4, 10)
        ]
    assert torch.isfinite(full).all()
    assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------- 2. geometry at construction
def test_rope_for_other_heads_is_refused_naming_both_values() -> None:
    """RoPE's default head_dim 64 in 128-wide heads would leave half of each head unrotated."""
    with pytest.raises(ValueError, match=r"head_dim=64 .* head_dim=128") as info:
        MultiHeadAttention(512, 4, position=positions.build("rope"))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", positions.names())
def test_every_scheme_geometry_is_checked_at_construction(name: str) -> None:
    """Every scheme with ``n_heads``/``head_dim`` in its config: a mismatch is a ValueError when the layer is built.

    Unchecked, it is a raw tensor-size RuntimeError at forward time (RoPE wider than the head, ALiBi's 8 slopes in 4
    heads).
    """
    d_model, n_heads = 48, 3  # head_dim 16: no scheme's default
    scheme = positions.build(name)
    fields = {f.name for f in dataclasses.fields(scheme.config)} & {"n_heads", "head_dim"}
    if not fields:
        MultiHeadAttention(d_model, n_heads, position=scheme)  # nothing to disagree on
        return
    with pytest.raises(ValueError, match="attention layer has") as info:
        MultiHeadAttention(d_model, n_heads, position=scheme)
    layer_value = {"n_heads": n_heads, "head_dim": d_model // n_heads}
    assert any(
        f"{k}={getattr(scheme.config, k)} " in str(info.value) and f"has {k}={layer_value[k]};" in str(info.value)
        for k in fields
    ), str(info.value)  # names both values
    fitted = positions.build(name, **{k: layer_value[k] for k in fields})
    attn = MultiHeadAttention(d_model, n_heads, position=fitted)
    assert attn(torch.randn(1, 5, d_model)).shape == (1, 5, d_model)
    with pytest.raises(ValueError, match="attention layer has"):
        MultiHeadAttention(d_model, n_heads).share_position(scheme)  # a lent scheme too


@pytest.mark.parametrize("name", positions.names())
def test_every_scheme_init_std_is_bounded_at_construction(name: str) -> None:
    """Every scheme whose config has ``init_std`` refuses one past ``MAX_INIT_STD`` with a one-line error.

    Unchecked, a huge std (3.4e38) builds a model whose logits are NaN at the first forward.
    """
    if "init_std" not in {f.name for f in dataclasses.fields(positions.build(name).config)}:
        return
    for bad in (3.4e38, -1.0, math.inf):
        with pytest.raises(ValueError, match="init_std must lie in") as info:
            positions.build(name, init_std=bad)
        assert "\n" not in str(info.value)
    with pytest.raises(TypeError, match="init_std must be a number"):
        positions.build(name, init_std="0.02")


# --------------------------------------------------------------------------------- 3. T5 causality
def test_t5_in_a_causal_layer_follows_the_layer() -> None:
    """A bidirectional T5 bias in a causal layer would give past distances only half of the 32 buckets."""
    scheme = positions.build("t5", n_heads=4)
    MultiHeadAttention(32, 4, attention=AttentionConfig(causal=True), position=scheme)
    assert scheme.config.bidirectional is False
    pos = torch.arange(300)
    past = scheme.buckets(pos, pos)[torch.ones(300, 300, dtype=torch.bool).tril()]
    assert past.unique().numel() == scheme.config.num_buckets  # every bucket serves a distance the layer sees
    encoder = positions.build("t5", n_heads=4)
    MultiHeadAttention(32, 4, attention=AttentionConfig(causal=False), position=encoder)
    assert encoder.config.bidirectional is True


def test_t5_explicitly_bidirectional_in_a_causal_layer_is_refused() -> None:
    with pytest.raises(ValueError, match="bidirectional=True in a causal attention layer"):
        MultiHeadAttention(32, 4, position=positions.build("t5", n_heads=4, bidirectional=True))
    with pytest.raises(ValueError, match="bidirectional=True in a causal"):
        GPTConfig(position="t5", position_config={"bidirectional": True})
    GPTConfig(
        position="t5", position_config={"bidirectional": True}, attention=AttentionConfig(causal=False)
    )  # an encoder: fine
    assert GPT(GPTConfig(position="t5", n_layer=1)).position.config.bidirectional is False


# ------------------------------------------------------------------------------- 4. derived dispatch
class _FlaglessDistanceBias(PositionScheme):
    """A scheme that overrides ``score_bias`` and sets no flag (not registered)."""

    name = "flagless-test"

    def score_bias(self, q, k, q_pos, k_pos, scale):
        return -relative_distance(q_pos, k_pos).abs().float()[None, None]  # [1, 1, Tq, Tk]


def test_a_scheme_overriding_score_bias_without_a_flag_is_dispatched() -> None:
    """``has_bias`` is derived from the overridden hook: a flag-only dispatch would run this scheme silently as NoPE."""
    scheme = _FlaglessDistanceBias(None)
    assert scheme.has_bias and scheme.encodes_position and not scheme.rotates and not scheme.embeds
    torch.manual_seed(0)
    attn = MultiHeadAttention(D_MODEL, N_HEADS).eval()
    x = torch.randn(2, 9, D_MODEL)
    pos = torch.arange(9)
    with torch.no_grad():
        plain = attn(x)
        attn.share_position(scheme)
        biased = attn(x)
        q, k, v = attn.qkv(x).split(D_MODEL, dim=-1)
        q, k, v = attn.split_q(q), attn.split_kv(k), attn.split_kv(v)  # [2, h, 9, dk]
        mask = torch.ones(9, 9, dtype=torch.bool).tril()
        expected = F.scaled_dot_product_attention(
            q, k, v, attn_mask=scheme.score_bias(q, k, pos, pos, 1.0).masked_fill(~mask, -math.inf)
        )
        expected = attn.proj(attn.merge(expected))
    assert (biased - plain).abs().max() > 1e-3
    assert_close(biased, expected, atol=1e-5, rtol=1e-5)


def test_a_scheme_with_only_a_score_mod_is_refused() -> None:
    """sdpa/eager call score_bias: a scheme with only the flex form would lose its bias there."""
    with pytest.raises(TypeError, match="overrides score_mod but not score_bias"):
        type("OnlyMod", (PositionScheme,), {"score_mod": lambda self, q, k, qp, kp, s: None})


# ------------------------------------------------------------------------------ 5. scaling keys
@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"scaling": "linear", "factor": 2.0, "beta_fast": 3.0},
            r"'linear' does not use beta_fast=3\.0; it accepts: factor$",
        ),
        (
            {"scaling": "ntk", "factor": 2.0, "low_freq_factor": 2.0},
            r"'ntk' does not use low_freq_factor=2\.0; it accepts: factor",
        ),
        (
            {"scaling": "llama3", "factor": 8.0, "mscale": 1.0},
            r"'llama3' does not use mscale=1\.0; it accepts: factor, low_freq_factor",
        ),
        ({"factor": 4.0}, r"no scaling does not use factor=4\.0"),
        ({"scaling": "yarn"}, r"'yarn' needs factor; it accepts: factor, beta_fast"),
    ],
)
def test_each_scaling_accepts_only_its_own_keys(config, message) -> None:
    """A key of another scaling is refused (``beta_fast`` means nothing to position interpolation)."""
    with pytest.raises(ValueError, match=message):
        positions.build("rope", **config)
    with pytest.raises(ValueError, match=message):
        GPTConfig(position="rope", position_config=config)


def test_every_scaling_declares_keys_that_exist_and_a_full_config_round_trips() -> None:
    from poslab.nn.positions.rope import ROPE_SCALINGS, RopeConfig, parse_scaling

    fields = {f.name for f in dataclasses.fields(RopeConfig)}
    for name, entry in ROPE_SCALINGS.items():
        assert set(entry.keys) <= fields, name
    cfg = positions.build("rope", head_dim=8, scaling="yarn", factor=4.0, beta_fast=16.0).config
    again = positions.build("rope", dataclasses.asdict(cfg))  # every field present, the others at their defaults
    assert again.config == cfg
    assert parse_scaling({"scaling": "yarn", "factor": 4.0, "beta_fast": 8.0}) == {
        "scaling": "yarn",
        "factor": 4.0,
        "beta_fast": 8.0,
    }
    with pytest.raises(ValueError, match="does not use beta_fast .* it accepts: factor"):
        parse_scaling({"scaling": "linear", "factor": 2.0, "beta_fast": 8.0})


def test_replace_position_keeps_config_and_modules_in_sync() -> None:
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(vocab_size=VOCAB, n_layer=1, n_head=N_HEADS, n_embd=D_MODEL, block_size=16, position="rope")
    ).eval()
    idx = torch.randint(0, VOCAB, (1, 12))
    before = model(idx)
    scheme = model.replace_position(config=model.position.rescaled_config(model.config.position_config, "linear:2"))
    assert model.position is scheme and scheme.config.scaling == "linear" and scheme.config.original_max_len == 16
    assert model.config.position_config == {"scaling": "linear", "factor": 2.0}
    rebuilt = GPT(GPTConfig(**{**model.config.to_dict()}))  # the config alone describes the model
    rebuilt.load_state_dict(model.state_dict())
    assert_close(rebuilt.eval()(idx), model(idx), atol=0, rtol=0)
    assert (model(idx) - before).abs().max() > 1e-4
    with pytest.raises(ValueError, match="has no context-extension scaling"):
        positions.get("alibi").rescaled_config({}, "yarn:4")
