"""``poslab experiment head-map``: head features, projections and seed 002 §6.1's testable claims."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch

from poslab.cli.app import main
from poslab.lab.experiments import head_map
from poslab.lab.verdicts import check_records


def synthetic_weights(T: int = 8) -> list[torch.Tensor]:
    """One layer, 2 heads: head 0 attends to the previous token, head 1 uniformly to the causal past."""
    prev = torch.zeros(T, T)
    prev[0, 0] = 1.0
    for i in range(1, T):
        prev[i, i - 1] = 1.0
    uniform = torch.ones(T, T).tril()
    uniform = uniform / uniform.sum(-1, keepdim=True)
    return [torch.stack([prev, uniform])[None].repeat(3, 1, 1, 1)]  # [B=3, h=2, T, T]


def test_head_features_and_mean_distance():
    T = 8
    features, distance = head_map.head_features(synthetic_weights(T))
    assert features.shape == (2, 3 * T * (T + 1) // 2)
    assert distance[0].item() == pytest.approx(1.0)  # previous-token head: always 1 back
    expected = sum(i / 2 for i in range(1, T)) / (T - 1)  # uniform over 0..i: mean distance i/2
    assert distance[1].item() == pytest.approx(expected)


def test_spearman():
    assert head_map.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert head_map.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert head_map.spearman([1, 1, 2, 2], [5, 5, 6, 6]) == pytest.approx(1.0)  # ties get average ranks


def test_map_claims_follow_their_criteria():
    table = [
        {"layer": 0, "head": h, "mean_distance": d, "mask_loss_delta": m}
        for h, (d, m) in enumerate([(1.0, 0.5), (1.2, 0.0), (6.0, 0.2), (7.0, 0.001)])
    ]
    clusters = [0, 0, 1, 1]
    local, index, spare = head_map.map_claims(table, clusters, base_loss=1.0)
    assert local.verdict == "held"  # medians 1.1 vs 6.5
    assert index.verdict == "held"  # distance rises with the index here (rho 1)
    assert spare.verdict == "held"  # 2 of 4 heads cost < 1% of the loss
    flat = [dict(h, mean_distance=2.0 + 0.01 * h["head"]) for h in table]
    assert head_map.map_claims(flat, clusters, base_loss=1.0)[0].verdict == "did not hold"


def test_head_type_order():
    assert head_map.head_type(["previous-token", "positional(-1)"]) == "previous-token"
    assert head_map.head_type(["induction"]) == "induction"
    assert head_map.head_type([]) == "none"


def test_quick_form(tmp_path):
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(["experiment", "head-map", "--quick", "--out", str(tmp_path)]) == 0
    r = json.loads((tmp_path / "results.json").read_text())
    assert not check_records(r["claims"])
    assert len(r["claims"]) == 3
    assert len(r["heads"]) == 4 * head_map.N_HEAD
    for h in r["heads"]:
        assert len(h["pca"]) == 2 and len(h["tsne"]) == 2
        assert 0 <= h["mean_distance"] < 64
    assert (tmp_path / "head_map.png").stat().st_size > 10_000
