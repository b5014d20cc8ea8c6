"""``poslab experiment head-map``: head features, projections and seed 002 §6.1's testable claims."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math

import pytest
import torch

from poslab.cli.app import main
from poslab.lab.experiments import head_map, head_map_probe
from poslab.lab.experiments.head_map_probe import HeadRow
from poslab.lab.experiments.training import SEEDS
from poslab.lab.plan import Test as StatTest
from poslab.lab.verdicts import DID_NOT_HOLD, HELD, INCONCLUSIVE, ClaimRecord, check_records, missing_premises


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
    features, distance = head_map_probe.head_features(synthetic_weights(T))
    assert features.shape == (2, 3 * T * (T + 1) // 2)
    assert distance[0].item() == pytest.approx(1.0)  # previous-token head: always 1 back
    expected = sum(i / 2 for i in range(1, T)) / (T - 1)  # uniform over 0..i: mean distance i/2
    assert distance[1].item() == pytest.approx(expected)


def test_spearman():
    assert head_map_probe.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert head_map_probe.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert head_map_probe.spearman([1, 1, 2, 2], [5, 5, 6, 6]) == pytest.approx(1.0)  # ties get average ranks


def test_map_statistics_follow_their_criteria():
    table = [
        HeadRow(0, h, [], "none", d, m, 0, [0.0, 0.0], [0.0, 0.0])
        for h, (d, m) in enumerate([(1.0, 0.5), (1.2, 0.0), (6.0, 0.2), (7.0, 0.001)])
    ]
    clusters = [0, 0, 1, 1]
    stats = head_map_probe.map_statistics(table, clusters, base_loss=1.0)
    assert stats.cluster_medians == pytest.approx([1.1, 6.5]) and stats.ratio == pytest.approx(6.5 / 1.1)
    assert stats.rho == pytest.approx(1.0)  # distance rises with the index here
    assert stats.spare_share == 0.5 and stats.spare_heads == [[0, 1], [0, 3]]  # cost < 1% of the loss
    flat = [dataclasses.replace(h, mean_distance=0.0) for h in table]
    assert head_map_probe.map_statistics(flat, clusters, base_loss=1.0).ratio == 1.0  # no separation


def test_map_claims_are_one_sample_tests_over_the_seeds():
    def stats(ratio: float, rho: float, share: float) -> head_map_probe.MapStatistics:
        return head_map_probe.MapStatistics(ratio, [1.0, ratio], [4, 4], rho, share, [], 8)

    per_seed = [stats(5.0, 0.8, 0.50), stats(6.0, 0.7, 0.45), stats(5.5, 0.9, 0.55)]
    local, index, spare = head_map.map_claims(per_seed, [1, 2, 3])
    assert local.verdict == index.verdict == spare.verdict == HELD
    assert all(r.design.test == StatTest.ONE_SAMPLE and r.details["seeds"] == [1, 2, 3] for r in (local, index, spare))
    assert local.design.log and local.design.threshold == pytest.approx(math.log(head_map.DISTANCE_FACTOR))
    assert check_records([local, index, spare]) == []
    # one model's values decide nothing: the claims are about models of this recipe, seed to seed
    assert {r.verdict for r in head_map.map_claims(per_seed[:1], [1])} == {INCONCLUSIVE}
    below = [stats(1.2, -0.1, 0.0), stats(1.1, 0.1, 0.03), stats(1.3, 0.0, 0.0)]
    assert {r.verdict for r in head_map.map_claims(below, [1, 2, 3])} == {DID_NOT_HOLD}


def test_the_premise_needs_every_seed_below_trigram():
    assert head_map.map_premise([1.60, 1.62, 1.58], trigram=2.05).met
    assert not head_map.map_premise([1.60, 1.62, 2.02], trigram=2.05).met  # one seed near trigram level


def test_head_type_order():
    assert head_map_probe.head_type(["previous-token", "positional(-1)"]) == "previous-token"
    assert head_map_probe.head_type(["induction"]) == "induction"
    assert head_map_probe.head_type([]) == "none"


SHORT = dataclasses.replace(head_map.SCALES["quick"], steps=20, eval_interval=20, warmup_steps=2, eval_iters=1)


def test_a_short_run_writes_seeded_claims_with_their_premise(tmp_path, capsys):
    """The quick form's code path with 20 training steps and 2 seeds: the fast version of ``test_quick_form``
    (test_map_claims_are_one_sample_tests_over_the_seeds decides claims on 3)."""
    results = json.loads(json.dumps(head_map.run(tmp_path, quick=True, seeds=(1, 2), scale=SHORT, workers=1)))
    _check(results, tmp_path, seeds=[1, 2])
    assert "seed 002 §6.1's descriptions per seed" in capsys.readouterr().out


def _check(r: dict, out, seeds: list[int]) -> None:
    assert not check_records(r["claims"])
    assert missing_premises(r["claims"]) == []  # every claim on trained models carries its premise
    assert len(r["claims"]) == 3 and [s["seed"] for s in r["per_seed"]] == seeds
    for claim in r["claims"]:
        record = ClaimRecord.from_dict(claim)
        assert record.n_seeds == len(seeds) and record.details["seeds"] == seeds
        assert record.design.test == StatTest.ONE_SAMPLE
        assert "trigram" in record.premise.text
    assert len(r["heads"]) == 4 * head_map.N_HEAD
    for h in r["heads"]:
        assert len(h["pca"]) == 2 and len(h["tsne"]) == 2
        assert 0 <= h["mean_distance"] < 64
    assert (out / "head_map.png").stat().st_size > 10_000


@pytest.mark.slow  # three 400-step models; test_a_short_run_writes_seeded_claims_with_their_premise runs its code
def test_quick_form(tmp_path):
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(["experiment", "head-map", "--quick", "--out", str(tmp_path)]) == 0
    _check(json.loads((tmp_path / "results.json").read_text()), tmp_path, seeds=list(SEEDS))
