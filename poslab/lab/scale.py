"""The lab's scales: :class:`Scale`, the named tables of them (:class:`ScaleTable`), and the lab models' recipe.

:data:`SIZES` holds the training experiments' sizes: ``smoke`` (tests), ``quick`` (the demo), ``full`` and the GPU
sizes; ``--size NAME=BASE,field=value,...`` defines another (:func:`define_size`, the table unchanged). The GPU
sizes train on CUDA (``device="cuda"``); their costs are **estimated from FLOPs, not measured** (nanoGPT's
``6 N + 12 n_layer d L``, :func:`poslab.training.mfu.matmul_flops_per_token`, at an assumed 25-50% of an
H100-class GPU's 67 TFLOP/s fp32 peak):

* ``gpu``: nanoGPT's Shakespeare-character GPU recipe (6 layers, 6 heads, width 384, ``L = 256``, 5,000 steps of
  64 windows, lr 1e-3): 70.9 MFLOP per token x 81.9M tokens = 5.8 PFLOP, 3-6 minutes a training, 2-4 hours for
  extrapolation's 39 trainings on one GPU.
* ``gpu-large``: GPT-2 small's geometry (12 layers, 12 heads, width 768) at ``L = 256``, lr 6e-4: 538 MFLOP per
  token, 44 PFLOP, 22-44 minutes a training, 14-29 hours for extrapolation's 39.

Their evaluations run on the CPU after training, at up to ``16 L = 4096`` tokens (not counted above).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import torch

#: the length factors the extrapolation evaluates (``k * L``); :attr:`Scale.n_targets` sizes its evaluation by
#: the largest
EXTRAPOLATION_FACTORS = (1, 2, 4, 8, 16)
#: the seeds of every seeded arm of every experiment (the verdict rule needs at least 3)
SEEDS = (1337, 1338, 1339)
#: the first seed (a lab model of this seed keeps the scheme's bare name)
SEED = SEEDS[0]
#: the lab models' corpus (tinyshakespeare, character level)
CORPUS = "shakespeare"


@dataclass(frozen=True, kw_only=True)
class Scale:
    """One scale of the lab's models (``smoke`` for tests, ``quick`` for the demo, ``full``, ...), built by keywords.

    Attributes:
        name: label (also the models' subfolder).
        train_length: ``L``, the training block size.
        n_layer, n_head, n_embd: model geometry.
        steps, batch_size, lr, warmup_steps: training.
        cooldown_steps: 0 for nanoGPT's cosine; else warmup-stable-decay (:func:`poslab.training.optim.lr_at`)
            over the last ``cooldown_steps`` steps (a fine-tune, of other steps, keeps the cosine).
        eval_windows: how much each evaluation reads (the extrapolation scores ``eval_windows * 16 * L`` targets at
            every length; the streaming experiments read that many streams or windows).
        finetune_steps, entropy_batch: context extension's steps at ``4 L``; attention entropy's sequences a length.
        eval_interval, eval_iters: steps between validation points (``None``: five a training), batches per point.
        schemes: the position schemes trained at this scale (``None``: every scheme the experiment trains).
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
    cooldown_steps: int = 0
    eval_windows: int = 4
    finetune_steps: int = 100
    entropy_batch: int = 2
    eval_interval: int | None = None
    eval_iters: int = 4
    schemes: tuple[str, ...] | None = None
    device: str = "auto"

    @property
    def n_targets(self) -> int:
        return self.eval_windows * max(EXTRAPOLATION_FACTORS) * self.train_length


class Named(Protocol):
    @property
    def name(self) -> str: ...


T = TypeVar("T", bound=Named)


class ScaleTable(Mapping[str, T], Generic[T]):
    """A read-only table of scales (or of any frozen value with a ``name``), keyed by name, in order.

    A table is never changed: :meth:`with_scale` returns a new table that also holds a scale, so a user's
    scale reaches the experiments it is given to and no other.
    """

    def __init__(self, *scales: T, what: str = "size") -> None:
        self._scales = {scale.name: scale for scale in scales}
        if len(self._scales) != len(scales):
            raise ValueError(f"two {what}s share a name: {[s.name for s in scales]}")
        self.what = what

    def __getitem__(self, name: str) -> T:
        return self._scales[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._scales)

    def __len__(self) -> int:
        return len(self._scales)

    def __repr__(self) -> str:
        return f"ScaleTable({', '.join(self._scales)})"

    def pick(self, name: str) -> T:
        """The scale named ``name`` (``ValueError`` naming it and the table's names)."""
        if name not in self._scales:
            raise ValueError(f"unknown {self.what} {name!r}; choose one of {', '.join(self._scales)}")
        return self._scales[name]

    def with_scale(self, scale: T) -> ScaleTable[T]:
        """A new table holding this one's scales and ``scale`` (``ValueError`` if its name has other values)."""
        if scale.name in self._scales and self._scales[scale.name] != scale:
            raise ValueError(f"{scale.name!r} is already the {self.what} {self._scales[scale.name]}")
        return ScaleTable(*{**self._scales, scale.name: scale}.values(), what=self.what)


# the demo: 4 layers, 1500 steps of warmup-stable-decay at lr 6e-3 (lr held after 100 warmup steps, linear to
# lr/10 over the last 300): NoPE, the arm that binds, uses its context at every seed (gain 0.114-0.144 nats over
# 6 seeds, the premise asks 0.1) for 0.47x the CPU of 3000 cosine steps at lr 3e-3; 2 layers, L 32, batch 8 or
# a 1500-step cosine fail the premise (benchmarks/lm_recipe_cost.py, benchmarks/README.md), for the five
# arms of the lessons' main claims
_QUICK = Scale(
    name="quick",
    train_length=64,
    n_layer=4,
    n_head=4,
    n_embd=64,
    steps=1500,
    batch_size=16,
    lr=6e-3,
    warmup_steps=100,
    cooldown_steps=300,
    schemes=("none", "learned", "sinusoidal", "rope", "alibi"),
)

_QUICK_COSINE = dataclasses.replace(
    _QUICK, name="quick-cosine", steps=3000, lr=3e-3, warmup_steps=200, cooldown_steps=0
)

#: nanoGPT's shakespeare_char GPU recipe (expected times in the module docstring: estimates, not measured)
_GPU = Scale(
    name="gpu",
    train_length=256,
    n_layer=6,
    n_head=6,
    n_embd=384,
    steps=5000,
    batch_size=64,
    lr=1e-3,
    warmup_steps=100,
    finetune_steps=500,
    entropy_batch=4,
    device="cuda",
)

SIZES: ScaleTable[Scale] = ScaleTable(
    Scale(
        name="smoke",
        train_length=16,
        n_layer=1,
        n_head=2,
        n_embd=16,
        steps=8,
        batch_size=4,
        lr=3e-3,
        warmup_steps=2,
        eval_windows=2,
        finetune_steps=4,
        entropy_batch=1,
    ),
    _QUICK,
    # the quick geometry at twice the training length, every scheme trained, 3000 cosine steps (the cheaper quick
    # recipe is measured at L = 64 only)
    dataclasses.replace(_QUICK_COSINE, name="full", train_length=128, schemes=None),
    # the quick geometry and arms at 3000 cosine steps at lr 3e-3: the bidirectional experiment's and the head
    # counts' quick base (their claims were measured on it), and a check of the quick recipe
    _QUICK_COSINE,
    _GPU,
    dataclasses.replace(_GPU, name="gpu-large", n_layer=12, n_head=12, n_embd=768, lr=6e-4, warmup_steps=200),
)

_STREAM_QUICK = Scale(
    name="quick",
    train_length=32,
    n_layer=2,
    n_head=4,
    n_embd=64,
    steps=150,
    batch_size=16,
    lr=3e-3,
    warmup_steps=20,
    eval_interval=150,
    eval_iters=2,
    eval_windows=2,
)
#: the small RoPE models the streaming and RoPE-frequency-usage experiments train on tinyshakespeare with the
#: ``shakespeare-char`` preset's recipe (:func:`preset_config`); ``eval_windows``: the streams the streaming
#: experiment reads (the frequency experiment reads its own number of windows)
STREAM_SCALES: ScaleTable[Scale] = ScaleTable(
    _STREAM_QUICK,
    dataclasses.replace(
        _STREAM_QUICK,
        name="full",
        steps=1500,
        batch_size=32,
        lr=2e-3,
        warmup_steps=100,
        eval_interval=500,
        eval_iters=10,
        eval_windows=8,
    ),
)


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
    "eval_interval": 10_000_000,
    "eval_iters": 100_000,
}
#: the learning rates a size may set, ``(0, MAX_LR]`` (the lab's sizes use 6e-4 to 3e-3)
MAX_LR = 10.0
#: a size's name: it names the models' subfolder and is printed, so plain ASCII of bounded length
NAME_RE = re.compile(r"[A-Za-z0-9_+][A-Za-z0-9._+-]{0,63}", re.ASCII)
NAME_RULE = "a plain folder name: 1 to 64 of A-Z a-z 0-9 . _ + -, not starting with . or -"


def _value(spec: str, key: str, text: str, base: Scale) -> int | float:
    """The value of ``key=text`` of a ``--size`` spec within its bound; else ``ValueError`` naming value and rule."""
    text = text.strip()
    if key == "lr":
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


def _check_geometry(spec: str, size: Scale) -> None:
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


def size_of(quick: bool, size: str | Scale | None = None, table: ScaleTable[Scale] = SIZES) -> Scale:
    """``size`` itself when it is a :class:`Scale`, else the scale of ``table`` named ``size``, else ``quick`` or
    ``full``."""
    if isinstance(size, Scale):
        return size
    return table.pick(size or ("quick" if quick else "full"))


def define_size(spec: str, table: ScaleTable[Scale] = SIZES) -> Scale:
    """The :class:`Scale` of a ``--size`` spec: ``"NAME=BASE,field=value,..."`` (``BASE`` of ``table`` with those
    fields changed, named ``NAME``) or ``"NAME"`` (the scale of ``table`` so named). ``table`` is not changed.

    Example: ``"deep=quick,n_layer=4,steps=600"`` is ``quick`` with 4 layers and 600 steps.

    Raises:
        ValueError: an unknown size or base, a field :class:`Scale` does not have, a value of the wrong type or
            out of its bound (:data:`MAX_FIELD`, :data:`MAX_LR`), a geometry no model has (``n_head`` not dividing
            ``n_embd``, an odd head width), a name that is no plain folder name (:data:`NAME_RE`), or the name of
            a scale of ``table`` with other values.
    """
    name, _, rest = str(spec).partition("=")
    name = name.strip()
    if not rest:
        return size_of(False, name if len(name) <= 80 else name[:77] + "...", table)
    spec = spec if len(spec) <= 120 else spec[:117] + "..."  # shown in the messages: one readable line
    base_name, *pairs = [part.strip() for part in rest.split(",")]
    if base_name not in table:
        raise ValueError(f"--size {spec!r}: unknown base size {base_name!r}; choose one of {', '.join(table)}")
    base = table[base_name]
    fields = [f.name for f in dataclasses.fields(Scale) if f.name not in ("name", "schemes")]
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
    if name in table and table[name] != size:
        raise ValueError(f"--size {spec!r}: {name!r} is already the size {table[name]}")
    return size


# ------------------------------------------------------------------------------------ the lab models' recipe
def _context(size: Scale) -> dict[str, Any]:
    """What a position scheme is built with in a causal GPT of ``size``."""
    return {
        "n_embd": size.n_embd,
        "n_heads": size.n_head,
        "head_dim": size.n_embd // size.n_head,
        "max_len": size.train_length,
        "bidirectional": False,
    }


def lab_schemes() -> tuple[str, ...]:
    """The schemes the extrapolation (and attention-entropy) lab trains: every registered scheme a GPT can be
    built with from its default config (``positions.names()`` order), so a newly registered scheme reaches
    these labs without an edit here. The filter is a property of the scheme, never its name: a scheme whose
    default config does not build for the lab's geometry (it needs a hand-chosen value) is left out.
    """
    from poslab.nn import positions

    context = {**_context(_QUICK), "original_max_len": _QUICK.train_length}
    out = []
    for name in positions.names():
        try:
            with torch.device("meta"):
                positions.build_for_model(name, {}, context)
        except (ValueError, TypeError):
            continue
        out.append(name)
    return tuple(out)


SCHEMES = lab_schemes()


def schemes_of(size: Scale) -> tuple[str, ...]:
    """The schemes trained at ``size``: its own list (the quick size's claim arms), else :data:`SCHEMES`."""
    return tuple(size.schemes) if size.schemes is not None else SCHEMES


def _bounded(scheme: str, size: Scale) -> bool:
    """Whether ``scheme`` (default config at this size) encodes only a bounded number of positions (a table)."""
    from poslab.nn import positions

    context = _context(size)
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        built = positions.build_for_model(scheme, {}, context)
    return built.max_positions is not None


@dataclass(frozen=True)
class Overrides:
    """What a lab run changes from its size's recipe (:func:`train_config`); ``None`` keeps the size's own.

    Attributes:
        block_size: the training length (default the size's ``L``).
        position_config: the position scheme's options (e.g. a RoPE scaling).
        steps: training steps; a run with other steps than the size's has no cooldown and evaluates 5 times.
        batch_size: sequences per step.
        lr: the peak learning rate (``min_lr`` is a tenth of it).
        warmup_steps: warmup steps.
        init_from: the run folder whose weights the run starts from (a fine-tune or a continued run).
    """

    block_size: int | None = None
    position_config: Mapping[str, Any] | None = None
    steps: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    warmup_steps: int | None = None
    init_from: str | None = None

    def __post_init__(self) -> None:
        for key in ("block_size", "steps", "batch_size"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{key} {value!r}: must be a whole number of at least 1, or None for the size's own")
        if self.warmup_steps is not None and (not isinstance(self.warmup_steps, int) or self.warmup_steps < 0):
            raise ValueError(f"warmup_steps {self.warmup_steps!r}: must be a whole number of at least 0, or None")
        number = isinstance(self.lr, (int, float)) and not isinstance(self.lr, bool)
        if self.lr is not None and not (number and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr {self.lr!r}: must be a finite number above 0, or None for the size's own")
        if self.init_from is not None and not str(self.init_from):
            raise ValueError("init_from '': must name a run folder, or be None")


def train_config(
    scheme: str,
    size: Scale,
    models_dir: Path,
    *,
    name: str | None = None,
    seed: int = SEED,
    changes: Overrides = Overrides(),
) -> Any:
    """The :class:`poslab.training.config.TrainConfig` of one lab model (same data, seed and recipe for every scheme).

    The recipe is nanoGPT's (AdamW, warmup + cosine or the scale's warmup-stable-decay, no dropout, no biases)
    with the token embeddings multiplied by ``sqrt(n_embd)`` (``embed_scale``, Vaswani et al. 2017 §3.4) for
    every scheme: with nanoGPT's 0.02-std token embeddings the unit-amplitude sinusoidal code swamps the content,
    and the scale gives the content its share back. A LayerNorm on the embeddings (``embed_norm``, Bloom) does
    that too but slows the learned table down (measured at 2 layers, width 64, 1000 steps, one seed:
    validation loss 2.30 with the norm, 2.07 without; ``benchmarks/lm_recipe_search.py``).

    The learned table has ``max(EXTRAPOLATION_FACTORS) * L`` rows, of which training reads the first ``L`` (as a
    GPT-2 checkpoint's table past its trained lengths): the rest keep their random initialisation, so the model can
    be read past ``L`` and the lesson's "collapse" measured.
    """
    from poslab.training.config import TrainConfig

    own_steps = changes.steps is None or changes.steps == size.steps
    steps = changes.steps or size.steps
    lr = changes.lr or size.lr
    block_size = changes.block_size
    position_config = dict(changes.position_config or {})
    if block_size is None and "max_len" not in position_config and _bounded(scheme, size):
        position_config["max_len"] = max(EXTRAPOLATION_FACTORS) * size.train_length  # rows to read past L
    values: dict[str, Any] = {
        "name": name or scheme,
        "out_dir": str(models_dir),
        "corpus": CORPUS,
        "tokenizer": "char",
        "model": {
            "n_layer": size.n_layer,
            "n_head": size.n_head,
            "n_embd": size.n_embd,
            "block_size": block_size or size.train_length,
            "dropout": 0.0,
            "bias": False,
            "embed_scale": float(size.n_embd) ** 0.5,
            "position": scheme,
            "position_config": position_config,
        },
        "max_steps": steps,
        "batch_size": changes.batch_size or size.batch_size,
        "lr": lr,
        "min_lr": lr / 10,
        "warmup_steps": size.warmup_steps if changes.warmup_steps is None else changes.warmup_steps,
        "cooldown_steps": size.cooldown_steps if own_steps else 0,
        "beta2": 0.99,
        "weight_decay": 0.1,
        "grad_clip": 1.0,
        "eval_interval": size.eval_interval if own_steps and size.eval_interval else max(1, steps // 5),
        "eval_iters": size.eval_iters,
        "log_interval": max(1, steps // 10),
        "ckpt_interval": 0,
        "keep_checkpoints": 1,
        "seed": seed,
        "device": size.device,  # a GPU size trains on CUDA
        "dtype": "auto",  # bf16 only where it measured faster on this machine (poslab.training.precision)
    }
    if changes.init_from is not None:
        values["init_from"] = changes.init_from
    return TrainConfig.from_dict(values)


def lab_config(position: str, size: Scale, changes: Overrides = Overrides()) -> dict[str, Any]:
    """:func:`train_config` as a config mapping without name and folder: the base of a seeded experiment's arms."""
    config = train_config(position, size, Path("runs"), changes=changes).to_dict()
    for key in ("name", "out_dir"):
        config.pop(key, None)
    return config


#: the lessons' own training: seed 001's ``tang-small`` GPT on the Tang poems for the lesson's 1000 steps
#: ("各訓練 1000 步", train each for 1000 steps), the full form of the heads and position-training experiments
LESSON = Scale(
    name="lesson",
    train_length=128,
    n_layer=4,
    n_head=4,
    n_embd=128,
    steps=1000,
    batch_size=16,
    lr=1e-3,
    warmup_steps=100,
    eval_interval=100,
    eval_iters=20,
)


def lesson_config() -> dict[str, Any]:
    """The ``tang-small`` preset at :data:`LESSON` (:func:`preset_config`), with its learned positions."""
    return preset_config(LESSON, preset="tang-small", position="learned")


def preset_config(scale: Scale, preset: str = "shakespeare-char", position: str = "rope") -> dict[str, Any]:
    """A preset's recipe (:mod:`poslab.training.presets`) at ``scale`` (:data:`STREAM_SCALES`, :data:`LESSON`):
    the scale's geometry, steps, schedule and validation, no checkpoints, the learning rate decaying over the
    whole run; the rest (corpus, dropout, ``min_lr``, ...) the preset's."""
    from poslab.training import presets

    config = presets.preset_config(preset)
    config.update(
        max_steps=scale.steps,
        batch_size=scale.batch_size,
        lr=scale.lr,
        warmup_steps=scale.warmup_steps,
        eval_interval=scale.eval_interval or max(1, scale.steps // 5),
        eval_iters=scale.eval_iters,
        ckpt_interval=0,
        keep_checkpoints=1,
        lr_decay_steps=scale.steps,
    )
    config["model"] = {
        **config["model"],
        "n_layer": scale.n_layer,
        "n_head": scale.n_head,
        "n_embd": scale.n_embd,
        "block_size": scale.train_length,
        "position": position,
    }
    return config
