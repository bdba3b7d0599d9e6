"""Shared fixtures of the graph_model tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from script_loader import load_script

from cellfuse.graph_model import Cell, Node

ROOT = Path(__file__).resolve().parents[2]


def _node(spec: tuple[Any, ...] | Node) -> Node:
    """("id", "op", [args]) or ("id", "weight", None, [shape]) or ("id", "const", None, None, value)."""
    if isinstance(spec, Node):
        return spec
    nid, op, *rest = spec
    args = rest[0] if len(rest) > 0 and rest[0] is not None else []
    shape = rest[1] if len(rest) > 1 else None
    value = rest[2] if len(rest) > 2 else None
    return Node(nid, op, list(args), shape=shape, value=value)


def elman_nodes() -> list[tuple[Any, ...]]:
    """A small valid cell, h = tanh(x @ W + h @ U + b), that the validation tests break one way at a time."""
    return [
        ("x", "input"),
        ("h", "state"),
        ("W", "weight", None, ["input", "hidden"]),
        ("U", "weight", None, ["hidden", "hidden"]),
        ("b", "weight", None, ["hidden"]),
        ("xw", "matmul", ["x", "W"]),
        ("hu", "matmul", ["h", "U"]),
        ("a", "add", ["xw", "hu"]),
        ("a_b", "add", ["a", "b"]),
        ("h_new", "tanh", ["a_b"]),
    ]


@pytest.fixture
def make_cell() -> Callable[..., Cell]:
    """make_cell(nodes, updates=..., output=...) -> Cell, nodes given as compact tuples (or Nodes)."""

    def make(nodes: list[Any] | None = None, updates: dict[str, str] | None = None,
             output: str | None = "h_new", name: str = "test") -> Cell:
        nodes = elman_nodes() if nodes is None else nodes
        return Cell(name=name, nodes=[_node(n) for n in nodes],
                    updates={"h": "h_new"} if updates is None else updates, output=output)

    return make


@pytest.fixture
def elman_nodes_list() -> list[tuple[Any, ...]]:
    return elman_nodes()


@pytest.fixture(scope="session")
def make_templates_module() -> ModuleType:
    """scripts/make_templates.py, imported as a module."""
    return load_script("scripts/make_templates.py", "make_templates_under_test")
