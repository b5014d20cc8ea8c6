"""Reliability of the run folder (``RunFolder``): symlinked writers, the tokenizer's digest,
forged-but-consistent files, resume edge cases. Each case guards a failure the one reader/writer
prevents (a second writer through a symlink, a swapped tokenizer sampled silently, raw ``KeyError``s,
``--resume`` of a missing folder exiting 2, ...)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from test_runs import corpus_file
from test_runs import tiny as tiny_run_config

from poslab.cli.app import main
from poslab.runs import RunFolder, load_run, read_metrics
from poslab.session import train
from poslab.training import checkpoint as ckpt
from poslab.training.config import TrainConfig
from poslab.training.lock import RunLock, lock_path

pytestmark = pytest.mark.usefixtures("single_thread")

SMALL = [
    "--model.n_layer",
    "1",
    "--model.n_embd",
    "16",
    "--model.block_size",
    "16",
    "--batch_size",
    "2",
    "--eval_iters",
    "1",
    "--threads",
    "1",
    "--no-progress",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return corpus_file(tmp_path_factory)


def tiny(out: Path, corpus: Path, **overrides) -> TrainConfig:
    """:func:`test_runs.tiny` named ``A``, with one checkpoint at the end."""
    return tiny_run_config(out, corpus, **{"name": "A", "ckpt_interval": 0, "seed": 5, **overrides})


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus):
    out = tmp_path_factory.mktemp("runs")
    cfg = tiny(out, corpus)
    train(cfg, progress=False)
    return cfg.run_dir


@pytest.fixture
def run(trained, tmp_path) -> Path:
    """A copy of the trained run in ``tmp_path/runs/A`` (one checkpoint, step 4)."""
    copy = tmp_path / "runs" / "A"
    shutil.copytree(trained, copy)
    return copy


def record(request, **figures) -> None:
    """Add this case's figures to the reliability table (test-artifacts/reliability.json)."""
    from test_reliability_artifacts import mode
    from test_reliability_artifacts import record as write

    write("run_folder", mode(request), {"cases": 1, **figures})


def error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("poslab: error:")]
    assert len(err) == 1, err
    return err[0]


def resume(run: Path, *extra: str) -> int:
    return main(["train", "--resume", "--name", run.name, "--out_dir", str(run.parent), "--no-progress", *extra])


# ------------------------------------------------------------------------------------ 1. symlinked writers
def test_a_symlinked_name_shares_the_lock_of_its_folder(run, capsys, request):
    alias = run.parent / "B"
    os.symlink(run.name, alias)
    assert lock_path(alias) == lock_path(run)
    before = read_metrics(run)
    with RunLock(run):  # the trainer of A
        assert resume(alias, "--max_steps", "6") == 2
        assert "is in use by another poslab process" in error_line(capsys)
    assert read_metrics(run) == before  # B never rewrote A's metrics
    record(request, symlinked_writers_refused=1)


def test_overwrite_through_a_symlinked_name_is_refused(run, corpus, request):
    alias = run.parent / "B"
    os.symlink(run.name, alias)
    with pytest.raises(FileExistsError, match="is a symbolic link to 'A'; overwrite that folder by its own name"):
        train(tiny(run.parent, corpus, name="B"), overwrite=True, progress=False)
    assert alias.is_symlink() and RunFolder(run).finished(4)
    record(request, symlinked_writers_refused=1)


@pytest.mark.parametrize("kind", ["symlink", "dangling", "directory"])
def test_a_planted_lock_path_is_refused_not_followed(run, tmp_path, kind, capsys, request):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    planted = lock_path(run)
    if kind == "symlink":
        os.symlink(victim, planted)
    elif kind == "dangling":
        os.symlink(tmp_path / "nowhere", planted)
    else:
        planted.mkdir()
    with pytest.raises(
        OSError,
        match={
            "symlink": "is a symbolic link to",
            "dangling": "is a dangling symbolic link",
            "directory": "is a directory, not a lock file",
        }[kind],
    ):
        RunLock(run).acquire()
    assert resume(run) != 0 and str(planted) in error_line(capsys)
    changed = victim.read_text() != "precious\n"
    record(request, planted_lock_paths_refused=1, victim_files_changed=int(changed))
    assert not changed  # never truncated through the link


# ------------------------------------------------------------------------------------ 2. tokenizer digest
def test_a_changed_tokenizer_is_refused_by_sample_and_resume(run, capsys, request):
    path = run / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    chars = list(data["chars"])
    chars[3], chars[4] = chars[4], chars[3]  # still a valid tokenizer: the letters exchanged
    data["chars"] = "".join(chars) if isinstance(data["chars"], str) else chars
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    assert main(["sample", str(run), "--tokens", "4"]) == 2
    assert "tokenizer.json' was changed after training" in error_line(capsys)
    assert resume(run, "--max_steps", "6") == 2
    assert "tokenizer.json' was changed after training" in error_line(capsys)
    record(request, changed_tokenizers_refused=1)


def swap_tokenizer_letters(run: Path) -> None:
    """Exchange two letters of ``tokenizer.json`` and record its new sha256 in ``config.json``: a consistent forgery."""
    path = run / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    chars = list(data["chars"])
    chars[3], chars[4] = chars[4], chars[3]
    data["chars"] = "".join(chars) if isinstance(data["chars"], str) else chars
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    digest = ckpt.sha256_file(path)
    rewrite_config(run, lambda doc: {**doc, "data": {**doc["data"], "tokenizer_sha256": digest}})


@pytest.mark.parametrize(
    ("forge", "needle", "resume_needle"),
    [
        (swap_tokenizer_letters, "tokenizer.json' was changed after checkpoint step 4", "no usable checkpoint"),
        (
            lambda run: rewrite_config(run, lambda doc: {**doc, "data": {**doc["data"], "corpus_sha256": "0" * 64}}),
            "the data section of",
            "the corpus text changed since the run started",
        ),
    ],
)
def test_a_consistent_forgery_of_a_run_file_is_refused_by_eval_sample_and_resume(
    run, forge, needle, resume_needle, capsys, request
):
    """The checkpoint records the digests of the tokenizer and the config's data section, and its own
    checksums cover that record: a file rewritten together with the digest ``config.json`` keeps of it
    no longer matches."""
    forge(run)
    assert main(["eval", str(run), "--lengths", "16", "--tokens", "64"]) == 2
    assert needle in error_line(capsys)
    assert main(["sample", str(run), "--tokens", "4"]) == 2
    assert needle in error_line(capsys)
    assert resume(run, "--max_steps", "6") == 2
    assert resume_needle in error_line(capsys)
    record(request, forged_files_one_line=1)


def test_a_checkpoint_without_run_file_digests_still_loads(run, capsys, request):
    """A checkpoint of the format that records no digests of the run files is read as before."""
    reforge(run, meta_edit=lambda meta: {k: v for k, v in meta.items() if k != ckpt.RUN_FILES})
    assert ckpt.RUN_FILES not in ckpt.load_checkpoint(run)[1]
    assert main(["sample", str(run), "--tokens", "3", "--seed", "1"]) == 0
    assert resume(run, "--max_steps", "6") == 0
    assert ckpt.RUN_FILES in ckpt.load_checkpoint(run)[1]  # the resumed run's checkpoints record them
    record(request, resume_edge_cases_ok=1)


# ------------------------------------------------------------------------------------ 3. forged, consistent
def rewrite_config(run: Path, edit) -> None:
    doc = json.loads((run / "config.json").read_text(encoding="utf-8"))
    (run / "config.json").write_text(json.dumps(edit(doc)), encoding="utf-8")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda doc: {}, "config.json' lacks the 'model' section"),
        (lambda doc: {k: v for k, v in doc.items() if k != "train"}, "config.json' lacks the 'train' section"),
        (
            lambda doc: {**doc, "model": {**doc["model"], "n_head": "two"}},
            "config.json': the model section does not build",
        ),
    ],
)
def test_a_forged_config_is_one_line(run, edit, message, capsys, request):
    rewrite_config(run, edit)
    assert main(["sample", str(run), "--tokens", "2"]) == 2
    assert message in error_line(capsys)
    record(request, forged_files_one_line=1)


def test_a_tokenizer_without_chars_is_one_line(run, capsys, request):
    data = json.loads((run / "tokenizer.json").read_text(encoding="utf-8"))
    del data["chars"]
    (run / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    digest = ckpt.sha256_file(run / "tokenizer.json")
    rewrite_config(run, lambda doc: {**doc, "data": {**doc["data"], "tokenizer_sha256": digest}})  # consistent
    assert main(["sample", str(run), "--tokens", "2"]) == 2
    assert "tokenizer.json' is not a usable 'char' tokenizer: it lacks 'chars'" in error_line(capsys)
    record(request, forged_files_one_line=1)


def reforge(run: Path, tensors_edit=None, meta_edit=None) -> None:
    """Rewrite the latest checkpoint with its checksums recomputed (a consistent forgery)."""
    tensors, meta = ckpt.load_checkpoint(run)
    step = meta["step"]
    meta = {k: v for k, v in meta.items() if k not in ("sha256", "step", "tensors_file")}
    if tensors_edit:
        tensors = tensors_edit(tensors)
    if meta_edit:
        meta = meta_edit(meta)
    ckpt.save_checkpoint(run, step, tensors, meta)


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


def test_non_finite_weights_are_refused_by_sample(run, capsys, request):
    def poison(tensors):
        tensors["model.tok_emb.weight"][0, 0] = float("nan")
        return tensors

    reforge(run, tensors_edit=poison)
    assert main(["sample", str(run), "--tokens", "2"]) == 2
    assert "non-finite weights (NaN/inf) in model.tok_emb.weight" in error_line(capsys)
    record(request, forged_files_one_line=1)


# ------------------------------------------------------------------------------- 5. a folder moved under a training
@pytest.mark.parametrize("how", ["delete", "rename", "replace"])
def test_a_run_folder_deleted_or_moved_during_training_stops_it(tmp_path, corpus, how, request):
    """Deleted, renamed, or renamed with a new folder put at its name after the checkpoint of step 2: the
    checkpoint of step 4 is refused in one line, nothing is recreated at the old name (no results.json,
    no empty checkpoints/), and a renamed run resumes under its new name."""
    from poslab.runs import RunFolderMoved

    cfg = tiny(tmp_path / "runs", corpus, ckpt_interval=2, max_steps=6)
    moved = cfg.run_dir.with_name("B")

    def move(step: int, record: dict) -> None:
        if step == 2:
            if how == "delete":
                shutil.rmtree(cfg.run_dir)
            else:
                os.replace(cfg.run_dir, moved)
                if how == "replace":
                    cfg.run_dir.mkdir()

    with pytest.raises(
        RunFolderMoved, match=r"was deleted or moved during training .* before writing checkpoint step 4"
    ):
        train(cfg, callback=move, progress=False)
    if how == "replace":
        assert cfg.run_dir.is_dir() and not any(cfg.run_dir.iterdir())  # the folder put there is left as it was
    else:
        assert not cfg.run_dir.exists()
    if how != "delete":
        assert RunFolder(moved).latest_step() == 2 and RunFolder(moved).results() is None
        results = train(
            tiny(tmp_path / "runs", corpus, ckpt_interval=2, max_steps=6, name="B"), resume=True, progress=False
        )
        assert results["resumed_from"] == 2 and results["steps"] == 6
    record(request, moved_folders_stopped=1)


def test_poslab_train_stops_in_one_line_when_its_folder_is_deleted(tmp_path, corpus, request):
    """``rm -rf RUN`` once a checkpoint exists, from another process: exit 2 and one error line, not "done"."""
    import subprocess
    import sys
    import time

    out = tmp_path / "runs"
    argv = ["train", "--preset", "tiny", "--name", "x", "--out_dir", str(out), "--corpus", str(corpus)]
    argv += ["--max_steps", "100000", "--ckpt_interval", "5", "--eval_interval", "100000", *SMALL]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "poslab", *argv], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while ckpt.latest_step(out / "x") is None and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ckpt.latest_step(out / "x") is not None, "no checkpoint within 60 s"
        while (out / "x").exists():  # rm -rf: again while a checkpoint being written races it
            shutil.rmtree(out / "x", ignore_errors=True)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    errors = [line for line in err.splitlines() if line.startswith("poslab: error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert "was deleted or moved during training" in errors[0] and "done:" not in err
    assert not (out / "x").exists()
    record(request, moved_folders_stopped=1)


# ------------------------------------------------------------------------------------ 9. resume edge cases
def test_preset_resume_of_a_run_that_was_never_created_starts_it(tmp_path, corpus, capsys, request):
    out = tmp_path / "runs"
    argv = [
        "train",
        "--preset",
        "tiny",
        "--name",
        "fresh",
        "--out_dir",
        str(out),
        "--corpus",
        str(corpus),
        "--max_steps",
        "2",
        "--eval_interval",
        "2",
        *SMALL,
        "--resume",
    ]
    assert main(argv) == 0
    assert "does not exist yet: --resume starts the run" in capsys.readouterr().err
    assert RunFolder(out / "fresh").finished(2)
    assert main(argv[:-1] + ["--max_steps", "3", "--resume"]) == 0  # and a real resume still resumes
    assert RunFolder(out / "fresh").results()["resumed_from"] == 2
    record(request, resume_edge_cases_ok=1)


@pytest.mark.parametrize("new_run_started", [False, True])
def test_an_overwrite_killed_early_is_cleaned_up(run, corpus, new_run_started, capsys, request):
    hidden = run.with_name(f".{run.name}.replaced-999999")
    shutil.copytree(run, hidden)
    if not new_run_started:  # killed right after moving the old run away: the folder is empty
        shutil.rmtree(run)
        run.mkdir()
    # the next start: the interrupted command again (--overwrite), or a resume of the new run
    results = train(
        tiny(run.parent, corpus, max_steps=5), resume=new_run_started, overwrite=not new_run_started, progress=False
    )
    err = capsys.readouterr().err
    assert not hidden.exists()
    assert ("restored" if not new_run_started else "removed") in err
    if new_run_started:  # the new run's folder was kept and resumed
        assert results["resumed_from"] == 4
    else:  # the old run was given back, then replaced by the --overwrite that runs now
        assert results["resumed_from"] is None and results["steps"] == 5
        assert not list(run.parent.glob(".A.replaced-*"))
    record(request, resume_edge_cases_ok=1)


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
