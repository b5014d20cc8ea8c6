"""The one guarded reader of every YAML and JSON value poslab parses: files and command-line text alike.

Two shapes of input cost far more than their size, so both readers bound them before anything walks
the result (merging overrides, ``json.dumps``, ``str``, ``copy.deepcopy``):

* **depth**: ``[`` x 5000 is 10 kB, and every recursive walker (the YAML composer, ``json``, Python's
  own ``repr``) raises ``RecursionError`` on it. Both readers refuse more than :data:`MAX_DEPTH`
  levels (a poslab config nests four or five; a Hugging Face ``tokenizer.json`` under ten).
* **aliases** (YAML only): a document of a few hundred bytes can name an anchor nine times, that list
  nine times, and so on ("billion laughs"); ``safe_load`` builds it cheaply (the aliases share one
  object), but a walker expands it exponentially, past gigabytes. :func:`load_yaml` composes the node
  graph first, counts the values the document holds once every alias is expanded (shared sub-trees
  counted once per reference), and refuses more than :data:`MAX_VALUES`; a recursive alias (a node
  containing itself) is refused too. Only then is the document constructed.

This module is the lowest layer of the package (it imports nothing of poslab), so the value
coercion of :mod:`poslab.config_keys` and the corpus, preset, sweep and run-file readers all share it.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

#: values a YAML document may hold with every alias expanded (a preset or sweep file holds tens)
MAX_VALUES = 100_000
#: nesting levels a YAML or JSON document may have (lists and mappings inside each other)
MAX_DEPTH = 100


def load_yaml(text: str, what: str, max_values: int = MAX_VALUES, max_depth: int = MAX_DEPTH) -> Any:
    """Parse one YAML document like ``yaml.safe_load``, refusing alias bombs and deep nesting.

    Args:
        text: the YAML text.
        what: how the message names the source (``"sweep file 'x.yaml'"``, ``"--model.mla"``).
        max_values: bound on the expanded document's values.
        max_depth: bound on the nesting of lists and mappings.

    Raises:
        yaml.YAMLError: not YAML (callers format it).
        ValueError: the document expands to more than ``max_values`` values, aliases itself, or is
            nested deeper than ``max_depth``; the message names ``what`` and the bound.
    """
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise ValueError(_too_deep(what, max_depth)) from None
        if node is None:
            return None
        size = expanded_size(node, max_values, max_depth)
        if size is None:
            raise ValueError(
                f"{what} refers to itself through an alias (&anchor ... *anchor inside it); "
                f"poslab config values cannot be recursive"
            )
        if size < 0:
            raise ValueError(_too_deep(what, max_depth))
        if size > max_values:
            raise ValueError(
                f"{what} expands to more than {max_values:,} values through its aliases (*anchor); "
                f"poslab refuses such values (a config holds tens of values)"
            )
        try:
            return loader.construct_document(node)
        except RecursionError:
            raise ValueError(_too_deep(what, max_depth)) from None
    finally:
        loader.dispose()


def load_json(text: str | bytes, what: str, max_depth: int = MAX_DEPTH) -> Any:
    """Parse JSON like ``json.loads``, refusing nesting deeper than ``max_depth``.

    Args:
        text: the JSON text (bytes are decoded as UTF-8 by ``json``).
        what: how the message names the source (``"'factors.json'"``).
        max_depth: bound on the nesting of arrays and objects.

    Raises:
        ValueError: not JSON (``json.JSONDecodeError``, ``UnicodeDecodeError``: both ``ValueError``),
            or nested deeper than ``max_depth`` (the message names ``what`` and the bound).
    """
    try:
        data = json.loads(text)
    except RecursionError:
        raise ValueError(_too_deep(what, max_depth)) from None
    if _depth_exceeds(data, max_depth):
        raise ValueError(_too_deep(what, max_depth))
    return data


def _too_deep(what: str, max_depth: int) -> str:
    return (
        f"{what} is nested more than {max_depth} levels deep (lists or mappings inside each other); poslab refuses it"
    )


def _depth_exceeds(data: Any, max_depth: int) -> bool:
    """Whether parsed JSON nests deeper than ``max_depth`` (iterative: no Python recursion)."""
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (list, dict)):
            if depth >= max_depth:
                return True
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children if isinstance(child, (list, dict)))
    return False


def expanded_size(root: yaml.Node, limit: int, max_depth: int = MAX_DEPTH) -> int | None:
    """Values under ``root`` with aliases expanded (stops counting past ``limit``).

    Iterative (no Python recursion), each distinct node visited once: the size of a shared node is
    computed once and added for every reference to it.

    Returns:
        The count (at most ``limit + 1``); ``None`` if a node contains itself; ``-1`` if the graph
        nests deeper than ``max_depth``.
    """
    sizes: dict[int, int] = {}
    heights: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            children = _children(node)
            sizes[key] = min(1 + sum(sizes[id(child)] for child in children), limit + 1)
            heights[key] = 1 + max((heights[id(child)] for child in children), default=0) if children else 0
            if heights[key] > max_depth:
                return -1
            continue
        if key in sizes:
            continue
        if key in on_path:
            return None
        if len(on_path) > max_depth:
            return -1
        on_path.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in on_path:
                return None
            if id(child) not in sizes:
                stack.append((child, False))
    return sizes[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


__all__ = ["MAX_DEPTH", "MAX_VALUES", "expanded_size", "load_json", "load_yaml"]
