"""``poslab.runs``: the run folder, the one reader and writer of ``OUT_DIR/NAME/`` (layer 3).

* :mod:`poslab.runs.files`: the layout, the JSON files, the tokenizer digest, metrics, results, state;
* :mod:`poslab.runs.checkpoints`: checkpoints verified against the run's config and files;
* :mod:`poslab.runs.averaging`: the mean of the newest checkpoints (``poslab average``);
* :mod:`poslab.runs.lifecycle`: the lock, and creating, resuming or replacing a run for a training;
* here: :class:`RunFolder` (all of the above) and :func:`load_run`, the way to load a trained run.

Everything else in the package reads runs through :class:`RunFolder`: the analyses, the lab, the CLI.
The training loop (layer 2) writes through the :class:`RunFolder` it is handed (the
:class:`poslab.training.loop.RunStore` and :class:`poslab.training.checkpointer.CheckpointStore` it
needs); :func:`poslab.session.train` builds it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from poslab.nn.model import GPT
from poslab.runs.averaging import RunAveraging
from poslab.runs.checkpoints import refuse_existing_run, write_model_run
from poslab.runs.files import CONFIG, RUN_FILES, SPLITS, STATES, TOKENIZER, RunFileError, RunFolderMoved
from poslab.runs.lifecycle import RunLifecycle
from poslab.training.checkpoint import training_state_missing
from poslab.training.data import model_vocab_size


class RunFolder(RunAveraging, RunLifecycle):
    """A run folder: its config, tokenizer, metrics, results and checkpoints.

    Args:
        path: the folder (``OUT_DIR/NAME``); it need not exist (see :attr:`state`).
    """



def load_run(run: str | Path | RunFolder, step: int | None = None) -> tuple[GPT, Any, dict[str, Any]]:
    """``(model, tokenizer, config)`` of a run folder: the way to load a run.

    Args:
        run: the run folder (a path or a :class:`RunFolder`).
        step: the checkpoint (default ``latest``).

    Returns:
        The trained :class:`GPT` (eval mode, on CPU, non-finite weights refused), the run's tokenizer
        (digest-checked) and its ``config.json``.

    Raises:
        FileNotFoundError: not a run folder.
        RunFileError: a run file unreadable or changed, or a tokenizer whose vocabulary is not the
            model's (a decoded id would fall outside it, or ids the model knows could never be written).
        CheckpointError: no/corrupt checkpoint, one written by a different config (the mismatched keys
            listed, the previous good checkpoint named), or non-finite weights.
    """
    run = run if isinstance(run, RunFolder) else RunFolder(run)
    tokenizer = run.tokenizer()
    model = run.checkpoint_model(step)
    config = run.config()
    objective = config["train"].get("objective", "clm")
    expected = model_vocab_size(tokenizer.vocab_size, objective) if objective in ("clm", "mlm") else None
    if expected is not None and expected != model.config.vocab_size:
        raise RunFileError(
            f"{str(run.file(TOKENIZER))!r} has {tokenizer.vocab_size} tokens but the model has "
            f"{model.config.vocab_size} ids ({objective}); a run's tokenizer and model must have one vocabulary"
        )
    return model, tokenizer, config


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The records of a run's ``metrics.jsonl``: :meth:`RunFolder.metrics`."""
    return RunFolder(run_dir).metrics()


def resolve_run(run: str | Path) -> RunFolder:
    """A run given as a folder, or as a name under ``runs/``.

    Raises:
        FileNotFoundError: neither holds a ``config.json``.
    """
    path = Path(run)
    for candidate in (path, Path("runs") / path):
        if RunFolder(candidate).is_run:
            return RunFolder(candidate)
    raise FileNotFoundError(
        f"no run {str(run)!r}: neither {str(path)!r} nor {str(Path('runs') / path)!r} holds a {CONFIG}"
    )


__all__ = [
    "RUN_FILES",
    "SPLITS",
    "STATES",
    "RunFileError",
    "RunFolder",
    "RunFolderMoved",
    "load_run",
    "read_metrics",
    "refuse_existing_run",
    "resolve_run",
    "training_state_missing",
    "write_model_run",
]
