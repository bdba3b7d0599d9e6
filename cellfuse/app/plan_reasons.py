"""Why each launch of a plan begins and ends where it does: the lines an outline's tooltip adds below
its label.

The plan does not record why the scheduler cut its work where it did; every reason here is read from
the plan's summary (which launch computes each node, which run before the loop) and from the cell's
wires and shapes, as the scheduler's passes decide (see codegen.scheduler): a GEMM is a launch of its
own, so fusion stops at every matmul; work that depends on no state runs once before the loop, the
rest at every step; a kernel's rows have one width; and a schedule that does not fuse gives every op
a kernel of its own (codegen.plan_text.SCHEDULE_LINES says what each schedule does).
"""

from __future__ import annotations

from collections.abc import Callable

from ..codegen.plan_text import SCHEDULE_LINES
from ..graph_model import Cell
from ..graph_model.validate import Shape

MAX_NAMES = 3  # values named in one line, then "and N more"


def _names(values: list[str]) -> str:
    shown = ", ".join(values[:MAX_NAMES])
    return shown + (f" and {len(values) - MAX_NAMES} more" if len(values) > MAX_NAMES else "")


class _Plan:
    """The summary's launches, indexed by node."""

    def __init__(self, summary: dict) -> None:
        self.schedule = str(summary.get("schedule", ""))
        self.kind: dict[str, str] = {}
        self.hoisted: dict[str, bool] = {}
        self.launch_of: dict[str, str] = {}
        for g in summary.get("gemm_groups", []):
            self.kind[g["name"]] = "gemm"
            self.hoisted[g["name"]] = bool(g.get("hoisted"))
            for n in [*g.get("matmuls", []), *g.get("folded", [])]:
                self.launch_of[n] = g["name"]
        kernels = summary.get("fused_kernels", [])
        for k in kernels:
            self.kind[k["name"]] = "fused"
            self.hoisted[k["name"]] = bool(k.get("hoisted"))
            for n in k.get("nodes", []):
                self.launch_of[n] = k["name"]
        # A schedule that fuses nothing: no kernel holds two ops.
        self.fuses = any(len(k.get("nodes", [])) > 1 for k in kernels) or not kernels

    def when(self, launch: str) -> str:
        return "once before the loop" if self.hoisted[launch] else "at every step"


def reasons(summary: dict, cell: Cell, shapes: Callable[[], dict[str, Shape]]) -> dict[str, list[str]]:
    """Each launch's name -> why it begins and ends where it does, one sentence a line. `shapes` gives
    the cell's shapes (asked for only where a reason needs a row's width)."""
    plan = _Plan(summary)
    why = _Apart(plan, cell, shapes)
    states = {target: state for state, target in cell.updates.items()}
    out: dict[str, list[str]] = {}
    for name, kind in plan.kind.items():
        # a plan made for the cell as it was a moment ago may name a node deleted since
        mine = [n for n, launch in plan.launch_of.items() if launch == name and n in why.nodes]
        lines = []
        if kind == "gemm":
            lines += _gemm_lines(name, mine, plan, why)
        elif not plan.fuses:
            line = SCHEDULE_LINES.get(plan.schedule)
            lines.append(f"Under '{plan.schedule}' nothing is fused" + (f": {line}." if line else "."))
        # What it reads from other launches, and what other launches read from it.
        before: dict[str, list[str]] = {}
        after: dict[str, list[str]] = {}
        for n in mine:
            for a in why.nodes[n].args:
                src = plan.launch_of.get(a)
                if src is not None and src != name and a not in before.get(src, []):
                    before.setdefault(src, []).append(a)
            for u in why.users.get(n, []):
                if (dst := plan.launch_of.get(u)) is not None and dst != name and n not in after.get(dst, []):
                    after.setdefault(dst, []).append(n)
        for other, values in before.items():
            because = why(other, name, values, name)
            lines.append(f"Begins after {other}, whose {_names(values)} it reads{because}.")
        for other, values in after.items():
            because = why(name, other, values, name)
            lines.append(f"Ends before {other}, which reads its {_names(values)}{because}.")
        for v in mine:
            if v in states or v == cell.output:
                what = f"the new value of state {states[v]}" if v in states else "the cell's output"
                lines.append(f"Writes {v}, {what}, at the end of the step.")
        out[name] = lines
    return out


def _gemm_lines(name: str, mine: list[str], plan: _Plan, why: _Apart) -> list[str]:
    nodes = why.nodes
    matmuls = [n for n in mine if nodes[n].op == "matmul"]
    lefts = list(dict.fromkeys(nodes[m].args[0] for m in matmuls))
    lines = ["A GEMM is a launch of its own (a cuBLAS call): fusion stops at it."]
    if plan.hoisted[name]:
        lines.append(f"Hoisted: {_names(lefts)} depends on no state, so it runs once for all steps, "
                     "before the loop.")
    elif any(why.on_state(v) for v in lefts):
        lines.append(f"Runs at every step: {_names(lefts)} depends on a state.")
    else:
        lines.append(f"Runs at every step: '{plan.schedule}' hoists nothing out of the loop.")
    apart = [g for g, kind in plan.kind.items() if kind == "gemm" and g != name
             and any(nodes[m].args[0] in lefts for m, launch in plan.launch_of.items()
                     if launch == g and m in nodes and nodes[m].op == "matmul")]
    if apart:
        line = SCHEDULE_LINES.get(plan.schedule, "")
        they = "it reads" if len(apart) == 1 else "they read"
        lines.append(f"Not stacked with {_names(apart)}, though {they} {_names(lefts)} too"
                     + (f": under '{plan.schedule}', {line}." if line else "."))
    return lines


class _Apart:
    """Why two launches, one reading `values` of the other, are not one: `why(first, second, values, me)`,
    said in the lines of launch `me`, is ": ..." or "" where the plan's data says nothing more."""

    def __init__(self, plan: _Plan, cell: Cell, shapes: Callable[[], dict[str, Shape]]) -> None:
        self.plan, self._shapes = plan, shapes
        self.nodes = cell.by_id()
        self._on_state: dict[str, bool] = {}
        self.users: dict[str, list[str]] = {n.id: [] for n in cell.nodes}
        for n in cell.nodes:
            for a in n.args:
                if a in self.users and n.id not in self.users[a]:
                    self.users[a].append(n.id)

    def on_state(self, v: str) -> bool:
        """Whether value `v` is a state or is computed from one."""
        if v not in self._on_state:
            self._on_state[v] = False  # a cycle (a cell with an error) ends here
            node = self.nodes[v]
            self._on_state[v] = node.op == "state" or any(self.on_state(a) for a in node.args
                                                          if a in self.nodes)
        return self._on_state[v]

    def __call__(self, first: str, second: str, values: list[str], me: str) -> str:
        plan = self.plan
        if "gemm" in (plan.kind[first], plan.kind[second]):
            return "" if plan.kind[me] == "gemm" else ": a GEMM is a launch of its own"
        if plan.hoisted[first] != plan.hoisted[second]:
            return f": {first} runs {plan.when(first)}, {second} {plan.when(second)}"
        if not plan.fuses:
            return ""
        if between := self._gemms_between(first, second):
            return f": {second} also waits for {_names(between)}, which needs what {first} computes"
        known = self._shapes()
        widths = {known[v][-1] for v in values if known.get(v)}
        theirs = {known[n][-1] for n, launch in plan.launch_of.items() if launch == second and known.get(n)}
        if widths and theirs and not widths & theirs:
            return (f": its rows are {_names(sorted(map(str, widths)))} wide, those of {second} "
                    f"{_names(sorted(map(str, theirs)))}, and a kernel's rows have one width")
        return ""

    def _gemms_between(self, first: str, second: str) -> list[str]:
        """The GEMMs of the step that `second` reads and whose left operand comes from `first`'s work."""
        plan = self.plan
        after_first = [n for n, launch in plan.launch_of.items() if launch == first]
        seen = set(after_first)
        while after_first:  # everything computed from `first`'s nodes
            for u in self.users.get(after_first.pop(), []):
                if u not in seen:
                    seen.add(u)
                    after_first.append(u)
        read = {plan.launch_of.get(a) for n, launch in plan.launch_of.items() if launch == second
                and n in self.nodes for a in self.nodes[n].args}
        return [g for g in plan.kind if plan.kind[g] == "gemm" and g in read and not plan.hoisted[g]
                and any(m in self.nodes and self.nodes[m].op == "matmul" and self.nodes[m].args[0] in seen
                        for m, launch in plan.launch_of.items() if launch == g)]
