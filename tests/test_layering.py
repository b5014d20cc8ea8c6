"""The package's layers import only downwards (docs/architecture.md).

Every ``import``/``from ... import`` in ``poslab/`` (top-level and inside functions) is read with
``ast``; an import of a higher layer, or of a sibling package on the same layer, fails the test.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "poslab"

#: layer of each top-level part of the package (higher may import lower, never the reverse)
LAYERS: dict[str, int] = {
    "safe_load": -1,
    "checks": -1,
    "config_keys": 0,
    "fileio": 0,
    "version": 0,
    "data": 0,
    "nn": 1,
    "display": 1,
    "training": 2,
    "runs": 3,
    "session": 4,
    "config": 4,
    "analysis": 4,
    "interop": 4,
    "jobs": 5,
    "bench": 5,
    "explore": 5,
    "lab": 6,
    "cli": 7,
    "__main__": 8,
}
#: the package's front door re-exports the public API from any layer
FACADE = "__init__"
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def part_of(module: str) -> str | None:
    """``poslab.nn.attention`` -> ``nn``; ``poslab`` itself -> ``__init__``; other packages -> None."""
    parts = module.split(".")
    if parts[0] != "poslab":
        return None
    return parts[1] if len(parts) > 1 else FACADE


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) for every import in ``path``, ``from poslab import x`` as ``poslab.x``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    package = list(rel.parts[:-1]) if rel.name != "__init__" else list(rel.parts[:-1])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module == "poslab":
                found += [(node.lineno, f"poslab.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, module))
    return found


def violations(path: Path) -> list[str]:
    own = part_of(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
    if own == FACADE:
        return []
    bad = []
    for line, module in imports_of(path):
        target = part_of(module)
        if target is None or target == own:
            continue
        if target == FACADE:
            bad.append(
                f"{path.relative_to(PACKAGE.parent)}:{line} imports the facade 'poslab' ({module}); "
                "import the submodule that owns it"
            )
        elif target not in LAYERS:
            bad.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {module} belongs to no layer")
        elif LAYERS[target] >= LAYERS[own]:
            bad.append(
                f"{path.relative_to(PACKAGE.parent)}:{line}: layer {own} ({LAYERS[own]}) imports "
                f"{module} (layer {target}, {LAYERS[target]})"
            )
    return bad


def documented_layers(text: str) -> dict[str, int]:
    """docs/architecture.md's layer list (its first code block) as ``{part: layer}``.

    A line ``" layer N   poslab/PART/   what it holds"`` starts layer N; the parts of a layer are the
    ``poslab/...`` paths of its left column (the text after two or more spaces describes them).
    """
    block = re.search(r"```\n( layer .*?)```", text, flags=re.S)
    assert block, "docs/architecture.md has no layer list"
    layers: dict[str, int] = {}
    layer = None
    for line in block.group(1).splitlines():
        start = re.match(r" layer (-?\d+)", line)
        if start:
            layer = int(start.group(1))
        column = re.split(r"\s{2,}", line[11:].strip())[0] if line[11:12].strip() else ""
        for part in re.findall(r"poslab/(\w+)", column):
            layers[part] = layer
    return layers


def test_the_documented_layers_are_the_checked_ones():
    """The layer list a reader sees is the table this file enforces."""
    assert documented_layers(ARCHITECTURE.read_text(encoding="utf-8")) == LAYERS


def test_every_part_has_a_layer():
    parts = {
        p.stem if p.is_file() else p.name
        for p in PACKAGE.iterdir()
        if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists()))
    }
    assert parts - {FACADE} <= set(LAYERS), f"parts without a layer: {sorted(parts - set(LAYERS) - {FACADE})}"


def test_imports_only_go_down():
    bad = [v for path in sorted(PACKAGE.rglob("*.py")) for v in violations(path)]
    assert not bad, "upward or sideways imports:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from poslab.lab import experiments\n", True),  # nn -> lab: upward
        ("from poslab import GPT\n", True),  # the facade from inside the package
        ("import poslab.display\n", True),  # sideways, same layer
        ("from poslab.config_keys import reject_unknown_keys\n", False),
        ("import torch\n", False),
    ],
)
def test_checker_flags_an_upward_import(tmp_path, monkeypatch, source, expected):
    """The checker itself can fail: a planted nn module with an upward import is reported."""
    fake = tmp_path / "poslab"
    (fake / "nn").mkdir(parents=True)
    planted = fake / "nn" / "planted.py"
    planted.write_text(source)
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    assert bool(violations(planted)) is expected


# ------------------------------------------------------------------------------------ experiments
EXPERIMENTS = PACKAGE / "lab" / "experiments"
#: imports between experiments that remain, each named with why (none: the zoo's table is read through
#: poslab.lab.zoo and the lessons' quotations through poslab.lab.lesson_quotes). The test fails when one goes.
KNOWN_CROSSINGS: set[tuple[str, str]] = set()


def experiment_names() -> list[str]:
    """The experiment modules' names, from the registry's list (``poslab.lab.experiments._MODULES``)."""
    tree = ast.parse((EXPERIMENTS / "__init__.py").read_text())
    listed = next(
        n.value for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "_MODULES"
    )
    return [ast.literal_eval(e).rsplit(".", 1)[1] for e in listed.elts]


def owner(module: str, names: list[str]) -> str | None:
    """The experiment a module of ``poslab.lab.experiments`` is part of: its own name, a ``NAME_part`` helper module
    or a module of the ``NAME`` package; ``None`` for the shared modules (``common``, ``training``, ...)."""
    first = module.split(".")[0]
    return next((n for n in sorted(names, key=len, reverse=True) if first == n or first.startswith(n + "_")), None)


def experiment_crossings(folder: Path, names: list[str]) -> list[tuple[str, str, str]]:
    """``(importer, imported experiment, where)`` for every import of one experiment's module by another's."""
    prefix = "poslab.lab.experiments."
    found = []
    for path in sorted(folder.rglob("*.py")):
        module = ".".join(path.relative_to(folder).with_suffix("").parts)
        mine = owner(module, names)
        if mine is None:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        targets = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets += [(node.lineno, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module == prefix[:-1]:
                targets += [(node.lineno, prefix + a.name) for a in node.names]  # a module or a name of __init__
            elif isinstance(node, ast.ImportFrom) and node.module:
                targets.append((node.lineno, node.module))
        for line, target in targets:
            if not target.startswith(prefix):
                continue
            theirs = owner(target[len(prefix) :], names)
            if theirs is not None and theirs != mine:
                found.append((mine, theirs, f"{path.relative_to(folder)}:{line} imports {target}"))
    return found


def test_no_experiment_imports_another():
    """An experiment imports the shared modules only; the lab models several share come from the store."""
    crossings = experiment_crossings(EXPERIMENTS, experiment_names())
    bad = [where for mine, theirs, where in crossings if (mine, theirs) not in KNOWN_CROSSINGS]
    assert not bad, "experiments importing other experiments:\n" + "\n".join(bad)
    assert {(mine, theirs) for mine, theirs, _ in crossings} == KNOWN_CROSSINGS, "a known crossing is gone: drop it"


def test_the_experiment_import_check_can_fail(tmp_path):
    """A planted experiment that imports another's helper module, or another experiment through the package, is
    reported; its own helper module and the shared modules are not."""
    (tmp_path / "alpha.py").write_text(
        "from poslab.lab.experiments import common, alpha_tables\nfrom poslab.lab.experiments.training import SEEDS\n"
    )
    (tmp_path / "alpha_tables.py").write_text("from poslab.lab.experiments import beta\n")
    (tmp_path / "beta.py").write_text("import poslab.lab.experiments.alpha_tables\n")
    found = {(mine, theirs) for mine, theirs, _ in experiment_crossings(tmp_path, ["alpha", "beta"])}
    assert found == {("alpha", "beta"), ("beta", "alpha")}


def folder_reads(folder: Path, names: dict[str, str]) -> list[str]:
    """Where a module of ``folder`` computes another experiment's folder: it climbs out of a folder (``.parent``,
    ``".."``) or joins another experiment's name (``names``: module -> experiment name) into a path (``/``)."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        module = ".".join(path.relative_to(folder).with_suffix("").parts)
        others = set(names.values()) - {names.get(owner(module, list(names)) or "")}
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            where = f"{path.relative_to(folder)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Attribute) and node.attr in ("parent", "parents"):
                found.append(f"{where} climbs out of a folder (.{node.attr})")
            parts = [node.left, node.right] if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) else []
            parts += node.args if isinstance(node, ast.Call) else []  # Path(out, "..", ...)
            values = [p.value for p in parts if isinstance(p, ast.Constant)]
            found += [f"{where} climbs out of a folder ('..')" for v in values if v == ".."]
            found += [f"{where} joins the experiment {v!r} into a path" for v in values if v in others]
    return found


def test_no_experiment_reads_another_s_folder():
    """The lab models several experiments read come from the store the pipeline gives them; no module under
    ``poslab/lab/experiments`` climbs out of its folder or joins another experiment's name into a path."""
    from poslab.lab.experiments import registry

    names = {m.__name__.rsplit(".", 1)[1]: name for name, m in registry().items()}
    assert folder_reads(EXPERIMENTS, names) == []


def test_the_folder_check_can_fail(tmp_path):
    (tmp_path / "alpha.py").write_text(
        "from pathlib import Path\n"
        "def models(out):\n    return Path(out) / 'models' / 'alpha'\n"  # its own name, in its own folder: fine
        "def theirs(out):\n    return Path(out).parent / 'beta' / 'models'\n"
        "def up(out):\n    return Path(out, '..', 'models')\n"
        "EXPERIMENT = declare(name='alpha', after=('beta',))\n"  # naming it for order: fine
    )
    found = folder_reads(tmp_path, {"alpha": "alpha", "beta": "beta"})
    assert sorted(f.split(" ", 1)[1] for f in found) == [
        "climbs out of a folder ('..')",
        "climbs out of a folder (.parent)",
        "joins the experiment 'beta' into a path",
    ], found
