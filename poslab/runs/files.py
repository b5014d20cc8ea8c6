"""A run folder's files (layer 3): the layout, the JSON files, the tokenizer digest, metrics, state.

A run folder ``OUT_DIR/NAME/`` holds::

    config.json        {"model": GPTConfig, "train": TrainConfig without "model", "data": split info
                       and "tokenizer_sha256", the digest of tokenizer.json}
    tokenizer.json     the tokenizer (char vocabulary, byte-level BPE, or a converted model's), JSON
    metrics.jsonl      one JSON line per logged step (step, loss, lr, tokens_per_s, grad_norm, time_s,
                       val_loss when evaluated)
    peak.json          the measured matmul peak (FLOP/s) used for MFU
    checkpoints/       step_NNNNNNN.safetensors + step_NNNNNNN.json and the ``latest`` pointer
                       (format: :mod:`poslab.training.checkpoint`; read and written by
                       :mod:`poslab.runs.checkpoints`)
    results.json       final losses, tokens/s, MFU, wall time, split sizes (written at the end)

Every problem with a run file is one line naming the file and what is wrong (:class:`RunFileError`, a
``ValueError``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from torch import Tensor

from poslab.checks import is_number
from poslab.data import encode_corpus, load_text, split_text, tokenizer_from_dict
from poslab.fileio import append_line, atomic_write_json, atomic_write_text, sha256_bytes, sha256_file
from poslab.nn.config_migration import migrate_model_config
from poslab.nn.model import GPTConfig
from poslab.safe_load import load_json
from poslab.training import checkpoint as ckpt
from poslab.training.config import TrainConfig, resume_identity
from poslab.training.lock import ensure_writable, folder_id, is_locked, remove_stale_temp_files

CONFIG, TOKENIZER, METRICS, RESULTS, PEAK = (
    "config.json",
    "tokenizer.json",
    "metrics.jsonl",
    "results.json",
    "peak.json",
)
#: every file of the format (the test that no other module parses them reads this list)
RUN_FILES = (CONFIG, TOKENIZER, METRICS, RESULTS, PEAK)
#: a run's states: no run here / a live process trains it / stopped before the end (resumable) /
#: ended as asked (:data:`ENDED`) / ended otherwise (diverged)
STATES = ("missing", "running", "interrupted", "finished", "failed")
#: the ``results.json`` statuses of a run that ended as asked: trained to ``max_steps``, stopped at its
#: ``stop_val_loss`` (time to quality), converted from another format, or averaged from checkpoints
ENDED = ("completed", "target reached", "converted", "averaged")
#: the splits of a run's own corpus
SPLITS = ("val", "train")


class RunFileError(ValueError):
    """A run file that is missing, unreadable or lacks what the format needs (the message names it)."""


class RunFolderMoved(RunFileError):
    """The folder a training writes was deleted or renamed under it (noticed before each checkpoint)."""


class RunFiles:
    """A run folder's files: config, tokenizer, metrics, results, peak (the base of :class:`RunFolder`).

    Args:
        path: the folder (``OUT_DIR/NAME``); it need not exist (see :attr:`state`).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._folder_id: tuple[int, int] | None = None  # (st_dev, st_ino) of the folder a training writes

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r})"

    def file(self, name: str) -> Path:
        return self.path / name

    @property
    def is_run(self) -> bool:
        """Whether the folder holds a run (its ``config.json``)."""
        return self.file(CONFIG).is_file()

    # -------------------------------------------------------------------------------- JSON files
    def _read_json(self, name: str) -> Any:
        path = self.file(name)
        try:
            return load_json(path.read_text(encoding="utf-8"), repr(str(path)))
        except FileNotFoundError:
            raise RunFileError(f"{str(path)!r} does not exist") from None
        except IsADirectoryError:
            raise RunFileError(f"{str(path)!r} is a folder, not a file") from None
        except ValueError as err:  # not UTF-8, not JSON or nested too deeply (a damaged or foreign file): name it
            raise RunFileError(f"{str(path)!r} is not a readable JSON file: {err}") from None

    def _object(self, name: str) -> dict[str, Any]:
        data = self._read_json(name)
        if not isinstance(data, dict):
            raise RunFileError(f"{str(self.file(name))!r} holds a {type(data).__name__}, not a JSON object")
        return data

    # -------------------------------------------------------------------------------- config
    def config(self) -> dict[str, Any]:
        """The run's ``config.json``: ``{"model", "train", "data"}`` (each section present and a mapping).

        Raises:
            FileNotFoundError: not a run folder (no ``config.json``).
            RunFileError: unreadable, or a section missing.
        """
        if not self.is_run:
            raise FileNotFoundError(f"{str(self.path)!r} is not a poslab run folder (no {CONFIG})")
        doc = self._object(CONFIG)
        for section in ("model", "train"):
            if not isinstance(doc.get(section), dict):
                what = "lacks" if section not in doc else "has a non-mapping"
                raise RunFileError(f"{str(self.file(CONFIG))!r} {what} the {section!r} section; is it a poslab run?")
        if not isinstance(doc.get("data", {}), dict):
            raise RunFileError(f"{str(self.file(CONFIG))!r} has a non-mapping 'data' section")
        doc["model"] = migrate_model_config(doc["model"])  # a run saved with the flat model keys loads alike
        return doc

    def model_config(self) -> GPTConfig:
        """The run's :class:`GPTConfig` (with its ``vocab_size``)."""
        return self._built(lambda doc: GPTConfig.from_dict(doc["model"]), "model")

    def train_config(self, **overrides: Any) -> TrainConfig:
        """The run's :class:`TrainConfig` (``overrides`` replace saved training keys, e.g. ``max_steps``)."""

        def build(doc: dict) -> TrainConfig:
            model = {k: v for k, v in doc["model"].items() if k != "vocab_size"}
            values = {"name": self.path.name, "out_dir": str(self.path.parent), **doc["train"], **overrides}
            return TrainConfig.from_dict({**values, "model": model})

        return self._built(build, "train")

    def resume_identity(self, model: GPTConfig | None = None) -> dict[str, Any]:
        """The part of the config a resume must match (:func:`poslab.training.config.resume_identity`);
        ``model``: :meth:`model_config` if already built."""
        return self._built(lambda doc: resume_identity(doc, model), "model/train")

    def _built(self, build: Callable[[dict], Any], section: str) -> Any:
        doc = self.config()
        try:
            return build(doc)
        except (TypeError, ValueError, KeyError) as err:
            message = str(err).strip("'\"") if isinstance(err, KeyError) else str(err)
            raise RunFileError(f"{str(self.file(CONFIG))!r}: the {section} section does not build: {message}") from None

    def write_config(self, config_doc: dict[str, Any]) -> None:
        """Write ``config.json``, recording the digest of the ``tokenizer.json`` now in the folder."""
        doc = dict(config_doc)
        if self.file(TOKENIZER).is_file():
            doc["data"] = {**doc.get("data", {}), "tokenizer_sha256": sha256_file(self.file(TOKENIZER))}
        atomic_write_json(self.file(CONFIG), doc)

    # -------------------------------------------------------------------------------- tokenizer
    def tokenizer(self) -> Any:
        """The run's tokenizer, checked against the digest ``config.json`` records for it.

        Raises:
            RunFileError: ``tokenizer.json`` missing, unreadable, changed since training (digest), or
                not a usable tokenizer (the missing field named).
        """
        recorded = (
            self.config().get("data", {}).get("tokenizer_sha256")
        )  # absent from runs whose config records no digest: read unchecked
        path = self.file(TOKENIZER)
        if not path.is_file():
            raise RunFileError(f"{str(path)!r} does not exist; the run's token ids cannot be decoded without it")
        data = self._object(TOKENIZER)  # not JSON at all: said first
        digest = sha256_file(path)
        if recorded is not None and digest != recorded:
            raise RunFileError(
                f"{str(path)!r} was changed after training: its sha256 {digest[:16]}… "
                f"differs from the {str(recorded)[:16]}… recorded in {CONFIG}"
            )
        try:
            return tokenizer_from_dict(data)
        except KeyError as err:
            raise RunFileError(
                f"{str(path)!r} is not a usable {data.get('type')!r} tokenizer: it lacks {err}"
            ) from None
        except (TypeError, ValueError) as err:
            raise RunFileError(f"{str(path)!r} is not a usable tokenizer: {err}") from None

    def read_tokenizer(self) -> Any:
        """:meth:`tokenizer`, ``None`` for a run that has none."""
        return self.tokenizer() if self.file(TOKENIZER).is_file() else None

    def write_start(self, tokenizer: Any) -> None:
        """A fresh run's ``tokenizer.json`` and empty ``metrics.jsonl``."""
        atomic_write_json(self.file(TOKENIZER), tokenizer.to_dict())
        atomic_write_text(self.file(METRICS), "")

    # -------------------------------------------------------------------------------- metrics
    def metrics(self) -> list[dict[str, Any]]:
        """The records of ``metrics.jsonl`` (a torn last line, or one that is not an object, is skipped)."""
        records = []
        if self.file(METRICS).is_file():
            for line in self.file(METRICS).read_text(encoding="utf-8", errors="replace").splitlines():
                with contextlib.suppress(ValueError):  # torn, not JSON or nested too deeply
                    record = load_json(line, METRICS)
                    if isinstance(record, dict):
                        records.append(record)
        return records

    def truncate_metrics(self, last_step: int) -> None:
        """Keep only the lines of steps ``<= last_step`` (dropping a torn last line), atomically."""
        kept = []
        if self.file(METRICS).is_file():
            for line in self.file(METRICS).read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    record = load_json(line, METRICS)
                except ValueError:  # torn, not JSON or nested too deeply
                    continue
                if isinstance(record, dict) and number(record.get("step"), math.inf) <= last_step:
                    kept.append(line)
        atomic_write_text(self.file(METRICS), "".join(line + "\n" for line in kept))

    @contextlib.contextmanager
    def metrics_appender(self, enabled: bool = True) -> Iterator[Callable[[dict], None]]:
        """A context giving ``append(record)``: one JSON line per call, never a torn one (disk full included)."""
        target = self.file(METRICS) if enabled else Path(os.devnull)
        with open(target, "ab", buffering=0) as handle:
            yield lambda record: append_line(handle, json.dumps(record))

    # -------------------------------------------------------------------------------- results
    def results(self) -> dict[str, Any] | None:
        """``results.json`` (``None`` when the run has not ended).

        Raises:
            RunFileError: the file exists but is unreadable.
        """
        if not self.file(RESULTS).exists():
            return None
        return self._object(RESULTS)

    def write_results(self, results: dict[str, Any]) -> None:
        with self.writing(RESULTS):
            atomic_write_json(self.file(RESULTS), results, allow_nan=False)  # strict JSON: no NaN/Infinity

    @property
    def state(self) -> str:
        """One of :data:`STATES`: ``missing``, ``running``, ``interrupted``, ``finished``, ``failed``."""
        if is_locked(self.path):
            return "running"
        if not self.is_run:
            return "missing"
        try:
            status = (self.results() or {}).get("status")
        except RunFileError:
            return "interrupted"  # a torn results.json: the run did not end cleanly
        if status in ENDED:
            return "finished"
        if status is not None:
            return "failed"
        return "interrupted"

    def finished(self, max_steps: int | None = None) -> bool:
        """Ended (and, with ``max_steps``, trained at least that many steps or stopped at its ``stop_val_loss``)."""
        if self.state != "finished":
            return False
        results = self.results() or {}
        return (
            max_steps is None
            or results.get("status") == "target reached"
            or number(results.get("steps"), 0) >= max_steps
        )

    # -------------------------------------------------------------------------------- peak
    def matmul_peak(self, key: str, measure: Callable[[], float]) -> float:
        """The cached matmul peak of ``key`` (``dtype/threads``) in ``peak.json``, else measured."""
        cached: dict[str, Any] = {}
        if self.file(PEAK).is_file():
            with contextlib.suppress(RunFileError):
                cached = self._object(PEAK)
        value = cached.get(key)
        if not is_number(value) or not 0 < value < math.inf:
            cached[key] = value = measure()
            atomic_write_json(self.file(PEAK), cached)
        return float(value)

    # -------------------------------------------------------------------------------- data
    def split_tokens(self, split: str = "val", tokenizer: Any = None) -> Tensor:
        """Token ids ``[N]`` of the run's evaluation text.

        Args:
            split: ``"val"`` / ``"train"`` (the run's own split of its corpus, checked against the
                corpus digest recorded at training), or any other shipped corpus name or UTF-8 file
                path (encoded whole with the run's tokenizer).
            tokenizer: the run's tokenizer if already loaded.

        Raises:
            ValueError: the run's corpus changed since training (digest), an unknown corpus or
                file, or characters the tokenizer does not know.
        """
        tokenizer = tokenizer if tokenizer is not None else self.tokenizer()
        if split not in SPLITS:
            return encode_corpus(tokenizer, load_text(split))
        doc = self.config()
        train = doc["train"]
        corpus = train.get("corpus", "tang5")
        text = load_text(corpus)
        recorded = doc.get("data", {}).get("corpus_sha256")
        if recorded is not None and sha256_bytes(text.encode("utf-8")) != recorded:
            raise ValueError(
                f"corpus {corpus!r} changed since the run was trained (sha256 differs); its {split} split is gone"
            )
        train_text, val_text = split_text(text, train.get("val_fraction", 0.1))
        return encode_corpus(tokenizer, val_text if split == "val" else train_text)

    # -------------------------------------------------------------------------------- a training's writes
    def prepare_for_writing(self) -> None:
        """Fail now if the folder is read-only; delete temporary files left by a killed writer."""
        for folder in (self.path, self.path / ckpt.CHECKPOINT_DIR):
            if folder.is_dir():
                ensure_writable(folder)  # fail now, not at the first checkpoint
        remove_stale_temp_files(self.path)  # the run's lock is ours
        self._folder_id = folder_id(self.path)

    def in_place(self) -> bool:
        """Whether the folder :meth:`prepare_for_writing` saw is still at :attr:`path` (``True`` before it)."""
        return self._folder_id is None or folder_id(self.path) == self._folder_id

    @contextlib.contextmanager
    def writing(self, what: str) -> Iterator[None]:
        """A training's write of ``what``; :class:`RunFolderMoved` if the folder moved since it began writing, or
        a file of it vanished during the write (another process deleting the folder: ``rm -rf`` removes the
        files before the folder, so the folder can still be in place when the write finds its file gone)."""
        self._check_in_place(what)
        try:
            yield
        except FileNotFoundError as err:
            self._check_in_place(what)
            if self._folder_id is not None and any(self._holds(name) for name in (err.filename, err.filename2)):
                raise self._moved(what) from None
            raise

    def _holds(self, name: object) -> bool:
        """Whether ``name`` is a path inside this run folder."""
        if not isinstance(name, (str, os.PathLike)):
            return False
        return Path(os.path.abspath(name)).is_relative_to(Path(os.path.abspath(self.path)))

    def _moved(self, what: str) -> RunFolderMoved:
        return RunFolderMoved(
            f"run folder {str(self.path)!r} was deleted or moved during training (it is not the folder "
            f"the training started in); stopped before writing {what}: nothing is recreated there"
        )

    def _check_in_place(self, what: str) -> None:
        if self._folder_id is not None and not (self.in_place() and self.is_run):
            raise self._moved(what)


def number(value: Any, default: float) -> float:
    """``value`` if it is a real number (not a bool), else ``default``."""
    return value if is_number(value) else default
