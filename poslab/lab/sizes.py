"""The training experiments' sizes: one named table (:data:`SIZES`) a user extends from the command line.

``smoke`` (tests), ``quick`` (the demo) and ``full`` are the extrapolation family's scales, used by
every experiment that takes ``size`` (extrapolation, attention_entropy, context_extension) and, for
``quick``, by head_count, position_training and bidirectional. ``poslab experiment X --size NAME``
(and ``poslab lab --size NAME``) picks one; ``--size NAME=BASE,field=value,...`` adds ``NAME`` to the
table as ``BASE`` with those fields changed (:func:`define_size`) and picks it.

The GPU sizes train on CUDA (``device="cuda"``: an error without a GPU):

* ``gpu``: nanoGPT's Shakespeare-character GPU recipe, 6 layers, 6 heads, width 384 at ``L = 256``,
  5,000 steps of 64 windows, lr 1e-3 with 100 warmup steps (no dropout, as every lab size). Expected,
  **estimated from FLOPs, not measured** (no GPU here): 70.9 MFLOP per token (nanoGPT's
  ``6 N + 12 n_layer d L``, :func:`poslab.training.mfu.matmul_flops_per_token`) x 81.9M training
  tokens = 5.8 PFLOP a training, 3-6 minutes on one H100-class GPU at an assumed 25-50% of its
  67 TFLOP/s fp32 peak (the lab's configs train in fp32), plus the first step's compilation of the
  attention kernels; about 2-4 hours for extrapolation's 39 trainings (13 schemes x 3 seeds) on one GPU.
  The other sized experiments reuse those models and add their own trainings (context extension's
  fine-tunes at ``4 L``), not counted here.
* ``gpu-large``: GPT-2 small's geometry, 12 layers, 12 heads, width 768, at ``L = 256``, 5,000 steps
  of 64 windows, lr 6e-4 with 200 warmup steps. Estimated the same way: 538 MFLOP per token x 81.9M
  tokens = 44 PFLOP a training, 22-44 minutes on one H100-class GPU in fp32; about 14-29 hours for
  extrapolation's 39 trainings on one GPU (Ray or shards spread them over GPUs).

Their evaluations run on the CPU after training (the experiments load every model there), at up to
``16 L = 4096`` tokens: at these widths that takes minutes a model on a few cores, not counted above.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

#: the length factors the extrapolation evaluates (``k * L``); :attr:`Size.n_targets` sizes its evaluation by
#: the largest
EXTRAPOLATION_FACTORS = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class Size:
    """One scale of the lab (``smoke`` for tests, ``quick`` for the demo, ``full``).

    Attributes:
        name: label (also the models' subfolder).
        train_length: ``L``, the training block size.
        n_layer, n_head, n_embd: model geometry.
        steps, batch_size, lr, warmup_steps: training.
        eval_windows: the evaluation scores ``eval_windows * 16 * L`` validation targets at every length.
        finetune_steps: context-extension fine-tuning steps at ``4 L``.
        entropy_batch: sequences per length in the attention-entropy measurement.
        schemes: the position schemes trained at this size (``None``: every scheme the experiment trains).
            The quick size trains the arms of the lessons' main claims only, each long enough to meet
            the claims' premises, instead of every scheme at bigram level.
        device: where its trainings run (``TrainConfig.device``: ``auto``, ``cpu`` or ``cuda``).
    """

    name: str
    train_length: int
    n_layer: int
    n_head: int
    n_embd: int
    steps: int
    batch_size: int
    lr: float
    warmup_steps: int
    eval_windows: int
    finetune_steps: int
    entropy_batch: int
    schemes: tuple[str, ...] | None = None
    device: str = "auto"

    @property
    def n_targets(self) -> int:
        return self.eval_windows * max(EXTRAPOLATION_FACTORS) * self.train_length


SIZES = {
    "smoke": Size("smoke", 16, 1, 2, 16, 8, 4, 3e-3, 2, 2, 4, 1),
    # the demo: 4 layers and 3000 steps, the least measured to make NoPE use its context (one seed, 2000 steps:
    # context gain 0.08-0.11 nats, the premise asks 0.1 at every seed; 2 layers or 1500 steps: below 0.05;
    # benchmarks/lm_recipe_search.py), for the five arms of the lessons' main claims
    "quick": Size(
        "quick",
        64,
        4,
        4,
        64,
        3000,
        16,
        3e-3,
        200,
        4,
        100,
        2,
        schemes=("none", "learned", "sinusoidal", "rope", "alibi"),
    ),
    "full": Size("full", 128, 4, 4, 64, 3000, 16, 3e-3, 200, 4, 100, 2),
    # nanoGPT's shakespeare_char GPU recipe (expected times in the module docstring: estimates, not measured)
    "gpu": Size("gpu", 256, 6, 6, 384, 5000, 64, 1e-3, 100, 4, 500, 4, device="cuda"),
    "gpu-large": Size("gpu-large", 256, 12, 12, 768, 5000, 64, 6e-4, 200, 4, 500, 4, device="cuda"),
}


#: the largest value of each integer field a size may set: far past any machine this lab runs on, so that a
#: typo (``n_layer=2**63``) is refused at once instead of when a training allocates it
MAX_FIELD = {
    "train_length": 65_536,
    "n_layer": 1_024,
    "n_head": 1_024,
    "n_embd": 65_536,
    "steps": 10_000_000,
    "batch_size": 65_536,
    "warmup_steps": 10_000_000,
    "eval_windows": 100_000,
    "finetune_steps": 10_000_000,
    "entropy_batch": 65_536,
}
#: the learning rates a size may set, ``(0, MAX_LR]`` (the lab's sizes use 6e-4 to 3e-3)
MAX_LR = 10.0
#: a size's name: it names the models' subfolder and is printed, so plain ASCII of bounded length
NAME_RE = re.compile(r"[A-Za-z0-9_+][A-Za-z0-9._+-]{0,63}", re.ASCII)
NAME_RULE = "a plain folder name: 1 to 64 of A-Z a-z 0-9 . _ + -, not starting with . or -"


def _value(spec: str, key: str, text: str, base: Size) -> int | float:
    """The value of ``key=text`` of a ``--size`` spec within its bound; else ``ValueError`` naming value and rule."""
    text = text.strip()
    if isinstance(getattr(base, key), float):
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"--size {spec!r}: {key} must be a number, got {text!r}") from None
        if not (text.isascii() and math.isfinite(value) and 0 < value <= MAX_LR):
            raise ValueError(f"--size {spec!r}: {key} must be a finite number in (0, {MAX_LR:g}], got {text!r}")
        return value
    if not re.fullmatch(r"\+?[0-9]+", text, re.ASCII) or not 0 < int(text) <= MAX_FIELD[key]:
        raise ValueError(f"--size {spec!r}: {key} must be an integer from 1 to {MAX_FIELD[key]:,}, got {text!r}")
    return int(text)


def _check_geometry(spec: str, size: Size) -> None:
    """The model a size builds must exist: ``n_head`` divides ``n_embd`` into an even head width (RoPE rotates
    pairs of dimensions, and every lab size trains RoPE arms)."""
    if size.n_embd % size.n_head:
        raise ValueError(
            f"--size {spec!r}: n_head={size.n_head} must divide n_embd={size.n_embd} (each head gets n_embd / n_head)"
        )
    if (size.n_embd // size.n_head) % 2:
        raise ValueError(
            f"--size {spec!r}: the head width n_embd / n_head = {size.n_embd // size.n_head} must be even "
            f"(RoPE rotates pairs of dimensions)"
        )


def size_of(quick: bool, size: str | None = None) -> Size:
    """The :class:`Size` named ``size``, else ``quick`` or ``full``."""
    name = size or ("quick" if quick else "full")
    if name not in SIZES:
        raise ValueError(f"unknown size {name!r}; choose one of {', '.join(SIZES)}")
    return SIZES[name]


def define_size(spec: str) -> Size:
    """Add a size to :data:`SIZES` from ``"NAME=BASE,field=value,..."`` (or return the size ``"NAME"``).

    Example: ``"deep=quick,n_layer=4,steps=600"`` is ``quick`` with 4 layers and 600 steps.

    Raises:
        ValueError: an unknown size or base, a field :class:`Size` does not have, a value of the wrong type or
            out of its bound (:data:`MAX_FIELD`, :data:`MAX_LR`), a geometry no model has (``n_head`` not dividing
            ``n_embd``, an odd head width), a name that is no plain folder name (:data:`NAME_RE`), or a name
            already in the table with other values.
    """
    name, _, rest = str(spec).partition("=")
    name = name.strip()
    if not rest:
        return size_of(False, name if len(name) <= 80 else name[:77] + "...")
    spec = spec if len(spec) <= 120 else spec[:117] + "..."  # shown in the messages: one readable line
    base_name, *pairs = [part.strip() for part in rest.split(",")]
    if base_name not in SIZES:
        raise ValueError(f"--size {spec!r}: unknown base size {base_name!r}; choose one of {', '.join(SIZES)}")
    base = SIZES[base_name]
    fields = {f.name: f.type for f in dataclasses.fields(Size) if f.name not in ("name", "schemes")}
    changes: dict[str, int | float | str] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or key not in fields:
            raise ValueError(f"--size {spec!r}: {pair!r} must be FIELD=VALUE with FIELD one of {', '.join(fields)}")
        if key == "device":
            from poslab.training.config import DEVICES

            if text.strip() not in DEVICES:
                raise ValueError(f"--size {spec!r}: device must be one of {', '.join(DEVICES)}, got {text!r}")
            changes[key] = text.strip()
            continue
        changes[key] = _value(spec, key, text, base)
    if not NAME_RE.fullmatch(name):
        raise ValueError(
            f"--size {spec!r}: the name {name[:60]!r} must be {NAME_RULE} (it names the models' subfolder)"
        )
    size = dataclasses.replace(base, name=name, **changes)
    _check_geometry(spec, size)
    if name in SIZES and SIZES[name] != size:
        raise ValueError(f"--size {spec!r}: {name!r} is already the size {SIZES[name]}")
    SIZES[name] = size
    return size


__all__ = ["EXTRAPOLATION_FACTORS", "SIZES", "Size", "define_size", "size_of"]
