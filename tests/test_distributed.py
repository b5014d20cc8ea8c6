"""Distributed training under torchrun (gloo, CPU): DDP equivalence, rank-0-only writes, resume, FSDP.

The default run launches torchrun twice (2 processes each, 1 thread each):

* 2 processes x batch 4 (x2 accumulation) against 1 process x batch 8 (x2), same seed, dropout 0:
  the loss after 20 steps, the validation losses and the final train loss agree to 1e-5; a probe
  wrapped around ``poslab train`` records every file-system write of each rank: rank 1 makes none.
* That DDP run, cut back to its step-10 checkpoint (a crash after step 10), is resumed under
  torchrun with ``--fsdp``: it continues from step 10, matches the uninterrupted run to 1e-5, and
  its final (gathered) checkpoint loads with plain ``load_run`` and reproduces the recorded val loss;
  no gloo thread of either rank outlives the command (one alive at interpreter exit can abort a
  finished run with ``terminate called without an active exception``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from poslab.cli.app import main
from poslab.data import get_batch
from poslab.runs import load_run, read_metrics
from poslab.training import checkpoint as ckpt
from poslab.training import distributed
from poslab.training.config import TrainConfig
from poslab.training.data import prepare_data
from poslab.training.distributed import DistContext
from poslab.training.evaluation import evaluate_loss

TOL = 1e-5
STEPS = 20


def train_args(corpus: str, out: Path, name: str, batch_size: int, *extra: str) -> list[str]:
    """``poslab train`` arguments shared by every run here (tiny model, fp32, dropout 0, 1 thread)."""
    return [
        "train",
        "--preset",
        "tiny",
        "--corpus",
        corpus,
        "--name",
        name,
        "--out_dir",
        str(out),
        "--batch_size",
        str(batch_size),
        "--grad_accum",
        "2",
        "--max_steps",
        str(STEPS),
        "--lr_decay_steps",
        str(STEPS),
        "--warmup_steps",
        "5",
        "--eval_interval",
        "10",
        "--eval_iters",
        "2",
        "--log_interval",
        "5",
        "--ckpt_interval",
        "10",
        "--keep_checkpoints",
        "0",
        "--seed",
        "3",
        "--threads",
        "1",
        "--model.dropout",
        "0",
        "--no-progress",
        *extra,
    ]


PROBE = textwrap.dedent('''
    """Run ``poslab`` with every file-system write under ROOT recorded, to LOGDIR/writes-rank<RANK>.json."""
    import builtins, io, json, os, shutil, sys

    root, logdir, argv = os.path.realpath(sys.argv[1]), sys.argv[2], sys.argv[3:]
    writes = []

    def note(kind, path):
        full = os.path.realpath(os.fspath(path))
        if full == root or full.startswith(root + os.sep):
            writes.append([kind, full])

    real_open = builtins.open

    def open_(file, mode="r", *args, **kwargs):
        if not isinstance(file, int) and any(c in mode for c in "wax+"):
            note("open", file)
        return real_open(file, mode, *args, **kwargs)

    builtins.open = io.open = open_
    real_os_open = os.open

    def os_open(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            note("os.open", path)
        return real_os_open(path, flags, *args, **kwargs)

    os.open = os_open
    for name in ("replace", "rename", "remove", "unlink", "mkdir", "makedirs", "rmdir", "truncate"):
        def wrapped(path, *args, _real=getattr(os, name), _name=name, **kwargs):
            note(_name, path)
            if _name in ("replace", "rename"):
                note(_name, args[0])  # the destination
            return _real(path, *args, **kwargs)
        setattr(os, name, wrapped)
    real_rmtree = shutil.rmtree

    def rmtree(path, *args, **kwargs):
        note("rmtree", path)
        return real_rmtree(path, *args, **kwargs)

    shutil.rmtree = rmtree
    from poslab.cli.app import main

    try:
        code = main(argv)
    finally:
        rank = os.environ.get("RANK", "0")
        with real_open(os.path.join(logdir, "writes-rank%s.json" % rank), "w") as f:
            json.dump(writes, f)
        threads = []  # the native threads still running once the command returned (Linux)
        if os.path.isdir("/proc/self/task"):
            for task in os.listdir("/proc/self/task"):
                with real_open("/proc/self/task/%s/comm" % task) as f:
                    threads.append(f.read().strip())
        with real_open(os.path.join(logdir, "threads-rank%s.json" % rank), "w") as f:
            json.dump(threads, f)
    sys.exit(code)
''')


def torchrun(args: list[str], *, nproc: int = 2, script: list[str] | None = None) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --standalone`` (a free port) with 1 thread per process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    target = script if script is not None else ["-m", "poslab"]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(nproc),
        *target,
        *args,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, f"torchrun failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done


def metric_at(run_dir: Path, step: int, key: str = "loss") -> float:
    return next(r[key] for r in read_metrics(run_dir) if r["step"] == step)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus):
    """The 1-process reference (in this process) and the 2-process DDP run under the write probe."""
    base = tmp_path_factory.mktemp("dist")
    out, logs = base / "runs", base / "writes"
    out.mkdir()
    logs.mkdir()
    assert main(train_args(corpus, out, "single", 8)) == 0
    probe = base / "probe.py"
    probe.write_text(PROBE, encoding="utf-8")
    torchrun(train_args(corpus, out, "ddp", 4), script=[str(probe), str(out), str(logs)])
    return {"out": out, "logs": logs, "single": out / "single", "ddp": out / "ddp"}


def test_two_processes_match_one_process_with_the_global_batch(runs):
    single = json.loads((runs["single"] / "results.json").read_text())
    ddp = json.loads((runs["ddp"] / "results.json").read_text())
    assert ddp["world_size"] == 2 and ddp["backend"] == "gloo" and ddp["fsdp"] is False
    assert "world_size" not in single  # a plain run's results are unchanged
    assert ddp["steps"] == single["steps"] == STEPS
    assert ddp["tokens_seen"] == single["tokens_seen"]  # global tokens: 2 x 4 x 2 x 32 per step
    assert abs(metric_at(runs["ddp"], STEPS) - metric_at(runs["single"], STEPS)) < TOL
    for step in (10, 20):
        assert abs(metric_at(runs["ddp"], step, "val_loss") - metric_at(runs["single"], step, "val_loss")) < TOL
    for key in ("final_val_loss", "final_train_loss"):
        assert abs(ddp[key] - single[key]) < TOL, (key, ddp[key], single[key])
    # the loss moved: the comparison is not between two untrained models
    assert metric_at(runs["single"], 5) - metric_at(runs["single"], STEPS) > 0.3
    config = json.loads((runs["ddp"] / "config.json").read_text())
    assert config["distributed"] == {"world_size": 2, "backend": "gloo", "fsdp": False, "device": "cpu"}
    tensors, meta = ckpt.load_checkpoint(runs["ddp"], STEPS)
    assert meta["world_size"] == 2 and "rng.torch.rank1" in tensors
    assert not torch.equal(tensors["rng.torch"], tensors["rng.torch.rank1"])  # each rank its own dropout stream


def test_only_rank_0_writes(runs):
    rank0 = json.loads((runs["logs"] / "writes-rank0.json").read_text())
    rank1 = json.loads((runs["logs"] / "writes-rank1.json").read_text())
    written = {Path(path).name for _, path in rank0}
    assert {"config.json", "tokenizer.json", "results.json", "latest", "metrics.jsonl"} <= written, written
    assert rank1 == []
    assert sorted(p.name for p in (runs["ddp"] / "checkpoints").iterdir()) == [
        "latest",
        "step_0000010.json",
        "step_0000010.safetensors",
        "step_0000020.json",
        "step_0000020.safetensors",
    ]


def test_resume_under_torchrun_with_fsdp_continues_the_run(runs, corpus):
    """A crash after step 10 (the run cut back to its step-10 checkpoint), resumed with --fsdp."""
    out, resumed = runs["out"], runs["out"] / "resumed"
    shutil.copytree(runs["ddp"], resumed)
    for suffix in (".json", ".safetensors"):
        (resumed / "checkpoints" / f"step_0000020{suffix}").unlink()
    ckpt.atomic_write_text(resumed / "checkpoints" / "latest", "step_0000010\n")
    (resumed / "results.json").unlink()

    logs = out.parent / "resume-writes"
    logs.mkdir()
    torchrun(
        train_args(corpus, out, "resumed", 4, "--resume", "--fsdp"),
        script=[str(out.parent / "probe.py"), str(out), str(logs)],
    )
    # no gloo thread outlives the command: DTensor's caches would keep the process group (and its
    # threads) alive until interpreter exit, where its destruction can abort a finished run
    for rank in (0, 1):
        threads = json.loads((logs / f"threads-rank{rank}.json").read_text())
        assert threads and not [name for name in threads if "gloo" in name], (rank, threads)
    ddp = json.loads((runs["ddp"] / "results.json").read_text())
    results = json.loads((resumed / "results.json").read_text())
    assert results["resumed_from"] == 10 and results["steps"] == STEPS and results["fsdp"] is True
    assert [r["step"] for r in read_metrics(resumed)] == [5, 10, 15, 20]
    assert abs(metric_at(resumed, STEPS) - metric_at(runs["ddp"], STEPS)) < TOL
    assert abs(results["final_val_loss"] - ddp["final_val_loss"]) < TOL
    assert results["n_params"] == ddp["n_params"]  # global sizes, not the shards

    # the FSDP checkpoint holds full tensors: plain load_run, and it reproduces the recorded val loss
    model, _, config = load_run(resumed)
    assert sum(p.numel() for p in model.parameters()) == ddp["n_params"]
    cfg = TrainConfig.from_dict({**config["train"], "model": {}})
    val = prepare_data(cfg).val
    again = evaluate_loss(model, val, config["model"]["block_size"], 8, cfg.eval_iters, seed=cfg.seed + 1)
    assert abs(again - results["final_val_loss"]) < 1e-5


def test_resume_with_another_number_of_processes_is_refused(runs, corpus, capsys):
    code = main(train_args(corpus, runs["out"], "ddp", 4, "--resume", "--max_steps", "30"))
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "trained by 2 process(es), this launch has 1" in err[0]
    assert "--nproc_per_node = 2" in err[0]


# ------------------------------------------------------------------------------------------ no launch
def test_a_plain_process_is_not_distributed(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    context = distributed.setup()
    assert not context.enabled and context.world_size == 1 and context.is_main
    assert context.config_section() == {} and context.checkpoint_meta() == {} and context.rng_states() == {}
    assert distributed.is_main_process()
    monkeypatch.setenv("RANK", "1")
    assert not distributed.is_main_process()


def test_bad_torchrun_environment_and_fsdp_without_torchrun(monkeypatch, capsys, corpus, tmp_path):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ValueError, match="--fsdp .*torchrun"):
        distributed.setup(fsdp=True)
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(ValueError, match=r"\['WORLD_SIZE'\] missing"):
        distributed.setup()
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ValueError, match="RANK=1 and WORLD_SIZE=1 are inconsistent"):
        distributed.setup()
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="WORLD_SIZE='two' must be an integer"):
        distributed.setup()
    for key in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key)
    assert main(train_args(corpus, tmp_path, "x", 4, "--fsdp")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "torchrun --nproc_per_node 2" in err[0]
    assert not (tmp_path / "x").exists()


def test_shards_are_the_rows_of_the_global_batch():
    data = torch.arange(1000)
    x, y = get_batch(data, 16, 3 * 4, torch.Generator().manual_seed(5))  # the global batch of 3 ranks x 4
    parts = [DistContext(rank=r, world_size=3, backend="gloo").shard(x, y, 4) for r in range(3)]
    assert all(px.shape == (4, 16) for px, _ in parts)
    assert torch.equal(torch.cat([px for px, _ in parts]), x) and torch.equal(torch.cat([py for _, py in parts]), y)
    starts = {int(px[i, 0]) for px, _ in parts for i in range(4)}
    assert len(starts) == 12  # distinct windows (no rank repeats another's)
    alone = DistContext()
    assert alone.shard(x, y, 12)[0] is x  # a single process: untouched


def test_check_resume_names_both_sizes():
    with pytest.raises(ValueError, match=r"trained by 1 process\(es\), this launch has 4.*a single process"):
        DistContext(rank=0, world_size=4, backend="gloo").check_resume({"step": 10}, "runs/x")
    DistContext(rank=0, world_size=4, backend="gloo").check_resume({"step": 10, "world_size": 4}, "runs/x")
    DistContext().check_resume({"step": 10}, "runs/x")


# ------------------------------------------------------------------------------------------ slow
@pytest.mark.slow
def test_dropout_resume_under_ddp_is_bitwise(tmp_path, corpus):
    """With dropout each rank has its own RNG stream; a resume restores every rank's stream exactly."""
    out = tmp_path / "runs"
    torchrun(train_args(corpus, out, "straight", 4, "--model.dropout", "0.2"))
    torchrun(train_args(corpus, out, "cut", 4, "--model.dropout", "0.2", "--max_steps", "10"))
    torchrun(train_args(corpus, out, "cut", 4, "--model.dropout", "0.2", "--resume"))
    assert read_metrics(out / "cut") == [
        {**r, "time_s": c["time_s"], "tokens_per_s": c["tokens_per_s"]}
        for r, c in zip(read_metrics(out / "straight"), read_metrics(out / "cut"))
    ]
    a = json.loads((out / "straight" / "results.json").read_text())
    b = json.loads((out / "cut" / "results.json").read_text())
    assert a["final_val_loss"] == b["final_val_loss"]


@pytest.mark.slow
def test_fsdp_matches_ddp_uninterrupted(tmp_path, corpus):
    out = tmp_path / "runs"
    torchrun(train_args(corpus, out, "ddp", 4))
    torchrun(train_args(corpus, out, "fsdp", 4, "--fsdp"))
    a = json.loads((out / "ddp" / "results.json").read_text())
    b = json.loads((out / "fsdp" / "results.json").read_text())
    assert abs(a["final_val_loss"] - b["final_val_loss"]) < TOL
    assert abs(metric_at(out / "ddp", STEPS) - metric_at(out / "fsdp", STEPS)) < TOL
