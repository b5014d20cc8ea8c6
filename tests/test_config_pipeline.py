"""The one config pipeline (poslab/config.py): one ``coerce``, one dotted-key parser for the CLI and
sweeps, one pre-flight for ``--dry-run`` and sweeps, a typed ``TrainConfig.model``, the scheme built once."""

from __future__ import annotations

import pytest

from poslab.cli.app import main
from poslab.config import nest, parse_overrides, preflight
from poslab.config_keys import coerce
from poslab.data import load_corpus
from poslab.jobs.sweep import load_plan
from poslab.nn import positions
from poslab.nn.model import GPTConfig
from poslab.session import train
from poslab.training.config import TrainConfig

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.mark.parametrize(
    ("text", "hint", "value"),
    [
        ("20", int, 20),
        ("3e-4", float, 3e-4),
        ("2", float, 2.0),
        ("none", int | None, None),
        ("off", bool, False),
        ("yes", bool, True),
        ("rope", str, "rope"),
        ('{"base": 500}', dict, {"base": 500}),
    ],
)
def test_coerce_from_text(text, hint, value):
    assert coerce("k", text, hint, text=True) == value


@pytest.mark.parametrize(
    ("value", "hint", "error", "match"),
    [
        (True, int, TypeError, "k must be an integer, got True"),
        ("3", int, TypeError, "k must be an integer"),
        (float("nan"), float, ValueError, "k must be finite"),
        ([1], dict, TypeError, "k must be dict"),
    ],
)
def test_coerce_checks_typed_values(value, hint, error, match):
    with pytest.raises(error, match=match):
        coerce("k", value, hint)


@pytest.mark.parametrize(
    ("text", "hint", "match"),
    [
        ("fast", float, "--k expects a number, got 'fast'"),
        ("2.5", int, "--k expects an integer, got '2.5'"),
        ("maybe", bool, "--k expects true or false"),
        ("[1, 2]", dict, "--k expects a mapping"),
        ("nan", float, "k must be finite"),
    ],
)
def test_coerce_refuses_bad_text(text, hint, match):
    with pytest.raises(ValueError, match=match):
        coerce("k", text, hint, text=True)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1e308", 1e308), ("500", 500), ("010", 10), ("-2.5", -2.5), (".5", 0.5), ("1E-3", 1e-3), ("yarn", "yarn")],
)
def test_a_position_config_number_follows_the_command_lines_decimal_rule(text, expected):
    """``--model.position_config.base 1e308`` is the float 1e308 (YAML 1.1 reads it as a string), as
    ``--lr 1e308`` is; ``010`` is ten as for an integer field, not YAML's octal eight."""
    value = parse_overrides(["--model.position_config.base", text])["model"]["position_config"]["base"]
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("text", ["0x10", "1_000", "0o17", "0b101", "1_0.5", "1:30"])
@pytest.mark.parametrize("key", ["model.position_config.base", "max_steps", "lr"])
def test_numbers_in_other_notations_are_refused_by_one_rule(key, text):
    """Hex, octal, binary and ``_`` separators were read as numbers in one place (YAML: 0x10 -> 16) and
    refused or read otherwise in another: every numeric command-line value refuses them in one line."""
    with pytest.raises(ValueError, match=rf"--{key} expects a decimal number such as 1000, 0.5 or 1e308, got '{text}'"):
        parse_overrides([f"--{key}", text])


def test_train_config_and_cli_share_coerce():
    """The same bad value gets the same check from the dataclass and from the command line."""
    with pytest.raises(ValueError, match="lr must be finite"):
        TrainConfig(name="a", lr=float("inf"))
    with pytest.raises(ValueError, match="lr must be finite"):
        parse_overrides(["--lr", "inf"])


def test_cli_and_sweep_share_the_dotted_parser(tmp_path):
    cli = parse_overrides(
        ["--model.position", "rope", "--model.position_config.base", "500", "--seed", "2", "--model.n_layer", "1"]
    )
    sweep_style = nest(
        [("model.position", "rope"), ("model.position_config.base", 500), ("seed", 2), ("model", {"n_layer": 1})]
    )
    assert (
        cli == sweep_style == {"model": {"position": "rope", "position_config": {"base": 500}, "n_layer": 1}, "seed": 2}
    )
    path = tmp_path / "s.yaml"
    path.write_text("preset: tiny\ngrid:\n  model.positon: [rope]\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"unknown training key 'model.positon' \(did you mean 'model.position'\?\)"):
        load_plan(path)
    with pytest.raises(ValueError, match=r"unknown key --model.positon \(did you mean --model.position\?\)"):
        parse_overrides(["--model.positon", "rope"])


def test_dry_run_and_sweep_share_the_preflight(tmp_path, capsys):
    missing = tmp_path / "no-such-corpus.txt"
    expected = f"corpus {str(missing)!r} is neither a shipped corpus"
    assert main(["train", "--preset", "tiny", "--corpus", str(missing), "--out_dir", str(tmp_path), "--dry-run"]) == 2
    assert expected in capsys.readouterr().err
    path = tmp_path / "s.yaml"
    path.write_text(f"preset: tiny\noverrides:\n  corpus: {missing}\ngrid:\n  seed: [1]\n", encoding="utf-8")
    with pytest.raises(ValueError, match="neither a shipped corpus"):
        load_plan(path)
    with pytest.raises(ValueError, match="tokenizer"):
        preflight(TrainConfig(name="a", tokenizer="words"), folder=False)


def test_train_config_model_is_a_gpt_config():
    cfg = TrainConfig.from_dict({"name": "a", "model": {"n_layer": 1, "position": "rope"}})
    assert isinstance(cfg.model, GPTConfig) and cfg.model.n_layer == 1 and cfg.model.position == "rope"
    again = TrainConfig.from_dict(cfg.to_dict())
    assert again == cfg and "vocab_size" not in cfg.to_dict()["model"]
    with pytest.raises(ValueError, match="model.vocab_size is set from the tokenizer"):
        TrainConfig(name="a", model={"vocab_size": 10})
    with pytest.raises(ValueError, match=r"unknown model key 'model.n_heads' \(did you mean 'model.n_head'\?\)"):
        TrainConfig(name="a", model={"n_heads": 2})
    # the model is checked when the training config is built, not only when training starts
    with pytest.raises(ValueError, match="not divisible by n_heads=3"):
        TrainConfig(name="a", model={"n_head": 3, "n_embd": 16})


def test_the_scheme_is_built_once_per_run_not_per_checkpoint(tmp_path, monkeypatch):
    corpus = tmp_path / "c.txt"
    corpus.write_text(load_corpus("tang5")[:20_000], encoding="utf-8")
    builds = []
    real = positions.build_for_model

    def counting(*args, **kwargs):
        builds.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(positions, "build_for_model", counting)

    def count(ckpt_interval: int) -> int:
        builds.clear()
        cfg = TrainConfig.from_dict(
            {
                "name": f"c{ckpt_interval}",
                "out_dir": str(tmp_path),
                "corpus": str(corpus),
                "max_steps": 6,
                "batch_size": 2,
                "warmup_steps": 1,
                "eval_interval": 6,
                "eval_iters": 1,
                "ckpt_interval": ckpt_interval,
                "threads": 1,
                "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 8, "position": "rope"},
            }
        )
        train(cfg, progress=False)
        return len(builds)

    once, every_step = count(0), count(1)
    assert every_step == once  # six checkpoints build no more schemes than one
    assert once <= 2  # the config's validation (meta device) and the model's own
