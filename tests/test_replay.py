"""The training experiments' claim records at their smallest sizes, replayed against a recorded set.

:func:`replay` runs every training experiment at its smoke size (or on a tiny base) in one lab folder with
one lab model store, in the lab's order (extrapolation first, its models reused by attention entropy and context
extension; tang-heads last, its Tang GPT trained from the preset with tiny overrides), and returns each
experiment's claim records as ``results.json`` holds them (after the statistical plan).
``tests/data/replay_claims.json`` holds what the lab produced when it was recorded; the test compares
every record's claim, verdict, measured text and design with it, so a refactoring of the lab that changes
the science fails here. A decimal number inside a measured text may differ by one unit of its last printed
digit (a different CPU may round a tiny model's last float bits differently, and a printed digit with them);
whole numbers, words and verdicts must be equal, the design's numbers to 4 significant digits.

Record again (only when the science is meant to change) with
``POSLAB_RECORD_REPLAY=1 python -m pytest tests/test_replay.py``.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import corpus_text_file

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one thread (conftest)

RECORDED = Path(__file__).parent / "data" / "replay_claims.json"
FIELDS = ("claim", "verdict", "measured", "design")
NUMBER = re.compile(r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")

#: the probes', heads' and bidirectional experiments' tiny training base (1 layer, width 16, 6 steps)
TINY_STEPS = {
    "max_steps": 6,
    "batch_size": 4,
    "warmup_steps": 1,
    "eval_interval": 3,
    "eval_iters": 2,
    "ckpt_interval": 0,
    "keep_checkpoints": 1,
    "threads": 1,
}
TINY_MODEL = {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16}
SEEDS = (3, 4, 5)


def _base(corpus: Path, **model: Any) -> dict[str, Any]:
    return {"corpus": str(corpus), "model": {**TINY_MODEL, **model}, **TINY_STEPS, "lr_decay_steps": 6, "seed": 3}


def _stream_scale(windows: int) -> Any:
    """The streaming experiments' tiny model: window 8, 6 steps, reading ``windows`` streams or windows."""
    from poslab.lab.scale import Scale

    tiny = {"n_layer": 1, "n_head": 2, "n_embd": 16, "batch_size": 4, "lr": 3e-3, "warmup_steps": 2}
    return Scale(name="tiny", train_length=8, steps=6, eval_interval=6, eval_iters=1, eval_windows=windows, **tiny)


def _tang_overrides(corpus: Path) -> dict[str, Any]:
    """The Tang GPT's tiny training on a Tang text (2 layers: its heads' analysis needs two): the preset's seed."""
    return {**TINY_STEPS, "lr_decay_steps": 6, "corpus": str(corpus), "model": {**TINY_MODEL, "n_layer": 2}}


def replay(root: Path) -> dict[str, list[dict[str, Any]]]:
    """Every training experiment's claim records, run small in the lab folder ``root``."""
    from poslab.lab.experiments import registry, settle

    corpus = corpus_text_file(root, 40_000)
    experiments = registry()
    runs: dict[str, dict[str, Any]] = {
        "extrapolation": {"size": "smoke", "schemes": ("learned", "rope", "alibi"), "workers": 1},
        "attention-entropy": {"size": "smoke", "schemes": ("rope", "alibi"), "workers": 1},
        "context-extension": {"size": "smoke", "seeds": (1337, 1338), "workers": 1},
        "probes": {"form": "smoke", "schemes": ["rope", "alibi"], "workers": 1},
        "heads": {"quick": True, "heads": (1, 2), "base": _base(corpus), "workers": 1, "seeds": SEEDS},
        "position-training": {
            "quick": True,
            "schemes": ["rope", "alibi"],
            "base": _base(corpus),
            "workers": 1,
            "seeds": SEEDS,
        },
        "bidirectional": {"quick": True, "base": _base(corpus), "workers": 1, "seeds": SEEDS, "leak_layers": (1,)},
        "streaming": {"quick": True, "seeds": SEEDS, "scale": _stream_scale(2), "workers": 1},
        "rope-frequency-usage": {"quick": True, "seeds": SEEDS, "scale": _stream_scale(4), "workers": 1},
        "tang-heads": {"quick": True, "overrides": _tang_overrides(corpus_text_file(root, 40_000, name="tang5"))},
    }
    claims = {}
    for name, options in runs.items():
        with contextlib.redirect_stdout(io.StringIO()):
            results = settle(experiments[name].EXPERIMENT.run(root / name, models=root / "models", **options), name)
        (root / name / "results.json").write_text(json.dumps(results, default=float))
        claims[name] = [{key: record.get(key) for key in FIELDS} for record in results["claims"]]
    return claims


def _numbers(text: str) -> tuple[str, list[tuple[float, float]]]:
    """``text`` with its numbers cut out, and each number with the unit of its last printed digit (0 for a
    whole number: compared exactly)."""
    values = []
    for match in NUMBER.findall(text):
        plain = match.replace(",", "")
        mantissa, e, exponent = plain.lower().partition("e")
        decimals = len(mantissa.partition(".")[2])
        unit = 10.0 ** (int(exponent or 0) - decimals) if "." in mantissa or e else 0.0
        values.append((float(plain), unit))
    return NUMBER.sub("#", text), values


def _same_number(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return abs(a[0] - b[0]) <= max(a[1], b[1]) * 1.001


def differences(recorded: Any, replayed: Any, where: str = "") -> list[str]:
    """Where ``replayed`` differs from ``recorded`` (module docstring: how closely)."""
    if isinstance(recorded, dict) and isinstance(replayed, dict):
        if set(recorded) != set(replayed):
            return [f"{where}: keys {sorted(recorded)} != {sorted(replayed)}"]
        return [d for key in recorded for d in differences(recorded[key], replayed[key], f"{where}.{key}")]
    if isinstance(recorded, list) and isinstance(replayed, list):
        if len(recorded) != len(replayed):
            return [f"{where}: {len(recorded)} items != {len(replayed)}"]
        return [d for i, (a, b) in enumerate(zip(recorded, replayed)) for d in differences(a, b, f"{where}[{i}]")]
    if isinstance(recorded, str) and isinstance(replayed, str):
        (shape_a, a), (shape_b, b) = _numbers(recorded), _numbers(replayed)
        if shape_a == shape_b and len(a) == len(b) and all(_same_number(x, y) for x, y in zip(a, b)):
            return []
        return [f"{where}: {recorded!r} != {replayed!r}"]
    if isinstance(recorded, float) and isinstance(replayed, (int, float)) and not isinstance(replayed, bool):
        return [] if math.isclose(recorded, replayed, rel_tol=1e-4) else [f"{where}: {recorded!r} != {replayed!r}"]
    return [] if recorded == replayed else [f"{where}: {recorded!r} != {replayed!r}"]


def test_differences_catch_a_changed_word_number_or_verdict():
    record = {"claim": "A < B", "verdict": "held", "measured": "1.2345 vs 2.5 (3 seeds)", "design": {"alpha": 0.05}}
    assert differences([record], [dict(record, measured="1.2346 vs 2.4 (3 seeds)")]) == []  # last digits only
    assert differences([record], [dict(record, measured="1.2347 vs 2.5 (3 seeds)")])
    assert differences([record], [dict(record, measured="1.2345 vs 2.7 (3 seeds)")])
    assert differences([record], [dict(record, measured="1.25 vs 2.5 (3 seeds)")])
    assert differences([record], [dict(record, measured="1.2345 vs 2.5 (4 seeds)")])
    assert differences([record], [dict(record, measured="1.2345 vs 2.5 (3 runs)")])
    assert differences([record], [dict(record, verdict="inconclusive")])
    assert differences([record], [dict(record, design={"alpha": 0.1})])
    assert differences([record], [record, record])


def test_the_lab_replays_its_recorded_claims(tmp_path):
    replayed = replay(tmp_path)
    if os.environ.get("POSLAB_RECORD_REPLAY"):
        RECORDED.parent.mkdir(exist_ok=True)
        RECORDED.write_text(json.dumps(replayed, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        pytest.skip(f"recorded {RECORDED}")
    recorded = json.loads(RECORDED.read_text(encoding="utf-8"))
    assert list(replayed) == list(recorded)
    assert all(recorded.values()), "every replayed experiment has claims"
    problems = differences(recorded, replayed)
    assert problems == [], "\n".join(problems[:20])
