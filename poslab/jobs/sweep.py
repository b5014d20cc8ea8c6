"""``poslab sweep CONFIG.yaml --workers K``: a grid of training runs, K at a time, resumable.

``CONFIG.yaml`` (read with ``yaml.safe_load``, aliases bounded by :mod:`poslab.data.safe_yaml`)::

    name: pe-sweep              # optional; the sweep folder is OUT_DIR/NAME (default: the file's stem)
    out_dir: sweeps             # optional (default "sweeps")
    description: ...            # optional
    preset: tiny                # optional base preset: a name (`poslab presets`) or a .yaml file
    quick: false                # optional: the preset's --quick variant
    overrides:                  # optional: training keys on top of the preset, as `poslab train` takes
      max_steps: 200            #   them: TrainConfig fields, model.FIELD, model.position_config.KEY
      model.n_layer: 2          #   (dotted, or nested under `model:`)
    grid:                       # required: KEY -> list of values; every combination is one run
      model.position: [learned, rope, alibi]
      seed: [1, 2, 3]

Every combination of the grid is a separate ``poslab train`` subprocess, ``--workers`` at a time,
each writing its own run folder ``SWEEP_DIR/runs/NAME`` (``NAME`` = the grid values, e.g.
``position=rope,seed=2``), its log ``SWEEP_DIR/logs/NAME.log`` and the preset file it was started
from ``SWEEP_DIR/configs/NAME.yaml``. Running the same command again continues the sweep: finished
runs (completed, or diverged) are skipped, interrupted ones resume from their latest checkpoint
(``poslab train --resume``), failed ones start again; raising ``max_steps`` extends completed runs.
When a run's config does not set ``threads``, each subprocess gets ``OMP_NUM_THREADS = cores // K``.
The runs go through :func:`poslab.jobs.runner.train_many`: on this machine by default, as Ray tasks
with ``--cluster ray`` (a killed training is retried by Ray and resumes from its checkpoint), and
``--shard i/N`` runs only the i-th of N disjoint slices (a batch scheduler's job array); the call
without ``--shard`` writes the summary.

At the end the runs are grouped by their grid point without ``seed``, and ``final_val_loss`` and
``tokens_per_s`` are summarised as mean ± sample standard deviation over the seeds: printed, and
written to ``SWEEP_DIR/summary.json`` and ``SWEEP_DIR/summary.md``. ``summary.json``::

    {"sweep", "config_file", "sweep_dir", "grid", "group_by", "status": {completed, diverged, failed, ...},
     "configs": [{"label", "point", "runs", "completed", "seeds", "final_val_loss": {"mean", "std", "values"},
                  "tokens_per_s": {...}, "best_val_loss": {...}}],
     "runs": [{"name", "point", "status", "run_dir", "final_val_loss", "best_val_loss", "tokens_per_s", "steps",
               "error"}]}

A bad file (not YAML, unknown keys, a grid key that is no training key, an empty list, a bad value)
is a one-line error before anything runs (exit 2). Ctrl-C, SIGTERM or SIGHUP forward one SIGINT to
the running trainings (each saves a checkpoint), write the summary of what finished, and exit 130.
The trainings die with the sweep however it dies: each gets SIGTERM (and saves a checkpoint) when the
sweep's process is gone, SIGKILL included. A rerun that finds a run still held by a training of an
earlier sweep waits for it to let go, then continues (or skips) it, instead of failing it.

The call without ``--shard`` holds the sweep's lock while it runs and summarises: a second one started
meanwhile is refused in one line naming the first (exit 2). A training that finds its run taken by
another process anyway (a shard, another machine) is waited for and read again, never failed as in use.
"""

from __future__ import annotations

import difflib
import itertools
import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from poslab.checks import positive_int
from poslab.data import safe_yaml
from poslab.fileio import atomic_write_json, atomic_write_text
from poslab.jobs import runner
from poslab.nn.footprint import check_training
from poslab.training import presets

SPEC_KEYS = ("name", "out_dir", "description", "preset", "quick", "overrides", "grid")
REPLICATE_KEY = "seed"  # grid key whose values are replicates (averaged), not configurations
_RESERVED = {"name": "the sweep names each run", "out_dir": "runs go to SWEEP_DIR/runs"}
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")
#: the environment variable that makes a training follow its parent (``poslab.cli.app`` reads it)
PARENT_ENV = "POSLAB_PARENT_PID"
LOCK_POLL_S = 0.5  # how often a run still in use by another process is checked
WAIT_NOTICE_S = 60.0  # how often the wait for it is announced
#: how ``poslab train`` says another process holds the run (a second collector's training took it first)
IN_USE = "is in use by another poslab process"
IN_USE_RETRIES = 5  # starts of one run that found it taken by another process, before it counts as failed


@dataclass
class SweepRun:
    """One grid point: its run name, the grid values, and the full training config (a preset mapping)."""

    name: str
    point: dict[str, Any]
    config: dict[str, Any]
    max_steps: int = 0
    status: str = "pending"
    error: str | None = None
    results: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class SweepPlan:
    """A parsed sweep file: where it writes and every run."""

    name: str
    sweep_dir: Path
    config_file: Path
    grid: dict[str, list[Any]]
    description: str
    runs: list[SweepRun]

    @property
    def group_keys(self) -> list[str]:
        return [key for key in self.grid if key != REPLICATE_KEY]


# ------------------------------------------------------------------------------------------ parsing
def load_plan(path: str | Path, out: str | Path | None = None) -> SweepPlan:
    """Read and validate a sweep file; every run's config is checked before anything runs.

    Args:
        path: the sweep YAML.
        out: the sweep folder (default: ``out_dir/name`` from the file, ``sweeps/<file stem>``).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not YAML, not a mapping, unknown keys (with the close one suggested), an empty
            or non-list grid entry, a grid key that is no training key, or a run config that
            ``TrainConfig``/``GPTConfig``/the position scheme rejects (the run named).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"sweep file {str(path)!r} does not exist")
    try:
        spec = safe_yaml.load(path.read_text(encoding="utf-8"), f"sweep file {str(path)!r}")  # refuses alias bombs
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        at = f" (line {where.line + 1}, column {where.column + 1})" if where is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ValueError(f"sweep file {str(path)!r} is not valid YAML{at}: {problem}") from None
    except UnicodeDecodeError:
        raise ValueError(f"sweep file {str(path)!r} is not UTF-8 text") from None
    if not isinstance(spec, dict):
        raise ValueError(f"sweep file {str(path)!r} must hold a mapping with a 'grid', got {type(spec).__name__}")
    for key in spec:
        if key not in SPEC_KEYS:
            close = difflib.get_close_matches(str(key), SPEC_KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"sweep file {str(path)!r}: unknown key {key!r}{hint}; allowed: {', '.join(SPEC_KEYS)}")
    name = spec.get("name", path.stem)
    if not isinstance(name, str) or not name or _UNSAFE.sub("", name) != name:
        raise ValueError(f"sweep name must be a plain folder name (letters, digits, . _ + -), got {name!r}")
    out_dir = spec.get("out_dir", "sweeps")
    if not isinstance(out_dir, str):
        raise ValueError(f"out_dir must be a string, got {out_dir!r}")
    quick = spec.get("quick", False)
    if not isinstance(quick, bool):
        raise ValueError(f"quick must be true or false, got {quick!r}")
    description = spec.get("description", "")
    base: dict[str, Any] = {}
    if spec.get("preset") is not None:
        if not isinstance(spec["preset"], str):
            raise ValueError(f"preset must be a preset name or a .yaml path, got {spec['preset']!r}")
        base = presets.preset_config(spec["preset"], quick=quick)
    elif quick:
        raise ValueError("quick: true needs a preset")
    overrides = _nest(spec.get("overrides") or {}, "overrides")
    grid = spec.get("grid")
    if not isinstance(grid, dict) or not grid:
        raise ValueError(
            f"sweep file {str(path)!r} needs a non-empty 'grid' mapping KEY -> [values], e.g. "
            f"grid: {{model.position: [learned, rope], seed: [1, 2]}}"
        )
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"grid entry {key!r} must be a non-empty list of values, got {values!r}")
        _nest({key: values[0]}, "grid")  # the key must be a training key
        if len({json.dumps(v, sort_keys=True) for v in values}) != len(values):
            raise ValueError(f"grid entry {key!r} repeats a value: {values!r}")

    from poslab.config import merge

    runs: list[SweepRun] = []
    names: dict[str, dict] = {}
    for combination in itertools.product(*grid.values()):
        point = dict(zip(grid, combination))
        run_name = run_name_of(point)
        if run_name in names:
            raise ValueError(
                f"grid points {names[run_name]} and {point} get the same run name {run_name!r}; "
                f"use values that differ after replacing characters outside [A-Za-z0-9._+-]"
            )
        names[run_name] = point
        config = merge(merge(base, overrides), _nest(point, "grid"))
        try:
            max_steps = _check_config(config, run_name)
        except (ValueError, TypeError) as err:
            raise ValueError(f"sweep file {str(path)!r}, run {run_name}: {err}") from None
        runs.append(SweepRun(run_name, point, config, max_steps))
    sweep_dir = Path(out) if out is not None else Path(out_dir) / name
    return SweepPlan(name, sweep_dir, path, grid, str(description), runs)


def _nest(mapping: Any, where: str) -> dict[str, Any]:
    """Dotted/nested training keys -> the nested overrides ``poslab.config.merge`` takes (:func:`poslab.config.nest`,
    the parser ``poslab train --KEY VALUE`` uses too)."""
    from poslab.config import nest

    if not isinstance(mapping, dict):
        raise ValueError(f"{where} must be a mapping of training keys, got {mapping!r}")
    return nest(mapping.items(), where=where, reserved=_RESERVED)


def _check_config(config: dict[str, Any], run_name: str) -> int:
    """What ``poslab train`` would reject about this config (:func:`poslab.config.preflight`, as
    ``poslab train --dry-run``), found before anything runs; returns max_steps."""
    from poslab.config import preflight
    from poslab.training.config import TrainConfig

    cfg = TrainConfig.from_dict({**config, "name": run_name})
    preflight(cfg, folder=False)
    check_training(cfg.model, cfg.batch_size, cfg.eval_iters)  # what cannot fit this machine, before anything runs
    return cfg.max_steps


def run_name_of(point: dict[str, Any]) -> str:
    """``{"model.position": "rope", "seed": 2}`` -> ``"position=rope,seed=2"`` (a safe folder name)."""
    parts = []
    for key, value in point.items():
        short = key[len("model.") :] if key.startswith("model.") else key
        text = json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)
        parts.append(f"{short}={_UNSAFE.sub('_', text).strip('_') or '_'}")
    return ",".join(parts)


# ------------------------------------------------------------------------------------------ running
def run_state(run_dir: Path, max_steps: int) -> str:
    """``"done"``, ``"diverged"``, ``"resume"`` (a run folder to continue) or ``"new"`` (from
    :attr:`RunFolder.state`)."""
    from poslab.runs import RunFolder

    run = RunFolder(run_dir)
    state = run.state
    if state == "failed":
        return "diverged"
    if state == "finished" and run.finished(max_steps):
        return "done"
    return "resume" if run.is_run else "new"


def _command(sweep_dir: Path, run: SweepRun, state: str) -> list[str]:
    """The ``poslab train`` command of one grid point (``--resume`` to continue its folder)."""
    cmd = [
        sys.executable,
        "-m",
        "poslab",
        "train",
        "--preset",
        str(sweep_dir / "configs" / f"{run.name}.yaml"),
        "--name",
        run.name,
        "--out_dir",
        str(sweep_dir / "runs"),
        "--no-progress",
    ]
    if state == "resume":
        cmd.append("--resume")
    return cmd


def _wait_until_free(run: SweepRun, run_dir: Path, echo: Any) -> bool:
    """Wait while another process (e.g. a training of a killed sweep, saving) holds the run's lock.

    Returns:
        ``False`` if the sweep is being stopped meanwhile.
    """
    from poslab.training.lock import RunLock, RunLockedError

    said = 0.0
    while not runner.children.stopping.is_set():
        try:
            RunLock(run_dir).acquire().release()
            return True
        except RunLockedError as err:
            if time.monotonic() - said > WAIT_NOTICE_S:
                said = time.monotonic()
                echo(f"sweep: waiting for {run.name}: {str(err).split('; wait')[0]}")
        runner.children.stopping.wait(LOCK_POLL_S)
    return False


def train_point(sweep_dir: str, plan_name: str, run: SweepRun, threads: int) -> SweepRun:
    """Train one grid point as a ``poslab train`` child process (a :class:`poslab.jobs.runner.Task` function).

    Resumable: a finished run is read back, an interrupted one continues from its latest checkpoint
    (``--resume``). A training killed by a signal from outside raises
    :class:`~poslab.jobs.runner.TrainingLost`, so Ray runs this again and it resumes.

    Args:
        sweep_dir: the sweep folder (on storage every node sees, under Ray).
        plan_name: the sweep's name (the preset file's description).
        run: the grid point.
        threads: ``OMP_NUM_THREADS`` of the training when its config does not set ``threads``.

    Returns:
        ``run`` with its status, error, results and seconds filled in.
    """
    folder = Path(sweep_dir)
    if runner.children.stopping.is_set():
        run.status = "not started"
        return run
    run_dir = folder / "runs" / run.name
    for _ in range(IN_USE_RETRIES):
        if not _wait_until_free(run, run_dir, print):
            run.status = "not started"
            return run
        state = run_state(run_dir, run.max_steps)  # what the previous holder left
        if state in ("done", "diverged"):
            run.status = "completed" if state == "done" else "diverged"
            run.results = _read_results(run_dir)
            return run
        _launch(folder, plan_name, run, threads, state)
        after = run_state(run_dir, run.max_steps)
        if run.status == "failed" and after in ("done", "diverged"):  # finished by another process meanwhile
            run.status, run.error = ("completed" if after == "done" else "diverged"), None
            run.results = _read_results(run_dir)
        if not (run.status == "failed" and IN_USE in (run.error or "")):
            return run
        # another process took the run between the wait and the start: wait for it and look again
    return run


def _launch(folder: Path, plan_name: str, run: SweepRun, threads: int, state: str) -> None:
    """Start one training of ``run`` from ``state`` and fill in its status, error, results and seconds."""
    run_dir = folder / "runs" / run.name
    run.error = None
    preset_file = folder / "configs" / f"{run.name}.yaml"
    atomic_write_text(
        preset_file,
        yaml.safe_dump(
            {"description": f"sweep {plan_name}: {run.name}", "config": run.config}, sort_keys=False, allow_unicode=True
        ),
    )
    env = dict(os.environ)
    if run.config.get("threads") is None:
        env["OMP_NUM_THREADS"] = str(threads)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)  # each run is its own single-process training
    env[PARENT_ENV] = str(os.getpid())  # the training stops (and saves) if this process dies, even by SIGKILL
    log_path = folder / "logs" / f"{run.name}.log"
    start = time.perf_counter()
    cmd = _command(folder, run, state)
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
        log.flush()
        try:
            returncode = runner.launch(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        except KeyboardInterrupt:  # Ctrl-C in this thread (one run at a time) or ray.cancel: the training saved
            runner.children.stopping.set()  # and no further run starts here
            raise
    run.seconds = time.perf_counter() - start
    run.results = _read_results(run_dir)
    if returncode == 0 and run.results.get("status") == "completed":
        run.status = "completed"
    elif run.results.get("status") == "diverged":
        run.status = "diverged"
        run.error = f"diverged at step {run.results.get('diverged_at_step')}"
    elif returncode == 130:
        run.status = "interrupted"
    elif returncode < 0 and not runner.children.stopping.is_set():
        raise runner.TrainingLost(
            f"sweep run {run.name}: the training was killed by signal {-returncode} "
            f"(its last checkpoint is kept; the next attempt resumes from it)"
        )
    else:
        run.status = "failed"
        run.error = f"exit {returncode}: {_last_error(log_path)}"


def _read_results(run_dir: Path) -> dict[str, Any]:
    from poslab.runs import RunFolder

    try:
        return RunFolder(run_dir).results() or {}
    except (OSError, ValueError):
        return {}


def _last_error(log_path: Path) -> str:
    """The last ``poslab: error:`` line of a log (else its last non-empty line)."""
    try:
        lines = [line.strip() for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines()]
    except OSError:
        return "no log"
    errors = [line for line in lines if line.startswith("poslab: error:")]
    if errors:
        return errors[-1][len("poslab: error:") :].strip()
    lines = [line for line in lines if line and not line.startswith("===")]
    return lines[-1] if lines else "no output"


def run_sweep(
    plan: SweepPlan, workers: int = 1, echo: Any = print, shard: tuple[int, int] | None = None
) -> dict[str, Any]:
    """Run every unfinished run of ``plan`` through :func:`poslab.jobs.runner.train_many`, then summarise.

    The current executor decides where the trainings run: ``workers`` at a time on this machine (the
    default), or as Ray tasks (``--cluster ray``). With ``shard=(i, N)`` only the i-th of N disjoint
    slices of the grid runs (:func:`poslab.jobs.runner.select_shard`) and no summary is written: a
    last call without a shard runs what is left, if anything, and writes the summary of every run.

    Raises:
        ValueError: ``workers`` < 1; a run reported finished whose folder this process cannot see
            (run folders must be on storage every node sees).
        KeyboardInterrupt: after Ctrl-C, once the running trainings have saved and the summary is written.
    """
    positive_int("--workers", workers)
    lock = None if shard is not None else _sweep_lock(plan)
    try:
        return _run_sweep(plan, workers, echo, shard)
    finally:
        if lock is not None:
            lock.release()


def _sweep_lock(plan: SweepPlan) -> Any:
    """The sweep's lock (:class:`poslab.training.lock.RunLock` of its folder), held by the collector that runs
    and summarises the whole sweep; a second one is refused naming the first. Shards (``--shard``) run side
    by side and do not take it: each run's own lock keeps them apart.

    Raises:
        RunLockedError: another live process collects this sweep (the message names it).
    """
    from poslab.training.lock import RunLock, RunLockedError

    try:
        return RunLock(plan.sweep_dir).acquire()
    except RunLockedError as err:
        holder = re.search(r"\((pid [^)]*)\)", str(err))
        raise RunLockedError(
            f"sweep {str(plan.sweep_dir)!r} is in use by another poslab sweep "
            f"({holder.group(1) if holder else 'its lock is held'}); wait for it to finish or stop it"
        ) from None


def _run_sweep(plan: SweepPlan, workers: int, echo: Any, shard: tuple[int, int] | None) -> dict[str, Any]:
    """:func:`run_sweep`'s work, under the sweep's lock when it collects the whole sweep."""
    for folder in ("runs", "configs", "logs"):
        (plan.sweep_dir / folder).mkdir(parents=True, exist_ok=True)
    atomic_write_json(
        plan.sweep_dir / "sweep.json",
        {
            "sweep": plan.name,
            "config_file": str(plan.config_file),
            "description": plan.description,
            "grid": plan.grid,
            "runs": [{"name": r.name, "point": r.point, "config": r.config} for r in plan.runs],
        },
    )
    mine = runner.select_shard(plan.runs, shard)
    todo = []
    for run in mine:
        state = run_state(plan.sweep_dir / "runs" / run.name, run.max_steps)
        if state in ("done", "diverged"):
            run.status = "completed" if state == "done" else "diverged"
            run.results = _read_results(plan.sweep_dir / "runs" / run.name)
        else:
            todo.append((run, state))
    skipped = len(mine) - len(todo)
    resumed = sum(state == "resume" for _, state in todo)
    executor = runner.current_executor()
    where = f"{workers} at a time" if executor.name == "local" else f"on {executor.name}"
    part = f" (shard {shard[0]}/{shard[1]}: {len(mine)} of {len(plan.runs)} runs)" if shard else ""
    echo(
        f"sweep {plan.name}{part}: {len(mine)} runs ({skipped} finished before, {resumed} to resume, "
        f"{len(todo) - resumed} new), {where} -> {plan.sweep_dir}"
    )
    # threads of a training whose config sets none: this machine's cores shared by the K local trainings;
    # on Ray one (a task requests what it uses; Ray packs the tasks onto the nodes' CPUs)
    threads = max(1, (os.cpu_count() or 1) // workers) if executor.name == "local" else 1
    tasks = [
        runner.Task(
            run.name,
            train_point,
            (str(plan.sweep_dir), plan.name, run, threads),
            cpus=int(run.config.get("threads") or threads),
            gpus=runner.gpus_for(run.config),
            launches_process=True,
        )
        for run, _ in todo
    ]
    by_name = {run.name: run for run in plan.runs}
    done = 0

    def finished(task: runner.Task, result: SweepRun) -> None:
        nonlocal done
        run = by_name[result.name]
        run.status, run.error, run.results, run.seconds = result.status, result.error, result.results, result.seconds
        if run.status == "completed" and not (plan.sweep_dir / "runs" / run.name / "results.json").is_file():
            raise ValueError(
                f"run {run.name} finished, but its results are not at "
                f"{str(plan.sweep_dir / 'runs' / run.name)!r} here: the sweep folder must be on "
                f"storage every node sees (a shared file system; docs/scaling.md)"
            )
        done += 1
        val = run.results.get("final_val_loss")
        figure = f"val {val:.4f}" if isinstance(val, (int, float)) else (run.error or "")
        echo(f"[{done}/{len(todo)}] {run.status:<11} {run.name}  {figure}  ({run.seconds:.0f}s)")

    interrupted = False
    runner.children.stopping.clear()
    try:
        runner.train_many(tasks, workers, finished)
    except KeyboardInterrupt:
        interrupted = True
        echo("sweep: Ctrl-C: the running trainings stopped (each saved a checkpoint)")
    finally:
        runner.children.stopping.clear()
    if shard is not None and not interrupted:
        counts: dict[str, int] = {}
        for run in mine:
            counts[run.status] = counts.get(run.status, 0) + 1
        echo(
            f"shard {shard[0]}/{shard[1]} done: "
            + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
            + "; run the sweep without --shard to write the summary"
        )
        return {
            "sweep": plan.name,
            "shard": list(shard),
            "status": counts,
            "runs": [{"name": r.name, "status": r.status} for r in mine],
        }
    summary = summarize(plan)
    write_summary(plan, summary)
    echo(format_table(summary))
    echo(f"summary: {plan.sweep_dir / 'summary.json'}, {plan.sweep_dir / 'summary.md'}")
    if interrupted:
        echo("sweep interrupted; run the same command again to continue")
        raise KeyboardInterrupt
    return summary


# ------------------------------------------------------------------------------------------ summary
def _stats(values: list[float]) -> dict[str, Any]:
    """``{"mean", "std" (sample, n-1; None below 2 values), "values"}``."""
    if not values:
        return {"mean": None, "std": None, "values": []}
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else None
    return {"mean": mean, "std": std, "values": values}


def summarize(plan: SweepPlan) -> dict[str, Any]:
    """Group the runs by their grid point without ``seed``; mean ± std of the final figures."""
    for run in plan.runs:  # runs not touched this time: read what their folders hold
        if run.status == "pending":
            run_dir = plan.sweep_dir / "runs" / run.name
            state = run_state(run_dir, run.max_steps)
            run.status = {"done": "completed", "diverged": "diverged", "resume": "unfinished"}.get(state, "not started")
            run.results = _read_results(run_dir)
    groups: dict[str, list[SweepRun]] = {}
    for run in plan.runs:
        key_point = {k: v for k, v in run.point.items() if k != REPLICATE_KEY}
        groups.setdefault(run_name_of(key_point) if key_point else "all", []).append(run)
    configs = []
    for label, members in groups.items():
        completed = [r for r in members if r.status == "completed"]
        configs.append(
            {
                "label": label,
                "point": {k: v for k, v in members[0].point.items() if k != REPLICATE_KEY},
                "runs": len(members),
                "completed": len(completed),
                "seeds": [r.point.get(REPLICATE_KEY, r.config.get("seed")) for r in completed],
                "final_val_loss": _stats([r.results["final_val_loss"] for r in completed]),
                "best_val_loss": _stats(
                    [r.results["best_val_loss"] for r in completed if r.results.get("best_val_loss") is not None]
                ),
                "tokens_per_s": _stats([r.results["tokens_per_s"] for r in completed if r.results.get("tokens_per_s")]),
            }
        )
    status: dict[str, int] = {}
    for run in plan.runs:
        status[run.status] = status.get(run.status, 0) + 1
    return {
        "sweep": plan.name,
        "description": plan.description,
        "config_file": str(plan.config_file),
        "sweep_dir": str(plan.sweep_dir),
        "grid": plan.grid,
        "group_by": plan.group_keys,
        "status": status,
        "configs": configs,
        "runs": [
            {
                "name": r.name,
                "point": r.point,
                "status": r.status,
                "run_dir": str(plan.sweep_dir / "runs" / r.name),
                "final_val_loss": r.results.get("final_val_loss"),
                "best_val_loss": r.results.get("best_val_loss"),
                "tokens_per_s": r.results.get("tokens_per_s"),
                "steps": r.results.get("steps"),
                "error": r.error,
            }
            for r in plan.runs
        ],
    }


def _pm(stats: dict[str, Any], digits: int) -> str:
    if stats["mean"] is None:
        return "-"
    text = f"{stats['mean']:.{digits}f}"
    return text + (f" ± {stats['std']:.{digits}f}" if stats["std"] is not None else "")


def format_table(summary: dict[str, Any]) -> str:
    """The summary as a markdown table: one row per configuration."""
    lines = [
        "| config | completed/runs | final val loss (mean ± std) | tokens/s (mean ± std) |",
        "|---|---|---|---|",
    ]
    for config in summary["configs"]:
        lines.append(
            f"| {config['label']} | {config['completed']}/{config['runs']} | "
            f"{_pm(config['final_val_loss'], 4)} | {_pm(config['tokens_per_s'], 0)} |"
        )
    counts = ", ".join(f"{n} {status}" for status, n in sorted(summary["status"].items()))
    return "\n".join(lines) + f"\n\n{counts}; std is the sample standard deviation over seeds (n-1)."


def write_summary(plan: SweepPlan, summary: dict[str, Any]) -> None:
    """``summary.json`` and ``summary.md`` in the sweep folder (atomic writes)."""
    atomic_write_json(plan.sweep_dir / "summary.json", summary)
    header = f"# Sweep {plan.name}\n\n" + (f"{plan.description}\n\n" if plan.description else "")
    header += f"Config: `{plan.config_file}`; grid: " + ", ".join(f"`{k}` = {v}" for k, v in plan.grid.items()) + "\n\n"
    atomic_write_text(plan.sweep_dir / "summary.md", header + format_table(summary) + "\n")


__all__ = [
    "SweepPlan",
    "SweepRun",
    "format_table",
    "load_plan",
    "run_name_of",
    "run_state",
    "run_sweep",
    "summarize",
    "train_point",
    "write_summary",
]
