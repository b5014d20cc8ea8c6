"""``poslab train`` / ``sample`` / ``presets``: a real subprocess round trip plus in-process error cases."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from poslab.cli.app import main
from poslab.config import parse_overrides
from poslab.training import presets

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one thread (conftest)


POSLAB = [sys.executable, "-m", "poslab"]


def run_cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # tiny models; no thread hand-offs on a shared machine
    return subprocess.run([*POSLAB, *args], capture_output=True, text=True, cwd=cwd, timeout=300, env=env)


def test_train_then_sample_in_a_subprocess(tmp_path, capsys):
    out = tmp_path / "runs"
    done = run_cli(
        "train",
        "--preset",
        "tiny",
        "--quick",
        "--out_dir",
        str(out),
        "--max_steps",
        "6",
        "--eval_interval",
        "3",
        "--model.n_head",
        "4",
        "--threads",
        "1",
        "--no-progress",
    )
    assert done.returncode == 0, done.stderr
    run = out / "tiny-quick"
    results = json.loads((run / "results.json").read_text())
    config = json.loads((run / "config.json").read_text())
    assert results["steps"] == 6 and config["model"]["n_head"] == 4
    assert "done: 6 steps" in done.stderr and "MFU" in done.stderr
    sample = run_cli("sample", str(run), "--prompt", "ROMEO:", "--tokens", "20", "--seed", "1")
    assert sample.returncode == 0, sample.stderr
    assert sample.stdout.startswith("ROMEO:") and len(sample.stdout) > len("ROMEO:") + 10
    capsys.readouterr()
    assert main(["sample", str(run), "--prompt", "ROMEO:", "--tokens", "20", "--seed", "1"]) == 0
    assert capsys.readouterr().out == sample.stdout  # same seed, same text
    assert main(["train", "--preset", "tiny", "--quick", "--out_dir", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"poslab: error: run folder '{run}' already exists; pass --resume to continue it or --overwrite to replace it"
    ]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--preset", "tiny", "--max_step", "3"], "unknown key --max_step (did you mean --max_steps?)"),
        (["train", "--preset", "tiny", "--n_head", "3"], "did you mean --model.n_head?"),
        (["train", "--preset", "tiny", "--model.n_heads", "3"], "did you mean --model.n_head?"),
        (["train", "--preset", "tiny", "--lr", "fast"], "--lr expects a number, got 'fast'"),
        (["train", "--preset", "tiny", "--model.bias", "maybe"], "--model.bias expects true or false"),
        (["train", "--preset", "tiny", "--batch_size"], "--batch_size needs a value"),
        (["train", "--preset", "tiny-ish"], "unknown preset 'tiny-ish' (did you mean 'tiny'?)"),
        (["train", "--max_steps", "3"], "give --preset NAME"),
        (
            ["train", "--preset", "tiny", "--model.position", "rop"],
            "unknown position scheme 'rop' (did you mean 'rope'?)",
        ),
        (["train", "--preset", "tiny", "--dtype", "fp16"], "dtype='fp16' is not allowed"),
        (["sample", "no-such-run"], "no run 'no-such-run'"),
    ],
)
def test_bad_command_lines_print_one_line_and_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("poslab: error:") and message in err[0], err


def test_sample_unknown_prompt_character_is_a_clear_error(tmp_path, capsys):
    from poslab.session import train
    from poslab.training.config import TrainConfig

    cfg = TrainConfig.from_dict(
        {
            **presets.preset_config("tiny", quick=True),
            "name": "t",
            "out_dir": str(tmp_path),
            "max_steps": 2,
            "eval_interval": 2,
            "threads": 1,
        }
    )
    train(cfg, progress=False)
    assert main(["sample", str(cfg.run_dir), "--prompt", "白日依山尽"]) == 2
    assert "characters not in the tokenizer's vocabulary (65 chars): '白日依山尽'" in capsys.readouterr().err
    assert main(["sample", str(cfg.run_dir), "--prompt", "A", "--max-len", "999"]) == 2
    assert "past the 'learned' position table (32 positions)" in capsys.readouterr().err


def test_override_syntax():
    assert parse_overrides(
        [
            "--max-steps",
            "20",
            "--model.n_head=8",
            "--lr",
            "3e-4",
            "--lr_decay_steps",
            "none",
            "--model.position",
            "rope",
            "--model.position_config.base",
            "500",
            "--model.bias",
            "false",
            "--tokenizer",
            "bpe:300",
        ]
    ) == {
        "max_steps": 20,
        "lr": 3e-4,
        "lr_decay_steps": None,
        "tokenizer": "bpe:300",
        "model": {"n_head": 8, "position": "rope", "position_config": {"base": 500}, "bias": False},
    }
    assert parse_overrides(["--model.position_config", '{"scaling": "linear", "factor": 2.0}']) == {
        "model": {"position_config": {"scaling": "linear", "factor": 2.0}}
    }
    with pytest.raises(ValueError, match="model.vocab_size|unknown key"):
        parse_overrides(["--model.vocab_size", "10"])


def test_presets_listing(capsys):
    assert main(["presets"]) == 0
    listing = capsys.readouterr().out
    for name in ("tang-small", "shakespeare-char", "tiny"):
        assert name in listing
    assert main(["presets", "shakespeare-char"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["config"]["model"]["block_size"] == 64 and shown["config"]["batch_size"] == 12


def test_yaml_preset_file(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("corpus: shakespeare\nmodel: {n_layer: 1, n_head: 2, n_embd: 16, block_size: 8}\nmax_steps: 3\n")
    assert presets.preset_config(str(path))["model"]["n_layer"] == 1
    path.write_text("!!python/object/apply:os.system ['echo unsafe']\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        presets.preset_config(str(path))


def test_resume_from_the_run_config_with_overrides(tmp_path, capsys):
    out = str(tmp_path)
    common = ["--out_dir", out, "--eval_interval", "2", "--threads", "1", "--no-progress"]
    assert main(["train", "--preset", "tiny", "--quick", "--max_steps", "4", *common]) == 0
    assert main(["train", "--name", "tiny-quick", "--resume", "--max_steps", "6", *common]) == 0
    results = json.loads((tmp_path / "tiny-quick" / "results.json").read_text())
    assert results["steps"] == 6 and results["resumed_from"] == 4
    assert main(["train", "--name", "tiny-quick", "--resume", "--lr", "0.5", *common]) == 2
    assert "train.lr: 0.003 (saved run) vs 0.5 (now)" in capsys.readouterr().err
