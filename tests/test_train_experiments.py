"""The training experiments (heads, position-training) on a tiny base; their quick forms are slow tests."""

from __future__ import annotations

import json

import pytest

from poslab import positions
from poslab.data import load_corpus
from poslab.lab.experiments import head_count as heads
from poslab.lab.experiments import position_training, run_experiment

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one thread (conftest)


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "shakespeare_40k.txt"
    path.write_text(load_corpus("shakespeare")[:40_000], encoding="utf-8")
    return {
        "corpus": str(path), "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16},
        "max_steps": 6, "batch_size": 4, "warmup_steps": 1, "lr_decay_steps": 6, "eval_interval": 3, "eval_iters": 2,
        "ckpt_interval": 0, "keep_checkpoints": 1, "threads": 1, "seed": 3,
    }


def test_heads_experiment_on_a_tiny_base(tmp_path, tiny_base):
    results = heads.run(tmp_path, quick=True, heads=(1, 2, 4), base=tiny_base, workers=1)
    assert set(results["final_val_loss"]) == {"1", "2", "4"}
    assert (tmp_path / "heads_curves.png").stat().st_size > 1000
    claim = results["claim_sqrt_d_over_16"]
    assert claim["predicted"] == pytest.approx(1.0)  # sqrt(16 / 16)
    assert claim["best_heads"] == min((1, 2, 4), key=lambda h: results["final_val_loss"][str(h)])
    params = {run["n_params"] for run in results["runs"].values()}
    assert len(params) == 1  # the head split changes no parameter count
    json.dumps(results)


def test_judge_claim():
    held = heads.judge_claim({1: 3.0, 2: 2.5, 4: 2.6, 8: 2.7, 16: 2.8}, 128, noise=0.01)
    assert held["held"] and held["nearest_tested"] == [2, 4] and held["best_heads"] == 2
    assert "within" not in held["verdict"]
    failed = heads.judge_claim({1: 3.0, 2: 2.6, 4: 2.59, 8: 2.5, 16: 2.8}, 128, noise=None)
    assert not failed["held"] and failed["best_heads"] == 8 and failed["verdict"].startswith("did not hold")
    close = heads.judge_claim({1: 3.0, 2: 2.501, 4: 2.6, 8: 2.5, 16: 2.8}, 128, noise=0.05)
    assert not close["held"] and "within the measured seed-to-seed spread" in close["verdict"]


def test_position_training_on_a_tiny_base(tmp_path, tiny_base):
    schemes = ["none", "learned", "rope", "alibi"]
    results = position_training.run(tmp_path, quick=True, schemes=schemes, base=tiny_base, workers=1)
    assert set(results["final_val_loss"]) == set(schemes)
    assert sorted(results["ranking"]) == sorted(schemes)
    assert (tmp_path / "position_training_curves.png").is_file()
    config = json.loads((tmp_path / "runs" / "rope" / "config.json").read_text())
    assert config["model"]["position"] == "rope" and config["model"]["n_embd"] == 16


def test_parallel_trainings_equal_sequential_ones(tmp_path, tiny_base):
    """Two worker processes (one thread each) give the runs one process gives, in the same order."""
    schemes = ["rope", "alibi", "learned"]
    one = position_training.run(tmp_path / "one", quick=True, schemes=schemes, base=tiny_base, workers=1)
    two = position_training.run(tmp_path / "two", quick=True, schemes=schemes, base=tiny_base, workers=2)
    assert list(two["runs"]) == schemes
    for name in schemes:
        assert two["runs"][name]["threads"] == 1
        assert two["runs"][name]["val_curve"] == one["runs"][name]["val_curve"]
        assert two["runs"][name]["train_curve"] == one["runs"][name]["train_curve"]
        assert (tmp_path / "two" / "runs" / name / "results.json").is_file()


@pytest.mark.parametrize("workers", [0, -1, 1.5, True])
def test_bad_worker_count_is_refused(tmp_path, tiny_base, workers):
    with pytest.raises(ValueError, match="workers must be a positive integer"):
        heads.train_variants(tmp_path, tiny_base, {"a": {}}, workers=workers)
    assert not (tmp_path / "runs").exists()


def test_experiments_are_registered_and_not_in_all():
    from poslab.lab.experiments import registry

    found = registry()
    assert not found["heads"].IN_ALL and not found["position-training"].IN_ALL


@pytest.mark.slow
def test_heads_quick_form(tmp_path):
    results = run_experiment("heads", tmp_path, quick=True)
    assert results["steps"] == 200 and len(results["final_val_loss"]) == 5
    config = json.loads((tmp_path / "runs" / "heads-4" / "config.json").read_text())
    assert config["model"]["block_size"] == 64 and config["train"]["batch_size"] == 8
    assert (tmp_path / "results.json").is_file()


@pytest.mark.slow
def test_position_training_quick_form(tmp_path):
    results = run_experiment("position-training", tmp_path, quick=True)
    assert set(results["final_val_loss"]) == set(positions.names())
