"""An experiment as a declaration: what it trains, what it measures and what it claims; the pipeline does the rest.

Not an experiment. A declared experiment is one small module ending with ``EXPERIMENT = declare(...)``:

* ``plan(out, quick, **options) -> Plan``: its arms (label -> seed -> training config, from the scale table or
  :func:`poslab.lab.scale.lab_config`, or a lab model of the store, :class:`~poslab.lab.experiments.lab_models.
  LabModel`) and its typed setting (what the measurement reads besides the runs);
* ``measure(runs) -> Result``: a frozen dataclass of typed fields (dataclasses, lists, dicts of them);
* ``claims(result) -> [ClaimRecord]`` with their premises;
* ``tables``: :class:`~poslab.lab.tables.KeyTable` values built from the typed ``Result``;
* ``figures(result, out) -> {key: path}``.

The pipeline (:func:`declare`) owns the rest, once: every arm and seed trained or reused through
:func:`ensure_runs`, the tables printed, the figures drawn, the result serialised with its claims; the report reads
results.json back into the same ``Result`` (:func:`load`): a field a table needs that the file lacks is a failure
naming the table and the field.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from poslab.lab.experiments.common import Experiment, Option
from poslab.lab.experiments.lab_models import MODELS, LabModel
from poslab.lab.plan import PILOT, QUICK_SEED_CAP, Design
from poslab.lab.tables import KeyTable, print_tables
from poslab.lab.verdicts import INCONCLUSIVE, ClaimRecord, Premise, with_premise

R = TypeVar("R")
T = TypeVar("T")


@dataclass(frozen=True)
class Plan(Generic[T]):
    """What a declared experiment trains and what its measurement reads besides the runs.

    ``arms``: arm label -> seed -> training config values (with ``name``, ``out_dir`` and ``seed``) or
    :class:`LabModel`, in the order they are trained and shown; ``summarise``: give each run its :class:`RunSummary`;
    ``what``: what progress lines and shard records call the runs; ``follow``: given every arm's runs, the plan of
    the trainings that start from them (fine-tunes), whose arms join these in :class:`Runs`.
    """

    setting: T
    arms: Mapping[str, Mapping[int, Mapping[str, Any] | LabModel]]
    summarise: bool = True
    what: str = "runs"
    follow: Callable[[Mapping[str, Mapping[int, Run]]], Plan[Any]] | None = None


@dataclass(frozen=True)
class RunSummary:
    """One finished training, summarised (:func:`poslab.lab.experiments.training.summarise_run`).

    ``val_loss_all`` is the loss on the whole validation split in consecutive windows of the training length
    (the same tokens for every run and seed); ``loss_by_position`` the mean loss at each window position
    (``None`` for a masked LM); the curves are ``(step, loss)`` pairs.
    """

    val_loss_all: float
    loss_by_position: list[float] | None
    seed: int
    final_val_loss: float
    final_train_loss: float
    best_val_loss: float
    tokens_per_s: float
    wall_time_s: float
    n_params: int
    threads: int | None
    val_curve: list[tuple[int, float]]
    train_curve: list[tuple[int, float]]
    run_dir: str


@dataclass(frozen=True)
class Run:
    """One trained arm and seed: its folder, and its summary when the plan asks for one."""

    seed: int
    path: Path
    summary: RunSummary | None = None


@dataclass(frozen=True)
class Runs(Generic[T]):
    """What :func:`ensure_runs` hands the measurement: the plan, every arm's runs (arm -> seed -> run), and the
    workers asked for (``None``: the default), for a measurement that trains or reads in parallel itself."""

    plan: Plan[T]
    by_arm: Mapping[str, Mapping[int, Run]]
    workers: int | None = None

    @property
    def setting(self) -> T:
        return self.plan.setting

    def summaries(self, arm: str) -> list[RunSummary]:
        """The arm's run summaries in seed order (``ValueError`` when the plan asked for none)."""
        found = [run.summary for run in self.by_arm[arm].values()]
        if any(s is None for s in found):
            raise ValueError(f"arm {arm!r} has no run summaries: its plan has summarise=False")
        return typing.cast(list[RunSummary], found)


def seeded_arms(
    out: Path, base: Mapping[str, Any], variants: Mapping[str, Mapping[str, Any]], seeds: Mapping[str, Sequence[int]]
) -> dict[str, dict[int, dict[str, Any]]]:
    """Arms trained from one base config: arm -> seed -> ``base`` with the arm's overrides (``model`` merged key by
    key), run ``OUT/runs/ARM-sSEED``.

    Args:
        base: the config every arm starts from.
        variants: arm -> its overrides.
        seeds: arm -> its seeds.
    """
    arms: dict[str, dict[int, dict[str, Any]]] = {}
    for arm, override in variants.items():
        values = {**base, **{k: v for k, v in override.items() if k != "model"}}
        values["model"] = {**base.get("model", {}), **override.get("model", {})}
        arms[arm] = {
            seed: {**values, "name": f"{arm}-s{seed}", "out_dir": str(Path(out) / "runs"), "seed": seed}
            for seed in seeds[arm]
        }
    return arms


def ensure_runs(plan: Plan[Any], workers: int | None = None, models: Path | None = None) -> Runs[Any]:
    """Every arm and seed of ``plan`` trained unless a finished identical run is in its folder (a lab model's
    folder in the store ``models``, which a plan asking for lab models needs), ``workers`` at a time; inside a
    sharded step only the shard's slice (:func:`poslab.lab.experiments.training.ensure_many`), then each run
    summarised if the plan asks."""
    from poslab.lab.experiments.training import ensure_many, summarise_many
    from poslab.training.config import TrainConfig

    keys = [(arm, seed) for arm, seeds in plan.arms.items() for seed in seeds]
    asked = [plan.arms[arm][seed] for arm, seed in keys]
    if models is None and any(isinstance(a, LabModel) for a in asked):
        raise ValueError("the plan asks for lab models: give ensure_runs the lab model store (models=)")
    configs = [a.config(models).to_dict() if isinstance(a, LabModel) else dict(a) for a in asked]
    paths = ensure_many([TrainConfig.from_dict(values) for values in configs], workers, what=plan.what)
    if plan.summarise:
        summaries: list[RunSummary | None] = [
            load(RunSummary, s) for s in summarise_many(list(zip(configs, paths)), workers)
        ]
    else:
        summaries = [None] * len(keys)
    by_arm: dict[str, dict[int, Run]] = {arm: {} for arm in plan.arms}
    for (arm, seed), path, summary in zip(keys, paths, summaries):
        by_arm[arm][seed] = Run(seed, path, summary)
    if plan.follow is not None:
        by_arm.update(ensure_runs(plan.follow(by_arm), workers, models).by_arm)
    return Runs(plan, by_arm, workers)


# ------------------------------------------------------------------------------------ arms left to the full form
#: why the quick lab leaves an arm to the full form (:data:`poslab.lab.plan.QUICK_SEEDS`)
QUICK_PLAN = (
    f"the quick lab trains an arm only where the pilot, {PILOT}, decides a claim it enters within {QUICK_SEED_CAP} "
    "seeds; `poslab lab --full` or `--seeds N` trains every arm"
)


def not_trained(
    claim: str, source: str, criterion: str, missing: Sequence[str], n_seeds: int, design: Design
) -> ClaimRecord:
    """The rule for a claim on arms the plan does not train at this form: not testable at this scale, its premise
    naming the ``missing`` arms and why (:data:`QUICK_PLAN`); ``n_seeds`` and ``design`` are what the form that
    trains them decides it with."""
    premise = Premise(
        text=f"its arms trained in this form ({QUICK_PLAN})",
        measured=f"{', '.join(missing)}: the full form only",
        met=False,
    )
    record = ClaimRecord(claim, source, criterion, "not trained in this form", None, None, 0, INCONCLUSIVE)
    return with_premise(dataclasses.replace(record, n_seeds=n_seeds, design=design), premise)


# ------------------------------------------------------------------------------------ typed results <-> JSON
def to_json(result: Any) -> Any:
    """A result (a dataclass, nested) as results.json holds it: dicts with string keys, lists, plain values; a
    field marked :data:`~poslab.lab.experiments.common.INLINE` is written as its own fields among its owner's, one
    marked :data:`~poslab.lab.experiments.common.WHEN_SET` only when it is not ``None``, one marked
    :func:`~poslab.lab.experiments.common.stored_as` under its key."""
    return json.loads(json.dumps(_plain(result), default=str))


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            inner = getattr(value, f.name)
            if inner is None and f.metadata.get("when_set"):
                continue
            if f.metadata.get("inline"):
                out.update(_plain(inner))
            else:
                out[_key(f)] = _plain(inner)
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def load(kind: Any, data: Any) -> Any:
    """``data`` (read from results.json) as ``kind``: a dataclass (every field present, else ``KeyError`` naming
    it; an :data:`~poslab.lab.experiments.common.INLINE` field read from the same object, an
    :data:`~poslab.lab.experiments.common.OLDER` or :data:`~poslab.lab.experiments.common.WHEN_SET` one absent
    there keeping its default),
    ``list``/``tuple``/``dict`` of such, ``X | None``, or a plain value (``TypeError`` for one of another type)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return data
    if dataclasses.is_dataclass(kind):
        if not isinstance(data, Mapping):
            raise TypeError(f"{kind.__name__}: expected an object, got {type(data).__name__}")
        hints = typing.get_type_hints(kind)
        return kind(
            **{f.name: load(hints[f.name], _field(f, data)) for f in dataclasses.fields(kind) if _read(f, data)}
        )
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return load(options[0], data)  # a missing field of an optional dataclass is named (KeyError)
        errors = []
        for inner in options:
            try:
                return load(inner, data)
            except (TypeError, ValueError, KeyError) as err:
                errors.append(err)
        raise TypeError(f"{kind}: {data!r:.40} is none of its types ({'; '.join(map(str, errors))})")
    if origin in (list, Sequence):
        return [load(args[0], v) for v in _items(kind, data)]
    if origin is tuple:
        items = _items(kind, data)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(load(args[0], v) for v in items)
        if len(items) != len(args):
            raise TypeError(f"{kind}: expected {len(args)} items, got {len(items)}")
        return tuple(load(a, v) for a, v in zip(args, items))
    if origin in (dict, Mapping):
        if not isinstance(data, Mapping):
            raise TypeError(f"{kind}: expected an object, got {type(data).__name__}")
        return {load(args[0], k): load(args[1], v) for k, v in data.items()}
    if kind is float and isinstance(data, (int, float)) and not isinstance(data, bool):
        return float(data)
    if kind is int and isinstance(data, str):
        return int(data)  # a dict key written by JSON
    if kind is Path and isinstance(data, str):
        return Path(data)
    if isinstance(kind, type) and not isinstance(data, kind):
        raise TypeError(f"expected {kind.__name__}, got {type(data).__name__} {data!r:.40}")
    return data


def _read(f: dataclasses.Field, data: Mapping[str, Any]) -> bool:
    """Whether :func:`load` reads field ``f`` from ``data`` (an absent ``OLDER`` or ``WHEN_SET`` field keeps its
    default)."""
    return f.init and not ((f.metadata.get("older") or f.metadata.get("when_set")) and _key(f) not in data)


def _key(f: dataclasses.Field) -> str:
    return f.metadata.get("key", f.name)


def _field(f: dataclasses.Field, data: Mapping[str, Any]) -> Any:
    return data if f.metadata.get("inline") else data[_key(f)]


def _items(kind: Any, data: Any) -> list[Any]:
    if not isinstance(data, (list, tuple)):
        raise TypeError(f"{kind}: expected a list, got {type(data).__name__}")
    return list(data)


# ------------------------------------------------------------------------------------ the pipeline
@dataclass(frozen=True)
class Declaration(Generic[R]):
    """A declared experiment's parts (module docstring), which :func:`declare` turns into an :class:`Experiment`:
    ``result`` is the type ``measure`` returns and results.json is read back into; the plan's keyword options are
    those of ``poslab experiment NAME`` and the lab."""

    result: type[R]
    plan: Callable[..., Plan[Any]]
    measure: Callable[[Runs[Any]], R]
    claims: Callable[[R], Sequence[ClaimRecord | dict[str, Any]]]
    tables: tuple[KeyTable, ...] = ()
    figures: Callable[[R, Path], Mapping[str, Path]] | None = None

    def key_tables(self) -> tuple[KeyTable, ...]:
        """The tables as results.json builds them: the file read back into the result type, then each table."""
        return tuple(KeyTable(k.name, _typed(k.build, self.result)) for k in self.tables)

    def run(
        self,
        name: str,
        out: Path,
        quick: bool = False,
        workers: int | None = None,
        models: Path | None = None,
        **options: Any,
    ) -> dict:
        """Plan, train (:func:`ensure_runs`; lab models in the store ``models``, default ``OUT/models``), measure,
        print the tables, draw the figures, claim."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        store = Path(models) if models is not None else out / MODELS
        runs = ensure_runs(self.plan(out, quick, **options), workers, store)
        result = self.measure(runs)
        data = to_json(result)
        print_tables(name, self.key_tables(), data)
        drawn = self.figures(result, out) if self.figures is not None else {}
        claims = [c.to_dict() if isinstance(c, ClaimRecord) else c for c in self.claims(result)]
        return {"experiment": name, **data, **{k: str(p) for k, p in drawn.items()}, "claims": claims}


def _typed(build: Callable[[Any], Any], kind: type) -> Callable[[dict], Any]:
    return lambda data: build(load(kind, data))


def declare(
    name: str,
    description: str,
    tier: str,
    declaration: Declaration[Any],
    after: tuple[str, ...] = (),
    estimate: tuple[float, float] = (4.0, 12.0),
) -> Experiment:
    """The :class:`Experiment` of a declaration: its ``run(out, quick=False, workers=None, models=None, <plan's
    options>)`` is the pipeline (:meth:`Declaration.run`); its tables build the typed result from results.json."""

    def run(
        out: Path, quick: bool = False, workers: int | None = None, models: Path | None = None, **options: Any
    ) -> dict:
        return declaration.run(name, out, quick, workers, models, **options)

    own = [p for p in inspect.signature(declaration.plan).parameters.values() if p.name not in ("out", "quick")]
    head = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in ("out",)]
    head += [
        inspect.Parameter("quick", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=False),
        inspect.Parameter("workers", inspect.Parameter.KEYWORD_ONLY, default=None),
        inspect.Parameter("models", inspect.Parameter.KEYWORD_ONLY, default=None),
    ]
    run.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        head + [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own]
    )
    run.__doc__ = declaration.plan.__doc__
    # the plan's own options (a scale, seeds) are what its run takes besides the pipeline's workers and store
    options = {Option.WORKERS, Option.MODELS} | {o for o in Option if o.value in {p.name for p in own}}
    return Experiment(name, description, tier, run, after, estimate, declaration.key_tables(), frozenset(options))
