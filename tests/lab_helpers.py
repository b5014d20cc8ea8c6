"""Shared, cached fixtures of the lab / report / explorer tests: tiny trained runs and a small lab folder.

Everything is built once per test process into a temporary folder (removed at exit), on one thread
(tiny models gain nothing from more, and a shared machine makes a second thread spin).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import io
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from poslab.lab.experiments.common import one_thread  # noqa: F401  (re-exported for the tests)

PROMPT = "白日依山尽，黄河入海流。"
CHEAP_EXPERIMENTS = ("params", "shapes", "rope-relative", "permutation")
#: the folder of the head analysis in :func:`make_lab`
TANG_HEADS = "experiments/tang-heads"


@functools.cache
def base_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="poslab-lab-tests-"))
    atexit.register(shutil.rmtree, path, True)
    return path


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


@functools.cache
def corpus_file() -> Path:
    """The first 3,000 Tang poems plus the test prompt, as a UTF-8 file."""
    from poslab.data import load_corpus

    lines = load_corpus("tang5").splitlines()[:3000]
    path = base_dir() / "corpus.txt"
    path.write_text("\n".join([*lines, PROMPT, *lines[:300]]) + "\n", encoding="utf-8")
    return path


@functools.cache
def tiny_run(position: str = "rope", steps: int = 30) -> Path:
    """A 2-layer, 2-head, n_embd-32 GPT trained ``steps`` steps on :func:`corpus_file`."""
    from poslab.session import train
    from poslab.training.config import TrainConfig

    cfg = TrainConfig(
        name=f"tiny-{position}",
        out_dir=str(base_dir() / "runs"),
        corpus=str(corpus_file()),
        model={"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32, "position": position},
        max_steps=steps,
        batch_size=8,
        warmup_steps=5,
        eval_interval=steps,
        eval_iters=2,
        ckpt_interval=0,
        threads=1,
        lr=3e-3,
    )
    with quiet():
        train(cfg, progress=False)
    return base_dir() / "runs" / f"tiny-{position}"


def make_lab(root: Path) -> Path:
    """A small lab folder: four cheap experiments, and tang-heads' analysis (heads, attention map, claims) of a tiny
    run in ``experiments/tang-heads`` (:data:`TANG_HEADS`)."""
    from poslab.fileio import atomic_write_json
    from poslab.lab import experiments
    from poslab.lab.experiments import tang_heads

    with one_thread(), quiet():
        for name in CHEAP_EXPERIMENTS:
            experiments.run_experiment(name, root / "experiments" / name)
        out = root / TANG_HEADS
        results = experiments.settle(tang_heads.run(out, quick=True, trained=tiny_run("rope")), "tang-heads")
        atomic_write_json(out / "results.json", results, default=float)
    return root


@functools.cache
def shared_lab() -> Path:
    """:func:`make_lab` once per process (read-only users)."""
    return make_lab(base_dir() / "lab")


def copy_lab(target: Path) -> Path:
    """A private copy of :func:`shared_lab` (for tests that edit it)."""
    shutil.copytree(shared_lab(), target)
    return target


def snapshot_lab(root: Path) -> Path:
    """A lab folder holding the claim records of ``docs/results/lab-quick.json`` (a quick lab's 100 records).

    The snapshot keeps each record's claim, source, measured text, margin, noise, seeds, verdict, kind, reason and
    design (no criterion, no per-seed details): each is written back as a record the report shows with the same
    kind, the unmet premise rebuilt from its reason, a source or withdrawn record marked so in ``details``.
    """
    import json

    from poslab.lab.evidence import KIND_KEY, LESSON_CLAIM_KEY, REFERENCE_KEY, SOURCE, WITHDRAWN
    from poslab.lab.verdicts import PREMISE_NOT_MET

    snap = json.loads((Path(__file__).parents[1] / "docs" / "results" / "lab-quick.json").read_text(encoding="utf-8"))
    folders: dict[str, list[dict]] = {}
    for c in snap["claims"]:
        details: dict = {"reason": c["reason"]} if c["reason"] else {}
        premise = None
        if c["kind"] == "untestable":
            text, _, measured = c["reason"].removeprefix(PREMISE_NOT_MET + ": ").partition(" (measured: ")
            premise = {"text": text, "measured": measured.removesuffix(")"), "met": False}
        elif c["kind"].startswith("cited-"):
            details.update({KIND_KEY: SOURCE, REFERENCE_KEY: c["source"]})
        elif c["kind"] == "withdrawn":
            details[KIND_KEY] = WITHDRAWN
        elif c["kind"] == "note":
            details[LESSON_CLAIM_KEY] = False
        design = None
        if c.get("test"):
            test = c["test"].removesuffix(" on ln")
            design = {"test": test, "log": c["test"] != test, "family": c.get("family") or ""}
        record = {
            **{k: c[k] for k in ("claim", "source", "measured", "margin", "noise", "n_seeds", "verdict")},
            "criterion": "",
            "details": details,
            "premise": premise,
            "design": design,
        }
        folders.setdefault(c["experiment"], []).append(record)
    for folder, records in folders.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "results.json").write_text(json.dumps({"claims": records}), encoding="utf-8")
    return root


def extrapolation_result(perplexity: dict[str, Any]) -> dict[str, Any]:
    """An extrapolation results.json (trained at 32, read at 1x and 2x, seeds 1 and 2) holding ``perplexity``
    (scheme -> factor -> aggregated cell) and nothing measured besides it."""
    from poslab.lab.experiments.common import Baselines
    from poslab.lab.experiments.declaration import to_json
    from poslab.lab.experiments.extrapolation import ExtrapolationResult
    from poslab.lab.scale import SIZES

    return to_json(
        ExtrapolationResult(
            **{f: {} for f in ("perplexity_by_seed", "loss_by_position", "run_dirs", "final_val_loss")},
            size=SIZES["smoke"],
            baselines=Baselines({}, "shakespeare", 3.3),
            seeds=[1, 2],
            seeds_by_scheme={scheme: [1, 2] for scheme in perplexity},
            train_length=32,
            factors=[1, 2],
            lengths=[32, 64],
            n_targets=8,
            perplexity=perplexity,
            seconds=1.0,
            threads=1,
        )
    )
