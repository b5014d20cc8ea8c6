"""``yaml.safe_load`` with a bound on what aliases expand to: one guard for presets and sweep files.

A YAML file of a few hundred bytes can name an anchor nine times, that list nine times, and so on
("billion laughs"): ``safe_load`` builds it cheaply (the aliases share one object), but anything that
walks the result (merging overrides, ``json.dumps``, ``str``) expands it exponentially, past gigabytes.
:func:`load` composes the node graph first, counts the values the document holds once every alias is
expanded (shared sub-trees counted once per reference, each counted once), and refuses more than
:data:`MAX_VALUES`; a recursive alias (a node containing itself) and nesting deeper than the parser
allows are refused too. Only then is the document constructed.
"""

from __future__ import annotations

from typing import Any

import yaml

#: values a config document may hold with every alias expanded (a preset or sweep file holds tens)
MAX_VALUES = 100_000


def load(text: str, what: str, max_values: int = MAX_VALUES) -> Any:
    """Parse one YAML document like ``yaml.safe_load``, refusing alias bombs.

    Args:
        text: the YAML text.
        what: how the message names the source (``"sweep file 'x.yaml'"``).
        max_values: bound on the expanded document's values.

    Raises:
        yaml.YAMLError: not YAML (callers format it).
        ValueError: the document expands to more than ``max_values`` values, aliases itself, or is
            nested too deeply; the message names ``what``.
    """
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise ValueError(f"{what} is nested too deeply to read") from None
        if node is None:
            return None
        size = expanded_size(node, max_values)
        if size is None:
            raise ValueError(f"{what} refers to itself through an alias (&anchor ... *anchor inside it); "
                             f"poslab config files cannot be recursive")
        if size > max_values:
            raise ValueError(f"{what} expands to more than {max_values:,} values through its aliases (*anchor); "
                             f"poslab refuses such files (a config holds tens of values)")
        try:
            return loader.construct_document(node)
        except RecursionError:
            raise ValueError(f"{what} is nested too deeply to read") from None
    finally:
        loader.dispose()


def expanded_size(root: yaml.Node, limit: int) -> int | None:
    """Values under ``root`` with aliases expanded (stops counting past ``limit``); ``None`` if recursive.

    Iterative (no Python recursion), each distinct node visited once: the size of a shared node is
    computed once and added for every reference to it.
    """
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            total = 1 + sum(sizes[id(child)] for child in _children(node))
            sizes[key] = min(total, limit + 1)
            continue
        if key in sizes:
            continue
        if key in on_path:
            return None
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


__all__ = ["MAX_VALUES", "expanded_size", "load"]
