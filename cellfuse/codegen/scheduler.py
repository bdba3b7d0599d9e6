"""The scheduler: from a validated cell, sizes and a schedule name to a Plan for the whole sequence.

It works in two passes. `_structure` decides what is independent of the sizes: which matmuls form a
GEMM group, which groups are hoisted out of the time loop (and which bias adds fold into them), and
which elementwise nodes form one kernel. `_instantiate` gives every value of every layer a buffer and
turns groups and islands into launches with concrete sizes and addresses.

Multi-layer: each layer runs its whole sequence before the next starts; layer l's hoisted GEMMs read
layer l-1's finished output sequence in one GEMM. (The `wavefront` rung would overlap them.)
"""

from __future__ import annotations

from dataclasses import dataclass

from ..graph_model import Cell, CellError, Sizes, param_key, require_valid
from ..graph_model.ops import OPS
from .plan import (
    Access,
    Buffer,
    GemmGroup,
    GemmLaunch,
    Island,
    KernelLaunch,
    Launch,
    LayerPlan,
    Plan,
)

# The ladder of schedules; each keeps what the ones before it do.
SCHEDULES = ("naive", "combined", "fused", "hoisted", "graph")
_COMBINE, _FUSE, _HOIST = 1, 2, 3
# Hoisted work runs in chunks of this many steps beside the recurrence (see Plan.chunk_steps): small
# enough that step 0 waits for little, large enough that each chunk's GEMM keeps the GPU busy.
HOIST_CHUNK_STEPS = 10

PRO, STEP = "pro", "step"  # the phases: once before the time loop, and in every step


@dataclass
class _Structure:
    groups: list[GemmGroup]
    islands: list[Island]
    phase: dict[str, str]  # every live non-source node's phase
    written_by: dict[str, str]  # value -> island that writes it to memory


def _structure(cell: Cell, order: list[str], shapes: dict, level: int) -> _Structure:
    nodes = cell.by_id()
    kind = {n: OPS[nodes[n].op].kind for n in order}
    consumers: dict[str, list[str]] = {n: [] for n in order}
    for n in order:
        for a in nodes[n].args:
            if n not in consumers[a]:
                consumers[a].append(n)
    state_dep: dict[str, bool] = {}
    for n in order:
        state_dep[n] = nodes[n].op == "state" or any(state_dep[a] for a in nodes[n].args)

    # GEMM groups: one per matmul, or one per shared left operand.
    by_key: dict[str, GemmGroup] = {}
    for n in order:
        if kind[n] != "matmul":
            continue
        left, w = nodes[n].args
        key = n if level < _COMBINE else left
        if key not in by_key:
            by_key[key] = GemmGroup(f"gemm{len(by_key)}", [], left, [], shapes[left][1], [],
                                    hoisted=level >= _HOIST and not state_dep[left], stage=0)
        g = by_key[key]
        g.matmuls.append(n)
        g.weights.append(w)
        g.n_dims.append(shapes[n][1])
    groups = list(by_key.values())
    group_of = {m: g for g in groups for m in g.matmuls}

    # A bias added directly to a hoisted matmul (its only use) is added by the hoisted GEMM itself.
    # A matmul that is also an update or the output has another use: its own value must stay readable.
    targets = set(cell.updates.values()) | {cell.output}
    folded: dict[str, GemmGroup] = {}
    for g in groups:
        if not g.hoisted:
            continue
        for m in g.matmuls:
            if len(consumers[m]) != 1 or m in targets:
                continue
            c = consumers[m][0]
            other = [a for a in nodes[c].args if a != m]
            if (nodes[c].op == "add" and len(other) == 1 and nodes[other[0]].op == "weight"
                    and shapes[other[0]] == (shapes[m][1],)):
                g.folded[c] = m
                folded[c] = g

    # Phases: state-independent elementwise work runs before the loop when a hoisted GEMM needs it.
    phase: dict[str, str] = {}
    for n in reversed(order):
        if kind[n] == "matmul":
            phase[n] = PRO if group_of[n].hoisted else STEP
        elif n in folded:
            phase[n] = PRO
        elif kind[n] == "elementwise":
            feeds_pro = any(phase.get(c) == PRO for c in consumers[n] if c not in folded)
            feeds_pro = feeds_pro or any(group_of[c].hoisted for c in consumers[n]
                                         if kind[c] == "matmul" and nodes[c].args[0] == n)
            phase[n] = PRO if level >= _HOIST and not state_dep[n] and feeds_pro else STEP

    # Stages: how many GEMMs of its own phase a value waits for.
    stage: dict[str, int] = {}

    def stage_in(v: str, reader: str) -> int:
        return stage[v] if phase.get(v) == reader else 0

    for n in order:
        if kind[n] == "source":
            stage[n] = 0
        elif kind[n] == "matmul":
            g = group_of[n]
            g.stage = stage_in(g.left, phase[n]) + 1
            stage[n] = g.stage
        elif n in folded:
            stage[n] = stage[folded[n].folded[n]]
        else:
            stage[n] = max((stage_in(a, phase[n]) for a in nodes[n].args), default=0)

    # Each elementwise node runs as late as it can (before the first GEMM or kernel that needs it),
    # so that producers join the island of their consumers.
    elementwise = [n for n in order if kind[n] == "elementwise" and n not in folded]
    last = {p: max((stage[n] for n in order if phase.get(n) == p), default=0) for p in (PRO, STEP)}
    for n in reversed(elementwise):
        latest = [last[phase[n]]]
        for c in consumers[n]:
            if phase.get(c) != phase[n]:
                continue
            if kind[c] == "matmul":
                latest.append(group_of[c].stage - 1)
            elif c not in folded:
                latest.append(stage[c])
        stage[n] = max(stage[n], min(latest))

    # Islands: in `fused` and above, every elementwise node of one phase, stage and row width in one
    # kernel; [N] and scalar values join the first island that needs them. Below, a kernel each.
    key: dict[str, tuple] = {}
    for n in reversed(elementwise):
        shape = shapes[n]
        if level < _FUSE:
            width = shape[-1] if shape else ""
            key[n] = (phase[n], stage[n], width, elementwise.index(n))
        elif len(shape) == 2:
            key[n] = (phase[n], stage[n], shape[1])
        else:
            key[n] = min(key[c] for c in consumers[n])
    members: dict[tuple, list[str]] = {}
    for n in elementwise:
        members.setdefault(key[n], []).append(n)

    islands: list[Island] = []
    written_by: dict[str, str] = {}
    for k in sorted(members, key=lambda k: (k[0] != PRO, *k[1:2], str(k[2]), *k[3:])):
        inside = members[k]
        width_dim = next((shapes[n][1] for n in inside if len(shapes[n]) == 2),
                         next((shapes[n][0] for n in inside if len(shapes[n]) == 1), ""))
        isl = Island(f"k{len(islands)}", inside, width_dim, hoisted=k[0] == PRO, stage=k[1])
        for n in inside:
            for a in nodes[n].args:
                if a not in inside and nodes[a].op != "const" and a not in isl.inputs:
                    isl.inputs.append(a)
        isl.outputs = [n for n in inside
                       if n in targets or any(c not in inside for c in consumers[n])]
        for n in isl.outputs:
            written_by[n] = isl.name
        islands.append(isl)

    # What the step must still store: updates and the output that no step kernel writes.
    unstored = [v for v in dict.fromkeys([*cell.updates.values(), cell.output])
                if not (phase.get(v) == STEP and v in written_by)]
    if unstored:
        last = max([g.stage for g in groups if not g.hoisted] + [i.stage for i in islands], default=0)
        islands.append(Island(f"k{len(islands)}", [], "hidden", hoisted=False, stage=last + 1,
                              inputs=list(unstored), outputs=list(unstored)))
    return _Structure(groups, islands, phase, written_by)


class _Layer:
    """Buffers and addresses of one layer."""

    def __init__(self, plan_cell: Cell, shapes: dict, st: _Structure, sizes: Sizes, layer: int,
                 buffers: dict[str, Buffer]):
        self.cell, self.shapes, self.st, self.layer, self.buffers = plan_cell, shapes, st, layer, buffers
        self.T, self.B, self.H = sizes.seq, sizes.batch, sizes.hidden
        self.K = sizes.layer_input(layer)
        self.dims = {"input": self.K, "hidden": self.H, "": 1}
        self.nodes = plan_cell.by_id()
        self.p = f"l{layer}."
        # Every buffer name but a weight's has a dot after the layer prefix, so none is a weight's name.
        self.y = self._buffer(f"{self.p}out.y", "seq+1", self.H, "output")
        # A state whose update is the output lives in the output sequence: step t reads row block t
        # and writes block t+1, so no copy is needed. Other states alternate between two slots.
        self.state_in_y = next((s for s, v in plan_cell.updates.items() if v == plan_cell.output), None)
        self.state_buf = {s: self._buffer(f"{self.p}state.{s}", "pair", self.H, "state")
                          for s in plan_cell.updates if s != self.state_in_y}
        self.group_of = {m: g for g in st.groups for m in g.matmuls}
        self.fold_of = {a: g for g in st.groups for a in g.folded}

    def _buffer(self, name: str, rows: str, width: int, role: str, sources: tuple = (),
                widths: tuple = ()) -> str:
        self.buffers[name] = Buffer(name, rows, width, role, sources, widths)
        return name

    def width(self, v: str) -> int:
        return self.dims[self.shapes[v][-1]] if self.shapes[v] else 1

    def _group_n(self, g: GemmGroup) -> tuple[int, list[int]]:
        widths = [self.dims[d] for d in g.n_dims]
        offsets = [sum(widths[:i]) for i in range(len(widths))]
        return sum(widths), offsets

    def group_out(self, g: GemmGroup) -> str:
        n_total, _ = self._group_n(g)
        return self._buffer(f"{self.p}{g.name}.out", "seq" if g.hoisted else "batch", n_total, "gemm")

    def value_buffer(self, v: str) -> str:
        shape = self.shapes[v]
        if len(shape) == 2:
            rows = "seq" if self.st.phase[v] == PRO else "batch"
            return self._buffer(f"{self.p}v.{v}", rows, self.width(v), "value")
        return self._buffer(f"{self.p}v.{v}", "one", self.width(v), "value")

    def read(self, v: str, reader: str) -> Access:
        """Where a reader of the given phase finds v."""
        node = self.nodes[v]
        seq = "t" if reader == STEP else "all"
        if node.op == "input":
            if self.layer == 0:
                return Access("x", "row", self.K, 0, seq)
            return Access(f"l{self.layer - 1}.out.y", "row", self.H, 0, "t+1" if reader == STEP else "all+1")
        if node.op == "state":
            if v == self.state_in_y:
                return Access(self.y, "row", self.H, 0, "t")
            return Access(self.state_buf[v], "row", self.H, 0, "t%2")
        if node.op == "weight":
            key = (param_key(self.layer, v),)
            return Access(self._buffer(f"{self.p}{v}", "one", self.width(v), "weight", key), "vec")
        if v in self.group_of or v in self.fold_of:
            g = self.group_of.get(v) or self.fold_of[v]
            m = g.folded.get(v, v)
            n_total, offsets = self._group_n(g)
            slot = (seq if g.hoisted else "fixed")
            return Access(f"{self.p}{g.name}.out", "row", n_total, offsets[g.matmuls.index(m)], slot)
        return self.stores(v)[0] if self.st.phase[v] == STEP else self._pro_value(v, reader)

    def _pro_value(self, v: str, reader: str) -> Access:
        name = f"{self.p}v.{v}"
        if len(self.shapes[v]) == 2:
            return Access(name, "row", self.width(v), 0, "t" if reader == STEP else "all")
        return Access(name, "vec" if self.shapes[v] else "scalar")

    def stores(self, v: str) -> list[Access]:
        """Where a step writes v: its own place first (where later launches of the step read it)."""
        out: list[Access] = []
        if v == self.cell.output:
            out.append(Access(self.y, "row", self.H, 0, "t+1"))
        for s, target in self.cell.updates.items():
            if target == v and s != self.state_in_y:
                out.append(Access(self.state_buf[s], "row", self.H, 0, "(t+1)%2"))
        if not out:
            name = self.value_buffer(v)
            if len(self.shapes[v]) == 2:
                out.append(Access(name, "row", self.width(v), 0, "fixed"))
            else:
                out.append(Access(name, "vec" if self.shapes[v] else "scalar"))
        return out

    def gemm(self, g: GemmGroup) -> GemmLaunch:
        n_total, _ = self._group_n(g)
        if len(g.weights) == 1:
            k = self.dims[self.shapes[g.weights[0]][0]]
            w = self._buffer(f"{self.p}{g.weights[0]}", "one", k * n_total, "weight",
                             (param_key(self.layer, g.weights[0]),))
        else:
            w = self._buffer(f"{self.p}{g.name}.w", "one", self.dims[g.k_dim] * n_total, "stacked",
                             tuple(param_key(self.layer, x) for x in g.weights))
        bias = None
        if g.folded:
            by_matmul = {m: g.bias_of(self.cell, a) for a, m in g.folded.items()}
            bias = self._buffer(f"{self.p}{g.name}.bias", "one", n_total, "bias",
                                tuple(param_key(self.layer, by_matmul[m]) if m in by_matmul else None
                                      for m in g.matmuls),
                                tuple(self.dims[d] for d in g.n_dims))
        phase = PRO if g.hoisted else STEP
        out = self.group_out(g)
        return GemmLaunch(g.name, "seq" if g.hoisted else "batch", self.T * self.B if g.hoisted else self.B,
                          n_total, self.dims[g.k_dim],
                          self.read(g.left, phase), w,
                          Access(out, "row", n_total, 0, "all" if g.hoisted else "fixed"), bias)

    def kernel(self, isl: Island) -> KernelLaunch:
        phase = PRO if isl.hoisted else STEP
        has_rows = not isl.nodes or any(len(self.shapes[n]) == 2 for n in isl.nodes)
        row_kind = ("seq" if isl.hoisted else "batch") if has_rows else "one"
        rows = {"seq": self.T * self.B, "batch": self.B, "one": 1}[row_kind]
        inputs = tuple((v, self.read(v, phase)) for v in isl.inputs)
        if isl.hoisted:
            outputs = tuple((v, self._pro_value(v, PRO)) for v in isl.outputs)
            for v in isl.outputs:
                self.value_buffer(v)
        else:
            outputs = tuple((v, acc) for v in isl.outputs for acc in self.stores(v))
        return KernelLaunch(isl.name, row_kind, rows, self.dims[isl.width_dim], inputs, outputs)


def _ordered(st: _Structure, hoisted: bool) -> list[GemmGroup | Island]:
    """Launch order of one phase: by stage, a stage's GEMMs before its kernels."""
    items: list[tuple[int, int, int, GemmGroup | Island]] = []
    for i, g in enumerate(st.groups):
        if g.hoisted == hoisted:
            items.append((g.stage, 0, i, g))
    for i, isl in enumerate(st.islands):
        if isl.hoisted == hoisted:
            items.append((isl.stage, 1, i, isl))
    return [it[3] for it in sorted(items, key=lambda it: it[:3])]


def make_plan(cell: Cell, sizes: Sizes, schedule: str) -> Plan:
    """The Plan of `schedule` for the cell at these sizes; raises CellError if either is unusable."""
    if schedule not in SCHEDULES:
        raise CellError(f"unknown schedule '{schedule}' (schedules: {', '.join(SCHEDULES)})")
    info = require_valid(cell)
    level = min(SCHEDULES.index(schedule), _HOIST)
    st = _structure(cell, info.order, info.shapes, level)
    buffers: dict[str, Buffer] = {"x": Buffer("x", "seq", sizes.input, "input")}
    layers = []
    for layer in range(sizes.layers):
        lay = _Layer(cell, info.shapes, st, sizes, layer, buffers)
        phases: dict[bool, list[Launch]] = {}
        for hoisted in (True, False):
            phases[hoisted] = [lay.gemm(item) if isinstance(item, GemmGroup) else lay.kernel(item)
                               for item in _ordered(st, hoisted)]
        x = next(n.id for n in cell.nodes if n.op == "input")
        layers.append(LayerPlan(layer, lay.K, phases[True], phases[False], lay.read(x, STEP),
                                {s: lay.read(s, STEP) for s in cell.updates}, lay.y))
    chunk = min(sizes.seq, HOIST_CHUNK_STEPS) if any(lp.prologue for lp in layers) else 0
    return Plan(cell, schedule, sizes, st.groups, st.islands, layers, buffers, sorted(info.dead),
                cuda_graph=schedule == "graph", chunk_steps=chunk)
