"""The training experiments' sizes: one named table (:data:`SIZES`) a user extends from the command line.

``smoke`` (tests), ``quick`` (the demo) and ``full`` are the extrapolation family's scales, used by
every experiment that takes ``size`` (extrapolation, attention_entropy, bidirectional,
context_extension) and, for ``quick``, by head_count and position_training. ``poslab experiment X
--size NAME`` picks one; ``--size NAME=BASE,field=value,...`` adds ``NAME`` to the table as ``BASE``
with those fields changed (:func:`define_size`) and picks it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

#: the length factors the extrapolation evaluates (``k * L``); :attr:`Size.n_targets` sizes its evaluation by the largest
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

    @property
    def n_targets(self) -> int:
        return self.eval_windows * max(EXTRAPOLATION_FACTORS) * self.train_length


SIZES = {
    "smoke": Size("smoke", 16, 1, 2, 16, 8, 4, 3e-3, 2, 2, 4, 1),
    "quick": Size("quick", 64, 2, 4, 64, 250, 16, 3e-3, 25, 4, 100, 2),
    "full": Size("full", 128, 3, 4, 96, 400, 16, 2e-3, 40, 4, 100, 2),
}


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
        ValueError: an unknown size or base, a field :class:`Size` does not have, a value of the wrong type,
            or a name already in the table with other values.
    """
    name, _, rest = str(spec).partition("=")
    name = name.strip()
    if not rest:
        return size_of(False, name)
    base_name, *pairs = [part.strip() for part in rest.split(",")]
    if base_name not in SIZES:
        raise ValueError(f"--size {spec!r}: unknown base size {base_name!r}; choose one of {', '.join(SIZES)}")
    base = SIZES[base_name]
    fields = {f.name: f.type for f in dataclasses.fields(Size) if f.name not in ("name", "schemes")}
    changes: dict[str, int | float] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or key not in fields:
            raise ValueError(f"--size {spec!r}: {pair!r} must be FIELD=VALUE with FIELD one of {', '.join(fields)}")
        kind = float if isinstance(getattr(base, key), float) else int
        try:
            value = kind(text)
        except ValueError:
            raise ValueError(f"--size {spec!r}: {key} must be {'a number' if kind is float else 'an integer'}, "
                             f"got {text!r}") from None
        if value <= 0:
            raise ValueError(f"--size {spec!r}: {key} must be > 0, got {text!r}")
        changes[key] = value
    size = dataclasses.replace(base, name=name, **changes)
    if not name or any(c in name for c in "/\\ ") or name.startswith("."):
        raise ValueError(f"--size {spec!r}: the name {name!r} must be a plain folder name (it names the models' subfolder)")
    if name in SIZES and SIZES[name] != size:
        raise ValueError(f"--size {spec!r}: {name!r} is already the size {SIZES[name]}")
    SIZES[name] = size
    return size


__all__ = ["EXTRAPOLATION_FACTORS", "SIZES", "Size", "define_size", "size_of"]
