"""The CPU step's kernel choices: short bf16 causal SDPA takes the math kernel (faster there), fp32 and long stay on
flash."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from poslab.nn.attention import CPU_LOWP_MATH_MAX_T, AttendOptions, AttentionSpec, attend


def _qkv(T: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    return tuple((torch.randn(3, 4, T, 16, generator=gen) * 2).to(dtype) for _ in range(3))


def _kernel(kernel: SDPBackend, q, k, v) -> torch.Tensor:
    with sdpa_kernel(kernel):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@pytest.mark.parametrize(
    ("T", "dtype", "expected"),
    [
        (64, torch.bfloat16, SDPBackend.MATH),
        (CPU_LOWP_MATH_MAX_T, torch.bfloat16, SDPBackend.MATH),
        (CPU_LOWP_MATH_MAX_T + 1, torch.bfloat16, SDPBackend.FLASH_ATTENTION),
        (64, torch.float32, SDPBackend.FLASH_ATTENTION),
    ],
)
def test_fused_causal_kernel_choice(T: int, dtype: torch.dtype, expected: SDPBackend) -> None:
    q, k, v = _qkv(T, dtype)
    pos = torch.arange(T)
    out, _ = attend(q, k, v, pos, pos, AttentionSpec(causal=True), options=AttendOptions(backend="sdpa"))
    want = _kernel(expected, q, k, v)
    other = _kernel(SDPBackend.FLASH_ATTENTION if expected == SDPBackend.MATH else SDPBackend.MATH, q, k, v)
    assert torch.equal(out, want)
    if dtype == torch.bfloat16:
        assert not torch.equal(out, other)  # the two kernels round differently: the check can tell them apart
    exact = F.scaled_dot_product_attention(*(t.double() for t in (q, k, v)), is_causal=True)
    assert float((out.double() - exact).norm() / exact.norm()) < (1e-2 if dtype == torch.bfloat16 else 1e-5)


def test_math_kernel_backward_matches_flash_in_bf16() -> None:
    q, k, v = (t.requires_grad_() for t in _qkv(64, torch.bfloat16))
    pos = torch.arange(64)
    attend(q, k, v, pos, pos, AttentionSpec(causal=True), options=AttendOptions(backend="sdpa"))[
        0
    ].float().square().sum().backward()
    grads = [t.grad.double() for t in (q, k, v)]
    q2, k2, v2 = (t.detach().double().requires_grad_() for t in (q, k, v))
    F.scaled_dot_product_attention(q2, k2, v2, is_causal=True).square().sum().backward()
    for got, ref in zip(grads, (q2.grad, k2.grad, v2.grad)):
        assert float((got - ref).norm() / ref.norm()) < 3e-2
