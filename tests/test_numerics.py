"""Numerics under stress: no NaN/inf anywhere, softmax in fp32, angles and slopes in fp32.

* The attention core (``attend``: SDPA and eager backends, one block and the blocked path, with and
  without an additive bias) under bf16 and fp16 autocast with logits around 1e4 whose differences
  are O(1): a softmax done in 16 bits would round every logit to a multiple of 64 (bf16) and lose
  them all; the output must match an fp64 computation from the same (rounded) inputs. Sliding
  window + left padding leave query rows that see no key: their output must be exactly 0.
* Every registered position scheme (and the RoPE/xPos variants) in a tiny GPT under bf16 and fp16
  autocast, the LM-head logits scaled to ~1e4, T = 1 and T = block size with a batch of one, and
  window + padding with fully masked rows: every module output and the loss finite, and under bf16
  (poslab's 16-bit training dtype) every gradient too. fp16 gradients of a loss of ~1e4 reach ~6e4,
  fp16's limit: training in fp16 would need a gradient scaler, which is why poslab does not offer it.
* ALiBi slopes, RoPE/xPos angles and the sinusoidal table stay fp32 when the model is cast to
  bf16/fp16, and agree with fp64 computations to fp32 precision.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import ALL_VARIANTS as VARIANTS  # every scheme and every rotary configuration
from conftest import BLOCK, make_gpt

from poslab import positions
from poslab.nn.attention import AttendOptions, AttentionSpec, attend

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: max |error| vs fp64 allowed for the attention output (|v| <= ~4): a few 16-bit roundings.
TOLERANCE = {"bf16": 0.06, "fp16": 0.01}
FIGURES = {"cases": 0, "nonfinite_found": 0, "max_fp32_err_vs_fp64": 0.0}


pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one thread (conftest)


def _record(request, **extra) -> None:
    from test_reliability_artifacts import mode, record

    figures = {k: v for k, v in {**FIGURES, **extra}.items() if not (k.startswith("max_") and v == 0.0)}  # not measured
    record("numerics", mode(request), figures)
    FIGURES.update(cases=0, nonfinite_found=0, max_fp32_err_vs_fp64=0.0)


# ------------------------------------------------------------------------------------ attention core
def _reference(q, k, v, keep, bias, scale) -> torch.Tensor:
    """fp64 ``softmax(q k^T * scale + bias) v`` with a bool keep-mask; rows that see nothing give 0."""
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-2, -1) * scale  # [B, h, T, T]
    if bias is not None:
        scores = scores + bias.double()
    scores = scores.masked_fill(~keep, float("-inf"))
    blind = ~keep.any(dim=-1, keepdim=True)  # [B|1, 1|h, T, 1]
    weights = torch.softmax(scores.masked_fill(blind, 0.0), dim=-1).masked_fill(blind, 0.0)
    return weights @ v  # [B, h, T, d]


def _stress_qkv(B: int, h: int, T: int, d: int, dtype: torch.dtype, seed: int):
    """q, k sharing a component of norm 100 (logits ~1e4, O(1) apart); rounded to ``dtype``."""
    generator = torch.Generator().manual_seed(seed)
    shared = torch.zeros(d)
    shared[0] = 100.0

    def small():
        x = torch.randn(B, h, T, d, generator=generator)
        x[..., 0] = 0
        return x

    q = (shared + small()).to(dtype).float()
    k = (shared + small()).to(dtype).float()
    v = torch.randn(B, h, T, d, generator=generator).to(dtype).float()
    return q, k, v


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_attention_core_with_logits_near_1e4(backend, dtype, request):
    B, h, T, d, W, pad = 2, 2, 48, 8, 4, 12
    pos = torch.arange(T)
    causal = pos[None, :] <= pos[:, None]  # [T, T]
    in_window = pos[:, None] - pos[None, :] < W
    padding = torch.ones(B, 1, 1, T, dtype=torch.bool)
    padding[0, ..., :pad] = False  # batch row 0 is left-padded: its first queries see no key
    slopes = torch.tensor([0.5, 0.0625])
    alibi = -(slopes[:, None, None] * (pos[:, None] - pos[None, :]).abs().float())[None]  # [1, h, T, T]
    worst = 0.0
    for masked in (False, True):
        for biased in (False, True):
            for query_chunk in (T, 8):  # one block / the blocked path
                q, k, v = _stress_qkv(B, h, T, d, DTYPES[dtype], seed=len(request.node.name))
                q.requires_grad_(True)
                keep = (causal & in_window) & padding if masked else causal.expand(B, 1, T, T)
                bias_fn = (lambda q_, k_, qp, kp: alibi[..., qp[:, None], kp[None, :]]) if biased else None
                with torch.autocast("cpu", dtype=DTYPES[dtype]):
                    out, _ = attend(
                        q,
                        k,
                        v,
                        pos,
                        pos,
                        AttentionSpec(causal=True, window=W if masked else None, bias_fn=bias_fn, scale=1.0),
                        attn_mask=padding.expand(B, 1, T, T) if masked else None,
                        options=AttendOptions(backend=backend, query_chunk=query_chunk),
                    )
                out.float().sum().backward()
                expected = _reference(q.detach(), k, v, keep, alibi if biased else None, 1.0)
                FIGURES["cases"] += 1
                finite = torch.isfinite(out).all() and torch.isfinite(q.grad).all()
                FIGURES["nonfinite_found"] += int(not finite)
                assert finite, (masked, biased, query_chunk)
                error = (out.double() - expected).abs().max().item()
                worst = max(worst, error)
                assert error < TOLERANCE[dtype], (masked, biased, query_chunk, error)
                if masked:
                    blind = out[0, :, : pad + 0]  # padded queries: every visible key is padding
                    assert torch.equal(blind, torch.zeros_like(blind))
    _record(request, **{f"max_err_vs_fp64_{dtype}": worst})


def test_the_stress_would_catch_a_16_bit_softmax():
    """The same inputs through a softmax of bf16-rounded logits miss the fp64 answer by far."""
    q, k, v = _stress_qkv(1, 2, 48, 8, torch.bfloat16, seed=0)
    scores = (q @ k.transpose(-2, -1)).to(torch.bfloat16).float()  # logits stored in 16 bits
    keep = torch.ones(48, 48, dtype=torch.bool).tril()
    low = torch.softmax(scores.masked_fill(~keep, float("-inf")), -1) @ v
    error = (low.double() - _reference(q, k, v, keep, None, 1.0)).abs().max().item()
    assert error > 10 * TOLERANCE["bf16"], error


def test_eager_weights_are_fp32_under_autocast():
    q, k, v = _stress_qkv(1, 2, 8, 8, torch.bfloat16, seed=1)
    pos = torch.arange(8)
    for dtype in DTYPES.values():
        with torch.autocast("cpu", dtype=dtype):
            _, weights = attend(q, k, v, pos, pos, options=AttendOptions(need_weights=True))
        assert weights.dtype == torch.float32
        assert torch.allclose(weights.sum(-1), torch.ones(()), atol=1e-6)


# ------------------------------------------------------------------------------------ whole model
def _finite_everywhere(model: torch.nn.Module, run, backward: bool) -> list[str]:
    """Names of modules whose output (and, with ``backward``, parameters whose gradient) hold NaN/inf."""
    bad: list[str] = []

    def hook(module, args, output):
        for tensor in output if isinstance(output, tuple) else (output,):
            if isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and not torch.isfinite(tensor).all():
                bad.append(names[module])

    names = {m: n or "model" for n, m in model.named_modules()}
    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        logits, loss = run()
    finally:
        for handle in handles:
            handle.remove()
    if not torch.isfinite(loss):
        bad.append("loss")
    if not backward:
        return bad + ([] if torch.isfinite(logits).all() else ["logits"])
    loss.backward()
    bad += [f"grad:{n}" for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    return bad + ([] if torch.isfinite(logits).all() else ["logits"])


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.id for v in VARIANTS])
def test_every_scheme_stays_finite_under_16_bit_autocast(variant, request):
    """The default run alternates the backend between schemes; the slow run does both for each."""
    _stress_model(variant, [("sdpa", "eager")[VARIANTS.index(variant) % 2]], request)


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS, ids=[v.id for v in VARIANTS])
def test_every_scheme_and_backend_stays_finite_under_16_bit_autocast(variant, request):
    _stress_model(variant, ["sdpa", "eager"], request)


def _stress_model(variant, backends: list[str], request) -> None:
    generator = torch.Generator().manual_seed(0)
    for backend in backends:
        window = 4
        model = make_gpt(variant, tie_embeddings=False, attention={"window": window, "backend": backend}).train()
        idx = torch.randint(0, 50, (2, BLOCK), generator=generator)
        with torch.no_grad():  # scale the LM head so the logits reach ~1e4
            model.lm_head.weight.mul_(1e4 / model(idx).abs().max())
        cases = [(idx[:1, :1], None), (idx[:1], None)]  # batch of one: T = 1 and T = block size
        keep = torch.ones(2, 1, BLOCK, BLOCK, dtype=torch.bool)
        keep[0, ..., :10] = False  # left padding longer than the window: fully masked query rows
        cases.append((idx, keep))
        for dtype in DTYPES.values():
            for tokens, mask in cases:
                targets = tokens.roll(-1, dims=1)
                if mask is not None:
                    targets = targets.clone()
                    targets[0, :10] = -1  # no loss on padding
                model.zero_grad(set_to_none=True)
                kwargs = {} if mask is None else {"mask": mask}

                def run(model=model, tokens=tokens, targets=targets, kwargs=kwargs, dtype=dtype):
                    with torch.autocast("cpu", dtype=dtype):
                        return model(tokens, targets, **kwargs)

                # fp16 gradients of a loss of ~1e4 reach fp16's 65504 limit (a GradScaler's job; poslab
                # trains in fp32/bf16): fp16 is checked forward, bf16 forward and backward
                bad = _finite_everywhere(model, run, backward=dtype == torch.bfloat16)
                FIGURES["cases"] += 1
                FIGURES["nonfinite_found"] += int(bool(bad))
                assert not bad, (backend, dtype, tuple(tokens.shape), mask is not None, bad[:5])
    _record(request)


# ------------------------------------------------------------------------------------ fp32 positions
def _track(error: float) -> float:
    FIGURES["max_fp32_err_vs_fp64"] = max(FIGURES["max_fp32_err_vs_fp64"], error)
    return error


@pytest.mark.parametrize("n_heads", [4, 12])
@pytest.mark.parametrize("cast", [torch.bfloat16, torch.float16])
def test_alibi_slopes_stay_fp32(n_heads, cast, request):
    scheme = positions.build("alibi", n_heads=n_heads).to(cast)
    assert scheme.slopes.dtype == torch.float32
    closest = 2 ** math.floor(math.log2(n_heads))
    slopes64 = [2.0 ** (-8.0 * k / closest) for k in range(1, closest + 1)]
    slopes64 += [2.0 ** (-8.0 * k / (2 * closest)) for k in range(1, 2 * closest + 1)][0::2][: n_heads - closest]
    pos = torch.arange(0, 8192, 97)  # distances up to 8k
    q = torch.zeros(1, n_heads, pos.numel(), 8, dtype=cast)
    bias = scheme.score_bias(q, q, pos, pos, 1.0)  # [1, h, T, T]
    assert bias.dtype == torch.float32
    expected = (
        -torch.tensor(slopes64, dtype=torch.float64)[:, None, None] * (pos[:, None] - pos[None, :]).abs().double()
    )
    relative = ((bias[0].double() - expected).abs() / expected.abs().clamp(min=1e-30)).max().item()
    FIGURES["cases"] += 1
    assert _track(relative) < 2e-7, relative  # fp32 rounding; bf16 slopes would be off by ~4e-3
    _record(request)


ROPE_VARIANTS = [v for v in VARIANTS if v.name in ("rope", "xpos")]


@pytest.mark.parametrize("variant", ROPE_VARIANTS, ids=[v.id for v in ROPE_VARIANTS])
def test_rope_angles_stay_fp32_whatever_the_model_dtype(variant, request):
    reference = make_gpt(variant)
    pos = torch.arange(0, 4096, 7)
    q = torch.randn(1, 4, pos.numel(), 8)
    expected_q, expected_k = reference.position.rotate(q, q, pos, pos)
    for cast in (torch.bfloat16, torch.float16):
        model = make_gpt(variant).to(cast)
        scheme = model.position
        assert all(b.dtype == torch.float32 for n, b in scheme.named_buffers() if n in scheme.fp32_buffers)
        cos, sin = scheme.cos_sin(pos)
        cos32, sin32 = reference.position.cos_sin(pos)
        assert cos.dtype == torch.float32 and torch.equal(cos, cos32) and torch.equal(sin, sin32)
        rotated_q, rotated_k = scheme.rotate(q.to(cast), q.to(cast), pos, pos)
        # only the activations' own 16-bit rounding: angles in 16 bits would scramble positions > 256
        error = (rotated_q.double() - expected_q.double()).abs().max().item() / expected_q.abs().max().item()
        assert error < 0.02, (cast, error)
        FIGURES["cases"] += 1
    if variant.id in ("rope", "rope-linear"):  # closed form in fp64
        cfg = reference.position.config
        d = cfg.rotary_dim or 8
        factor = cfg.factor if cfg.scaling == "linear" else 1.0
        inv64 = 1.0 / (cfg.base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)) / factor
        angles64 = pos.double()[:, None] * inv64[None, :]
        cos32, _ = reference.position.cos_sin(pos)
        assert _track((cos32.double() - angles64.cos()).abs().max().item()) < 2e-3  # ulp(4096 rad) in fp32 ~ 5e-4
    _record(request)


def test_sinusoidal_table_stays_fp32(request):
    scheme = positions.build("sinusoidal", n_embd=32, max_len=4096).to(torch.bfloat16)
    x = torch.zeros(1, 4096, 32, dtype=torch.float32)
    table = scheme.embed(x, torch.arange(4096))[0].double()  # [T, d]
    pos = torch.arange(4096, dtype=torch.float64)[:, None]
    div = torch.exp(torch.arange(0, 32, 2, dtype=torch.float64) * (-math.log(10000.0) / 32))
    expected = torch.zeros(4096, 32, dtype=torch.float64)
    expected[:, 0::2], expected[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
    FIGURES["cases"] += 1
    assert _track((table - expected).abs().max().item()) < 2e-3
    _record(request)


@pytest.mark.slow
def test_flex_backend_fully_masked_rows_and_large_logits(request):
    """FlexAttention (compiled on CPU, forward only): a query whose keys are all in its future sees none."""
    q, k, v = _stress_qkv(1, 2, 32, 8, torch.float32, seed=3)
    q_pos = torch.arange(32)
    k_pos = torch.arange(32) + 8  # keys 8..39: queries 0..7 see no key under the causal mask
    out, _ = attend(q, k, v, q_pos, k_pos, AttentionSpec(causal=True, scale=1.0), options=AttendOptions(backend="flex"))
    keep = k_pos[None, :] <= q_pos[:, None]
    expected = _reference(q, k, v, keep, None, 1.0)
    FIGURES["cases"] += 1
    assert torch.isfinite(out).all()
    assert torch.equal(out[0, :, :8], torch.zeros_like(out[0, :, :8]))
    # logits ~1e4 carry an fp32 rounding of up to ulp(1e4)/2 = 4.9e-4 each, which moves the weights
    # (and an output of |v| ~ 2) by ~1e-3 depending on the compiled kernel's order of operations:
    # measured 1.2e-3 when flex was compiled after other tests, under 1e-3 alone
    assert (out.double() - expected).abs().max().item() < 4e-3
    _record(request)
