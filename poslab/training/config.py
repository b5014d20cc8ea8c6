"""``TrainConfig``: everything a training run needs, typed (its ``model`` is a :class:`GPTConfig`).

Values are converted and checked by :func:`poslab.config_keys.coerce`, the one conversion of the
config pipeline; ranges are checked here. :func:`resume_identity` is the part of a run's config that
must not change across a resume.
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from poslab.checks import positive_int
from poslab.config_keys import coerce, reject_unknown_keys
from poslab.data import split_text
from poslab.nn.config_migration import check_not_flat, migrate_model_config
from poslab.nn.gpt_config import GROUPS
from poslab.nn.model import GPTConfig

DTYPES = ("auto", "fp32", "bf16")
#: ``TrainConfig.optimizer`` choices (see :func:`poslab.training.optim.make_optimizer`)
OPTIMIZERS = ("adamw", "muon")
#: training objectives: next-token prediction (causal LM) and BERT's masked LM (bidirectional encoder)
OBJECTIVES = ("clm", "mlm")
#: ``TrainConfig.device`` choices (see :func:`training_device`)
DEVICES = ("auto", "cpu", "cuda")

#: tokens per optimizer step (``batch_size * grad_accum * block_size``) above which a config is refused:
#: 2**30 is ~250x the 4M-token batches of the largest published trainings (GPT-3, LLaMA); one step of it
#: is a billion token positions, hours of CPU before the first number appears
MAX_TOKENS_PER_STEP = 2**30
#: tokens of a whole training (``max_steps`` x tokens per step) above which a config is refused: 10**15 is
#: ~30x the largest published trainings (15-36 T tokens); no machine poslab runs on gets through it
MAX_TRAINING_TOKENS = 10**15
#: optimizer steps above which a config is refused: 1000x the ~1M steps of the longest published trainings
#: (at a millisecond per step, the smallest model's, 10**9 steps are 12 days)
MAX_STEPS = 10**9

#: keys that may differ between a run's saved config and the config it is resumed with
RESUME_FREE_KEYS = frozenset(
    {
        "name",
        "out_dir",
        "max_steps",
        "eval_interval",
        "eval_iters",
        "log_interval",
        "ckpt_interval",
        "keep_checkpoints",
        "threads",
        "skip_nonfinite",
        "stop_val_loss",
        "compile",
        "device",
    }
)

#: the model keys a user may set (``vocab_size`` comes from the tokenizer); ``attention``, ``norm`` and
#: ``mlp`` are groups whose fields are set as ``model.GROUP.FIELD``
MODEL_KEYS = tuple(f.name for f in dataclasses.fields(GPTConfig) if f.name != "vocab_size")


@dataclass
class TrainConfig:
    """Everything a training run needs; flat and typed.

    Attributes:
        name: run name; the run folder is ``out_dir/name``.
        out_dir: parent folder of runs.
        corpus: a shipped corpus (``tang5``, ``tang``, ``shakespeare``) or a path to a UTF-8 text file.
        tokenizer: ``"char"`` or ``"bpe:VOCAB"`` (byte-level BPE trained on the training split).
        val_fraction: the last fraction of the text (by character) used for validation.
        model: the :class:`GPTConfig` (given as one or as a dict of its fields, without ``vocab_size``);
            its ``vocab_size`` is a placeholder until the tokenizer fills it in (:func:`model_config`).
        max_steps: optimizer steps.
        batch_size: sequences per micro-batch.
        grad_accum: micro-batches per optimizer step (tokens per step = ``batch_size*grad_accum*block_size``).
        lr, min_lr: peak and final learning rate.
        warmup_steps: linear warmup steps.
        lr_decay_steps: the cosine reaches ``min_lr`` here (``None`` = ``max_steps``).
        cooldown_steps: 0 for the cosine; else warmup-stable-decay: ``lr`` held after the warmup, then
            linear to ``min_lr`` over the last ``cooldown_steps`` before ``lr_decay_steps``.
        weight_decay: AdamW decay on parameters with 2+ dimensions (nanoGPT's groups).
        beta1, beta2: AdamW betas.
        grad_clip: clip the global gradient norm to this (0 = no clipping).
        eval_interval: evaluate the validation loss every this many steps (and at the end).
        eval_iters: validation batches per evaluation (the same batches every time); 0 = the whole
            validation split in non-overlapping windows (the training-loss estimate then uses 20 batches).
        log_interval: write a metrics line every this many steps.
        ckpt_interval: checkpoint every this many steps (0 = only at the end).
        keep_checkpoints: keep the newest N checkpoints (0 = all).
        seed: seeds the model initialisation, dropout and the data order.
        dtype: ``"fp32"``, ``"bf16"`` (bf16 autocast; weights and optimizer stay fp32) or ``"auto"``:
            bf16 only where it measured faster on this machine (:mod:`poslab.training.precision`;
            the presets' default). A resumed ``auto`` run keeps the dtype it started with.
        threads: ``torch.set_num_threads`` (``None`` = torch's default).
        init_from: a run folder whose latest checkpoint's model weights (and tokenizer) start this
            run: fine-tuning, e.g. at a longer ``block_size`` or with a RoPE scaling; the optimizer,
            step count and schedule start fresh. Parameter names and shapes must match.
        skip_nonfinite: skip up to this many batches whose loss or gradient norm is NaN/inf (no
            update; the next batch is drawn for the same step; recorded in metrics and results)
            before stopping as diverged (0 = stop at the first one).
        optimizer: ``"adamw"`` (nanoGPT's groups, fused) or ``"muon"``: ``torch.optim.Muon`` for the
            2-D weights inside the blocks (its update RMS matched to AdamW's, so ``lr`` and the
            schedule are shared), AdamW for embeddings, the LM head and 1-D parameters.
        stop_val_loss: stop once an evaluated validation loss is ``<=`` this (``None`` = run all
            ``max_steps``): time to quality. The checkpoint of that step is saved; ``results.json``
            records ``status: "target reached"``, the step, the tokens and the training time.
        objective: ``"clm"`` (next-token prediction) or ``"mlm"`` (BERT's masked LM: 15% of the
            positions selected, 80/10/10 mask/random/kept, the loss on the selected positions only;
            needs ``model.attention.causal = False`` and a scheme that works without the causal mask; the model
            gets one extra vocabulary id, the ``[MASK]`` token: see :mod:`poslab.training.data`).
        compile: run the training forward and backward through ``torch.compile(model, dynamic=False)``
            (inductor; on CPU it generates C++ and needs a compiler). Only the training step is
            compiled: evaluation, checkpoints (plain parameter names) and sampling use the model as
            is. The first step pays the compilation (about a minute on a shared 2-core CPU); a resume
            may switch it. Measured on CPU (``benchmarks/README.md``, "Compiled step"): no gain at
            4/4/128 T=128 or 6/6/384 T=256, 1.2-1.35x at the fast preset's size (T=64, RoPE), where
            the warm-up still costs more than it saves over the preset's run; so it is off.
        memory: Transformer-XL segment-level recurrence (Dai et al. 2019): the memory length ``M``
            (0 = off). Batches are then consecutive segments of ``batch_size`` contiguous streams of
            the training text (each micro-batch of ``grad_accum`` its own streams), every layer also
            attends the last ``M`` inputs it saw (no gradient into them), and validation reads the
            validation streams segment after segment with the memory carried. The memory starts
            empty when a stream wraps around and on a resume. Causal LM, one process, and a scheme
            without a position table (positions continue across segments) only.
        stream_batches: batches are consecutive segments of contiguous streams, as with ``memory``,
            but without a memory (the fixed-context baseline of Transformer-XL trained on the same
            segments); implied by ``memory > 0``.
        device: where a single-process run trains: ``"auto"`` (the default: CUDA when torch sees a
            device, else the CPU), ``"cuda"`` (the current CUDA device; an error when torch sees none)
            or ``"cpu"``.
            Under torchrun each process uses ``cuda:LOCAL_RANK`` when CUDA is available and the CPU
            otherwise; ``cuda`` there without CUDA, or ``cpu`` on CUDA ranks, is an error. Checkpoints
            are device-independent, so a resume may change it. ``results.json`` records the device used.
    """

    name: str
    out_dir: str = "runs"
    corpus: str = "tang5"
    tokenizer: str = "char"
    val_fraction: float = 0.1
    model: GPTConfig = field(default_factory=GPTConfig)
    max_steps: int = 2000
    batch_size: int = 32
    grad_accum: int = 1
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    lr_decay_steps: int | None = None
    cooldown_steps: int = 0
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_interval: int = 250
    eval_iters: int = 20
    log_interval: int = 10
    ckpt_interval: int = 500
    keep_checkpoints: int = 3
    seed: int = 1337
    dtype: str = "fp32"
    threads: int | None = None
    init_from: str | None = None
    skip_nonfinite: int = 0
    optimizer: str = "adamw"
    stop_val_loss: float | None = None
    objective: str = "clm"
    compile: bool = False
    memory: int = 0
    stream_batches: bool = False
    device: str = "auto"

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(TrainConfig)
        for f in dataclasses.fields(self):
            if f.name != "model":
                setattr(self, f.name, coerce(f.name, getattr(self, f.name), hints[f.name]))
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective={self.objective!r} is not allowed; choose one of {list(OBJECTIVES)}")
        try:
            self.model = _model_of(self.model)
        except ValueError as err:
            if self.objective == "mlm":
                position = self.model.get("position", "none") if isinstance(self.model, dict) else "?"
                raise ValueError(
                    f"objective 'mlm' needs non-causal attention, and the model does not build with "
                    f"position scheme {position!r}: {err}"
                ) from None
            raise
        if self.objective == "mlm":
            check_bidirectional(self.model)
        if not self.name or any(c in self.name for c in "/\\") or self.name in (".", ".."):
            raise ValueError(f"name must be a plain folder name (no '/', not '.' or '..'), got {self.name!r}")
        positive = ("max_steps", "batch_size", "grad_accum", "eval_interval", "log_interval")
        for key in positive:
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be > 0, got {getattr(self, key)!r}")
        for key in (
            "warmup_steps",
            "cooldown_steps",
            "ckpt_interval",
            "keep_checkpoints",
            "seed",
            "skip_nonfinite",
            "eval_iters",
            "memory",
        ):
            if getattr(self, key) < 0:
                raise ValueError(f"{key} must be >= 0, got {getattr(self, key)!r}")
        per_step = self.batch_size * self.grad_accum * self.model.block_size
        if (
            per_step > MAX_TOKENS_PER_STEP
            or self.max_steps * per_step > MAX_TRAINING_TOKENS
            or self.max_steps > MAX_STEPS
        ):
            raise ValueError(
                f"batch_size {self.batch_size:,} x grad_accum {self.grad_accum:,} x block_size "
                f"{self.model.block_size:,} = {per_step:,} tokens per step, x max_steps {self.max_steps:,} = "
                f"{self.max_steps * per_step:.3g} tokens: a training is limited to {MAX_TOKENS_PER_STEP:,} tokens "
                f"per step, {MAX_STEPS:.0e} steps and {MAX_TRAINING_TOKENS:.0e} tokens in all (past any real "
                "training: it would never finish)"
            )
        if self.lr_decay_steps is not None and self.lr_decay_steps <= 0:
            raise ValueError(f"lr_decay_steps must be > 0 or None, got {self.lr_decay_steps!r}")
        if self.cooldown_steps and self.cooldown_steps > self.decay_steps - self.warmup_steps:
            raise ValueError(
                f"cooldown_steps {self.cooldown_steps} must fit between warmup_steps {self.warmup_steps} "
                f"and lr_decay_steps {self.decay_steps}"
            )
        if self.threads is not None and not 0 < self.threads <= 4096:
            raise ValueError(f"threads must be in 1..4096 or None, got {self.threads!r}")
        if self.seed >= 2**63:  # torch seeds are 64-bit
            raise ValueError(f"seed must be < 2**63, got {self.seed!r}")
        if not (self.lr > 0 and 0 <= self.min_lr <= self.lr):
            raise ValueError(f"need lr > 0 and 0 <= min_lr <= lr, got lr={self.lr!r}, min_lr={self.min_lr!r}")
        for key in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ValueError(f"{key} must be in [0, 1), got {getattr(self, key)!r}")
        if self.weight_decay < 0 or self.grad_clip < 0:
            raise ValueError(f"weight_decay and grad_clip must be >= 0, got {self.weight_decay!r}, {self.grad_clip!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is not allowed; choose one of {list(DTYPES)}")
        if self.device not in DEVICES:
            raise ValueError(f"device={self.device!r} is not allowed; choose one of {list(DEVICES)}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer={self.optimizer!r} is not allowed; choose one of {list(OPTIMIZERS)}")
        if self.stop_val_loss is not None and not self.stop_val_loss > 0:
            raise ValueError(f"stop_val_loss must be > 0 or None, got {self.stop_val_loss!r}")
        if (self.memory or self.stream_batches) and self.objective != "clm":
            what = f"memory={self.memory} (Transformer-XL segment recurrence)" if self.memory else "stream_batches"
            raise ValueError(f"{what} reads the text left to right: it needs objective 'clm', got {self.objective!r}")
        if self.memory and self.compile:
            raise ValueError(
                f"compile=true does not run with memory={self.memory} (the segment memory changes between "
                "calls, which a compiled graph cannot follow); set compile=false or memory=0"
            )
        split_text("", self.val_fraction)  # validates the range

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """Build from a dict; unknown keys raise ``ValueError`` suggesting the close key."""
        reject_unknown_keys(values, [f.name for f in dataclasses.fields(cls)], "training key")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values; ``model`` holds every model field except ``vocab_size``."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "model"}
        return {**values, "model": model_fields(self.model)}

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir) / self.name

    @property
    def decay_steps(self) -> int:
        return self.lr_decay_steps if self.lr_decay_steps is not None else self.max_steps


def _model_of(model: Any) -> GPTConfig:
    """A :class:`GPTConfig` from a ``TrainConfig.model`` value (a dict of its fields without ``vocab_size``)."""
    if isinstance(model, GPTConfig):
        return model
    if not isinstance(model, dict):
        raise TypeError(f"model must be a mapping of GPTConfig fields or a GPTConfig, got {type(model).__name__}")
    if "vocab_size" in model:
        raise ValueError("model.vocab_size is set from the tokenizer; remove it from the config")
    check_not_flat(model, prefix="model.")
    reject_unknown_keys(model, list(MODEL_KEYS), "model key", prefix="model.")
    for name, group in GROUPS.items():
        if isinstance(model.get(name), dict):
            fields = [f.name for f in dataclasses.fields(group)]
            reject_unknown_keys(model[name], fields, f"{name} key", prefix=f"model.{name}.")
    return GPTConfig.from_dict(dict(model))


def check_bidirectional(model: GPTConfig) -> None:
    """``ValueError`` unless ``model`` can train a masked LM: its scheme works without the causal mask, and ``causal``
    is off.

    Whether a scheme is causal-only is the scheme's own answer: the model config is rebuilt with
    ``causal=False``, which calls the scheme's ``check_layer(..., causal=False)``; a refusal there is
    reported naming the scheme.
    """
    if model.attention.causal:
        try:
            dataclasses.replace(
                model,
                attention=model.attention.with_(causal=False),
                position_config=copy.deepcopy(model.position_config),
            )
        except ValueError as err:
            raise ValueError(
                f"position scheme {model.position!r} is causal-only, so it cannot train a masked LM "
                f"(objective 'mlm'): {err}"
            ) from None
        raise ValueError(
            "objective 'mlm' trains a bidirectional encoder: set model.attention.causal to false "
            "(--model.attention.causal false)"
        )


def model_fields(model: GPTConfig) -> dict[str, Any]:
    """The fields of ``model`` a user sets (all but ``vocab_size``), as plain values."""
    return {k: v for k, v in model.to_dict().items() if k != "vocab_size"}


def model_config(cfg: TrainConfig, vocab_size: int) -> GPTConfig:
    """``cfg.model`` with the tokenizer's ``vocab_size``, without building (and validating) it again.

    ``vocab_size`` takes no part in the position scheme or the geometry that ``GPTConfig`` checks,
    so the validated config is copied rather than rebuilt: the scheme is built once more only by the
    model itself.
    """
    positive_int("vocab_size", vocab_size)
    out = copy.copy(cfg.model)
    out.position_config = copy.deepcopy(cfg.model.position_config)
    out.vocab_size = vocab_size
    return out


def training_device(device: str, distributed_device: str | None = None) -> str:
    """The device type a run of ``TrainConfig.device = device`` trains on: ``"cpu"`` or ``"cuda"``.

    Args:
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``.
        distributed_device: under torchrun, the device type the process group chose (``cuda`` with
            nccl, ``cpu`` with gloo); ``None`` for a single process.

    Raises:
        ValueError: ``cuda`` where torch sees no CUDA device (naming the torch build), or a device
            that contradicts the one torchrun's process group uses.
    """
    import torch

    if device not in DEVICES:
        raise ValueError(f"device={device!r} is not allowed; choose one of {list(DEVICES)}")
    if distributed_device is not None:
        if device != "auto" and device != distributed_device:
            why = (
                "torch sees no CUDA device, so torchrun's processes use gloo on the CPU"
                if device == "cuda"
                else "torch sees CUDA, so torchrun's processes use nccl on cuda:LOCAL_RANK "
                "(CUDA_VISIBLE_DEVICES= hides the GPUs)"
            )
            raise ValueError(f"device={device!r} cannot be used under this torchrun: {why}; use --device auto")
        return distributed_device
    if device == "cuda" and not torch.cuda.is_available():
        build = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "built without CUDA"
        raise ValueError(
            f"device='cuda' but torch sees no CUDA device (torch {torch.__version__}, {build}); "
            "use --device cpu or --device auto"
        )
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def check_backend_trains(backend: str, device: str) -> None:
    """Refuse an attention backend that cannot run a backward pass on ``device``.

    The rule is the backend registry's (:func:`poslab.nn.attention.backend_trains`, a reason or ``None``).

    Raises:
        ValueError: ``model.attention.backend='flex' cannot train on cpu: ...``, naming the backends that can.
    """
    from poslab.nn.attention import backend_trains

    reason = backend_trains(backend, device)
    if reason is not None:
        raise ValueError(
            f"model.attention.backend={backend!r} cannot train on {device}: the {backend} backend {reason}; use "
            "--model.attention.backend auto, sdpa or eager to train (a trained model can still be evaluated "
            f"with {backend})"
        )


def check_model_for_training(
    cfg: TrainConfig, max_positions: int | None, world_size: int = 1, device: str = "cpu"
) -> None:
    """What training refuses about ``cfg.model`` beyond its own checks: one function for ``train`` and its pre-flight.

    Args:
        cfg: the training config.
        max_positions: the position scheme's table size (``None``: no table), from the scheme itself.
        world_size: processes of the run (torchrun), 1 for one process.
        device: the device type training runs on (``"cpu"``, ``"cuda"``).

    Raises:
        ValueError: a backend that cannot train on ``device``; ``block_size`` past the scheme's table;
            ``memory``/``stream_batches`` with several processes, with a position table (``memory``) or
            with mla.
    """
    model = cfg.model
    check_backend_trains(model.attention.backend, device)
    if max_positions is not None and model.block_size > max_positions:
        raise ValueError(
            f"block_size {model.block_size} is larger than the {model.position!r} position "
            f"table ({max_positions} positions); lower --model.block_size or raise the table's max_len"
        )
    if not (cfg.memory or cfg.stream_batches):
        return
    what = f"memory={cfg.memory} (segment recurrence)" if cfg.memory else "stream_batches"
    if world_size > 1:
        raise ValueError(
            f"{what} runs in one process; this run has world_size={world_size} "
            "(drop --memory / --stream_batches or torchrun)"
        )
    if max_positions is not None and cfg.memory:
        raise ValueError(
            f"memory={cfg.memory} continues positions across segments, past the "
            f"{model.position!r} table of {max_positions} positions; use a scheme without a table"
        )
    if model.mla is not None:
        raise ValueError(f"{what} needs standard attention, not mla")


def resume_identity(config_doc: dict, model: GPTConfig | None = None) -> dict:
    """The part of a run's config (``{"model": ..., "train": ...}``) that must not change across a resume.

    Both sections are normalised through their dataclasses, so a field added to ``GPTConfig`` or
    ``TrainConfig`` after a run was saved compares equal to its default instead of blocking the resume.

    Args:
        config_doc: the run's config document.
        model: ``config_doc["model"]`` already built (saves building it again).

    Raises:
        KeyError: a section is missing; TypeError / ValueError: a section does not build.
    """
    if model is None:
        model = GPTConfig.from_dict(migrate_model_config(config_doc["model"]))
    train_values = {**config_doc["train"], "model": model}
    train_values.setdefault("name", "run")
    train = {
        k: v
        for k, v in TrainConfig.from_dict(train_values).to_dict().items()
        if k not in RESUME_FREE_KEYS and k != "model"
    }
    return {"model": model.to_dict(), "train": train}


__all__ = [
    "DEVICES",
    "DTYPES",
    "MAX_STEPS",
    "MAX_TOKENS_PER_STEP",
    "MAX_TRAINING_TOKENS",
    "MODEL_KEYS",
    "OBJECTIVES",
    "OPTIMIZERS",
    "RESUME_FREE_KEYS",
    "TrainConfig",
    "check_backend_trains",
    "check_bidirectional",
    "check_model_for_training",
    "model_config",
    "model_fields",
    "resume_identity",
    "training_device",
]
