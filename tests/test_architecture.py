"""docs/architecture.md's recipes: each core recipe's ``Files:`` line names the files that exist and
that define the registered schemes, mechanisms, backends, cache types and experiments (read from the
registries and the classes)."""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import inspect
import re
from pathlib import Path

import pytest

from poslab.nn import gpt_config, positions
from poslab.nn.attention import MASK_TERMS, REGISTRY, AttentionConfig, AttentionSpec, MultiHeadAttention
from poslab.nn.attention.backends import BACKENDS
from poslab.nn.attention.cache import KVCache
from poslab.nn.caches import CACHE_SPECS
from poslab.nn.mla import MultiHeadLatentAttention
from poslab.nn.streaming import StreamingKVCache

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
#: the recipes whose ``Files:`` line the test holds to the tree
CORE = (
    "add a position scheme",
    "add an attention mechanism",
    "add an attention backend",
    "add a KV-cache type",
    "add an experiment",
)


def recipe_files(title: str) -> list[str]:
    """The backticked paths of the ``Files:`` line (which may wrap) of recipe ``title``."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split(f"## Recipe: {title}\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"^Files: (.+?)\n\n", section, re.M | re.S)
    assert match, f"recipe {title!r} has no Files: line"
    return re.findall(r"`([^`]+)`", match.group(1))


def source(obj: object) -> str:
    return Path(inspect.getsourcefile(obj)).resolve().relative_to(ROOT).as_posix()  # type: ignore[arg-type]


def listed(path: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(path, re.sub(r"<\w+>", "*", p)) for p in patterns)


@pytest.mark.parametrize("title", CORE)
def test_every_file_a_recipe_names_exists(title: str) -> None:
    for name in recipe_files(title):
        matches = list(ROOT.glob(re.sub(r"<\w+>", "*", name)))
        assert matches, f"{title}: {name} is not in the tree"


def test_the_scheme_recipe_names_where_every_scheme_lives() -> None:
    files = recipe_files("add a position scheme")
    for name in positions.names():
        cls = positions.get(name)
        assert listed(source(cls), files), f"{name} is defined in {source(cls)}, which the recipe does not name"
        assert cls.__module__ in positions._MODULES  # the one line step 2 adds
    assert source(positions) in files  # the registry (``_MODULES``)


def _mechanism_tests(field: str) -> set[str]:
    """Test files whose ``MECHANISMS`` table has a case setting ``field``."""
    found = set()
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
                isinstance(t, ast.Name) and t.id == "MECHANISMS" for t in targets
            ):
                keys = {k.value for d in ast.walk(node.value) if isinstance(d, ast.Dict) for k in d.keys if k}
                if field in {k for k in keys if isinstance(k, str)}:
                    found.add(path.relative_to(ROOT).as_posix())
    return found


def mechanism_files(field: str) -> set[str]:
    """Where mechanism ``field`` is defined today: the spec, its mask term, the layer config, the
    layer's call, the per-layer keys, MLA's refusals and the tests' mechanism tables."""
    found = _mechanism_tests(field)
    if field in {f.name for f in dataclasses.fields(AttentionSpec)}:
        found.add(source(AttentionSpec))
    if field in MASK_TERMS:
        found.add(source(MASK_TERMS[field].keep))
    if field in {f.name for f in dataclasses.fields(AttentionConfig)}:
        found.add(source(AttentionConfig))
    if re.search(rf"\b{field}=", inspect.getsource(MultiHeadAttention._attend)):  # where the layer builds its spec
        found.add(source(MultiHeadAttention))
    if field in gpt_config.LAYER_ATTENTION_KEYS:
        found.add(source(gpt_config))
    if field in MultiHeadLatentAttention.UNSUPPORTED:
        found.add(source(MultiHeadLatentAttention))
    return found


def test_the_mechanism_recipe_names_the_files_of_an_existing_mechanism() -> None:
    """``chunk`` touches every step of the recipe (a mask term, per-layer, refused by MLA): its files
    are exactly the recipe's; ``window``'s (supported by MLA) are among them."""
    files = set(recipe_files("add an attention mechanism"))
    assert mechanism_files("chunk") == files
    assert mechanism_files("window") <= files and len(mechanism_files("window")) >= 5


def test_the_backend_recipe_names_where_the_backends_live() -> None:
    files = recipe_files("add an attention backend")
    for name in BACKENDS[1:]:
        backend = type(REGISTRY[name])
        assert listed(source(backend), files), f"backend {name!r} lives in {source(backend)}"
    test_file = ROOT / "tests" / "test_attention_backends.py"
    assert test_file.relative_to(ROOT).as_posix() in files
    assert "REGISTRY" in test_file.read_text(encoding="utf-8") or "backend_names" in test_file.read_text(
        encoding="utf-8"
    )


def cache_types() -> list[type]:
    """``KVCache`` and every subclass of it in the package (the modules the cache specs build from imported)."""
    found, todo = [], [KVCache]
    while todo:
        cls = todo.pop()
        if cls.__module__.startswith("poslab."):
            found.append(cls)
        todo += cls.__subclasses__()
    return found


def test_the_cache_recipe_names_where_every_cache_type_lives() -> None:
    files = recipe_files("add a KV-cache type")
    types = cache_types()
    assert StreamingKVCache in types and len(types) >= 3
    for cls in types:
        assert listed(source(cls), files), f"cache type {cls.__name__} lives in {source(cls)}"
        tests = [f for f in files if f.startswith("tests/")]
        named = [p for p in sorted((ROOT / "tests").glob("test_*.py")) if listed(p.relative_to(ROOT).as_posix(), tests)]
        assert any(cls.__name__ in p.read_text(encoding="utf-8") for p in named), f"no listed test names {cls.__name__}"
    for spec in CACHE_SPECS:  # the types ``GPT.make_cache`` takes
        assert listed(source(spec), files), f"cache spec {spec.__name__} lives in {source(spec)}"


def test_the_experiment_recipe_names_where_every_experiment_lives() -> None:
    """Each registered experiment's module matches the recipe's ``<name>.py`` (a package's ``__init__`` too),
    is one line of ``_MODULES`` in the listed ``__init__.py``, and the toy experiment's test is listed."""
    from poslab.lab import experiments

    files = recipe_files("add an experiment")
    modules = experiments.registry()
    assert len(modules) >= 10
    for name, module in modules.items():
        assert listed(source(module), files), f"experiment {name!r} lives in {source(module)}"
        assert module.__name__ in experiments._MODULES
    assert source(experiments) in files  # ``_MODULES``
    assert "declare(" in (ROOT / "tests" / "test_experiments.py").read_text(encoding="utf-8")  # the toy one
