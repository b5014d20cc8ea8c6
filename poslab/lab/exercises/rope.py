"""Exercise ``apply-rope`` (lesson 000 §3.3): rotate the two halves of x by position-dependent angles."""

from __future__ import annotations

import torch
from torch import Tensor

from poslab.lab.exercises.base import Case, Exercise
from poslab.nn.positions.rope import apply_rotary, default_inv_freq


def reference(x: Tensor, pos: Tensor, base: float = 10000) -> Tensor:
    """poslab's rotation (``layout="half"``: pairs ``(i, i + d/2)``, as the lesson's ``apply_rope``)."""
    inv_freq = default_inv_freq(base, x.shape[-1])  # [d/2]
    angles = pos.to(torch.float32)[:, None] * inv_freq[None, :]  # [T, d/2]
    return apply_rotary(x, angles.cos(), angles.sin(), "half")


def cases(seed: int) -> list[Case]:
    g = torch.Generator().manual_seed(seed)
    out = []
    # (leading shape, T, d, first position, base): T = 1, odd offsets, d = 2, leading batch/head dims
    for lead, T, d, start, base in (
        ((), 1, 2, 0, 10000),
        ((), 1, 16, 7, 10000),
        ((), 5, 8, 0, 10000),
        ((), 17, 16, 3, 10000),
        ((), 33, 64, 101, 10000),
        ((), 12, 32, 0, 500),
        ((2, 3), 9, 16, 5, 10000),
    ):
        x = torch.randn(*lead, T, d, generator=g)
        out.append(
            Case(
                (x, torch.arange(start, start + T), base),
                f"x {list(x.shape)}, pos {start}..{start + T - 1}, base {base}",
            )
        )
    x = torch.randn(10, 8, generator=g)
    pos = torch.randint(0, 512, (10,), generator=g)  # unsorted positions
    out.append(Case((x, pos, 10000), f"x {list(x.shape)}, pos {pos.tolist()}, base 10000"))
    return out


EXERCISE = Exercise(
    name="apply-rope",
    lesson="000 §3.3",
    function="apply_rope",
    signature="x, pos, base=10000",
    task_zh=(
        "旋转位置编码（RoPE）。\n\n"
        "x: [..., seq, d]（d 为偶数），pos: [seq] 整数位置，base: 频率的底数。\n"
        "频率 inv_freq[i] = 1 / base^(2i/d)，i = 0 .. d/2-1；角度 angles = pos[:, None] * inv_freq[None, :]。\n"
        "前后两半配对：x1 = x[..., :d/2]，x2 = x[..., d/2:]，\n"
        "返回 cat([x1*cos - x2*sin, x2*cos + x1*sin], -1)，形状与 x 相同。"
    ),
    task_en="RoPE on x [..., seq, d] at positions pos [seq]; pairs (i, i + d/2), inv_freq = base^(-2i/d)",
    reference=reference,
    cases=cases,
    atol=1e-4,  # fp32 angles up to ~500 rad: equally correct orderings of the same math differ by ~1e-5
    rtol=1e-4,
)
