"""``TrainConfig.device`` (``auto`` | ``cpu`` | ``cuda``): validated, resolved, refused clearly without CUDA."""

from __future__ import annotations

import json

import pytest
import torch

from poslab.cli.app import main
from poslab.training import distributed
from poslab.training.config import RESUME_FREE_KEYS, TrainConfig, resume_identity, training_device
from poslab.training.loop import on_device

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the errors without CUDA")


def test_the_device_is_validated_naming_the_choices():
    assert TrainConfig(name="x").device == "auto"
    with pytest.raises(ValueError, match=r"device='gpu' is not allowed; choose one of \['auto', 'cpu', 'cuda'\]"):
        TrainConfig(name="x", device="gpu")
    with pytest.raises(ValueError, match="device='tpu' is not allowed"):
        training_device("tpu")


def test_auto_and_cpu_resolve_and_torchrun_decides_under_a_process_group():
    assert training_device("cpu") == "cpu"
    assert training_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert training_device("auto", "cuda") == "cuda" and training_device("cuda", "cuda") == "cuda"
    assert training_device("auto", "cpu") == "cpu"
    with pytest.raises(ValueError, match="device='cuda' cannot be used under this torchrun: torch sees no CUDA"):
        training_device("cuda", "cpu")
    with pytest.raises(ValueError, match="device='cpu' cannot be used under this torchrun: torch sees CUDA"):
        training_device("cpu", "cuda")


def test_a_device_change_does_not_block_a_resume():
    assert "device" in RESUME_FREE_KEYS
    doc = {"model": TrainConfig(name="x").model.to_dict(), "train": {"name": "x", "device": "cpu"}}
    assert resume_identity(doc) == resume_identity({**doc, "train": {"name": "x", "device": "cuda"}})


@NO_CUDA
def test_cuda_without_a_gpu_is_one_clear_error(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"device='cuda' but torch sees no CUDA device \(torch .*\); use --device cpu"):
        training_device("cuda")
    with pytest.raises(ValueError, match="torch sees no CUDA device"):
        on_device("cuda", distributed.DistContext())
    assert on_device("auto", distributed.DistContext()).device == torch.device("cpu")
    args = [
        "train",
        "--preset",
        "tiny",
        "--device",
        "cuda",
        "--out_dir",
        str(tmp_path),
        "--name",
        "g",
        "--max_steps",
        "2",
    ]
    assert main([*args, "--dry-run"]) == 2  # the pre-flight (also a sweep's) refuses it before anything runs
    assert "torch sees no CUDA device" in capsys.readouterr().err
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("poslab: error: device='cuda' but torch sees no CUDA device"), err
    assert not (tmp_path / "g").exists()  # refused before the run existed: no half folder left


def test_results_record_the_device(tmp_path, single_thread):
    assert (
        main(
            [
                "train",
                "--preset",
                "tiny",
                "--device",
                "cpu",
                "--out_dir",
                str(tmp_path),
                "--name",
                "c",
                "--max_steps",
                "2",
                "--eval_interval",
                "2",
                "--eval_iters",
                "1",
                "--no-progress",
            ]
        )
        == 0
    )
    results = json.loads((tmp_path / "c" / "results.json").read_text())
    assert results["device"] == "cpu"
    assert json.loads((tmp_path / "c" / "config.json").read_text())["train"]["device"] == "cpu"
