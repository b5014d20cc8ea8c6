"""The one training step (poslab.training.step.train_step): the loop, the probes and the sparse experiment share it."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from poslab.nn.model import GPT, GPTConfig
from poslab.training.step import StepSettings, train_step


def _model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=11, n_layer=1, n_head=2, n_embd=16, block_size=8, dropout=0.0))


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        t = torch.randint(0, 11, (3, 9), generator=g)  # [B, T+1]
        out.append((t[:, :-1], t[:, 1:]))
    return out


def _hand_step(model: GPT, optimizer: torch.optim.Optimizer, batches, lr: float, clip: float) -> tuple[float, float]:
    """nanoGPT's step written out: lr, accumulated micro-batches, clip, update, cleared gradients."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    total = 0.0
    for x, y in batches:
        _, loss = model(x, y)
        (loss / len(batches)).backward()
        total += loss.item()
    norm = float(torch.nn.utils.clip_grad_norm_(list(model.parameters()), clip))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total / len(batches), norm


def test_train_step_is_the_hand_written_step_bitwise():
    a, b = _model(), _model()
    opt_a = torch.optim.AdamW(a.parameters(), lr=1e-2)
    opt_b = torch.optim.AdamW(b.parameters(), lr=1e-2)
    settings = StepSettings(grad_clip=0.5, grad_accum=2)
    for step in range(3):
        batches = _batches(2 * (step + 1))[-2:]
        want = _hand_step(a, opt_a, batches, 1e-2 / (step + 1), 0.5)
        got = train_step(
            opt_b, list(b.parameters()), lambda i, bs=batches: b(*bs[i])[1], settings, lr=1e-2 / (step + 1)
        )
        assert (got.loss, got.grad_norm, got.applied) == (want[0], want[1], True)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert all(p.grad is None for p in b.parameters())


def test_a_non_finite_loss_is_dropped_only_when_asked():
    ((x, y),) = _batches(1)
    for finite_only in (True, False):
        model = _model()
        before = [p.detach().clone() for p in model.parameters()]
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        result = train_step(
            optimizer,
            list(model.parameters()),
            lambda _i, m=model: m(x, y)[1] * float("nan"),
            StepSettings(finite_only=finite_only),
        )
        assert math.isnan(result.loss) and math.isnan(result.grad_norm)
        assert result.applied is not finite_only
        unchanged = all(torch.equal(p, q) for p, q in zip(before, model.parameters()))
        assert unchanged is finite_only  # dropped: the weights as they were; applied: NaN written into them
        assert all(p.grad is None for p in model.parameters())


def test_no_clip_measures_no_norm_and_a_zero_clip_measures_it():
    ((x, y),) = _batches(1)
    model = _model()
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=0.0)
    loss_of = lambda _i: F.cross_entropy(model(x).reshape(-1, 11), y.reshape(-1))  # noqa: E731
    assert train_step(optimizer, params, loss_of, StepSettings(grad_clip=None)).grad_norm is None
    norm = train_step(optimizer, params, loss_of, StepSettings(grad_clip=0.0)).grad_norm
    loss_of(0).backward()
    assert norm == pytest.approx(float(torch.nn.utils.get_total_norm([p.grad for p in params])), rel=1e-6)
