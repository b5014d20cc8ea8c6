"""The run folder's files as found on disk: a changed or forged tokenizer, config or weights (even with
consistent checksums), a folder deleted or moved while it trains, an ``--overwrite`` killed early, an
existing folder (refused unless resumed or overwritten; an overwrite that fails early gives the old run back).
Each is refused by ``sample``, ``eval``, ``heads`` and ``--resume`` in one line naming the file, or
handled without losing what the user made.

The figures go to ``test-artifacts/reliability.json`` under ``run_folder`` and ``hostile_inputs``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from cli_helpers import error_line, refused, resume
from conftest import TRAINING
from run_helpers import SMALL, record, reforge, rewrite_config, tiny

from poslab.cli.app import main
from poslab.runs import RunFolder, load_run
from poslab.session import train
from poslab.training import checkpoint as ckpt

pytestmark = pytest.mark.usefixtures("single_thread", "hostile_figures")


# ------------------------------------------------------------------------------------ tokenizer digest
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
    """A checkpoint of the format that records no digests of the run files loads without the check."""
    reforge(run, meta_edit=lambda meta: {k: v for k, v in meta.items() if k != ckpt.RUN_FILES})
    assert ckpt.RUN_FILES not in ckpt.load_checkpoint(run)[1]
    assert main(["sample", str(run), "--tokens", "3", "--seed", "1"]) == 0
    assert resume(run, "--max_steps", "6") == 0
    assert ckpt.RUN_FILES in ckpt.load_checkpoint(run)[1]  # the resumed run's checkpoints record them
    record(request, resume_edge_cases_ok=1)


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


def test_non_finite_weights_are_refused_by_sample(run, capsys, request):
    def poison(tensors):
        tensors["model.tok_emb.weight"][0, 0] = float("nan")
        return tensors

    reforge(run, tensors_edit=poison)
    assert main(["sample", str(run), "--tokens", "2"]) == 2
    assert "non-finite weights (NaN/inf) in model.tok_emb.weight" in error_line(capsys)
    record(request, forged_files_one_line=1)


def forge_tokenizer(folder: Path, data: dict) -> None:
    """A tokenizer forged consistently everywhere: its digest in ``config.json`` and in the checkpoint's
    record of the run files (checksums recomputed), so what is left to refuse it is the tokenizer itself."""
    from poslab.runs import RunFolder

    (folder / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    digest = ckpt.sha256_file(folder / "tokenizer.json")
    rewrite_config(folder, lambda doc: {**doc, "data": {**doc["data"], "tokenizer_sha256": digest}})  # consistent
    reforge(folder, meta_edit=lambda meta: {**meta, ckpt.RUN_FILES: RunFolder(folder).file_digests()})


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (lambda chars: {"type": "char", "chars": chars[:10]}, "has 10 tokens but the model has"),
        (lambda chars: {"type": "ids", "vocab_size": 3}, "has 3 tokens but the model has"),
        (
            lambda chars: {"type": "bpe", "vocab_size": 5, "tokenizer": {"garbage": 1}},
            "'bpe' tokenizer body does not load",
        ),
        (lambda chars: {"type": "hf", "vocab_size": 5, "tokenizer": [1, 2]}, "'hf' tokenizer body does not load"),
    ],
    ids=["char-10-of-V", "ids-vocab-3", "bpe-garbage", "hf-garbage"],
)
def test_a_forged_tokenizer_is_refused_by_sample(run, body, needle, capsys):
    chars = json.loads((run / "tokenizer.json").read_text(encoding="utf-8"))["chars"]
    forge_tokenizer(run, body(chars))
    refused(capsys, ["sample", str(run), "--prompt", chars[0], "--tokens", "3"], needle)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.uint8])
def test_weights_of_an_integer_dtype_are_refused_not_cast(run, dtype, capsys):
    def cast(tensors):
        return {k: (v.to(dtype) if k == "model.tok_emb.weight" else v) for k, v in tensors.items()}

    reforge(run, tensors_edit=cast)
    refused(capsys, ["sample", str(run), "--tokens", "2"], "wrong dtype", "tok_emb")


def test_weights_that_overflow_the_logits_are_one_line(run, capsys):
    def scale(tensors):
        return {k: (v * 1e25 if k.startswith("model.") and v.is_floating_point() else v) for k, v in tensors.items()}

    reforge(run, tensors_edit=scale)
    refused(capsys, ["sample", str(run), "--tokens", "3", "--seed", "1"], "logits are not finite")


@pytest.mark.parametrize("factor", [1e30, 1e8])
def test_eval_of_weights_that_overflow_the_loss_is_one_line_and_writes_no_json(run, factor, tmp_path, capsys):
    """Embeddings x1e30 make the loss NaN; x1e8 a finite loss whose perplexity overflows a float: neither is
    printed as ``nan``/``inf`` nor written to ``--out`` as JSON's invalid ``NaN``."""

    def scale(tensors):
        return {k: (v * factor if k == "model.tok_emb.weight" else v) for k, v in tensors.items()}

    reforge(run, tensors_edit=scale)
    out = tmp_path / "e.json"
    line = refused(
        capsys, ["eval", str(run), "--lengths", "16", "--out", str(out)], "the model's loss is", "at length 16"
    )
    assert "checkpoint is damaged" in line and not out.exists()


def test_heads_of_weights_whose_loss_is_not_finite_is_one_line_and_writes_nothing(run, tmp_path, capsys):
    """``heads`` printed ``loss nan (+nan)`` and wrote ``NaN`` into its results.json."""
    reforge(run, tensors_edit=lambda t: {k: (v * 1e30 if k == "model.tok_emb.weight" else v) for k, v in t.items()})
    out = tmp_path / "heads"
    refused(capsys, ["heads", str(run), "--quick", "--out", str(out)], "loss on the evaluation text is nan")
    assert not out.exists()


def test_a_callback_that_is_not_a_function_is_refused_before_training_and_leaves_no_folder(tmp_path, corpus):
    cfg = tiny(tmp_path / "runs", corpus, max_steps=2)
    with pytest.raises(ValueError, match=r"^callback 'print': must be a function or None$"):
        train(cfg, callback="print", progress=False)
    assert not cfg.run_dir.exists()


# ------------------------------------------------------------------------------- a folder moved under a training
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


# ------------------------------------------------------------------------------------ resume edge cases
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
def test_an_overwrite_killed_early_is_cleaned_up(run, tang_corpus, new_run_started, capsys, request):
    hidden = run.with_name(f".{run.name}.replaced-999999")
    shutil.copytree(run, hidden)
    if not new_run_started:  # killed right after moving the old run away: the folder is empty
        shutil.rmtree(run)
        run.mkdir()
    # the next start: the interrupted command again (--overwrite), or a resume of the new run
    results = train(
        tiny(run.parent, tang_corpus, max_steps=5),
        resume=new_run_started,
        overwrite=not new_run_started,
        progress=False,
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


def test_a_checkpoint_file_vanishing_mid_write_stops_the_training_in_one_line(tmp_path, corpus, monkeypatch):
    """``rm -rf RUN`` removes the files before the folder: a checkpoint file can vanish between its write and its
    checksum while the folder and config.json are still there. That is the folder being deleted, not a bug: the
    training stops with :class:`RunFolderMoved`, not a bare ``FileNotFoundError``."""
    from poslab.runs import RunFolderMoved
    from poslab.training import checkpoint as ckpt_module

    cfg = tiny(tmp_path / "runs", corpus, ckpt_interval=2, max_steps=6)
    real = ckpt_module.sha256_file
    deleting = {"on": False}

    def vanish(path, *args, **kwargs):
        if deleting["on"]:
            os.unlink(path)  # another process's rm -rf got there first
        return real(path, *args, **kwargs)

    def start_deleting(step: int, record: dict) -> None:
        deleting["on"] = step >= 2

    monkeypatch.setattr(ckpt_module, "sha256_file", vanish)
    with pytest.raises(
        RunFolderMoved, match=r"was deleted or moved during training .* before writing checkpoint step 4"
    ):
        train(cfg, callback=start_deleting, progress=False)
    assert (cfg.run_dir / "config.json").exists()  # the folder was still in place: the vanished file decided


def test_a_missing_file_outside_the_run_folder_is_not_taken_for_a_deleted_folder(tmp_path):
    from poslab.runs import RunFolder, RunFolderMoved

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    folder = RunFolder(run)
    folder.prepare_for_writing()
    with pytest.raises(FileNotFoundError) as found, folder.writing("a file"):
        open(tmp_path / "elsewhere.txt")  # noqa: SIM115 - raises before anything is opened
    assert not isinstance(found.value, RunFolderMoved)
    with pytest.raises(RunFolderMoved), folder.writing("a file"):
        open(run / "checkpoints" / "gone.json")  # noqa: SIM115


# ------------------------------------------------------------------------------------ an existing folder
def test_existing_run_folder_is_refused_unless_resume_or_overwrite(make_config, tmp_path):
    cfg = make_config(TRAINING, max_steps=4, eval_interval=2)
    train(cfg, progress=False)
    with pytest.raises(FileExistsError, match="--resume.*--overwrite"):
        train(cfg, progress=False)
    marker = cfg.run_dir / "results.json"
    before = marker.read_text()
    train(cfg, overwrite=True, progress=False)
    assert marker.read_text() != before  # a new run (new timings)
    assert not list(cfg.run_dir.parent.glob(".run.replaced-*"))
    (tmp_path / "runs" / "notarun").mkdir()
    (tmp_path / "runs" / "notarun" / "thesis.tex").write_text("precious")
    with pytest.raises(FileExistsError, match="not a poslab run"):
        train(make_config(TRAINING, name="notarun"), overwrite=True, progress=False)
    assert (tmp_path / "runs" / "notarun" / "thesis.tex").read_text() == "precious"
    with pytest.raises(FileNotFoundError, match="cannot resume"):
        train(make_config(TRAINING, name="never"), resume=True, progress=False)


def test_overwrite_that_fails_early_gives_the_old_run_back(make_config):
    cfg = make_config(TRAINING, max_steps=4, eval_interval=2)
    train(cfg, progress=False)
    bad = make_config(TRAINING, max_steps=4, model=dict(block_size=100_000))
    with pytest.raises(ValueError, match="too short"):
        train(bad, overwrite=True, progress=False)
    assert (cfg.run_dir / "results.json").is_file()
    load_run(cfg.run_dir)
