"""Exercises ``split-heads`` and ``merge-heads`` (lesson 001 多頭, lesson 002 §1.2): the shape walk."""

from __future__ import annotations

import torch
from torch import Tensor

from poslab.lab.exercises.base import Case, Exercise
from poslab.nn.attention.module import MergeHeads, SplitHeads

# (B, T, n_head, d_k): one head, T = 1, d_k = 1, odd sizes
GEOMETRIES = ((1, 1, 1, 4), (2, 5, 4, 8), (3, 7, 2, 3), (1, 4, 8, 1), (2, 1, 4, 16))


def split_reference(x: Tensor, n_head: int) -> Tensor:
    return SplitHeads(n_head)(x)


def split_cases(seed: int) -> list[Case]:
    g = torch.Generator().manual_seed(seed)
    xs = [(torch.randn(B, T, h * dk, generator=g), h) for B, T, h, dk in GEOMETRIES]
    return [Case((x, h), f"x {list(x.shape)}, n_head {h}") for x, h in xs]


def merge_cases(seed: int) -> list[Case]:
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(B, h, T, dk, generator=g) for B, T, h, dk in GEOMETRIES]
    return [Case((x,), f"x {list(x.shape)}") for x in xs]


SPLIT = Exercise(
    name="split-heads",
    lesson="001 多頭 / 002 §1.2",
    function="split_heads",
    signature="x, n_head",
    task_zh=(
        "把向量切成多个头。\n\n"
        "x: [B, T, C]，C 能被 n_head 整除，d_k = C // n_head。\n"
        "返回 [B, n_head, T, d_k]：第 h 个头拿到每个字向量的第 h 段 x[:, :, h*d_k:(h+1)*d_k]。"
    ),
    task_en="[B, T, C] -> [B, n_head, T, C // n_head]; head h gets the h-th slice of each vector",
    reference=split_reference,
    cases=split_cases,
    atol=0.0,
    rtol=0.0,
)

MERGE = Exercise(
    name="merge-heads",
    lesson="001 多頭 / 002 §1.2",
    function="merge_heads",
    signature="x",
    task_zh=(
        "把各个头的结果拼回去（split_heads 的逆）。\n\n"
        "x: [B, n_head, T, d_k]。\n"
        "返回 [B, T, n_head * d_k]：每个位置上依次是第 0、1、…… 个头的 d_k 维输出。"
    ),
    task_en="[B, n_head, T, d_k] -> [B, T, n_head * d_k], head 0 first (the inverse of split_heads)",
    reference=MergeHeads(),
    cases=merge_cases,
    atol=0.0,
    rtol=0.0,
)
