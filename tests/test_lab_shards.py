"""``poslab lab --shard i/N`` / ``poslab experiment --shard i/N`` and ``poslab lab --size``.

N shards train disjoint slices of a training experiment's trainings into the shared folder; a last
call without ``--shard`` reuses them and decides the claims, which equal one unsharded run's.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import json
import sys
from pathlib import Path

import pytest

from poslab.cli.app import main
from poslab.jobs import runner
from poslab.lab import lab, scale
from poslab.lab.experiments import position_training, training

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one thread (conftest)

SEEDS = (3, 4, 5)
SCHEMES = ["rope", "alibi"]


def _position_training(out: Path, base: dict) -> dict:
    return position_training.run(out, quick=True, schemes=SCHEMES, base=base, workers=1, seeds=SEEDS)


def _no_training(*args, **kwargs):
    raise AssertionError("the collecting call trained a model that a shard had finished")


# ------------------------------------------------------------------------------------------ the helpers
def test_two_shards_then_a_collect_give_the_claims_of_one_unsharded_run(tmp_path, tiny_base, monkeypatch):
    one = _position_training(tmp_path / "one", tiny_base)

    out = tmp_path / "sharded"
    with runner.use_shard((1, 2)), pytest.raises(runner.ShardFinished) as stop:
        _position_training(out, tiny_base)
    (stage,) = stop.value.stages
    trained = sorted(p.name for p in (out / "runs").iterdir())
    assert 0 < len(trained) < 6  # the seeds of each arm go to the shards in turn
    per_arm = collections.Counter(name.split("-s")[0] for name in trained)
    assert set(per_arm) == {"alibi", "rope"} and all(n in (1, 2) for n in per_arm.values())  # 3 seeds: 2 and 1
    assert stage == {
        "what": "runs",
        "trained": len(trained),
        "in_shard": len(trained),
        "total": 6,
        "left": 6 - len(trained),
    }
    assert not (out / "results.json").exists()
    with runner.use_shard((2, 2)):  # the last shard finds every run finished: the step goes on to its results
        last = _position_training(out, tiny_base)
    assert last["claims"] == one["claims"]

    monkeypatch.setattr("poslab.session.train", _no_training)
    collected = _position_training(out, tiny_base)  # without a shard: every run reused
    assert collected["claims"] == one["claims"]
    assert collected["val_loss_seeds"] == one["val_loss_seeds"]
    for scheme in SCHEMES:
        for a, b in zip(one["runs"][scheme], collected["runs"][scheme]):
            assert b["val_curve"] == a["val_curve"] and b["val_loss_all"] == a["val_loss_all"]


def test_ensure_many_trains_only_its_shard_and_stops_while_others_are_missing(tmp_path, tiny_base, monkeypatch):
    from poslab.training.config import TrainConfig

    jobs = [
        TrainConfig.from_dict({**tiny_base, "name": f"r{i}", "out_dir": str(tmp_path), "seed": i}) for i in range(3)
    ]
    with runner.use_shard((2, 2)), pytest.raises(runner.ShardFinished) as stop:
        training.ensure_many(jobs, workers=1, what="lab models")
    mine = sorted(p.name for p in tmp_path.iterdir())
    n = len(mine)
    assert mine in (["r1"], ["r0", "r2"])  # consecutive seeds of one config: the shards in turn
    assert stop.value.stages == [{"what": "lab models", "trained": n, "in_shard": n, "total": 3, "left": 3 - n}]
    assert f"shard 2/2: trained {n} of 3 lab models" in str(stop.value)
    with runner.use_shard((1, 2)):  # the other shard: the rest, then all 3 are finished and the paths come back
        paths = training.ensure_many(jobs, workers=1)
    assert paths == [tmp_path / f"r{i}" for i in range(3)]
    monkeypatch.setattr("poslab.session.train", _no_training)
    assert training.ensure_many(jobs, workers=1) == paths  # the collecting call trains nothing


def test_a_run_saved_before_a_training_key_existed_is_still_reused(tmp_path, tiny_base):
    from poslab.session import train
    from poslab.training.config import TrainConfig

    cfg = TrainConfig.from_dict({**tiny_base, "name": "old", "out_dir": str(tmp_path)})
    train(cfg, progress=False)
    config = json.loads((tmp_path / "old" / "config.json").read_text())
    del config["train"]["device"]  # as a run saved before the key: it trained with the default
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))
    assert training.same_run(tmp_path / "old", cfg)
    assert not training.same_run(tmp_path / "old", TrainConfig.from_dict({**tiny_base, "name": "old", "device": "cpu"}))


def test_a_plain_train_many_inside_a_shard_leaves_its_trainings_to_the_collect():
    calls = []
    with runner.use_shard((1, 3)), pytest.raises(runner.ShardFinished) as stop:
        runner.train_many([runner.Task("a", calls.append, (1,))], 1)
    assert calls == [] and stop.value.stages[0]["trained"] == 0 and stop.value.stages[0]["left"] == 1
    assert runner.train_many([runner.Task("a", calls.append, (1,))], 1) == [None] and calls == [1]  # unsharded
    assert runner.current_shard() is None
    with runner.use_shard((3, 3)):
        assert runner.current_shard() == (3, 3)


def test_trainings_on_cuda_request_a_gpu_from_ray(tmp_path, tiny_base, monkeypatch):
    from poslab.training.config import TrainConfig

    assert runner.gpus_for({"device": "cuda"}) == 1
    assert runner.gpus_for({"device": "auto"}) == runner.gpus_for({}) == 0
    seen = []
    monkeypatch.setattr(
        training, "train_many", lambda tasks, *a, **k: seen.extend(tasks) or [str(tmp_path)] * len(tasks)
    )
    jobs = [
        TrainConfig.from_dict({**tiny_base, "name": f"g{d}", "out_dir": str(tmp_path), "device": d})
        for d in ("cuda", "cpu")
    ]
    training.ensure_many(jobs, workers=2)
    assert [t.gpus for t in seen] == [1, 0]


# ------------------------------------------------------------------------------------------ the CLI
def test_experiment_shard_is_recorded_and_refused_for_all(tmp_path, capsys):
    assert main(["experiment", "all", "--shard", "1/2", "--out", str(tmp_path)]) == 2
    assert "'all' trains nothing" in capsys.readouterr().err
    assert main(["experiment", "params", "--shard", "3/2", "--out", str(tmp_path)]) == 2
    assert "--shard must be i/N with 1 <= i <= N" in capsys.readouterr().err
    # an experiment that trains nothing runs to the end under a shard; the record says so
    assert main(["experiment", "params", "--shard", "1/2", "--out", str(tmp_path / "p")]) == 0
    record = json.loads(runner.shard_file(tmp_path / "p", (1, 2)).read_text())
    assert record["status"] == "complete" and record["shard"] == "1/2" and record["size"] is None
    assert (tmp_path / "p" / "results.json").is_file()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the error without CUDA")
def test_a_gpu_size_without_cuda_is_one_clear_error(tmp_path, capsys):
    assert main(["experiment", "extrapolation", "--size", "gpu", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "device='cuda' but torch sees no CUDA device" in err[0], err
    with pytest.raises(ValueError, match="device='cuda' but torch sees no CUDA device"):
        lab.run_lab(tmp_path / "lab", "quick", size="gpu", stream=io.StringIO())
    assert not (tmp_path / "lab").exists()


# ------------------------------------------------------------------------------------------ the lab
def test_the_lab_plan_of_a_shard_and_a_size():
    steps = lab.plan(Path("/L"), "quick", size="smoke", shard=(2, 3))
    from poslab.lab import experiments
    from poslab.lab.experiments.common import LAB

    assert [s.name for s in steps] == [n for n, e in experiments.descriptions().items() if e.tier == LAB]
    for step in steps:
        assert step.argv[-2:] == ["--shard", "2/3"] and step.done_file == "shards/2-of-3.json"
        sized = step.name in ("extrapolation", "context-extension", "attention-entropy")
        assert ("--size" in step.argv) == sized, step.argv
        assert step.size == (dataclasses.asdict(scale.SIZES["smoke"]) if sized else None)
    whole = lab.plan(Path("/L"), "quick")
    assert "tang-heads" in {s.name for s in whole}
    assert all("--shard" not in s.argv and s.size is None for s in whole)


def _fake_experiment(lab_dir: Path, name: str, size: dict | None, shard: tuple[int, int] | None) -> lab.Step:
    """An experiment step: a shard writes its record; the call without a shard writes results.json.

    Each call appends ``[name, shard, files in the folder]`` to ``LAB/../calls``.
    """
    folder = lab_dir / "experiments" / name
    record = {
        "status": "sharded",
        "quick": True,
        "size": size,
        "stages": [{"what": "runs", "trained": 1, "in_shard": 1, "total": 2, "left": 1}],
    }
    target = runner.shard_file(folder, shard) if shard else folder / "results.json"
    code = (
        "import json, pathlib\n"
        f"folder = pathlib.Path({str(folder)!r}); calls = pathlib.Path({str(lab_dir.parent / 'calls')!r})\n"
        "seen = sorted(str(p.relative_to(folder)) for p in folder.rglob('*') if p.is_file()) "
        "if folder.exists() else []\n"
        "calls.write_text((calls.read_text() if calls.exists() else '') + "
        f"json.dumps([{name!r}, {str(shard)!r}, seen]) + '\\n')\n"
        f"target = pathlib.Path({str(target)!r}); target.parent.mkdir(parents=True, exist_ok=True)\n"
        f"target.write_text(json.dumps({record!r}))\n"
        "(folder / 'runs').mkdir(exist_ok=True); (folder / 'runs' / f'trained-{target.stem}').write_text('x')\n"
    )
    done = str(runner.shard_file("", shard)) if shard else "results.json"
    return lab.Step(name, f"experiments/{name}", [], done_file=done, size=size, command=[sys.executable, "-c", code])


def _calls(lab_dir: Path) -> list:
    path = lab_dir.parent / "calls"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_lab_shards_then_a_collect(tmp_path, monkeypatch):
    lab_dir = tmp_path / "lab"
    monkeypatch.setattr("poslab.lab.report.build_report", lambda folder, **k: Path(folder) / "report.html")

    def fake_plan(lab_dir_arg: Path, mode: str, size: str | None = None, shard: tuple[int, int] | None = None):
        sized = dataclasses.asdict(scale.SIZES[size]) if size else None
        return [_fake_experiment(lab_dir_arg, "sized", sized, shard)]

    monkeypatch.setattr(lab, "plan", fake_plan)
    for i in (1, 2):
        manifest = lab.run_lab(lab_dir, "quick", size="smoke", shard=(i, 2), stream=io.StringIO())
        (step,) = manifest["steps"]
        assert step["status"] == "sharded" and step["trained"] == "trained 1 of 2 runs", step
        assert manifest["shard"] == f"{i}/2" and manifest["size"]["name"] == "smoke"
        assert manifest["command"] == f"poslab lab --quick --size smoke --shard {i}/2"
        assert lab.succeeded(manifest)
        assert json.loads((lab_dir / "shards" / f"lab-{i}-of-2.json").read_text())["steps"] == manifest["steps"]
    assert not (lab_dir / "lab.json").exists()  # the shards leave the lab's own manifest to the collecting call
    assert (lab_dir / "logs" / "shard-2-of-2" / "experiments_sized.log").is_file()
    # the second shard did not clean the first one's work
    assert _calls(lab_dir)[1] == ["sized", "(2, 2)", ["runs/trained-1-of-2", "shards/1-of-2.json"]]

    manifest = lab.run_lab(lab_dir, "quick", size="smoke", stream=io.StringIO())  # collect: continues, no clean
    assert manifest["steps"][0]["status"] == "ok" and manifest["size"]["name"] == "smoke"
    assert _calls(lab_dir)[2][2] == [
        "runs/trained-1-of-2",
        "runs/trained-2-of-2",
        "shards/1-of-2.json",
        "shards/2-of-2.json",
    ]
    saved = json.loads((lab_dir / "lab.json").read_text())
    assert saved["records"]["experiments/sized"]["size"] == dataclasses.asdict(scale.SIZES["smoke"])
    assert lab.run_lab(lab_dir, "quick", size="smoke", stream=io.StringIO())["steps"][0]["status"] == "reused"
    assert len(_calls(lab_dir)) == 3

    # another size: the step runs again, from a clean folder (its shards were of the other size)
    manifest = lab.run_lab(lab_dir, "quick", size="quick", stream=io.StringIO())
    assert manifest["steps"][0]["status"] == "ok" and _calls(lab_dir)[3][2] == []


def test_lab_shard_refuses_fresh(tmp_path):
    with pytest.raises(ValueError, match="--fresh cannot be combined with --shard"):
        lab.run_lab(tmp_path, "quick", fresh=True, shard=(1, 2), stream=io.StringIO())
    assert main(["lab", "--out", str(tmp_path), "--shard", "0/2"]) == 2


@pytest.mark.slow
def test_sharded_extrapolation_equals_one_unsharded_run(tmp_path, monkeypatch):
    """The experiments that share models (:func:`training.ensure_many`): 2 shards + a collect = one run (smoke size)."""
    from poslab.lab.experiments import extrapolation

    def run(out: Path) -> dict:
        return extrapolation.run(out, size="smoke", schemes=("rope", "alibi"), workers=1)

    one = run(tmp_path / "one" / "extrapolation")
    out = tmp_path / "sharded" / "extrapolation"
    with runner.use_shard((1, 2)), pytest.raises(runner.ShardFinished):
        run(out)
    with runner.use_shard((2, 2)):
        run(out)
    monkeypatch.setattr("poslab.session.train", _no_training)
    collected = run(out)
    assert collected["claims"] == one["claims"] and collected["perplexity"] == one["perplexity"]


def test_lab_refuses_a_bad_size_before_any_step(tmp_path, capsys):
    assert main(["lab", "--out", str(tmp_path / "lab"), "--size", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown size 'nope'; choose one of smoke, quick, full, quick-cosine, gpu, gpu-large" in err
    assert not (tmp_path / "lab").exists()


# ------------------------------------------------------------------------------------------ --seeds
def test_seeds_extend_the_lab_seeds():
    """The lab's three seeds (1337, 1338, 1339: docs/extrapolation.md's tables) come first, then the next ones."""
    assert training.seeds_for(3) == (1337, 1338, 1339)
    assert training.seeds_for(4) == (1337, 1338, 1339, 1340)
    assert training.seeds_for(5) == (1337, 1338, 1339, 1340, 1341)


@pytest.mark.parametrize("value", ["2", "0", "-3", "x", "2.5"])
def test_too_few_seeds_is_one_line(value, tmp_path, capsys):
    assert main(["experiment", "probes", "--seeds", value, "--out", str(tmp_path / "e")]) == 2
    assert main(["lab", "--seeds", value, "--out", str(tmp_path / "lab")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("--seeds" in line and value in line for line in err), err
    assert not (tmp_path / "lab").exists() and not (tmp_path / "e" / "results.json").exists()


def _fake_registry(monkeypatch) -> dict:
    """Two fake experiments, one that takes seeds and one that does not; what each run received."""
    from types import SimpleNamespace

    from poslab.lab import experiments
    from poslab.lab.experiments.common import LAB, Experiment, Option

    got: dict = {}

    def seeded(out, quick=False, seeds=(1, 2, 3)):
        got["seeded"] = tuple(seeds)
        return {"claims": []}

    def plain(out, quick=False):
        got["plain"] = True
        return {"claims": []}

    fakes = {
        name: SimpleNamespace(
            EXPERIMENT=Experiment(name, "fake", LAB, run, estimate=(1, 1), options=frozenset(options))
        )
        for name, run, options in (("seeded", seeded, {Option.SEEDS}), ("plain", plain, set()))
    }
    monkeypatch.setattr(experiments, "registry", lambda: fakes)
    return got


def test_an_experiment_receives_the_seeds(tmp_path, monkeypatch, capsys):
    got = _fake_registry(monkeypatch)
    assert main(["experiment", "seeded", "--seeds", "5", "--out", str(tmp_path / "s")]) == 0
    assert got["seeded"] == training.seeds_for(5)
    assert main(["experiment", "seeded", "--out", str(tmp_path / "d")]) == 0
    assert got["seeded"] == (1, 2, 3)  # no --seeds: the experiment's own default
    assert main(["experiment", "plain", "--seeds", "5", "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'plain' trains no seeded arms" in err[0] and "seeded" in err[0], err
    assert "plain" not in got


def test_the_lab_gives_the_seeds_to_experiments_that_take_them(tmp_path, monkeypatch):
    from poslab.lab import experiments

    _fake_registry(monkeypatch)
    steps = lab.plan(Path("/L"), "quick", seeds=6)
    by_name = {s.name: s for s in steps}
    assert by_name["seeded"].argv[-2:] == ["--seeds", "6"] and by_name["seeded"].seeds == 6
    assert "--seeds" not in by_name["plain"].argv and by_name["plain"].seeds is None
    monkeypatch.undo()
    real = lab.plan(Path("/L"), "quick", seeds=4)
    takes = {
        n for n, e in experiments.descriptions().items() if "seeds" in __import__("inspect").signature(e.run).parameters
    }
    assert {"probes", "heads", "position-training"} <= takes
    for step in real:
        assert (step.seeds == 4) == (step.name in takes) and ("--seeds" in step.argv) == (step.name in takes)


def test_a_finished_step_of_other_seeds_is_rerun(tmp_path):
    step = lab.Step("e", "experiments/e", [], seeds=5)
    (tmp_path / "experiments" / "e").mkdir(parents=True)
    (tmp_path / "experiments" / "e" / "results.json").write_text("{}")
    record = {"status": "ok", "mode": "quick", "size": None, "seeds": None}
    previous = {"records": {"experiments/e": record}}
    assert not lab._finished(step, tmp_path, previous, "quick")
    record["seeds"] = 5
    assert lab._finished(step, tmp_path, previous, "quick")
