"""Evaluation cells (:mod:`poslab.lab.experiments.cells`): their perplexity, their means over seeds, and their
round trip through results.json in the layout the lab has always written."""

from __future__ import annotations

import pytest

from poslab.lab.experiments.cells import Evaluation, MeanEvaluation, Score, SeedsScore
from poslab.lab.experiments.declaration import load, to_json

READ = {
    "length": 32,
    "nonoverlapping": {"loss": 2.5, "ppl": 12.0, "n_tokens": 64},
    "sliding": {"loss": 2.4, "ppl": 11.0, "n_tokens": 64, "stride": 16},
}


def test_a_cell_reads_its_perplexity_per_mode_and_cannot_where_the_model_cannot():
    cell = Evaluation.of(READ)
    assert cell.nonoverlapping == Score(2.5, 12.0, 64) and cell.sliding == Score(2.4, 11.0, 64, stride=16)
    assert cell.ppl() == 12.0 and cell.ppl("sliding") == 11.0 and cell.shown("sliding") == 11.0
    blocked = Evaluation.of({"length": 64, "cannot": "learned table has 32 rows"}, rope_scaling="none")
    assert blocked.ppl() is None and blocked.shown() == "cannot" and blocked.rope_scaling == "none"
    with pytest.raises(ValueError, match="'ppl' is not one of nonoverlapping, sliding"):
        cell.ppl("ppl")


def test_the_mean_over_seeds_keeps_each_seed_and_a_blocked_seed_blocks_the_length():
    other = Evaluation.of({**READ, "nonoverlapping": {"loss": 2.6, "ppl": 13.0, "n_tokens": 64}})
    mean = MeanEvaluation.of([Evaluation.of(READ), other], rope_scaling="yarn:4")
    assert mean.nonoverlapping == SeedsScore(12.5, pytest.approx(0.7071, abs=1e-4), [12.0, 13.0])
    assert mean.ppl() == 12.5 and str(mean.spread()) == "12.500 ± 0.707 (n=2)" and mean.spread("sliding").n == 2
    blocked = MeanEvaluation.of([Evaluation.of(READ), Evaluation.of({"length": 32, "cannot": "too long"})])
    assert blocked == MeanEvaluation(32, cannot="too long") and blocked.spread() == "cannot"


def test_a_cell_writes_the_dict_it_reads_leaving_out_what_it_lacks():
    blocked = {"length": 64, "cannot": "too long", "rope_scaling": "none"}
    for data in (READ, blocked, {"length": 32, "nonoverlapping": READ["nonoverlapping"]}):
        assert to_json(Evaluation.of(data)) == data and list(to_json(Evaluation.of(data))) == list(data)
    mean = {"length": 32, "nonoverlapping": {"ppl": 9.5, "ppl_sd": 0.7, "ppl_seeds": [9.0, 10.0]}}
    assert to_json(load(MeanEvaluation, mean)) == mean


def test_a_cell_missing_a_field_is_an_error_naming_it():
    with pytest.raises(KeyError, match="n_tokens"):
        Evaluation.of({"length": 32, "nonoverlapping": {"loss": 2.5, "ppl": 12.0}})
    with pytest.raises(KeyError, match="ppl_seeds"):
        load(MeanEvaluation, {"length": 32, "nonoverlapping": {"ppl": 9.5, "ppl_sd": 0.7}})
    with pytest.raises(KeyError, match="length"):
        load(MeanEvaluation, {"cannot": "too long"})


def test_a_mode_only_some_seeds_read_is_an_error_not_a_mean_of_fewer_seeds():
    only_chunks = Evaluation.of({"length": 32, "nonoverlapping": READ["nonoverlapping"]})
    with pytest.raises(ValueError, match="1 of 2 seeds read length 32 sliding"):
        MeanEvaluation.of([Evaluation.of(READ), only_chunks])
    assert MeanEvaluation.of([only_chunks, only_chunks]).sliding is None  # a mode no seed read stays out
