"""Sink rates in the head analysis (Xiao et al. 2023, https://arxiv.org/abs/2309.17453)."""

from __future__ import annotations

import pytest
import torch

from poslab import GPT, GPTConfig
from poslab.analysis import heads

pytestmark = pytest.mark.usefixtures("single_thread")


def sink_pattern(T: int, share: float) -> torch.Tensor:
    """Causal weights ``[T, T]``: ``share`` on key 0 and the rest on the diagonal (query 0: all on key 0)."""
    w = torch.zeros(T, T)
    w[0, 0] = 1.0
    for i in range(1, T):
        w[i, 0] = share
        w[i, i] = 1.0 - share
    return w


def test_sink_scores_on_hand_built_patterns():
    T = 8
    uniform = torch.tril(torch.ones(T, T))
    uniform = uniform / uniform.sum(-1, keepdim=True)  # [T, T]
    prev = torch.zeros(T, T)
    prev[0, 0] = 1.0
    prev[torch.arange(1, T), torch.arange(0, T - 1)] = 1.0  # query i -> key i-1
    layer0 = torch.stack([sink_pattern(T, 0.9), uniform, prev])[None]  # [1, 3, T, T]
    layer1 = torch.stack([sink_pattern(T, 0.25), sink_pattern(T, 0.0), uniform])[None]
    scores = heads.sink_scores([layer0, layer1])
    assert scores.shape == (2, 3)
    expected_uniform = sum(1 / (i + 1) for i in range(1, T)) / (T - 1)
    torch.testing.assert_close(scores[0], torch.tensor([0.9, expected_uniform, 1 / (T - 1)]))
    torch.testing.assert_close(scores[1], torch.tensor([0.25, 0.0, expected_uniform]))
    # query 0 (whose only key is 0) is left out: a head with no sink scores 0, not 1/T
    assert heads.head_labels(0.0, 0.0, 0, 0.0, 0.0, float(scores[0, 0])) == ["sink"]
    assert "sink" not in heads.head_labels(0.0, 0.0, 0, 0.0, 0.0, float(scores[1, 0]))


def test_sink_scores_reject_one_token():
    with pytest.raises(ValueError, match="at least 2 tokens"):
        heads.sink_scores([torch.ones(1, 1, 1, 1)])


def test_analyze_reports_uniform_sink_rate_for_a_model_with_zero_queries():
    """Zero queries give equal scores, so attention is uniform: the sink rate is mean(1/(i+1))."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=30, n_layer=2, n_head=2, n_embd=16, block_size=12, position="rope")).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight[:16].zero_()  # the query rows of the fused projection
            if block.attn.qkv.bias is not None:
                block.attn.qkv.bias[:16].zero_()
    tokens = torch.randint(0, 30, (400,), generator=torch.Generator().manual_seed(1))
    results = heads.analyze(model, tokens, n_batches=1, batch_size=2)
    expected = sum(1 / (i + 1) for i in range(1, 12)) / 11
    assert results["sink_rate_uniform"] == pytest.approx(expected)
    for row in results["heads"]:
        assert row["sink_rate"] == pytest.approx(expected, abs=1e-5)
        assert "sink" not in row["labels"]
    assert results["counts"]["sink"] == 0
    assert results["thresholds"]["sink"] == heads.SINK_THRESHOLD


def test_analyze_finds_a_sink_in_an_untrained_model_differs_from_uniform():
    """A random model's rates are per-head measurements, not the uniform constant."""
    torch.manual_seed(3)
    model = GPT(GPTConfig(vocab_size=30, n_layer=1, n_head=2, n_embd=16, block_size=12, position="rope")).eval()
    with torch.no_grad():
        model.blocks[0].attn.qkv.weight.mul_(20.0)  # sharp attention
    tokens = torch.randint(0, 30, (400,), generator=torch.Generator().manual_seed(1))
    results = heads.analyze(model, tokens, n_batches=1, batch_size=2)
    rates = [row["sink_rate"] for row in results["heads"]]
    assert all(0.0 <= r <= 1.0 for r in rates)
    assert any(abs(r - results["sink_rate_uniform"]) > 1e-3 for r in rates)
