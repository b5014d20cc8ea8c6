"""Exercise ``local-mask`` (lesson 002 §3.1): the sliding-window mask the lesson meant to write."""

from __future__ import annotations

import torch
from torch import Tensor

from poslab.lab.exercises.base import Case, Exercise
from poslab.nn.attention.spec import position_mask


def reference(L: int, window_size: int) -> Tensor:
    """poslab's window rule without causality: keep ``|i - j| < window_size``, ``[L, L]`` bool."""
    pos = torch.arange(L)
    mask = position_mask(pos, pos, causal=False, window=window_size)
    assert mask is not None  # a window is set, so there is a mask
    return mask


def cases(seed: int) -> list[Case]:
    del seed  # the inputs are sizes: nothing random
    return [
        Case((L, w), f"L {L}, window_size {w}")
        for L, w in ((1, 1), (2, 1), (8, 3), (8, 1), (13, 4), (6, 6), (5, 9), (64, 16))
    ]


EXERCISE = Exercise(
    name="local-mask",
    lesson="002 §3.1",
    function="local_mask",
    signature="L, window_size",
    task_zh=(
        "局部（滑动窗口）注意力的掩码。\n\n"
        "返回 [L, L]：位置 i 能看到位置 j 时为 1（或 True），否则为 0（或 False），\n"
        "即 |i - j| < window_size（window_size = 1 时只看自己）。\n"
        "用法：scores = scores.masked_fill(mask == 0, -1e9)。\n"
        "注意：课文的 tril(-window_size) + triu(window_size) 保留的恰恰是窗口之外，不要照抄。"
    ),
    task_en="sliding-window mask [L, L], 1/True where |i - j| < window_size (the lesson's code keeps the outside)",
    reference=reference,
    cases=cases,
    atol=0.0,
    rtol=0.0,
)
