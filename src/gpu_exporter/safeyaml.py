"""YAML from untrusted or hand-written files and requests, bounded: aliases ("billion laughs")
may not expand the document beyond a node budget, and values quoted in error messages are cut.

PyYAML shares an aliased node rather than copying it, so loading an alias bomb is cheap; what
is not is everything after it that walks the value (validation, an echo, an error message that
prints it). So the budget counts nodes *with aliases expanded*, before anything is constructed.
Leaf module: imports nothing of ours.
"""

from __future__ import annotations

import reprlib
from typing import Any

import yaml

MAX_NODES = 100_000  # expanded nodes in a scenario file; its own nodes are a few hundred
MAX_QUOTED = 80  # characters of a value quoted in an error message

_QUOTE = reprlib.Repr()
_QUOTE.maxstring = MAX_QUOTED
_QUOTE.maxother = MAX_QUOTED
_QUOTE.maxlist = _QUOTE.maxtuple = _QUOTE.maxdict = _QUOTE.maxset = 6
_QUOTE.maxlevel = 3


class YamlBudgetError(yaml.MarkedYAMLError):
    """Refused: too many nodes once aliases are expanded, a recursive alias, or an alias where
    none is allowed. ``problem`` and ``problem_mark`` say what and where, as PyYAML's errors do."""


def load(text: str, *, max_nodes: int = MAX_NODES, aliases: bool = True) -> Any:
    """``yaml.safe_load`` of one document, refusing documents whose aliases expand beyond
    ``max_nodes`` nodes (or any alias, with ``aliases=False``)."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check(node, max_nodes, aliases)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def quote(value: Any) -> str:
    """``repr(value)`` for an error message, at most about :data:`MAX_QUOTED` characters, and
    cheap whatever the value's size."""
    return _QUOTE.repr(value)


def _check(root: yaml.Node, max_nodes: int, aliases: bool) -> None:
    sizes: dict[int, int] = {}  # expanded size of each node already measured, by id
    open_nodes: set[int] = set()  # nodes being measured: met again below themselves = recursion
    total = 0
    # Iterative post-order walk: a deeply nested document must not exhaust the Python stack.
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            open_nodes.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for child in _children(node))
            continue
        if key in sizes:
            if not aliases:
                _refuse(node, "aliases (*name) are not allowed here")
            total += sizes[key]  # an alias: the whole subtree again
        elif key in open_nodes:
            _refuse(node, "a recursive alias (an anchor used inside itself)")
        else:
            open_nodes.add(key)
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(_children(node)))
            total += 1
        if total > max_nodes:
            _refuse(node, f"more than {max_nodes} values once aliases are expanded")


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _refuse(node: yaml.Node, problem: str) -> None:
    raise YamlBudgetError(problem=problem, problem_mark=node.start_mark)
