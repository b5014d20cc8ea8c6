"""The reliability figures: each test behind ``docs/reliability.md`` (its ``$RELIABILITY`` list) records
what it tried in ``test-artifacts/reliability.json``; the page's table is built from that file.

    python tests/test_reliability_artifacts.py      # print the markdown table from the JSON

The JSON maps ``category -> {"default" | "slow": {figure: count, ...}}``: the default run
(``pytest``) and the long one (``pytest -m slow``) write their own entry, so both are kept.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts" / "reliability.json"
#: one id per pytest session: counts add up within a session and restart in the next; the workers of
#: one pytest-xdist session share its run id, so their counts add up in the same entry
SESSION = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"{os.getpid()}-{time.time():.0f}"

#: category -> (title, figure keys shown in the table, in order)
CATEGORIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "kill": (
        "SIGKILL at any moment, then `--resume`",
        (
            "kills",
            "kills_in_checkpoint_write",
            "kills_at_start",
            "kills_metrics_torn",
            "kills_random_time",
            "launches",
            "steps",
            "curve_bitwise_equal",
            "bad_latest_seen",
            "bad_listed_seen",
            "stray_json_files",
        ),
    ),
    "corruption": (
        "corrupt checkpoints refused",
        (
            "corruptions_tried",
            "bit_flips",
            "truncations",
            "wrong_config",
            "refused",
            "loaded_identical",
            "silently_wrong",
        ),
    ),
    "unsafe": (
        "no code execution from files",
        ("malicious_files_planted", "refused", "markers_created", "source_files_scanned"),
    ),
    "numerics": (
        "numerics under stress (bf16/fp16, logits ~1e4, masked rows)",
        ("cases", "nonfinite_found", "max_err_vs_fp64_bf16", "max_err_vs_fp64_fp16", "max_fp32_err_vs_fp64"),
    ),
    "nonfinite": ("NaN/inf during training", ("runs", "detected_within_one_step", "skipped_batches")),
    "fuzz": (
        "fuzzed configs and command lines",
        (
            "cases",
            "accepted",
            "rejected_one_line",
            "tracebacks",
            "models_run",
            "subprocess_cases",
            "forged_runs",
            "consistent_forgeries_refused",
            "cached_values_checked",
            "remeasured",
        ),
    ),
    "disk": ("disk full / read-only run folder", ("cases", "clear_error", "half_written_files", "resumed_equal")),
    "realdisk": (
        "real disk full (a small tmpfs): training, resume, eval/experiment/report/sample outputs",
        (
            "cases",
            "sizes",
            "clear_error",
            "half_written_files",
            "checkpoints_verified",
            "resumed_equal",
            "earlier_files_changed",
            "reads_ok",
        ),
    ),
    "lock": ("two processes on one run folder", ("cases", "second_refused", "interleaved_writes")),
    "run_folder": (
        "symlinked writers, changed tokenizers, forged-consistent files, resume edge cases",
        (
            "cases",
            "symlinked_writers_refused",
            "planted_lock_paths_refused",
            "changed_tokenizers_refused",
            "forged_files_one_line",
            "model_only_sampled",
            "model_only_resume_refused",
            "resume_edge_cases_ok",
            "moved_folders_stopped",
            "victim_files_changed",
        ),
    ),
    "sweep_lab": (
        "kills of sweeps and trainings, lab reruns",
        (
            "sweep_kills",
            "trainings_stopped_with_sweep",
            "final_checkpoints_saved",
            "sigterm_to_train_saved",
            "reruns_waited_for_run_in_use",
            "second_collectors_refused",
            "runs_taken_by_another_collector_completed",
            "lab_trainings_resumed",
            "checkpoints_deleted",
        ),
    ),
    "stop": (
        "the lab and experiments stopped (SIGTERM, SIGKILL of the parent, a diverged training)",
        (
            "experiment_sigterms",
            "experiment_sigkills",
            "lab_sigterms",
            "trainings_checkpointed",
            "processes_left",
            "experiment_trainings_resumed_bitwise",
            "lab_stopped_steps_continued",
            "lab_trainings_resumed_bitwise",
            "diverged_in_experiment_one_line",
        ),
    ),
    "inputs": (
        "unbounded and rough inputs refused before they cost",
        ("cases", "refused_one_line", "tracebacks", "max_mib_grown_reading_1gib_binary_corpus"),
    ),
    "explorer": (
        "explorer request checks (Host, Origin, Content-Length, disconnects, concurrent requests)",
        (
            "requests",
            "refused",
            "served_anyway",
            "disconnects_logged_in_one_line",
            "tracebacks",
            "concurrent_requests",
            "concurrent_answers_differing",
        ),
    ),
    "report": (
        "forged claim records and malformed lab files given to `poslab report`",
        (
            "cases",
            "records",
            "shown_unusable",
            "decided_against_the_rule_shown",
            "files_written",
            "unreadable_named",
            "tracebacks",
        ),
    ),
    "hf_folders": (
        "malformed Hugging Face folders given to `poslab convert`",
        ("cases", "refused_one_line", "tracebacks"),
    ),
    "export": (
        "`poslab.to_hf` of every GPTConfig option (alone, family combinations; pairs in slow)",
        ("cases", "exact", "refused", "not_offered", "silent_differences"),
    ),
    "hostile_inputs": (
        "hostile inputs at their cause (deep nesting, alias bombs, forged files, extreme values, costs, lock, "
        "memory resume)",
        ("cases", "refused_one_line", "right_answer"),
    ),
}


def mode(request: pytest.FixtureRequest) -> str:
    """``"slow"`` for a slow-marked test, else ``"default"``."""
    return "slow" if request.node.get_closest_marker("slow") else "default"


def record(category: str, run_mode: str, figures: dict[str, Any]) -> None:
    """Merge ``figures`` into ``ARTIFACTS[category][run_mode]`` (atomic rewrite of the JSON).

    Numbers add up across the tests of one pytest session that record the same category (each
    test adds its own counts); a new session starts the entry afresh.
    """
    ARTIFACTS.parent.mkdir(parents=True, exist_ok=True)
    # the read-merge-write holds an exclusive lock: pytest-xdist workers record into the same file
    with open(ARTIFACTS.with_name(f".{ARTIFACTS.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _merge(category, run_mode, figures)


def _merge(category: str, run_mode: str, figures: dict[str, Any]) -> None:
    """The body of :func:`record`, run under its lock."""
    data = json.loads(ARTIFACTS.read_text(encoding="utf-8")) if ARTIFACTS.is_file() else {}
    entry = data.setdefault(category, {}).get(run_mode, {})
    if entry.get("session") != SESSION:
        entry = {"session": SESSION}
    for key, value in figures.items():
        old = entry.get(key)
        if old is None or not isinstance(value, (int, float)):
            entry[key] = value
        elif isinstance(value, bool):
            entry[key] = old and value  # a property holds only if it held in every test
        elif key.startswith("max_"):
            entry[key] = max(old, value)
        else:
            entry[key] = old + value
    entry["updated"] = time.strftime("%Y-%m-%d %H:%M:%S")
    data[category][run_mode] = entry
    tmp = ARTIFACTS.with_name(f".{ARTIFACTS.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, ARTIFACTS)


def table(data: dict[str, Any]) -> str:
    """The markdown table of ``data`` (the artifacts JSON): one row per category and run mode."""
    lines = ["| what | run | figures |", "|---|---|---|"]
    for category, (title, keys) in CATEGORIES.items():
        for run_mode in ("default", "slow"):
            entry = data.get(category, {}).get(run_mode)
            if entry is None:
                continue
            shown = ", ".join(f"{key.replace('_', ' ')}: {_fmt(entry[key])}" for key in keys if key in entry)
            lines.append(f"| {title} | {run_mode} | {shown} |")
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.2g}"
    return str(value)


def test_record_adds_within_a_session_and_restarts_in_the_next(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ARTIFACTS", tmp_path / "r.json")
    monkeypatch.setattr(sys.modules[__name__], "SESSION", "a")
    record("kill", "default", {"kills": 3, "curve_bitwise_equal": True, "max_x": 1.0})
    record("kill", "default", {"kills": 2, "curve_bitwise_equal": False, "max_x": 0.5})
    entry = json.loads((tmp_path / "r.json").read_text())["kill"]["default"]
    assert (entry["kills"], entry["curve_bitwise_equal"], entry["max_x"]) == (5, False, 1.0)
    monkeypatch.setattr(sys.modules[__name__], "SESSION", "b")
    record("kill", "default", {"kills": 4})
    entry = json.loads((tmp_path / "r.json").read_text())["kill"]["default"]
    assert entry["kills"] == 4 and "curve_bitwise_equal" not in entry
    assert "| SIGKILL at any moment, then `--resume` | default | kills: 4 |" in table({"kill": {"default": entry}})


def test_workers_of_one_run_add_up_in_one_entry(tmp_path):
    """Two processes of one pytest-xdist run (one ``PYTEST_XDIST_TESTRUNUID``) recording at the same time:
    no count is lost and neither restarts the other's entry."""
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "import test_reliability_artifacts as r\n"
        "r.ARTIFACTS = Path(sys.argv[1])\n"
        "for _ in range(40):\n"
        "    r.record('kill', 'default', {'kills': 1})\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent), "PYTEST_XDIST_TESTRUNUID": "run-1"}
    path = tmp_path / "r.json"
    workers = [subprocess.Popen([sys.executable, "-c", script, str(path)], env=env) for _ in range(2)]
    assert [w.wait(timeout=120) for w in workers] == [0, 0]
    entry = json.loads(path.read_text())["kill"]["default"]
    assert (entry["session"], entry["kills"]) == ("run-1", 80)


if __name__ == "__main__":
    print(table(json.loads(ARTIFACTS.read_text(encoding="utf-8"))))
