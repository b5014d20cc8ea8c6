"""Fuzzed files of a run and of the measurement caches: consistent forgeries of checkpoints, tokenizers
and configs (checksums recomputed) answered or refused by ``sample`` and ``--resume`` in one line,
never a traceback; random, non-finite and absurd cached figures used only when plausible, else
measured again. The counts go to ``test-artifacts/reliability.json`` under ``fuzz``.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch
from fuzz_helpers import COUNTS, _settings, deep_values, extreme_numbers, values
from hypothesis import given
from hypothesis import strategies as st

from poslab.cli.app import main
from poslab.training.config import TrainConfig


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
