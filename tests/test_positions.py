"""Per-scheme facts: the lessons' check values, layouts, formulas and edge behaviour of each scheme."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from poslab import positions
from poslab.nn.positions.absolute import sinusoid_table
from poslab.nn.positions.alibi import alibi_slopes
from poslab.nn.positions.rope import RopeConfig, apply_rotary, rope_parameters, yarn_correction_range
from poslab.nn.positions.t5 import relative_position_bucket
from poslab.nn.positions.xl import rel_shift

pytestmark = pytest.mark.usefixtures("single_thread")

# ------------------------------------------------------------------------------------------- RoPE


def _seed000_rotated(layout: str = "half") -> tuple[torch.Tensor, torch.Tensor]:
    """Seed 000 section 3.4: one (q, k) pair rotated to each of 200 positions with poslab's RoPE."""
    torch.manual_seed(0)
    d, max_pos = 16, 200
    q, k = torch.randn(d), torch.randn(d)
    rope = positions.build("rope", head_dim=d, layout=layout)
    pos = torch.arange(max_pos)
    Q, K = rope.rotate(q.expand(1, 1, max_pos, d), k.expand(1, 1, max_pos, d), pos, pos)  # [1, 1, 200, 16]
    return Q[0, 0], K[0, 0]


def test_seed000_rope_inner_product_table_digit_for_digit() -> None:
    Q, K = _seed000_rotated()
    from poslab.lab.experiments.seed000_rope import LESSON_VALUES  # what the lesson printed

    for off, expected in LESSON_VALUES.items():
        values = [float((Q[i] * K[i + off]).sum()) for i in range(0, 200 - off, 20)]
        assert all(f"{v:.4f}" == f"{expected:.4f}" for v in values), (off, values)
        assert max(values) - min(values) < 1e-4  # depends on the offset only (float noise)


def test_apply_rotary_matches_the_lessons_code() -> None:
    """poslab's rotation equals seed 000's ``apply_rope`` (half layout, same frequencies)."""

    from poslab.lab.experiments.seed000_rope import apply_rope  # the lesson's code, verbatim

    x, pos = torch.randn(50, 16), torch.arange(50)
    rope = positions.build("rope", head_dim=16)
    cos, sin = rope.cos_sin(pos)
    assert_close(apply_rotary(x, cos, sin, "half"), apply_rope(x, pos), atol=1e-5, rtol=1e-5)


def _half_to_interleaved(d: int) -> torch.Tensor:
    """Index ``P`` with ``x_interleaved = x_half[..., P]``: pair ``(i, i + d/2)`` moves to ``(2i, 2i + 1)``."""
    half = torch.arange(d // 2)
    return torch.stack((half, half + d // 2), dim=-1).flatten()  # [d]: 0, d/2, 1, d/2+1, ...


@pytest.mark.parametrize("rotary_dim", [None, 8])
def test_interleaved_layout_is_half_layout_after_a_permutation(rotary_dim: int | None) -> None:
    d = 16
    r = rotary_dim or d
    perm = torch.cat((_half_to_interleaved(r), torch.arange(r, d)))
    half = positions.build("rope", head_dim=d, layout="half", rotary_dim=rotary_dim)
    inter = positions.build("rope", head_dim=d, layout="interleaved", rotary_dim=rotary_dim)
    q, k = torch.randn(2, 3, 10, d), torch.randn(2, 3, 10, d)
    pos = torch.arange(5, 15)
    qh, kh = half.rotate(q, k, pos, pos)
    qi, ki = inter.rotate(q[..., perm], k[..., perm], pos, pos)
    assert_close(qi, qh[..., perm], atol=1e-6, rtol=1e-6)
    assert_close(ki, kh[..., perm], atol=1e-6, rtol=1e-6)
    # so the logits agree, while the two layouts on the *same* coordinates do not
    assert_close(qi @ ki.transpose(-1, -2), qh @ kh.transpose(-1, -2), atol=1e-5, rtol=1e-5)
    qx, kx = inter.rotate(q, k, pos, pos)
    assert (qx @ kx.transpose(-1, -2) - qh @ kh.transpose(-1, -2)).abs().max() > 1e-2


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_partial_rotary_leaves_the_tail_untouched(layout: str) -> None:
    rope = positions.build("rope", head_dim=16, rotary_dim=6, layout=layout)
    assert rope.inv_freq.shape == (3,)
    q, k = torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16)
    pos = torch.arange(9)
    qr, kr = rope.rotate(q, k, pos, pos)
    assert torch.equal(qr[..., 6:], q[..., 6:]) and torch.equal(kr[..., 6:], k[..., 6:])
    assert (qr[..., 1:, :6] - q[..., 1:, :6]).abs().max() > 1e-2  # position 0 is the identity
    full = positions.build("rope", head_dim=6, layout=layout)  # the head's rotary part alone
    qf, _ = full.rotate(q[..., :6], k[..., :6], pos, pos)
    assert_close(qr[..., :6], qf, atol=0, rtol=0)


def test_rope_rotation_preserves_norms() -> None:
    rope = positions.build("rope", head_dim=32, layout="interleaved")
    q = torch.randn(1, 1, 64, 32)
    pos = torch.arange(64) * 97
    qr, _ = rope.rotate(q, q, pos, pos)
    assert_close(qr.norm(dim=-1), q.norm(dim=-1), atol=1e-5, rtol=1e-5)


def test_default_inv_freq_formula() -> None:
    rope = positions.build("rope", head_dim=64, base=500000.0)
    i = torch.arange(32, dtype=torch.float64)
    assert_close(rope.inv_freq.double(), 500000.0 ** (-2 * i / 64), atol=0, rtol=1e-6)
    assert rope.inv_freq.dtype == torch.float32


def test_yarn_correction_range_check_value() -> None:
    cfg = RopeConfig(head_dim=128, base=1e4, scaling="yarn", factor=16.0, original_max_len=2048)
    assert yarn_correction_range(cfg) == (16, 41)
    inv, attention_factor = rope_parameters(cfg)
    base_inv = rope_parameters(RopeConfig(head_dim=128, base=1e4))[0]
    assert torch.equal(inv[:16], base_inv[:16])  # below `low`: high frequencies kept
    assert_close(inv[41:], base_inv[41:] / 16, atol=0, rtol=1e-6)  # above `high`: interpolated
    assert attention_factor == pytest.approx(0.1 * math.log(16) + 1)


def test_dynamic_ntk_check_value() -> None:
    cfg = RopeConfig(head_dim=128, base=1e4, scaling="dynamic", factor=10.0, original_max_len=2048)
    inv, _ = rope_parameters(cfg, seq_len=16384)
    # transformers' _compute_dynamic_ntk_parameters: base' = base * (s * L / L0 - (s - 1))^(d / (d - 2)),
    # computed here in fp64 from the formula: inv[1] = base'^(-2/d) = 0.80931
    base = 1e4 * (10.0 * 16384 / 2048 - 9.0) ** (128 / 126)
    assert float(inv[1]) == pytest.approx(base ** (-2 / 128), abs=5e-6)
    # at or below the original window the frequencies are the unscaled ones
    assert torch.equal(rope_parameters(cfg, seq_len=2048)[0], rope_parameters(RopeConfig(head_dim=128, base=1e4))[0])


def test_ntk_static_formula() -> None:
    s, d = 4.0, 64
    inv, factor = rope_parameters(RopeConfig(head_dim=d, scaling="ntk", factor=s))
    i = torch.arange(d // 2, dtype=torch.float64)
    assert_close(inv.double(), (1e4 * s ** (d / (d - 2))) ** (-2 * i / d), atol=0, rtol=1e-6)
    assert factor == 1.0
    assert float(inv[0]) == 1.0  # the highest frequency is never scaled
    assert float(inv[-1]) == pytest.approx(1e4 ** (-(d - 2) / d) / s, rel=1e-5)  # the lowest is divided by s


def test_llama3_bands() -> None:
    cfg = RopeConfig(head_dim=128, base=500000.0, scaling="llama3", factor=8.0, original_max_len=8192)
    inv, _ = rope_parameters(cfg)
    base_inv = rope_parameters(RopeConfig(head_dim=128, base=500000.0))[0]
    wavelength = 2 * math.pi / base_inv
    short, long = wavelength < 8192 / 4, wavelength > 8192 / 1
    assert torch.equal(inv[short], base_inv[short])
    assert_close(inv[long], base_inv[long] / 8, atol=0, rtol=1e-6)
    middle = ~short & ~long
    assert middle.any() and ((inv[middle] < base_inv[middle]) & (inv[middle] > base_inv[middle] / 8)).all()


def test_rope_attention_factor_scales_cos_and_sin() -> None:
    rope = positions.build("rope", head_dim=16, scaling="yarn", factor=8.0, original_max_len=64)
    cos, sin = rope.cos_sin(torch.arange(10))
    assert_close(cos**2 + sin**2, torch.full_like(cos, rope.attention_factor**2), atol=1e-5, rtol=1e-5)


def test_longrope_switches_factors_past_the_original_window() -> None:
    short, long = [1.0, 1.5, 2.0, 3.0], [2.0, 4.0, 8.0, 16.0]
    rope = positions.build(
        "rope", head_dim=8, scaling="longrope", factor=4.0, original_max_len=32, short_factor=short, long_factor=long
    )
    base_inv = rope_parameters(RopeConfig(head_dim=8))[0]
    assert_close(rope.frequencies(32)[0], base_inv / torch.tensor(short), atol=0, rtol=1e-6)
    assert_close(rope.frequencies(33)[0], base_inv / torch.tensor(long), atol=0, rtol=1e-6)
    assert rope.attention_factor == pytest.approx(math.sqrt(1 + math.log(4) / math.log(32)))


def test_logn_scaling_only_past_the_window() -> None:
    rope = positions.build("rope", head_dim=8, logn_scaling=True, original_max_len=16)
    plain = positions.build("rope", head_dim=8)
    q, k = torch.randn(1, 1, 40, 8), torch.randn(1, 1, 40, 8)
    pos = torch.arange(40)
    (ql, _), (qp, _) = rope.rotate(q, k, pos, pos), plain.rotate(q, k, pos, pos)
    assert_close(ql[..., :16, :], qp[..., :16, :], atol=0, rtol=0)  # n = pos + 1 <= 16
    ratio = math.log(40) / math.log(16)
    assert_close(ql[..., 39, :], qp[..., 39, :] * ratio, atol=1e-6, rtol=1e-6)


# ------------------------------------------------------------------------------------------- xPos
def test_xpos_inner_product_depends_on_the_offset_only() -> None:
    d, n = 16, 120
    xpos = positions.build("xpos", head_dim=d, scale_base=64.0)
    rope = positions.build("rope", head_dim=d)
    q, k = torch.randn(d), torch.randn(d)
    pos = torch.arange(n)
    Q, K = xpos.rotate(q.expand(1, 1, n, d), k.expand(1, 1, n, d), pos, pos)
    Qr, Kr = rope.rotate(q.expand(1, 1, n, d), k.expand(1, 1, n, d), pos, pos)
    Q, K, Qr, Kr = Q[0, 0], K[0, 0], Qr[0, 0], Kr[0, 0]
    zeta = (torch.arange(0, d, 2) / d + 0.4) / 1.4  # [d/2]
    per_offset = []
    for off in (0, 1, 5, 30):
        # query at n = i + off attends to the key at m = i: decay zeta^(off / scale_base) per pair
        vals = torch.stack([(Q[i + off] * K[i]).sum() for i in range(0, n - off, 7)])
        assert vals.max() - vals.min() < 1e-4
        pairs = Qr[off] * Kr[0]  # rope contributions per coordinate at this offset
        per_pair = pairs[: d // 2] + pairs[d // 2 :]  # half layout: pair i = (i, i + d/2)
        assert_close(vals[0], (zeta ** (off / 64.0) * per_pair).sum(), atol=1e-5, rtol=1e-5)
        per_offset.append(float(vals[0]))
    assert len({round(v, 3) for v in per_offset}) == 4


# ------------------------------------------------------------------------------------------ ALiBi
def test_alibi_slopes_powers_of_two() -> None:
    expected = torch.tensor([2.0**-k for k in range(1, 9)])
    assert_close(alibi_slopes(8), expected, atol=0, rtol=0)
    assert_close(alibi_slopes(16), torch.tensor([2.0 ** (-k / 2) for k in range(1, 17)]), atol=0, rtol=1e-6)


def test_alibi_slopes_twelve_heads() -> None:
    expected = [2.0**-k for k in range(1, 9)] + [2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5]
    slopes = alibi_slopes(12)
    assert slopes.dtype == torch.float32
    assert_close(slopes, torch.tensor(expected), atol=0, rtol=1e-6)


def test_alibi_bias_is_minus_slope_times_distance_in_fp32() -> None:
    alibi = positions.build("alibi", n_heads=4).to(torch.bfloat16)
    assert alibi.slopes.dtype == torch.float32
    q = torch.randn(1, 4, 6, 8, dtype=torch.bfloat16)
    bias = alibi.score_bias(q, q, torch.arange(6), torch.arange(6), 8**-0.5)
    assert bias.dtype == torch.float32 and bias.shape == (1, 4, 6, 6)
    i, j = torch.arange(6)[:, None], torch.arange(6)[None, :]
    assert_close(bias[0, 1], -alibi_slopes(4)[1] * (i - j).abs().float(), atol=0, rtol=0)


# --------------------------------------------------------------------------------------------- T5
@pytest.mark.parametrize(
    ("relative", "bucket"),
    [(0, 0), (-7, 7), (-8, 8), (-16, 10), (-64, 14), (-128, 15), (-1000, 15), (1, 17), (8, 24), (64, 30)],
)
def test_t5_bidirectional_bucket_check_values(relative: int, bucket: int) -> None:
    assert int(relative_position_bucket(torch.tensor(relative), True, 32, 128)) == bucket


@pytest.mark.parametrize(
    ("relative", "bucket"), [(-15, 15), (-16, 16), (-32, 21), (-64, 26), (-128, 31), (-5000, 31), (1, 0), (40, 0)]
)
def test_t5_causal_bucket_check_values(relative: int, bucket: int) -> None:
    assert int(relative_position_bucket(torch.tensor(relative), False, 32, 128)) == bucket


def test_t5_bias_reads_the_table_by_bucket() -> None:
    t5 = positions.build("t5", n_heads=3, bidirectional=False)
    q_pos, k_pos = torch.arange(4, 10), torch.arange(10)
    bias = t5.score_bias(torch.zeros(1, 3, 6, 4), torch.zeros(1, 3, 10, 4), q_pos, k_pos, 0.5)
    buckets = relative_position_bucket(k_pos[None, :] - q_pos[:, None], False, 32, 128)
    assert_close(bias[0], t5.relative_attention_bias.weight[buckets].permute(2, 0, 1), atol=0, rtol=0)


# ------------------------------------------------------------------------------ Transformer-XL
@pytest.mark.parametrize(("Tq", "Tk"), [(6, 6), (4, 9), (1, 5)])
def test_xl_rel_shift_equals_the_gather_in_score_bias(Tq: int, Tk: int) -> None:
    """The paper's relative shift and poslab's gather by distance give the same (b)+(c)+(d)."""
    h, dk, d = 2, 8, 16
    xl = positions.build("xl", n_embd=d, n_heads=h, head_dim=dk)
    with torch.no_grad():
        for p in xl.parameters():
            p.normal_()
    q, k = torch.randn(3, h, Tq, dk), torch.randn(3, h, Tk, dk)
    q_pos, k_pos = torch.arange(Tk - Tq, Tk), torch.arange(Tk)  # queries are the last Tq keys
    scale = dk**-0.5
    bias = xl.score_bias(q, k, q_pos, k_pos, scale)

    r = xl.projected_r(torch.arange(Tk - 1, -1, -1)).detach()  # [h, Tk, dk], descending distances
    raw = (q + xl.v[None, :, None, :]) @ r.transpose(-1, -2)  # (b)+(d) by column: [3, h, Tq, Tk]
    shifted = rel_shift(raw)
    content = torch.einsum("hd,bhkd->bhk", xl.u, k)[:, :, None, :]  # (c): [3, h, 1, Tk]
    expected = (shifted + content) * scale
    valid = k_pos[None, :] <= q_pos[:, None]  # rel_shift's upper triangle is garbage, masked causally
    assert_close(bias[..., valid], expected[..., valid].detach(), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------- absolute schemes
def test_learned_table_past_max_len_raises() -> None:
    learned = positions.build("learned", n_embd=8, max_len=16)
    x = torch.zeros(1, 4, 8)
    learned.embed(x, torch.arange(12, 16))  # the last rows are fine
    with pytest.raises(ValueError, match=r"position 16 .*max_len=16.*\[0, 16\)"):
        learned.embed(x, torch.arange(13, 17))
    with pytest.raises(ValueError, match="position -1"):
        learned.embed(x, torch.arange(-1, 3))


def test_sinusoidal_cache_extends_on_demand_and_equals_a_fresh_table() -> None:
    d = 12
    sinus = positions.build("sinusoidal", n_embd=d, max_len=8)
    assert sinus.cache.shape == (8, d)
    x = torch.zeros(1, 5, d)
    out = sinus.embed(x, torch.arange(36, 41))
    assert sinus.cache.shape[0] >= 41 and sinus.cache.dtype == torch.float32
    fresh = positions.build("sinusoidal", n_embd=d, max_len=sinus.cache.shape[0]).cache
    assert torch.equal(sinus.cache, fresh)
    assert torch.equal(out[0], fresh[36:41])
    # Vaswani et al.: PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(...)
    p = torch.arange(41, dtype=torch.float64)[:, None]
    angle = p / 10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    assert_close(fresh[:41, 0::2].double(), angle.sin(), atol=1e-5, rtol=0)
    assert_close(fresh[:41, 1::2].double(), angle.cos(), atol=1e-5, rtol=0)


def test_sinusoid_table_rejects_odd_width() -> None:
    with pytest.raises(ValueError, match="even, got 7"):
        sinusoid_table(torch.arange(3), 7)


# ---------------------------------------------------------------------------------- KERPLE, FIRE
def test_kerple_bias_formula() -> None:
    kerple = positions.build("kerple", n_heads=2)
    with torch.no_grad():
        kerple.r1.copy_(torch.tensor([0.5, 2.0]))
        kerple.r2.copy_(torch.tensor([1.0, 0.1]))
    q = torch.zeros(1, 2, 5, 4)
    bias = kerple.score_bias(q, q, torch.arange(5), torch.arange(5), 0.5)
    distance = (torch.arange(5)[:, None] - torch.arange(5)[None, :]).abs().float()
    assert_close(bias[0, 1], -2.0 * torch.log1p(0.1 * distance), atol=1e-6, rtol=1e-6)


def test_fire_normalises_by_the_query_position_past_L() -> None:
    fire = positions.build("fire", n_heads=2, threshold_init=4.0)
    q_pos = torch.tensor([2, 9])
    x = fire._normalised(q_pos.float()[:, None], torch.tensor([[1.0], [1.0]]))
    c = fire.c.detach()
    assert_close(x[0, 0].detach(), torch.log(c + 1) / torch.log(4 * c + 1))  # max(2, L=4) = 4
    assert_close(x[1, 0].detach(), torch.log(c + 1) / torch.log(9 * c + 1))  # max(9, L=4) = 9


# ----------------------------------------------------------------------------------- registry
def test_every_scheme_cites_its_paper_and_has_a_typed_config() -> None:
    import dataclasses

    for name in positions.names():
        cls = positions.get(name)
        assert cls.paper and ("arxiv.org" in cls.paper or "Radford" in cls.paper), name
        assert dataclasses.is_dataclass(cls.config_class)
        assert "http" in (cls.__doc__ or "") or "et al." in (cls.__doc__ or ""), name


def test_build_for_model_fills_dimensions_before_validating() -> None:
    """longrope factors sized for the model's head_dim are valid although the default head_dim is 64."""
    factors = [1.0, 2.0, 3.0, 4.0]
    scheme = positions.build_for_model(
        "rope",
        {"scaling": "longrope", "factor": 2.0, "short_factor": factors, "long_factor": factors},
        {"head_dim": 8, "n_heads": 4, "n_embd": 32},
    )
    assert scheme.config.head_dim == 8 and scheme.inv_freq.shape == (4,)


def test_names_keep_the_canonical_order_whatever_was_imported_first() -> None:
    """``from poslab.nn.positions.rope import ...`` before the registry loads must not reorder the list
    (the CLI's "known: ..." messages and the docs depend on it)."""
    from poslab.nn.positions import _REGISTRY

    canonical = positions.names()
    assert canonical[:3] == ["none", "learned", "sinusoidal"]
    moved = _REGISTRY.pop("none")
    _REGISTRY["none"] = moved  # as if rope and the others had registered first
    assert positions.names() == canonical
    with pytest.raises(ValueError, match="known: " + ", ".join(canonical)):
        positions.get("rotary")


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [32, 16, 8])
def test_fused_rotation_equals_plain_ops(layout, rotary_dim):
    """``apply_rotary`` (one autograd node whose backward is the inverse rotation) gives the values and
    gradients of the rotation written with plain differentiable ops, on a non-contiguous input."""
    from poslab.nn.positions.rope import _rotary_reference, apply_rotary

    generator = torch.Generator().manual_seed(rotary_dim)
    x = torch.randn(2, 10, 3, 32, dtype=torch.float64, generator=generator).transpose(1, 2)  # [B, h, T, d] view
    angles = torch.randn(10, rotary_dim // 2, dtype=torch.float64, generator=generator)  # [T, r/2]
    cos, sin = angles.cos(), angles.sin()
    fused_in, plain_in = x.clone().requires_grad_(), x.clone().requires_grad_()
    fused, plain = apply_rotary(fused_in, cos, sin, layout), _rotary_reference(plain_in, cos, sin, layout)
    torch.testing.assert_close(fused, plain, rtol=0, atol=1e-12)
    upstream = torch.randn(fused.shape, dtype=torch.float64, generator=generator)
    fused.backward(upstream)
    plain.backward(upstream)
    torch.testing.assert_close(fused_in.grad, plain_in.grad, rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(lambda t: apply_rotary(t, cos, sin, layout), (x.clone().requires_grad_(),))
    if rotary_dim < 32:  # the unrotated tail passes through untouched
        assert torch.equal(fused[..., rotary_dim:], x[..., rotary_dim:])


@pytest.mark.parametrize("scheme, table", [("learned", "table"), ("t5", "relative_attention_bias")])
def test_a_models_initialisation_keeps_the_schemes_init_std(scheme, table):
    from poslab.nn.model import GPT, GPTConfig

    torch.manual_seed(0)
    stds = {}
    for init_std in (0.02, 0.5):
        config = GPTConfig(
            vocab_size=11,
            n_layer=1,
            n_head=4,
            n_embd=32,
            block_size=64,
            position=scheme,
            position_config={"init_std": init_std},
        )
        stds[init_std] = float(getattr(GPT(config).position, table).weight.detach().std())
    assert stds[0.02] == pytest.approx(0.02, rel=0.25)
    assert stds[0.5] == pytest.approx(0.5, rel=0.25)


@pytest.mark.parametrize("scheme", ["learned", "t5"])
@pytest.mark.parametrize("init_std", [-0.1, 1e30, float("nan"), float("inf")])
def test_an_init_std_outside_the_fp32_rule_is_refused(scheme, init_std):
    from poslab.nn.model import GPT, GPTConfig

    with pytest.raises(ValueError, match="init_std must lie in"):
        GPT(
            GPTConfig(
                vocab_size=11,
                n_layer=1,
                n_head=2,
                n_embd=16,
                block_size=8,
                position=scheme,
                position_config={"init_std": init_std},
            )
        )
