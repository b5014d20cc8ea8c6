"""Corrupt checkpoints are refused with a clear message naming the previous good one.

Every single-bit flip and truncation of the latest checkpoint's two files (the ``.safetensors``
tensors, the ``.json`` metadata) and a checkpoint copied in from a run with another config must
either be refused by ``load_run`` (``CheckpointError`` naming the file and the previous good
checkpoint) or load exactly what was saved (a flip that changes nothing, e.g. ``1e-3`` -> ``1E-3``);
a checkpoint that loads different numbers ("silently wrong") fails the test. ``poslab train
--resume`` falls back to the previous good checkpoint with a warning and reproduces the
uninterrupted run bitwise.

A run stopped in process (Ctrl-C, SIGINT, a crash) resumes bitwise; a resume with another config lists the
keys that differ; checkpoint writes are atomic, go through the injected checkpointer, and never unpickle.

Also: a model-only checkpoint samples but does not resume, an unreadable checkpoint ``.json`` or a
stray step name is passed over, a forged training state (random-generator state, optimizer step or
param groups, checksums recomputed) is refused by ``--resume`` in one line.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import signal

import pytest
import torch
from cli_helpers import error_line, refused, resume, resume_args
from conftest import TRAINING
from run_helpers import record, reforge, tiny

from poslab.cli.app import main
from poslab.data import load_corpus
from poslab.runs import RunFolder, load_run, read_metrics
from poslab.session import train
from poslab.training import checkpoint as ckpt
from poslab.training.config import TrainConfig

STEPS = (2, 4, 6)  # checkpoints of the corrupted run; 6 is the latest


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A finished run with checkpoints at 2, 4, 6, a longer uninterrupted one, and one with another config."""
    root = tmp_path_factory.mktemp("corruption")
    corpus = root / "corpus.txt"
    corpus.write_text(load_corpus("shakespeare")[:20_000], encoding="utf-8")

    def config(name, **overrides):
        model = {
            "n_layer": 1,
            "n_head": 2,
            "n_embd": 16,
            "block_size": 16,
            "dropout": 0.1,
            **overrides.pop("model", {}),
        }
        values = dict(
            name=name,
            out_dir=str(root / "runs"),
            corpus=str(corpus),
            model=model,
            max_steps=6,
            batch_size=4,
            lr=3e-3,
            min_lr=3e-4,
            warmup_steps=2,
            lr_decay_steps=10,
            eval_interval=3,
            eval_iters=1,
            log_interval=1,
            ckpt_interval=2,
            keep_checkpoints=0,
            seed=5,
            threads=1,
        )
        return TrainConfig.from_dict({**values, **overrides})

    run = config("run")
    train(run, progress=False)
    reference = config("reference", max_steps=8)
    train(reference, progress=False)
    other = config("other", model={"n_head": 4})
    train(other, progress=False)
    return {"config": config, "run": run.run_dir, "reference": reference.run_dir, "other": other.run_dir}


def _state(run_dir, step=None):
    model, _, _ = load_run(run_dir, step)
    return {k: v.clone() for k, v in model.state_dict().items()}


def _outcome(run_dir, original: dict, counts: dict) -> None:
    """Load the run's latest checkpoint: refused with the right message, or exactly the saved weights."""
    try:
        state = _state(run_dir)
    except ckpt.CheckpointError as err:
        message = str(err)
        assert "\n" not in message
        assert "step_0000006" in message or "step 6" in message, message  # names the bad checkpoint
        assert "previous good checkpoint is step 4" in message, message  # and offers the previous one
        counts["refused"] += 1
        return
    if state.keys() == original.keys() and all(torch.equal(state[k], original[k]) for k in state):
        counts["loaded_identical"] += 1
    else:
        counts["silently_wrong"] += 1


def _corrupt_everything(run_dir, n_flips: int, seed: int) -> dict:
    folder = run_dir / ckpt.CHECKPOINT_DIR
    original = _state(run_dir)
    counts = {
        "corruptions_tried": 0,
        "refused": 0,
        "loaded_identical": 0,
        "silently_wrong": 0,
        "bit_flips": 0,
        "truncations": 0,
        "wrong_config": 0,
    }
    rng = random.Random(seed)
    for suffix in (".safetensors", ".json"):
        path = folder / f"step_0000006{suffix}"
        good = path.read_bytes()
        cuts = sorted({0, 1, 8, len(good) // 2, len(good) - 1})
        for cut in cuts:  # truncated (a kill or a full disk mid-copy)
            path.write_bytes(good[:cut])
            _outcome(run_dir, original, counts)
            counts["truncations"] += 1
        for _ in range(n_flips // 2):  # one flipped bit anywhere in the file
            position, bit = rng.randrange(len(good)), rng.randrange(8)
            flipped = bytearray(good)
            flipped[position] ^= 1 << bit
            path.write_bytes(bytes(flipped))
            _outcome(run_dir, original, counts)
            counts["bit_flips"] += 1
        path.write_bytes(good)
    counts["corruptions_tried"] = counts["truncations"] + counts["bit_flips"]
    return counts


def _wrong_config(runs, counts: dict) -> None:
    """A checkpoint copied in from a run with another config (both files, so the checksums agree)."""
    folder = runs["run"] / ckpt.CHECKPOINT_DIR
    saved = {s: (folder / f"step_0000006{s}").read_bytes() for s in (".json", ".safetensors")}
    original = _state(runs["run"])
    for suffix in saved:
        shutil.copy(runs["other"] / ckpt.CHECKPOINT_DIR / f"step_0000006{suffix}", folder / f"step_0000006{suffix}")
    with pytest.raises(ckpt.CheckpointError, match=r"different config: model\.n_head: 4 \(checkpoint\) vs 2 \(now\)"):
        load_run(runs["run"])
    _outcome(runs["run"], original, counts)
    # only the metadata swapped in: the tensor file no longer matches the sha256 it records
    (folder / "step_0000006.safetensors").write_bytes(saved[".safetensors"])
    with pytest.raises(ckpt.CheckpointError, match="corrupt"):
        load_run(runs["run"])
    _outcome(runs["run"], original, counts)
    counts["wrong_config"] += 2
    counts["corruptions_tried"] += 2
    for suffix, data in saved.items():
        (folder / f"step_0000006{suffix}").write_bytes(data)


def _check_and_record(request, counts):
    from test_reliability_artifacts import mode, record

    record("corruption", mode(request), counts)
    assert counts["silently_wrong"] == 0, counts
    assert counts["refused"] + counts["loaded_identical"] == counts["corruptions_tried"], counts
    assert counts["refused"] >= 0.9 * counts["corruptions_tried"], counts


def test_truncated_bit_flipped_and_foreign_checkpoints_are_refused(runs, request):
    counts = _corrupt_everything(runs["run"], n_flips=120, seed=0)
    _wrong_config(runs, counts)
    _check_and_record(request, counts)
    load_run(runs["run"])  # restored: loads again


@pytest.mark.slow
def test_every_kind_of_corruption_many_times(runs, request):
    counts = _corrupt_everything(runs["run"], n_flips=3000, seed=1)
    _wrong_config(runs, counts)
    _check_and_record(request, counts)


@pytest.mark.parametrize("damage", ["truncate", "flip", "foreign"])
def test_resume_falls_back_to_the_previous_good_checkpoint(runs, damage, tmp_path, capsys):
    run = tmp_path / "runs" / "run"
    shutil.copytree(runs["run"], run)
    tensors = run / ckpt.CHECKPOINT_DIR / "step_0000006.safetensors"
    meta = run / ckpt.CHECKPOINT_DIR / "step_0000006.json"
    if damage == "truncate":
        tensors.write_bytes(tensors.read_bytes()[:-100])
    elif damage == "flip":
        raw = bytearray(meta.read_bytes())
        raw[raw.index(b'"log_loss_sum"') + 20] ^= 0x01  # a digit of a number: still valid JSON
        meta.write_bytes(bytes(raw))
    else:
        for path in (tensors, meta):
            shutil.copy(runs["other"] / ckpt.CHECKPOINT_DIR / path.name, path)
    cfg = runs["config"]("run", out_dir=str(tmp_path / "runs"), max_steps=8)
    train(cfg, resume=True, progress=False)
    err = capsys.readouterr().err
    assert "poslab: warning:" in err and ("step_0000006" in err or "step 6" in err), err
    assert "resuming from the previous good checkpoint, step 4" in err, err
    # the replayed steps 5-6 and the new 7-8 are exactly the uninterrupted 8-step run's
    drop = ("tokens_per_s", "time_s")
    ours = [{k: v for k, v in r.items() if k not in drop} for r in read_metrics(run)]
    theirs = [{k: v for k, v in r.items() if k not in drop} for r in read_metrics(runs["reference"])]
    assert ours == theirs
    assert json.loads((run / "results.json").read_text())["resumed_from"] == 4


def test_cli_names_the_previous_good_checkpoint_and_loads_it_on_request(runs, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(runs["run"], run)
    tensors = run / ckpt.CHECKPOINT_DIR / "step_0000006.safetensors"
    tensors.write_bytes(tensors.read_bytes()[: len(tensors.read_bytes()) // 2])
    assert main(["sample", str(run), "--tokens", "4", "--seed", "0"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "is corrupt" in lines[0] and "previous good checkpoint is step 4" in lines[0], lines
    assert "--step 4" in lines[0]
    assert main(["sample", str(run), "--tokens", "4", "--seed", "0", "--step", "4"]) == 0


def test_no_good_checkpoint_left_is_a_clear_error(runs, tmp_path):
    run = tmp_path / "runs" / "run"
    shutil.copytree(runs["run"], run)
    for step in STEPS:
        path = run / ckpt.CHECKPOINT_DIR / f"{ckpt.checkpoint_name(step)}.safetensors"
        path.write_bytes(b"")
    with pytest.raises(ckpt.CheckpointError, match=r"no usable checkpoint .*step_0000006.*step_0000002.*--overwrite"):
        train(runs["config"]("run", out_dir=str(tmp_path / "runs"), max_steps=8), resume=True, progress=False)
    with pytest.raises(ckpt.CheckpointError, match="no earlier checkpoint verifies"):
        load_run(run)


def test_a_garbled_latest_pointer_falls_back_to_the_newest_checkpoint(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs["run"], run)
    (run / ckpt.CHECKPOINT_DIR / "latest").write_bytes(b"\xff\xfe garbage")
    assert ckpt.latest_step(run) == 6
    load_run(run)


@pytest.mark.parametrize("strip", ["rng.data", "rng.torch", "exp_avg", "optimizer"])
def test_a_model_only_checkpoint_samples_but_does_not_resume(run, strip, capsys, request):
    if strip == "optimizer":
        reforge(run, meta_edit=lambda meta: {k: v for k, v in meta.items() if k != "optimizer"})
    else:
        reforge(run, tensors_edit=lambda t: {k: v for k, v in t.items() if not (k == strip or k.endswith(f".{strip}"))})
    assert main(["sample", str(run), "--tokens", "3", "--seed", "1"]) == 0
    capsys.readouterr()
    assert resume(run, "--max_steps", "6") == 2
    line = error_line(capsys)
    assert "holds the model only" in line and "cannot resume the optimizer" in line and "--init_from" in line
    record(request, model_only_sampled=1, model_only_resume_refused=1)


@pytest.mark.parametrize("damage", ["folder", "no-best"])
def test_an_unreadable_checkpoint_json_falls_back_to_the_previous_one(tmp_path, corpus, damage, capsys, request):
    cfg = tiny(tmp_path / "runs", corpus, ckpt_interval=2)
    train(cfg, progress=False)
    newest = cfg.run_dir / "checkpoints" / "step_0000004.json"
    if damage == "folder":  # unreadable: a folder where the JSON was
        newest.unlink()
        newest.mkdir()
    else:  # consistent (checksums recomputed) but without the training state's "best"
        reforge(cfg.run_dir, meta_edit=lambda meta: {k: v for k, v in meta.items() if k != "best"})
    capsys.readouterr()
    results = train(tiny(tmp_path / "runs", corpus, ckpt_interval=2, max_steps=3), resume=True, progress=False)
    assert results["resumed_from"] == 2
    assert "resuming from the previous good checkpoint, step 2" in capsys.readouterr().err
    record(request, resume_edge_cases_ok=1)


def test_a_stray_non_ascii_step_name_is_ignored(run, capsys, request):
    folder = run / "checkpoints"
    stray = "step_" + "\u0660" * 6 + "\u0669"  # Arabic-Indic digits: int() reads 9
    for suffix in (".json", ".safetensors"):
        shutil.copy(folder / f"step_0000004{suffix}", folder / f"{stray}{suffix}")
    (folder / "latest").unlink()
    assert ckpt.list_checkpoints(run) == [4]
    assert main(["sample", str(run), "--tokens", "2", "--seed", "1"]) == 0
    assert resume(run, "--max_steps", "5") == 0
    record(request, resume_edge_cases_ok=1)


def test_resume_without_any_checkpoint_says_it_starts_from_zero(run, capsys, request):
    shutil.rmtree(run / "checkpoints")
    (run / "results.json").unlink()
    assert resume(run, "--max_steps", "2") == 0
    assert "has no checkpoint yet: --resume starts it from step 0" in capsys.readouterr().err
    assert RunFolder(run).results()["resumed_from"] == 0 and RunFolder(run).finished(2)
    record(request, resume_edge_cases_ok=1)


def test_resume_matches_the_uninterrupted_run_through_run_folder(tmp_path, corpus):
    """The loop writes through RunFolder; a resume still continues the curve bitwise."""
    model = dict(n_layer=1, n_head=2, n_embd=16, block_size=16, dropout=0.1)
    same = dict(ckpt_interval=3, eval_interval=3, lr_decay_steps=6, model=model)
    whole = tiny(tmp_path / "a", corpus, max_steps=6, **same)
    train(whole, progress=False)
    part = tiny(tmp_path / "b", corpus, max_steps=3, **same)
    train(part, progress=False)
    train(tiny(tmp_path / "b", corpus, max_steps=6, **same), resume=True, progress=False)
    keys = ("step", "loss", "lr", "grad_norm", "val_loss")
    curve = [[r.get(k) for k in keys] for r in read_metrics(whole.run_dir)]
    assert [[r.get(k) for k in keys] for r in read_metrics(part.run_dir)] == curve
    a, b = load_run(whole.run_dir)[0], load_run(part.run_dir)[0]
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


# ---------------------------------------------------------------------- forged files with consistent checksums
def forge_rng(name: str):
    return lambda t: {**t, name: torch.zeros(7, dtype=torch.uint8)}


def forge_step(t):
    (key,) = [k for k in t if k.startswith("optim.state.0.") and k.endswith(".step")] or ["optim.state.0.step"]
    return {**t, key: torch.zeros(5)}


@pytest.mark.parametrize(
    ("tensors_edit", "meta_edit", "needle"),
    [
        (forge_rng("rng.torch"), None, "unusable random-generator state 'rng.torch'"),
        (forge_rng("rng.data"), None, "unusable random-generator state 'rng.data'"),
        (forge_step, None, "step counter"),
        (
            None,
            lambda m: {**m, "optimizer": {**m["optimizer"], "param_groups": [1]}},
            "unusable optimizer param_groups",
        ),
    ],
    ids=["rng-torch-7-bytes", "rng-data-7-bytes", "step-shape-5", "param-groups-1"],
)
@pytest.mark.usefixtures("hostile_figures")
def test_a_forged_training_state_is_refused_by_resume(run, tensors_edit, meta_edit, needle, capsys):
    reforge(run, tensors_edit=tensors_edit, meta_edit=meta_edit)
    refused(capsys, [*resume_args(run), "--max_steps", "6"], needle)


# ---------------------------------------------------------------------- interrupted in process, then resumed
COMPARED = ("step", "loss", "lr", "grad_norm", "val_loss")  # everything but timings


def curve(run_dir) -> list[tuple]:
    return [tuple(r.get(k) for k in COMPARED) for r in read_metrics(run_dir)]


def test_resume_after_ctrl_c_is_bitwise_identical(make_config):
    reference = make_config(TRAINING, name="straight")
    train(reference, progress=False)

    cfg = make_config(TRAINING, name="interrupted")

    def interrupt(step, record):
        if step == 13:  # not a checkpoint step: Ctrl-C must save one
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfg, progress=False, callback=interrupt)
    assert ckpt.latest_step(cfg.run_dir) == 13
    assert [r["step"] for r in read_metrics(cfg.run_dir)][-1] == 13
    assert not (cfg.run_dir / "results.json").exists()
    train(cfg, resume=True, progress=False)
    assert curve(cfg.run_dir) == curve(reference.run_dir)  # exact float equality, dropout included
    a, _, _ = load_run(reference.run_dir)
    b, _, _ = load_run(cfg.run_dir)
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), name


def test_resume_after_a_crash_replays_from_the_last_checkpoint(make_config):
    reference = make_config(TRAINING, name="straight", model=dict(dropout=0.0), grad_accum=2)
    train(reference, progress=False)
    cfg = make_config(TRAINING, name="crashed", model=dict(dropout=0.0), grad_accum=2)

    def crash(step, record):
        if step == 17:
            raise RuntimeError("power cut")

    with pytest.raises(RuntimeError, match="power cut"):
        train(cfg, progress=False, callback=crash)
    assert ckpt.latest_step(cfg.run_dir) == 10
    with open(cfg.run_dir / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 18, "lo')  # a torn line from the kill
    train(cfg, resume=True, progress=False)
    assert curve(cfg.run_dir) == curve(reference.run_dir)


def test_sigint_saves_a_checkpoint_then_exits(make_config):
    cfg = make_config(TRAINING)

    def press_ctrl_c(step, record):
        if step == 5:
            os.kill(os.getpid(), signal.SIGINT)

    # Python's own handler, whatever this process inherited (a background job starts with SIGINT ignored)
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            train(cfg, progress=False, callback=press_ctrl_c)
        assert ckpt.latest_step(cfg.run_dir) == 5
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler restored
    finally:
        signal.signal(signal.SIGINT, inherited)


def test_resume_with_a_different_config_lists_the_keys(make_config):
    cfg = make_config(TRAINING, max_steps=4, eval_interval=2)
    train(cfg, progress=False)
    changed = make_config(TRAINING, max_steps=8, eval_interval=2, lr=1e-2, model=dict(n_embd=64))
    with pytest.raises(ValueError, match=r"model\.n_embd: 32.*vs 64.*train\.lr"):
        train(changed, resume=True, progress=False)
    longer = make_config(TRAINING, max_steps=8, eval_interval=2)  # max_steps may change
    assert train(longer, resume=True, progress=False)["steps"] == 8


# ---------------------------------------------------------------------- the loop's checkpoint files
def test_the_loop_checkpoints_through_the_checkpointer_it_is_given(make_config):
    """The checkpointer is injected: the loop saves through it (its own ``keep``, not the config's) and resumes
    from it."""
    from poslab.runs import RunFolder
    from poslab.training.checkpointer import Checkpointer
    from poslab.training.distributed import DistContext
    from poslab.training.loop import Hooks, run_training

    class Recording(Checkpointer):
        def save(self, step, state, identity):
            saved.append(step)
            return super().save(step, state, identity)

        def restore(self, state, identity):
            restored.append(state.progress.step)
            return super().restore(state, identity)

    saved, restored = [], []

    def run_it(cfg, resuming: bool) -> dict:
        run = RunFolder(cfg.run_dir)
        with run.lock():
            run.prepare(resuming, False)
            hooks = Hooks(progress=False)
            return run_training(
                cfg, run, resuming=resuming, dist_ctx=DistContext(), hooks=hooks, checkpointer=Recording(run, 1)
            )

    run_it(make_config(TRAINING, max_steps=12, ckpt_interval=5), resuming=False)
    assert saved == [5, 10, 12] and restored == []
    assert RunFolder(make_config(TRAINING).run_dir).checkpoints() == [12]  # keep_checkpoints=0 in the config
    assert run_it(make_config(TRAINING, max_steps=14, ckpt_interval=5), resuming=True)["resumed_from"] == 12
    assert saved == [5, 10, 12, 14] and restored == [0]


def test_checkpoint_write_is_atomic(make_config, monkeypatch):
    cfg = make_config(TRAINING, max_steps=20, ckpt_interval=10)

    def crash_at_second_save(step, record):
        if step == 15:

            def broken_save(tensors, filename, metadata=None):
                with open(filename, "wb") as handle:
                    handle.write(b"half a file")
                raise OSError("disk full")

            monkeypatch.setattr(ckpt, "save_file", broken_save)

    with pytest.raises(OSError, match="disk full"):
        train(cfg, progress=False, callback=crash_at_second_save)
    folder = cfg.run_dir / "checkpoints"
    assert ckpt.latest_step(cfg.run_dir) == 10
    assert sorted(p.name for p in folder.iterdir()) == ["latest", "step_0000010.json", "step_0000010.safetensors"]
    load_run(cfg.run_dir)  # the previous checkpoint is intact


def test_corrupt_checkpoint_and_foreign_config_are_detected(make_config):
    a = make_config(TRAINING, name="a", max_steps=4, ckpt_interval=4)
    b = make_config(TRAINING, name="b", max_steps=4, ckpt_interval=4, model=dict(n_head=4, dropout=0.0))
    train(a, progress=False)
    train(b, progress=False)
    # a checkpoint copied in from another run: the error lists the keys that differ
    for suffix in (".json", ".safetensors"):
        src = b.run_dir / "checkpoints" / f"step_0000004{suffix}"
        (a.run_dir / "checkpoints" / f"step_0000004{suffix}").write_bytes(src.read_bytes())
    with pytest.raises(
        ckpt.CheckpointError, match=r"model\.dropout: 0\.0 \(checkpoint\) vs 0\.1.*model\.n_head: 4 \(checkpoint\) vs 2"
    ):
        load_run(a.run_dir)
    # a damaged tensor file
    tensors = b.run_dir / "checkpoints" / "step_0000004.safetensors"
    raw = bytearray(tensors.read_bytes())
    raw[-1] ^= 0xFF
    tensors.write_bytes(bytes(raw))
    with pytest.raises(ckpt.CheckpointError, match="corrupt"):
        load_run(b.run_dir)
    with pytest.raises(ckpt.CheckpointError, match="available steps"):
        load_run(b.run_dir, step=3)


def test_loading_never_unpickles(make_config, monkeypatch):
    cfg = make_config(TRAINING, max_steps=4, ckpt_interval=2)
    train(cfg, progress=False)

    def forbidden(*args, **kwargs):
        raise AssertionError("pickle used while loading")

    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(torch, "load", forbidden)
    load_run(cfg.run_dir)
    train(make_config(TRAINING, max_steps=6, ckpt_interval=2), resume=True, progress=False)
    suffixes = {p.suffix for p in (cfg.run_dir / "checkpoints").iterdir()}
    assert suffixes == {".json", ".safetensors", ""}  # "" is the `latest` pointer


def test_resuming_a_run_that_ended_keeps_its_results(make_config, capsys):
    cfg = make_config(TRAINING, name="ended")
    first = train(cfg, progress=False)
    assert first["status"] == "completed" and first["tokens_per_s"] > 0
    saved = (cfg.run_dir / "results.json").read_bytes()
    metrics = (cfg.run_dir / "metrics.jsonl").read_bytes()
    capsys.readouterr()
    again = train(cfg, resume=True, progress=False)
    assert again == first  # the measurements of the training that made the run, not an empty session's
    assert (cfg.run_dir / "results.json").read_bytes() == saved
    assert (cfg.run_dir / "metrics.jsonl").read_bytes() == metrics
    assert f"already ended at step {cfg.max_steps} (completed)" in capsys.readouterr().err
    longer = train(make_config(TRAINING, name="ended", max_steps=cfg.max_steps + 2), resume=True, progress=False)
    assert longer["steps"] == cfg.max_steps + 2 and longer["resumed_from"] == cfg.max_steps  # a new end: trains on


def test_a_run_that_reached_its_target_has_ended(make_config):
    from poslab.jobs.sweep import run_state

    cfg = make_config(TRAINING, name="target", stop_val_loss=100.0)  # reached at the first evaluation
    first = train(cfg, progress=False)
    assert first["status"] == "target reached" and first["steps"] < cfg.max_steps
    run = RunFolder(cfg.run_dir)
    assert run.state == "finished" and run.finished(cfg.max_steps)
    assert run_state(cfg.run_dir, cfg.max_steps) == "done"  # a sweep does not retrain it as diverged
    assert train(cfg, resume=True, progress=False) == first  # no step past the target
    lower = train(make_config(TRAINING, name="target", stop_val_loss=0.01), resume=True, progress=False)
    assert lower["steps"] == cfg.max_steps and lower["resumed_from"] == first["steps"]  # another target: on
