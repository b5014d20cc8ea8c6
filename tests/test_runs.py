"""``RunFolder`` (poslab/runs/): the one reader and writer of a run folder, and the rule that no other
module parses a run file."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import tiny_config

from poslab.runs import RUN_FILES, RunFileError, RunFolder, load_run
from poslab.session import train
from poslab.training import checkpoint as ckpt
from poslab.training.lock import RunLock

pytestmark = pytest.mark.usefixtures("single_thread")

PACKAGE = Path(__file__).resolve().parents[1] / "poslab"
#: functions outside poslab/runs/ allowed to parse a JSON file whose name is also a run file's, and why
ALLOWED = {
    ("runs/files.py", "*"): "the run folder's owner",
    ("training/checkpoint.py", "load_checkpoint"): "the checkpoint format RunFolder delegates to",
    ("interop/convert.py", "_model_type"): "a Hugging Face folder's config.json, not a run's",
    ("lab/report/reading.py", "load_results"): "experiment folders' results.json (it skips runs/)",
    ("bench/report.py", "rerender"): "a bench output folder's results.json",
    ("lab/experiments/__init__.py", "read_results"): "an experiment folder's results.json, not a run's",
    ("lab/experiments/declaration.py", "to_json"): "a result's round trip through JSON text, no file",
}
RUN_FILE_HINTS = (*RUN_FILES, "checkpoints", "step_")


def _mentions_run_file(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and any(h in sub.value for h in RUN_FILE_HINTS):
            return True
    return False


def _parses_json(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr in ("load", "loads")
            and isinstance(sub.func.value, ast.Name)
            and sub.func.value.id == "json"
        ):
            return True
    return False


def run_file_parsers(source: str) -> list[str]:
    """Functions (or ``<module>``) of ``source`` that call ``json.load(s)`` and name a run file."""
    tree = ast.parse(source)
    scopes: list[tuple[str, ast.AST]] = [
        (n.name, n) for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    top = ast.Module(body=[n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.ClassDef))], type_ignores=[])
    scopes.append(("<module>", top))
    return sorted({name for name, node in scopes if _parses_json(node) and _mentions_run_file(node)})


def test_no_module_outside_runs_parses_a_run_file():
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for name in run_file_parsers(path.read_text(encoding="utf-8")):
            if (rel, "*") not in ALLOWED and (rel, name) not in ALLOWED:
                bad.append(f"poslab/{rel}: {name} parses a run file; read it through poslab.runs.RunFolder")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    ("source", "flagged"),
    [
        ('import json\ndef f(run):\n    return json.loads((run / "config.json").read_text())\n', ["f"]),
        ('import json\nrows = [json.loads(x) for x in open("r/metrics.jsonl")]\n', ["<module>"]),
        ('import json\ndef g(p):\n    return json.load(open(p / f"checkpoints/{p.name}"))\n', ["g"]),
        ("import json\ndef h(body):\n    return json.loads(body)\n", []),  # a request body: no run file
        ("from poslab.runs import RunFolder\ndef k(p):\n    return RunFolder(p).config()\n", []),
    ],
)
def test_the_run_file_checker_can_fail(source, flagged):
    assert run_file_parsers(source) == flagged


READERS = (
    "poslab.runs",
    "poslab.analysis.eval",
    "poslab.analysis.heads",
    "poslab.analysis.attention_map",
    "poslab.cli.sample",
    "poslab.interop.convert",
    "poslab.explore.server",
)


def module_file(module: str) -> Path | None:
    path = PACKAGE.parent / Path(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported(path: Path) -> list[str]:
    """Modules an ``import`` names in ``path`` (``from a import b`` gives ``a`` and ``a.b``: b may be a module)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return found


def reachable(start: str) -> set[str]:
    """Every poslab module ``start`` can import, at module level or inside a function (read with ``ast``)."""
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        path = module_file(module)
        if module in seen or path is None:
            continue
        seen.add(module)
        todo += [m for m in imported(path) if m.startswith("poslab")]
    return seen


@pytest.mark.parametrize("reader", READERS)
def test_readers_do_not_import_the_training_loop(reader):
    assert "poslab.training.loop" not in reachable(reader)


def test_the_import_walk_finds_the_loop_where_it_is_imported(tmp_path):
    assert "poslab.training.loop" in reachable("poslab.session")
    assert "poslab.training.loop" in reachable("poslab.cli.train")
    planted = tmp_path / "poslab" / "planted.py"  # a lazy import of the loop as a submodule is found too
    planted.parent.mkdir()
    planted.write_text("def f():\n    from poslab.training import loop\n    return loop\n")
    assert "poslab.training.loop" in imported(planted)


# ------------------------------------------------------------------------------------ a real run
@pytest.fixture(scope="module")
def trained(tmp_path_factory, tang_corpus):
    """:func:`conftest.tiny_config` on :func:`conftest.tang_corpus`: checkpoints at steps 2 and 4."""
    out = tmp_path_factory.mktemp("runs")
    cfg = tiny_config(out, tang_corpus)
    train(cfg, progress=False)
    return cfg.run_dir


@pytest.fixture
def run(trained, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    return RunFolder(copy)


def test_config_tokenizer_metrics_results_checkpoints(run):
    doc = run.config()
    assert set(doc) >= {"model", "train", "data"}
    assert run.model_config().n_layer == 1 and run.train_config().max_steps == 4
    assert doc["data"]["tokenizer_sha256"] == ckpt.sha256_file(run.file("tokenizer.json"))
    assert run.tokenizer().vocab_size == doc["model"]["vocab_size"]
    assert [r["step"] for r in run.metrics()] == [1, 2, 3, 4]
    run.truncate_metrics(2)
    assert [r["step"] for r in run.metrics()] == [1, 2]
    with run.metrics_appender() as append:
        append({"step": 3, "loss": 1.0})
    assert [r["step"] for r in run.metrics()] == [1, 2, 3]
    assert run.results()["status"] == "completed"
    assert run.checkpoints() == [2, 4] and run.latest_step() == 4


def test_load_model_by_step(run):
    last, first = load_run(run)[0], load_run(run, step=2)[0]
    assert not first.training
    assert any(not torch.equal(a, b) for a, b in zip(last.state_dict().values(), first.state_dict().values()))
    tensors, _ = ckpt.load_checkpoint(run.path, 2)
    assert torch.equal(first.state_dict()["tok_emb.weight"], tensors["model.tok_emb.weight"])


def test_state_is_answered_once(run, tmp_path):
    assert RunFolder(tmp_path / "nothing").state == "missing"
    assert run.state == "finished" and run.finished(4) and not run.finished(5)
    with RunLock(run.path):
        assert run.state == "running"
    run.file("results.json").unlink()
    assert run.state == "interrupted"
    run.write_results({"status": "diverged"})
    assert run.state == "failed"


def change_corpus(monkeypatch) -> None:
    """As if the corpus file had changed since training: it reads one character longer, so the digest
    ``config.json`` records for it no longer matches (the run's own files untouched)."""
    import poslab.runs.files

    read = poslab.runs.files.load_text
    monkeypatch.setattr(poslab.runs.files, "load_text", lambda source: read(source) + "变")


def test_split_tokens_are_checksummed(run, monkeypatch):
    val = run.split_tokens("val")
    train_split = run.split_tokens("train")
    assert val.numel() > 0 and train_split.numel() > 8 * val.numel()
    # the corpus changed since training: the run's own split is gone, said instead of scored
    change_corpus(monkeypatch)
    with pytest.raises(ValueError, match="changed since the run was trained"):
        run.split_tokens("val")


def test_heads_reads_the_checksummed_split(run, tmp_path, monkeypatch):
    """heads reads the run's checksummed split: a corpus changed since training is refused, not scored."""
    from poslab.analysis.heads import run_heads

    change_corpus(monkeypatch)
    with pytest.raises(ValueError, match="changed since the run was trained"):
        run_heads(run.path, tmp_path / "heads", quick=True)


def test_resume_identity_ignores_free_keys(run):
    identity = run.resume_identity()
    assert "max_steps" not in identity["train"] and identity["model"]["n_layer"] == 1


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({}, r"config.json' lacks the 'model' section"),
        ({"model": {}}, r"config.json' lacks the 'train' section"),
        ([1, 2], r"config.json' holds a list, not a JSON object"),
    ],
)
def test_a_config_without_its_sections_is_one_line(run, doc, match):
    run.file("config.json").write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(RunFileError, match=match):
        load_run(run.path)


def test_averaged_model_is_the_mean_of_the_last_checkpoints(run):
    averaged, steps = run.averaged_model(2)
    assert steps == [2, 4] and not averaged.training
    first, last = load_run(run, step=2)[0].state_dict(), load_run(run, step=4)[0].state_dict()
    mean = averaged.state_dict()
    for key in last:
        torch.testing.assert_close(mean[key], (first[key] + last[key]) / 2)
    differs = [k for k in last if not torch.equal(first[k], last[k])]
    assert differs and all(not torch.equal(mean[k], last[k]) and not torch.equal(mean[k], first[k]) for k in differs)
    assert averaged.lm_head.weight is averaged.tok_emb.weight or "lm_head.weight" not in mean  # ties survive
    only_first, _ = run.averaged_model(2, weights=[1.0, 0.0])
    assert all(torch.equal(only_first.state_dict()[k], first[k]) for k in first)
    latest, steps = run.averaged_model(1)
    assert steps == [4] and all(torch.equal(latest.state_dict()[k], last[k]) for k in last)


def test_averaged_model_refuses_what_it_cannot_average(run):
    with pytest.raises(
        ckpt.CheckpointError,
        match=r"keeps 2 checkpoint\(s\) \(steps \[2, 4\]\); averaging the last 3.*keep_checkpoints >= 3",
    ):
        run.averaged_model(3)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="an int >= 1"):
            run.averaged_model(bad)
    with pytest.raises(ValueError, match="one weight per state dict"):
        run.averaged_model(2, weights=[1.0])
