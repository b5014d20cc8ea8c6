"""The training loop: ``run_training(cfg, store, ...)`` trains a GPT and writes through ``store``.

The loop follows nanoGPT's ``train.py`` (random windows, AdamW with weight-decay groups, linear
warmup then cosine decay to ``min_lr``, gradient clipping and accumulation, optional bf16 autocast),
with a checkpoint format that never unpickles and a resume that reproduces the uninterrupted loss
curve bitwise on CPU.

The loop knows nothing of the run folder's layout: it reads and writes the run's files through the
:class:`RunStore` it is given and its checkpoints through an injected
:class:`~poslab.training.checkpointer.Checkpointer`. :class:`poslab.runs.RunFolder` is both stores
(the one reader and writer of a run folder), and ``poslab.session.train(cfg)`` is the public entry
that takes the run's lock, prepares the folder and calls :func:`run_training`. A step is
:func:`poslab.training.step.train_step`; evaluation is :mod:`poslab.training.evaluation`; MFU is
:mod:`poslab.training.mfu`. See ``docs/training.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from poslab.data import get_batch
from poslab.nn.memory import SegmentMemory
from poslab.nn.model import GPT
from poslab.training import checkpoint as ckpt
from poslab.training import distributed
from poslab.training.checkpointer import Checkpointer, Progress, TrainingState
from poslab.training.config import (
    DTYPES,
    RESUME_FREE_KEYS,
    TrainConfig,
    check_model_for_training,
    model_config,
    resume_identity,
    training_device,
)
from poslab.training.data import (
    RunData,
    batchify,
    data_seed,
    mask_id_of,
    model_vocab_size,
    objective_batch,
    prepare_data,
    stream_segment,
    stream_segments,
)
from poslab.training.evaluation import evaluate_loss, segment_nll
from poslab.training.interrupt import InterruptFlag
from poslab.training.mfu import matmul_flops_per_token, mfu_of, training_peak
from poslab.training.optim import lr_at, make_optimizer
from poslab.training.precision import CONCRETE_DTYPES, PrecisionChoice, choose_dtype
from poslab.training.progress import ProgressBar, format_duration, format_rate
from poslab.training.step import StepSettings, train_step

#: windows per forward pass of a whole-split evaluation at least (a multiple of the training batch): on one
#: CPU thread the 4/4/128 model at T=64 evaluates the split in about 0.8x (bf16) to 0.95x (fp32) the time
#: of batches of 12
WHOLE_SPLIT_BATCH = 64


class TrainingDiverged(RuntimeError):
    """The loss or the gradient norm became NaN/inf; training stopped before applying that update."""


class RunStore(Protocol):
    """The run files the loop reads and writes (implemented by :class:`poslab.runs.RunFolder`; its checkpoints
    go through :class:`~poslab.training.checkpointer.CheckpointStore`).

    Under ``torchrun`` only rank 0 calls the writing methods.
    """

    path: Path

    def prepare_for_writing(self) -> None:
        """Fail now if the folder is read-only; delete temporary files a killed writer left."""

    def config(self) -> dict:
        """The saved ``config.json`` (a resume)."""

    def read_tokenizer(self) -> Any:
        """The saved tokenizer, checked against its recorded digest (``None`` if the run has none)."""

    def write_start(self, tokenizer: Any) -> None:
        """A fresh run: write the tokenizer and an empty metrics file."""

    def write_config(self, config_doc: dict) -> None:
        """Write ``config.json`` (with the tokenizer's digest recorded)."""

    def truncate_metrics(self, last_step: int) -> None:
        """Keep only the metrics of steps ``<= last_step``."""

    def metrics_appender(self, enabled: bool) -> contextlib.AbstractContextManager[Callable[[dict], None]]:
        """A context giving ``append(record)``; a no-op writer when not ``enabled``."""

    def results(self) -> dict | None:
        """The saved ``results.json`` (``None`` before the run ends)."""

    def write_results(self, results: dict) -> None:
        """Write ``results.json``."""

    def restore_weights(self, model: nn.Module) -> None:
        """Load the latest checkpoint's model weights into ``model`` (``init_from``)."""

    def matmul_peak(self, key: str, measure: Callable[[], float]) -> float:
        """The cached matmul peak for ``key`` (``dtype/threads``), measured with ``measure`` on first use."""


@dataclass(frozen=True)
class Hooks:
    """What the caller sees of a session: the live progress bar (``progress``), ``callback(step, record)`` after
    every optimizer step (raising ``KeyboardInterrupt`` in it acts like Ctrl-C), ``on_started()`` once the run's
    config is written (the run exists from then on), and ``wall_start``, ``time.perf_counter()`` at the start of
    the command (default: when training starts)."""

    progress: bool = True
    callback: Callable[[int, dict], None] | None = None
    on_started: Callable[[], None] | None = None
    wall_start: float | None = None

    def __post_init__(self) -> None:
        for name in ("callback", "on_started"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise ValueError(f"{name} {getattr(self, name)!r}: must be a function or None")


@dataclass
class _Timing:
    """Wall-clock bookkeeping of one session (not saved: a resume measures its own)."""

    wall_start: float
    train_time: float = 0.0
    interval_tokens: int = 0
    interval_time: float = 0.0
    session_tokens: int = 0
    tokens_per_s_log: list[float] = field(default_factory=list)
    first_step_s: float | None = None  # this session's first step (with cfg.compile: the compilation)


def run_training(
    cfg: TrainConfig,
    store: RunStore,
    *,
    resuming: bool,
    dist_ctx: distributed.DistContext,
    hooks: Hooks | None = None,
    init_from: RunStore | None = None,
    checkpointer: Checkpointer | None = None,
) -> dict:
    """Train as ``cfg`` says, reading and writing the run through ``store``.

    Args:
        cfg: the run's configuration.
        store: the run folder (already locked and prepared by the caller).
        resuming: continue from the store's newest good checkpoint (the config must match the saved
            one except for :data:`RESUME_FREE_KEYS`).
        dist_ctx: the process group context (:func:`poslab.training.distributed.setup`).
        hooks: the progress bar, the callbacks and the command's start time (default: :class:`Hooks`'s).
        init_from: the run whose weights and tokenizer start this one (``cfg.init_from``).
        checkpointer: saves and restores the training's state (default: a
            :class:`~poslab.training.checkpointer.Checkpointer` keeping ``cfg.keep_checkpoints`` of them in
            ``store``); the trainer sets its process group.

    Returns:
        The results dict (also written through ``store``).
    """
    dist_ctx = on_device(cfg.device, dist_ctx)
    checkpointer = checkpointer if checkpointer is not None else Checkpointer(store, cfg.keep_checkpoints)
    checkpointer.dist = dist_ctx
    hooks = Hooks() if hooks is None else hooks
    trainer = _Trainer(cfg, store, checkpointer, dist_ctx, hooks)
    trainer.setup(resuming, init_from)
    if hooks.on_started is not None:
        hooks.on_started()
    trainer.loop()
    return trainer.finish()


def on_device(device: str, dist_ctx: distributed.DistContext) -> distributed.DistContext:
    """``dist_ctx`` on the device ``TrainConfig.device`` names (:func:`~poslab.training.config.training_device`).

    A single process moves to the current CUDA device for ``cuda`` (and ``auto`` where torch sees
    one); under torchrun the process group's device stays, checked against ``device``.

    Raises:
        ValueError: ``cuda`` without a CUDA device, or a device torchrun's process group does not use.
    """
    if dist_ctx.enabled:
        training_device(device, dist_ctx.device.type)
        return dist_ctx
    if training_device(device) == "cuda":
        return dataclasses.replace(dist_ctx, device=torch.device("cuda", torch.cuda.current_device()))
    return dist_ctx


class _Trainer:
    """One training session: built by :meth:`setup`, run by :meth:`loop`, summarised by :meth:`finish`."""

    def __init__(
        self,
        cfg: TrainConfig,
        store: RunStore,
        checkpointer: Checkpointer,
        dist_ctx: distributed.DistContext,
        hooks: Hooks,
    ) -> None:
        self.cfg, self.store, self.checkpointer, self.dist = cfg, store, checkpointer, dist_ctx
        self.show, self.callback = hooks.progress, hooks.callback
        self.timing = _Timing(hooks.wall_start or time.perf_counter())
        self.state = Progress()
        self.target: dict[str, Any] = {}  # where stop_val_loss was reached (time to quality), empty until then
        self.last_val: tuple[int, float] | None = None  # (step, validation loss) of the latest evaluation
        self.resuming = False
        self.start_step = 0
        self.ended: dict | None = None  # the saved results of a resumed run that had already ended
        self.notes: list[str] = []  # printed once the progress bar exists

    # -------------------------------------------------------------------------------- setup
    def setup(self, resuming: bool, init_from: RunStore | None) -> None:
        """Data, model and optimizer; the saved state restored (``resuming``) or the run's files started."""
        store, dist = self.store, self.dist
        self.resuming = resuming
        if dist.is_main:  # only rank 0 writes the run folder (and holds its lock)
            store.prepare_for_writing()
        saved_doc = store.config() if resuming else None
        self._resolve_precision(saved_doc)
        self._prepare_data(init_from)
        self._build_model(init_from)
        if resuming:
            self._restore(saved_doc)
        elif dist.is_main:
            store.write_start(self.data.tokenizer)
        if dist.is_main:
            store.write_config(self.config_doc)
        self.start_step = self.state.step
        self.ended = self._ended(resuming)
        self._start_progress()

    def _ended(self, resuming: bool) -> dict | None:
        """A resumed run that had already ended at the restored step (its ``max_steps``, or its ``stop_val_loss``
        reached): its saved results, which this session keeps instead of training or overwriting the measurements
        of the training that made them; else ``None``."""
        if not resuming:
            return None
        try:
            saved = self.store.results()
        except (OSError, ValueError):  # a torn results.json: the run did not end cleanly
            return None
        if not isinstance(saved, dict) or saved.get("steps") != self.state.step:
            return None
        if saved.get("status") == "completed":
            return saved if self.state.step >= self.cfg.max_steps else None
        target = saved.get("target")
        reached = saved.get("status") == "target reached" and isinstance(target, dict)
        return saved if reached and target.get("stop_val_loss") == self.cfg.stop_val_loss else None

    def _resolve_precision(self, saved_doc: dict | None) -> None:
        """``dtype="auto"`` made concrete (measured once per machine); every rank takes rank 0's choice.

        A resumed ``auto`` run keeps the dtype its saved config records, so a resume on another
        machine continues the same computation.
        """
        cfg = self.cfg
        saved = ((saved_doc or {}).get("train") or {}).get("dtype")
        if cfg.dtype == "auto" and saved in CONCRETE_DTYPES:
            self.precision = PrecisionChoice("auto", saved, f"auto: {saved}, kept from the resumed run")
        else:
            self.precision = self.dist.run_on_main(choose_dtype, cfg.dtype, self.dist.device)
        if self.precision.warning:
            self.notes.append(self.precision.warning)
        self.cfg = dataclasses.replace(cfg, dtype=self.precision.dtype)

    def _prepare_data(self, init_from: RunStore | None) -> None:
        """The corpus encoded (with the resumed run's or ``init_from``'s tokenizer) and the run's config document."""
        cfg = self.cfg
        tokenizer = None
        if self.resuming:
            tokenizer = self.store.read_tokenizer()
        elif init_from is not None:
            tokenizer = init_from.read_tokenizer()  # the same ids as the weights
        self.data: RunData = prepare_data(cfg, tokenizer)
        self.model_cfg = model_config(cfg, model_vocab_size(self.data.tokenizer.vocab_size, cfg.objective))
        self.mask_id = mask_id_of(self.model_cfg.vocab_size) if cfg.objective == "mlm" else None
        train_doc = {k: v for k, v in cfg.to_dict().items() if k != "model"}
        self.config_doc = {"model": self.model_cfg.to_dict(), "train": train_doc, "data": self.data.info}
        self.config_doc.update(self.dist.config_section())  # {"distributed": {world_size, ...}} under torchrun
        self.identity = resume_identity(self.config_doc, self.model_cfg)  # once per run, not per checkpoint

    def _build_model(self, init_from: RunStore | None) -> None:
        """The seeded model (``init_from``'s weights where given), its DDP/FSDP form, the optimizer, the data RNG."""
        cfg, dist = self.cfg, self.dist
        torch.manual_seed(cfg.seed)
        self.model = GPT(self.model_cfg)
        if init_from is not None and (not self.resuming or self.checkpointer.latest_step() is None):
            init_from.restore_weights(self.model)  # a resume with a checkpoint overwrites these weights anyway
        check_model_for_training(
            cfg, self.model.position.max_positions, dist.world_size, dist.device.type
        )  # = pre-flight
        if cfg.memory or cfg.stream_batches:
            self._setup_memory()
        self.wrapped_model = dist.prepare_model(self.model, cfg.seed)  # DDP wrapper, FSDP shards, or the model
        # cfg.compile: only the training calls go through the compiled wrapper; self.model (evaluation,
        # checkpoints: no "_orig_mod." in the names) stays the plain module with the same parameters
        self.train_model = torch.compile(self.wrapped_model, dynamic=False) if cfg.compile else self.wrapped_model
        self.eval_model, self.eval_batch = dist.eval_model(self.model, cfg.batch_size)  # global eval batch
        self.optimizer = make_optimizer(self.model, cfg)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.step_settings = StepSettings(cfg.grad_clip, cfg.grad_accum, cfg.dtype, dist.device.type, finite_only=True)
        self.data_rng = torch.Generator().manual_seed(data_seed(cfg.seed))

    def _setup_memory(self) -> None:
        """Stream batches (``cfg.memory``, ``cfg.stream_batches``): the streams of each micro-batch and their
        memories."""
        cfg = self.cfg
        T = self.model_cfg.block_size
        streams = batchify(self.data.train, cfg.batch_size * cfg.grad_accum, T)  # [B*A, S]
        self.train_streams = list(streams.split(cfg.batch_size))  # one stream set per micro-batch: [B, S] each
        self.train_segments = stream_segments(streams, T)
        # empty at the start (a resume loads the checkpoint's); None: stream batches without a memory
        self.memories = [SegmentMemory(cfg.memory) if cfg.memory else None for _ in self.train_streams]

    def _start_progress(self) -> None:
        """The matmul peak (MFU), FLOPs per token and the progress bar, with the opening line and notes."""
        cfg, dist = self.cfg, self.dist
        self.peak = training_peak(
            cfg.dtype, dist.device, lambda key, measure: dist.run_on_main(self.store.matmul_peak, key, measure)
        )
        self.flops_per_token = matmul_flops_per_token(self.model, self.model_cfg.block_size)
        self.tokens_per_step = cfg.batch_size * cfg.grad_accum * self.model_cfg.block_size * dist.world_size
        self.bar = ProgressBar(
            cfg.max_steps, start_step=self.state.step, enabled=self.show and dist.is_main, stream=dist.bar_stream()
        )
        if self.show and dist.is_main:
            self.bar.message(self._banner())
        if dist.is_main:
            for note in self.notes:
                self.bar.message(note)

    def _restore(self, saved_doc: dict) -> None:
        """Check the config against the saved one, then load the newest good checkpoint (if any)."""
        cfg, store, dist = self.cfg, self.store, self.dist
        mismatch = ckpt.config_mismatch(resume_identity(saved_doc), self.identity, saved_label="saved run")
        if saved_doc.get("data", {}).get("corpus_sha256") != self.data.info["corpus_sha256"]:
            mismatch.append(f"data.corpus_sha256: the corpus text changed since the run started ({cfg.corpus!r})")
        if mismatch:
            raise ValueError(
                f"cannot resume {str(store.path)!r}: the config differs from the saved one: " + "; ".join(mismatch)
            )
        state = self._training_state()
        notes = self.checkpointer.restore(state, self.identity)
        if notes is None:  # killed before its first checkpoint: nothing to restore (said, not silent)
            self.notes.append(
                f"poslab: note: {str(store.path)!r} has no checkpoint yet: --resume starts it from step 0"
            )
        else:
            self.notes += notes
            self.state = state.progress
        if dist.is_main:
            store.truncate_metrics(self.state.step)

    def _banner(self) -> str:
        cfg, data, state = self.cfg, self.data, self.state
        n_params = sum(p.numel() for p in self.model.parameters())
        return (
            f"{'resuming' if self.resuming else 'training'} {self.store.path}"
            f"{f' from step {state.step}' if self.resuming else ''}: "
            f"{n_params / 1e6:.2f}M parameters, {self.model_cfg.position} positions, corpus {cfg.corpus} "
            f"({data.info['train_tokens']:,} train / {data.info['val_tokens']:,} val tokens, vocab "
            f"{data.tokenizer.vocab_size}), {cfg.max_steps} steps x {self.tokens_per_step:,} tokens, "
            f"{self.precision.reason}, "
            f"{torch.get_num_threads()} threads"
            + (f", on {self.dist.device}" if self.dist.device.type != "cpu" else "")
        )

    # -------------------------------------------------------------------------------- checkpoints
    def _training_state(self) -> TrainingState:
        """What a checkpoint holds of this training (:class:`~poslab.training.checkpointer.TrainingState`)."""
        memories = getattr(self, "memories", [])
        return TrainingState(
            self.model,
            self.optimizer,
            self.data_rng,
            self.state,
            self.cfg.grad_accum,
            memories,
            [streams.shape[0] for streams in getattr(self, "train_streams", [])],
        )

    def save(self, at_step: int) -> Path | None:
        """Checkpoint the state after ``at_step`` steps (every rank takes part; only rank 0 writes)."""
        return self.checkpointer.save(at_step, self._training_state(), self.identity)

    def _checkpoint_due(self, step: int) -> bool:
        return step == self.cfg.max_steps or bool(self.cfg.ckpt_interval and step % self.cfg.ckpt_interval == 0)

    # -------------------------------------------------------------------------------- steps
    def loop(self) -> None:
        """Optimizer steps until ``max_steps``; Ctrl-C saves a checkpoint and raises ``KeyboardInterrupt``."""
        if self.ended is not None:
            return
        self.model.train()
        with self.store.metrics_appender(self.dist.is_main) as append, InterruptFlag(self.bar.message) as interrupt:
            while self.state.step < self.cfg.max_steps:
                step_start = time.perf_counter()
                lr = lr_at(self.state.step, self.cfg)
                result = train_step(
                    self.optimizer, self.params, self._micro_loss, self.step_settings, lr=lr, reduce=self.dist.mean
                )  # the loss: the global batch's, the same on every rank
                step_loss, grad_norm = result.loss, float(result.grad_norm or 0.0)
                if not result.applied:
                    self._skip_nonfinite(step_loss, grad_norm)
                    continue
                self._count_step(time.perf_counter() - step_start, step_loss)
                record = self._log(append, lr, step_loss, grad_norm)
                step = self.state.step
                if self._checkpoint_due(step) or self.target:
                    self.save(step)
                if self.callback is not None:
                    try:
                        self.callback(step, record)
                    except KeyboardInterrupt:
                        interrupt.requested = True
                if self.dist.any(interrupt.requested):  # Ctrl-C on any rank stops every rank after the same step
                    self._stop_interrupted(step)
                if self.target:  # stop_val_loss reached: time to quality, stop here
                    break

    def _micro_loss(self, micro: int) -> torch.Tensor:
        """The loss of micro-batch ``micro`` of this step (its batch drawn, the forward run)."""
        cfg, dist = self.cfg, self.dist
        extra: dict[str, Any] = {}
        if cfg.memory or cfg.stream_batches:  # the next segment of this micro-batch's streams
            x, y, memory = self._memory_batch(micro)  # [B, T] x2
            x, y = x.to(dist.device), y.to(dist.device)
            if memory is not None:
                extra["cache"] = memory
        else:
            # the global batch (world_size x batch_size windows), then this rank's rows on its device
            x, y = get_batch(
                self.data.train, self.model_cfg.block_size, cfg.batch_size * dist.world_size, self.data_rng
            )  # [W*B, T] x2
            x, y = objective_batch(cfg.objective, x, y, self.mask_id, self.data_rng)  # [W*B, T] x2: masked for mlm
            x, y = dist.shard(x, y, cfg.batch_size)  # [B, T] x2
        dist.set_grad_sync(self.wrapped_model, micro == cfg.grad_accum - 1)  # all-reduce once per step
        _, loss = self.train_model(x, y, **extra)
        return loss

    def _memory_batch(self, micro: int) -> tuple[torch.Tensor, torch.Tensor, SegmentMemory | None]:
        """Micro-batch ``micro``'s next segment and its memory (emptied when its streams wrap around; ``None``: none).

        The segment read is the number of batches drawn so far (steps and skipped batches), so a
        resume continues where the run stopped, with the memory its checkpoint saved.
        """
        drawn = self.state.step + len(self.state.skipped)
        x, y = stream_segment(self.train_streams[micro], drawn, self.model_cfg.block_size)  # [B, T] x2
        memory = self.memories[micro]
        if memory is not None and drawn % self.train_segments == 0:
            memory.reset()
        return x, y, memory

    def _skip_nonfinite(self, step_loss: float, grad_norm: float) -> None:
        """Drop a non-finite batch without an update (``skip_nonfinite``), or stop as diverged."""
        state, cfg = self.state, self.cfg
        if len(state.skipped) >= cfg.skip_nonfinite:
            self._diverged(state.step + 1, step_loss, grad_norm)
        for memory in getattr(self, "memories", ()):  # the dropped batch's states may be non-finite
            if memory is not None:
                memory.reset()
        state.skipped.append(state.step + 1)
        self.bar.message(
            f"skipped a non-finite batch at step {state.step + 1} (loss={step_loss}, "
            f"grad_norm={grad_norm}); {len(state.skipped)} of {cfg.skip_nonfinite} allowed skips used"
        )

    def _count_step(self, elapsed: float, step_loss: float) -> None:
        state, timing = self.state, self.timing
        state.step += 1
        if timing.first_step_s is None:
            timing.first_step_s = elapsed
        timing.train_time += elapsed
        timing.interval_time += elapsed
        timing.interval_tokens += self.tokens_per_step
        timing.session_tokens += self.tokens_per_step
        state.tokens_seen += self.tokens_per_step
        state.log_loss_sum += step_loss
        state.log_loss_count += 1

    def _log(self, append: Callable[[dict], None], lr: float, step_loss: float, grad_norm: float) -> dict[str, Any]:
        """The step's record; on a logged step also the metrics line (and the evaluation when due)."""
        cfg, state, timing = self.cfg, self.state, self.timing
        step = state.step
        evaluate = step % cfg.eval_interval == 0 or step == cfg.max_steps
        if not (evaluate or step % cfg.log_interval == 0 or step == cfg.max_steps):
            self.bar.update(step, loss=step_loss)
            return {"step": step, "loss": step_loss, "lr": lr}
        rate = timing.interval_tokens / timing.interval_time if timing.interval_time > 0 else 0.0
        timing.tokens_per_s_log.append(rate)
        record: dict[str, Any] = {
            "step": step,
            "loss": state.log_loss_sum / state.log_loss_count,
            "lr": lr,
            "tokens_per_s": rate,
            "grad_norm": grad_norm,
            "time_s": time.perf_counter() - timing.wall_start,
        }
        state.log_loss_sum, state.log_loss_count = 0.0, 0
        timing.interval_tokens, timing.interval_time = 0, 0.0
        if evaluate:
            val = self._evaluate(self.data.val, cfg.seed + 1)
            self.last_val = (step, val)
            record["val_loss"] = val
            if state.best["val_loss"] is None or val < state.best["val_loss"]:
                state.best = {"val_loss": val, "step": step}
            if cfg.stop_val_loss is not None and val <= cfg.stop_val_loss:
                self.target = {
                    "step": step,
                    "tokens": state.tokens_seen,
                    "train_time_s": timing.train_time,
                    "val_loss": val,
                }
        if state.skipped:
            record["skipped_nonfinite"] = len(state.skipped)
        append(record)
        self.bar.update(step, loss=record["loss"], val_loss=record.get("val_loss"), tokens_per_s=rate, force=evaluate)
        return record

    def _evaluate(self, data: torch.Tensor, seed: int, iters: int | None = None) -> float:
        """Mean loss over ``eval_iters`` fixed batches (``eval_iters=0``: the whole split, or ``iters`` batches)."""
        n = self.cfg.eval_iters or iters  # None: every non-overlapping window of the split
        # the whole split in larger batches: the same windows and mean, fewer and fuller forward passes
        batch = self.eval_batch * max(1, WHOLE_SPLIT_BATCH // self.cfg.batch_size) if n is None else self.eval_batch
        if self.cfg.memory:  # the split's streams read segment after segment, the memory carried (n segments)
            streams = batchify(data, self.eval_batch, self.model_cfg.block_size)  # [B, S]
            return float(
                segment_nll(
                    self.eval_model, streams, self.model_cfg.block_size, self.cfg.memory, n, dtype=self.cfg.dtype
                )
                .double()
                .mean()
            )
        return evaluate_loss(
            self.eval_model,
            data,
            self.model_cfg.block_size,
            batch,
            n,
            seed=seed,
            dtype=self.cfg.dtype,
            objective=self.cfg.objective,
        )

    def _stop_interrupted(self, step: int) -> None:
        cfg = self.cfg
        if not self._checkpoint_due(step):
            self.save(step)
        self.bar.close(
            f"interrupted at step {step}; checkpoint saved in {self.checkpointer.path_of(step).parent}; "
            f"continue with: {'torchrun (the same options) -m ' if self.dist.world_size > 1 else ''}"
            f"poslab train --name {cfg.name} --out_dir {cfg.out_dir} --resume"
        )
        raise KeyboardInterrupt

    def _diverged(self, step: int, loss: float, grad_norm: float) -> None:
        cfg, skipped = self.cfg, self.state.skipped
        last = self.checkpointer.latest_step()
        where = (
            f"the last good checkpoint is step {last} ({self.checkpointer.path_of(last)})"
            if last is not None
            else "no checkpoint was written before it"
        )
        message = (
            f"training diverged at step {step}: loss={loss}, grad_norm={grad_norm}; the update was not applied; {where}"
        )
        if skipped:
            message += f"; {len(skipped)} non-finite batches were skipped before (skip_nonfinite={cfg.skip_nonfinite})"
        if distributed.is_main_process():  # under torchrun every rank gets here (same global loss); rank 0 writes
            self.store.write_results(
                {
                    "name": cfg.name,
                    "status": "diverged",
                    "diverged_at_step": step,
                    "loss": repr(loss),
                    "grad_norm": repr(grad_norm),
                    "last_good_checkpoint": last,
                    "wall_time_s": time.perf_counter() - self.timing.wall_start,
                    "skipped_nonfinite": list(skipped),
                }
            )
        self.bar.close(message)
        raise TrainingDiverged(message)

    # -------------------------------------------------------------------------------- the end
    def finish(self) -> dict:
        """Final train/val losses, throughput and MFU; ``results.json`` written; the summary printed."""
        cfg, state, timing, dist, data = self.cfg, self.state, self.timing, self.dist, self.data
        if self.ended is not None:
            val = self.ended.get("final_val_loss")
            loss = f"val {val:.4f} | " if isinstance(val, (int, float)) else ""
            self.bar.close(
                f"already ended at step {state.step} ({self.ended['status']}): {loss}its results.json kept | "
                f"{self.store.path}"
            )
            return self.ended
        # the last step's evaluation is the final one (same weights, same windows): not computed twice
        last = self.last_val
        final_val = last[1] if last is not None and last[0] == state.step else self._evaluate(data.val, cfg.seed + 1)
        final_train = self._evaluate(data.train, cfg.seed + 2, iters=20)  # the train split is too big to read whole
        tokens_per_s = timing.session_tokens / timing.train_time if timing.train_time > 0 else None
        results = {
            "name": cfg.name,
            "status": "target reached" if self.target else "completed",
            "steps": state.step,
            "final_train_loss": final_train,
            "final_val_loss": final_val,
            "best_val_loss": state.best["val_loss"],
            "best_val_step": state.best["step"],
            "tokens_per_s": tokens_per_s,
            "tokens_per_s_median": statistics.median(timing.tokens_per_s_log) if timing.tokens_per_s_log else None,
            "flops_per_token": self.flops_per_token,
            "peak_flops": self.peak,
            "mfu": None,
            "dtype": cfg.dtype,
            "precision": self.precision.to_dict(),
            "threads": torch.get_num_threads(),
            "device": dist.device.type,
            "train_time_s": timing.train_time,
            "wall_time_s": time.perf_counter() - timing.wall_start,
            "tokens_seen": state.tokens_seen,
            "n_params": sum(p.numel() for p in self.model.parameters()),
            "train_tokens": data.info["train_tokens"],
            "val_tokens": data.info["val_tokens"],
            "vocab_size": data.info["vocab_size"],
            "resumed_from": self.start_step if self.resuming else None,
            **dist.results_section(tokens_per_s),  # world_size, backend, fsdp, tokens/s per process
            "skipped_nonfinite": state.skipped,
        }
        mfu = mfu_of(tokens_per_s, self.flops_per_token, self.peak * dist.world_size)
        if isinstance(mfu, str):
            results["mfu_refused"] = mfu
            self.bar.message(f"poslab: warning: {mfu}")
        else:
            results["mfu"] = mfu
        if cfg.compile:  # the compilation happens in the first step: counted in train_time_s and tokens_per_s
            results["compile_first_step_s"] = timing.first_step_s
        if cfg.stop_val_loss is not None:  # time to quality (train_time_s counts optimizer steps only, no evaluation)
            results["target"] = {"stop_val_loss": cfg.stop_val_loss, "reached": bool(self.target), **self.target}
        if dist.is_main:
            self.store.write_results(results)
        summary = (
            f"done: {state.step} steps | train {final_train:.4f} | val {final_val:.4f} | "
            f"{format_rate(tokens_per_s or 0)} tok/s | MFU {100 * (results['mfu'] or 0):.1f}% of the measured "
            f"{'fp32/bf16' if cfg.dtype == 'bf16' else 'fp32'} matmul peak {self.peak / 1e9:.0f} GFLOP/s | "
            f"{format_duration(results['wall_time_s'])} | {self.store.path}"
        )
        self.bar.close(summary)
        return results


#: ``evaluate_loss`` and ``segment_nll`` are :mod:`poslab.training.evaluation`'s, named here too for the lab's
#: experiments that import them from the loop
__all__ = [
    "DTYPES",
    "RESUME_FREE_KEYS",
    "RunStore",
    "TrainConfig",
    "TrainingDiverged",
    "evaluate_loss",
    "run_training",
    "segment_nll",
]
