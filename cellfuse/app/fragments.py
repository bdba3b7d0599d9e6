"""Clipboard fragments: a few nodes of a cell, as plain JSON, and how to paste them into another cell.

A fragment keeps the links between its own nodes and drops the links to nodes it does not hold
(an arg it does not hold becomes None, so that the other args keep their ports), and the groups all
of whose nodes it holds. Pasted ids that are taken get fresh ones.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..graph_model import Cell, Group, group_name_problem

FRAGMENT_FORMAT = "cellfuse.fragment/1"
PASTE_MARGIN = 40.0  # between the copied nodes and their pasted copies
DEFAULT_NODE_HEIGHT = 80.0  # where the copied nodes are not on the canvas to measure


def fragment_ids(fragment: dict[str, Any]) -> list[str]:
    nodes = fragment.get("nodes", [])
    return [r["id"] for r in nodes if isinstance(r, dict) and isinstance(r.get("id"), str)]



def fragment_of(cell: Cell, ids: list[str], update_positions: dict[str, list[float]] | None = None
                ) -> dict[str, Any]:
    """The nodes `ids` of `cell`, with their layout and the updates of the states among them."""
    keep = [n for n in cell.nodes if n.id in set(ids)]
    held = {n.id for n in keep}
    nodes = []
    for n in keep:
        data = n.to_json()
        if n.args:
            data["args"] = [a if a in held else None for a in n.args]
        nodes.append(data)
    return {
        "format": FRAGMENT_FORMAT,
        "nodes": nodes,
        "updates": {s: v for s, v in cell.updates.items() if s in held and v in held},
        "states": [n.id for n in keep if n.op == "state"],
        "layout": {i: list(cell.layout[i]) for i in held if i in cell.layout},
        "update_layout": {s: list(p) for s, p in (update_positions or {}).items() if s in held},
        "groups": [g.to_json() for g in cell.groups if all(m in held for m in g.nodes)],
    }


def fragment_to_text(fragment: dict[str, Any]) -> str:
    return json.dumps(fragment)


def fragment_from_text(text: str) -> dict[str, Any] | None:
    """The fragment in a clipboard text, or None when the text holds none."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("format") != FRAGMENT_FORMAT:
        return None
    if not isinstance(data.get("nodes"), list):
        return None
    return data


def paste_offset(fragment: dict[str, Any], node_height: float) -> tuple[float, float]:
    """How far to move pasted nodes so that they land clear of their originals: below the copied
    nodes' bounding box (its height, a node's height and a margin) and a little to the right."""
    layout = fragment.get("layout") if isinstance(fragment.get("layout"), dict) else {}
    ys = [float(p[1]) for p in layout.values()
          if isinstance(p, list) and len(p) == 2 and all(isinstance(c, (int, float)) for c in p)]
    span = max(ys) - min(ys) if ys else 0.0
    return PASTE_MARGIN, span + node_height + PASTE_MARGIN


@dataclass
class PastedNode:
    id: str
    op: str
    args: list[str | None]
    shape: list[str] | None = None
    value: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    pos: tuple[float, float] | None = None


@dataclass
class PastePlan:
    nodes: list[PastedNode]
    updates: dict[str, str]  # new state id -> new id
    states: list[str]  # new ids of the pasted states, each gets an update node
    update_pos: dict[str, tuple[float, float]]
    groups: list[Group] = field(default_factory=list)  # under the new ids


def plan_paste(cell: Cell, fragment: dict[str, Any], offset: tuple[float, float] = (40.0, 40.0)
               ) -> PastePlan:
    """What pasting `fragment` into `cell` adds: the nodes under fresh ids, shifted by `offset`."""
    taken = {n.id for n in cell.nodes}
    renames: dict[str, str] = {}
    raw_nodes = [r for r in fragment.get("nodes", []) if isinstance(r, dict)
                 and isinstance(r.get("id"), str) and isinstance(r.get("op"), str)]
    for raw in raw_nodes:
        old = raw["id"]
        new = old
        if new in taken:
            stem = old.rstrip("0123456789") or old
            i = 1
            while f"{stem}{i}" in taken:
                i += 1
            new = f"{stem}{i}"
        taken.add(new)
        renames[old] = new

    def moved(p: Any) -> tuple[float, float] | None:
        if isinstance(p, list) and len(p) == 2 and all(isinstance(c, (int, float)) for c in p):
            return float(p[0]) + offset[0], float(p[1]) + offset[1]
        return None

    layout = fragment.get("layout", {}) if isinstance(fragment.get("layout"), dict) else {}
    nodes = []
    for raw in raw_nodes:
        args = raw.get("args", []) if isinstance(raw.get("args"), list) else []
        value = raw.get("value")
        shape = raw.get("shape")
        nodes.append(PastedNode(
            id=renames[raw["id"]], op=raw["op"],
            args=[renames.get(a) if isinstance(a, str) else None for a in args],
            shape=list(shape) if isinstance(shape, list) else None,
            value=float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None,
            extra={k: v for k, v in raw.items() if k.startswith("x-")},
            pos=moved(layout.get(raw["id"])),
        ))
    updates = {renames[s]: renames[v] for s, v in (fragment.get("updates") or {}).items()
               if s in renames and isinstance(v, str) and v in renames}
    states = [renames[n["id"]] for n in raw_nodes if n["op"] == "state"]
    upd_layout = fragment.get("update_layout", {}) if isinstance(fragment.get("update_layout"), dict) else {}
    update_pos = {renames[s]: p for s, raw in upd_layout.items() if s in renames
                  and (p := moved(raw)) is not None}
    groups = []
    for raw in fragment.get("groups", []) if isinstance(fragment.get("groups"), list) else []:
        if not isinstance(raw, dict) or group_name_problem(raw.get("name")) is not None:
            continue
        held = [renames[m] for m in raw.get("nodes", []) if isinstance(m, str) and m in renames] \
            if isinstance(raw.get("nodes"), list) else []
        if held:
            groups.append(Group(raw["name"], list(dict.fromkeys(held))))
    return PastePlan(nodes=nodes, updates=updates, states=states, update_pos=update_pos, groups=groups)
