"""Exercise ``causal-leak`` (lesson 001 注意力分不清順序, 練習 1): the causal mask leaks order.

The student runs the lesson's experiment on a stack of single-head causal attention layers without
positions: the same tokens in two orders (the last one fixed), the last position's outputs
compared. One layer gives float noise; from two layers on the mask makes them differ. A stack
without the mask gives noise at every depth, so it fails the cases with two layers or more.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from poslab.lab.exercises.base import Case, Exercise
from poslab.nn.attention import AttendOptions, AttentionSpec, attend


def _stack(x: Tensor, weights: list[tuple[Tensor, Tensor, Tensor]]) -> Tensor:
    pos = torch.arange(x.shape[0])
    h = x[None, None]  # [1, 1, T, d]: one sequence, one head
    for wq, wk, wv in weights:
        h, _ = attend(
            h @ wq, h @ wk, h @ wv, pos, pos, AttentionSpec(causal=True), options=AttendOptions(backend="eager")
        )
    return h[0, 0]  # [T, d]


def reference(x: Tensor, perm: Tensor, weights: list[tuple[Tensor, Tensor, Tensor]]) -> Tensor:
    """``max |out(x)[-1] - out(x[perm])[-1]|`` through poslab's causal attention (eager backend)."""
    return (_stack(x, weights)[-1] - _stack(x[perm], weights)[-1]).abs().max()


def cases(seed: int) -> list[Case]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for T, d, n_layer in ((5, 16, 1), (5, 16, 2), (5, 16, 3), (2, 8, 2), (9, 32, 2), (7, 8, 4)):
        x = torch.randn(T, d, generator=g)
        perm = torch.cat([torch.randperm(T - 1, generator=g), torch.tensor([T - 1])])
        if T > 2 and bool((perm == torch.arange(T)).all()):
            perm[:2] = perm[:2].flip(0)  # a real shuffle
        elif T == 2:
            perm = torch.tensor([0, 1])  # two tokens, the last fixed: the only order
        scale = 1 / math.sqrt(d)  # keeps q.k of order 1: softmax not saturated
        weights = [tuple(torch.randn(d, d, generator=g) * scale for _ in range(3)) for _ in range(n_layer)]
        out.append(Case((x, perm, weights), f"T {T}, d {d}, {n_layer} layer(s), perm {perm.tolist()}"))
    return out


EXERCISE = Exercise(
    name="causal-leak",
    lesson="001 注意力分不清順序 / 練習 1",
    function="causal_leak",
    signature="x, perm, weights",
    task_zh=(
        "因果掩码泄露顺序的实验（不用任何位置编码）。\n\n"
        "x: [T, d] 字向量；perm: [T] 一个排列，perm[-1] == T-1（最后一个字不动），x[perm] 是打乱顺序的句子；\n"
        "weights: 列表，每层一组 (Wq, Wk, Wv)，各 [d, d]。\n"
        "每一层（单头，无残差）：q, k, v = h @ Wq, h @ Wk, h @ Wv；\n"
        "h = softmax(q @ k.T / sqrt(d) + 因果掩码) @ v（位置 i 只看 j <= i）。\n"
        "分别让 x 和 x[perm] 走完所有层，返回最后一个位置输出之差的最大绝对值（一个数）。"
    ),
    task_en="stack causal single-head attention layers (no positions) on x and x[perm]; max |last outputs' diff|",
    reference=reference,
    cases=cases,
    atol=1e-5,  # one layer: both sides are float noise (~1e-7)
    rtol=1e-3,
)
