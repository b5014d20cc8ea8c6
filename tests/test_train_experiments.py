"""The training experiments (heads, position-training) on a tiny base; their quick forms are slow tests."""

from __future__ import annotations

import json
import math

import pytest

from poslab import positions
from poslab.lab import plan
from poslab.lab.experiments import head_count as heads
from poslab.lab.experiments import position_training, run_experiment, training
from poslab.lab.experiments.common import unigram_entropy
from poslab.lab.verdicts import (
    DID_NOT_HOLD,
    HELD,
    INCONCLUSIVE,
    Arm,
    Metric,
    check_records,
    equivalent,
    missing_premises,
)

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one thread (conftest)


SEEDS = (3, 4, 5)


def test_heads_experiment_on_a_tiny_base(tmp_path, tiny_base):
    results = heads.run(tmp_path, quick=True, heads=(1, 2, 4), base=tiny_base, workers=1, seeds=SEEDS)
    assert set(results["val_loss_seeds"]) == {"1", "2", "4"} and results["seeds"] == list(SEEDS)
    assert all(len(v) == 3 for v in results["val_loss_seeds"].values())
    assert (tmp_path / "heads_curves.png").stat().st_size > 1000
    assert results["nearest_sqrt_d_over_16"] == [1]  # sqrt(16 / 16) = 1
    rule = results["claims"][0]
    assert rule["details"]["predicted"] == ["1 heads"] and rule["n_seeds"] == 3
    assert rule["details"]["arms"]["2 heads"] == results["val_loss_seeds"]["2"]
    params = {run["n_params"] for runs in results["runs"].values() for run in runs}
    assert len(params) == 1  # the head split changes no parameter count
    seeds = {
        json.loads((tmp_path / "runs" / f"heads-2-s{s}" / "config.json").read_text())["train"]["seed"] for s in SEEDS
    }
    assert seeds == set(SEEDS)
    assert check_records(results["claims"]) == []
    assert missing_premises(results["claims"]) == []  # every training claim carries its premise
    assert results["unigram_entropy_nats"] == pytest.approx(unigram_entropy(tiny_base["corpus"]))
    json.dumps(results)


def test_head_claims_follow_the_numbers():
    rule = {
        1: [3.0, 3.01, 2.99],
        2: [2.5, 2.51, 2.49],
        4: [2.6, 2.61, 2.59],
        8: [2.7, 2.71, 2.69],
        16: [2.8, 2.81, 2.79],
    }
    held, small = heads.head_claims(rule, 128)  # sqrt(128 / 16) = 2.83: the nearest counts are 2 and 4
    assert held["verdict"] == HELD and held["details"]["predicted"] == ["2 heads", "4 heads"]
    assert small["verdict"] == HELD  # 16 heads (2.8) beat 1 head (3.0)
    rule[8] = [2.4, 2.41, 2.39]
    assert heads.head_claims(rule, 128)[0]["verdict"] == DID_NOT_HOLD
    rule[8] = [2.5, 2.55, 2.45]  # a tie with 2 heads, within the seeds' spread
    tie = heads.head_claims(rule, 128)[0]
    assert tie["verdict"] == INCONCLUSIVE and abs(tie["margin"]) <= tie["noise"]


def test_unigram_baseline_by_hand(tmp_path):
    path = tmp_path / "abab.txt"
    path.write_text("aab" * 100, encoding="utf-8")  # train split: 2/3 a, 1/3 b
    assert unigram_entropy(str(path)) == pytest.approx(-(2 / 3) * math.log(2 / 3) - (1 / 3) * math.log(1 / 3), abs=1e-3)


def test_position_training_on_a_tiny_base(tmp_path, tiny_base):
    schemes = ["none", "learned", "rope", "alibi", "sinusoidal"]
    results = position_training.run(tmp_path, quick=True, schemes=schemes, base=tiny_base, workers=1, seeds=SEEDS)
    assert set(results["val_loss_seeds"]) == set(schemes)
    assert sorted(results["ranking"]) == sorted(schemes)
    assert (tmp_path / "position_training_curves.png").is_file()
    # the per-position loss of every scheme's seeds, with the n-gram baselines, is a figure of the report
    assert results["plot_by_position"] == str(tmp_path / "loss_by_position.png")
    assert (tmp_path / "loss_by_position.png").stat().st_size > 1000
    assert all(len(r["loss_by_position"]) == 16 for runs in results["runs"].values() for r in runs)
    config = json.loads((tmp_path / "runs" / "rope-s4" / "config.json").read_text())
    assert config["model"]["position"] == "rope" and config["model"]["n_embd"] == 16 and config["train"]["seed"] == 4
    learned = next(c for c in results["claims"] if c["claim"].startswith("a causal model learns better with positions"))
    assert learned["details"]["better"] == results["val_loss_seeds"]["learned"] and learned["n_seeds"] == 3
    # the arms share their seeds: paired by seed; the timing rounds pair the speed claim, in its own family
    paired = [c for c in results["claims"] if (c.get("design") or {}).get("test") == plan.Test.PAIRED.value]
    assert len(paired) == 3 and all(c["details"]["seeds"] == list(SEEDS) for c in paired)
    timing = next(c for c in results["claims"] if c["claim"].startswith("ALiBi 不增加计算"))
    assert timing["design"]["family"] == position_training.TIMING_FAMILY
    assert timing["n_seeds"] == training.TIMING_ROUNDS and timing["design"]["test"] == plan.Test.EQUIVALENCE.value
    assert check_records(results["claims"]) == []
    assert missing_premises(results["claims"]) == []  # every training claim carries its premise


def test_quick_position_training_trains_the_extrapolation_models(tmp_path):
    """The quick form's configs equal the lab models' (:func:`poslab.lab.scale.train_config`, which extrapolation
    trains), so the lab trains each model once."""
    from poslab.lab import scale
    from poslab.training.config import TrainConfig

    base, variants = position_training.quick_variants(["learned", "rope"])
    for scheme in ("learned", "rope"):
        values = {
            **base,
            "model": {**base["model"], **variants[scheme]["model"]},
            "name": "x",
            "out_dir": "y",
            "seed": 1338,
        }
        mine = TrainConfig.from_dict(values).to_dict()
        theirs = scale.train_config(scheme, scale.SIZES["quick"], tmp_path, seed=1338).to_dict()
        assert {k: v for k, v in mine.items() if k not in ("name", "out_dir")} == {
            k: v for k, v in theirs.items() if k not in ("name", "out_dir")
        }


def test_parallel_trainings_equal_sequential_ones(tmp_path, tiny_base):
    """Two worker processes (one thread each) give the runs one process gives, in the same order."""
    schemes = ["rope", "alibi", "learned"]
    one = position_training.run(tmp_path / "one", quick=True, schemes=schemes, base=tiny_base, workers=1, seeds=SEEDS)
    two = position_training.run(tmp_path / "two", quick=True, schemes=schemes, base=tiny_base, workers=2, seeds=SEEDS)
    assert list(two["runs"]) == schemes
    for name in schemes:
        for a, b in zip(one["runs"][name], two["runs"][name]):
            assert b["threads"] == 1
            assert b["val_curve"] == a["val_curve"] and b["train_curve"] == a["train_curve"]
            assert b["val_loss_all"] == a["val_loss_all"]
        assert (tmp_path / "two" / "runs" / f"{name}-s3" / "results.json").is_file()


@pytest.mark.parametrize("workers", [0, -1, 1.5, True])
def test_bad_worker_count_is_refused(tmp_path, tiny_base, workers):
    with pytest.raises(ValueError, match="workers must be a positive integer"):
        position_training.run(tmp_path, quick=True, schemes=["rope"], base=tiny_base, workers=workers, seeds=SEEDS)
    assert not (tmp_path / "runs").exists()


def test_experiments_are_registered_and_not_in_all():
    from poslab.lab.experiments import registry

    found = registry()
    assert not found["heads"].EXPERIMENT.in_all and not found["position-training"].EXPERIMENT.in_all


@pytest.mark.slow
def test_heads_quick_form(tmp_path):
    results = run_experiment("heads", tmp_path, quick=True)
    assert results["steps"] == 250 and len(results["val_loss_seeds"]) == 5 and results["corpus"] == "shakespeare"
    config = json.loads((tmp_path / "runs" / "heads-4-s1337" / "config.json").read_text())
    assert config["model"]["block_size"] == 64 and config["model"]["n_embd"] == 64
    # trained into structure: every model far below the character-frequency baseline
    assert all(max(v) < results["unigram_entropy_nats"] - 0.5 for v in results["val_loss_seeds"].values())
    assert check_records(results["claims"]) == []
    assert missing_premises(results["claims"]) == []  # every training claim carries its premise


@pytest.mark.slow
def test_position_training_quick_form(tmp_path):
    results = run_experiment("position-training", tmp_path, quick=True)
    assert set(results["val_loss_seeds"]) == set(positions.names())
    assert check_records(results["claims"]) == []
    assert missing_premises(results["claims"]) == []  # every training claim carries its premise
    # learned vs none in-length is decided at 3 seeds (as "none is within 5% of learned")
    nope = next(c for c in results["claims"] if c["claim"].startswith("不加位置编码"))
    assert nope["verdict"] != INCONCLUSIVE, nope
    assert all(max(v) < results["unigram_entropy_nats"] - 0.5 for v in results["val_loss_seeds"].values())


def test_training_claims_follow_the_numbers():
    def runs(params: int) -> int:
        return params

    losses = {
        "learned": [2.00, 2.01, 1.99],
        "sinusoidal": [2.10, 2.11, 2.09],
        "rope": [1.90, 1.91, 1.89],
        "alibi": [1.95, 1.96, 1.94],
        "none": [2.06, 2.07, 2.05],
    }
    summary = {"alibi": runs(1000), "rope": runs(1000), "none": runs(1000)}
    rounds = [30000.0, 33000.0, 36000.0, 31000.0, 35000.0]  # the machine's load moves every round
    speed = {"none": rounds, "alibi": [r * (0.98 + 0.002 * k) for k, r in enumerate(rounds)]}

    def claims() -> dict[str, dict]:
        records = position_training.training_claims(losses, summary, speed, seeds=SEEDS)
        assert check_records(records) == []
        return {c["claim"].split(" — ")[0]: c for c in records}

    verdict = claims()
    learned = verdict["a causal model learns better with positions: the learned table beats none in-length"]
    assert learned["verdict"] == HELD
    nope = next(v for k, v in verdict.items() if k.startswith("不加位置编码"))
    assert nope["verdict"] == HELD and nope["margin"] == pytest.approx(0.05 * 2.0 - 0.06)  # 3% worse, 5% allowed
    assert verdict["ALiBi 性能略低于 RoPE"]["verdict"] == HELD
    assert verdict["RoPE 比「加位置向量」更好"]["verdict"] == HELD
    assert verdict["ALiBi 极简：不需要任何参数"]["verdict"] == HELD
    # every arm trains from the same seeds on the same batches: paired by seed, the seeds recorded
    for record in (learned, nope, verdict["ALiBi 性能略低于 RoPE"], verdict["RoPE 比「加位置向量」更好"]):
        assert record["details"]["seeds"] == list(SEEDS)
    assert learned["design"]["test"] == plan.Test.PAIRED.value and nope["design"]["test"] == plan.Test.PAIRED.value
    # the timing: 98-99% of the speed round by round, an equivalence within 10% paired by round, in its own family
    timing = verdict["ALiBi 不增加计算"]
    assert timing["verdict"] == HELD and timing["design"]["test"] == plan.Test.EQUIVALENCE.value
    assert timing["design"]["log"] is True and timing["design"]["family"] == position_training.TIMING_FAMILY
    adjusted = {r.claim: r for r in plan.adjust(list(verdict.values()), "position-training")}
    assert adjusted[timing["claim"]].details["holm"]["family"] == position_training.TIMING_FAMILY
    assert adjusted[timing["claim"]].details["holm"]["m"] == 1  # not counted in the lesson's family
    assert adjusted[learned["claim"]].details["holm"]["m"] == 4  # the four seeded training claims
    # matched to the wrong rounds, the load's spread (30k to 36k) swamps the 10% margin: the rounds pair the arms
    unpaired = [r * 0.98 for r in reversed(rounds)]
    assert (
        equivalent(
            "x", "y", Arm("alibi", unpaired), Arm("none", rounds), Metric("tokens/s", log=True), within=math.log(1.1)
        ).verdict
        != HELD
    )
    losses["none"] = [2.20, 2.21, 2.19]  # 10% worse than learned
    summary["alibi"] = runs(1016)
    speed["alibi"] = [r * (0.80 + 0.002 * k) for k, r in enumerate(rounds)]
    verdict = claims()
    assert next(v for k, v in verdict.items() if k.startswith("不加位置编码"))["verdict"] == DID_NOT_HOLD
    assert verdict["ALiBi 极简：不需要任何参数"]["verdict"] == DID_NOT_HOLD
    assert verdict["ALiBi 不增加计算"]["verdict"] == DID_NOT_HOLD
    # without a timing of the arms side by side, no speed claim is made
    records = position_training.training_claims(losses, summary, seeds=SEEDS)
    assert not any(c["claim"].startswith("ALiBi 不增加计算") for c in records)


def test_training_claims_pair_arms_of_different_seed_counts_on_the_seeds_both_trained():
    # none and learned train 6 seeds (the plan), the others 3: every pair reads the seeds both arms trained
    six, three = [1337, 1338, 1339, 1340, 1341, 1342], [1337, 1338, 1339]
    losses = {
        "learned": [2.00, 2.01, 1.99, 2.02, 1.98, 2.00],
        "none": [2.06, 2.07, 2.05, 2.08, 2.04, 2.06],
        "sinusoidal": [2.10, 2.11, 2.09],
        "rope": [1.90, 1.91, 1.89],
        "alibi": [1.95, 1.96, 1.94],
    }
    seeds = {arm: six if len(v) == 6 else three for arm, v in losses.items()}
    params = {"alibi": 1000, "rope": 1000, "none": 1000}
    records = position_training.training_claims(losses, params, seeds=seeds)
    assert check_records(records) == []
    by = {c["claim"].split(" — ")[0]: c for c in records}
    learned = by["a causal model learns better with positions: the learned table beats none in-length"]
    assert learned["details"]["seeds"] == six and learned["n_seeds"] == 6
    assert learned["margin"] == pytest.approx(0.06)  # the mean of six paired differences
    ranked = by["RoPE 比「加位置向量」更好"]
    assert ranked["details"]["seeds"] == three and ranked["verdict"] == HELD  # learned read on its first 3 seeds
    # seeds in another order pair by seed, not by position in the list
    shuffled = {**seeds, "learned": list(reversed(six))}
    flipped = {**losses, "learned": list(reversed(losses["learned"]))}
    again = position_training.training_claims(flipped, params, seeds=shuffled)
    first = next(c for c in again if c["claim"] == learned["claim"])
    assert first["margin"] == pytest.approx(learned["margin"]) and first["details"]["seeds"] == list(reversed(six))
