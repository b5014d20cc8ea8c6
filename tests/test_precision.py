"""``dtype: auto``: the precision chosen by measuring it, the cache, the warning, MFU that cannot exceed 1."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from poslab.runs import load_run
from poslab.session import train
from poslab.training import precision
from poslab.training.config import TrainConfig
from poslab.training.mfu import mfu_of
from poslab.training.precision import PrecisionFigures, cached_figures, choose_dtype

pytestmark = pytest.mark.usefixtures("single_thread")

CPU = torch.device("cpu")
BF16_FASTER = PrecisionFigures(fp32_step_s=0.010, bf16_step_s=0.004, fp32_matmul_flops=1e11, bf16_matmul_flops=3e11)
BF16_SLOWER = PrecisionFigures(fp32_step_s=0.010, bf16_step_s=0.180, fp32_matmul_flops=1e11, bf16_matmul_flops=5e8)


class Stub:
    """A measurement that returns fixed figures and counts its calls."""

    def __init__(self, figures: PrecisionFigures) -> None:
        self.figures, self.calls = figures, 0

    def __call__(self) -> PrecisionFigures:
        self.calls += 1
        return self.figures


def test_auto_takes_bf16_only_where_it_measured_faster(tmp_path):
    faster = choose_dtype("auto", CPU, Stub(BF16_FASTER), tmp_path / "a.json")
    assert faster.dtype == "bf16" and faster.warning is None
    assert "0.40x" in faster.reason and faster.figures == BF16_FASTER
    slower = choose_dtype("auto", CPU, Stub(BF16_SLOWER), tmp_path / "b.json")
    assert slower.dtype == "fp32" and slower.warning is None
    assert "18.00x" in slower.reason
    record = slower.to_dict()
    assert record["requested"] == "auto" and record["dtype"] == "fp32"
    assert record["figures"]["bf16_over_fp32_step"] == pytest.approx(18.0)


def test_a_tie_keeps_fp32(tmp_path):
    tie = PrecisionFigures(fp32_step_s=0.0260, bf16_step_s=0.0252, fp32_matmul_flops=1e11, bf16_matmul_flops=2e11)
    assert choose_dtype("auto", CPU, Stub(tie), tmp_path / "t.json").dtype == "fp32"  # 0.97x: inside the noise
    clear = PrecisionFigures(fp32_step_s=0.0260, bf16_step_s=0.0230, fp32_matmul_flops=1e11, bf16_matmul_flops=2e11)
    assert choose_dtype("auto", CPU, Stub(clear), tmp_path / "c.json").dtype == "bf16"  # 0.88x


def test_explicit_bf16_measured_slower_runs_with_a_warning_naming_the_ratio(tmp_path):
    choice = choose_dtype("bf16", CPU, Stub(BF16_SLOWER), tmp_path / "c.json")
    assert choice.dtype == "bf16"
    assert choice.warning is not None and "\n" not in choice.warning
    assert "18.00x" in choice.warning and "slower than fp32" in choice.warning
    assert choose_dtype("bf16", CPU, Stub(BF16_FASTER), tmp_path / "d.json").warning is None


def test_fp32_measures_nothing_and_a_bad_dtype_is_refused(tmp_path):
    def never() -> PrecisionFigures:
        raise AssertionError("fp32 must not measure")

    assert choose_dtype("fp32", CPU, never, tmp_path / "e.json").dtype == "fp32"
    with pytest.raises(ValueError, match="dtype='fp16' is not allowed"):
        choose_dtype("fp16", CPU, never, tmp_path / "e.json")
    with pytest.raises(ValueError, match="dtype='fp16' is not allowed"):
        TrainConfig(name="x", dtype="fp16")


def test_figures_are_measured_once_per_machine_and_a_corrupt_cache_is_measured_again(tmp_path):
    path = tmp_path / "cache" / "precision.json"
    stub = Stub(BF16_FASTER)
    assert cached_figures(stub, path) == BF16_FASTER
    assert cached_figures(stub, path) == BF16_FASTER
    assert stub.calls == 1
    assert precision.machine_key() in json.loads(path.read_text())
    path.write_text("[" * 5000)  # unreadable: measured again, rewritten
    assert cached_figures(stub, path) == BF16_FASTER and stub.calls == 2
    assert json.loads(path.read_text())[precision.machine_key()]["bf16_step_s"] == BF16_FASTER.bf16_step_s


BAD_CACHED = ["0", "1e-400", "-1.0", "-1000.0", "NaN", "Infinity", "-Infinity", "true", '"0.01"', "1e30", "null"]


def write_cache(path, fp32_step: str) -> None:
    """A cache record for this machine whose ``fp32_step_s`` is the raw JSON text ``fp32_step``."""
    text = (
        f'{{{json.dumps(precision.machine_key())}: {{"fp32_step_s": {fp32_step}, "bf16_step_s": 0.004, '
        '"fp32_matmul_flops": 1e11, "bf16_matmul_flops": 3e11}}'
    )
    path.write_text(text, encoding="utf-8")


@pytest.mark.parametrize("bad", BAD_CACHED)
def test_a_cached_figure_that_is_not_a_plausible_time_is_measured_again(tmp_path, bad):
    """0, an underflow to 0, negative, non-finite, bool, string or absurd: measured again and the cache
    replaced, never a ZeroDivisionError or a negative/NaN time in the header or results.json."""
    path = tmp_path / "precision.json"
    write_cache(path, bad)
    stub = Stub(BF16_SLOWER)
    choice = choose_dtype("auto", CPU, stub, path)
    assert stub.calls == 1 and choice.figures == BF16_SLOWER and choice.dtype == "fp32"
    assert "-" not in choice.reason and "nan" not in choice.reason.lower()
    json.dumps(choice.to_dict(), allow_nan=False)  # what results.json records is strict JSON
    assert json.loads(path.read_text())[precision.machine_key()]["fp32_step_s"] == BF16_SLOWER.fp32_step_s
    assert cached_figures(stub, path) == BF16_SLOWER and stub.calls == 1  # the replaced cache is used


def test_a_symlinked_cache_is_read_through_and_replaced_not_written_through(tmp_path):
    target = tmp_path / "elsewhere.json"
    write_cache(target, "0")
    before = target.read_text()
    link = tmp_path / "precision.json"
    link.symlink_to(target)
    stub = Stub(BF16_FASTER)
    assert cached_figures(stub, link) == BF16_FASTER and stub.calls == 1
    assert target.read_text() == before and not link.is_symlink()  # the link's target is never written
    write_cache(target, "0.01")
    link.unlink()
    link.symlink_to(target)
    assert cached_figures(stub, link).fp32_step_s == 0.01 and stub.calls == 1  # a good linked cache is used


def test_the_real_measurement_returns_positive_figures(tmp_path):
    figures = precision.measure(reps=2, budget_s=0.2, rounds=1)
    assert figures.fp32_step_s > 0 and figures.bf16_step_s > 0
    assert figures.fp32_matmul_flops > 0 and figures.bf16_matmul_flops > 0


#: :func:`conftest.tiny_config`'s form here: 6 steps in ``dtype: auto``, checkpoints at 3 and 6
AUTO_DTYPE: dict[str, Any] = dict(dtype="auto", max_steps=6, eval_interval=3, ckpt_interval=3, keep_checkpoints=3)


def seed_cache(monkeypatch, tmp_path, figures: PrecisionFigures, name: str) -> None:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "precision.json").write_text(json.dumps({precision.machine_key(): figures.__dict__}))
    monkeypatch.setenv("POSLAB_CACHE_DIR", str(folder))


@pytest.mark.parametrize(("figures", "expected"), [(BF16_FASTER, "bf16"), (BF16_SLOWER, "fp32")])
def test_a_run_records_the_choice_and_its_figures(make_config, tmp_path, monkeypatch, capsys, figures, expected):
    seed_cache(monkeypatch, tmp_path, figures, "cache")
    results = train(make_config(AUTO_DTYPE), progress=True)
    assert results["dtype"] == expected
    assert results["precision"]["requested"] == "auto" and results["precision"]["dtype"] == expected
    assert results["precision"]["figures"]["bf16_step_s"] == figures.bf16_step_s
    _, _, config = load_run(tmp_path / "runs" / "run")
    assert config["train"]["dtype"] == expected  # the run computes in a concrete dtype
    assert f"auto: {expected}" in capsys.readouterr().err  # the progress header says what was chosen


def test_a_resumed_auto_run_keeps_the_dtype_it_started_with(make_config, tmp_path, monkeypatch):
    seed_cache(monkeypatch, tmp_path, BF16_FASTER, "first")
    train(make_config(AUTO_DTYPE, max_steps=3), progress=False)
    seed_cache(monkeypatch, tmp_path, BF16_SLOWER, "second")  # another machine's figures
    results = train(make_config(AUTO_DTYPE), resume=True, progress=False)
    assert results["dtype"] == "bf16" and results["resumed_from"] == 3
    assert "kept from the resumed run" in results["precision"]["reason"]


def test_mfu_above_one_is_refused_not_recorded(make_config, monkeypatch):
    assert mfu_of(1000.0, 1e6, 1e10) == pytest.approx(0.1)
    assert mfu_of(None, 1e6, 1e10) is None
    refused = mfu_of(1000.0, 1e6, 1e8)
    assert isinstance(refused, str) and "exceeds 1" in refused
    # a peak far below what the run reaches: the run records no MFU and says why
    monkeypatch.setattr("poslab.training.mfu.measured_peak", lambda dtype: 1.0)
    results = train(make_config(AUTO_DTYPE, dtype="fp32"), progress=False)
    assert results["mfu"] is None and "exceeds 1" in results["mfu_refused"]


def test_the_bf16_mfu_peak_is_the_faster_of_the_two_dtypes(make_config, monkeypatch):
    peaks = {"fp32": 4e12, "bf16": 1e9}  # emulated bf16: its own peak would make MFU look above 1
    monkeypatch.setattr("poslab.training.mfu.measured_peak", lambda dtype: peaks[dtype])
    results = train(make_config(AUTO_DTYPE, dtype="bf16"), progress=False)
    assert results["peak_flops"] == 4e12
    assert results["mfu"] is not None and 0 < results["mfu"] <= 1
