"""The cell: a dataflow graph of one time step of one layer, as plain data."""

from __future__ import annotations

import hashlib
import json
from copy import deepcopy
from dataclasses import dataclass, field
from typing import Any

FORMAT = "cellfuse.cell/1"
GROUPS_VERSION = 1  # of the file's optional "groups" field
DEFAULT_SIZES = {"input": 512, "hidden": 512}


@dataclass
class Node:
    id: str
    op: str
    args: list[str] = field(default_factory=list)
    shape: list[str] | None = None  # weights only: ["input"|"hidden", ...], one or two dims
    value: float | None = None  # consts only
    extra: dict[str, Any] = field(default_factory=dict)  # "x-" keys, kept for the editor

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "op": self.op}
        if self.args:
            out["args"] = list(self.args)
        if self.shape is not None:
            out["shape"] = list(self.shape)
        if self.value is not None:
            out["value"] = self.value
        out.update(self.extra)
        return out


@dataclass
class Group:
    """Nodes the editor shows as one node under a name ("forget gate"). Presentation only: nothing
    that validates, plans, compiles or runs a cell reads its groups."""

    name: str
    nodes: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "nodes": list(self.nodes)}


@dataclass
class Cell:
    name: str
    nodes: list[Node] = field(default_factory=list)
    updates: dict[str, str] = field(default_factory=dict)
    output: str | None = None
    description: str = ""
    sizes: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_SIZES))
    layout: dict[str, list[float]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # top-level "x-" keys
    groups: list[Group] = field(default_factory=list)  # disjoint; for the editor only

    # -- lookup -------------------------------------------------------------------------------
    def node(self, node_id: str) -> Node:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)

    def has(self, node_id: str) -> bool:
        return any(n.id == node_id for n in self.nodes)

    def by_id(self) -> dict[str, Node]:
        """First node of each id (ids are unique in a valid cell)."""
        out: dict[str, Node] = {}
        for n in self.nodes:
            out.setdefault(n.id, n)
        return out

    def of_op(self, op: str) -> list[Node]:
        return [n for n in self.nodes if n.op == op]

    def consumers(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {n.id: [] for n in self.nodes}
        for n in self.nodes:
            for a in n.args:
                if a in out and n.id not in out[a]:
                    out[a].append(n.id)
        return out

    # -- editing ------------------------------------------------------------------------------
    def add(self, node: Node) -> Node:
        self.nodes.append(node)
        return node

    def rename(self, old: str, new: str) -> None:
        """Gives node `old` the id `new`; every reference follows. Callers check that `new` is free."""
        if new != old and self.has(new):
            raise ValueError(f"cannot rename '{old}' to '{new}': that id is taken")
        for n in self.nodes:
            if n.id == old:
                n.id = new
            n.args = [new if a == old else a for a in n.args]
        self.updates = {(new if s == old else s): (new if v == old else v)
                        for s, v in self.updates.items()}
        if self.output == old:
            self.output = new
        if old in self.layout:
            self.layout[new] = self.layout.pop(old)
        for g in self.groups:
            g.nodes = [new if m == old else m for m in g.nodes]

    def fresh_id(self, stem: str) -> str:
        taken = {n.id for n in self.nodes}
        if stem not in taken:
            return stem
        i = 1
        while f"{stem}{i}" in taken:
            i += 1
        return f"{stem}{i}"

    # -- serialisation ------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": FORMAT, "name": self.name}
        if self.description:
            out["description"] = self.description
        out["sizes"] = dict(self.sizes)
        out["nodes"] = [n.to_json() for n in self.nodes]
        out["updates"] = dict(self.updates)
        out["output"] = self.output
        if self.groups:
            out["groups"] = {"version": GROUPS_VERSION, "list": [g.to_json() for g in self.groups]}
        if self.layout:
            out["layout"] = {k: list(v) for k, v in self.layout.items()}
        out.update(self.extra)
        return out

    def structure_hash(self) -> str:
        """A hash of what the compiler sees (not the layout, the groups or editor keys)."""
        data = self.to_json()
        for key in ("layout", "groups", "description", "sizes"):
            data.pop(key, None)
        data = {k: v for k, v in data.items() if not k.startswith("x-")}
        data["nodes"] = [{k: v for k, v in n.items() if not k.startswith("x-")} for n in data["nodes"]]
        blob = json.dumps(data, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def copy(self) -> Cell:
        """An independent copy: nothing of it, editor data included, is shared with this cell."""
        return deepcopy(self)
