"""YAML and JSON from users and files, read by one guarded loader (``poslab.safe_load``): deep nesting
and alias bombs are refused in one line naming the value and the limit, before they cost anything;
ordinary aliases still load.

The figures go to ``test-artifacts/reliability.json`` under ``inputs`` and ``hostile_inputs``.
"""

from __future__ import annotations

import pytest
from cli_helpers import DRY, answered, refused, tally
from conftest import alias_bomb
from run_helpers import rewrite_config

from poslab.cli.app import main
from poslab.data import safe_yaml
from poslab.training import checkpoint as ckpt

pytestmark = pytest.mark.usefixtures("single_thread", "hostile_figures", "input_figures")


# ------------------------------------------------------------------------------------------ YAML alias bombs
def bomb(levels: int = 9, width: int = 9) -> str:
    """About 500 bytes whose ``description`` expands to ``width ** levels`` strings (9^9 = 387 million)."""
    lines = ["description:", f"  - &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"  - &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_bomb_is_small():
    assert len(bomb()) < 600


def test_sweep_file_alias_bomb_is_refused(tmp_path, capsys):
    """Refused before ``--dry-run`` describes it: ``str(description)`` would walk 9^9 strings (gigabytes)."""
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb() + "preset: tiny\ngrid:\n  seed: [1]\n")
    assert main(["sweep", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "expands to more than 100,000 values through its aliases" in err and "bomb.yaml" in err
    assert len(err.strip().splitlines()) == 1
    tally()


def test_preset_file_alias_bomb_is_refused_by_the_same_guard(tmp_path, capsys):
    path = tmp_path / "bomb.yaml"
    path.write_text(
        "config:\n  corpus: shakespeare\n"
        + bomb().replace("description:", "  model:\n    position_config:\n      x:").replace("\n  - ", "\n        - ")
    )
    assert main(["train", "--preset", str(path), "--dry-run"]) == 2
    assert "expands to more than 100,000 values" in capsys.readouterr().err
    tally()


def test_recursive_alias_is_refused(tmp_path):
    with pytest.raises(ValueError, match="refers to itself"):
        safe_yaml.load("a: &a [1, *a]\n", "x.yaml")
    tally()


def test_ordinary_aliases_still_load():
    text = "base: &b {lr: 0.001, n: [1, 2]}\nrun1: *b\nrun2: {<<: *b, lr: 0.01}\n"
    assert safe_yaml.load(text, "x") == {
        "base": {"lr": 0.001, "n": [1, 2]},
        "run1": {"lr": 0.001, "n": [1, 2]},
        "run2": {"lr": 0.01, "n": [1, 2]},
    }


def test_expanded_size_counts_every_reference():
    import yaml

    node = yaml.compose("a: &x [1, 2, 3]\nb: [*x, *x]\n")
    # mapping 1 + key a 1 + [1,2,3] 4 + key b 1 + [*x, *x] (1 + 2 * 4)
    assert safe_yaml.expanded_size(node, 10**6) == 1 + 1 + 4 + 1 + 1 + 2 * 4


# ------------------------------------------------------------------------------------------ deep nesting
DEEP = "[" * 5000 + "]" * 5000


@pytest.mark.parametrize(
    "key", ["model.position_config", "model.position_config.base", "model.layer_pattern", "model.mla"]
)
def test_deeply_nested_cli_values_are_one_line(key, capsys):
    refused(capsys, [*DRY, f"--{key}", DEEP], f"--{key}", "nested more than 100 levels")


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "metrics.jsonl", "peak.json", "checkpoint"])
def test_deeply_nested_run_files_are_one_line(run, name, capsys):
    deep = "[" * 200_000 + "]" * 200_000
    if name == "checkpoint":
        (path,) = (run / ckpt.CHECKPOINT_DIR).glob("*.json")
    else:
        path = run / name
    path.write_text(deep + ("\n" if name == "metrics.jsonl" else ""), encoding="utf-8")
    if name == "tokenizer.json":  # consistent: the digest in config.json matches
        digest = ckpt.sha256_file(path)
        rewrite_config(run, lambda doc: {**doc, "data": {**doc["data"], "tokenizer_sha256": digest}})
    if name in ("metrics.jsonl", "peak.json"):  # readers that skip a damaged file: no traceback
        from poslab.runs import RunFolder

        folder = RunFolder(run)
        if name == "metrics.jsonl":
            assert folder.metrics() == []
        else:
            assert folder.matmul_peak("k", lambda: 2.0) == 2.0  # measured again, the damaged cache replaced
        answered()
        return
    refused(capsys, ["sample", str(run), "--tokens", "2"], "nested more than 100 levels")


def test_deeply_nested_longrope_file_is_one_line(run, tmp_path, capsys):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000, encoding="utf-8")
    refused(
        capsys,
        ["eval", str(run), "--rope-scaling", f"longrope:{deep}", "--lengths", "16"],
        "nested more than 100 levels",
    )


@pytest.mark.parametrize("key", ["model.position_config.base", "model.position_config", "model.layer_pattern"])
def test_an_alias_bomb_in_a_cli_value_is_refused_at_once(key, capsys):
    assert len(alias_bomb()) < 400
    value = alias_bomb() if key != "model.layer_pattern" else f"[{alias_bomb()}]"
    refused(capsys, [*DRY, f"--{key}", value], f"--{key}", "more than 100,000 values through its aliases")
