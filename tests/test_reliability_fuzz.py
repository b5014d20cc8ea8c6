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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from poslab import GPT, GPTConfig, positions
from poslab.cli.app import main
from poslab.training import presets
from poslab.training.config import TrainConfig

DEFAULT_EXAMPLES = {
    "train": 150,
    "model": 200,
    "yaml": 60,
    "cli": 150,
    "extreme": 80,
    "hostile_cli": 40,
    "forged": 12,
    "cached": 60,
}
SLOW_EXAMPLES = {
    "train": 2500,
    "model": 3000,
    "yaml": 800,
    "cli": 2000,
    "extreme": 1500,
    "hostile_cli": 400,
    "forged": 150,
    "cached": 1000,
}
COUNTS = {
    "cases": 0,
    "accepted": 0,
    "rejected_one_line": 0,
    "tracebacks": 0,
    "subprocess_cases": 0,
    "models_run": 0,
    "forged_runs": 0,
    "consistent_forgeries_refused": 0,
    "cached_values_checked": 0,
    "remeasured": 0,
}

TRAIN_FIELDS = [f.name for f in dataclasses.fields(TrainConfig)]
MODEL_FIELDS = [f.name for f in dataclasses.fields(GPTConfig)]
WEIRD_TEXT = [
    "",
    " ",
    "none",
    "null",
    "nan",
    "-inf",
    "1e309",
    "0x10",
    "٣",
    "１２",
    "🙂",
    "é",
    "a/b",
    "..",
    ".",
    "\x00",
    "\n",
    "--",
    "-1",
    "true",
    "[]",
    "{}",
    "{'a': 1}",
    "rope",
    "alibi",
    "tang5",
    "bpe:٣",
    "bpe:0",
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-5, max_value=300),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=16),
    st.sampled_from(WEIRD_TEXT),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=5,
)


def _keys(fields: list[str]):
    return st.one_of(st.sampled_from(fields), st.text(max_size=12), st.sampled_from([f + "s" for f in fields]))


def _settings(kind: str, slow: bool):
    examples = (SLOW_EXAMPLES if slow else DEFAULT_EXAMPLES)[kind]
    return settings(
        max_examples=examples, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
    )


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
    "--model.window",
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
    "--model.window": st.sampled_from(["none", "0", "4", "-4", "2.5"]),
    "--model.position_config.scaling": st.sampled_from(["linear", "yarn", "dynamic", "llama3", "none", "bogus"]),
    "--model.position_config.factor": st.sampled_from(["2", "0", "-1", "nan", "1e400"]),
    "--model.norm": st.sampled_from(["layernorm", "rmsnorm", "batchnorm"]),
}
pairs = st.sampled_from(sorted(PLAUSIBLE)).flatmap(lambda flag: st.tuples(st.just(flag), PLAUSIBLE[flag] | tokens))


# ------------------------------------------------------------------------------------ hostile values
#: finite numbers at the edges of float64 and fp32 (and past fp32's range), of both signs
EXTREME_NUMBERS = [
    5e-324,
    1e-300,
    1e-46,
    1e-38,
    1e-30,
    1e-6,
    1e6,
    1e30,
    3.4e38,
    1e39,
    1e300,
    1.7e308,
    2**31,
    2**53,
    2**62,
    2**63,
    -1e-300,
    -1e300,
]
extreme_numbers = st.one_of(
    st.sampled_from(EXTREME_NUMBERS),
    st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: abs(x) > 1e30 or 0 < abs(x) < 1e-30),
)


def nested(depth: int, opener: str) -> str:
    """``depth`` levels of ``[`` / ``{a:`` (flow YAML) or ``{"a":`` (JSON), closed."""
    closer = {"[": "]", "{a: ": "}", '{"a": ': "}"}[opener]
    return opener * depth + ("1" if opener != "[" else "") + closer * depth


deep_values = st.builds(nested, st.integers(1, 6000), st.sampled_from(["[", "{a: ", '{"a": ']))


def alias_bomb(levels: int, width: int) -> str:
    """Flow YAML of about ``30 * levels * width`` bytes expanding to ``width ** levels`` values."""
    names = [f"n{i}" for i in range(levels)]
    parts = [f"{names[0]}: &{names[0]} [{', '.join(['x'] * width)}]"]
    parts += [f"{n}: &{n} [{', '.join([f'*{names[i]}'] * width)}]" for i, n in enumerate(names[1:])]
    return "{" + ", ".join(parts) + "}"


bombs = st.builds(alias_bomb, st.integers(1, 12), st.integers(1, 12))
HOSTILE_FLAGS = [
    "--model.position_config",
    "--model.position_config.base",
    "--model.position_config.factor",
    "--model.layer_pattern",
    "--model.mla",
    "--model.attn_temperature",
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


# ------------------------------------------------------------------------------------ forged, consistent run files
def _forged_cli(argv: list[str]) -> int:
    """Like :func:`_cli`, also allowing exit 1 (a diverged training) with its one error line."""
    COUNTS["cases"] += 1
    err, out = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(argv)
    except BaseException:
        COUNTS["tracebacks"] += 1
        raise
    errors = [line for line in err.getvalue().splitlines() if line.startswith("poslab: error: ")]
    assert "Traceback" not in err.getvalue(), (argv, err.getvalue())
    if code == 0:
        COUNTS["accepted"] += 1
        return code
    assert code in (1, 2) and len(errors) == 1, (argv, code, err.getvalue())
    COUNTS["rejected_one_line"] += 1
    return code


TENSOR_EDITS = ["scale", "int64", "bool", "uint8", "float16", "float64", "flatten", "truncate", "empty", "bytes"]


@st.composite
def forgeries(draw):
    """One consistent forgery: ``(kind, target, edit)`` with checksums recomputed after it."""
    kind = draw(st.sampled_from(["tensor", "meta", "tokenizer", "config", "swap", "data"]))
    if kind == "swap":  # a still valid tokenizer: two of its letters exchanged
        return kind, draw(st.integers(0, 10_000)), draw(st.integers(1, 10_000))
    if kind == "data":  # a value of config.json's data section (not the tokenizer's digest) replaced
        key = draw(st.sampled_from(["corpus", "corpus_sha256", "chars", "split", "train_tokens", "val_tokens", "new"]))
        return kind, key, draw(values | extreme_numbers)
    if kind == "tensor":
        return kind, draw(st.integers(0, 10_000)), (draw(st.sampled_from(TENSOR_EDITS)), draw(extreme_numbers))
    if kind == "meta":
        key = draw(
            st.sampled_from(
                [
                    "optimizer",
                    "log_loss_sum",
                    "log_loss_count",
                    "best",
                    "tokens_seen",
                    "skipped_nonfinite",
                    "model_aliases",
                    "data_position",
                ]
            )
        )
        return kind, key, draw(values | extreme_numbers | st.just({"param_groups": [1]}))
    if kind == "tokenizer":
        return (
            kind,
            draw(st.sampled_from(["char", "bpe", "hf", "ids"])),
            draw(values | deep_values | st.integers(0, 70)),
        )
    return kind, draw(st.sampled_from(["n_embd", "vocab_size", "position", "block_size", "n_head"])), draw(values)


def _record_tokenizer_digest(run: Path) -> None:
    """Write the sha256 of ``run/tokenizer.json`` into ``config.json``: the forgery is consistent."""
    from poslab.fileio import sha256_file

    doc = json.loads((run / "config.json").read_text(encoding="utf-8"))
    doc.setdefault("data", {})["tokenizer_sha256"] = sha256_file(run / "tokenizer.json")
    (run / "config.json").write_text(json.dumps(doc), encoding="utf-8")


def _apply_forgery(run: Path, forgery: tuple) -> None:
    from poslab.training import checkpoint as ckpt

    kind, target, edit = forgery
    if kind in ("tensor", "meta"):
        tensors, meta = ckpt.load_checkpoint(run)
        step = meta["step"]
        meta = {k: v for k, v in meta.items() if k not in ("sha256", "step", "tensors_file")}
        if kind == "tensor":
            name = sorted(tensors)[target % len(tensors)]
            op, number = edit
            t = tensors[name]
            tensors[name] = {
                "scale": lambda: t * number if t.is_floating_point() else t,
                "int64": lambda: t.to(torch.int64),
                "bool": lambda: t.to(torch.bool),
                "uint8": lambda: t.to(torch.uint8),
                "float16": lambda: t.to(torch.float16),
                "float64": lambda: t.to(torch.float64),
                "flatten": lambda: t.reshape(-1).clone(),
                "truncate": lambda: t.reshape(-1)[: max(t.numel() // 2, 1)].clone(),
                "empty": lambda: t.reshape(-1)[:0].clone(),
                "bytes": lambda: torch.zeros(7, dtype=torch.uint8),
            }[op]()
        else:
            meta[target] = edit
        ckpt.save_checkpoint(run, step, tensors, meta)
        return
    if kind == "swap":
        data = json.loads((run / "tokenizer.json").read_text(encoding="utf-8"))
        chars = list(data["chars"])
        i, j = target % len(chars), (target + edit) % len(chars)
        if chars[i] == chars[j]:
            j = (i + 1) % len(chars)
        chars[i], chars[j] = chars[j], chars[i]
        data["chars"] = "".join(chars) if isinstance(data["chars"], str) else chars
        (run / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
        _record_tokenizer_digest(run)
        return
    if kind == "data":
        doc = json.loads((run / "config.json").read_text(encoding="utf-8"))
        doc["data"][target] = edit
        (run / "config.json").write_text(json.dumps(doc, default=str), encoding="utf-8")
        return
    if kind == "tokenizer":
        chars = json.loads((run / "tokenizer.json").read_text(encoding="utf-8")).get("chars", ["a"])
        body = {
            "type": target,
            "vocab_size": edit,
            "tokenizer": edit,
            "chars": chars[:edit] if isinstance(edit, int) else edit,
        }
        (run / "tokenizer.json").write_text(
            json.dumps(body, default=str) if not isinstance(edit, str) or not edit.startswith(("[", "{")) else edit,
            encoding="utf-8",
        )
        _record_tokenizer_digest(run)
        return
    doc = json.loads((run / "config.json").read_text(encoding="utf-8"))
    doc["model"][target] = edit
    (run / "config.json").write_text(json.dumps(doc, default=str), encoding="utf-8")


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    from poslab.data import load_corpus
    from poslab.session import train

    folder = tmp_path_factory.mktemp("forge")
    corpus = folder / "corpus.txt"
    corpus.write_text(load_corpus("tang5")[:20_000], encoding="utf-8")
    cfg = TrainConfig.from_dict(
        dict(
            name="A",
            out_dir=str(folder / "runs"),
            corpus=str(corpus),
            model=dict(n_layer=1, n_head=2, n_embd=16, block_size=16),
            max_steps=2,
            batch_size=2,
            warmup_steps=1,
            eval_interval=2,
            eval_iters=1,
            ckpt_interval=0,
            seed=1,
            threads=1,
        )
    )
    with contextlib.redirect_stderr(io.StringIO()):
        train(cfg, progress=False)
    return cfg.run_dir


def _forged_test(slow: bool, trained: Path, scratch: Path):
    import shutil

    @_settings("forged", slow)
    @given(forgeries(), st.booleans())
    def check(forgery, also_resume):
        run = scratch / "A"
        if run.exists():
            shutil.rmtree(run)
        shutil.copytree(trained, run)
        before = json.loads((run / "config.json").read_text(encoding="utf-8"))["data"]
        _apply_forgery(run, forgery)
        COUNTS["forged_runs"] += 1
        code = _forged_cli(["sample", str(run), "--tokens", "2", "--seed", "1"])
        if forgery[0] == "swap" or (forgery[0] == "data" and json.loads(json.dumps(before)) != _data_of(run)):
            # a valid file rewritten with its recorded digest: the checkpoint's record of the run files refuses it
            assert code == 2, forgery
            COUNTS["consistent_forgeries_refused"] += 1
        if also_resume:
            _forged_cli(
                ["train", "--resume", "--name", "A", "--out_dir", str(scratch), "--max_steps", "3", "--no-progress"]
            )

    return check


def _data_of(run: Path) -> dict:
    return json.loads(json.dumps(json.loads((run / "config.json").read_text(encoding="utf-8"))["data"], default=str))


def _run_forged(trained: Path, tmp_path: Path, slow: bool, request) -> None:
    for key in COUNTS:
        COUNTS[key] = 0
    _forged_test(slow, trained, tmp_path)()
    from test_reliability_artifacts import mode, record

    record("fuzz", mode(request), dict(COUNTS))
    assert COUNTS["tracebacks"] == 0 and COUNTS["forged_runs"] >= 5 and COUNTS["consistent_forgeries_refused"], COUNTS


def test_fuzzed_forged_run_files(trained_run, tmp_path, request):
    """Consistent forgeries of checkpoints, tokenizers and configs: ``sample`` and ``--resume`` answer
    or refuse in one line, never a traceback."""
    _run_forged(trained_run, tmp_path, slow=False, request=request)


@pytest.mark.slow
def test_fuzzed_forged_run_files_at_length(trained_run, tmp_path, request):
    _run_forged(trained_run, tmp_path, slow=True, request=request)


# ------------------------------------------------------------------------------------ cached measurements
cached_values = values | extreme_numbers | st.sampled_from([0, 0.0, -0.0, 1e-400, float("nan"), float("inf"), True])


@st.composite
def cached_records(draw):
    """A precision-cache record: each figure kept plausible, or replaced by a random or non-finite value."""
    plausible = {"fp32_step_s": 0.01, "bf16_step_s": 0.02, "fp32_matmul_flops": 1e10, "bf16_matmul_flops": 1e10}
    return {k: (draw(cached_values) if draw(st.booleans()) else v) for k, v in plausible.items()}


def _cached_test(slow: bool, folder: Path):
    from poslab.runs import RunFolder
    from poslab.training import precision

    measured = precision.PrecisionFigures(0.03, 0.06, 2e10, 1e10)

    @_settings("cached", slow)
    @given(cached_records(), cached_values)
    def check(record, peak):
        COUNTS["cases"] += 1
        cache = folder / "precision.json"
        cache.write_text(json.dumps({precision.machine_key(): record}), encoding="utf-8")  # NaN/Infinity written
        calls = []
        choice = precision.choose_dtype("auto", torch.device("cpu"), lambda: calls.append(1) or measured, cache)
        figures = choice.figures
        for name, (low, high) in precision.FIGURE_RANGES.items():
            assert low <= getattr(figures, name) <= high, (record, figures)
        assert bool(calls) == (precision.valid_figures(record) is None), record  # a bad record is measured again
        assert "nan" not in choice.reason.lower() and " -" not in choice.reason, choice.reason
        json.dumps(choice.to_dict(), allow_nan=False)  # what results.json records is strict JSON
        assert precision.valid_figures(json.loads(cache.read_text())[precision.machine_key()]) is not None
        run = RunFolder(folder / "run")
        run.path.mkdir(exist_ok=True)
        run.file("peak.json").write_text(json.dumps({"fp32/1": peak}), encoding="utf-8")
        value = run.matmul_peak("fp32/1", lambda: 5e9)
        assert 0 < value < float("inf"), (peak, value)
        COUNTS["cached_values_checked"] += 1
        COUNTS["accepted" if not calls else "remeasured"] += 1

    return check


def _run_cached(tmp_path: Path, slow: bool, request) -> None:
    for key in COUNTS:
        COUNTS[key] = 0
    _cached_test(slow, tmp_path)()
    from test_reliability_artifacts import mode, record

    record("fuzz", mode(request), dict(COUNTS))
    assert COUNTS["tracebacks"] == 0 and COUNTS["remeasured"] > 10 and COUNTS["accepted"] >= 1, COUNTS


def test_fuzzed_cached_measurements(tmp_path, request):
    """Random, non-finite and absurd figures in the precision cache and ``peak.json``: each is used only
    when it is a plausible finite number, else measured again and replaced; never a ZeroDivisionError,
    a negative or NaN time in the header, or a NaN in what ``results.json`` records."""
    _run_cached(tmp_path, slow=False, request=request)


@pytest.mark.slow
def test_fuzzed_cached_measurements_at_length(tmp_path, request):
    _run_cached(tmp_path, slow=True, request=request)
