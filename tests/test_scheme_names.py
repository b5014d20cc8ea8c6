"""Nothing outside ``poslab/nn/positions/`` names a position scheme or tests a scheme's type.

Walks every module of the package with ``ast`` and fails on

* ``isinstance(x, C)`` / ``issubclass(x, C)`` with ``C`` a registered scheme class (``RoPE``, ``ALiBi``, ...);
* a comparison (``==``, ``!=``, ``in``, ``not in``) with a string constant that is a registered scheme
  name (``cfg.position == "xl"``, ``scheme in ("rope", "xpos")``);
* ``hasattr``/``getattr`` with the name of a method only some scheme classes define (``"buckets"``,
  ``"frequencies"``): duck-typing a scheme is testing its type.

Code outside ``positions/`` asks the scheme instead: the derived ``embeds``/``rotates``/``has_bias``
flags, ``describe(T)``, ``check_layer``, ``rescalable()``/``rescaled_config``. The allow-list below
holds the modules that are *about* a named scheme (a lesson's experiment, a model family of interop),
each with its reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

import torch

from poslab.nn import positions
from poslab.nn.positions.base import PositionScheme

PACKAGE = Path(__file__).resolve().parents[1] / "poslab"
OWNER = PACKAGE / "nn" / "positions"

#: (module relative to poslab/, scheme name) -> why naming it there is right
ALLOWED: dict[tuple[str, str], str] = {
    ("interop/permute.py", "rope"): "model family: relayouts a RoPE checkpoint between half and interleaved pairs",
    ("lab/experiments/causal_leak.py", "none"): "experiment about NoPE: the lesson's table has a 'no positions' column",
    ("lab/experiments/causal_leak.py", "learned"): "experiment about the learned table: the lesson's 'learned' column",
    (
        "lab/experiments/context_extension.py",
        "none",
    ): "experiment about RoPE scalings: 'none' is its no-scaling variant",
    (
        "lab/experiments/position_training.py",
        "learned",
    ): "reports each scheme against GPT-2's learned table, the lessons' baseline",
    ("config.py", "none"): "the literal None of a CLI override ('none'/'null'), not the NoPE scheme",
    ("interop/llama4.py", "rope"): "model family: Llama 4's RoPE layers",
    ("interop/llama4.py", "none"): "model family: Llama 4's NoPE layers (every 4th)",
    (
        "lab/experiments/corrections/lesson000_heads.py",
        "alibi",
    ): "the zoo's 'position' column of published models, for the lesson's claim that modern LLMs hardly use ALiBi",
    ("explore/server.py", "none"): "the HTTP header value Sec-Fetch-Site: none, not the NoPE scheme",
    ("config_keys.py", "none"): "the literal None of a typed value given as text ('none'/'null'), not the NoPE scheme",
    (
        "lab/experiments/probes_claims.py",
        "none",
    ): "claims about NoPE: Kazemnejad et al.'s ranking and 'attention needs position'",
    ("interop/common.py", "rope"): "model family: the rotary families' check that every RoPE layer has rope_parameters",
    ("lab/experiments/extrapolation.py", "none"): "the premise of a scheme comparison: each positional arm beats NoPE",
    (
        "lab/experiments/position_training.py",
        "alibi",
    ): "the lesson's claim about ALiBi: it trains at nearly NoPE's speed",
    (
        "lab/experiments/position_training.py",
        "none",
    ): "the lesson's claim about ALiBi: it trains at nearly NoPE's speed",
}


def _scheme_classes() -> set[str]:
    names = set()
    for name in positions.names():
        for cls in positions.get(name).__mro__:
            if issubclass(cls, PositionScheme) and cls is not PositionScheme:
                names.add(cls.__name__)
    return names


def _scheme_only_methods() -> set[str]:
    """Attributes some scheme classes define that the base interface does not (so testing for them is a type test)."""
    base = set(dir(PositionScheme)) | set(dir(torch.nn.Module))
    out = set()
    for name in positions.names():
        for cls in positions.get(name).__mro__:
            if cls is PositionScheme or not issubclass(cls, PositionScheme):
                continue
            out |= {
                attr
                for attr, value in vars(cls).items()
                if callable(value) and not attr.startswith("_") and attr not in base
            }
    return out


def _string_constants(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def scheme_references(source: str) -> list[tuple[int, str, str]]:
    """``(line, kind, scheme or class)`` for every scheme-type test in ``source``."""
    names, classes, methods = set(positions.names()), _scheme_classes(), _scheme_only_methods()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("isinstance", "issubclass") and len(node.args) == 2:
                target = node.args[1]
                for item in target.elts if isinstance(target, ast.Tuple) else [target]:
                    label = (
                        item.id
                        if isinstance(item, ast.Name)
                        else item.attr
                        if isinstance(item, ast.Attribute)
                        else None
                    )
                    if label in classes:
                        found.append((node.lineno, node.func.id, label))
            if node.func.id in ("hasattr", "getattr") and len(node.args) >= 2:
                for text in _string_constants(node.args[1]):
                    if text in methods:
                        found.append((node.lineno, node.func.id, text))
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                for text in _string_constants(side):
                    if text in names:
                        found.append((node.lineno, "compare", text))
    return found


def test_the_scan_finds_every_kind_of_scheme_test() -> None:
    """The scanner itself: each form it must catch, and the forms it must let through."""
    caught = scheme_references(
        "from poslab.nn.positions.rope import RoPE\n"
        "isinstance(scheme, RoPE)\n"
        "issubclass(cls, (int, rope.XPos))\n"
        "cfg.position == 'xl'\n"
        "name in ('rope', 'xpos')\n"
        "hasattr(scheme, 'buckets')\n"
    )
    assert [(line, kind) for line, kind, _ in caught] == [
        (2, "isinstance"),
        (3, "issubclass"),
        (4, "compare"),
        (5, "compare"),
        (5, "compare"),
        (6, "hasattr"),
    ]
    assert (
        scheme_references("isinstance(x, PositionScheme)\nscheme.has_bias\nname == 'gpt2'\nhasattr(t, 'encode')\n")
        == []
    )


def test_no_module_outside_positions_names_or_type_tests_a_scheme() -> None:
    offences = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if OWNER in path.parents:
            continue
        module = path.relative_to(PACKAGE).as_posix()
        for line, kind, what in scheme_references(path.read_text(encoding="utf-8")):
            if (module, what) not in ALLOWED:
                offences.append(f"poslab/{module}:{line}: {kind} {what!r}")
    assert not offences, "ask the scheme (flags, describe(), check_layer(), rescalable()) instead of:\n" + "\n".join(
        offences
    )
