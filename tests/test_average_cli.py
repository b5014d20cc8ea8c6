"""``poslab average RUN --last K --out NEW_RUN``: a real subprocess on real run files, and what it refuses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from poslab.data import load_corpus
from poslab.fileio import sha256_file
from poslab.runs import RunFolder, load_run
from poslab.session import train
from poslab.training.config import TrainConfig

pytestmark = pytest.mark.usefixtures("single_thread")

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run([sys.executable, "-m", "poslab", *args], capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A tiny run that keeps its checkpoints of steps 2, 4 and 6."""
    corpus = tmp_path_factory.mktemp("corpus") / "tang.txt"
    corpus.write_text(load_corpus("tang5")[:30_000], encoding="utf-8")
    cfg = TrainConfig.from_dict(
        dict(
            name="run",
            out_dir=str(tmp_path_factory.mktemp("runs")),
            corpus=str(corpus),
            model=dict(n_layer=1, n_head=2, n_embd=16, block_size=16),
            max_steps=6,
            batch_size=2,
            warmup_steps=1,
            eval_interval=3,
            eval_iters=1,
            log_interval=1,
            ckpt_interval=2,
            keep_checkpoints=3,
            seed=3,
            threads=1,
        )
    )
    train(cfg, progress=False)
    return cfg.run_dir


def fingerprint(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def test_average_writes_a_new_run_and_never_overwrites(source, tmp_path, capsys):
    before = fingerprint(source)
    new = tmp_path / "averaged"
    done = run_cli("average", str(source), "--last", "2", "--out", str(new))
    assert done.returncode == 0, done.stderr
    assert "averaged checkpoints [4, 6]" in done.stdout
    model, tokenizer, config = load_run(new)
    run = RunFolder(source)
    four, six = load_run(run, step=4)[0].state_dict(), load_run(run, step=6)[0].state_dict()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, (four[key] + six[key]) / 2)
    assert config["data"]["averaged_from"]["steps"] == [4, 6] and config["data"]["averaged_from"]["weights"] == [
        0.5,
        0.5,
    ]
    assert config["train"]["name"] == "averaged" and RunFolder(new).state == "finished"
    assert RunFolder(new).checkpoints() == [6] and tokenizer.to_dict() == run.tokenizer().to_dict()
    assert fingerprint(source) == before  # the source run is only read
    # in-process from here (one subprocess is enough to prove the command line works)
    from poslab.cli.app import main

    written = fingerprint(new)
    assert main(["average", str(source), "--last", "3", "--out", str(new)]) == 2  # the folder exists now: refused
    err = capsys.readouterr().err
    assert "already exists" in err and "never overwrites" in err
    assert fingerprint(new) == written
    weighted = tmp_path / "weighted"
    assert main(["average", str(source), "--last", "3", "--out", str(weighted), "--weights", "0", "0", "1"]) == 0
    assert all(torch.equal(v, six[k]) for k, v in load_run(weighted)[0].state_dict().items())


def test_average_refuses_bad_input_in_one_line(source, tmp_path, capsys):
    import re

    from poslab.cli.app import main

    cases = [
        (["--last", "4"], r"keeps 3 checkpoint\(s\) \(steps \[2, 4, 6\]\); averaging the last 4"),
        (["--last", "0"], "an int >= 1"),
        (["--last", "2", "--weights", "1"], "one weight per state dict"),
        (["--last", "2", "--weights", "1", "-1"], r"weights\[1\] = -1.0"),
    ]
    for args, match in cases:
        out = tmp_path / "new"
        assert main(["average", str(source), *args, "--out", str(out)]) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("poslab: error:") and re.search(match, err), err
        assert not out.exists()  # nothing half-written
    assert main(["average", str(tmp_path / "nowhere"), "--last", "1", "--out", str(tmp_path / "x")]) == 2
    assert "no run" in capsys.readouterr().err
