"""Every lesson experiment runs (``poslab experiment all``) and its key numbers hold.

The experiments run once per module, through the CLI entry point, into a temporary folder; the tests
read the ``results.json`` files a user would read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import re

import pytest

from poslab import positions
from poslab.cli.app import main
from poslab.lab import experiments
from poslab.lab.experiments.common import Baselines, baselines_field
from poslab.nn.positions.rope import SCALINGS

NAMES = ("params", "shapes", "rope-relative", "permutation", "causal-leak", "frequencies")


@pytest.fixture(scope="module")
def run_all(tmp_path_factory):
    """Run ``poslab experiment all --out TMP`` once; return (stdout, {name: results.json dict}, TMP)."""
    out = tmp_path_factory.mktemp("experiments")
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = main(["experiment", "all", "--out", str(out)])
    assert code == 0
    results = {name: json.loads((out / name / "results.json").read_text()) for name in NAMES}
    return buffer.getvalue(), results, out


def test_registry_lists_every_experiment_in_all():
    registry = experiments.registry()
    assert set(NAMES) <= set(registry)  # later issues may add experiments
    for name in NAMES:
        module = registry[name]
        assert module.EXPERIMENT.name == name
        assert module.EXPERIMENT.in_all is True
        assert isinstance(module.EXPERIMENT.description, str) and module.EXPERIMENT.description


def test_params(run_all):
    r = run_all[1]["params"]
    assert r["seed000_one_linear_512"] == 262_656
    assert r["seed000_four_linear_512"] == 1_050_624
    assert r["seed000_ratio_four_over_one"] == pytest.approx(4.0, abs=1e-3)
    d = 512
    assert [row["n_heads"] for row in r["multihead_attention_512"]] == [1, 8]
    for row in r["multihead_attention_512"]:
        assert row["total"] == 4 * d * d + 4 * d == 1_050_624
    assert r["seed001_qkv_params_by_heads"] == {"1": 3168, "2": 3168, "4": 3168, "8": 3168}
    assert r["seed001_proj_params_by_heads"] == {"1": 1056, "2": 1056, "4": 1056, "8": 1056}
    gqa = r["gqa_counterpoint_32"]
    assert gqa["n_kv_heads"] < gqa["n_heads"]
    assert gqa["qkv"] == 32 * (8 + 2 * 2) * 4 + (8 + 2 * 2) * 4 == 1584  # fewer kv heads: fewer qkv params
    assert gqa["proj"] == 1056


def test_shapes(run_all):
    r = run_all[1]["shapes"]
    observed = [step["shape"] for step in r["seed000_walk"]]
    assert observed == [
        [2, 10, 512],
        [2, 10, 1536],
        [2, 10, 512],
        [2, 10, 8, 64],
        [2, 8, 10, 64],
        [2, 8, 10, 64],
        [2, 8, 10, 64],
        [2, 8, 10, 10],
        [2, 8, 10, 64],
        [2, 10, 8, 64],
        [2, 10, 512],
        [2, 10, 512],
    ]
    assert r["seed000_all_steps_match_lesson"] is True
    assert [s["submodule"] for s in r["seed000_walk"]][-1] == "proj"
    assert r["seed001_walk"] == {"q": [1, 5, 32], "q_heads": [1, 4, 5, 8], "scores": [1, 4, 5, 5], "output": [1, 5, 32]}


LESSON_ROPE = {0: 2.9839, 1: 2.8449, 2: 1.2160, 4: -0.6933, 8: -2.6004, 16: -3.5409, 32: -2.6989}


def test_rope_relative_reproduces_the_lesson_digit_for_digit(run_all):
    r = run_all[1]["rope-relative"]
    assert [row["offset"] for row in r["lesson_table"]] == list(LESSON_ROPE)
    for row in r["lesson_table"]:
        expected = f"{LESSON_ROPE[row['offset']]:.4f}"
        # every sampled position, not only the three printed, gives the lesson's number
        assert [f"{v:.4f}" for v in row["inner_products_sampled"]] == [expected] * len(row["inner_products_sampled"])
        assert row["spread_over_positions"] < 1e-4  # floating-point level, like the lesson's 1e-6..1e-5
    assert r["poslab_vs_lesson_apply_rope_max_abs_diff"] < 1e-5
    assert r["all_match_lesson_4dp"] is True


def test_rope_relative_holds_for_every_rope_variant_and_fails_for_absolute(run_all):
    checks = run_all[1]["rope-relative"]["scheme_checks"]
    rope_configs = [c["config"] for c in checks if c["scheme"] == "rope"]
    assert {c.get("scaling") for c in rope_configs} == set(SCALINGS)  # every scaling, and none
    assert {c.get("layout", "half") for c in rope_configs} == {"half", "interleaved"}
    assert any(c.get("rotary_dim") for c in rope_configs)
    for check in checks:
        if check["expected_offset_only"]:
            assert check["max_spread_over_positions"] < 1e-4, check["label"]
        else:
            assert check["max_spread_over_positions"] > 1e-3, check["label"]
    by_scheme = {c["scheme"]: c for c in checks if c["scheme"] in ("xpos", "learned", "sinusoidal")}
    assert by_scheme["xpos"]["offset_only"] is True
    assert by_scheme["learned"]["offset_only"] is False
    assert by_scheme["sinusoidal"]["offset_only"] is False
    # (not the experiment's own all_as_expected verdict: the thresholds above decide every row independently)


def test_permutation(run_all):
    r = run_all[1]["permutation"]
    assert r["lesson_raw_matrices"]["max_abs_diff_after_unpermuting"] < 1e-5
    rows = {row["scheme"]: row for row in r["schemes"]}
    assert list(rows) == positions.names()  # one row per registered scheme
    assert rows["none"]["max_abs_diff_after_unpermuting"] < 1e-5
    for name, row in rows.items():
        if positions.get(name).encodes_position:
            assert row["max_abs_diff_after_unpermuting"] > 1e-3, name
    # (not the experiment's own all_as_expected verdict: each row is checked above against the scheme's class)


def test_causal_leak(run_all):
    r = run_all[1]["causal-leak"]
    diffs = r["max_abs_diff_last_logits"]
    assert diffs["1"]["none"] < 1e-6  # one layer, no positions: float noise
    assert diffs["1"]["learned_zeroed"] < 1e-6  # the lesson's own way of removing positions
    assert diffs["2"]["none"] > 1e-4  # the causal mask leaks order from two layers on
    assert diffs["3"]["none"] > 1e-4
    for scheme in ("learned", "rope", "alibi"):
        assert diffs["1"][scheme] > 1e-4, scheme  # positions tell the two lines apart at any depth
    assert r["model"]["n_head"] == 4 and r["model"]["n_embd"] == 128 and r["model"]["trained"] is False


def test_frequencies_table_and_plot(run_all):
    _, results, out = run_all
    r = results["frequencies"]
    table = r["lesson_table_d8_base10000"]
    assert len(table) == 8
    for row in table:
        assert row["inv_freq"] == pytest.approx(10000 ** (-row["dim"] / 8), rel=1e-5)
        assert row["period_positions"] == pytest.approx(2 * math.pi / row["inv_freq"], rel=1e-6)
    # the lesson's slowest pair: 2*pi / 10000^(-7/8) = 19869.2 positions
    assert table[-1]["period_positions"] == pytest.approx(2 * math.pi * 10000 ** (7 / 8), rel=1e-6)
    assert r["poslab_rope_head16_vs_lesson_max_abs_diff"] == 0.0
    # YaRN's correction range (Peng et al. 2023, eq. 17-18) for d=128, base 1e4, L0=2048, beta 32 / 1, floored/ceiled
    d, base, l0 = 128, 1e4, 2048
    low = math.floor(d * math.log(l0 / (32 * 2 * math.pi)) / (2 * math.log(base)))
    high = math.ceil(d * math.log(l0 / (1 * 2 * math.pi)) / (2 * math.log(base)))
    assert (r["yarn_low_pair"], r["yarn_high_pair"]) == (low, high)
    spectra = {s["label"]: s for s in r["scalings"]}
    assert len(spectra) == 7
    assert all(x == pytest.approx(1.0) for x in spectra["none"]["stretch"])
    assert all(x == pytest.approx(4.0, rel=1e-5) for x in spectra["linear (PI)"]["stretch"])
    yarn = spectra["yarn"]["stretch"]
    assert yarn[: r["yarn_low_pair"]] == pytest.approx([1.0] * r["yarn_low_pair"])  # high frequencies kept
    assert yarn[r["yarn_high_pair"] :] == pytest.approx([4.0] * (64 - r["yarn_high_pair"]), rel=1e-5)
    assert spectra["yarn"]["attention_factor"] == pytest.approx(0.1 * math.log(4) + 1)
    assert spectra["llama3"]["stretch"][0] == pytest.approx(1.0) and spectra["llama3"]["stretch"][-1] == pytest.approx(
        4.0
    )
    ntk = spectra["ntk (static)"]["stretch"]
    assert ntk[0] == pytest.approx(1.0) and ntk[-1] == pytest.approx(4.0, rel=1e-4)
    assert all(a < b for a, b in zip(ntk, ntk[1:]))

    png = out / "frequencies" / "rope_scaling_spectrum.png"
    assert png.is_file() and png.stat().st_size > 10_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from matplotlib import image

    pixels = image.imread(png)
    assert pixels.ndim == 3 and pixels.shape[0] > 200 and pixels.shape[1] > 400
    assert pixels.std() > 0.01  # not a blank canvas


RESULT_KEYS = {
    "params": {
        "seed000_one_linear_512",
        "seed000_four_linear_512",
        "seed000_ratio_four_over_one",
        "formula_4d2_plus_4d_512",
        "multihead_attention_512",
        "seed001_multihead_attention_32",
        "seed001_qkv_params_by_heads",
        "seed001_proj_params_by_heads",
        "gqa_counterpoint_32",
    },
    "shapes": {"seed000_walk", "seed000_all_steps_match_lesson", "seed001_walk"},
    "rope-relative": {
        "head_dim",
        "positions",
        "sample_stride",
        "offset_only_tolerance",
        "poslab_vs_lesson_apply_rope_max_abs_diff",
        "lesson_table",
        "all_match_lesson_4dp",
        "scheme_checks",
        "all_as_expected",
    },
    "permutation": {
        "equivariant_below",
        "broken_above",
        "attention",
        "lesson_raw_matrices",
        "schemes",
        "all_as_expected",
    },
    "causal-leak": {
        "lines",
        "model",
        "max_abs_diff_last_logits",
        "noise_below",
        "leak_above",
        "one_layer_no_positions_is_noise",
        "two_plus_layers_no_positions_leak",
        "lesson_printout",
    },
    "frequencies": {
        "lesson_table_d8_base10000",
        "poslab_rope_head16_vs_lesson_max_abs_diff",
        "realistic_head",
        "yarn_low_pair",
        "yarn_high_pair",
        "scalings",
        "plot",
    },
}


@pytest.mark.parametrize("name", NAMES)
def test_results_json_keys(run_all, name):
    assert set(run_all[1][name]) == RESULT_KEYS[name] | {"claims"}  # every experiment decides its own claims
    assert run_all[1][name]["claims"] and all(c["verdict"] == "held" for c in run_all[1][name]["claims"])
    assert not list((run_all[2] / name).glob("*.tmp*"))  # atomic writes leave no temp files


def test_printed_tables(run_all):
    stdout = run_all[0]
    for value in (
        "262,656",
        "1,050,624",
        "3168",
        "1056",
        "2.9839",
        "-3.5409",
        "-2.6989",
        "(1, 4, 5, 8)",
        "白日依山尽",
        "19869.2",
    ):
        assert value in stdout, value
    for name in NAMES:
        assert f"=== experiment {name}:" in stdout
    # no table cell says a check failed ("NO", "UNEXPECTED"); a premise column may say "NOT MET"
    assert "UNEXPECTED" not in stdout and not re.search(r" NO(\s|$)", stdout, re.M)


def test_run_experiment_default_folder_and_unknown_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with contextlib.redirect_stdout(io.StringIO()):
        results = experiments.run_experiment("params")
    written = json.loads((tmp_path / "runs" / "experiments" / "params" / "results.json").read_text())
    assert written == json.loads(json.dumps(results))
    with pytest.raises(ValueError, match="unknown experiment 'nope'.*params"):
        experiments.run_experiment("nope")


def test_every_experiment_is_described_once_and_the_lab_plans_from_the_descriptions(tmp_path):
    from poslab.lab import lab
    from poslab.lab.experiments.common import FOUNDATION, FULL_ONLY, LAB, Experiment

    described = experiments.descriptions()
    assert list(described) == list(experiments.registry())
    for module in experiments.registry().values():
        assert isinstance(module.EXPERIMENT, Experiment) and module.EXPERIMENT.run is module.run
    quick = {s.name: s for s in lab.plan(tmp_path, "quick")}
    full = {s.name: s for s in lab.plan(tmp_path, "full")}
    assert set(quick) == {n for n, e in described.items() if e.tier in (FOUNDATION, LAB)}
    assert set(full) == set(described)
    for name, step in full.items():
        e = described[name]
        assert step.needs == tuple(f"experiments/{n}" for n in e.after) and step.estimate == e.estimate[1]
        if name in quick:
            assert quick[name].estimate == e.estimate[0]
    assert [n for n in quick if described[n].tier == FOUNDATION] == [n for n in quick][
        : len(experiments.descriptions(FOUNDATION))
    ]
    assert set(experiments.descriptions(FULL_ONLY)) == set(full) - set(quick)
    with pytest.raises(ValueError, match="tier must be one of"):
        Experiment("x", "y", "sometimes", run=lambda out, quick=False: {})
    with pytest.raises(ValueError, match="tier must be one of"):
        experiments.descriptions("sometimes")


TOY_EXPERIMENT = '''
"""A toy experiment: one module, as docs/architecture.md's recipe "add an experiment" writes it."""
from dataclasses import dataclass
from pathlib import Path

from poslab.lab.experiments.common import LAB
from poslab.lab.experiments.declaration import Declaration, Plan, Runs, declare, seeded_arms
from poslab.lab.tables import KeyTable, MeanSd, Table
from poslab.lab.verdicts import Arm, ClaimRecord, Metric, paired

BASE = {"corpus": CORPUS_FILE, "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16}, "max_steps": 4,
        "batch_size": 2, "warmup_steps": 1, "eval_interval": 2, "eval_iters": 1, "ckpt_interval": 0, "threads": 1}
SEEDS = (3, 4, 5)


@dataclass(frozen=True)
class ToyResult:
    losses: dict[str, list[float]]  # arm -> whole-split validation loss of each seed


def plan(out: Path, quick: bool) -> Plan[None]:
    arms = {"rope": {"model": {"position": "rope"}}, "none": {"model": {"position": "none"}}}
    return Plan(None, seeded_arms(out, BASE, arms, {arm: SEEDS for arm in arms}))


def measure(runs: Runs[None]) -> ToyResult:
    return ToyResult({arm: [s.val_loss_all for s in runs.summaries(arm)] for arm in runs.by_arm})


def claims(r: ToyResult) -> list[ClaimRecord]:
    rope, none = r.losses["rope"], r.losses["none"]
    return [paired("toy: rope beats no positions", "a toy source", Arm("rope", rope, SEEDS),
                   Arm("none", none, SEEDS), Metric("loss"))]


def table(r: ToyResult) -> Table:
    return Table("toy losses", ("arm", "val loss"), tuple((arm, MeanSd.of(v)) for arm, v in r.losses.items()))


TABLES = (KeyTable("toy losses", table),)
EXPERIMENT = declare("toy", "a toy", LAB, Declaration(ToyResult, plan, measure, claims, TABLES))
'''


def test_an_experiment_is_one_module_and_one_registry_line(tmp_path, monkeypatch, corpus, capsys):
    """The recipe of docs/architecture.md: a declared experiment (arms, measure, claims, a table) plus its line in
    ``_MODULES`` trains its arms, reaches the experiment list, the plan (families, Holm, power), results.json and the
    report's table, with no other edit; a results.json whose field the table reads is renamed makes the report name
    the table and the field instead of dropping it."""
    from poslab.lab.report import build_report

    module = TOY_EXPERIMENT.replace("CORPUS_FILE", repr(corpus))
    (tmp_path / "toy_experiment.py").write_text(module, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(experiments, "_MODULES", (*experiments._MODULES, "toy_experiment"))
    assert "toy" in experiments.descriptions()
    out = tmp_path / "lab" / "experiments" / "toy"
    results = experiments.run_experiment("toy", out, workers=1)
    trained = sorted(p.name for p in (out / "runs").iterdir())
    assert trained == [f"{arm}-s{seed}" for arm in ("none", "rope") for seed in (3, 4, 5)]
    assert all((out / "runs" / p / "results.json").is_file() for p in ("rope-s3", "none-s5"))  # trained
    printed = capsys.readouterr().out
    assert "toy losses" in printed and "cannot be built" not in printed  # the pipeline printed the typed table
    written = json.loads((out / "results.json").read_text())
    assert written["losses"] == results["losses"] and len(written["losses"]["rope"]) == 3
    record = written["claims"][0]
    assert record == results["claims"][0] and record["details"]["better"] == written["losses"]["rope"]
    assert record["design"]["family"] == "toy" and record["details"]["holm"]["m"] == 1
    assert "power" in record["details"]
    html = build_report(tmp_path / "lab").read_text(encoding="utf-8")
    assert "<caption>toy losses</caption>" in html and "toy: rope beats no positions" in html

    written["loss"] = written.pop("losses")  # a field renamed: the report names the table, never drops it
    (out / "results.json").write_text(json.dumps(written), encoding="utf-8")
    html = build_report(tmp_path / "lab").read_text(encoding="utf-8")
    assert "<caption>toy losses</caption>" not in html
    assert "the table “toy losses” cannot be built: results.json has no field “losses”" in html


@dataclasses.dataclass(frozen=True)
class _Cell:
    mean: float
    rise: float | None = None


@dataclasses.dataclass(frozen=True)
class _Result:
    cells: dict[str, list[_Cell]]
    curve: list[tuple[int, float]]
    by_seed: dict[int, float]
    label: str | int


def test_a_typed_result_reads_back_from_its_json_and_names_what_it_lacks():
    """A declared experiment's result is written as JSON (:func:`declaration.to_json`) and read back into its type
    (:func:`declaration.load`) for the report: equal after the round trip; a missing field is a ``KeyError`` naming
    it (the report names the table and the field), a value of another type a ``TypeError``."""
    from poslab.lab.experiments.declaration import load, to_json

    result = _Result({"4": [_Cell(1.5, 0.25), _Cell(2, None)]}, [(0, 3.5), (10, 2.0)], {1337: 0.5}, 7)
    data = json.loads(json.dumps(to_json(result)))
    assert data["by_seed"] == {"1337": 0.5} and data["curve"] == [[0, 3.5], [10, 2.0]]
    assert load(_Result, data) == result
    del data["cells"]["4"][0]["mean"]
    with pytest.raises(KeyError, match="mean"):
        load(_Result, data)
    with pytest.raises(TypeError, match="expected float, got str"):
        load(_Result, {**to_json(result), "by_seed": {"1": "high"}})
    with pytest.raises(TypeError, match="none of its types"):
        load(_Result, {**to_json(result), "label": [1]})


@dataclasses.dataclass(frozen=True)
class Held:
    steps: int
    baselines: Baselines = baselines_field()


def test_a_results_baselines_are_held_inline_and_read_from_the_older_layout():
    """A result's :class:`Baselines` field is written as ``corpus``, ``unigram_entropy_nats`` and ``ngram_baselines``
    among the result's own keys and read back from them; a results.json holding only ``ngram_baselines`` reads
    back too, and one without them names the missing field."""
    from poslab.lab.experiments.declaration import load, to_json

    result = Held(3, Baselines({"bigram": 2.5}, "shakespeare", 3.25))
    data = json.loads(json.dumps(to_json(result)))
    assert data == {
        "steps": 3,
        "ngram_baselines": {"bigram": 2.5},
        "corpus": "shakespeare",
        "unigram_entropy_nats": 3.25,
    }
    assert load(Held, data) == result
    assert load(Held, {"steps": 3, "ngram_baselines": {"bigram": 2.5}}) == Held(3, Baselines({"bigram": 2.5}))
    with pytest.raises(KeyError, match="ngram_baselines"):
        load(Held, {"steps": 3, "corpus": "shakespeare"})


def test_a_plan_follows_its_runs_with_runs_that_start_from_them(tmp_path, corpus, monkeypatch):
    """``Plan.follow``: once the plan's runs are finished, the runs that start from them (a fine-tune initialised
    from its seed's base run, as context extension's) are planned from their folders and trained; both join the
    measurement's runs, and a second pass trains nothing."""
    from poslab.lab.experiments import training
    from poslab.lab.experiments.declaration import Plan, ensure_runs, seeded_arms

    base = {
        "corpus": corpus,
        "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16},
        "max_steps": 2,
        "batch_size": 2,
        "warmup_steps": 1,
        "eval_interval": 2,
        "eval_iters": 1,
        "ckpt_interval": 0,
        "threads": 1,
    }
    seen = []

    def tuned(bases):
        seen.append({seed: run.path for seed, run in bases["base"].items()})
        arms = seeded_arms(tmp_path, {**base, "max_steps": 3}, {"tuned": {}}, {"tuned": (3,)})
        arms["tuned"][3]["init_from"] = str(bases["base"][3].path)
        return Plan(None, arms, summarise=False)

    plan = Plan(None, seeded_arms(tmp_path, base, {"base": {}}, {"base": (3,)}), summarise=False, follow=tuned)
    runs = ensure_runs(plan, workers=1)
    assert seen == [{3: tmp_path / "runs" / "base-s3"}]
    assert set(runs.by_arm) == {"base", "tuned"} and runs.by_arm["tuned"][3].path == tmp_path / "runs" / "tuned-s3"
    config = json.loads((runs.by_arm["tuned"][3].path / "config.json").read_text())
    assert config["train"]["init_from"] == str(tmp_path / "runs" / "base-s3")
    assert (runs.by_arm["tuned"][3].path / "results.json").is_file()

    monkeypatch.setattr(training, "train_or_resume", lambda *a, **k: pytest.fail("trained again"))
    again = ensure_runs(plan, workers=1)
    assert {arm: {s: r.path for s, r in v.items()} for arm, v in again.by_arm.items()} == {
        arm: {s: r.path for s, r in v.items()} for arm, v in runs.by_arm.items()
    }


def test_every_experiment_says_which_options_its_run_takes():
    """``Experiment.options`` is what the CLI and the lab read to pass ``--size``/``--seeds``/``--workers``/
    ``--models``: for every registered experiment it names exactly the keywords its ``run`` accepts."""
    import inspect

    from poslab.lab.experiments.common import Option

    for name, module in experiments.registry().items():
        experiment = module.EXPERIMENT
        accepted = set(inspect.signature(experiment.run).parameters)
        assert {o for o in Option if o.value in accepted} == experiment.options, name
    assert experiments.registry()["extrapolation"].EXPERIMENT.takes(Option.SIZE)
    assert not experiments.registry()["heads"].EXPERIMENT.takes(Option.SIZE)


def test_an_experiment_s_options_are_option_values():
    from poslab.lab.experiments.common import LAB, Experiment

    with pytest.raises(ValueError, match="options must be Option values, got 'size'"):
        Experiment("x", "a stand-in", LAB, lambda out, quick=False: {}, options=frozenset({"size"}))
