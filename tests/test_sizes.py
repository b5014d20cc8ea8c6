"""``poslab.lab.scale``: the training experiments' size table, extended from the command line."""

from __future__ import annotations

import re
import types

import pytest

from poslab.cli.app import main
from poslab.lab import experiments
from poslab.lab import scale as sizes
from poslab.lab.experiments.common import LAB, Experiment, Option


@pytest.fixture
def table():
    """The size table, checked unchanged after the test (defining a size never adds to it)."""
    before = dict(sizes.SIZES)
    yield sizes.SIZES
    assert dict(sizes.SIZES) == before


def test_the_table_is_read_only_and_its_scales_are_built_by_keywords():
    assert list(sizes.SIZES)[:3] == ["smoke", "quick", "full"]
    assert sizes.size_of(True) is sizes.SIZES["quick"] and sizes.size_of(False) is sizes.SIZES["full"]
    quick = sizes.SIZES["quick"]
    assert quick.n_targets == quick.eval_windows * 16 * quick.train_length
    with pytest.raises(TypeError):
        sizes.SIZES["mine"] = quick  # type: ignore[index]
    with pytest.raises(TypeError):
        sizes.Scale("x", 16, 1, 2, 16, 8, 4, 3e-3, 2)  # type: ignore[misc]


def test_a_learned_table_has_rows_for_the_longest_evaluated_length(tmp_path):
    """The extrapolation models are read at every factor of the size table: a learned table must reach
    the longest of those lengths (training reads its first ``L`` rows), a relative scheme needs none."""
    quick = sizes.SIZES["quick"]
    longest = max(sizes.EXTRAPOLATION_FACTORS) * quick.train_length
    learned = sizes.train_config("learned", quick, tmp_path)
    assert learned.model.block_size == quick.train_length
    assert learned.model.position_config["max_len"] == longest
    assert "max_len" not in sizes.train_config("rope", quick, tmp_path).model.position_config


def test_a_user_defines_a_size_from_a_base(table):
    deep = sizes.define_size("deep=quick,n_layer=4,steps=600,lr=1e-3")
    assert (deep.name, deep.n_layer, deep.steps, deep.lr) == ("deep", 4, 600, 1e-3)
    assert deep.n_embd == table["quick"].n_embd  # the rest from the base
    assert "deep" not in table and sizes.size_of(False, deep) is deep  # the scale itself goes to the experiments
    mine = table.with_scale(deep)  # a user's table: the lab's and the new size
    assert list(mine) == [*table, "deep"] and mine["quick"] is table["quick"]
    assert sizes.define_size("deep", mine) is deep and sizes.size_of(False, "deep", mine) is deep
    assert sizes.define_size("deep=quick,n_layer=4,steps=600,lr=1e-3", mine) == deep  # the same definition: fine
    with pytest.raises(ValueError, match="'deep' is already the size"):
        sizes.define_size("deep=quick,n_layer=2", mine)
    with pytest.raises(ValueError, match="'deep' is already the size"):
        mine.with_scale(sizes.define_size("deep=smoke"))
    wide = sizes.define_size("wide=deep,n_embd=128", mine)  # a user's size is a base too
    assert (wide.n_layer, wide.n_embd, wide.steps) == (4, 128, 600)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("x=nope", "unknown base size 'nope'; choose one of smoke, quick, full"),
        ("x=quick,depth=4", "'depth=4' must be FIELD=VALUE with FIELD one of train_length, n_layer"),
        ("x=quick,n_layer", "'n_layer' must be FIELD=VALUE"),
        ("x=quick,n_layer=2.5", "n_layer must be an integer from 1 to 1,024, got '2.5'"),
        ("x=quick,lr=fast", "lr must be a number, got 'fast'"),
        ("x=quick,steps=0", "steps must be an integer from 1 to 10,000,000, got '0'"),
        ("x=quick,n_head=3", "n_head=3 must divide n_embd=64"),
        ("x=quick,n_embd=7", "n_head=4 must divide n_embd=7"),
        ("x=quick,n_embd=68", "the head width n_embd / n_head = 17 must be even"),
        ("x=quick,lr=inf", "lr must be a finite number in (0, 10], got 'inf'"),
        ("x=quick,lr=1e308", "lr must be a finite number in (0, 10], got '1e308'"),
        ("x=quick,lr=nan", "lr must be a finite number in (0, 10], got 'nan'"),
        ("x=quick,lr=-1e-3", "lr must be a finite number in (0, 10], got '-1e-3'"),
        (f"x=quick,n_layer={2**63}", f"n_layer must be an integer from 1 to 1,024, got '{2**63}'"),
        ("x=quick,train_length=1000000000", "train_length must be an integer from 1 to 65,536, got '1000000000'"),
        ("x=quick,train_length=1e9", "train_length must be an integer from 1 to 65,536, got '1e9'"),
        ("x=quick,steps=1e30", "steps must be an integer from 1 to 10,000,000, got '1e30'"),
        ("x=quick,steps=٣", "steps must be an integer from 1 to 10,000,000, got '٣'"),
        ("x\u202e=quick", "the name 'x\\u202e' must be a plain folder name: 1 to 64 of A-Z a-z 0-9"),
        ("x\ny=quick", "the name 'x\\ny' must be a plain folder name"),
        ("a" * 5000 + "=quick", "must be a plain folder name"),
        ("quick=smoke", "'quick' is already the size"),
        ("../x=quick", "must be a plain folder name"),
        ("nope", "unknown size 'nope'; choose one of smoke, quick, full"),
    ],
)
def test_bad_sizes_are_refused_naming_the_value(table, spec, message):
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        sizes.define_size(spec)
    assert "\n" not in str(err.value) and len(str(err.value)) < 400  # one readable line


@pytest.mark.parametrize(
    "spec, rule",
    [
        ("x=smoke,lr=nan", "lr must be a finite number in (0, 10]"),
        ("x=smoke,n_head=3", "n_head=3 must divide n_embd=16"),
        ("x=smoke,steps=1e30", "steps must be an integer from 1 to 10,000,000"),
        ("x\u202e=smoke", "must be a plain folder name"),
    ],
)
def test_lab_refuses_a_bad_size_before_any_step(table, tmp_path, capsys, spec, rule):
    assert main(["lab", "--out", str(tmp_path / "lab"), "--size", spec, "--only", "params"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("poslab: error: --size ") and err.count("\n") == 1 and rule in err, err
    assert not (tmp_path / "lab" / "experiments").exists()


def test_experiment_size_reaches_the_experiments_that_take_one(table, monkeypatch, tmp_path, capsys):
    seen = {}

    def run(out, quick=False, size=None):
        seen["size"] = size
        return {}

    sized = Experiment("sized", "a stand-in with sizes", LAB, run, options=frozenset({Option.SIZE}))
    fake = types.SimpleNamespace(EXPERIMENT=sized)
    plain = types.SimpleNamespace(
        EXPERIMENT=Experiment("plain", "a stand-in without", LAB, lambda out, quick=False: {})
    )
    monkeypatch.setattr(experiments, "registry", lambda: {"sized": fake, "plain": plain})
    assert main(["experiment", "sized", "--size", "mine=smoke,steps=3", "--out", str(tmp_path / "a")]) == 0
    assert seen == {"size": sizes.define_size("mine=smoke,steps=3")} and seen["size"].steps == 3
    assert main(["experiment", "plain", "--size", "quick", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["poslab: error: --size 'quick': experiment 'plain' has no sizes (those with sizes: sized)"]


def test_every_sized_experiment_builds_its_configs_at_the_gpu_sizes(tmp_path):
    """The GPU sizes train on CUDA, and every lab scheme's config (and context extension's fine-tunes) builds at
    them."""
    import inspect

    from poslab.lab.experiments import context_extension
    from poslab.lab.experiments.lab_models import LabModel

    sized = [n for n, e in experiments.descriptions().items() if "size" in inspect.signature(e.run).parameters]
    assert sized == ["extrapolation", "context-extension", "attention-entropy"]
    for name in ("gpu", "gpu-large"):
        size = sizes.size_of(False, name)
        assert size.device == "cuda" and size.train_length == 256
        for scheme in sizes.SCHEMES:  # extrapolation and attention-entropy train these
            cfg = sizes.train_config(scheme, size, tmp_path)
            assert cfg.device == "cuda" and cfg.model.block_size == 256 and cfg.max_steps == size.steps
        base = LabModel("rope", size, 1337).config(tmp_path)
        tuned = context_extension.finetune_config("PI", "linear:4", size, tmp_path / "base", tmp_path)
        assert base.device == tuned.device == "cuda" and tuned.model.block_size == 4 * 256
    assert (sizes.SIZES["gpu"].n_layer, sizes.SIZES["gpu"].n_head, sizes.SIZES["gpu"].n_embd) == (6, 6, 384)
    assert (sizes.SIZES["gpu-large"].n_layer, sizes.SIZES["gpu-large"].n_head, sizes.SIZES["gpu-large"].n_embd) == (
        12,
        12,
        768,
    )
    assert {sizes.SIZES[n].device for n in ("smoke", "quick", "full")} == {"auto"}


def test_a_size_can_change_its_device(table):
    cpu = sizes.define_size("gpu-on-cpu=gpu,steps=10,device=cpu")
    assert (cpu.device, cpu.steps, cpu.n_embd) == ("cpu", 10, 384)
    with pytest.raises(ValueError, match="device must be one of auto, cpu, cuda, got 'tpu'"):
        sizes.define_size("x=gpu,device=tpu")


@pytest.mark.parametrize(
    ("changes", "rule"),
    [
        ({"steps": 0}, "steps 0: must be a whole number of at least 1"),
        ({"block_size": 2.5}, "block_size 2.5: must be a whole number of at least 1"),
        ({"batch_size": True}, "batch_size True: must be a whole number of at least 1"),
        ({"warmup_steps": -1}, "warmup_steps -1: must be a whole number of at least 0"),
        ({"lr": float("nan")}, "lr nan: must be a finite number above 0"),
        ({"lr": True}, "lr True: must be a finite number above 0"),
        ({"init_from": ""}, "init_from '': must name a run folder"),
    ],
)
def test_a_bad_change_to_a_lab_recipe_is_one_line(changes, rule):
    with pytest.raises(ValueError, match=re.escape(rule)) as caught:
        sizes.Overrides(**changes)
    assert "\n" not in str(caught.value)


def test_a_lab_run_changes_only_what_its_overrides_name(tmp_path):
    """A continued run: other steps, rate and start; the rest is the size's recipe."""
    quick = sizes.SIZES["quick"]
    plain = sizes.train_config("rope", quick, tmp_path).to_dict()
    changes = sizes.Overrides(steps=quick.steps + 7, lr=quick.lr / 3, init_from=str(tmp_path / "base"))
    continued = sizes.train_config("rope", quick, tmp_path, changes=changes).to_dict()
    differ = {k for k in plain.keys() | continued.keys() if plain.get(k) != continued.get(k)}
    assert differ == {"max_steps", "lr", "min_lr", "init_from", "cooldown_steps", "eval_interval"}
    assert continued["eval_interval"] == (quick.steps + 7) // 5  # other steps: five evaluations
    assert continued["max_steps"] == quick.steps + 7 and continued["lr"] == quick.lr / 3
    assert continued["init_from"] == str(tmp_path / "base") and continued["cooldown_steps"] == 0
