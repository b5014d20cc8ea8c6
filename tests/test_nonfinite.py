"""NaN/inf during training: detected at the step it happens, the run stops naming that step with the
last good checkpoint kept, or (``--skip-nonfinite N``) up to N bad batches are skipped and recorded.

Bad batches are made two ways: an absurd learning rate (the weights overflow after one update), and
a test hook that poisons one particular batch (by content, so it is the same batch after a resume):
its loss becomes NaN, or its loss stays finite and its gradient becomes inf.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from conftest import TRAINING

import poslab.training.loop as train_module
from poslab.cli.app import main
from poslab.runs import load_run, read_metrics
from poslab.session import train
from poslab.training import checkpoint as ckpt
from poslab.training.config import TrainConfig
from poslab.training.loop import TrainingDiverged

FIGURES = {"runs": 0, "detected_within_one_step": 0, "skipped_batches": 0}


#: :func:`conftest.tiny_config`'s form here: dropout, batch 4 and a checkpoint every step (10 steps)
NONFINITE: dict[str, Any] = dict(
    model=dict(dropout=0.1),
    max_steps=10,
    batch_size=4,
    lr=3e-3,
    min_lr=3e-4,
    warmup_steps=2,
    lr_decay_steps=20,
    eval_interval=5,
    ckpt_interval=1,
    seed=11,
)


def batches_of(cfg: TrainConfig, monkeypatch) -> list[torch.Tensor]:
    """The training batches a clean run of ``cfg`` feeds the model, in order (evaluation excluded)."""
    drawn = []
    base = train_module.GPT

    class Spy(base):
        def forward(self, idx, targets=None, **kwargs):
            if self.training and targets is not None:
                drawn.append(idx.clone())
            return super().forward(idx, targets, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(train_module, "GPT", Spy)
        train(cfg, progress=False)
    return drawn


class Poison:
    """Patch ``poslab.training.loop.GPT`` so a forward pass on a poisoned batch gives a NaN loss (``"loss"``) or a
    finite loss whose gradient is inf (``"grad"``)."""

    def __init__(self, monkeypatch, poisoned: list[torch.Tensor], kind: str) -> None:
        base = train_module.GPT
        hits = self.hits = []

        class Poisoned(base):
            def forward(self, idx, targets=None, **kwargs):
                out = super().forward(idx, targets, **kwargs)
                if (
                    not self.training
                    or targets is None
                    or not any(idx.shape == p.shape and torch.equal(idx, p) for p in poisoned)
                ):
                    return out
                hits.append(idx)
                logits, loss = out
                if kind == "loss":
                    return logits, loss * float("nan")
                loss.register_hook(lambda grad: grad * float("inf"))
                return logits, loss

        monkeypatch.setattr(train_module, "GPT", Poisoned)


def curve(run_dir) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("tokens_per_s", "time_s")} for r in read_metrics(run_dir)]


@pytest.mark.parametrize("kind", ["loss", "grad"])
def test_a_bad_batch_stops_the_run_at_its_step_with_the_last_good_checkpoint(make_config, monkeypatch, kind, request):
    batches = batches_of(make_config(NONFINITE, name="clean"), monkeypatch)
    Poison(monkeypatch, [batches[5]], kind)  # the 6th batch: step 6
    cfg = make_config(NONFINITE)
    seen = []
    with pytest.raises(TrainingDiverged, match=r"diverged at step 6: .*last good checkpoint is step 5"):
        train(cfg, progress=False, callback=lambda step, record: seen.append(step))
    assert seen == [1, 2, 3, 4, 5]  # detected at the bad step itself, before any update from it
    results = json.loads((cfg.run_dir / "results.json").read_text())
    assert results["status"] == "diverged" and results["diverged_at_step"] == 6 and results["last_good_checkpoint"] == 5
    assert ckpt.list_checkpoints(cfg.run_dir) == [1, 2, 3, 4, 5]  # nothing written at or after the bad step
    model, _, _ = load_run(cfg.run_dir)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert [r["step"] for r in read_metrics(cfg.run_dir)] == [1, 2, 3, 4, 5]
    FIGURES["runs"] += 1
    FIGURES["detected_within_one_step"] += 1
    _record(request)


def test_skip_nonfinite_skips_bad_batches_records_them_and_survives_a_resume(make_config, monkeypatch, request):
    batches = batches_of(make_config(NONFINITE, name="clean"), monkeypatch)
    Poison(monkeypatch, [batches[3], batches[7]], "loss")
    straight = make_config(NONFINITE, name="straight", skip_nonfinite=2)
    results = train(straight, progress=False)
    assert results["status"] == "completed" and results["skipped_nonfinite"] == [4, 7]  # steps that lost a batch
    records = read_metrics(straight.run_dir)
    assert [r["step"] for r in records] == list(range(1, 11))
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in records)
    assert [r.get("skipped_nonfinite", 0) for r in records] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 2]
    # interrupted after the first skip and resumed: the skip is remembered, the curve is the same
    resumed = make_config(NONFINITE, name="resumed", skip_nonfinite=2)

    def crash(step, record):
        if step == 5:
            raise RuntimeError("power cut")

    with pytest.raises(RuntimeError):
        train(resumed, progress=False, callback=crash)
    assert train(resumed, resume=True, progress=False)["skipped_nonfinite"] == [4, 7]
    assert curve(resumed.run_dir) == curve(straight.run_dir)
    # one bad batch more than allowed: diverged, naming the skips already used
    strict = make_config(NONFINITE, name="strict", skip_nonfinite=1)
    with pytest.raises(TrainingDiverged, match=r"diverged at step 7: .*1 non-finite batches were skipped"):
        train(strict, progress=False)
    assert json.loads((strict.run_dir / "results.json").read_text())["skipped_nonfinite"] == [4]
    FIGURES["runs"] += 3
    FIGURES["detected_within_one_step"] += 3
    FIGURES["skipped_batches"] += 2 + 2 + 1
    _record(request)


def test_absurd_learning_rate_on_the_command_line(tmp_path, corpus, capsys, request):
    argv = [
        "train",
        "--preset",
        "tiny",
        "--corpus",
        corpus,
        "--out_dir",
        str(tmp_path),
        "--name",
        "hot",
        "--model.block_size",
        "16",
        "--batch_size",
        "4",
        "--max_steps",
        "10",
        "--ckpt_interval",
        "1",
        "--lr",
        "1e30",
        "--min_lr",
        "1e29",
        "--warmup_steps",
        "0",
        "--grad_clip",
        "0",
        "--threads",
        "1",
        "--no-progress",
    ]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        err[-1].startswith("poslab: error: training diverged at step 2: ")
        and "last good checkpoint is step 1" in err[-1]
    )
    results = json.loads((tmp_path / "hot" / "results.json").read_text())
    assert results["diverged_at_step"] == 2 and ckpt.latest_step(tmp_path / "hot") == 1
    # --skip-nonfinite (dashes read as underscores): the bad batches are skipped, then it still stops
    assert main([*argv, "--name", "hot-skip", "--skip-nonfinite", "3"]) == 1
    err = capsys.readouterr().err
    assert err.count("skipped a non-finite batch at step 2") == 3 and "3 non-finite batches were skipped" in err
    assert json.loads((tmp_path / "hot-skip" / "results.json").read_text())["skipped_nonfinite"] == [2, 2, 2]
    FIGURES["runs"] += 2
    FIGURES["detected_within_one_step"] += 2
    FIGURES["skipped_batches"] += 3
    _record(request)


def test_skip_nonfinite_is_validated():
    with pytest.raises(ValueError, match="skip_nonfinite must be >= 0"):
        TrainConfig(name="x", skip_nonfinite=-1)
    with pytest.raises(TypeError, match="skip_nonfinite must be an integer"):
        TrainConfig(name="x", skip_nonfinite=1.5)


def _record(request) -> None:
    from test_reliability_artifacts import mode, record

    record("nonfinite", mode(request), FIGURES)
    FIGURES.update(runs=0, detected_within_one_step=0, skipped_batches=0)


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(make_config):
    cfg = make_config(TRAINING, max_steps=30, ckpt_interval=10)

    def poison(step, record):
        if step == 14:
            model_param = poison.model_param
            with torch.no_grad():
                model_param.fill_(float("nan"))

    original = train_module.make_optimizer

    def capture(model, c):
        poison.model_param = next(model.parameters())
        return original(model, c)

    train_module.make_optimizer = capture
    try:
        with pytest.raises(TrainingDiverged, match=r"diverged at step 15.*last good checkpoint is step 10"):
            train(cfg, progress=False, callback=poison)
    finally:
        train_module.make_optimizer = original
    assert ckpt.latest_step(cfg.run_dir) == 10
    results = json.loads((cfg.run_dir / "results.json").read_text())
    assert results["status"] == "diverged" and results["diverged_at_step"] == 15
    model, _, _ = load_run(cfg.run_dir)
    assert all(torch.isfinite(p).all() for p in model.parameters())
