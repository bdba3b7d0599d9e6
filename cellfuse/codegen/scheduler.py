"""The scheduler: from a validated cell, sizes and a schedule name to a Plan for the whole sequence.

Each rung of the ladder is a list of named passes (`LADDER`) over the cell's step: grouping matmuls
into GEMMs, hoisting the GEMMs that depend on no state out of the time loop, folding biases into them,
placing every node in a phase and a stage, and fusing elementwise nodes into kernels. Together they
decide what is independent of the sizes; `_Layer` then gives every value of every layer a buffer and
turns groups and islands into launches with concrete sizes and addresses.

Multi-layer: layer l's hoisted launches read layer l-1's output sequence, in chunks of steps
(`HOIST_CHUNK_STEPS`) where they run beside the loop. The layers run one after another, but in the
wavefront rung, which gives each layer streams of its own so that layer l runs a chunk of its steps
beside layer l-1's next chunk (see `lowering`).

The persistent rung keeps the hoisted rung's launches, but for the row reductions that depend on no
state, which it runs before the loop, and runs each layer's step loop as one cooperative launch (see
`persistent`); the tensor rung runs the GEMMs of the persistent rung's launches on tensor
cores, each float32 product as three fp16 ones over rows and columns scaled by powers of two (float32's
error for values within 2^-26 of their row's and column's largest), at a third of fp16's rate on the
tensor cores, several times the CUDA cores'.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass

from ..graph_model import (
    Cell,
    CellError,
    CellInfo,
    Node,
    Sizes,
    expected_params,
    param_key,
    require_valid,
    state_dependent,
)
from ..graph_model.limits import MAX_LAYERS
from ..graph_model.ops import OPS
from ..graph_model.params import check_widths
from ..graph_model.validate import ONE, ROW, check_count
from .gemm_routes import on_tensor_cores
from .persistent import persistent_launch
from .plan import (
    H100,
    Access,
    Buffer,
    Const,
    GemmGroup,
    GemmLaunch,
    Instr,
    Island,
    KernelLaunch,
    Launch,
    LayerPlan,
    Plan,
    Target,
    state_copies,
)
from .precision import check_precision, with_precision

# Hoisted work runs in chunks of this many steps beside the recurrence (see Plan.chunk_steps): small
# enough that step 0 waits for little, large enough that each chunk's GEMM keeps the GPU busy.
HOIST_CHUNK_STEPS = 10

PRO, STEP = "pro", "step"  # the phases: once before the time loop, and in every step


class _Step:
    """What the passes know of the cell's step, and what they have decided so far."""

    def __init__(self, cell: Cell, info: CellInfo, precision: str, sizes: Sizes, hoisted_rows: int):
        self.cell, self.order, self.shapes = cell, info.order, info.shapes
        self.precision, self.sizes = precision, sizes
        self.hoisted_rows = hoisted_rows  # the rows of a hoisted GEMM's launch (a chunk's, or all steps')
        self.nodes: dict[str, Node] = cell.by_id()
        self.spec = {n: OPS[self.nodes[n].op] for n in self.order}
        self.consumers: dict[str, list[str]] = {n: [] for n in self.order}
        for n in self.order:
            for a in self.nodes[n].args:
                if n not in self.consumers[a]:
                    self.consumers[a].append(n)
        self.state_dep = state_dependent(cell, self.order)
        self.targets = set(cell.updates.values()) | {cell.output}
        # decided by the passes
        self.groups: list[GemmGroup] = []
        self.folded: dict[str, GemmGroup] = {}  # an add node whose bias a hoisted GEMM adds -> that GEMM
        self.phase: dict[str, str] = {}  # every live non-source node's phase
        self.stage: dict[str, int] = {}
        self.islands: list[Island] = []
        self.written_by: dict[str, str] = {}  # value -> island that writes it to memory

    def matmuls(self) -> list[str]:
        return [n for n in self.order if self.spec[n].is_matmul]

    def elementwise(self) -> list[str]:
        """Elementwise nodes and row reductions, which a kernel computes (a folded bias add is the GEMM's)."""
        return [n for n in self.order if self.spec[n].in_kernel and n not in self.folded]

    @property
    def group_of(self) -> dict[str, GemmGroup]:
        return {m: g for g in self.groups for m in g.matmuls}

    def on_tensor_cores(self, g: GemmGroup) -> bool:
        """Whether a hoisted GEMM runs on tensor cores with float32's accuracy (gemm_routes) in some
        layer: x is the input's width wide in the first, the hidden width above."""
        s = self.sizes
        for x_width in {s.input, s.hidden} if s.layers > 1 else {s.input}:
            dims = {"input": x_width, "hidden": s.hidden, ONE: 1, "": 1}
            if on_tensor_cores(self.hoisted_rows, sum(dims[d] for d in g.n_dims),
                               dims[self.shapes[g.left][-1]]):
                return True
        return False


Pass = Callable[[_Step], None]


# -- grouping -------------------------------------------------------------------------------------
def _group(st: _Step, key: Callable[[str], str]) -> None:
    by_key: dict[str, GemmGroup] = {}
    for n in st.matmuls():
        left, w = st.nodes[n].args
        if key(n) not in by_key:
            by_key[key(n)] = GemmGroup(f"gemm{len(by_key)}", [], left, [], st.shapes[left][1], [],
                                       hoisted=False, stage=0)
        g = by_key[key(n)]
        g.matmuls.append(n)
        g.weights.append(w)
        g.n_dims.append(st.shapes[n][1])
    st.groups = list(by_key.values())


def gemm_each(st: _Step) -> None:
    """One GEMM per matmul node."""
    _group(st, lambda m: m)


def gemm_per_left_operand(st: _Step) -> None:
    """Matmuls that share their left operand become one GEMM on weights stacked along N."""
    _group(st, lambda m: st.nodes[m].args[0])


# -- hoisting -------------------------------------------------------------------------------------
def hoist(st: _Step) -> None:
    """A GEMM whose left operand depends on no state runs once for all steps, before the loop."""
    for g in st.groups:
        g.hoisted = not st.state_dep[g.left]


def fold_biases(st: _Step) -> None:
    """A bias added directly to a hoisted matmul (its only use) is added by the hoisted GEMM itself.
    A matmul that is also an update or the output has another use: its own value must stay readable.
    Not in a 16-bit plan: its GEMMs (cublasGemmEx) cannot add a bias as they write, so a folded one
    costs a pass writing the bias into every row and the GEMM reading them back (the GRU's input GEMM at
    B=64 in bf16: 0.096 ms against 0.035 alone, benchmarks/probes/folded_bias_probe.py), where the fused
    kernel that reads the GEMM's output adds it for nothing. Nor where a float32 GEMM runs on tensor
    cores at the plan's sizes: its pass after the GEMM would add the bias, reading and writing all of C,
    where with one scale per operand it otherwise returns at once (gemm_splits.cuh; the LSTM, which
    folds none, lost that pass's 42 us at B=64 on an H200:
    docs/results/2026-12-02-d-one-scale-per-operand.md; the GRU's three input biases added in its step
    instead: forward 5% faster at B=64 and 256, docs/results/2026-12-02-g-input-biases-in-the-step.md)."""
    if st.precision != "fp32":
        return
    for g in st.groups:
        if not g.hoisted or st.on_tensor_cores(g):
            continue
        for m in g.matmuls:
            if len(st.consumers[m]) != 1 or m in st.targets:
                continue
            c = st.consumers[m][0]
            other = [a for a in st.nodes[c].args if a != m]
            if (st.spec[c].folds_into_gemm and len(other) == 1 and st.nodes[other[0]].op == "weight"
                    and st.shapes[other[0]] == (st.shapes[m][1],)):
                g.folded[c] = m
                g.biases[c] = other[0]
                st.folded[c] = g


# -- placing --------------------------------------------------------------------------------------
def place(st: _Step, reductions_before_the_loop: bool = False) -> None:
    """Each node's phase (state-independent elementwise work runs before the loop when a hoisted GEMM
    needs it, and with `reductions_before_the_loop` also a row reduction that depends on no state, see
    `_hoist_reductions`) and stage (how many GEMMs of its own phase it waits for); each elementwise node
    as late as it can run, so that producers join the island of their consumers."""
    group_of, phase, stage = st.group_of, st.phase, st.stage
    for n in reversed(st.order):
        spec = st.spec[n]
        if spec.is_matmul:
            phase[n] = PRO if group_of[n].hoisted else STEP
        elif n in st.folded:
            phase[n] = PRO
        elif spec.in_kernel:
            feeds_pro = any(phase.get(c) == PRO for c in st.consumers[n] if c not in st.folded)
            feeds_pro = feeds_pro or any(group_of[c].hoisted for c in st.consumers[n]
                                         if st.spec[c].is_matmul and st.nodes[c].args[0] == n)
            phase[n] = PRO if not st.state_dep[n] and feeds_pro else STEP
    if reductions_before_the_loop:
        _hoist_reductions(st)

    def stage_in(v: str, reader: str) -> int:
        return stage[v] if phase.get(v) == reader else 0

    for n in st.order:
        spec = st.spec[n]
        if spec.is_source:
            stage[n] = 0
        elif spec.is_matmul:
            g = group_of[n]
            g.stage = stage_in(g.left, phase[n]) + 1
            stage[n] = g.stage
        elif n in st.folded:
            stage[n] = stage[st.folded[n].folded[n]]
        else:
            stage[n] = max((stage_in(a, phase[n]) for a in st.nodes[n].args), default=0)

    elementwise = st.elementwise()
    last = {p: max((stage[n] for n in st.order if phase.get(n) == p), default=0) for p in (PRO, STEP)}
    for n in reversed(elementwise):
        latest = [last[phase[n]]]
        for c in st.consumers[n]:
            if phase.get(c) != phase[n]:
                continue
            if st.spec[c].is_matmul:
                latest.append(group_of[c].stage - 1)
            elif c not in st.folded:
                latest.append(stage[c])
        stage[n] = max(stage[n], min(latest))


def _hoist_reductions(st: _Step) -> None:
    """A row reduction that depends on no state runs before the loop where what it reads is there (a
    hoisted GEMM's output, the input, weights), and with it what it needs and what needs it that depends
    on no state either (the layer norm of x W): in a persistent step a reduction is a block per row, while
    the other blocks wait; before the loop every step's rows are reduced at once. (In `graph` the
    hoisted kernel, run in chunks beside the loop, delayed the steps more than it saved them, as the
    layer-normalised LSTM at B=64 showed on an H100:
    docs/results/2026-11-26-persistent-rungs-changes-1-to-13.md, change 6.)"""
    phase = st.phase
    ready: set[str] = set()  # elementwise nodes that could run before the loop
    for n in st.elementwise():
        if not st.state_dep[n] and all(st.spec[a].is_source or phase.get(a) == PRO or a in ready
                                       for a in st.nodes[n].args):
            ready.add(n)
    after: set[str] = set()  # ... that are a reduction or read one
    for n in st.order:
        if n in ready and (st.spec[n].is_reduction or any(a in after for a in st.nodes[n].args)):
            after.add(n)
    hoisted = set(after)
    for n in reversed(st.order):  # and what those read
        if n in ready and any(c in hoisted for c in st.consumers[n]):
            hoisted.add(n)
    for n in hoisted:
        phase[n] = PRO


def place_reductions_before_the_loop(st: _Step) -> None:
    """`place`, with the row reductions that depend on no state before the loop."""
    place(st, reductions_before_the_loop=True)


# -- kernels --------------------------------------------------------------------------------------
def _width_dim(st: _Step, inside: list[str]) -> str:
    """The width of an island's rows: the hidden width where it reduces a row (its kernel runs a block per
    row), else that of its [batch, D] values, else 1 for [batch, 1] values only, else that of its [N]
    values."""
    if any(st.spec[n].is_reduction for n in inside):
        return "hidden"
    rows = [st.shapes[n][1] for n in inside if len(st.shapes[n]) == 2]
    return next((d for d in rows if d != ONE), rows[0] if rows else
                next((st.shapes[n][0] for n in inside if len(st.shapes[n]) == 1), ""))


def _islands(st: _Step, fuse: bool) -> None:
    elementwise = st.elementwise()

    def width(n: str) -> str:  # a [batch, 1] value goes with the hidden-wide rows it reduces or spreads over
        shape = st.shapes[n]
        return ("hidden" if shape[-1] == ONE else shape[-1]) if shape else ""

    # Rows of the two widths meet where they are tied (x + h), and a [batch, 1] value of a hidden-wide
    # row spreads over input-wide ones: within a stage, a value may need one of the other width computed
    # first. Each crossing starts a new level, so that islands in order of level never read a later one.
    level: dict[str, int] = {}
    for n in elementwise:
        if len(st.shapes[n]) == 2:
            level[n] = max((level[a] + (width(a) != width(n)) for a in st.nodes[n].args if a in level
                            and (st.phase[a], st.stage[a]) == (st.phase[n], st.stage[n])), default=0)
    key: dict[str, tuple] = {}
    for n in reversed(elementwise):
        if not fuse:
            key[n] = (st.phase[n], st.stage[n], level.get(n, 0), width(n), elementwise.index(n))
        elif n in level:
            key[n] = (st.phase[n], st.stage[n], level[n], width(n))
        else:  # [N] and scalar values join the first island that needs them
            key[n] = min(key[c] for c in st.consumers[n])
    members: dict[tuple, list[str]] = {}
    for n in elementwise:
        members.setdefault(key[n], []).append(n)

    for k in sorted(members, key=lambda k: (k[0] != PRO, k[1], k[2], str(k[3]), *k[4:])):
        inside = members[k]
        isl = Island(f"k{len(st.islands)}", inside, _width_dim(st, inside), hoisted=k[0] == PRO, stage=k[1])
        body = []
        for n in inside:
            args: list[str | Const] = []
            for a in st.nodes[n].args:
                if st.nodes[a].op == "const":
                    args.append(Const(float(st.nodes[a].value)))
                    continue
                args.append(a)
                if a not in inside and a not in isl.inputs:
                    isl.inputs.append(a)
            body.append(Instr(n, st.spec[n], tuple(args)))
        isl.body = tuple(body)
        isl.outputs = [n for n in inside if n in st.targets or any(c not in inside for c in st.consumers[n])]
        for n in isl.outputs:
            st.written_by[n] = isl.name
        st.islands.append(isl)


def kernel_each(st: _Step) -> None:
    """One kernel per elementwise node."""
    _islands(st, fuse=False)


def fuse(st: _Step) -> None:
    """Every elementwise node of one phase, stage and row width in one kernel."""
    _islands(st, fuse=True)


def store_the_rest(st: _Step) -> None:
    """A last kernel stores the updates and the output that no step kernel writes (a state updated to a
    matmul, a hoisted value, or another state)."""
    unstored = [v for v in dict.fromkeys([*st.cell.updates.values(), st.cell.output])
                if not (st.phase.get(v) == STEP and v in st.written_by)]
    if unstored:
        last = max([g.stage for g in st.groups if not g.hoisted] + [i.stage for i in st.islands], default=0)
        st.islands.append(Island(f"k{len(st.islands)}", [], "hidden", hoisted=False, stage=last + 1,
                                 inputs=list(unstored), outputs=list(unstored)))


@dataclass(frozen=True)
class Rung:
    passes: tuple[Pass, ...]
    cuda_graph: bool = False  # the whole forward pass captured once into a CUDA graph and replayed
    layer_streams: bool = False  # each layer's loop on its own stream, a chunk of steps behind the one below
    persistent: bool = False  # each layer's step loop is one cooperative launch
    tensor_cores: bool = False  # and the GEMMs in them on tensor cores, three fp16 products for each


_HOISTED = (gemm_per_left_operand, hoist, fold_biases, place, fuse, store_the_rest)
_PERSISTENT = (gemm_per_left_operand, hoist, fold_biases, place_reductions_before_the_loop, fuse,
               store_the_rest)
# The ladder of schedules; each keeps what the ones before it do, but `persistent` runs the layers one
# after another (a cooperative launch takes every SM), not as the wavefront does, and its row reductions
# that depend on no state before the loop.
LADDER: dict[str, Rung] = {
    "naive": Rung((gemm_each, place, kernel_each, store_the_rest)),
    "combined": Rung((gemm_per_left_operand, place, kernel_each, store_the_rest)),
    "fused": Rung((gemm_per_left_operand, place, fuse, store_the_rest)),
    "hoisted": Rung(_HOISTED),
    "graph": Rung(_HOISTED, cuda_graph=True),
    "wavefront": Rung(_HOISTED, cuda_graph=True, layer_streams=True),
    "persistent": Rung(_PERSISTENT, cuda_graph=True, persistent=True),
    "tensor": Rung(_PERSISTENT, cuda_graph=True, persistent=True, tensor_cores=True),
}
SCHEDULES = tuple(LADDER)


class _Layer:
    """Buffers and addresses of one layer."""

    def __init__(self, st: _Step, sizes: Sizes, layer: int, buffers: dict[str, Buffer], save_steps: bool):
        self.cell, self.shapes, self.st, self.layer, self.buffers = st.cell, st.shapes, st, layer, buffers
        self.T, self.B, self.H = sizes.seq, sizes.batch, sizes.hidden
        self.K = sizes.layer_input(layer)
        self.dims = {"input": self.K, "hidden": self.H, ONE: 1, "": 1}
        self.nodes = st.nodes
        self.p = f"l{layer}."
        # Every buffer name but a weight's has a dot after the layer prefix, so none is a weight's name.
        self.y = self._buffer(f"{self.p}out.y", "seq+1", self.H, "output")
        # A state whose update is the output lives in the output sequence: step t reads row block t
        # and writes block t+1, so no copy is needed. Other states alternate between two slots, and a
        # step's values and GEMM outputs are overwritten by the next step's, unless the steps are saved
        # (for a backward pass): then every step keeps its own rows, as the output sequence does.
        self.state_in_y = next((s for s, v in st.cell.updates.items() if v == st.cell.output), None)
        self.state_rows, self.state_read, self.state_write = (("seq+1", "t", "t+1") if save_steps
                                                             else ("pair", "t%2", "(t+1)%2"))
        self.step_rows, self.step_slot = ("seq", "t") if save_steps else ("batch", "fixed")
        self.state_buf = {s: self._buffer(f"{self.p}state.{s}", self.state_rows, self.H, "state")
                          for s in st.cell.updates if s != self.state_in_y}
        self.group_of = st.group_of
        self.fold_of = st.folded

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
        return self._buffer(f"{self.p}{g.name}.out", "seq" if g.hoisted else self.step_rows, n_total, "gemm")

    def kind(self, v: str) -> str:
        """The access kind of a value of a row per batch row: "col" for a [batch, 1] value."""
        return "col" if self.shapes[v] == (ROW, ONE) else "row"

    def value_buffer(self, v: str) -> str:
        shape = self.shapes[v]
        if len(shape) == 2:
            rows = "seq" if self.st.phase[v] == PRO else self.step_rows
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
            return Access(self.state_buf[v], "row", self.H, 0, self.state_read)
        if node.op == "weight":
            key = (param_key(self.layer, v),)
            return Access(self._buffer(f"{self.p}{v}", "one", self.width(v), "weight", key), "vec")
        if v in self.group_of or v in self.fold_of:
            g = self.group_of.get(v) or self.fold_of[v]
            m = g.folded.get(v, v)
            n_total, offsets = self._group_n(g)
            slot = seq if g.hoisted else self.step_slot
            return Access(f"{self.p}{g.name}.out", "row", n_total, offsets[g.matmuls.index(m)], slot)
        return self.stores(v)[0] if self.st.phase[v] == STEP else self._pro_value(v, reader)

    def _pro_value(self, v: str, reader: str) -> Access:
        name = f"{self.p}v.{v}"
        if len(self.shapes[v]) == 2:
            return Access(name, self.kind(v), self.width(v), 0, "t" if reader == STEP else "all")
        return Access(name, "vec" if self.shapes[v] else "scalar")

    def stores(self, v: str) -> list[Access]:
        """Where a step writes v: its own place first (where later launches of the step read it)."""
        out: list[Access] = []
        if v == self.cell.output:
            out.append(Access(self.y, "row", self.H, 0, "t+1"))
        for s, target in self.cell.updates.items():
            if target == v and s != self.state_in_y:
                out.append(Access(self.state_buf[s], "row", self.H, 0, self.state_write))
        if not out:
            name = self.value_buffer(v)
            if len(self.shapes[v]) == 2:
                out.append(Access(name, self.kind(v), self.width(v), 0, self.step_slot))
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
            by_matmul = {m: g.bias_of(a) for a, m in g.folded.items()}
            bias = self._buffer(f"{self.p}{g.name}.bias", "one", n_total, "bias",
                                tuple(param_key(self.layer, by_matmul[m]) if m in by_matmul else None
                                      for m in g.matmuls),
                                tuple(self.dims[d] for d in g.n_dims))
        phase = PRO if g.hoisted else STEP
        out = self.group_out(g)
        return GemmLaunch(g.name, "seq" if g.hoisted else "batch", self.T * self.B if g.hoisted else self.B,
                          n_total, self.dims[g.k_dim],
                          self.read(g.left, phase), w,
                          Access(out, "row", n_total, 0, "all" if g.hoisted else self.step_slot), bias)

    def columns(self, item: GemmGroup | Island) -> tuple[int, ...]:
        """The widths of a launch's column blocks: a GEMM's one per stacked weight, a kernel's one."""
        match item:
            case GemmGroup():
                return tuple(self.dims[d] for d in item.n_dims)
            case Island():
                return (self.dims[item.width_dim],)
            case _:
                raise TypeError(f"unknown item of a phase: {item!r}")

    def launch(self, item: GemmGroup | Island) -> Launch:
        match item:
            case GemmGroup():
                return self.gemm(item)
            case Island():
                return self.kernel(item)
            case _:
                raise TypeError(f"unknown item of a phase: {item!r}")

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
        return KernelLaunch(isl.name, row_kind, rows, self.dims[isl.width_dim], inputs, outputs, isl.body,
                            isl.hoisted)


def _ordered(st: _Step, hoisted: bool) -> list[GemmGroup | Island]:
    """Launch order of one phase: by stage, a stage's GEMMs before its kernels."""
    items: list[tuple[int, int, int, GemmGroup | Island]] = []
    for i, g in enumerate(st.groups):
        if g.hoisted == hoisted:
            items.append((g.stage, 0, i, g))
    for i, isl in enumerate(st.islands):
        if isl.hoisted == hoisted:
            items.append((isl.stage, 1, i, isl))
    return [it[3] for it in sorted(items, key=lambda it: it[:3])]


def _check_plan_sizes(sizes: Sizes) -> None:
    """Every size a whole number of at least 1, and no more layers than a run may have (the plan loops
    over them). Nothing is allocated for a plan, so the other sizes are bounded where they are used: by
    check_sizes before a run, by the int indices of the generated CUDA before an export."""
    for name in ("seq", "batch", "input", "hidden"):
        check_count(name, getattr(sizes, name), sys.maxsize)
    check_count("layers", sizes.layers, MAX_LAYERS)


def make_plan(cell: Cell, sizes: Sizes, schedule: str, target: Target = H100,
              save_steps: bool = False, precision: str = "fp32",
              float32_states: Collection[str] | None = None) -> Plan:
    """The Plan of `schedule` for the cell at these sizes; raises CellError if either is unusable. A
    persistent plan is made for `target`'s number of SMs and shared memory. With `save_steps`, every
    state, step value and recurrent GEMM output keeps its rows of every step (what a backward pass
    reads) instead of being overwritten by the next step's. `precision` and `float32_states`: see
    `precision.with_precision`."""
    check_precision(precision)
    if schedule not in LADDER:
        raise CellError(f"unknown schedule '{schedule}' (schedules: {', '.join(SCHEDULES)})")
    rung = LADDER[schedule]
    _check_plan_sizes(sizes)
    info = require_valid(cell)
    check_widths(sizes, cell, info)
    # (a hoisted GEMM's launch: all steps' rows where the loop is one persistent launch, else a chunk's)
    hoisted_rows = sizes.batch * (sizes.seq if rung.persistent else min(sizes.seq, HOIST_CHUNK_STEPS))
    st = _Step(cell, info, precision, sizes, hoisted_rows)
    for run_pass in rung.passes:
        run_pass(st)
    H = sizes.hidden
    buffers: dict[str, Buffer] = {"x": Buffer("x", "seq", sizes.input, "input")}
    for s in cell.updates:
        buffers[f"init.{s}"] = Buffer(f"init.{s}", "layers", H, "init")
        buffers[f"final.{s}"] = Buffer(f"final.{s}", "layers", H, "final")
    layers = []
    x = next(n.id for n in cell.nodes if n.op == "input")
    for layer in range(sizes.layers):
        lay = _Layer(st, sizes, layer, buffers, save_steps)
        prologue = [lay.launch(item) for item in _ordered(st, True)]
        looped = _ordered(st, False)
        step = [lay.launch(item) for item in looped]
        state_read = {s: lay.read(s, STEP) for s in cell.updates}
        persistent = None
        if rung.persistent:
            persistent = persistent_launch(lay.layer, step, [lay.columns(item) for item in looped], H,
                                           sizes.batch, target, save_steps, mma=rung.tensor_cores,
                                           states=state_copies(state_read, H, lay.layer),
                                           sixteen_bit=precision != "fp32")
        layers.append(LayerPlan(lay.layer, lay.K, prologue, step, lay.read(x, STEP), state_read, lay.y,
                                persistent))
    # The persistent kernel cannot wait for chunks of hoisted work mid-loop: its prologue runs first.
    hoisting = any(lp.prologue for lp in layers) and not rung.persistent
    chunk = min(sizes.seq, HOIST_CHUNK_STEPS) if hoisting else 0
    # the layers side by side only where a layer has more than one chunk to run beside another's
    side_by_side = rung.layer_streams and sizes.layers > 1 and 0 < chunk < sizes.seq
    plan = Plan(cell.name, cell.description, schedule, sizes, tuple(cell.updates),
                expected_params(cell, sizes.layers, sizes.input, sizes.hidden), st.groups, st.islands,
                layers, buffers, sorted(info.dead), cuda_graph=rung.cuda_graph,
                chunk_steps=chunk, layer_streams=side_by_side,
                saves_steps=save_steps,
                target=target if rung.persistent else None, tensor_cores=rung.tensor_cores)
    return with_precision(plan, cell, precision, float32_states)
