"""The lab model store: experiments ask for lab models by scheme, size and seed and share one folder of each."""

from __future__ import annotations

import dataclasses
import io
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from poslab.cli.app import main
from poslab.jobs import runner
from poslab.lab import lab, scale
from poslab.lab.experiments import training
from poslab.lab.experiments.common import LAB
from poslab.lab.experiments.declaration import Declaration, Plan, Runs, declare
from poslab.lab.experiments.lab_models import LabModel, lab_model_arms

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one thread (conftest)

SMOKE = scale.size_of(False, "smoke")


@dataclass(frozen=True)
class ToyResult:
    """The folder of the lab model the toy experiment read."""

    model: str


def _toy(name: str, size: scale.Scale = SMOKE, after: tuple[str, ...] = ()):
    """A declared toy experiment that reads the RoPE lab model of ``size``, first seed."""

    def plan(out: Path, quick: bool) -> Plan[None]:
        return Plan(None, lab_model_arms(("rope",), size, (scale.SEED,)), summarise=False, what="lab models")

    def measure(runs: Runs[None]) -> ToyResult:
        return ToyResult(str(runs.by_arm["rope"][scale.SEED].path))

    return declare(name, "a toy", LAB, Declaration(ToyResult, plan, measure, lambda r: []), after=after)


def test_two_experiments_that_need_one_lab_model_train_it_once_in_the_store(tmp_path, monkeypatch):
    store = tmp_path / "lab" / "models"
    first, second = _toy("first"), _toy("second", after=("first",))
    trained = first.run(tmp_path / "lab" / "experiments" / "first", workers=1, models=store)["model"]
    assert trained == str(store / "smoke" / "rope") and (Path(trained) / "results.json").is_file()

    def no_training(*args, **kwargs):
        raise AssertionError("the second experiment trained the lab model the store holds")

    with monkeypatch.context() as patched:
        patched.setattr("poslab.session.train", no_training)
        assert second.run(tmp_path / "lab" / "experiments" / "second", workers=1, models=store)["model"] == trained
    assert not (tmp_path / "lab" / "experiments" / "second" / "models").exists()

    # the same name with another recipe is not the stored model: it is trained again, never read as it
    calls = []
    monkeypatch.setattr(
        "poslab.lab.experiments.training.train_or_resume", lambda cfg, progress=False: calls.append(cfg)
    )
    longer = dataclasses.replace(SMOKE, steps=SMOKE.steps + 1)
    _toy("third", longer).run(tmp_path / "lab" / "experiments" / "third", workers=1, models=store)
    assert [c.max_steps for c in calls] == [SMOKE.steps + 1] and calls[0].run_dir == store / "smoke" / "rope"


def test_a_plan_asking_for_lab_models_needs_a_store(tmp_path, monkeypatch):
    from poslab.lab.experiments.declaration import ensure_runs

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="the plan asks for lab models: give ensure_runs the lab model store"):
        ensure_runs(Plan(None, lab_model_arms(("rope",), SMOKE, (scale.SEED,)), summarise=False), workers=1)
    assert list(tmp_path.iterdir()) == []  # nothing trained in a folder nobody named


def test_a_lab_model_that_two_experiments_ask_for_belongs_to_one_shard(tmp_path, monkeypatch):
    """Side-by-side shards never train one store folder at once: a lab model's shard is the same in every
    experiment's list of trainings, whatever its place there."""
    store = tmp_path / "models"
    seeds = (1337, 1338, 1339)
    first = [LabModel(s, SMOKE, seed).config(store) for s in ("rope", "alibi") for seed in seeds]
    second = [LabModel(s, SMOKE, seed).config(store) for s in ("alibi", "rope") for seed in seeds]
    trained: list[Path] = []
    monkeypatch.setattr(
        training, "train_many", lambda tasks, *a, **k: trained.extend(t.label for t in tasks) or ["x"] * len(tasks)
    )
    shards = {}
    for i in (1, 2):
        for name, configs in (("first", first), ("second", second)):
            trained.clear()
            with runner.use_shard((i, 2)), pytest.raises(runner.ShardFinished):
                training.ensure_many(configs, workers=1)
            shards[name, i] = set(trained)
    for i in (1, 2):
        assert shards["first", i] == shards["second", i]
    assert shards["first", 1] | shards["first", 2] == {c.name for c in first}
    assert not shards["first", 1] & shards["first", 2]


def test_shards_on_machines_that_mount_the_lab_elsewhere_agree(tmp_path):
    """A fine-tune's config names its base run by path: the shard of the training must not depend on where this
    machine mounts the lab, or two machines would both train it (or neither)."""
    from poslab.lab.scale import Overrides, train_config

    def finetune(root: str, seed: int):
        changes = Overrides(steps=3, init_from=f"{root}/models/smoke/rope-s{seed}")
        return train_config("rope", SMOKE, Path(root) / "runs", name=f"ft-s{seed}", seed=seed, changes=changes)

    for seed in range(1337, 1345):
        keys = {training.shard_key(finetune(root, seed)) for root in ("/mnt/a/lab", "/scratch/user/lab", "lab")}
        assert len(keys) == 1, seed
    assert training.shard_key(finetune("lab", 1337)) != training.shard_key(finetune("lab", 1338))


@pytest.mark.parametrize("mode", lab.MODES)
def test_the_lab_gives_every_step_its_store_after_the_steps_it_reads(mode, tmp_path):
    """One store for every step; the steps run one after another, each after those it names in ``after`` (which
    are rerun first when rebuilt), so no two steps train one lab model at once."""
    earlier: list[str] = []
    for step in lab.plan(tmp_path, mode):
        at = step.argv.index("--models")
        assert step.argv[at + 1] == str(tmp_path / "models"), step.argv
        assert all(need in earlier for need in step.needs), (step.name, step.needs)
        earlier.append(step.folder)
    readers = {s.name: s.needs for s in lab.plan(tmp_path, mode)}
    assert (
        readers["context-extension"]
        == readers["attention-entropy"]
        == (
            "experiments/extrapolation",
            "experiments/position-training",
        )
    )


def test_a_rerun_step_keeps_the_store_and_fresh_starts_it_afresh(tmp_path, monkeypatch):
    lab_dir = tmp_path / "lab"
    folder = lab_dir / "experiments" / "one"
    code = f"import pathlib; p = pathlib.Path({str(folder)!r}); p.mkdir(parents=True); (p / 'results.json').touch()"
    step = lab.Step("one", "experiments/one", [], command=[sys.executable, "-c", code])
    monkeypatch.setattr(lab, "plan", lambda lab_dir_arg, mode: [step])
    model = lab_dir / "models" / "smoke" / "rope" / "config.json"
    model.parent.mkdir(parents=True)
    model.write_text("{}")
    assert lab.run_lab(lab_dir, "quick", stream=io.StringIO())["steps"][0]["status"] == "ok"
    assert lab.run_lab(lab_dir, "full", stream=io.StringIO())["steps"][0]["status"] == "ok"  # rerun: its folder cleaned
    assert model.is_file()
    lab.run_lab(lab_dir, "full", fresh=True, only=["one"], stream=io.StringIO())  # one step afresh: the store stays
    assert model.is_file()
    lab.run_lab(lab_dir, "full", fresh=True, stream=io.StringIO())  # everything afresh: every lab model trained again
    assert not (lab_dir / "models").exists() and (folder / "results.json").is_file()


@pytest.mark.parametrize("bad", ["file", "under-a-file"])
def test_a_bad_models_folder_is_one_line(bad, tmp_path, capsys):
    file = tmp_path / "a-file"
    file.write_text("x")
    models = file if bad == "file" else file / "models"
    assert main(["experiment", "params", "--models", str(models), "--out", str(tmp_path / "e")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--models" in err[0] and repr(str(models)) in err[0], err
    assert "is a file, not a folder" in err[0]
    assert not (tmp_path / "e" / "results.json").exists()


def _own_run(folder: Path, name: str, tiny_base: dict) -> dict[str, bytes]:
    """A run a user trained at ``folder/name`` with a config of their own (not a lab model's); its files' bytes."""
    from poslab.session import train
    from poslab.training.config import TrainConfig

    train(TrainConfig.from_dict({**tiny_base, "name": name, "out_dir": str(folder)}), progress=False)
    return _contents(folder / name)


def _contents(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def _no_training(*args, **kwargs):
    raise AssertionError("the lab trained over a run it did not make")


def test_a_run_the_lab_did_not_make_in_a_models_folder_is_never_replaced(tmp_path, tiny_base, monkeypatch):
    store = tmp_path / "my-models"  # --models DIR: a folder of the user's own runs
    before = _own_run(store / "smoke", "rope", tiny_base)
    monkeypatch.setattr("poslab.session.train", _no_training)
    with pytest.raises(FileExistsError) as refused:
        _toy("mine").run(tmp_path / "experiment", workers=1, models=store)
    message = str(refused.value)
    assert "\n" not in message and repr(str(store / "smoke" / "rope")) in message, message
    assert "the lab replaces only runs it made" in message and "move it away" in message
    assert _contents(store / "smoke" / "rope") == before


@pytest.mark.parametrize("made_by", ["lab", "experiment"])
def test_a_lab_run_with_a_changed_recipe_is_trained_again_and_one_put_in_its_place_is_not(
    made_by, tmp_path, tiny_base, monkeypatch
):
    """A store as a lab (``lab.json``) or an experiment (its ``results.json``) made it, with no records:
    the lab's run is retrained after a recipe change; a user's run put at its name afterwards is the user's."""
    if made_by == "lab":
        store = tmp_path / "lab" / "models"
        models, marker = store, (tmp_path / "lab" / "lab.json", "{}")

        def out(name: str) -> Path:
            return tmp_path / "lab" / "experiments" / name
    else:
        store = tmp_path / "experiment" / "models"
        models, marker = None, (tmp_path / "experiment" / "results.json", '{"experiment": "first"}')

        def out(name: str) -> Path:
            return tmp_path / "experiment"  # one experiment's folder, run again with its own store

    _toy("first").run(out("first"), workers=1, models=models)
    shutil.rmtree(store / ".lab-runs", ignore_errors=True)  # a store without records
    marker[0].write_text(marker[1])
    calls = []
    monkeypatch.setattr(
        "poslab.lab.experiments.training.train_or_resume", lambda cfg, progress=False: calls.append(cfg)
    )
    longer = dataclasses.replace(SMOKE, steps=SMOKE.steps + 1)
    _toy("second", longer).run(out("second"), workers=1, models=models)
    assert [(c.run_dir, c.max_steps) for c in calls] == [(store / "smoke" / "rope", SMOKE.steps + 1)]

    shutil.rmtree(store / "smoke" / "rope")
    before = _own_run(store / "smoke", "rope", tiny_base)
    with pytest.raises(FileExistsError, match="the lab replaces only runs it made"):
        _toy("third", longer).run(out("third"), workers=1, models=models)
    assert len(calls) == 1 and _contents(store / "smoke" / "rope") == before


def test_a_run_the_lab_did_not_make_in_an_experiment_runs_folder_is_never_replaced(tmp_path, tiny_base, monkeypatch):
    from poslab.lab.experiments.declaration import ensure_runs, seeded_arms

    out = tmp_path / "experiment"
    before = _own_run(out / "runs", "a-s3", tiny_base)
    plan = Plan(None, seeded_arms(out, {**tiny_base, "max_steps": 4}, {"a": {"max_steps": 5}}, {"a": (3,)}))
    monkeypatch.setattr("poslab.session.train", _no_training)
    with pytest.raises(FileExistsError, match="the lab replaces only runs it made"):
        ensure_runs(plan, workers=1)
    assert _contents(out / "runs" / "a-s3") == before


def test_the_cli_refuses_a_run_it_did_not_make_in_models_with_one_line(tmp_path, tiny_base, monkeypatch, capsys):
    store = tmp_path / "my-models"
    before = _own_run(store / "smoke", "rope", tiny_base)
    monkeypatch.setattr("poslab.session.train", _no_training)
    capsys.readouterr()  # the user's training's own output
    argv = ["experiment", "extrapolation", "--size", "smoke", "--workers", "1", "--models", str(store)]
    assert main([*argv, "--out", str(tmp_path / "e")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and repr(str(store / "smoke" / "rope")) in err[0], err
    assert "move it away" in err[0] and "--models" in err[0]
    assert _contents(store / "smoke" / "rope") == before and not (tmp_path / "e" / "results.json").exists()
