"""What the lab's training experiments share: the seeds, training many runs, reusing finished ones, the claims table.

Not an experiment. Every training goes through :func:`ensure_many` (trained unless an identical finished run
exists), a declared experiment's arms through :func:`poslab.lab.experiments.declaration.ensure_runs`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from poslab.checks import is_int
from poslab.display import cut, print_table
from poslab.jobs import runner
from poslab.jobs.runner import Task, check_workers, default_workers, train_many
from poslab.lab.experiments.common import one_thread
from poslab.lab.lab_runs import check_all, lab_training
from poslab.lab.premises import all_of, below_bigram, uses_context
from poslab.lab.report.i18n import t
from poslab.lab.scale import SEED, SEEDS, Scale, preset_config  # noqa: F401  (SEED re-exported: the experiments' seeds are here)
from poslab.lab.tables import Table, spread
from poslab.lab.verdicts import ClaimRecord, Premise, missed_by, num, tally
from poslab.training.step import StepSettings, train_step

if TYPE_CHECKING:
    from poslab.lab.experiments.declaration import RunSummary


def check_seeds(n: object) -> int:
    """``n`` as a number of seeds per arm: a whole number of at least :data:`~poslab.lab.verdicts.MIN_SEEDS`, the
    fewest seeds an arm needs for a verdict (``ValueError`` naming the value and the rule)."""
    from poslab.lab.verdicts import MIN_SEEDS

    if not is_int(n) or n < MIN_SEEDS:
        raise ValueError(
            f"--seeds {n!r}: the number of seeds per arm must be a whole number of at least {MIN_SEEDS} "
            f"(fewer cannot decide a seeded claim)"
        )
    return n


def seeds_for(n: int) -> tuple[int, ...]:
    """``n`` seeds for every seeded arm (``poslab lab --seeds N``, ``poslab experiment NAME --seeds N``): the first
    ``n`` of :data:`SEEDS` and then the next seeds in turn, so the default runs are among them and reused
    (``ValueError`` for a bad ``n``: :func:`check_seeds`)."""
    n = check_seeds(n)
    return tuple(SEEDS[:n]) + tuple(range(SEEDS[-1] + 1, SEEDS[-1] + 1 + n - len(SEEDS)))


def planned_seeds(
    experiment: str, arms: Sequence[str], quick: bool, seeds: Sequence[int] | None = None
) -> dict[str, tuple[int, ...]]:
    """arm -> its training seeds: ``seeds`` for every arm when given (``--seeds N``: :func:`seeds_for`); else, in
    the quick form, the plan's seeds per arm (:func:`poslab.lab.plan.quick_seeds`: the first ``n`` of
    :func:`seeds_for`), an arm at 0 (the full form only) left out; else :data:`SEEDS` for every arm."""
    from poslab.lab.plan import quick_seeds

    if seeds is not None:
        return {arm: tuple(int(s) for s in seeds) for arm in arms}
    if not quick:
        return {arm: SEEDS for arm in arms}
    counts = {arm: quick_seeds(experiment, arm) for arm in arms}
    return {arm: seeds_for(n) for arm, n in counts.items() if n > 0}


#: validation windows averaged for the per-position loss of the context premise: every whole window of
#: the split (``None``). 64 windows give each position 64 targets, a noise of about 0.1 nats per point, as
#: large as the premise's margin (:data:`poslab.lab.premises.CONTEXT_MARGIN`)
CONTEXT_WINDOWS: int | None = None


def lm_premise(
    runs: Mapping[str, Sequence[RunSummary]], arms: list[str], bigram: float, context: bool = False
) -> Premise:
    """The language-model premise of a claim over ``arms`` of a declared experiment's run summaries: every seed's
    whole-split loss clearly below the bigram baseline, and (``context``) every seed using its context
    within the window (:func:`poslab.lab.premises.uses_context`)."""
    found = below_bigram({a: [r.val_loss_all for r in runs[a]] for a in arms}, bigram)
    if not context:
        return found
    curves = {a: [r.loss_by_position for r in runs[a] if r.loss_by_position] for a in arms}
    return all_of(found, uses_context(curves))


# ------------------------------------------------------------------------------------ training
def summarise_run(values: dict[str, Any], run_dir: str) -> dict[str, Any]:
    """The summary of the finished run in ``run_dir`` trained with the config ``values``
    (:class:`poslab.lab.experiments.declaration.RunSummary`'s fields: its whole-split loss carries no
    evaluation-sampling noise)."""
    from poslab.analysis.eval import loss_by_position
    from poslab.runs import RunFolder, load_run, read_metrics
    from poslab.training.config import TrainConfig
    from poslab.training.data import prepare_data
    from poslab.training.loop import evaluate_loss

    cfg = TrainConfig.from_dict(values)
    results = RunFolder(run_dir).results() or {}
    metrics = read_metrics(run_dir)
    model, tokenizer, _ = load_run(run_dir)
    data = prepare_data(cfg, tokenizer)
    block = model.config.block_size
    val_all = evaluate_loss(model, data.val, block, max(1, 8192 // block), None, objective=cfg.objective)
    by_position = None
    if cfg.objective != "mlm":  # the context premise: loss at each position of the window
        by_position = [float(v) for v in loss_by_position(model.eval(), data.val, block, CONTEXT_WINDOWS)]
    return {
        "val_loss_all": val_all,
        "loss_by_position": by_position,
        "seed": cfg.seed,
        "final_val_loss": results["final_val_loss"],
        "final_train_loss": results["final_train_loss"],
        "best_val_loss": results["best_val_loss"],
        "tokens_per_s": results["tokens_per_s"],
        "wall_time_s": results["wall_time_s"],
        "n_params": results["n_params"],
        "threads": results["threads"],
        "val_curve": [(r["step"], r["val_loss"]) for r in metrics if "val_loss" in r],
        "train_curve": [(r["step"], r["loss"]) for r in metrics],
        "run_dir": str(run_dir),
    }


def summarise_many(runs: Sequence[tuple[dict[str, Any], Path]], workers: int | None = None) -> list[dict[str, Any]]:
    """:func:`summarise_run` of every finished ``(config values, run folder)``, ``workers`` at a time (each in its own
    process on one thread when more than one), in order."""
    workers = default_workers() if workers is None else check_workers(workers)
    alone = workers == 1 or len(runs) <= 1
    tasks = [
        Task(
            Path(path).name,
            summarise_run,
            ({**values, **({} if alone else {"threads": values.get("threads") or 1})}, str(path)),
            gpus=runner.gpus_for(values),
        )
        for values, path in runs
    ]
    return train_many(tasks, 1 if alone else workers, sharded=True)


# ------------------------------------------------------------------------------------ timing
#: training steps of each arm per round, and rounds, of :func:`alternating_cpu_speed`
TIMING_STEPS = 4
TIMING_ROUNDS = 5


def alternating_cpu_speed(
    configs: dict[str, dict[str, Any]],
    vocab_size: int,
    steps: int = TIMING_STEPS,
    rounds: int = TIMING_ROUNDS,
    seed: int = SEED,
) -> dict[str, list[float]]:
    """Training tokens per CPU second of each arm, measured in this process with the arms interleaved.

    Each arm's model and optimiser are built from its config; every round runs ``steps`` training
    steps of each arm in turn (same random batches for every arm) on one thread and charges the
    process CPU time (:func:`time.process_time`) of those steps to the arm. Interleaving spreads
    whatever else the machine is doing over every arm alike, and CPU time does not count the time a
    process waits for a core: unlike wall-clock tokens/s of trainings run side by side, the ratio
    does not follow the machine's load. The first round is a warm-up and is not returned.
    ``configs``: arm -> a training config mapping; returns arm -> tokens per CPU second of each measured round.
    """
    import time

    import torch

    from poslab.nn.model import GPT
    from poslab.training.config import TrainConfig, model_config
    from poslab.training.optim import make_optimizer

    if steps < 1 or rounds < 3:
        raise ValueError(f"alternating timing needs steps >= 1 and rounds >= 3, got steps={steps!r}, rounds={rounds!r}")
    with one_thread():
        arms = {}
        for arm, values in configs.items():
            cfg = TrainConfig.from_dict({"name": f"timing-{arm}", **values})
            torch.manual_seed(seed)
            model = GPT(model_config(cfg, vocab_size)).train()
            arms[arm] = (cfg, model, make_optimizer(model, cfg))
        generator = torch.Generator().manual_seed(seed)
        out: dict[str, list[float]] = {arm: [] for arm in arms}
        for round_ in range(rounds + 1):
            for arm, (cfg, model, optimizer) in arms.items():
                block = cfg.model.block_size
                batches = [
                    torch.randint(0, vocab_size, (cfg.batch_size, block + 1), generator=generator) for _ in range(steps)
                ]
                params = list(model.parameters())
                start = time.process_time()
                for batch in batches:
                    # [B, T+1] -> inputs [B, T], targets [B, T]; the trainer's step, unclipped like the original timing
                    train_step(optimizer, params, lambda _i, b=batch, m=model: m(b[:, :-1], b[:, 1:])[1], UNCLIPPED)
                spent = time.process_time() - start
                if round_ > 0:
                    out[arm].append(steps * cfg.batch_size * block / max(spent, 1e-9))
        return out


#: the timing's training step: fp32, no gradient clipping (the arms differ only in their position scheme)
UNCLIPPED = StepSettings(grad_clip=None)


# ------------------------------------------------------------------------------------ reusing runs
def same_run(run_dir: Path, cfg: Any, state: str = "finished") -> bool:
    """A run in ``run_dir`` in ``state`` (completed; ``interrupted``: stopped with a checkpoint) trained with exactly
    ``cfg`` (up to its name and folder)."""
    from poslab.runs import RunFileError, RunFolder

    run = RunFolder(run_dir)
    try:
        if run.state != state or (state == "interrupted" and not run.checkpoints()):
            return False
        saved = run.config()
        requested = ((run.results() or {}).get("precision") or {}).get("requested")
    except (OSError, RunFileError, AttributeError):
        return False
    # threads change no result (tests/test_train_experiments.py: parallel one-thread == sequential)
    wanted = {k: v for k, v in cfg.to_dict().items() if k not in ("name", "out_dir", "model", "threads")}
    have = {k: v for k, v in saved.get("train", {}).items() if k not in ("name", "out_dir", "threads")}
    # a training key added after the run was saved: the run trained with its default
    have.update(
        {
            f.name: f.default
            for f in dataclasses.fields(type(cfg))
            if f.name in wanted and f.name not in have and f.default is not dataclasses.MISSING
        }
    )
    if wanted.get("dtype") == "auto" and (requested == "auto" or state == "interrupted"):
        # config.json keeps the dtype auto chose; the run asked for auto as cfg does (an interrupted run, with no
        # results.json to say so, resumes in the dtype it saved, as auto does on resume)
        have["dtype"] = "auto"
    model = {k: v for k, v in saved.get("model", {}).items() if k != "vocab_size"}
    expected_model = {k: v for k, v in cfg.to_dict()["model"].items() if k != "vocab_size"}
    return have == wanted and model == expected_model


def train_or_resume(cfg: Any, progress: bool = False) -> dict[str, Any]:
    """Train ``cfg`` into its folder, returning its results: continue an interrupted run of the same config from
    its checkpoint, else start afresh, replacing what the folder holds."""
    from poslab.session import train

    run_dir = Path(cfg.out_dir) / cfg.name
    if same_run(run_dir, cfg, state="interrupted"):
        return train(cfg, resume=True, progress=progress)
    return train(cfg, overwrite=run_dir.exists() and any(run_dir.iterdir()), progress=progress)


def preset_arms(out: Path, scale: Scale, seeds: Sequence[int]) -> dict[str, dict[int, dict[str, Any]]]:
    """One RoPE GPT per seed of the ``shakespeare-char`` preset's recipe at ``scale`` (:func:`poslab.lab.scale.
    preset_config`) as a declared experiment's one arm ``"rope"``: runs ``OUT/runs/seed-SEED``, one thread each."""
    arms: dict[int, dict[str, Any]] = {}
    for seed in seeds:
        config = preset_config(scale)
        config.update(name=f"seed-{seed}", out_dir=str(Path(out) / "runs"), seed=seed, threads=1)
        arms[seed] = config
    return {"rope": arms}


def ensure_trained(cfg: Any, progress: bool = False) -> Path:
    """The run folder of ``cfg``, trained (:func:`train_or_resume`) unless a completed identical run is there; a run
    the lab did not make is never replaced (:func:`poslab.lab.lab_runs.lab_training`)."""
    if not same_run(cfg.run_dir, cfg):
        with lab_training(cfg.run_dir, resumes=same_run(cfg.run_dir, cfg, state="interrupted")):
            train_or_resume(cfg, progress)
    return Path(cfg.run_dir)


def _ensure_in_worker(values: dict[str, Any], progress: bool = False) -> str:
    """Worker: :func:`ensure_trained` of one config's dict (a live progress bar when ``progress``)."""
    from poslab.training.config import TrainConfig

    return str(ensure_trained(TrainConfig.from_dict(values), progress))


def shard_key(cfg: Any) -> int:
    """The number that picks the shard of a training (``key % N``): its config without name, folder and threads (what
    :func:`same_run` compares), plus its seed. One training lands in the same shard whichever experiment asks for it,
    so two shards never train one lab model at once; the seeds of one config go to the shards in turn. A path in the
    config counts by its last name only: shards on machines that mount the lab at other paths agree."""
    values = {k: v for k, v in cfg.to_dict().items() if k not in ("name", "out_dir", "threads", "seed")}
    for key in ("init_from", "corpus"):  # a run folder or a corpus file, wherever this machine keeps it
        if isinstance(values.get(key), str):
            values[key] = Path(values[key]).name
    return zlib.crc32(json.dumps(values, sort_keys=True, default=str).encode()) + int(cfg.seed)


def ensure_many(configs: Sequence[Any], workers: int | None = None, what: str = "runs") -> list[Path]:
    """The run folder of every config, in order: :func:`ensure_trained`, the missing ones ``workers`` at a time (each
    in its own process on one thread when more than one). Inside a sharded step (:func:`poslab.jobs.runner.use_shard`)
    only the shard's trainings (:func:`shard_key`) are trained, and :class:`poslab.jobs.runner.ShardFinished` stops
    the step while any is unfinished. A run the lab did not make is never replaced: the step stops first with one line
    (:func:`poslab.lab.lab_runs.check_all`)."""
    workers = default_workers() if workers is None else check_workers(workers)
    shard = runner.current_shard()
    mine = {i for i, c in enumerate(configs) if shard is None or shard_key(c) % shard[1] == shard[0] - 1}

    def finished(i: int) -> Path | None:
        return configs[i].run_dir if same_run(configs[i].run_dir, configs[i]) else None

    found = {i: done for i in range(len(configs)) if (done := finished(i)) is not None}
    todo = [i for i in sorted(mine) if i not in found]
    # a run the lab did not make where one is trained afresh: one line, nothing trained
    check_all([configs[i].run_dir for i in todo if not same_run(configs[i].run_dir, configs[i], state="interrupted")])
    if todo:
        print(
            f"--- training {len(todo)} {what} ({min(workers, len(todo))} at a time): "
            f"{', '.join(configs[i].name for i in todo)}",
            flush=True,
        )
    alone = workers == 1 or len(todo) <= 1
    tasks = [
        Task(
            configs[i].name,
            _ensure_in_worker,
            ({**configs[i].to_dict(), **({} if alone else {"threads": configs[i].threads or 1})}, alone),
            gpus=runner.gpus_for(configs[i].to_dict()),
        )
        for i in todo
    ]
    for i, path in zip(todo, train_many(tasks, 1 if alone else workers, sharded=True)):
        found[i] = Path(path)
    if shard is not None:  # a sharded step: go on only once every shard's trainings are finished
        for i in range(len(configs)):
            if i not in found and (done := finished(i)) is not None:
                found[i] = done
        left = len(configs) - len(found)
        runner.end_of_stage(what, trained=len(todo), in_shard=len(mine), total=len(configs), left=left)
    return [found[i] for i in range(len(configs))]


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.3g}"
    return str(value)


def print_claims(claims: Sequence[dict[str, Any] | ClaimRecord]) -> None:
    """Print the verdicts (records or their dicts) as a table: verdict, claim, measured, margin against noise,
    premise; then the counts."""
    rows = []
    records = []
    for c in claims:
        c = c.to_dict() if isinstance(c, ClaimRecord) else c
        measured = c.get("measured", "")
        if isinstance(measured, dict):
            measured = ", ".join(f"{k}={_fmt(v)}" for k, v in measured.items())
        try:
            against = missed_by(c)
            records.append(c)
        except (ValueError, TypeError):
            against = "-"
        premise = c.get("premise")
        shown = "-" if not premise else f"{'met' if premise['met'] else 'NOT MET'}: {premise['measured']}"
        claim = str(c.get("claim", "?"))
        rows.append([c.get("verdict", "?"), cut(claim, 70), cut(str(measured), 90), against, cut(shown, 60)])
    print_table(["verdict", "claim", "measured", "margin vs noise", "premise"], rows, title="claims", align="lllll")
    print("  counts: " + ", ".join(f"{k} {v}" for k, v in tally(records).items()) + " (full texts: results.json)")


def baseline_note(corpus: str | None, value: float | None) -> str:
    """``corpus``'s unigram-entropy baseline ``value`` (nats) as a caption clause (empty without a value)."""
    if not isinstance(value, (int, float)):
        return ""
    return t("key.baseline", corpus=corpus or "?", value=num(value), ppl=num(math.exp(value)))


def runs_table(results: dict, label: str) -> Table:
    """The seeded runs of :func:`train_seeded` (``results["runs"]``: arm -> per-seed summaries), best arm first:
    whole-split and best validation loss, parameters and speed, mean ± sd over seeds. ``label``: the message id of
    the arm column."""
    rows = []
    for name, runs in results["runs"].items():
        runs = runs if isinstance(runs, list) else [runs]
        values = [x.get("val_loss_all", x.get("final_val_loss")) for x in runs]
        mean = sum(values) / len(values)
        row = (
            name,
            spread(values),
            spread([x.get("best_val_loss") for x in runs]),
            runs[0].get("n_params"),
            spread([x.get("tokens_per_s") for x in runs], 0),
        )
        rows.append((mean, row))
    rows.sort(key=lambda pair: pair[0] if isinstance(pair[0], (int, float)) else float("inf"))
    return Table(
        t(
            "key.train.caption",
            steps=results.get("steps"),
            corpus=results.get("corpus", "?"),
            seeds=results.get("seeds"),
            baseline=baseline_note(results.get("corpus"), results.get("unigram_entropy_nats")),
        ),
        (t(label), t("key.train.val"), t("key.train.best"), t("key.train.params"), "tokens/s"),
        tuple(row for _, row in rows),
    )
