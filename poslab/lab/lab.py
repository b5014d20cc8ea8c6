"""``poslab lab``: run every experiment of the lessons and write one self-contained ``report.html``.

Every step is one experiment (``python -m poslab experiment NAME`` as a subprocess, into
``LAB/experiments/NAME``, its output kept in ``LAB/logs/experiments_NAME.log``), one after another, all sharing
the lab model store ``LAB/models`` (:mod:`poslab.lab.experiments.lab_models`): first the foundation experiments,
then the training experiments of tier ``lab`` (and, in the full lab, ``full``); then ``LAB/report.html``
(:func:`poslab.lab.report.build_report`). ``--size`` and ``--seeds`` go to the steps that take them; ``--shard i/N``
runs only the training experiments' i-th slice of their trainings and records it in
``LAB/shards/lab-I-of-N.json``, and a last call without it collects.

A step whose folder holds a finished result of the same mode, size and seeds (recorded in ``LAB/lab.json``) is
reused unless ``--fresh``; an interrupted step keeps its folder and its trainings resume from their checkpoints; a
failed step is recorded and its dependants are skipped. docs/lab.md describes the progress line and the ETA.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from poslab.jobs.sweep import PARENT_ENV
from poslab.training.progress import format_duration

#: the exit status of a ``poslab`` command stopped by Ctrl-C or a signal (it saved what it trained)
INTERRUPTED = 130
MODES = ("quick", "full")


@dataclass
class Step:
    """One unit of the lab: one experiment.

    Attributes:
        name: the experiment's name.
        folder: output folder relative to the lab folder.
        argv: arguments of ``python -m poslab``.
        done_file: the file whose presence (with a matching manifest entry) marks the step finished.
        needs: folders of the steps this one runs after (:attr:`~poslab.lab.experiments.common.Experiment.after`);
            rerun when one of them is.
        estimate: expected seconds (the experiment's own estimate, or the last run's time).
        command: the full command line instead of ``python -m poslab ARGV`` (tests).
        size, seeds: the size's values and the seeds per arm given to the step (``None``: its default); a
            finished result of another size or seeds is not reused.
    """

    name: str
    folder: str
    argv: list[str]
    done_file: str = "results.json"
    needs: tuple[str, ...] = ()
    estimate: float = 10.0
    command: list[str] | None = None
    size: dict | None = None
    seeds: int | None = None


def plan(
    lab_dir: Path,
    mode: str,
    size: str | None = None,
    shard: tuple[int, int] | None = None,
    seeds: int | None = None,
) -> list[Step]:
    """The lab's steps for ``mode`` (``quick`` or ``full``), tier by tier in registry order.

    ``size`` and ``seeds`` go to the experiments that take them; ``shard`` ``(i, N)``: only the training
    experiments, each with ``--shard i/N``, its done file the shard's record (:func:`poslab.jobs.runner.shard_file`).
    """
    from poslab.jobs import runner
    from poslab.lab import experiments
    from poslab.lab.experiments.common import FOUNDATION, FULL_ONLY, LAB, Option
    from poslab.lab.experiments.lab_models import MODELS
    from poslab.lab.scale import define_size

    quick = ["--quick"] if mode == "quick" else []
    described = experiments.descriptions()
    tiers = (FOUNDATION, LAB) + ((FULL_ONLY,) if mode == "full" else ())
    sized = dataclasses.asdict(define_size(size)) if size is not None else None
    steps = []
    for tier in tiers:
        if shard is not None and tier == FOUNDATION:
            continue  # nothing to train: the collecting call computes them
        for name, experiment in described.items():
            if experiment.tier != tier:
                continue
            folder = lab_dir / "experiments" / name
            takes_size = sized is not None and experiment.takes(Option.SIZE)
            extra = ["--size", str(size)] if takes_size else []
            takes_seeds = seeds is not None and experiment.takes(Option.SEEDS)
            extra += ["--seeds", str(seeds)] if takes_seeds else []
            done = "results.json"
            if shard is not None:
                extra += ["--shard", f"{shard[0]}/{shard[1]}"]
                done = str(runner.shard_file("", shard))
            steps.append(
                Step(
                    name,
                    f"experiments/{name}",
                    ["experiment", name, "--out", str(folder), "--models", str(lab_dir / MODELS), *quick, *extra],
                    done_file=done,
                    needs=tuple(f"experiments/{n}" for n in experiment.after),
                    estimate=float(experiment.estimate[MODES.index(mode)]),
                    size=sized if takes_size else None,
                    seeds=seeds if takes_seeds else None,
                )
            )
    return steps


# ------------------------------------------------------------------------------------------ display
class Display:
    """The lab's progress: a status line redrawn in place on a terminal, plain lines otherwise."""

    def __init__(self, stream: TextIO | None = None, interval: float = 1.0, heartbeat: float = 60.0) -> None:
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.interval, self.heartbeat = interval, heartbeat
        self.lock = threading.Lock()
        self.status = ""
        self.detail = ""
        self.step_start = time.monotonic()
        self.lab_start = time.monotonic()
        self.remaining_after = 0.0  # estimated seconds of the steps after the current one
        self.estimate = 0.0
        self.label = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_beat = time.monotonic()

    def eta(self) -> float:
        elapsed = time.monotonic() - self.step_start
        return (
            max(self.estimate - elapsed, 0.1 * self.estimate if elapsed > self.estimate else 0.0) + self.remaining_after
        )

    def line(self) -> str:
        step = format_duration(time.monotonic() - self.step_start)
        total = format_duration(time.monotonic() - self.lab_start)
        text = f"lab {self.label} · {step} in step · {total} total · ETA ~{format_duration(self.eta())}"
        if self.detail:
            text += f" │ {self.detail}"
        width = shutil.get_terminal_size((120, 20)).columns - 1
        return text[:width]

    def begin(self, label: str, estimate: float, remaining_after: float) -> None:
        with self.lock:
            self.label, self.estimate, self.remaining_after = label, estimate, remaining_after
            self.step_start = time.monotonic()
            self.detail = ""
            self._clear()
            self.stream.write(f"\n━━ lab {label} · ETA ~{format_duration(estimate + remaining_after)} ━━\n")
            self._draw()

    def output(self, text: str, transient: bool = False) -> None:
        """A line of the running step's output (``transient``: a progress update ending in ``\\r``)."""
        with self.lock:
            if transient:
                self.detail = text.strip()
                self._draw()
                return
            self._clear()
            self.stream.write(text + "\n")
            if text.strip():
                self.detail = text.strip()
            self._draw()

    def message(self, text: str) -> None:
        with self.lock:
            self._clear()
            self.stream.write(text + "\n")
            self._draw()

    def finish(self, text: str) -> None:
        """The running step ended: print ``text`` and drop the status line until the next step."""
        with self.lock:
            self.label, self.detail = "", ""
        self.message(text)

    def _clear(self) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K")

    def _draw(self) -> None:
        if self.tty and self.label:
            self.stream.write("\r\x1b[K" + self.line())
        self.stream.flush()

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            with self.lock:
                if self.tty:
                    self._draw()
                elif time.monotonic() - self._last_beat >= self.heartbeat and self.label:
                    self._last_beat = time.monotonic()
                    self.stream.write(self.line() + "\n")
                    self.stream.flush()

    def __enter__(self) -> Display:
        self._thread = threading.Thread(target=self._tick, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        with self.lock:
            self._clear()
            self.label = ""
            self.stream.flush()


# ------------------------------------------------------------------------------------------ running
def run_step(step: Step, log_path: Path, display: Display, append: bool = False) -> tuple[int, str, float]:
    """Run one step as a subprocess; relay its output; return (exit code, last output lines, CPU seconds).

    ``append``: add to the step's log instead of replacing it (a step continuing its interrupted run).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", MPLBACKEND="Agg")
    env[PARENT_ENV] = str(os.getpid())  # the step gets SIGTERM (and saves) when the lab dies, SIGKILL included
    command = step.command or [sys.executable, "-m", "poslab", *step.argv]
    tail: list[str] = []
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(log_path, "a" if append else "w", encoding="utf-8") as log:
        log.write("$ " + " ".join(command) + "\n")
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        assert process.stdout is not None
        pending = b""

        def emit(text: str) -> None:
            nonlocal tail
            log.write(text + "\n")
            tail = (tail + [text])[-15:]
            display.output(text)

        try:
            while True:
                chunk = os.read(process.stdout.fileno(), 4096)
                if not chunk:
                    break
                pending += chunk
                while True:
                    cut = min((i for i in (pending.find(b"\n"), pending.find(b"\r")) if i >= 0), default=-1)
                    if cut < 0:
                        break
                    text = pending[:cut].decode("utf-8", errors="replace")
                    transient = pending[cut : cut + 1] == b"\r" and pending[cut + 1 : cut + 2] != b"\n"
                    pending = pending[cut + 1 :]
                    if transient:
                        display.output(text, transient=True)
                    else:
                        emit(text)
            if pending:
                emit(pending.decode("utf-8", errors="replace"))
            code = process.wait()
        except BaseException:
            _stop(process)
            raise
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return code, "\n".join(line for line in tail if line.strip()), cpu


def _stop(process: subprocess.Popen) -> None:
    """Stop a step's process group (Ctrl-C first, so a training step can save its checkpoint)."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=20)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()


def _read_json(path: Path) -> dict:
    """The JSON object in ``path``; ``{}`` if it is absent, unreadable, too deep or not an object."""
    from poslab.safe_load import load_json

    try:
        data = load_json(path.read_text(encoding="utf-8"), repr(str(path)))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_manifest(path: Path, manifest: dict) -> None:
    from poslab.fileio import atomic_write_json

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, manifest)


def _shard_outcome(path: Path) -> dict:
    """A sharded step's status (``sharded``, or ``ok`` when its experiment ran to the end) and what it trained."""
    record = _read_json(path)
    stages = record.get("stages") or []
    out: dict = {"status": "sharded" if record.get("status") == "sharded" else "ok", "stages": stages}
    if stages:
        last = stages[-1]
        out["trained"] = f"trained {last['trained']} of {last['total']} {last['what']}"
    return out


def _same_form(record: dict, step: Step) -> bool:
    """Whether ``record`` (a manifest's or a shard's) is of the step's size and seeds."""
    return record.get("size") == step.size and record.get("seeds") == step.seeds


def _finished(step: Step, lab_dir: Path, previous: dict, mode: str) -> bool:
    """Whether the step's result from an earlier run of the same mode can be reused."""
    record = previous.get("records", {}).get(step.folder, {})
    return (
        record.get("status") in ("ok", "reused")
        and record.get("mode") == mode
        and _same_form(record, step)
        and (lab_dir / step.folder / step.done_file).is_file()
    )


def _sharded_here(step: Step, lab_dir: Path, mode: str) -> bool:
    """Whether the step's folder holds shards (``poslab lab --shard``) of this mode and size: continued, not cleaned."""
    from poslab.jobs.runner import SHARDS_DIR

    folder = lab_dir / step.folder / SHARDS_DIR
    shards = sorted(folder.glob("*.json")) if folder.is_dir() else []
    return any(r.get("quick") == (mode == "quick") and _same_form(r, step) for r in map(_read_json, shards))


def run_lab(
    lab_dir: Path | str = Path("runs/lab"),
    mode: str = "quick",
    fresh: bool = False,
    only: list[str] | None = None,
    stream: TextIO | None = None,
    size: str | None = None,
    shard: tuple[int, int] | None = None,
    seeds: int | None = None,
) -> dict:
    """Run the lab and write ``lab_dir/report.html``; return the manifest written to ``lab_dir/lab.json``.

    Args:
        mode: ``quick`` (the demo; docs/lab.md gives its measured time) or ``full``.
        fresh: rerun every step even where a finished result of the same mode exists; without ``only``, the lab
            model store ``lab_dir/models`` is removed first.
        only: run only the steps with these names (plus reuse); others are left as they are.
        stream: where progress goes (default stderr).
        size, seeds: the size (:func:`poslab.lab.scale.define_size` spec) and seeds per arm (at least 3) of the
            steps that take them; steps of another size or seeds are rerun.
        shard: ``(i, N)``: train the i-th of N slices of the training experiments' trainings and stop (the
            manifest goes to ``lab_dir/shards/lab-I-of-N.json``, no report).

    Raises:
        ValueError: an unknown mode or step, a bad size (or a CUDA size without a GPU), fewer than 3
            seeds, ``fresh`` with ``shard`` (a fresh shard would delete the other shards' trainings).
    """
    from poslab.lab.experiments.lab_models import MODELS
    from poslab.lab.experiments.training import seeds_for
    from poslab.lab.report import build_report, machine_info
    from poslab.lab.scale import define_size
    from poslab.training.config import training_device

    if mode not in MODES:
        raise ValueError(f"lab mode must be one of {list(MODES)}, got {mode!r}")
    if shard is not None and fresh:
        raise ValueError(
            "--fresh cannot be combined with --shard: the shards share the lab folder, and a fresh shard "
            "would delete the other shards' trainings; start the lab folder afresh before the shards"
        )
    sized = define_size(size) if size is not None else None  # a bad size: one error before any step
    if seeds is not None:
        seeds_for(seeds)  # a bad number of seeds: one error before any step
    if sized is not None:
        training_device(sized.device)  # a CUDA size without a GPU: one error, not one per step
    lab_dir = Path(lab_dir)
    if lab_dir.exists() and not lab_dir.is_dir():
        raise ValueError(f"lab folder {str(lab_dir)!r} exists and is not a folder")
    lab_dir.mkdir(parents=True, exist_ok=True)
    previous = _read_json(lab_dir / "lab.json") if shard is None else {}
    if fresh and not only:
        _clean(lab_dir, MODELS)
    options = {k: v for k, v in (("size", size), ("shard", shard), ("seeds", seeds)) if v is not None}
    steps = plan(lab_dir, mode, **options)
    known = {s.name for s in steps}
    if only:
        unknown = [name for name in only if name not in known]
        if unknown:
            raise ValueError(f"unknown lab step(s) {unknown}; steps: {', '.join(s.name for s in steps)}")
    last_times = {r.get("folder"): r.get("seconds") for r in previous.get("steps", []) if r.get("mode") == mode}
    for step in steps:
        step.estimate = float(last_times.get(step.folder) or step.estimate)

    started = time.time()
    command = (
        "poslab lab "
        + ("--quick" if mode == "quick" else "--full")
        + (" --fresh" if fresh else "")
        + (f" --size {size}" if size is not None else "")
        + (f" --seeds {seeds}" if seeds is not None else "")
        + (f" --shard {shard[0]}/{shard[1]}" if shard else "")
    )
    manifest = {
        "mode": mode,
        "command": command,
        "size": dataclasses.asdict(sized) if sized is not None else None,
        "seeds": seeds,
        "started": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine_info(),
        "steps": [],
        "records": dict(previous.get("records", {})),
    }
    if shard is not None:
        manifest["shard"] = f"{shard[0]}/{shard[1]}"
    manifest_file = lab_dir / "shards" / f"lab-{shard[0]}-of-{shard[1]}.json" if shard else lab_dir / "lab.json"
    logs = lab_dir / "logs" / (f"shard-{shard[0]}-of-{shard[1]}" if shard else "")
    rerun: set[str] = set()
    failed: set[str] = set()
    interrupted = False
    with Display(stream) as display:
        for index, step in enumerate(steps):
            label = f"[{index + 1}/{len(steps)}] {step.name}"
            remaining = sum(
                s.estimate
                for s in steps[index + 1 :]
                if (not only or s.name in only) and (fresh or not _finished(s, lab_dir, previous, mode))
            )
            record = {
                "name": step.name,
                "folder": step.folder,
                "mode": mode,
                "size": step.size,
                "seeds": step.seeds,
            }
            blocked = [n for n in step.needs if n in failed]
            if blocked:
                record.update(status="skipped", error=f"needs {', '.join(blocked)}, which failed", seconds=0.0)
                display.message(f"━━ lab {label}: skipped (needs {', '.join(blocked)}, which failed)")
            elif interrupted or (only and step.name not in only):
                old = manifest["records"].get(step.folder)
                if old:
                    record = old
                else:
                    record.update(status="not run", seconds=0.0)
            elif not fresh and not any(n in rerun for n in step.needs) and _finished(step, lab_dir, previous, mode):
                old = previous["records"][step.folder]
                record.update(status="reused", seconds=old.get("seconds", 0.0), finished=old.get("finished"))
                display.message(f"━━ lab {label}: reused ({step.folder}, finished {old.get('finished', '?')})")
            else:
                if step.command is None and step.name not in _registered():
                    record.update(
                        status="unavailable", error=f"experiment {step.name!r} is not part of this poslab", seconds=0.0
                    )
                    failed.add(step.folder)
                    display.message(f"━━ lab {label}: unavailable in this poslab")
                else:
                    stopped = not fresh and _stopped(step, previous, mode)
                    # a shard never cleans (the other shards' trainings share the folder), nor does the call
                    # that collects shards of this mode and size (it reuses their trainings), nor a step that was
                    # stopped (its trainings continue from their checkpoints)
                    if not stopped and shard is None and (fresh or not _sharded_here(step, lab_dir, mode)):
                        _clean(lab_dir, step.folder)
                    display.begin(label, step.estimate, remaining)
                    if stopped:
                        display.message(
                            f"━━ lab {label}: continuing the interrupted step in {step.folder} (its trainings "
                            "resume from their checkpoints; --fresh starts it again)"
                        )
                    begin = time.monotonic()
                    cpu = None
                    try:
                        code, tail, cpu = run_step(
                            step, logs / f"{step.folder.replace('/', '_')}.log", display, append=stopped
                        )
                    except KeyboardInterrupt:
                        code, tail, interrupted = INTERRUPTED, "interrupted (Ctrl-C or a signal)", True
                    seconds = time.monotonic() - begin
                    record.update(
                        seconds=round(seconds, 1),
                        cpu_seconds=None if cpu is None else round(cpu, 1),
                        finished=dt.datetime.now().astimezone().isoformat(timespec="seconds"),
                    )
                    if code == 0 and (lab_dir / step.folder / step.done_file).is_file():
                        record["status"] = "ok"
                        rerun.add(step.folder)
                        done = f"done in {format_duration(seconds)}"
                        if shard is not None:
                            record.update(_shard_outcome(lab_dir / step.folder / step.done_file))
                            done = f"{record['status']} in {format_duration(seconds)}: {record.get('trained', '')}"
                        display.finish(f"━━ lab {label}: {done}")
                    else:
                        why = tail.splitlines()[-1] if tail else f"exit code {code}"
                        if code == 0:
                            why = f"finished without writing {step.folder}/{step.done_file}"
                        stop = interrupted or code == INTERRUPTED  # the lab's stop, or the step's own
                        record.update(status="interrupted" if stop else "failed", error=why, exit_code=code)
                        failed.add(step.folder)
                        display.finish(
                            f"━━ lab {label}: {record['status']} after {format_duration(seconds)}: {why} (log: {logs})"
                        )
            manifest["steps"].append(record)
            manifest["records"][step.folder] = record
            _write_manifest(manifest_file, manifest)
    manifest["finished"] = dt.datetime.now().astimezone().isoformat(timespec="seconds")
    manifest["seconds"] = round(time.time() - started, 1)
    _write_manifest(manifest_file, manifest)
    ok = sum(r["status"] in ("ok", "reused", "sharded") for r in manifest["steps"])
    if shard is not None:
        asked = sum(not only or s.name in only for s in steps)
        print(
            f"\nlab shard {shard[0]}/{shard[1]}: {ok} of {asked} training experiments did their part in "
            f"{format_duration(manifest['seconds'])} (record: {manifest_file}); once every shard is done, "
            f"collect with the same command without --shard",
            file=stream or sys.stderr,
        )
    else:
        report = build_report(lab_dir)
        print(
            f"\nlab: {ok} of {len(steps)} steps finished in {format_duration(manifest['seconds'])}; report: {report}",
            file=stream or sys.stderr,
        )
    if interrupted:
        raise KeyboardInterrupt
    return manifest


def succeeded(manifest: dict, only: list[str] | None = None) -> bool:
    """Whether every step that was asked for (all, or those in ``only``) finished (``ok``, ``reused``, or its shard
    ``sharded``)."""
    asked = [r for r in manifest["steps"] if not only or r.get("name") in only]
    return all(r.get("status") in ("ok", "reused", "sharded") for r in asked)


def _registered() -> set[str]:
    from poslab.lab import experiments

    return set(experiments.registry())


def _stopped(step: Step, previous: dict, mode: str) -> bool:
    """Whether the step's last run, of the same mode and size, was interrupted (a signal, Ctrl-C): its folder is
    kept, and its trainings continue from their checkpoints."""
    record = previous.get("records", {}).get(step.folder, {})
    return record.get("status") == "interrupted" and record.get("mode") == mode and _same_form(record, step)


def _clean(lab_dir: Path, folder: str) -> None:
    """Remove a step's previous output (or the lab model store) before rerunning it (only inside the lab folder)."""
    target = (lab_dir / folder).resolve()
    if lab_dir.resolve() not in target.parents:
        raise ValueError(f"refusing to clean {target}: outside the lab folder")
    if target.is_dir():
        shutil.rmtree(target)
