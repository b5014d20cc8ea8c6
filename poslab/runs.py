"""``RunFolder``: the one reader and writer of a run folder's format (layer 3).

A run folder ``OUT_DIR/NAME/`` holds::

    config.json        {"model": GPTConfig, "train": TrainConfig without "model", "data": split info
                       and "tokenizer_sha256", the digest of tokenizer.json}
    tokenizer.json     the tokenizer (char vocabulary, byte-level BPE, or a converted model's), JSON
    metrics.jsonl      one JSON line per logged step (step, loss, lr, tokens_per_s, grad_norm, time_s,
                       val_loss when evaluated)
    peak.json          the measured matmul peak (FLOP/s) used for MFU
    checkpoints/       step_NNNNNNN.safetensors + step_NNNNNNN.json and the ``latest`` pointer
                       (format: :mod:`poslab.training.checkpoint`)
    results.json       final losses, tokens/s, MFU, wall time, split sizes (written at the end)

Everything else in the package reads runs through this class: the analyses, the lab, the CLI. Every
problem with a run file is one line naming the file and what is wrong (:class:`RunFileError`, a
``ValueError``; checkpoints raise :class:`poslab.training.checkpoint.CheckpointError`). The training
loop (layer 2) writes through a :class:`RunFolder` it is given (:class:`poslab.training.loop.RunStore`);
:func:`poslab.session.train` builds it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from poslab.data import encode_corpus, load_text, split_text, tokenizer_from_dict
from poslab.fileio import (
    append_line,
    atomic_write_folder,
    atomic_write_json,
    atomic_write_text,
    sha256_bytes,
    sha256_file,
)
from poslab.nn.model import GPT, GPTConfig
from poslab.safe_load import load_json
from poslab.training import checkpoint as ckpt
from poslab.training.averaging import average_state_dicts, normalised_weights
from poslab.training.checkpoint import training_state_missing
from poslab.training.config import TrainConfig, resume_identity
from poslab.training.data import model_vocab_size
from poslab.training.lock import (
    RunLock,
    ensure_writable,
    folder_id,
    interrupted_start,
    is_locked,
    remove_stale_temp_files,
)

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
#: completed / ended without completing (diverged)
STATES = ("missing", "running", "interrupted", "finished", "failed")
#: the splits of a run's own corpus
SPLITS = ("val", "train")


class RunFileError(ValueError):
    """A run file that is missing, unreadable or lacks what the format needs (the message names it)."""


class RunFolderMoved(RunFileError):
    """The folder a training writes was deleted or renamed under it (noticed before each checkpoint)."""


class RunFolder:
    """A run folder: its config, tokenizer, metrics, results and checkpoints.

    Args:
        path: the folder (``OUT_DIR/NAME``); it need not exist (see :attr:`state`).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._folder_id: tuple[int, int] | None = None  # (st_dev, st_ino) of the folder a training writes

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

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
        return doc

    read_config = config  # RunStore

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
        """RunStore: :meth:`tokenizer`, ``None`` for a run that has none."""
        return self.tokenizer() if self.file(TOKENIZER).is_file() else None

    def write_start(self, tokenizer: Any) -> None:
        """RunStore: a fresh run's ``tokenizer.json`` and empty ``metrics.jsonl``."""
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
                if isinstance(record, dict) and _number(record.get("step"), math.inf) <= last_step:
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
        if status in ("completed", "converted", "averaged"):
            return "finished"
        if status is not None:
            return "failed"
        return "interrupted"

    def finished(self, max_steps: int | None = None) -> bool:
        """Completed (and, with ``max_steps``, trained at least that many steps)."""
        if self.state != "finished":
            return False
        steps = (self.results() or {}).get("steps", 0)
        return max_steps is None or _number(steps, 0) >= max_steps

    # -------------------------------------------------------------------------------- peak
    def matmul_peak(self, key: str, measure: Callable[[], float]) -> float:
        """RunStore: the cached matmul peak of ``key`` (``dtype/threads``) in ``peak.json``, else measured."""
        cached: dict[str, Any] = {}
        if self.file(PEAK).is_file():
            with contextlib.suppress(RunFileError):
                cached = self._object(PEAK)
        value = cached.get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
            cached[key] = value = measure()
            atomic_write_json(self.file(PEAK), cached)
        return float(value)

    # -------------------------------------------------------------------------------- checkpoints
    def checkpoints(self) -> list[int]:
        """Steps of the listed checkpoints, ascending (integrity is checked on load)."""
        return ckpt.list_checkpoints(self.path)

    def latest_step(self) -> int | None:
        return ckpt.latest_step(self.path)

    def checkpoint_path(self, step: int | None) -> Path:
        """The tensor file of checkpoint ``step``."""
        return self.path / ckpt.CHECKPOINT_DIR / f"{ckpt.checkpoint_name(step or 0)}.safetensors"

    def save_checkpoint(self, step: int, tensors: dict[str, Tensor], meta: dict[str, Any], keep: int = 0) -> Path:
        """Checkpoint ``step``; its JSON records the digests of the run files it depends on (:meth:`file_digests`)."""
        with self.writing(f"checkpoint step {step}"):
            meta = {**meta, ckpt.RUN_FILES: self.file_digests()}
            return ckpt.save_checkpoint(self.path, step, tensors, meta, keep=keep)

    def file_digests(self) -> dict[str, str | None]:
        """:func:`~poslab.training.checkpoint.run_file_digests` of the folder's config and tokenizer."""
        return ckpt.run_file_digests(self.config() if self.is_run else {}, self.file(TOKENIZER))

    def load_checkpoint(self, step: int | None = None, identity: dict | None = None) -> tuple[dict[str, Tensor], dict]:
        """Checkpoint ``step`` (default ``latest``), verified and checked against the run's config.

        Raises:
            CheckpointError: missing, corrupt, written by another config (the keys listed), or a run file
                it depends on (``tokenizer.json``, ``config.json``'s data) changed since it was written.
        """
        tensors, meta = ckpt.load_checkpoint(self.path, step)
        self._check_checkpoint_config(meta, identity if identity is not None else self.resume_identity(), meta["step"])
        ckpt.check_run_files(meta, self.file_digests(), self.path)
        return tensors, meta

    def _check_checkpoint_config(self, meta: dict, identity: dict, step: int) -> None:
        saved = meta.get("config")
        if saved is None:
            raise ckpt.CheckpointError(f"checkpoint step {step} of {str(self.path)!r} records no config")
        try:
            saved = resume_identity(saved)
        except (TypeError, ValueError, KeyError) as err:
            raise ckpt.CheckpointError(
                f"checkpoint step {step} of {str(self.path)!r} records an unreadable config: {err}"
            ) from None
        if ckpt.config_hash(saved) != ckpt.config_hash(identity):
            mismatch = ckpt.config_mismatch(saved, identity)
            raise ckpt.CheckpointError(
                f"checkpoint step {step} in {str(self.path)!r} was written by a different config: "
                + "; ".join(mismatch)
            )

    def resume_checkpoint(self, identity: dict) -> tuple[dict[str, Tensor], dict] | None:
        """RunStore: ``(tensors, meta)`` of the newest checkpoint that verifies and can continue training.

        A checkpoint that fails (corrupt, unreadable JSON, another config, model weights only) is
        skipped with a warning on stderr naming it and why, and the previous one is tried; ``None``
        when the run has no checkpoint at all.

        Raises:
            CheckpointError: checkpoints exist but none can resume (each one's problem listed; for
                model-only ones, ``--init_from`` offered).
        """
        latest = self.latest_step()
        candidates = self.checkpoints()
        if latest is None and not candidates:
            return None
        order = ([latest] if latest is not None else []) + [
            s for s in reversed(candidates) if latest is None or s < latest
        ]
        problems, model_only = [], False
        for step in order:
            try:
                tensors, meta = self.load_checkpoint(step, identity)
                missing = training_state_missing(tensors, meta)
                if not missing:
                    problem = ckpt.training_state_problem(tensors, meta)
                    if problem:
                        raise ckpt.CheckpointError(f"checkpoint {str(self.checkpoint_path(step))!r} {problem}")
                if missing:
                    model_only = True
                    raise ckpt.CheckpointError(
                        f"checkpoint {str(self.checkpoint_path(step))!r} holds the model only "
                        f"(no {', '.join(missing)}): "
                        "it cannot resume the optimizer and the data order"
                    )
            except ckpt.CheckpointError as err:
                problems.append(str(err))
                continue
            if problems:
                print(
                    f"poslab: warning: {'; '.join(problems)}; resuming from the previous good checkpoint, step {step}",
                    file=sys.stderr,
                )
            return tensors, meta
        hint = (
            f"; to train on from its weights start a new run with --init_from {self.path}"
            if model_only
            else "; start again with --overwrite"
        )
        raise ckpt.CheckpointError(f"no usable checkpoint in {str(self.path)!r}: " + "; ".join(problems) + hint)

    def _previous_good(self, identity: dict, below: int | None) -> str:
        """A hint naming the newest checkpoint before step ``below`` that verifies (for error messages)."""
        candidates = [s for s in reversed(self.checkpoints()) if below is None or s < below]
        if not candidates:
            return ""
        for step in candidates:
            try:
                self.load_checkpoint(step, identity)
            except ckpt.CheckpointError:
                continue
            return (
                f"; the previous good checkpoint is step {step}: load_run(run, step={step}), "
                f"`poslab sample RUN --step {step}`; `poslab train --resume` falls back to it"
            )
        return "; no earlier checkpoint verifies"

    def restore_weights(self, model: nn.Module) -> None:
        """RunStore: the latest checkpoint's model weights into ``model`` (``init_from``: names and shapes must
        match)."""
        if not self.is_run:
            raise FileNotFoundError(f"init_from {str(self.path)!r} is not a poslab run folder (no {CONFIG})")
        tensors, meta = self.load_checkpoint()
        try:
            ckpt.restore_model(model, tensors, _aliases(meta))
        except ckpt.CheckpointError as err:
            raise ckpt.CheckpointError(f"init_from {str(self.path)!r}: {err}") from None

    # -------------------------------------------------------------------------------- model
    def load_model(self, step: int | None = None) -> GPT:
        """The trained :class:`GPT` of checkpoint ``step`` (default ``latest``), eval mode, on CPU.

        Raises:
            FileNotFoundError: not a run folder.
            RunFileError: a config that does not build.
            CheckpointError (a ``ValueError``): no/corrupt checkpoint, one written by a different config
                (the mismatched keys listed, the previous good checkpoint named), or non-finite weights.
        """
        model_cfg = self.model_config()
        identity = self.resume_identity(model_cfg)
        with torch.random.fork_rng(devices=[]):  # building the model must not move the caller's RNG
            model = GPT(model_cfg)
        try:
            tensors, meta = self.load_checkpoint(step, identity)
        except ckpt.CheckpointError as err:
            below = step if step is not None else self.latest_step()
            raise ckpt.CheckpointError(f"{err}{self._previous_good(identity, below)}") from None
        bad = [
            name
            for name, t in tensors.items()
            if name.startswith("model.") and t.is_floating_point() and not bool(torch.isfinite(t).all())
        ]
        if bad:
            raise ckpt.CheckpointError(
                f"checkpoint {str(self.checkpoint_path(meta['step']))!r} holds non-finite "
                f"weights (NaN/inf) in {', '.join(bad[:4])}; sampling from it is meaningless"
            )
        ckpt.restore_model(model, tensors, _aliases(meta))
        return model.eval()

    def averaged_model(self, last: int, weights: list[float] | None = None) -> tuple[GPT, list[int]]:
        """A :class:`GPT` holding the weighted mean of the run's newest ``last`` checkpoints' weights.

        Each checkpoint is verified (sha256, config) as in :meth:`load_model`, then the model tensors
        are averaged by :func:`poslab.training.averaging.average_state_dicts` (float32 accumulation).

        Args:
            last: how many of the newest checkpoints to average (>= 1; 1 is the latest checkpoint).
            weights: one weight per averaged checkpoint, oldest first (default uniform).

        Returns:
            ``(model in eval mode on CPU, the averaged steps ascending)``.

        Raises:
            ValueError: ``last`` not a positive int, or bad weights.
            CheckpointError: fewer than ``last`` checkpoints (the steps kept named, and the settings that
                keep more), a corrupt one, or one written by another config.
        """
        if isinstance(last, bool) or not isinstance(last, int) or last < 1:
            raise ValueError(f"last = {last!r}: the number of checkpoints to average must be an int >= 1")
        steps = self.checkpoints()
        if len(steps) < last:
            raise ckpt.CheckpointError(
                f"run {str(self.path)!r} keeps {len(steps)} checkpoint(s) (steps {steps}); "
                f"averaging the last {last} needs "
                f"{last}: train with keep_checkpoints >= {last} and a ckpt_interval that saves them"
            )
        chosen = steps[-last:]
        model_cfg = self.model_config()
        identity = self.resume_identity(model_cfg)
        with torch.random.fork_rng(devices=[]):  # building the model must not move the caller's RNG
            model = GPT(model_cfg)
        states, aliases = [], {}
        for step in chosen:
            tensors, meta = self.load_checkpoint(step, identity)
            states.append({name: t for name, t in tensors.items() if name.startswith("model.")})
            aliases = _aliases(meta)
        averaged = average_state_dicts(states, weights)
        bad = [name for name, t in averaged.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
        if bad:
            raise ckpt.CheckpointError(
                f"the average of checkpoints {chosen} of {str(self.path)!r} holds non-finite "
                f"weights (NaN/inf) in {', '.join(bad[:4])}"
            )
        ckpt.restore_model(model, averaged, aliases)
        return model.eval(), chosen

    def write_average(self, out: str | Path, last: int, weights: list[float] | None = None) -> Path:
        """Create the run folder ``out`` holding the mean of this run's newest ``last`` checkpoints.

        The new run has this run's config (its name and folder changed; ``data.averaged_from`` names
        this run, the steps and the normalised weights), its tokenizer, one model-only checkpoint at the
        newest averaged step and a ``results.json`` with ``status: averaged``: ``load_run``, ``poslab
        eval`` and ``poslab sample`` read it as any run. The folder is written aside and renamed at the
        end; nothing existing is ever overwritten.

        Raises:
            FileExistsError: ``out`` exists and is not an empty folder.
            ValueError, CheckpointError: as :meth:`averaged_model`.
        """
        out = refuse_existing_run(out, "averaging")
        model, steps = self.averaged_model(last, weights)
        normalised = normalised_weights(len(steps), weights)  # the weights the average used
        source = {"run": str(self.path.resolve()), "steps": steps, "weights": normalised}
        doc = self.config()
        doc = {
            **doc,
            "train": {**doc.get("train", {}), "name": out.name, "out_dir": str(out.parent)},
            "data": {**doc.get("data", {}), "averaged_from": source},
        }
        return write_model_run(
            out,
            model,
            self.tokenizer(),
            doc,
            step=steps[-1],
            meta={"averaged_from": source},
            results={"status": "averaged", "steps": steps[-1], "averaged_from": source},
        )

    def load(self, step: int | None = None) -> tuple[GPT, Any, dict[str, Any]]:
        """``(model, tokenizer, config)``: :meth:`load_model`, :meth:`tokenizer`, :meth:`config`.

        Raises:
            RunFileError: the tokenizer's vocabulary is not the model's (a decoded id would fall
                outside it, or ids the model knows could never be written).
        """
        tokenizer = self.tokenizer()
        model = self.load_model(step)
        config = self.config()
        objective = config["train"].get("objective", "clm")
        expected = model_vocab_size(tokenizer.vocab_size, objective) if objective in ("clm", "mlm") else None
        if expected is not None and expected != model.config.vocab_size:
            raise RunFileError(
                f"{str(self.file(TOKENIZER))!r} has {tokenizer.vocab_size} tokens but the model has "
                f"{model.config.vocab_size} ids ({objective}); a run's tokenizer and model must have one vocabulary"
            )
        return model, tokenizer, config

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

    # -------------------------------------------------------------------------------- writing
    def lock(self) -> RunLock:
        """The run's lock (on the resolved folder; see :mod:`poslab.training.lock`)."""
        return RunLock(self.path)

    def prepare_for_writing(self) -> None:
        """RunStore: fail now if the folder is read-only; delete temporary files left by a killed writer."""
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
        """A training's write of ``what``; :class:`RunFolderMoved` if the folder moved since it began writing."""
        self._check_in_place(what)
        try:
            yield
        except FileNotFoundError:
            self._check_in_place(what)
            raise

    def _check_in_place(self, what: str) -> None:
        if self._folder_id is not None and not (self.in_place() and self.is_run):
            raise RunFolderMoved(
                f"run folder {str(self.path)!r} was deleted or moved during training (it is not the folder "
                f"the training started in); stopped before writing {what}: nothing is recreated there"
            )

    def displaced_name(self) -> Path:
        return self.path.with_name(f".{self.path.name}.replaced-{os.getpid()}")

    def restore_displaced(self) -> list[str]:
        """Give back a run an earlier ``--overwrite`` moved aside and was killed before replacing.

        ``--overwrite`` moves the old run to ``.NAME.replaced-PID`` and deletes it once the new run
        has written its config. If that process died in between, the next start (holding the lock)
        finds the hidden copy: it is put back if the folder holds no run, else deleted.

        Returns:
            One line per copy handled (printed by the caller).
        """
        notes = []
        prefix = f".{self.path.name}.replaced-"
        siblings = sorted(self.path.parent.iterdir()) if self.path.parent.is_dir() else []
        for hidden in (p for p in siblings if p.name.startswith(prefix)):
            pid = hidden.name.rsplit("-", 1)[-1]
            if not hidden.is_dir() or (pid.isdecimal() and int(pid) == os.getpid()):
                continue
            if not self.is_run and (not self.path.exists() or interrupted_start(self.path)):
                if self.path.exists():
                    shutil.rmtree(self.path)
                os.replace(hidden, self.path)
                notes.append(
                    f"poslab: note: restored {str(self.path)!r} from {hidden.name}, left by an --overwrite "
                    "that was killed before the new run started"
                )
            else:
                shutil.rmtree(hidden, ignore_errors=True)
                notes.append(f"poslab: note: removed {hidden.name}, the old run an earlier --overwrite replaced")
        return notes

    def prepare(self, resume: bool, overwrite: bool) -> tuple[bool, Path | None]:
        """Create or validate the folder for ``train`` (call while holding :meth:`lock`).

        Returns:
            ``(resuming, displaced)``: whether an existing run is resumed, and (for ``overwrite``) where
            the old run was moved; it is deleted only once the new run has written its config.
        """
        if resume and overwrite:
            raise ValueError("choose one of resume and overwrite, not both")
        if self.path.exists() and not self.path.is_dir():
            raise FileExistsError(f"{str(self.path)!r} exists and is not a folder")
        if overwrite and self.path.is_symlink():  # replacing the link would leave its lock on the old target
            raise FileExistsError(
                f"refusing to overwrite {str(self.path)!r}: it is a symbolic link to "
                f"{os.readlink(self.path)!r}; overwrite that folder by its own name"
            )
        for note in self.restore_displaced():
            print(note, file=sys.stderr)
        if interrupted_start(self.path):  # a start killed before its config.json (nothing to keep): start again
            shutil.rmtree(self.path)
            self.path.mkdir(parents=True)
            return False, None
        if not self.path.exists() or not any(self.path.iterdir()):
            if resume:
                raise FileNotFoundError(f"cannot resume: run folder {str(self.path)!r} does not exist or is empty")
            self.path.mkdir(parents=True, exist_ok=True)
            return False, None
        if resume:
            if not self.is_run:
                raise FileNotFoundError(f"cannot resume: {str(self.path)!r} has no {CONFIG} (not a poslab run)")
            return True, None
        if not overwrite:
            raise FileExistsError(
                f"run folder {str(self.path)!r} already exists; "
                "pass --resume to continue it or --overwrite to replace it"
            )
        if not self.is_run:
            raise FileExistsError(
                f"refusing to overwrite {str(self.path)!r}: it is not a poslab run folder (no {CONFIG})"
            )
        displaced = self.displaced_name()
        os.replace(self.path, displaced)
        self.path.mkdir(parents=True)
        return False, displaced


def refuse_existing_run(out: str | Path, action: str) -> Path:
    """``out`` as a ``Path``; ``FileExistsError`` if it exists and is not an empty folder (``action`` never
    overwrites)."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(
            f"{str(out)!r} already exists and is not an empty folder; {action} never overwrites a run"
        )
    return out


def write_model_run(
    out: str | Path,
    model: nn.Module,
    tokenizer: Any,
    config_doc: dict[str, Any],
    *,
    step: int,
    meta: dict[str, Any],
    results: dict[str, Any],
) -> Path:
    """Create the run folder ``out`` holding ``model`` as one model-only checkpoint (a converted or averaged run).

    The folder gets the tokenizer, ``config_doc`` as its config (with the tokenizer's digest), the
    checkpoint at ``step`` (its meta: the resume identity, the model's tensor aliases, ``meta`` and the
    torch version) and ``results.json`` (``name``, ``results``, ``n_params``); ``load_run``, ``poslab
    eval`` and ``poslab sample`` read it as any run. It is written aside and renamed at the end, and an
    existing non-empty ``out`` is refused (:func:`refuse_existing_run`).
    """
    out = refuse_existing_run(out, "writing a run")

    def fill(folder: Path) -> None:
        run = RunFolder(folder)
        run.write_start(tokenizer)
        run.write_config(config_doc)  # records the tokenizer's digest
        tensors, aliases = ckpt.model_tensors(model)
        identity = run.resume_identity()
        run.save_checkpoint(
            step,
            tensors,
            {
                "config": identity,
                "config_hash": ckpt.config_hash(identity),
                "model_aliases": aliases,
                **meta,
                "torch_version": torch.__version__,
            },
        )
        run.write_results({"name": out.name, **results, "n_params": sum(p.numel() for p in model.parameters())})

    atomic_write_folder(out, fill)
    return out


def load_run(run_dir: str | Path, step: int | None = None) -> tuple[GPT, Any, dict[str, Any]]:
    """``(model, tokenizer, config)`` of a run folder: :meth:`RunFolder.load`."""
    return RunFolder(run_dir).load(step)


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


def _aliases(meta: dict[str, Any]) -> dict[str, str]:
    aliases = meta.get("model_aliases", {})
    return aliases if isinstance(aliases, dict) else {}


def _number(value: Any, default: float) -> float:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else default


__all__ = [
    "RUN_FILES",
    "STATES",
    "RunFileError",
    "RunFolder",
    "RunFolderMoved",
    "load_run",
    "read_metrics",
    "resolve_run",
    "training_state_missing",
]
