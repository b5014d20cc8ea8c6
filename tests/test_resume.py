"""Kill ``poslab train`` with SIGKILL at any moment, resume with ``--resume``, lose nothing.

A Transformer-XL (``--memory``) run resumes bitwise too: its segment memory is part of each checkpoint.

An uninterrupted ``python -m poslab train`` run (a fresh interpreter) is the reference. The same run
is then started, SIGKILLed and resumed again and again until it completes; at the end its loss curve
(``metrics.jsonl``: loss, lr, grad_norm, val_loss of every logged step) and its final weights,
optimizer state and RNG states must equal the reference bitwise, ``metrics.jsonl`` must hold each
step once with no torn line, and after every kill the ``latest`` checkpoint (and every listed one)
must load and verify.

Starting a Python with torch takes seconds on this machine, so the killed processes are forked
from a "zygote" process that has imported poslab once: each is a separate process running
``poslab.cli.app.main(["train", ...])`` (what the ``poslab`` script runs) and is killed with SIGKILL by
this test. Where the kills land:

* inside every step of a checkpoint write: the child announces each phase on a pipe (tensor file
  written, each rename, each pruning unlink) and, when the test targets that phase, holds still
  there until the SIGKILL arrives, so the kill lands exactly between the temporary write and the
  rename (a "partial" variant truncates the temporary tensor file first, like a kill mid-write);
* at start-up (before ``config.json`` exists, and during the metrics rewrite of a resume);
* at random moments: a random delay after the start, or a random fraction of a step after the
  j-th checkpoint of the launch.

Run as a script with ``--zygote`` it is that zygote (reads jobs as JSON lines on stdin).
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMPARED_OUT = ("tokens_per_s", "time_s")  # timings: the only fields that may differ

# a phase kill: {"phase": ..., "match": [prefix of the file name, then substrings], "occurrence": n}
PHASE_PLANS: list[dict[str, Any]] = [
    {"phase": "replace", "match": ["tokenizer.json"], "occurrence": 1, "kind": "start"},  # fresh start, first write
    {"phase": "replace", "match": ["config.json"], "occurrence": 1, "kind": "start"},  # before config.json exists
    {"phase": "tensors-partial", "match": [".step_"], "occurrence": 3, "kind": "checkpoint"},
    {"phase": "replace", "match": ["step_", ".safetensors"], "occurrence": 2, "kind": "checkpoint"},
    {"phase": "replace", "match": ["step_", ".json"], "occurrence": 2, "kind": "checkpoint"},
    {"phase": "replace", "match": ["latest"], "occurrence": 2, "kind": "checkpoint"},
    {"phase": "unlink", "match": ["step_"], "occurrence": 2, "kind": "checkpoint"},  # pruning old checkpoints
    {"phase": "metrics-torn", "match": [], "occurrence": 2, "kind": "metrics"},
    {"phase": "replace", "match": ["metrics.jsonl"], "occurrence": 1, "kind": "start"},  # the resume's rewrite
]


# ------------------------------------------------------------------------------------------ zygote
def _zygote() -> None:  # pragma: no cover - runs in its own process
    """Import once, then fork one child per job line; report pids, phases and exit statuses."""
    import torch._dynamo  # noqa: F401  (AdamW imports it lazily: seconds, paid once here)

    import poslab.cli.app  # noqa: F401
    import poslab.runs  # noqa: F401
    import poslab.session  # noqa: F401
    import poslab.training.checkpoint  # noqa: F401
    import poslab.training.loop  # noqa: F401

    out = sys.stdout
    out.write(json.dumps({"event": "ready"}) + "\n")
    out.flush()
    while True:
        line = sys.stdin.readline()
        if not line:
            return
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(job)
        out.write(json.dumps({"event": "started", "pid": pid}) + "\n")
        out.flush()
        _, status = os.waitpid(pid, 0)
        signaled = os.WIFSIGNALED(status)
        out.write(
            json.dumps(
                {
                    "event": "exited",
                    "pid": pid,
                    "signal": os.WTERMSIG(status) if signaled else None,
                    "code": None if signaled else os.WEXITSTATUS(status),
                }
            )
            + "\n"
        )
        out.flush()


def _child(job: dict) -> None:  # pragma: no cover - runs in a forked process
    code = 99
    try:
        marker = os.dup(1)
        log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        _install_hooks(marker, job.get("pause"))
        import poslab.cli.app

        code = poslab.cli.app.main(job["argv"])
    except SystemExit as err:
        code = err.code if isinstance(err.code, int) else 2
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _install_hooks(marker: int, pause: dict | None) -> None:  # pragma: no cover - runs in a forked process
    """Announce every checkpoint/metrics write phase on ``marker``; hold still at the targeted one."""
    import pathlib

    import poslab.runs.files as runs_module  # the metrics appender is the run folder's
    import poslab.training.checkpoint as ckpt

    seen = [0]

    def targeted(phase: str, detail: str) -> bool:
        match = pause["match"] if pause is not None else []
        if pause is None or phase != pause["phase"] or not (not match or detail.startswith(match[0])):
            return False
        if not all(m in detail for m in match[1:]):
            return False
        seen[0] += 1
        return seen[0] == pause["occurrence"]

    def emit(phase: str, detail: str, hold: bool) -> None:
        event = {
            "event": "phase",
            "pid": os.getpid(),
            "phase": phase,
            "detail": detail,
            "paused": hold,
            "t": time.monotonic(),
        }
        os.write(marker, (json.dumps(event) + "\n").encode())
        if hold:
            time.sleep(600)  # the SIGKILL arrives here

    real_replace, real_unlink = os.replace, pathlib.Path.unlink
    real_save_file, real_save_checkpoint, real_append = ckpt.save_file, ckpt.save_checkpoint, runs_module.append_line

    def replace(src, dst, *args, **kwargs):
        name = Path(dst).name
        emit("replace", name, targeted("replace", name))  # the temporary file is complete and fsynced
        return real_replace(src, dst, *args, **kwargs)

    def unlink(self, *args, **kwargs):
        emit("unlink", self.name, targeted("unlink", self.name))
        return real_unlink(self, *args, **kwargs)

    def save_file(tensors, filename, metadata=None):
        real_save_file(tensors, filename, metadata=metadata)
        name = Path(filename).name
        hold = targeted("tensors-partial", name)
        if hold:  # a kill in the middle of writing the temporary tensor file
            os.truncate(filename, os.path.getsize(filename) // 2)
        emit("tensors-partial" if hold else "tensors-written", name, hold)

    def save_checkpoint(run_dir, step, *args, **kwargs):
        emit("ckpt-begin", str(step), False)
        result = real_save_checkpoint(run_dir, step, *args, **kwargs)
        emit("ckpt-end", str(step), False)
        return result

    def append_line(handle, line):
        if targeted("metrics-torn", line):  # a kill half-way through a metrics line
            handle.write((line + "\n").encode()[: len(line) // 2])
            emit("metrics-torn", line[:40], True)
        real_append(handle, line)
        emit("metrics-line", line[:40], False)

    os.replace = replace
    pathlib.Path.unlink = unlink
    ckpt.save_file = save_file
    ckpt.save_checkpoint = save_checkpoint
    runs_module.append_line = append_line


class Zygote:
    """The test's handle on the zygote process: launch jobs, read their events, kill them."""

    def __init__(self, cwd: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
            cwd=cwd,
        )
        self.events: queue.Queue = queue.Queue()
        self.pending: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()
        assert self.next(lambda e: e["event"] == "ready", 300)["event"] == "ready"

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.events.put(json.loads(line))
        self.events.put({"event": "eof"})

    def next(self, wanted, timeout: float) -> dict | None:
        """The next event satisfying ``wanted`` (earlier ones are handed to ``self.seen``), or ``None``."""
        deadline = time.monotonic() + timeout
        while self.pending:  # events that arrived while waiting for "started"
            event = self.pending.pop(0)
            if wanted(event):
                return event
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                event = self.events.get(timeout=left)
            except queue.Empty:
                return None
            self.seen(event)
            if event["event"] == "eof":
                raise RuntimeError("the zygote died")
            if wanted(event):
                return event

    def seen(self, event: dict) -> None:
        if event["event"] == "phase":
            self.last_phase = event
            self.phases.append(event)

    def launch(self, argv: list[str], log: Path, pause: dict | None = None) -> int:
        self.last_phase: dict | None = None
        self.phases: list[dict] = []
        self.pending = []
        self.proc.stdin.write(json.dumps({"argv": argv, "log": str(log), "pause": pause}) + "\n")
        self.proc.stdin.flush()
        while True:
            event = self.events.get(timeout=60)
            self.seen(event)
            if event["event"] == "started":
                return event["pid"]
            self.pending.append(event)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


# ------------------------------------------------------------------------------------------ helpers
def train_args(corpus: Path, out: Path, name: str, max_steps: int, extra: tuple[str, ...] = ()) -> list[str]:
    return [
        "train",
        "--preset",
        "tiny",
        "--name",
        name,
        "--out_dir",
        str(out),
        "--corpus",
        str(corpus),
        "--model.block_size",
        "16",
        "--model.dropout",
        "0.1",
        "--batch_size",
        "4",
        "--grad_accum",
        "2",
        "--max_steps",
        str(max_steps),
        "--warmup_steps",
        "4",
        "--eval_interval",
        "5",
        "--eval_iters",
        "1",
        "--log_interval",
        "2",
        "--ckpt_interval",
        "1",
        "--keep_checkpoints",
        "2",
        "--seed",
        "3",
        "--threads",
        "1",
        "--no-progress",
        *extra,
    ]


def metric_lines(run: Path) -> list[str]:
    return (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()


def curve(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in COMPARED_OUT} for line in metric_lines(run)]


def verify_folder(run: Path) -> tuple[int, int]:
    """Load and verify ``latest`` and every listed checkpoint. Returns ``(bad_latest, bad_listed)``."""
    from poslab.training import checkpoint as ckpt

    if not (run / "config.json").exists():
        return 0, 0
    bad_latest = bad_listed = 0
    latest = ckpt.latest_step(run)
    if latest is not None:
        try:
            ckpt.load_checkpoint(run, latest)
        except ckpt.CheckpointError:
            bad_latest += 1
    for step in ckpt.list_checkpoints(run):
        try:
            ckpt.load_checkpoint(run, step)
        except ckpt.CheckpointError:
            bad_listed += 1
    return bad_latest, bad_listed


def kill_schedule(n_random: int, phase_rounds: int, rng: random.Random) -> list[dict]:
    """Phase kills (each round: start-up ones first, then the rest interleaved with random ones)."""
    plans: list[dict] = []
    randoms = [{"kind": "random"} for _ in range(n_random)]
    for round_index in range(phase_rounds):
        phases = [dict(p) for p in PHASE_PLANS if round_index == 0 or p["kind"] != "start"]
        share = len(randoms) // (phase_rounds - round_index)
        mixed = phases + [randoms.pop() for _ in range(share)]
        head = [p for p in mixed if p.get("kind") == "start" and p["match"] != ["metrics.jsonl"]]
        rest = [p for p in mixed if p not in head]
        rng.shuffle(rest)
        plans.extend(head + rest)
    return plans


def run_kill_test(
    tmp_path: Path, max_steps: int, n_random: int, phase_rounds: int, seed: int, extra: tuple[str, ...] = ()
) -> dict:
    from poslab.training import checkpoint as ckpt

    corpus = tmp_path / "corpus.txt"
    from poslab.data import load_corpus

    corpus.write_text(load_corpus("shakespeare")[:20_000], encoding="utf-8")
    out = tmp_path / "runs"
    # the reference: one uninterrupted run in a fresh interpreter (the real command line)
    done = subprocess.run(
        [sys.executable, "-m", "poslab", *train_args(corpus, out, "reference", max_steps, extra)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    reference = out / "reference"

    rng = random.Random(seed)
    plans = kill_schedule(n_random, phase_rounds, rng)
    run = out / "killed"
    args = train_args(corpus, out, "killed", max_steps, extra)
    figures = {
        "kills": 0,
        "kills_in_checkpoint_write": 0,
        "kills_at_start": 0,
        "kills_random_time": 0,
        "kills_metrics_torn": 0,
        "launches": 0,
        "bad_latest_seen": 0,
        "bad_listed_seen": 0,
    }
    step_time = 0.15  # refined from the children's checkpoint timestamps
    first_checkpoint = 1.0  # seconds from a launch to its first checkpoint (refined likewise)
    zygote = Zygote(tmp_path)
    log = tmp_path / "killed.log"
    try:
        while True:
            plan = plans.pop(0) if plans else None
            resume = ["--resume"] if run.exists() else []
            pause = (
                None
                if plan is None or plan["kind"] == "random"
                else {k: plan[k] for k in ("phase", "match", "occurrence")}
            )
            launched_at = time.monotonic()
            pid = zygote.launch(args + resume, log, pause)
            figures["launches"] += 1
            with open(log, "a") as handle:
                handle.write(f"--- launch {figures['launches']}: pid {pid}, plan {plan}, {resume}\n")
            exited = None
            if plan is None:
                exited = zygote.next(lambda e: e["event"] == "exited", 600)
            elif plan["kind"] != "random":
                hit = zygote.next(lambda e: (e["event"] == "phase" and e["paused"]) or e["event"] == "exited", 300)
                assert hit is not None, f"launch {pid} neither reached {plan} nor exited"
                if hit["event"] == "exited":
                    exited = hit  # the phase never came (e.g. the run finished): no kill
                else:
                    os.kill(pid, signal.SIGKILL)
            else:
                if rng.random() < 0.25:  # a random moment after the start (start-up, resume, first steps)
                    delay = rng.uniform(0.0, first_checkpoint + 1.5 * step_time)  # at most ~2 steps of progress
                    exited = zygote.next(lambda e: e["event"] == "exited", delay)
                else:  # a random moment within the j-th step after the launch's first checkpoint
                    j = rng.randint(1, 2)
                    ends = [0]

                    def nth_end(e, ends=ends, j=j):
                        if e["event"] == "phase" and e["phase"] == "ckpt-end":
                            ends[0] += 1
                        return e["event"] == "exited" or ends[0] >= j

                    first = zygote.next(nth_end, 300)
                    assert first is not None
                    exited = first if first["event"] == "exited" else None
                    if exited is None:
                        exited = zygote.next(lambda e: e["event"] == "exited", rng.uniform(0.0, 1.2 * step_time))
                if exited is None:
                    os.kill(pid, signal.SIGKILL)
            if exited is None:
                exited = zygote.next(lambda e: e["event"] == "exited", 60)
            assert exited is not None
            ends = [e["t"] for e in zygote.phases if e["phase"] == "ckpt-end"]
            if len(ends) >= 3:
                step_time = (ends[-1] - ends[0]) / (len(ends) - 1)
            if ends:
                first_checkpoint = 0.5 * first_checkpoint + 0.5 * (ends[0] - launched_at)
            if exited["signal"] == signal.SIGKILL:
                figures["kills"] += 1
                last = zygote.last_phase
                inside = False
                for event in zygote.phases:  # were we between a ckpt-begin and its ckpt-end?
                    if event["phase"] == "ckpt-begin":
                        inside = True
                    elif event["phase"] == "ckpt-end":
                        inside = False
                if plan is not None and plan["kind"] == "random":
                    figures["kills_random_time"] += 1
                    figures["kills_in_checkpoint_write"] += int(inside)
                elif plan is not None:
                    figures["kills_in_checkpoint_write"] += int(plan["kind"] == "checkpoint")
                    figures["kills_at_start"] += int(plan["kind"] == "start")
                    figures["kills_metrics_torn"] += int(plan["kind"] == "metrics")
                    assert last is not None and last["paused"], last
                bad_latest, bad_listed = verify_folder(run)
                figures["bad_latest_seen"] += bad_latest
                figures["bad_listed_seen"] += bad_listed
                continue
            assert exited["code"] == 0, log.read_text()[-3000:]
            if plan is None:
                break
    finally:
        zygote.close()

    # the same numbers as the uninterrupted run, each step logged once, no torn line
    lines = metric_lines(run)
    records = [json.loads(line) for line in lines]  # a torn line would fail here
    steps = [r["step"] for r in records]
    assert steps == sorted(set(steps)) and steps[-1] == max_steps
    assert curve(run) == curve(reference)
    final = ckpt.checkpoint_name(max_steps)
    assert ckpt.latest_step(run) == ckpt.latest_step(reference) == max_steps
    a, _ = ckpt.load_checkpoint(reference, max_steps)
    b, _ = ckpt.load_checkpoint(run, max_steps)
    import torch

    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), final
    results = json.loads((run / "results.json").read_text())
    assert results["status"] == "completed" and results["steps"] == max_steps
    assert not [p.name for p in run.rglob(".*tmp*")], "temporary files left behind"
    folder = run / ckpt.CHECKPOINT_DIR
    orphans = [p.name for p in folder.glob("step_*.safetensors") if not p.with_suffix(".json").exists()]
    assert not orphans, f"tensor files without their JSON: {orphans}"
    # a kill between the two unlinks of pruning leaves a small JSON whose tensors are gone: never listed
    figures["stray_json_files"] = sum(
        1 for p in folder.glob("step_*.json") if not p.with_suffix(".safetensors").exists()
    )
    assert figures["bad_latest_seen"] == 0 and figures["bad_listed_seen"] == 0
    figures["curve_bitwise_equal"] = True
    figures["steps"] = max_steps
    return figures


def test_sigkill_anywhere_then_resume_reproduces_the_uninterrupted_run(tmp_path, request):
    from test_reliability_artifacts import mode, record

    figures = run_kill_test(tmp_path, max_steps=80, n_random=13, phase_rounds=1, seed=0)
    record("kill", mode(request), figures)
    assert figures["kills"] >= 20, figures
    # every planned checkpoint-phase kill lands (a random kill may land inside a write too, or not: timing decides)
    planned = sum(p["kind"] == "checkpoint" for p in PHASE_PLANS)
    assert figures["kills_in_checkpoint_write"] >= planned and figures["kills_at_start"] >= 2, figures


@pytest.mark.slow
def test_sigkill_of_a_memory_run_then_resume_is_bitwise(tmp_path, request):
    """Transformer-XL recurrence (``--memory``): the segment memory is checkpointed, so killed and
    resumed runs continue bitwise too (the fast version:
    :func:`test_a_memory_run_interrupted_and_resumed_continues_bitwise`)."""
    from test_reliability_artifacts import mode, record

    memory = ("--model.position", "rope", "--memory", "8")
    figures = run_kill_test(tmp_path, max_steps=30, n_random=4, phase_rounds=1, seed=2, extra=memory)
    record("kill", mode(request), figures)
    assert figures["kills"] >= 8, figures


@pytest.mark.slow
def test_sigkill_anywhere_many_times(tmp_path, request):
    from test_reliability_artifacts import mode, record

    figures = run_kill_test(tmp_path, max_steps=300, n_random=70, phase_rounds=3, seed=1)
    record("kill", mode(request), figures)
    assert figures["kills"] >= 90, figures


def test_building_a_config_leaves_the_global_rng_alone():
    """A resume replays dropout from the saved RNG state; a ``GPTConfig`` built between steps (the
    trainer does, for each checkpoint's config) must not draw from it (a throwaway
    position scheme's initialisation drawing from it makes the resumed curve differ from step one on)."""
    import torch

    from poslab import GPTConfig

    torch.manual_seed(0)
    before = torch.get_rng_state()
    for position in ("learned", "t5", "fire", "xl", "kerple"):
        GPTConfig(vocab_size=10, n_layer=1, n_head=2, n_embd=8, block_size=8, position=position)
    assert torch.equal(before, torch.get_rng_state())


@pytest.mark.usefixtures("single_thread", "hostile_figures")
def test_a_memory_run_interrupted_and_resumed_continues_bitwise(tmp_path, corpus):
    """The segment memory is saved with the checkpoint (``memory.{micro}.*``): the resumed curve and
    weights equal the uninterrupted run's (a memory restarted empty changes the loss from step 5)."""
    import torch
    from cli_helpers import answered
    from run_helpers import tiny

    from poslab.runs import load_run, read_metrics
    from poslab.session import train
    from poslab.training import checkpoint as ckpt

    model = dict(n_layer=2, n_head=2, n_embd=16, block_size=8, position="rope", dropout=0.1)
    same = dict(ckpt_interval=3, eval_interval=3, lr_decay_steps=6, memory=8, model=model)
    whole = tiny(tmp_path / "a", corpus, max_steps=6, **same)
    train(whole, progress=False)
    part = tiny(tmp_path / "b", corpus, max_steps=3, **same)
    train(part, progress=False)
    assert any(k.startswith("memory.0.hidden.") for k in ckpt.load_checkpoint(part.run_dir)[0])
    train(tiny(tmp_path / "b", corpus, max_steps=6, **same), resume=True, progress=False)
    keys = ("step", "loss", "lr", "grad_norm", "val_loss")
    reference = [[r.get(k) for k in keys] for r in read_metrics(whole.run_dir)]
    assert [[r.get(k) for k in keys] for r in read_metrics(part.run_dir)] == reference
    a, b = load_run(whole.run_dir)[0], load_run(part.run_dir)[0]
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    answered()


if __name__ == "__main__":
    if sys.argv[1:] == ["--zygote"]:
        _zygote()
