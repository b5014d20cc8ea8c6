"""The ``transformer-xl`` experiment: a tiny run in the default suite, the quick form marked slow."""

from __future__ import annotations

import json

import pytest

from poslab.lab.experiments import descriptions, registry
from poslab.lab.experiments import transformer_xl as exp
from poslab.lab.experiments.transformer_xl_measure import Condition, SeedReading
from poslab.lab.lab import plan
from poslab.lab.plan import Test as StatTest
from poslab.lab.verdicts import DID_NOT_HOLD, HELD, ClaimRecord, check_records, missing_premises

pytestmark = pytest.mark.usefixtures("single_thread")

TINY_MODEL = {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 8}
TINY_STEPS = {
    "max_steps": 6,
    "batch_size": 4,
    "lr": 3e-3,
    "warmup_steps": 2,
    "eval_interval": 6,
    "eval_iters": 1,
    "ckpt_interval": 0,
    "keep_checkpoints": 1,
}


def test_the_experiment_is_registered_and_in_the_full_lab_only(tmp_path):
    assert registry()["transformer-xl"] is exp and not exp.EXPERIMENT.in_all
    assert "transformer-xl" in descriptions("full")
    assert "transformer-xl" in [s.name for s in plan(tmp_path, "full")]
    assert "transformer-xl" not in [s.name for s in plan(tmp_path, "quick")]


def test_the_arms_differ_only_by_the_memory(tmp_path):
    a = exp.train_config(tmp_path, True, "a", 1)
    b = exp.train_config(tmp_path, True, "b", 1)
    assert a["memory"] == 0 and a["stream_batches"] and b["memory"] == b["model"]["block_size"]
    differing = {k for k in set(a) | set(b) if a.get(k) != b.get(k)}
    assert differing == {"name", "memory", "stream_batches"}
    assert a["model"]["position"] == b["model"]["position"] == exp.SCHEME


def test_a_tiny_run_writes_results_plot_and_claims(tmp_path, corpus):
    results = exp.run(
        tmp_path, quick=True, seeds=(1, 2, 3), model=TINY_MODEL, steps=TINY_STEPS, workers=1, corpus=corpus
    )
    assert (tmp_path / exp.PLOT_FILE).is_file()
    json.dumps(results, default=float)  # what run_experiment writes
    L = TINY_MODEL["block_size"]
    labels = list(exp.conditions(L))
    for seed in results["per_seed"]:
        r = seed["conditions"]
        for label in labels:
            assert len(r[label]["by_position"]) == L
            assert r[label]["loss"] == pytest.approx(sum(r[label]["by_position"]) / L, rel=1e-6)
        # every condition reads the same segments: conftest's 2,000 validation tokens in 8 streams hold 31 of 8 (+1)
        assert {r[label]["segments"] for label in labels} == {31}
    assert missing_premises(results["claims"]) == []  # every training claim carries its premise
    records = [ClaimRecord.from_dict(c) for c in results["claims"]]
    assert len(records) == 4 and all(r.n_seeds == 3 for r in records)
    assert check_records(records) == []
    # both arms of a seed share initialisation and batches, and the other claims read one model twice: all paired
    assert all(r.design.test == StatTest.PAIRED and r.details["seeds"] == [1, 2, 3] for r in records)
    first = records[0]
    assert first.details["better"] == [r["conditions"][f"b, memory {L}"]["loss"] for r in results["per_seed"]]
    assert first.details["worse"] == [r["conditions"]["a, no memory"]["loss"] for r in results["per_seed"]]
    timing = results["step_time"]
    assert timing["memory_s"] > 0 and timing["none_s"] > 0 and timing["mem_len"] == L
    assert results["unigram_entropy_nats"] > 0


def synthetic(a_loss: list[float], b_gain: list[float], L: int = 8) -> list[SeedReading]:
    """Per-seed readings: (a) without memory at ``a_loss``, every other condition ``b_gain`` below it."""
    out = []
    for seed, (a, gain) in enumerate(zip(a_loss, b_gain), start=1):
        read = {}
        for label in exp.conditions(L):
            loss = a if label == "a, no memory" else a - gain
            # the first quarter gains twice what the last does, and a longer memory at evaluation gains more
            first = a + 0.5 if label == "a, no memory" else a + 0.5 - 2 * gain
            longer = 0.01 if label == f"b, memory {4 * L}" else 0.0
            last = a if label == "a, no memory" else a - gain
            read[label] = Condition(loss - longer, [], first, last, 1)
        out.append(SeedReading(seed, L, 1, read))
    return out


def test_claims_follow_the_numbers_paired_by_seed():
    # the seeds' models differ by 0.5 nats, the memory gains 0.05 at every seed: only the pairing sees it
    lowers, where, longer, untrained = (
        ClaimRecord.from_dict(c) for c in exp.xl_claims(synthetic([2.0, 2.5, 3.0], [0.050, 0.052, 0.048]))
    )
    assert lowers.verdict == where.verdict == longer.verdict == untrained.verdict == HELD
    assert all(r.design.test == StatTest.PAIRED for r in (lowers, where, longer, untrained))
    reverse = ClaimRecord.from_dict(exp.xl_claims(synthetic([2.0, 2.5, 3.0], [-0.050, -0.052, -0.048]))[0])
    assert reverse.verdict == DID_NOT_HOLD  # memory that costs loss at every seed


@pytest.mark.slow
def test_transformer_xl_quick_form(tmp_path):
    from poslab.lab.experiments import run_experiment

    results = run_experiment("transformer-xl", tmp_path, quick=True)
    assert (tmp_path / "results.json").is_file() and (tmp_path / exp.PLOT_FILE).is_file()
    assert len(results["claims"]) == 4 and results["seeds"] == list(exp.SEEDS)
    for label in exp.conditions(results["segment_length"]):  # every model learned structure beyond the frequencies
        assert all(r["conditions"][label]["loss"] < results["unigram_entropy_nats"] - 0.3 for r in results["per_seed"])
