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
