"""CUDA paths: flex = sdpa = eager on the GPU for every registered scheme, KV-cache decoding, a training step.

No GPU path of poslab had run before these tests: ``auto`` picks FlexAttention on CUDA (compiled,
with a backward), and the fused AdamW, the bf16 autocast and the cache all run there. Every test
marked ``cuda`` is skipped without a CUDA device; ``benchmarks/gpu_check.sh`` runs them
(``pytest -m cuda tests/test_cuda.py``). The helpers also run on CPU (the unmarked tests at the
end, with the backends CPU has a backward for), so they cannot rot while no GPU is lent.

Tolerances: fp32 with TF32 switched off compares backends to 1e-4; bf16 autocast compares each
backend with the fp32 eager reference by relative norm error (bf16 carries 8 mantissa bits:
about 4e-3 per rounding, a few of them per layer).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import pytest
import torch
from conftest import Variant, _perturb, on_backend
from torch.testing import assert_close

from poslab import GPT, GPTConfig, positions
from poslab.nn.attention import AttentionConfig
from poslab.nn.caches import DecodeSpec
from poslab.nn.generate import generate
from poslab.training.config import TrainConfig
from poslab.training.optim import make_optimizer

HAS_CUDA = torch.cuda.is_available()

# head_dim 16: FlexAttention's Triton kernels need head_dim >= 16
D_MODEL, N_HEADS, N_KV, VOCAB, BLOCK, T, B = 64, 4, 2, 97, 128, 96, 2
# every registered scheme with its default config, plus the RoPE layouts and scalings whose config fits head_dim 16
VARIANTS = [Variant(n, n) for n in positions.names()] + [
    Variant("rope-interleaved", "rope", {"layout": "interleaved"}),
    Variant("rope-partial", "rope", {"rotary_dim": 8}),
    Variant("rope-yarn", "rope", {"scaling": "yarn", "factor": 4.0, "original_max_len": 64}),
]
IDS = [v.id for v in VARIANTS]
FP32_TOL = {"atol": 1e-4, "rtol": 1e-4}
BF16_REL = 3e-2  # relative norm error vs the fp32 eager reference


@pytest.fixture(autouse=True)
def _no_tf32() -> Iterator[None]:
    """fp32 means fp32: TF32 matmuls (10 mantissa bits) off for the comparisons, restored after."""
    if not HAS_CUDA:
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.fixture(autouse=True, scope="module")
def _recompile_limit() -> Iterator[None]:
    """FlexAttention compiles once per shape and score_mod; the default limit (8) would fall back to eager."""
    import torch._dynamo.config as dynamo_config

    before = dynamo_config.recompile_limit
    dynamo_config.recompile_limit = max(before, 256)
    yield
    dynamo_config.recompile_limit = before


def tiny_gpt(variant: Variant, device: str, backend: str = "sdpa", seed: int = 0) -> GPT:
    """A seeded 2-layer GQA GPT (width 64, 4 query / 2 kv heads) with non-trivial position parameters."""
    torch.manual_seed(seed)
    cfg = GPTConfig(
        vocab_size=VOCAB,
        n_layer=2,
        n_head=N_HEADS,
        n_kv_head=N_KV,
        n_embd=D_MODEL,
        block_size=BLOCK,
        position=variant.name,
        position_config=dict(variant.config),
        attention=AttentionConfig(backend=backend),
    )
    model = GPT(cfg)
    _perturb(model)
    return model.to(device)


def autocast(dtype: str, device: str) -> contextlib.AbstractContextManager:
    return torch.autocast(device, dtype=torch.bfloat16) if dtype == "bf16" else contextlib.nullcontext()


def forward_backward(
    model: GPT, idx: torch.Tensor, targets: torch.Tensor, backend: str, dtype: str
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Logits ``[B, T, V]`` (fp32) and every parameter's gradient (fp32) of one forward + backward."""
    model.zero_grad(set_to_none=True)
    with autocast(dtype, idx.device.type):
        logits, loss = on_backend(model, backend, idx, targets)
    loss.backward()
    grads = {name: p.grad.float().clone() for name, p in model.named_parameters() if p.grad is not None}
    return logits.float().detach(), grads


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got - ref).norm() / ref.norm().clamp_min(1e-12))


def check_backends_agree(variant: Variant, device: str, dtype: str, backends: tuple[str, ...]) -> None:
    """Every backend's logits and gradients equal the eager fp32 reference (fp32: 1e-4; bf16: relative)."""
    model = tiny_gpt(variant, device)
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, VOCAB, (B, T), generator=gen).to(device)
    targets = torch.randint(0, VOCAB, (B, T), generator=gen).to(device)
    ref_logits, ref_grads = forward_backward(model, idx, targets, "eager", "fp32")
    assert len(ref_grads) == sum(1 for p in model.parameters() if p.requires_grad)  # every parameter gets a gradient
    for backend in backends:
        logits, grads = forward_backward(model, idx, targets, backend, dtype)
        assert grads.keys() == ref_grads.keys(), backend
        if dtype == "fp32":
            assert_close(logits, ref_logits, **FP32_TOL, msg=lambda m, b=backend: f"{b} logits: {m}")
            for name, g in grads.items():
                assert_close(g, ref_grads[name], atol=1e-4, rtol=1e-3, msg=lambda m, b=backend, n=name: f"{b} {n}: {m}")
        else:
            assert rel_err(logits, ref_logits) < BF16_REL, (backend, rel_err(logits, ref_logits))
            for name, g in grads.items():
                if ref_grads[name].norm() > 1e-6:
                    assert rel_err(g, ref_grads[name]) < 2 * BF16_REL, (backend, name, rel_err(g, ref_grads[name]))


def check_decode(variant: Variant, device: str, backend: str) -> None:
    """Prefill 9, then single tokens and a chunk through the cache: logits equal one full forward.

    Few distinct multi-token shapes: on CUDA each one compiles FlexAttention anew (``dynamic=False``).
    """
    model = tiny_gpt(variant, device, backend=backend).eval()
    idx = torch.randint(0, VOCAB, (B, 18), generator=torch.Generator().manual_seed(2)).to(device)
    with torch.no_grad():
        full = on_backend(model, "eager", idx)
        cache = model.make_cache(B, DecodeSpec(capacity=18))
        outs, t = [], 0
        for n in [9, 1, 1, 6, 1]:
            outs.append(model(idx[:, t : t + n], cache=cache))
            t += n
    assert t == 18 and cache[0].length == 18
    assert_close(torch.cat(outs, 1), full, **FP32_TOL)


def check_greedy_generate(variant: Variant, device: str) -> None:
    """Greedy generation with the cache picks, at every step, the argmax of a full recompute."""
    model = tiny_gpt(variant, device, backend="auto").eval()
    prompt = torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(3)).to(device)
    out = generate(model, prompt, 12, temperature=0.0)
    assert out.shape == (1, 17)
    with torch.no_grad():
        logits = on_backend(model, "sdpa", out[:, :-1])  # [1, 16, V]
    assert torch.equal(out[0, 5:], logits[0, 4:].argmax(-1))


def check_training_steps(variant: Variant, device: str, dtype: str, backend: str, steps: int = 4) -> list[float]:
    """``steps`` updates on one batch (poslab's AdamW groups, clipping, autocast): loss falls, weights move."""
    model = tiny_gpt(variant, device, backend=backend)
    model.train()
    optimizer = make_optimizer(model, TrainConfig(name="cuda-step", lr=3e-3))
    if device == "cuda":
        assert optimizer.defaults.get("fused"), "poslab's AdamW should take the fused kernel on CUDA"
    before = copy.deepcopy(model.state_dict())
    gen = torch.Generator().manual_seed(4)
    # the comparison tests' batch shape, so CUDA reuses their compiled FlexAttention kernels
    idx = torch.randint(0, VOCAB, (B, T), generator=gen).to(device)
    targets = torch.randint(0, VOCAB, (B, T), generator=gen).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    losses = []
    for _ in range(steps):
        with autocast(dtype, device):
            _, loss = model(idx, targets)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        assert torch.isfinite(norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0], losses
    moved = [k for k, v in model.state_dict().items() if v.is_floating_point() and not torch.equal(v, before[k])]
    assert moved, "no weight changed"
    return losses


# ------------------------------------------------------------------------------------------ CUDA
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (benchmarks/gpu_check.sh)")
def test_cuda_flex_sdpa_eager_agree_forward_backward(variant: Variant, dtype: str) -> None:
    check_backends_agree(variant, "cuda", dtype, ("flex", "sdpa", "eager", "auto"))


@pytest.mark.parametrize("backend", ["auto", "sdpa"])  # auto: flex for the multi-token chunks, sdpa for one token
@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (benchmarks/gpu_check.sh)")
def test_cuda_kv_cache_decode_equals_full_forward(variant: Variant, backend: str) -> None:
    check_decode(variant, "cuda", backend)


@pytest.mark.parametrize("name", ["rope", "alibi", "t5"])
@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (benchmarks/gpu_check.sh)")
def test_cuda_greedy_generate_matches_recompute(name: str) -> None:
    check_greedy_generate(Variant(name, name), "cuda")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (benchmarks/gpu_check.sh)")
def test_cuda_training_step(variant: Variant, dtype: str) -> None:
    check_training_steps(variant, "cuda", dtype, backend="auto")


@pytest.mark.parametrize("name", ["learned", "rope", "alibi", "t5"])
@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (benchmarks/gpu_check.sh)")
def test_cuda_first_loss_equals_cpu(name: str) -> None:
    """The same weights and batch give the same fp32 loss on CUDA (auto = flex) as on CPU (sdpa)."""
    cpu_model = tiny_gpt(Variant(name, name), "cpu")
    gpu_model = copy.deepcopy(cpu_model).to("cuda")
    idx = torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        _, cpu_loss = cpu_model(idx, idx)
        _, gpu_loss = on_backend(gpu_model, "auto", idx.cuda(), idx.cuda())
    assert abs(cpu_loss.item() - gpu_loss.item()) < 1e-4


# ------------------------------------------------ the same helpers on CPU (default suite, fast)
@pytest.mark.parametrize("name", ["alibi", "rope"])
def test_helpers_on_cpu_sdpa_equals_eager(name: str, single_thread) -> None:
    """The comparison helper on CPU (sdpa vs eager; CPU flex has no backward): catches a rotten helper."""
    check_backends_agree(Variant(name, name), "cpu", "fp32", ("sdpa",))
    check_backends_agree(Variant(name, name), "cpu", "bf16", ("sdpa", "eager"))


def test_helpers_on_cpu_decode_generate_and_step(single_thread) -> None:
    check_decode(Variant("t5", "t5"), "cpu", "sdpa")
    check_greedy_generate(Variant("rope", "rope"), "cpu")
    losses = check_training_steps(Variant("alibi", "alibi"), "cpu", "fp32", backend="sdpa")
    assert len(losses) == 4


def test_cuda_marker_is_registered(pytestconfig) -> None:
    markers = pytestconfig.getini("markers")
    assert any(m.startswith("cuda:") for m in markers), markers
