"""Time to quality: ``stop_val_loss``, whole-split evaluation, the Muon option, the preset and
``benchmarks/time_to_loss.py`` (a fast smoke of both contenders)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
import torch
from run_helpers import tiny_preset

from poslab.runs import load_run, read_metrics
from poslab.session import train
from poslab.training import presets
from poslab.training.config import TrainConfig
from poslab.training.data import prepare_data
from poslab.training.evaluation import evaluate_loss
from poslab.training.optim import ChainedOptimizer, lr_at, make_optimizer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import time_to_loss  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")


def _tiny(tmp_path: Path, corpus: str, **overrides) -> TrainConfig:
    """:func:`run_helpers.tiny_preset` of 30 steps, checkpoints every 10."""
    return tiny_preset(tmp_path, corpus, **{"ckpt_interval": 10, "lr_decay_steps": 30, "max_steps": 30, **overrides})


def test_stop_val_loss_stops_at_the_first_evaluation_under_it(tmp_path: Path, corpus: str) -> None:
    full = train(_tiny(tmp_path, corpus, name="full", eval_interval=5, eval_iters=0), progress=False)
    curve = [r for r in read_metrics(tmp_path / "full") if "val_loss" in r]
    target = curve[2]["val_loss"] + 1e-9  # reached at the third evaluation, not before
    assert all(r["val_loss"] > target for r in curve[:2])
    stopped = train(
        _tiny(tmp_path, corpus, name="stop", eval_interval=5, eval_iters=0, stop_val_loss=target), progress=False
    )
    assert stopped["status"] == "target reached" and stopped["steps"] == curve[2]["step"] == 15
    assert stopped["target"]["reached"] and stopped["target"]["step"] == 15
    assert stopped["target"]["tokens"] == 15 * 8 * 32 == stopped["tokens_seen"]
    assert 0 < stopped["target"]["train_time_s"] <= stopped["wall_time_s"]
    assert full["status"] == "completed" and full["steps"] == 30
    model, _, _ = load_run(tmp_path / "stop")  # the checkpoint of the stopping step: usable by sample/eval
    cfg = _tiny(tmp_path, corpus, name="stop")
    assert evaluate_loss(model, prepare_data(cfg).val, 32, 8, None) == pytest.approx(
        stopped["target"]["val_loss"], abs=1e-6
    )


def test_eval_iters_zero_is_the_whole_validation_split(tmp_path: Path, corpus: str) -> None:
    result = train(_tiny(tmp_path, corpus, name="whole", eval_iters=0, max_steps=10, lr_decay_steps=10), progress=False)
    model, _, _ = load_run(tmp_path / "whole")
    whole = evaluate_loss(model, prepare_data(_tiny(tmp_path, corpus, name="whole")).val, 32, 8, None)
    assert result["final_val_loss"] == pytest.approx(whole, abs=1e-6)
    assert "target" not in result


def test_the_last_steps_evaluation_is_the_final_one(tmp_path: Path, corpus: str, monkeypatch) -> None:
    """A whole-split evaluation at the last step is not repeated for the final figure; it runs in fuller batches."""
    from poslab.training import loop

    calls: list[tuple[int, int | None]] = []  # (batch, iters) of each evaluation

    def counting(model, data, block_size, batch_size, iters, **kwargs):
        calls.append((batch_size, iters))
        return evaluate_loss(model, data, block_size, batch_size, iters, **kwargs)

    monkeypatch.setattr(loop, "evaluate_loss", counting)
    result = train(
        _tiny(tmp_path, corpus, name="once", eval_interval=5, eval_iters=0, max_steps=10, lr_decay_steps=10),
        progress=False,
    )
    whole = [batch for batch, iters in calls if iters is None]
    assert len(whole) == 2  # steps 5 and 10; the final figure is step 10's
    assert set(whole) == {8 * (loop.WHOLE_SPLIT_BATCH // 8)}
    curve = [r["val_loss"] for r in read_metrics(tmp_path / "once") if "val_loss" in r]
    assert result["final_val_loss"] == curve[-1]


def test_muon_trains_and_resumes_bitwise(tmp_path: Path, corpus: str) -> None:
    straight = train(_tiny(tmp_path, corpus, name="muon", optimizer="muon"), progress=False)
    train(_tiny(tmp_path, corpus, name="muon-resumed", optimizer="muon", max_steps=10), progress=False)
    resumed = train(_tiny(tmp_path, corpus, name="muon-resumed", optimizer="muon"), resume=True, progress=False)
    assert resumed["final_val_loss"] == straight["final_val_loss"]
    adamw = train(_tiny(tmp_path, corpus, name="adamw"), progress=False)
    assert adamw["final_val_loss"] != straight["final_val_loss"]  # a different optimizer, a different run


def test_muon_takes_the_block_matrices_and_adamw_the_rest(tmp_path: Path, corpus: str) -> None:
    from poslab import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=20, n_layer=2, n_head=2, n_embd=16, block_size=8, bias=True))
    opt = make_optimizer(model, _tiny(tmp_path, corpus, name="x", optimizer="muon"))
    assert isinstance(opt, ChainedOptimizer)
    muon, adamw = opt.optimizers
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    muon_ids = {id(p) for g in muon.param_groups for p in g["params"]}
    block_matrices = {id(p) for n, p in model.named_parameters() if n.startswith("blocks.") and p.dim() == 2}
    assert muon_ids == block_matrices
    assert id(model.tok_emb.weight) not in muon_ids
    every = [id(p) for g in opt.param_groups for p in g["params"]]
    assert sorted(every) == sorted(id(p) for p in model.parameters())  # each parameter once
    for group in opt.param_groups:  # the loop's schedule reaches both parts
        group["lr"] = 0.123
    assert muon.param_groups[0]["lr"] == adamw.param_groups[0]["lr"] == 0.123


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("optimizer", "sgd", "optimizer='sgd' is not allowed; choose one of ['adamw', 'muon']"),
        ("stop_val_loss", 0.0, "stop_val_loss must be > 0 or None, got 0.0"),
        ("eval_iters", -1, "eval_iters must be >= 0, got -1"),
    ],
)
def test_bad_values_get_one_line_errors(tmp_path: Path, corpus: str, key: str, value, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        _tiny(tmp_path, corpus, name="bad", **{key: value})


def test_fast_preset_is_listed_and_builds() -> None:
    assert "shakespeare-char-fast" in presets.names()
    cfg = TrainConfig.from_dict({**presets.preset_config("shakespeare-char-fast"), "name": "x"})
    assert cfg.stop_val_loss == pytest.approx(1.90) and cfg.eval_iters == 0
    assert cfg.model.block_size == 64  # the recipe's windows: its whole-split loss is comparable with nanoGPT's
    # warmup-stable-decay: the peak lr until the cooldown, then down to min_lr = 0 by the last step
    assert cfg.decay_steps == cfg.max_steps and cfg.min_lr == 0.0
    assert lr_at(cfg.decay_steps - cfg.cooldown_steps, cfg) == cfg.lr > lr_at(cfg.max_steps - 1, cfg) > 0.0
    # one whole-split evaluation, at the last step: the only one that can find the crossing
    evaluated = [s for s in range(1, cfg.max_steps + 1) if s % cfg.eval_interval == 0 or s == cfg.max_steps]
    assert evaluated == [cfg.max_steps]
    quick = TrainConfig.from_dict({**presets.preset_config("shakespeare-char-fast", quick=True), "name": "x"})
    assert quick.stop_val_loss is None and quick.max_steps < cfg.max_steps


def test_time_to_loss_smoke(tmp_path: Path, corpus: str) -> None:
    """Both contenders through the benchmark's own functions, tiny: the rows have what the table needs."""
    args = argparse.Namespace(
        target=4.0, nano_iters=4, nano_eval_every=2, preset="tiny", eval_every=5, threads=1, runs=tmp_path / "runs"
    )
    ids = torch.randint(0, 65, (3000,), generator=torch.Generator().manual_seed(0))
    nano = time_to_loss.nanogpt_run(1, args, ids[:2000], ids[2000:], 65)
    label, overrides = time_to_loss.parse_variant("tiny-b4:batch_size=4,lr=2e-3,model.n_embd=16")
    assert overrides == {"batch_size": 4, "lr": 0.002, "model.n_embd": 16}
    row = time_to_loss.poslab_run(args, label, {**overrides, "corpus": corpus}, seed=1)
    assert nano["steps"] == 4 and [c["step"] for c in nano["curve"]] == [2, 4] and nano["tokens"] == 4 * 12 * 64
    assert row["reached"] and row["crossing"]["val_loss"] <= 4.0 and row["steps"] % 5 == 0
    assert row["tokens"] == row["steps"] * 4 * 32
    summary = time_to_loss.summarise([nano, row], 4.0)
    assert summary["tiny-b4"]["reached"] == 1
    assert ("time_vs_nanogpt_recipe" in summary["tiny-b4"]) and summary["tiny-b4"]["time_vs_nanogpt_recipe"] > 0
    with pytest.raises(SystemExit, match="is not key=value"):
        time_to_loss.parse_variant("x:lr")


def test_gpu_preset_is_nanogpts_gpu_recipe_with_the_fast_levers() -> None:
    recipe = time_to_loss.NANOGPT_RECIPES["gpu"]
    cfg = TrainConfig.from_dict({**presets.preset_config("shakespeare-char-gpu"), "name": "x"})
    m = cfg.model
    assert (m.n_layer, m.n_head, m.n_embd, m.block_size) == (recipe.layers, recipe.heads, recipe.d, recipe.block)
    assert m.dropout == recipe.dropout == 0.2 and not m.bias
    assert (cfg.batch_size, cfg.max_steps, cfg.lr_decay_steps) == (recipe.batch, recipe.iters, recipe.iters)
    assert (cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.beta2) == (1e-3, 1e-4, 100, 0.99)
    assert m.position == "rope" and cfg.dtype == "auto" and cfg.eval_iters == 0
    assert cfg.stop_val_loss == pytest.approx(recipe.target)
    assert time_to_loss.DEFAULT_PRESETS["gpu"] == "shakespeare-char-gpu"


def test_gpu_preset_dry_run_on_cpu(tmp_path: Path) -> None:
    import json
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, "-m", "poslab", "train", "--preset", "shakespeare-char-gpu", "--dry-run"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    resolved = json.loads(proc.stdout)["config"]
    assert resolved["model"]["n_embd"] == 384 and resolved["max_steps"] == 5000
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing


def test_nanogpt_gpu_recipe_runs_dry_on_the_cpu(tmp_path: Path) -> None:
    """The GPU recipe's nanoGPT side (dropout 0.2, 6/6/384, block 256) through the benchmark, 2 steps."""
    args = argparse.Namespace(
        target=1.47, nano_iters=2, nano_eval_every=2, recipe="gpu", device="cpu", nano_dtype="fp32", dry_run=True
    )
    ids = torch.randint(0, 65, (4000,), generator=torch.Generator().manual_seed(0))
    row = time_to_loss.nanogpt_run(1, args, ids[:3000], ids[3000:], 65)
    assert row["steps"] == 2 and row["tokens"] == 2 * time_to_loss.DRY_BATCH * 256
    assert [c["step"] for c in row["curve"]] == [2] and 3.5 < row["final_val_loss"] < 5.0  # about ln 65


def test_whole_process_runs_both_contenders_launch_to_exit(tmp_path: Path, corpus: str) -> None:
    """``--whole-process``'s two processes, dry: the variant's overrides reach the run, the crossing is the
    run folder's, and each process's time is launch to exit (more than its training steps and its run)."""
    import json

    args = argparse.Namespace(
        target=10.0, nano_iters=2, preset="tiny", eval_every=None, threads=1, runs=tmp_path / "runs", dry_run=True
    )
    overrides = {"corpus": corpus, "model.n_embd": 16, "dtype": "fp32"}
    command = time_to_loss.poslab_command(args, "tiny16", overrides, seed=3)
    assert command[3:6] == ["train", "--preset", "tiny"] and "--model.n_embd=16" in command and "--seed=3" in command
    row = time_to_loss.poslab_process(args, "tiny16", overrides, seed=3)
    run_dir = tmp_path / "runs" / "process" / "tiny16-s3"
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["model"]["n_embd"] == 16 and saved["train"]["seed"] == 3
    assert saved["train"]["max_steps"] == time_to_loss.DRY_STEPS
    results = json.loads((run_dir / "results.json").read_text())
    assert row["reached"] and row["crossing"] == {k: results["target"][k] for k in row["crossing"]}
    assert row["crossing"]["step"] == time_to_loss.DRY_STEPS and row["dtype"] == "fp32"
    assert 0 < row["train_time_s"] < row["run_wall_s"] < row["process_wall_s"] and row["process_cpu_s"] > 0
    nano = time_to_loss.nanogpt_process(args, seed=3)
    assert nano["steps"] == 2 and 0 < nano["train_time_s"] < nano["run_wall_s"] < nano["process_wall_s"]
    assert 3.5 < nano["val_loss_20_batches"] < 5.0  # about ln 65 after 2 steps
    summary = time_to_loss.summarise_processes([nano, row])
    assert summary["tiny16"]["reached"] == 1 and len(summary["tiny16"]["speedup_process_wall_s"]) == 1
    assert "speedup_process_wall_s" not in summary["nanoGPT"]
    with pytest.raises(SystemExit, match="exited 3; its output"):
        time_to_loss.timed_process([sys.executable, "-c", "raise SystemExit(3)"], 1, tmp_path / "failed.log")


def test_a_process_that_missed_the_target_has_no_speed_up() -> None:
    """``summarise_processes``: the speed-up is a time to quality, so only the seeds that reached the target
    count; a contender that missed on every seed has none."""

    def proc(name: str, seed: int, wall: float, reached: bool = True) -> dict:
        return {"contender": name, "seed": seed, "process_wall_s": wall, "process_cpu_s": wall,
                "train_time_s": wall - 5, "reached": reached}  # fmt: skip

    rows = [proc("nanoGPT", 1, 120.0), proc("nanoGPT", 2, 130.0), proc("fast", 1, 40.0), proc("fast", 2, 26.0, False)]
    rows += [proc("slow", 1, 60.0, False), proc("slow", 2, 60.0, False)]
    summary = time_to_loss.summarise_processes(rows)
    assert summary["fast"]["reached"] == 1 and summary["fast"]["speedup_process_wall_s"] == [3.0]
    assert summary["fast"]["speedup_process_wall_s_mean"] == 3.0
    assert summary["slow"]["reached"] == 0 and "speedup_process_wall_s_mean" not in summary["slow"]


def test_whole_process_table_divides_nanogpts_times_by_each_contenders() -> None:
    """``time_to_loss_table.py``: per seed, nanoGPT's process times over the contender's (wall / CPU /
    training steps), the crossing or the miss, and the mean ± sd of the per-seed wall and CPU ratios."""
    import time_to_loss_table

    def proc(name: str, seed: int, wall: float, cpu: float, steps: float, val: float | None = None) -> dict:
        row = {"contender": name, "seed": seed, "process_wall_s": wall, "process_cpu_s": cpu, "train_time_s": steps}
        if name != "nanoGPT":
            cross = {"step": 900, "val_loss": val} if val is not None and val <= 1.9 else None
            row.update(dtype="fp32", crossing=cross, final_val_loss=val)
        return row

    report = {
        "seeds": [1, 2],
        "processes": [
            proc("nanoGPT", 1, 120.0, 118.0, 110.0),
            proc("fast", 1, 40.0, 40.0, 33.0, val=1.8876),
            proc("nanoGPT", 2, 132.0, 130.0, 121.0),
            proc("fast", 2, 40.0, 39.0, 33.0, val=1.9012),
        ],
    }
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")] for line in time_to_loss_table.table(report).splitlines()
    ]
    assert rows[2] == [
        "1",
        "120.0 s / 118.0 s (110.0 s)",
        "40.0 s / 40.0 s (33.0 s), step 900, 1.8876",
        "3.00x / 2.95x (3.33x)",
    ]
    # seed 2 missed 1.90: it has no time to quality, so no speed-up, and the mean is seed 1's alone
    assert rows[3][2:] == ["40.0 s / 39.0 s (33.0 s), missed (1.9012)", "none: missed the target"]
    assert rows[4] == [
        "mean ± sd",
        "",
        "",
        "**3.00 ± 0.00x** / 2.95 ± 0.00x (3.33x), over the 1 seeds that reached it (1 missed)",
    ]
    with pytest.raises(SystemExit, match="no nanoGPT process"):
        time_to_loss_table.table({"seeds": [1], "processes": [proc("fast", 1, 40.0, 40.0, 33.0, val=1.88)]})
