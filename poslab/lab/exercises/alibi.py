"""Exercise ``alibi-bias`` (lesson 000 §4): the per-head linear penalty on the distance to past keys."""

from __future__ import annotations

import torch
from torch import Tensor

from poslab.lab.exercises.base import Case, Exercise
from poslab.nn.positions.alibi import ALiBi, AlibiConfig


def reference(n_head: int, seq_len: int) -> Tensor:
    """poslab's ALiBi bias ``-m_h |i - j|``, ``[n_head, seq_len, seq_len]``."""
    pos = torch.arange(seq_len)
    return ALiBi(AlibiConfig(n_heads=n_head)).score_bias(None, None, pos, pos, 1.0)[0]  # type: ignore[arg-type]


def causal_part(bias: Tensor) -> Tensor:
    """Keep the entries ``j <= i`` (the causal mask removes the others before the softmax)."""
    return torch.tril(bias)


def cases(seed: int) -> list[Case]:
    del seed  # the inputs are sizes: nothing random
    return [
        Case((n_head, seq_len), f"n_head {n_head}, seq_len {seq_len}")
        for n_head, seq_len in ((1, 1), (2, 2), (8, 8), (4, 7), (16, 5), (8, 33))
    ]


EXERCISE = Exercise(
    name="alibi-bias",
    lesson="000 §4",
    function="alibi_bias",
    signature="n_head, seq_len",
    task_zh=(
        "ALiBi 的位置偏置（加在 softmax 之前的 logits 上）。\n\n"
        "n_head 是 2 的幂；第 h 个头（h = 0 .. n_head-1）的斜率 m_h = 2^(-8(h+1)/n_head)\n"
        "（8 个头：1/2, 1/4, ..., 1/256）。\n"
        "返回 [n_head, seq_len, seq_len]：bias[h, i, j] = -m_h * (i - j)，j <= i（越远的过去罚得越多）。\n"
        "j > i 的位置会被因果掩码遮住，检查时不看。"
    ),
    task_en="ALiBi bias [n_head, T, T]: -m_h (i - j) for keys j <= i, m_h = 2^(-8(h+1)/n_head)",
    reference=reference,
    cases=cases,
    view=causal_part,
)
