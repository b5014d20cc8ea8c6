"""The memory-efficient blocked path of attention for bias schemes.

The blocked path must equal the one-shot path (forward and backward, every bias scheme) and must
never build or keep a ``[B, h, T, T]`` tensor: checked by recording every bias tile requested and
every tensor autograd saves for backward.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import BIAS_VARIANTS, D_MODEL, N_HEADS, Variant, make_attention
from torch.testing import assert_close

from poslab import MultiHeadAttention
from poslab.nn.attention import AttendOptions, AttentionSpec, attend

B = 2
ROOT = Path(__file__).resolve().parents[1]
TIGHT = {"atol": 1e-5, "rtol": 1e-5}
BIAS_IDS = [v.id for v in BIAS_VARIANTS]


# ------------------------------------------------------------------------------ blocked path
def _blocked(attn: MultiHeadAttention, chunk: int = 8, recompute_from: int = 16) -> MultiHeadAttention:
    attn.query_chunk, attn.recompute_threshold = chunk, recompute_from
    return attn


@pytest.mark.parametrize(
    ("causal", "window", "recompute_from"),
    [(True, None, 16), (True, None, 10_000), (False, None, 16), (True, 6, 16), (False, 6, 16)],
    ids=["causal-recompute", "causal-keep", "bidir-recompute", "causal-w6", "bidir-w6"],
)
@pytest.mark.parametrize("variant", BIAS_VARIANTS, ids=BIAS_IDS)
def test_blocked_equals_one_shot_forward_and_backward(
    variant: Variant, causal: bool, window: int | None, recompute_from: int
) -> None:
    """T=40 in blocks of 8 (checkpointed or not) equals one SDPA call, values and grads."""
    attn = make_attention(variant, n_kv_heads=2, causal=causal, window=window)
    x = torch.randn(B, 40, D_MODEL, requires_grad=True)
    attn.query_chunk = 10_000  # one-shot
    attn(x).square().sum().backward()
    one_shot = attn(x).detach()
    grads = [x.grad.clone()] + [p.grad.clone() for p in attn.parameters()]
    x.grad = None
    attn.zero_grad()
    _blocked(attn, recompute_from=recompute_from)
    out = attn(x)
    out.square().sum().backward()
    assert_close(out, one_shot, **TIGHT)
    for got, expected in zip([x.grad] + [p.grad for p in attn.parameters()], grads):
        assert_close(got, expected, **TIGHT)


def _record_bias_tiles(attn: MultiHeadAttention) -> list[tuple[int, int]]:
    tiles: list[tuple[int, int]] = []
    original = attn.position.score_bias

    def spy(q, k, q_pos, k_pos, scale):
        tiles.append((q_pos.shape[0], k_pos.shape[0]))
        return original(q, k, q_pos, k_pos, scale)

    attn.position.score_bias = spy
    return tiles


@pytest.mark.parametrize("variant", BIAS_VARIANTS, ids=BIAS_IDS)
def test_blocked_path_never_builds_the_full_bias(variant: Variant) -> None:
    attn = _blocked(make_attention(variant, n_kv_heads=2), chunk=16)
    tiles = _record_bias_tiles(attn)
    with torch.no_grad():
        attn(torch.randn(1, 128, D_MODEL))
    assert len(tiles) == 8 and max(tq for tq, _ in tiles) == 16
    # causal: keys up to the block's end; the largest block runs first (memory, see poslab.nn.attention.blocked)
    assert [tk for _, tk in tiles] == [16 * (8 - i) for i in range(8)]


def test_blocked_window_reads_only_keys_within_reach() -> None:
    attn = _blocked(make_attention(Variant("t5", "t5"), window=10), chunk=16)
    tiles = _record_bias_tiles(attn)
    with torch.no_grad():
        attn(torch.randn(1, 128, D_MODEL))
    assert max(tk for _, tk in tiles) == 16 + 10 - 1  # the block plus the window's reach behind it


@pytest.mark.parametrize("name", ["alibi", "t5", "xl"])
def test_blocked_backward_keeps_no_quadratic_tensor(name: str) -> None:
    """All tensors autograd saves for backward together are far smaller than one ``[h, T, T]`` bias."""
    T = 512
    attn = _blocked(make_attention(Variant(name, name), n_kv_heads=2), chunk=64, recompute_from=256)
    x = torch.randn(1, T, D_MODEL, requires_grad=True)
    saved: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = attn(x)
    out.sum().backward()  # the checkpointed blocks recompute their bias here
    assert sum(saved) < N_HEADS * T * T / 8
    attn.recompute_threshold = 10_000  # blocks that keep their bias: the check can fail
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        attn(x)
    assert sum(saved) >= N_HEADS * T * T / 2  # the causal half of [h, T, T], at least


def test_blocked_path_runs_the_largest_blocks_first() -> None:
    """Causal bias tiles grow with a block's reach; computed largest first, each later tile fits in a freed one.

    Smallest first, glibc's heap grows around the live tensors (ALiBi at T=2048/4096/8192:
    +37/+149/+572 MiB, ``benchmarks/eval_memory.py --allocator default``).
    """
    widths = []

    def bias_fn(q, k, q_pos, k_pos):
        widths.append(k.shape[2])
        return torch.zeros(1, 1, q.shape[2], k.shape[2])

    q = torch.randn(1, 2, 64, 8)
    pos = torch.arange(64)
    with torch.no_grad():
        attend(q, q, q, pos, pos, AttentionSpec(bias_fn=bias_fn), options=AttendOptions(query_chunk=8))
    assert len(widths) == 8 and widths == sorted(widths, reverse=True) and widths[0] == 64


@pytest.mark.slow
@pytest.mark.parametrize("mode", [[], ["--train"]], ids=["eval", "train"])
def test_memory_is_linear_in_T_without_allocator_settings(mode: list[str]) -> None:
    """The library path (no ``mallopt``): the peak of an evaluation / a training step grows less than 8x from T=2048 to
    8192.

    Without the largest-first order and heap trimming: ALiBi's evaluation x15.4, T5's training step x11.6
    (``benchmarks/eval_memory.py --allocator default``).
    """
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "eval_memory.py"),
            "--lengths",
            "2048,8192",
            "--schemes",
            "alibi,t5",
            "--allocator",
            "default",
            *mode,
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert result.returncode == 0, result.stdout + result.stderr  # exit 1 when a scheme's growth is >= 8x
