"""Fuzzed configs and command lines: every input works or gets a one-line error (exit 2), never a traceback.

Hypothesis generates random keys (real field names and random unicode), values of every JSON/YAML
type (huge integers, NaN/inf, unicode, nested lists and dicts), and "near-valid" inputs (a valid
config with one to three fields replaced), for ``TrainConfig.from_dict``, ``GPTConfig.from_dict`` (a
config it accepts with a small model is also built and run: accepted must mean working), preset
YAML files (random mappings and random text) and ``poslab train`` command lines (in-process through
``poslab.cli.app.main`` with ``--dry-run``, so nothing trains; a few in real subprocesses). Only
``ValueError``/``TypeError`` (and their subclasses) with a one-line message are allowed out of the
Python API; the CLI must return 0 or 2 with a single ``poslab: error: ...`` line on stderr.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import alias_bomb
from fuzz_helpers import COUNTS, WEIRD_TEXT, _settings, deep_values, extreme_numbers, values
from hypothesis import given
from hypothesis import strategies as st

from poslab import GPT, GPTConfig, positions
from poslab.cli.app import main
from poslab.training import presets
from poslab.training.config import TrainConfig

TRAIN_FIELDS = [f.name for f in dataclasses.fields(TrainConfig)]


MODEL_FIELDS = [f.name for f in dataclasses.fields(GPTConfig)]


def _keys(fields: list[str]):
    return st.one_of(st.sampled_from(fields), st.text(max_size=12), st.sampled_from([f + "s" for f in fields]))


def _api(call) -> str:
    """Run ``call``: ``"accepted"``, or ``"rejected"`` for a ValueError/TypeError with a one-line message."""
    COUNTS["cases"] += 1
    try:
        result = call()
    except (ValueError, TypeError) as err:
        message = str(err)
        assert message.strip() and "\n" not in message, repr(message)
        COUNTS["rejected_one_line"] += 1
        return "rejected"
    except BaseException:
        COUNTS["tracebacks"] += 1
        raise
    COUNTS["accepted"] += 1
    return result


# ------------------------------------------------------------------------------------ TrainConfig
TRAIN_BASE = {"name": "fuzz", "max_steps": 10, "batch_size": 2, "model": {"n_layer": 1, "n_head": 2, "n_embd": 16}}


@st.composite
def train_dicts(draw):
    if draw(st.booleans()):  # near-valid: the base with a few fields replaced
        values_ = dict(TRAIN_BASE)
        for key in draw(st.lists(_keys(TRAIN_FIELDS), min_size=1, max_size=3)):
            values_[key] = draw(values)
        return values_
    return draw(st.dictionaries(_keys(TRAIN_FIELDS), values, max_size=6))


def _check_train(values_: dict) -> None:
    cfg = _api(lambda: TrainConfig.from_dict(values_))
    if cfg != "rejected":  # what dry-run and train check next: the model config
        _check_model({**cfg.to_dict()["model"], "vocab_size": 50}, run=False)


def _train_test(slow: bool):
    @_settings("train", slow)
    @given(train_dicts())
    def check(values_):
        _check_train(values_)

    return check


# ------------------------------------------------------------------------------------ GPTConfig
MODEL_BASE = {"vocab_size": 50, "n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16}


SCHEME_FIELDS = sorted(
    {f.name for name in positions.names() for f in dataclasses.fields(positions.get(name).config_class)}
)


@st.composite
def model_dicts(draw):
    choice = draw(st.integers(0, 2))
    if choice == 0:
        return draw(st.dictionaries(_keys(MODEL_FIELDS), values, max_size=6))
    values_ = dict(MODEL_BASE, position=draw(st.sampled_from(positions.names())))
    if choice == 1:
        for key in draw(st.lists(_keys(MODEL_FIELDS), min_size=1, max_size=3)):
            values_[key] = draw(values)
    else:  # a scheme config with random fields
        values_["position_config"] = draw(st.dictionaries(_keys(SCHEME_FIELDS), values, max_size=3))
    return values_


def _check_model(values_: dict, run: bool = True) -> None:
    cfg = _api(lambda: GPTConfig.from_dict(values_))
    if cfg == "rejected" or not run:
        return
    weights = 12 * cfg.n_layer * cfg.n_embd**2 + (cfg.vocab_size + cfg.block_size) * cfg.n_embd
    if weights > 2_000_000 or cfg.block_size > 4096:
        return  # accepted but too big to build here
    torch.manual_seed(0)
    model = GPT(cfg).eval()  # accepted must mean it works
    T = min(cfg.block_size, 8, model.position.max_positions or 8)  # a learned table may be shorter
    with torch.no_grad():
        logits = model(torch.zeros(1, T, dtype=torch.long))
    assert logits.shape == (1, T, cfg.vocab_size) and torch.isfinite(logits).all(), values_
    COUNTS["models_run"] += 1


def _model_test(slow: bool):
    @_settings("model", slow)
    @given(model_dicts())
    def check(values_):
        _check_model(values_)

    return check


# ------------------------------------------------------------------------------------ CLI
def _cli(argv: list[str]) -> int:
    """``poslab.cli.app.main(argv)`` in-process: 0 with anything on stdout, or 2 with one error line."""
    COUNTS["cases"] += 1
    err, out = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                code = main(argv)
            except SystemExit as exit_:  # argparse (--help, a missing value)
                code = exit_.code if isinstance(exit_.code, int) else 2
    except BaseException:
        COUNTS["tracebacks"] += 1
        raise
    lines = err.getvalue().strip().splitlines()
    if code == 0:
        COUNTS["accepted"] += 1
        assert "Traceback" not in err.getvalue()
        return code
    assert code == 2, (argv, code, err.getvalue())
    assert len(lines) == 1 and lines[0].startswith("poslab: error: "), (argv, lines)
    COUNTS["rejected_one_line"] += 1
    return code


FLAGS = [
    "--max_steps",
    "--max-steps",
    "--lr",
    "--batch_size",
    "--dtype",
    "--tokenizer",
    "--corpus",
    "--name",
    "--seed",
    "--threads",
    "--val_fraction",
    "--skip-nonfinite",
    "--model.n_head",
    "--model.n_embd",
    "--model.position",
    "--model.block_size",
    "--model.dropout",
    "--model.attention.window",
    "--model.bias",
    "--model.position_config",
    "--model.position_config.base",
    "--model.position_config.scaling",
    "--quick",
    "--resume",
    "--overwrite",
    "--preset",
    "--model.",
    "--model.position_config.",
    "-x",
    "--",
]


tokens = st.one_of(
    st.sampled_from(FLAGS),
    st.text(max_size=12).map(lambda t: "--" + t),
    st.sampled_from(WEIRD_TEXT),
    st.text(max_size=12),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.floats().map(repr),
)


#: near-valid command lines: a real flag with a plausible (or random) value
PLAUSIBLE = {
    "--max_steps": st.integers(-2, 50).map(str),
    "--lr": st.floats(-1, 1).map(repr),
    "--batch_size": st.integers(-1, 64).map(str),
    "--dtype": st.sampled_from(["fp32", "bf16", "fp16", "FP32"]),
    "--tokenizer": st.sampled_from(["char", "bpe:300", "bpe:", "bpe:-1", "word"]),
    "--skip-nonfinite": st.integers(-1, 5).map(str),
    "--model.n_head": st.integers(-1, 8).map(str),
    "--model.position": st.sampled_from([*positions.names(), "rotary", "ALiBi"]),
    "--model.block_size": st.integers(-1, 64).map(str),
    "--model.dropout": st.floats(-0.5, 1.5).map(repr),
    "--model.attention.window": st.sampled_from(["none", "0", "4", "-4", "2.5"]),
    "--model.position_config.scaling": st.sampled_from(["linear", "yarn", "dynamic", "llama3", "none", "bogus"]),
    "--model.position_config.factor": st.sampled_from(["2", "0", "-1", "nan", "1e400"]),
    "--model.norm.kind": st.sampled_from(["layernorm", "rmsnorm", "batchnorm"]),
}


pairs = st.sampled_from(sorted(PLAUSIBLE)).flatmap(lambda flag: st.tuples(st.just(flag), PLAUSIBLE[flag] | tokens))


bombs = st.builds(alias_bomb, st.integers(1, 12), st.integers(1, 12))


HOSTILE_FLAGS = [
    "--model.position_config",
    "--model.position_config.base",
    "--model.position_config.factor",
    "--model.layer_pattern",
    "--model.mla",
    "--model.attention.temperature_tuning",
]


hostile_pairs = st.tuples(st.sampled_from(HOSTILE_FLAGS), st.one_of(deep_values, bombs, extreme_numbers.map(repr)))


def _hostile_cli_test(slow: bool, out_dir: Path):
    base = ["train", "--preset", "tiny", "--dry-run", "--out_dir", str(out_dir)]

    @_settings("hostile_cli", slow)
    @given(st.lists(hostile_pairs, min_size=1, max_size=2).map(lambda ps: [t for p in ps for t in p]))
    def check(extra):
        _cli([*base, *extra])

    return check


@st.composite
def extreme_model_dicts(draw):
    """A valid small model whose scheme or model scales get extreme finite numbers."""
    values_ = dict(MODEL_BASE, position=draw(st.sampled_from(positions.names())))
    fields = [
        f.name
        for f in dataclasses.fields(positions.get(values_["position"]).config_class)
        if f.type in ("float", float, "float | None", "int")
    ]
    numeric = [k for k in fields if k not in ("n_embd", "n_heads", "head_dim", "n_layer", "max_len", "rotary_dim")]
    if numeric and draw(st.booleans()):
        values_["position_config"] = {
            k: draw(extreme_numbers) for k in draw(st.lists(st.sampled_from(numeric), min_size=1, max_size=2))
        }
        if values_["position"] in ("rope", "xpos", "prope") and draw(st.booleans()):
            values_["position_config"]["scaling"] = draw(
                st.sampled_from(["linear", "ntk", "yarn", "llama3", "dynamic"])
            )
            values_["position_config"].setdefault("original_max_len", 8)
    else:
        values_[draw(st.sampled_from(["attn_scale", "embed_scale", "attn_softcap", "final_softcap"]))] = draw(
            extreme_numbers
        )
    return values_


def _extreme_test(slow: bool):
    @_settings("extreme", slow)
    @given(extreme_model_dicts())
    def check(values_):
        _check_model(values_)  # accepted must mean finite logits

    return check


def _cli_test(slow: bool, out_dir: Path):
    base = ["train", "--preset", "tiny", "--dry-run", "--out_dir", str(out_dir)]

    @_settings("cli", slow)
    @given(
        st.one_of(st.lists(tokens, max_size=8), st.lists(pairs, max_size=4).map(lambda ps: [t for p in ps for t in p]))
    )
    def check(extra):
        _cli([*base, *extra])

    return check


# ------------------------------------------------------------------------------------ preset YAML
yaml_docs = st.one_of(
    st.text(max_size=80),
    st.binary(max_size=40).map(lambda raw: raw.decode("latin-1")),
    st.dictionaries(
        st.sampled_from(["config", "quick", "description", "x"]),
        st.dictionaries(_keys(TRAIN_FIELDS), values, max_size=4) | values,
        max_size=3,
    ).map(lambda d: json.dumps(d, ensure_ascii=False, default=str)),
)


def _yaml_test(slow: bool, folder: Path):
    path = folder / "fuzz.yaml"

    @_settings("yaml", slow)
    @given(yaml_docs)
    def check(text):
        raw = text.encode("latin-1") if all(ord(c) < 256 for c in text) else text.encode("utf-8", errors="replace")
        path.write_bytes(raw)  # sometimes not UTF-8 at all
        _api(lambda: presets.load_preset_file(path))
        _cli(["train", "--preset", str(path), "--dry-run", "--out_dir", str(folder / "runs")])

    return check


# ------------------------------------------------------------------------------------ tests
def _run_all(tmp_path: Path, slow: bool, request) -> None:
    for key in COUNTS:
        COUNTS[key] = 0
    _train_test(slow)()
    _model_test(slow)()
    _cli_test(slow, tmp_path / "runs")()
    _yaml_test(slow, tmp_path)()
    _hostile_cli_test(slow, tmp_path / "runs")()
    _extreme_test(slow)()
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir()), "a dry run wrote files"
    from test_reliability_artifacts import mode, record

    record("fuzz", mode(request), dict(COUNTS))
    # (the exact counts move a little with the modules loaded: hypothesis draws constants from them)
    assert COUNTS["tracebacks"] == 0 and COUNTS["accepted"] >= 20 and COUNTS["rejected_one_line"] > 100, COUNTS


def test_fuzzed_configs_and_command_lines(tmp_path, request):
    _run_all(tmp_path, slow=False, request=request)


@pytest.mark.slow
def test_fuzzed_configs_and_command_lines_at_length(tmp_path, request):
    _run_all(tmp_path, slow=True, request=request)


SUBPROCESS_CASES = [
    ["--seed", "1" + "0" * 40],
    ["--model.position", "🙂"],
    ["--name", "a/b"],
    ["--lr", "nan"],
    ["--model.position_config", "{base: [1, 2]}"],
    ["--tokenizer", "bpe:٣x"],
    ["--corpus", "\x7f/nowhere.txt"],
    ["--model.n_head", "-3"],
    ["--threads", "1" + "0" * 12],
    ["--model.position_config.base", "1e400"],
]


@pytest.mark.parametrize("extra", SUBPROCESS_CASES[:2], ids=["huge-seed", "emoji-scheme"])
def test_bad_command_lines_in_a_real_process(extra, tmp_path, request):
    _subprocess_case(extra, tmp_path, request)


@pytest.mark.slow
@pytest.mark.parametrize("extra", SUBPROCESS_CASES[2:], ids=[str(i) for i in range(2, len(SUBPROCESS_CASES))])
def test_more_bad_command_lines_in_a_real_process(extra, tmp_path, request):
    _subprocess_case(extra, tmp_path, request)


def _subprocess_case(extra: list[str], tmp_path: Path, request) -> None:
    argv = [sys.executable, "-m", "poslab", "train", "--preset", "tiny", "--out_dir", str(tmp_path), *extra]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("poslab: error: "), done.stderr
    assert not list(tmp_path.iterdir()), "nothing may be written"
    from test_reliability_artifacts import mode, record

    record("fuzz", mode(request), {"subprocess_cases": 1})


def test_dry_run_checks_the_run_folder_and_writes_nothing(tmp_path, capsys):
    base = ["train", "--preset", "tiny", "--out_dir", str(tmp_path), "--dry-run"]
    assert main(base) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["action"] == "start" and report["config"]["max_steps"] == 40 and not list(tmp_path.iterdir())
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "notes.txt").write_text("mine")
    assert main(base) == 2 and "already exists" in capsys.readouterr().err
    assert main([*base, "--resume"]) == 2 and "has no config.json" in capsys.readouterr().err
    assert main([*base, "--overwrite"]) == 2 and "not a poslab run folder" in capsys.readouterr().err
    assert main([*base, "--model.n_head", "3"]) == 2 and "divisible" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["notes.txt", "tiny"]
