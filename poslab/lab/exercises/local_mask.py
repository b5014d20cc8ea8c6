"""Exercise ``local-mask`` (lesson 002 §3.1): the sliding-window mask the lesson meant to write.

The lesson's snippet is bidirectional (``tril(-w) + triu(w)`` is symmetric); the lab's correction compares it
with the causal window. The exercise asks for both, as poslab's ``position_mask(causal, window)`` gives them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from poslab.lab.exercises.base import Case, Exercise
from poslab.nn.attention.spec import position_mask


def reference(L: int, window_size: int, causal: bool) -> Tensor:
    """poslab's window rule, ``[L, L]`` bool: ``i - W < j <= i`` (causal) or ``|i - j| < W``."""
    pos = torch.arange(L)
    mask = position_mask(pos, pos, causal=causal, window=window_size)
    assert mask is not None  # a window is set, so there is a mask
    return mask


def cases(seed: int) -> list[Case]:
    del seed  # the inputs are sizes: nothing random
    sizes = ((1, 1), (2, 1), (8, 3), (8, 1), (13, 4), (6, 6), (5, 9), (64, 16))
    return [
        Case((L, w, causal), f"L {L}, window_size {w}, causal {causal}") for causal in (False, True) for L, w in sizes
    ]


EXERCISE = Exercise(
    name="local-mask",
    lesson="002 §3.1",
    function="local_mask",
    signature="L, window_size, causal",
    task_zh=(
        "局部（滑动窗口）注意力的掩码。\n\n"
        "返回 [L, L]：位置 i 能看到位置 j 时为 1（或 True），否则为 0（或 False）。\n"
        "causal 为 False（课文的片段，双向）：|i - j| < window_size；\n"
        "causal 为 True（GPT 这样的因果模型，Mistral 的滑动窗口）：i - window_size < j <= i。\n"
        "window_size = 1 时只看自己。\n"
        "用法：scores = scores.masked_fill(mask == 0, -1e9)。\n"
        "注意：课文的 tril(-window_size) + triu(window_size) 保留的恰恰是窗口之外，不要照抄。"
    ),
    task_en="sliding-window mask [L, L], 1/True where |i - j| < W (causal: i - W < j <= i)",
    reference=reference,
    cases=cases,
    atol=0.0,
    rtol=0.0,
)
