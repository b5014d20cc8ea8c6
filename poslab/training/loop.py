"""Training: ``train(TrainConfig)`` writes a self-contained run folder that can be resumed exactly.

The loop follows nanoGPT's ``train.py`` (random windows, AdamW with weight-decay groups, linear
warmup then cosine decay to ``min_lr``, gradient clipping and accumulation, optional bf16 autocast),
with a checkpoint format that never unpickles and a resume that reproduces the uninterrupted loss
curve bitwise on CPU. Run folder ``OUT_DIR/NAME/``::

    config.json        {"model": GPTConfig, "train": TrainConfig without "model", "data": split info}
    tokenizer.json     the tokenizer (char vocabulary or byte-level BPE), JSON
    metrics.jsonl      one JSON line per logged step (step, loss, lr, tokens_per_s, grad_norm, time_s,
                       val_loss when evaluated)
    peak.json          the measured matmul peak (FLOP/s) used for MFU
    checkpoints/       step_NNNNNNN.safetensors + step_NNNNNNN.json, and the ``latest`` pointer
    results.json       final losses, tokens/s, MFU, wall time, split sizes (written at the end)

See ``docs/training.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import math
import os
import shutil
import signal
import sys
import threading
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from poslab.config_keys import reject_unknown_keys
from poslab.data import build_tokenizer, encode_corpus, get_batch, load_text, split_text, tokenizer_from_dict
from poslab.nn.model import GPT, GPTConfig
from poslab.training import checkpoint as ckpt
from poslab.training import distributed
from poslab.training.lock import RunLock, ensure_writable, interrupted_start, remove_stale_temp_files
from poslab.training.progress import ProgressBar, format_duration, format_rate

DTYPES = ("fp32", "bf16")
#: ``TrainConfig.optimizer`` choices (see :func:`make_optimizer`)
OPTIMIZERS = ("adamw", "muon")

# keys that may differ between a run's saved config and the config it is resumed with
RESUME_FREE_KEYS = frozenset(
    {"name", "out_dir", "max_steps", "eval_interval", "eval_iters", "log_interval", "ckpt_interval", "keep_checkpoints",
     "threads", "skip_nonfinite", "stop_val_loss"}
)


class TrainingDiverged(RuntimeError):
    """The loss or the gradient norm became NaN/inf; training stopped before applying that update."""


@dataclass
class TrainConfig:
    """Everything a training run needs; flat and typed (``model`` holds :class:`GPTConfig` fields).

    Attributes:
        name: run name; the run folder is ``out_dir/name``.
        out_dir: parent folder of runs.
        corpus: a shipped corpus (``tang5``, ``tang``, ``shakespeare``) or a path to a UTF-8 text file.
        tokenizer: ``"char"`` or ``"bpe:VOCAB"`` (byte-level BPE trained on the training split).
        val_fraction: the last fraction of the text (by character) used for validation.
        model: :class:`GPTConfig` fields; ``vocab_size`` is filled in from the tokenizer.
        max_steps: optimizer steps.
        batch_size: sequences per micro-batch.
        grad_accum: micro-batches per optimizer step (tokens per step = ``batch_size*grad_accum*block_size``).
        lr, min_lr: peak and final learning rate.
        warmup_steps: linear warmup steps.
        lr_decay_steps: the cosine reaches ``min_lr`` here (``None`` = ``max_steps``).
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
        dtype: ``"fp32"`` or ``"bf16"`` (bf16 autocast; weights and optimizer stay fp32).
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
    """

    name: str
    out_dir: str = "runs"
    corpus: str = "tang5"
    tokenizer: str = "char"
    val_fraction: float = 0.1
    model: dict = field(default_factory=dict)
    max_steps: int = 2000
    batch_size: int = 32
    grad_accum: int = 1
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    lr_decay_steps: int | None = None
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

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(TrainConfig)
        for f in dataclasses.fields(self):
            setattr(self, f.name, _coerce(f.name, getattr(self, f.name), hints[f.name]))
        if not self.name or any(c in self.name for c in "/\\") or self.name in (".", ".."):
            raise ValueError(f"name must be a plain folder name (no '/', not '.' or '..'), got {self.name!r}")
        positive = ("max_steps", "batch_size", "grad_accum", "eval_interval", "log_interval")
        for key in positive:
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be > 0, got {getattr(self, key)!r}")
        for key in ("warmup_steps", "ckpt_interval", "keep_checkpoints", "seed", "skip_nonfinite", "eval_iters"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key} must be >= 0, got {getattr(self, key)!r}")
        if self.lr_decay_steps is not None and self.lr_decay_steps <= 0:
            raise ValueError(f"lr_decay_steps must be > 0 or None, got {self.lr_decay_steps!r}")
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
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer={self.optimizer!r} is not allowed; choose one of {list(OPTIMIZERS)}")
        if self.stop_val_loss is not None and not self.stop_val_loss > 0:
            raise ValueError(f"stop_val_loss must be > 0 or None, got {self.stop_val_loss!r}")
        split_text("", self.val_fraction)  # validates the range
        if "vocab_size" in self.model:
            raise ValueError("model.vocab_size is set from the tokenizer; remove it from the config")
        reject_unknown_keys(self.model, [f.name for f in dataclasses.fields(GPTConfig)], "model key", prefix="model.")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """Build from a dict; unknown keys raise ``ValueError`` suggesting the close key."""
        reject_unknown_keys(values, [f.name for f in dataclasses.fields(cls)], "training key")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir) / self.name

    @property
    def decay_steps(self) -> int:
        return self.lr_decay_steps if self.lr_decay_steps is not None else self.max_steps


def _coerce(key: str, value: Any, hint: Any) -> Any:
    """Check ``value`` against the annotation ``hint`` (int, float, str, bool, dict, ``X | None``)."""
    args = typing.get_args(hint)
    if type(None) in args:
        if value is None:
            return None
        hint = next(a for a in args if a is not type(None))
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(f"{key} must be an integer, got {value!r} ({type(value).__name__})")
    if hint in (float, str, bool, dict) and not isinstance(value, hint):
        raise TypeError(f"{key} must be {hint.__name__}, got {value!r} ({type(value).__name__})")
    if hint is float and not math.isfinite(value):
        raise ValueError(f"{key} must be finite, got {value!r}")
    return value


# ------------------------------------------------------------------------------------------ pieces
def data_seed(seed: int) -> int:
    """Seed of a run's batch generator, derived from ``seed`` but not equal to it.

    The global RNG (initialisation, dropout) is seeded with ``seed``; a batch generator seeded with
    the same number would replay the very bits the initial weights were drawn from as batch offsets,
    tying the data order to the initialisation. A fixed odd offset makes the two streams independent
    while keeping one ``seed`` the only knob.
    """
    return (seed + 0x9E3779B97F4A7C15) % (2**63)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """nanoGPT's schedule: linear warmup over ``warmup_steps``, cosine to ``min_lr`` at ``decay_steps``.

    Args:
        step: optimizer steps already taken (0 for the first update).
    """
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / (cfg.warmup_steps + 1)
    if step > cfg.decay_steps:
        return cfg.min_lr
    span = max(cfg.decay_steps - cfg.warmup_steps, 1)
    ratio = (step - cfg.warmup_steps) / span
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return cfg.min_lr + coeff * (cfg.lr - cfg.min_lr)


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """The optimizer ``cfg.optimizer`` names, with nanoGPT's weight-decay groups.

    ``adamw``: AdamW with weight decay on every parameter with 2+ dims (matmul weights and
    embedding tables), none on biases, norm gains and other 1-D or scalar parameters. Uses the
    fused kernel where torch has one for the parameters' device (CPU included): same fp32 math,
    one launch instead of one per tensor.

    ``muon``: see :func:`make_muon`.
    """
    if cfg.optimizer == "muon":
        return make_muon(model, cfg)
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return _adamw(groups, cfg)


def _adamw(groups: list[dict], cfg: TrainConfig) -> torch.optim.AdamW:
    kwargs: dict[str, Any] = {"lr": cfg.lr, "betas": (cfg.beta1, cfg.beta2)}
    try:
        return torch.optim.AdamW(groups, fused=True, **kwargs)
    except (RuntimeError, ValueError):  # a device without a fused kernel
        return torch.optim.AdamW(groups, **kwargs)


# ---- Muon (TrainConfig.optimizer = "muon"): make_muon + ChainedOptimizer; self-contained for optim.py
def make_muon(model: nn.Module, cfg: TrainConfig) -> ChainedOptimizer:
    """Muon (Jordan et al. 2024, ``torch.optim.Muon``) for the blocks' 2-D weights, AdamW for the rest.

    Muon orthogonalises the momentum of each hidden matrix (Newton-Schulz) and is meant for those
    only; the token embedding (tied to the LM head), other embeddings and 1-D parameters keep
    AdamW with nanoGPT's groups. ``adjust_lr_fn="match_rms_adamw"`` (Moonshot's scaling, Liu et al.
    2025) gives Muon's update AdamW's RMS, so one ``lr`` and schedule drive both. Muon keeps its
    default Nesterov momentum 0.95 and takes ``weight_decay``.
    """
    params = {id(p): p for p in model.parameters() if p.requires_grad}
    blocks = getattr(model, "blocks", None)
    matrices = [p for p in (blocks.parameters() if blocks is not None else []) if p.requires_grad and p.dim() == 2]
    taken = {id(p) for p in matrices}
    rest = [p for p in params.values() if id(p) not in taken]
    adamw = _adamw([{"params": [p for p in rest if p.dim() >= 2], "weight_decay": cfg.weight_decay},
                    {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0}], cfg)
    if not matrices:
        return ChainedOptimizer([adamw])
    muon = torch.optim.Muon(matrices, lr=cfg.lr, weight_decay=cfg.weight_decay, adjust_lr_fn="match_rms_adamw")
    return ChainedOptimizer([muon, adamw])


class ChainedOptimizer(torch.optim.Optimizer):
    """Several optimizers over disjoint parameters behind one optimizer's interface.

    ``param_groups`` is the concatenation of theirs (the same dicts: setting ``group["lr"]`` reaches
    the owner), ``step``/``zero_grad`` call each, and ``state_dict`` is one standard state dict with
    parameter indices numbered across the parts in order, so checkpoints and resume treat it as one
    optimizer.
    """

    def __init__(self, optimizers: list[torch.optim.Optimizer]) -> None:  # no super().__init__: the parts own the state
        self.optimizers = optimizers
        self.param_groups = [g for opt in optimizers for g in opt.param_groups]
        self.defaults = {}
        self.state = {}

    @torch.no_grad()
    def step(self, closure: Callable | None = None) -> None:
        for opt in self.optimizers:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        state, groups, offset = {}, [], 0
        for opt in self.optimizers:
            sd = opt.state_dict()
            n = sum(len(g["params"]) for g in sd["param_groups"])
            state.update({offset + int(i): v for i, v in sd["state"].items()})
            groups.extend({**g, "params": [offset + i for i in g["params"]]} for g in sd["param_groups"])
            offset += n
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        groups, state, offset = list(state_dict["param_groups"]), state_dict["state"], 0
        for opt in self.optimizers:
            mine = groups[: len(opt.param_groups)]
            groups = groups[len(opt.param_groups) :]
            n = sum(len(g["params"]) for g in mine)
            opt.load_state_dict({
                "state": {int(i) - offset: v for i, v in state.items() if offset <= int(i) < offset + n},
                "param_groups": [{**g, "params": [i - offset for i in g["params"]]} for g in mine],
            })
            offset += n
        self.param_groups = [g for opt in self.optimizers for g in opt.param_groups]


def autocast(dtype: str, device_type: str = "cpu") -> contextlib.AbstractContextManager:
    """bf16 autocast for ``dtype="bf16"``, nothing for fp32."""
    if dtype == "bf16":
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def evaluate_loss(
    model: nn.Module,
    data: torch.Tensor,
    block_size: int,
    batch_size: int,
    iters: int | None,
    *,
    seed: int = 0,
    dtype: str = "fp32",
) -> float:
    """Mean next-token cross-entropy of ``model`` on ``data``.

    Args:
        model: a :class:`GPT` (put in eval mode for the call, its mode restored after).
        data: token ids ``[N]``.
        block_size, batch_size: window length and windows per forward pass.
        iters: number of random batches, drawn from a generator seeded with ``seed`` (so every call
            sees the same windows: curves are comparable across steps and runs); ``None`` = the
            whole of ``data`` in consecutive non-overlapping windows.
        seed: seed of the random windows.
        dtype: ``"fp32"`` or ``"bf16"`` (autocast).

    Returns:
        The mean loss per token (float).
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    try:
        if iters is None:
            n_windows = (data.numel() - 1) // block_size
            if n_windows == 0:
                raise ValueError(f"{data.numel()} tokens cannot fill one block of {block_size} + 1 tokens")
            starts = torch.arange(n_windows) * block_size  # [W]
            for first in range(0, n_windows, batch_size):
                window = starts[first : first + batch_size, None] + torch.arange(block_size + 1)  # [b, T+1]
                chunk = data[window].to(device)  # [b, T+1]
                with autocast(dtype, device.type):
                    _, loss = model(chunk[:, :-1], chunk[:, 1:])
                total += loss.item() * chunk.shape[0]
                count += chunk.shape[0]
        else:
            generator = torch.Generator().manual_seed(seed)
            for _ in range(iters):
                x, y = get_batch(data, block_size, batch_size, generator)  # [B, T] x2
                with autocast(dtype, device.type):
                    _, loss = model(x.to(device), y.to(device))
                total += loss.item()
                count += 1
    finally:
        model.train(was_training)
    return total / count


def matmul_flops_per_token(model: GPT, block_size: int) -> float:
    """Training FLOPs per token (forward + backward), PaLM's estimate as used by nanoGPT.

    ``6 * N + 12 * n_layer * n_embd * T`` with ``N`` = the weights of the transformer's linear
    layers and the LM head (the matmul parameters; embedding lookups cost no FLOPs).
    """
    n_matmul = sum(m.weight.numel() for name, m in model.named_modules()
                   if isinstance(m, nn.Linear) and (name.startswith("blocks.") or name == "lm_head"))
    cfg = model.config
    return 6.0 * n_matmul + 12.0 * cfg.n_layer * cfg.n_embd * block_size


def measure_matmul_peak(dtype: str = "fp32", n: int = 1024, seconds: float = 0.3, min_reps: int = 8) -> float:
    """Best measured FLOP/s of an ``n x n @ n x n`` matmul on the CPU with the current threads.

    The best of at least ``min_reps`` timed matmuls (and at least ``seconds``): on a machine shared
    with other jobs the best one is the least disturbed. Uses no global RNG (a run's random stream is
    untouched).
    """
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    generator = torch.Generator().manual_seed(0)
    a = torch.rand(n, n, generator=generator).to(torch_dtype)
    b = torch.rand(n, n, generator=generator).to(torch_dtype)
    for _ in range(2):
        torch.matmul(a, b)
    best = 0.0
    deadline = time.perf_counter() + seconds
    reps = 0
    while True:
        start = time.perf_counter()
        torch.matmul(a, b)
        elapsed = time.perf_counter() - start
        best = max(best, 2.0 * n**3 / elapsed)
        reps += 1
        if reps >= min_reps and time.perf_counter() > deadline:
            return best


# ------------------------------------------------------------------------------------------ data
@dataclass
class RunData:
    """Tokenizer and the encoded splits of a run."""

    tokenizer: Any
    train: torch.Tensor
    val: torch.Tensor
    info: dict[str, Any]


def prepare_data(cfg: TrainConfig, tokenizer: Any = None) -> RunData:
    """Load the corpus, split it, fit (or reuse) the tokenizer and encode both splits.

    Raises:
        ValueError: bad corpus (missing, empty, binary, non-UTF-8) or a split too short for one block.
    """
    text = load_text(cfg.corpus)
    train_text, val_text = split_text(text, cfg.val_fraction)
    if tokenizer is None:
        # char: the vocabulary of the whole text (nanoGPT); BPE: merges learned on the training split only
        tokenizer = build_tokenizer(cfg.tokenizer, text if cfg.tokenizer == "char" else train_text)
    train_ids, val_ids = encode_corpus(tokenizer, train_text), encode_corpus(tokenizer, val_text)
    block_size = int(cfg.model.get("block_size", GPTConfig.block_size))
    for label, ids in (("training", train_ids), ("validation", val_ids)):
        if ids.numel() <= block_size:
            raise ValueError(
                f"corpus {cfg.corpus!r} is too short for block_size {block_size}: its {label} split has "
                f"{ids.numel()} tokens, needs at least {block_size + 1}; use a longer text, a smaller "
                f"--model.block_size or another --val_fraction"
            )
    import hashlib

    info = {
        "corpus": cfg.corpus,
        "corpus_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "chars": len(text),
        "split": f"first {1 - cfg.val_fraction:.0%} of the characters train, last {cfg.val_fraction:.0%} validate",
        "train_tokens": int(train_ids.numel()),
        "val_tokens": int(val_ids.numel()),
        "vocab_size": int(tokenizer.vocab_size),
    }
    return RunData(tokenizer, train_ids, val_ids, info)


# ------------------------------------------------------------------------------------------ run folder
def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:  # not UTF-8 or not JSON (a damaged or foreign file): name it
        raise ValueError(f"{str(path)!r} is not a readable JSON file: {err}") from None


def resume_identity(config_doc: dict) -> dict:
    """The part of a config that must not change across a resume.

    Both sections are normalised through their dataclasses, so a field added to ``GPTConfig`` or
    ``TrainConfig`` after a run was saved compares equal to its default instead of blocking the resume.
    """
    model = GPTConfig.from_dict(config_doc["model"]).to_dict()
    train_values = {**config_doc["train"], "model": {}}
    train_values.setdefault("name", "run")
    train = {k: v for k, v in TrainConfig.from_dict(train_values).to_dict().items()
             if k not in RESUME_FREE_KEYS and k != "model"}
    return {"model": model, "train": train}


def _rewrite_metrics(path: Path, last_step: int) -> None:
    """Keep only the metric lines of steps ``<= last_step`` (dropping any torn last line), atomically."""
    kept = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and record.get("step", math.inf) <= last_step:
                kept.append(line)
    ckpt.atomic_write_text(path, "".join(line + "\n" for line in kept))


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records of a run's ``metrics.jsonl`` (a torn last line is skipped)."""
    path = Path(run_dir) / "metrics.jsonl"
    records = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                records.append(json.loads(line))
    return records


class _InterruptFlag:
    """SIGINT -> a flag checked between steps (the step in flight completes, then a checkpoint is saved).

    A second Ctrl-C raises ``KeyboardInterrupt`` at once. Only installed in the main thread.
    """

    def __init__(self, notify: Callable[[str], None]) -> None:
        self.requested = False
        self.notify = notify
        self._previous: Any = None

    def _handler(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.notify("Ctrl-C: finishing this step and saving a checkpoint (press Ctrl-C again to abort at once)")

    def __enter__(self) -> _InterruptFlag:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _prepare_run_dir(run_dir: Path, resume: bool, overwrite: bool) -> tuple[bool, Path | None]:
    """Create/validate the run folder.

    Returns:
        ``(resuming, displaced)``: whether an existing run is resumed, and (for ``overwrite``) where
        the old run was moved; it is deleted only once the new run has written its config.
    """
    if resume and overwrite:
        raise ValueError("choose one of resume and overwrite, not both")
    if run_dir.exists() and not run_dir.is_dir():
        raise FileExistsError(f"{str(run_dir)!r} exists and is not a folder")
    if interrupted_start(run_dir):  # a start killed before its config.json (nothing to keep): start again
        shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
        return False, None
    if not run_dir.exists() or not any(run_dir.iterdir()):
        if resume:
            raise FileNotFoundError(f"cannot resume: run folder {str(run_dir)!r} does not exist or is empty")
        run_dir.mkdir(parents=True, exist_ok=True)
        return False, None
    is_run = (run_dir / "config.json").is_file()
    if resume:
        if not is_run:
            raise FileNotFoundError(f"cannot resume: {str(run_dir)!r} has no config.json (not a poslab run)")
        return True, None
    if not overwrite:
        raise FileExistsError(
            f"run folder {str(run_dir)!r} already exists; pass --resume to continue it or --overwrite to replace it"
        )
    if not is_run:
        raise FileExistsError(f"refusing to overwrite {str(run_dir)!r}: it is not a poslab run folder (no config.json)")
    displaced = run_dir.with_name(f".{run_dir.name}.replaced-{os.getpid()}")
    os.replace(run_dir, displaced)
    run_dir.mkdir(parents=True)
    return False, displaced


# ------------------------------------------------------------------------------------------ train
def train(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    callback: Callable[[int, dict], None] | None = None,
    fsdp: bool = False,
) -> dict:
    """Train a GPT as ``cfg`` says, writing the run folder ``cfg.out_dir/cfg.name``.

    Under ``torchrun`` (``RANK``/``WORLD_SIZE`` set) this is data-parallel training on every
    process: DDP (or FSDP2 with ``fsdp``), ``batch_size`` per process, only rank 0 writes; see
    :mod:`poslab.training.distributed` and ``docs/scaling.md``.

    Args:
        cfg: the run's configuration.
        resume: continue the run in the existing folder from its latest checkpoint (the config must
            match the saved one except for :data:`RESUME_FREE_KEYS`); bitwise the same curve on CPU.
        overwrite: delete an existing run folder of the same name first.
        progress: draw the live progress bar on stderr (the final summary prints regardless).
        callback: called as ``callback(step, record)`` after every optimizer step (``record`` is the
            metrics line of a logged step, else ``{"step", "loss", "lr"}``). Raising
            ``KeyboardInterrupt`` in it acts like Ctrl-C.
        fsdp: under torchrun, shard the model with FSDP2 ``fully_shard`` instead of DDP.

    Returns:
        The results dict (also written to ``results.json``).

    Raises:
        FileExistsError: the folder exists and neither ``resume`` nor ``overwrite`` was given;
            :class:`poslab.training.lock.RunLockedError` (a subclass): another live process trains this folder.
        PermissionError / OSError: the run folder is read-only (checked before training), or the
            disk filled up (the last complete checkpoint is kept; ``resume`` continues once there is space).
        CheckpointError: on ``resume``, no checkpoint of the run verifies (a bad newest one is skipped
            with a warning and the previous good one used).
        ValueError: bad config or corpus, a config mismatch on resume (lists the keys).
        TrainingDiverged: NaN/inf loss or gradient norm (names the step and the last good checkpoint).
        KeyboardInterrupt: after Ctrl-C, once the checkpoint of the last completed step is saved.
    """
    wall_start = time.perf_counter()
    run_dir = cfg.run_dir
    dist_ctx = distributed.setup(fsdp=fsdp)  # under torchrun: a gloo/nccl process group; else one plain process
    lock = RunLock(run_dir).acquire()  # another live process on this run folder: RunLockedError
    try:
        # rank 0 prepares the folder; its outcome (or its error) reaches every rank
        resuming, displaced = dist_ctx.run_on_main(_prepare_run_dir, run_dir, resume, overwrite)
    except BaseException:
        lock.release()
        distributed.teardown(dist_ctx)
        raise
    threads_before = torch.get_num_threads()
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    try:
        return _train(cfg, run_dir, resuming, progress, callback, wall_start, displaced, dist_ctx)
    except BaseException:
        if dist_ctx.is_main and not resuming and not (run_dir / "config.json").exists():
            shutil.rmtree(run_dir, ignore_errors=True)  # nothing was written yet: leave no half folder
            if displaced is not None and displaced.exists():
                os.replace(displaced, run_dir)  # the new run never started: give the old one back
        raise
    finally:
        torch.set_num_threads(threads_before)
        lock.release()
        distributed.teardown(dist_ctx)


def _train(
    cfg: TrainConfig, run_dir: Path, resuming: bool, show: bool, callback: Callable[[int, dict], None] | None,
    wall_start: float, displaced: Path | None, dist_ctx: distributed.DistContext,
) -> dict:
    if dist_ctx.is_main:  # only rank 0 writes the run folder (and holds its lock)
        for folder in (run_dir, run_dir / ckpt.CHECKPOINT_DIR):
            if folder.is_dir():
                ensure_writable(folder)  # fail now, not at the first checkpoint
        remove_stale_temp_files(run_dir)  # left by a writer killed mid-write (the run's lock is ours)
    saved_doc = _read_json(run_dir / "config.json") if resuming else None
    tokenizer = None
    if not resuming and cfg.init_from is not None:
        tokenizer = tokenizer_from_dict(_read_json(Path(cfg.init_from) / "tokenizer.json"))  # same ids as the weights
    if resuming and (run_dir / "tokenizer.json").is_file():
        tokenizer = tokenizer_from_dict(_read_json(run_dir / "tokenizer.json"))
    data = prepare_data(cfg, tokenizer)
    model_cfg = GPTConfig.from_dict({**cfg.model, "vocab_size": data.tokenizer.vocab_size})
    train_doc = {k: v for k, v in cfg.to_dict().items() if k != "model"}
    config_doc = {"model": model_cfg.to_dict(), "train": train_doc, "data": data.info}
    config_doc.update(dist_ctx.config_section())  # {"distributed": {world_size, ...}} under torchrun, else nothing

    torch.manual_seed(cfg.seed)
    model = GPT(model_cfg)
    if cfg.init_from is not None and (not resuming or ckpt.latest_step(run_dir) is None):
        _init_from(model, cfg.init_from)  # a resume with a checkpoint overwrites these weights anyway
    limit = model.position.max_positions
    if limit is not None and model_cfg.block_size > limit:
        raise ValueError(
            f"block_size {model_cfg.block_size} is larger than the {model_cfg.position!r} position table "
            f"({limit} positions); lower --model.block_size or raise the table's max_len"
        )
    train_model = dist_ctx.prepare_model(model, cfg.seed)  # DDP wrapper, FSDP shards (in place), or model itself
    eval_model, eval_batch = dist_ctx.eval_model(model, cfg.batch_size)  # global eval batch, sharded over ranks
    optimizer = make_optimizer(model, cfg)
    data_rng = torch.Generator().manual_seed(data_seed(cfg.seed))
    metrics_path = run_dir / "metrics.jsonl"
    step, log_loss_sum, log_loss_count, best = 0, 0.0, 0, {"val_loss": None, "step": None}
    tokens_seen = 0
    skipped: list[int] = []  # steps whose batch was dropped as non-finite (skip_nonfinite)
    target: dict[str, Any] = {}  # stop_val_loss reached: where

    if resuming:
        mismatch = ckpt.config_mismatch(resume_identity(saved_doc), resume_identity(config_doc), saved_label="saved run")
        if saved_doc.get("data", {}).get("corpus_sha256") != data.info["corpus_sha256"]:
            mismatch.append(f"data.corpus_sha256: the corpus text changed since the run started ({cfg.corpus!r})")
        if mismatch:
            raise ValueError(f"cannot resume {str(run_dir)!r}: the config differs from the saved one: " + "; ".join(mismatch))
        found = _newest_good_checkpoint(run_dir, saved_doc)
        if found is not None:
            tensors, meta = found
            dist_ctx.check_resume(meta, run_dir)  # the same number of processes as the checkpoint's
            dist_ctx.restore(model, optimizer, tensors, meta)  # ckpt.restore_model/_optimizer (FSDP: re-sharded)
            dist_ctx.restore_rng(tensors)  # this rank's torch.set_rng_state
            data_rng.set_state(tensors["rng.data"])
            step = meta["step"]
            log_loss_sum, log_loss_count = meta["log_loss_sum"], meta["log_loss_count"]
            best = meta["best"]
            tokens_seen = meta["tokens_seen"]
            skipped = list(meta.get("skipped_nonfinite", []))
        if dist_ctx.is_main:
            _rewrite_metrics(metrics_path, step)
    elif dist_ctx.is_main:
        ckpt.atomic_write_json(run_dir / "tokenizer.json", data.tokenizer.to_dict())
        ckpt.atomic_write_text(metrics_path, "")
    if dist_ctx.is_main:
        ckpt.atomic_write_json(run_dir / "config.json", config_doc)
    if displaced is not None and dist_ctx.is_main:
        shutil.rmtree(displaced, ignore_errors=True)  # --overwrite: the new run is under way
    start_step = step

    peak = dist_ctx.run_on_main(_matmul_peak, run_dir, cfg.dtype)  # per process; measured and cached by rank 0
    flops_per_token = matmul_flops_per_token(model, model_cfg.block_size)
    tokens_per_step = cfg.batch_size * cfg.grad_accum * model_cfg.block_size * dist_ctx.world_size  # all processes
    bar = ProgressBar(cfg.max_steps, start_step=step, enabled=show and dist_ctx.is_main, stream=dist_ctx.bar_stream())
    if show and dist_ctx.is_main:
        n_params = sum(p.numel() for p in model.parameters())
        bar.message(
            f"{'resuming' if resuming else 'training'} {run_dir}{f' from step {step}' if resuming else ''}: "
            f"{n_params / 1e6:.2f}M parameters, {model_cfg.position} positions, corpus {cfg.corpus} "
            f"({data.info['train_tokens']:,} train / {data.info['val_tokens']:,} val tokens, vocab "
            f"{data.tokenizer.vocab_size}), {cfg.max_steps} steps x {tokens_per_step:,} tokens, {cfg.dtype}, "
            f"{torch.get_num_threads()} threads"
        )

    def save(at_step: int) -> Path | None:
        # every rank takes part (FSDP gathers full tensors; each rank's RNG state); only rank 0 writes
        model_t, aliases, optim_t, optim_meta = dist_ctx.checkpoint_state(model, optimizer)
        rank_rng = dist_ctx.rng_states()  # {} in a single process
        if not dist_ctx.is_main:
            return None
        tensors = {**model_t, **optim_t, "rng.torch": torch.get_rng_state(), "rng.data": data_rng.get_state(), **rank_rng}
        meta = {
            "config": resume_identity(config_doc),
            "config_hash": ckpt.config_hash(resume_identity(config_doc)),
            "data_position": (at_step + len(skipped)) * cfg.grad_accum,  # micro-batches drawn; the generator state is rng.data
            "tokens_seen": tokens_seen,
            "model_aliases": aliases,
            "optimizer": optim_meta,
            "log_loss_sum": log_loss_sum,
            "log_loss_count": log_loss_count,
            "best": best,
            "torch_version": torch.__version__,
            **dist_ctx.checkpoint_meta(),  # world_size under torchrun
            "skipped_nonfinite": skipped,
        }
        return ckpt.save_checkpoint(run_dir, at_step, tensors, meta, keep=cfg.keep_checkpoints)

    params = [p for p in model.parameters() if p.requires_grad]
    train_time = 0.0
    interval_tokens, interval_time = 0, 0.0
    session_tokens = 0
    tokens_per_s_log: list[float] = []
    model.train()
    metrics_target = metrics_path if dist_ctx.is_main else os.devnull  # only rank 0 writes metrics
    with open(metrics_target, "ab", buffering=0) as metrics, _InterruptFlag(bar.message) as interrupt:
        while step < cfg.max_steps:
            step_start = time.perf_counter()
            lr = lr_at(step, cfg)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_sum = 0.0
            for micro in range(cfg.grad_accum):
                # the global batch (world_size x batch_size windows), then this rank's rows on its device
                x, y = get_batch(data.train, model_cfg.block_size, cfg.batch_size * dist_ctx.world_size, data_rng)  # [W*B, T] x2
                x, y = dist_ctx.shard(x, y, cfg.batch_size)  # [B, T] x2
                dist_ctx.set_grad_sync(train_model, micro == cfg.grad_accum - 1)  # all-reduce once per step
                with autocast(cfg.dtype, dist_ctx.device.type):
                    _, loss = train_model(x, y)
                (loss / cfg.grad_accum).backward()
                loss_sum += loss.item()
            step_loss = dist_ctx.mean(loss_sum / cfg.grad_accum)  # the global batch's loss, the same on every rank
            if cfg.grad_clip > 0:
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip))
            else:
                grad_norm = float(torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None]))
            if not (math.isfinite(step_loss) and math.isfinite(grad_norm)):
                if len(skipped) >= cfg.skip_nonfinite:
                    _diverged(cfg, run_dir, bar, step + 1, step_loss, grad_norm, wall_start, skipped)
                # skip_nonfinite: drop this batch without an update and draw the next one for the same step
                optimizer.zero_grad(set_to_none=True)
                skipped.append(step + 1)
                bar.message(f"skipped a non-finite batch at step {step + 1} (loss={step_loss}, grad_norm={grad_norm}); "
                            f"{len(skipped)} of {cfg.skip_nonfinite} allowed skips used")
                continue
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            elapsed = time.perf_counter() - step_start
            train_time += elapsed
            interval_time += elapsed
            interval_tokens += tokens_per_step
            session_tokens += tokens_per_step
            tokens_seen += tokens_per_step
            log_loss_sum += step_loss
            log_loss_count += 1

            evaluate = step % cfg.eval_interval == 0 or step == cfg.max_steps
            logged = evaluate or step % cfg.log_interval == 0 or step == cfg.max_steps
            record: dict[str, Any] = {"step": step, "loss": step_loss, "lr": lr}
            if logged:
                rate = interval_tokens / interval_time if interval_time > 0 else 0.0
                tokens_per_s_log.append(rate)
                record = {
                    "step": step,
                    "loss": log_loss_sum / log_loss_count,
                    "lr": lr,
                    "tokens_per_s": rate,
                    "grad_norm": grad_norm,
                    "time_s": time.perf_counter() - wall_start,
                }
                log_loss_sum, log_loss_count = 0.0, 0
                interval_tokens, interval_time = 0, 0.0
                if evaluate:
                    val = evaluate_loss(eval_model, data.val, model_cfg.block_size, eval_batch, cfg.eval_iters or None,
                                        seed=cfg.seed + 1, dtype=cfg.dtype)
                    record["val_loss"] = val
                    if best["val_loss"] is None or val < best["val_loss"]:
                        best = {"val_loss": val, "step": step}
                    if cfg.stop_val_loss is not None and val <= cfg.stop_val_loss:  # time to quality: stop here
                        target = {"step": step, "tokens": tokens_seen, "train_time_s": train_time, "val_loss": val}
                if skipped:
                    record["skipped_nonfinite"] = len(skipped)
                _append_line(metrics, json.dumps(record))
                bar.update(step, loss=record["loss"], val_loss=record.get("val_loss"), tokens_per_s=rate, force=evaluate)
            else:
                bar.update(step, loss=step_loss)
            if step == cfg.max_steps or (cfg.ckpt_interval and step % cfg.ckpt_interval == 0) or target:
                save(step)
            if callback is not None:
                try:
                    callback(step, record)
                except KeyboardInterrupt:
                    interrupt.requested = True
            if dist_ctx.any(interrupt.requested):  # Ctrl-C on any rank stops every rank after the same step
                if step != cfg.max_steps and not (cfg.ckpt_interval and step % cfg.ckpt_interval == 0):
                    save(step)
                bar.close(f"interrupted at step {step}; checkpoint saved in {run_dir / ckpt.CHECKPOINT_DIR}; "
                          f"continue with: {'torchrun (the same options) -m ' if dist_ctx.world_size > 1 else ''}"
                          f"poslab train --name {cfg.name} --out_dir {cfg.out_dir} --resume")
                raise KeyboardInterrupt
            if target:
                break

    final_val = evaluate_loss(eval_model, data.val, model_cfg.block_size, eval_batch, cfg.eval_iters or None,
                              seed=cfg.seed + 1, dtype=cfg.dtype)
    final_train = evaluate_loss(eval_model, data.train, model_cfg.block_size, eval_batch, cfg.eval_iters or 20,
                                seed=cfg.seed + 2, dtype=cfg.dtype)
    tokens_per_s = session_tokens / train_time if train_time > 0 else None
    results = {
        "name": cfg.name,
        "status": "target reached" if target else "completed",
        "steps": step,
        "final_train_loss": final_train,
        "final_val_loss": final_val,
        "best_val_loss": best["val_loss"],
        "best_val_step": best["step"],
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_median": _median(tokens_per_s_log),
        "flops_per_token": flops_per_token,
        "peak_flops": peak,
        "mfu": (tokens_per_s * flops_per_token / (peak * dist_ctx.world_size)) if tokens_per_s else None,
        "dtype": cfg.dtype,
        "threads": torch.get_num_threads(),
        "train_time_s": train_time,
        "wall_time_s": time.perf_counter() - wall_start,
        "tokens_seen": tokens_seen,
        "n_params": sum(p.numel() for p in model.parameters()),
        "train_tokens": data.info["train_tokens"],
        "val_tokens": data.info["val_tokens"],
        "vocab_size": data.info["vocab_size"],
        "resumed_from": start_step if resuming else None,
        **dist_ctx.results_section(tokens_per_s),  # world_size, backend, fsdp, tokens/s per process
        "skipped_nonfinite": skipped,
    }
    if cfg.stop_val_loss is not None:  # time to quality (train_time_s counts optimizer steps only, no evaluation)
        results["target"] = {"stop_val_loss": cfg.stop_val_loss, "reached": bool(target), **target}
    if dist_ctx.is_main:
        ckpt.atomic_write_json(run_dir / "results.json", results)
    summary = (
        f"done: {step} steps | train {final_train:.4f} | val {final_val:.4f} | "
        f"{format_rate(tokens_per_s or 0)} tok/s | MFU {100 * (results['mfu'] or 0):.1f}% of the measured "
        f"{cfg.dtype} matmul peak {peak / 1e9:.0f} GFLOP/s | {format_duration(results['wall_time_s'])} | {run_dir}"
    )
    bar.close(summary)
    return results


def _init_from(model: GPT, source: str) -> None:
    """Copy the model weights of run ``source``'s latest checkpoint into ``model`` (``TrainConfig.init_from``)."""
    if not (Path(source) / "config.json").is_file():
        raise FileNotFoundError(f"init_from {source!r} is not a poslab run folder (no config.json)")
    tensors, meta = ckpt.load_checkpoint(source)
    try:
        ckpt.restore_model(model, tensors, meta.get("model_aliases", {}))
    except ckpt.CheckpointError as err:
        raise ckpt.CheckpointError(f"init_from {source!r}: {err}") from None


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def _matmul_peak(run_dir: Path, dtype: str) -> float:
    """The run's cached matmul peak (``peak.json``), measured on first use for this dtype/threads."""
    path = run_dir / "peak.json"
    threads = torch.get_num_threads()
    cached = _read_json(path) if path.is_file() else {}
    key = f"{dtype}/{threads}"
    if key not in cached:
        if key not in _PEAK_CACHE:  # measured once per process, then cached in each run
            _PEAK_CACHE[key] = measure_matmul_peak(dtype)
        cached[key] = _PEAK_CACHE[key]
        ckpt.atomic_write_json(path, cached)
    return float(cached[key])


_PEAK_CACHE: dict[str, float] = {}


def _diverged(cfg: TrainConfig, run_dir: Path, bar: ProgressBar, step: int, loss: float, grad_norm: float,
              wall_start: float, skipped: list[int] | None = None) -> None:
    last = ckpt.latest_step(run_dir)
    where = (f"the last good checkpoint is step {last} ({run_dir / ckpt.CHECKPOINT_DIR / ckpt.checkpoint_name(last)})"
             if last is not None else "no checkpoint was written before it")
    message = (f"training diverged at step {step}: loss={loss}, grad_norm={grad_norm}; the update was not applied; "
               f"{where}")
    if skipped:
        message += f"; {len(skipped)} non-finite batches were skipped before (skip_nonfinite={cfg.skip_nonfinite})"
    if distributed.is_main_process():  # under torchrun every rank gets here (same global loss); rank 0 writes
        ckpt.atomic_write_json(run_dir / "results.json", {
            "name": cfg.name, "status": "diverged", "diverged_at_step": step, "loss": repr(loss),
            "grad_norm": repr(grad_norm), "last_good_checkpoint": last, "wall_time_s": time.perf_counter() - wall_start,
            "skipped_nonfinite": list(skipped or []),
        })
    bar.close(message)
    raise TrainingDiverged(message)


def _append_line(handle: Any, line: str) -> None:
    """Append ``line`` + newline to an unbuffered binary file; a failed write (e.g. disk full) is cut
    back off the file before the error propagates, so no torn line is left."""
    data = (line + "\n").encode("utf-8")
    start = os.fstat(handle.fileno()).st_size
    try:
        written = handle.write(data)
        if written != len(data):
            raise OSError(errno.ENOSPC, f"short write ({written} of {len(data)} bytes)", handle.name)
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(handle.fileno(), start)
        raise


def _newest_good_checkpoint(run_dir: Path, run_doc: dict) -> tuple[dict, dict] | None:
    """``(tensors, meta)`` of the newest checkpoint that verifies, trying ``latest`` first.

    A checkpoint that fails (corrupt, truncated, another config) is skipped with a warning on
    stderr naming it and why, and the previous one is tried; ``None`` when the run has none.

    Raises:
        CheckpointError: checkpoints exist but none verifies (each one's problem listed).
    """
    latest = ckpt.latest_step(run_dir)
    if latest is None:
        return None
    problems = []
    for step in [latest] + [s for s in reversed(ckpt.list_checkpoints(run_dir)) if s < latest]:
        try:
            tensors, meta = ckpt.load_checkpoint(run_dir, step)
            _check_checkpoint_config(meta, run_doc, run_dir, step)
        except ckpt.CheckpointError as err:
            problems.append(str(err))
            continue
        if problems:
            print(f"poslab: warning: {'; '.join(problems)}; resuming from the previous good checkpoint, step {step}",
                  file=sys.stderr)
        return tensors, meta
    raise ckpt.CheckpointError(f"no usable checkpoint in {str(run_dir)!r}: " + "; ".join(problems)
                               + "; start again with --overwrite")


def _previous_good(run_dir: Path, run_doc: dict, below: int | None) -> str:
    """A hint naming the newest checkpoint before step ``below`` that verifies (for error messages)."""
    candidates = [s for s in reversed(ckpt.list_checkpoints(run_dir)) if below is None or s < below]
    if not candidates:
        return ""
    for step in candidates:
        try:
            _check_checkpoint_config(ckpt.load_checkpoint(run_dir, step)[1], run_doc, run_dir, step)
        except ckpt.CheckpointError:
            continue
        return (f"; the previous good checkpoint is step {step}: load_run(run, step={step}), "
                f"`poslab sample RUN --step {step}`; `poslab train --resume` falls back to it")
    return "; no earlier checkpoint verifies"


def _check_checkpoint_config(meta: dict, run_doc: dict, run_dir: Path, step: int) -> None:
    """Raise ``CheckpointError`` listing the keys where the checkpoint's config differs from the run's."""
    saved = meta.get("config")
    if saved is None:
        raise ckpt.CheckpointError(f"checkpoint step {step} of {str(run_dir)!r} records no config")
    try:
        saved = resume_identity(saved)
    except (TypeError, ValueError) as err:
        raise ckpt.CheckpointError(f"checkpoint step {step} of {str(run_dir)!r} records an unreadable config: {err}") from None
    if ckpt.config_hash(saved) != ckpt.config_hash(resume_identity(run_doc)):
        mismatch = ckpt.config_mismatch(saved, resume_identity(run_doc))
        raise ckpt.CheckpointError(
            f"checkpoint step {step} in {str(run_dir)!r} was written by a different config: " + "; ".join(mismatch)
        )


# ------------------------------------------------------------------------------------------ load
def load_run(run_dir: str | Path, step: int | None = None) -> tuple[GPT, Any, dict]:
    """Load a trained model from a run folder.

    Args:
        run_dir: the run folder (``OUT_DIR/NAME``).
        step: checkpoint step (default: the ``latest`` pointer).

    Returns:
        ``(model, tokenizer, config)``: the :class:`GPT` in eval mode on CPU, its tokenizer, and the
        run's ``config.json`` (``{"model": ..., "train": ..., "data": ...}``).

    Raises:
        FileNotFoundError: not a run folder.
        CheckpointError (a ``ValueError``): no/corrupt checkpoint, or one written by a different
            config (the message lists the mismatched keys).
    """
    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        raise FileNotFoundError(f"{str(run_dir)!r} is not a poslab run folder (no config.json)")
    config = _read_json(run_dir / "config.json")
    tokenizer = tokenizer_from_dict(_read_json(run_dir / "tokenizer.json"))
    with torch.random.fork_rng(devices=[]):  # building the model must not move the caller's RNG
        model = GPT(GPTConfig.from_dict(config["model"]))
    try:
        tensors, meta = ckpt.load_checkpoint(run_dir, step)
        _check_checkpoint_config(meta, config, run_dir, meta["step"])
    except ckpt.CheckpointError as err:
        below = step if step is not None else ckpt.latest_step(run_dir)
        raise ckpt.CheckpointError(f"{err}{_previous_good(run_dir, config, below)}") from None
    ckpt.restore_model(model, tensors, meta.get("model_aliases", {}))
    model.eval()
    return model, tokenizer, config


__all__ = [
    "DTYPES",
    "OPTIMIZERS",
    "ChainedOptimizer",
    "RESUME_FREE_KEYS",
    "TrainConfig",
    "TrainingDiverged",
    "evaluate_loss",
    "load_run",
    "lr_at",
    "make_muon",
    "make_optimizer",
    "matmul_flops_per_token",
    "measure_matmul_peak",
    "prepare_data",
    "read_metrics",
    "train",
]
