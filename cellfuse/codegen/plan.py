"""The Plan: plain data that says what runs, on which buffers, for a whole forward pass.

Every backend executes the same Plan, lowered once (see `lowering`). A Plan is closed: it names buffers
(flat float arrays) and launches that read and write them through `Access`es, and each kernel launch
carries its body as typed instructions (an op of the op table over values and literals), so that no
backend needs the cell to execute it. The step index t moves an access's rows by a rule (`Slot`), and
every executor and emitter resolves addresses with one expression per access (see `address`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from ..graph_model import OpSpec, Sizes
from .address import Rows, Slot, access_offset, rows_of
from .dtypes import COMPUTE, FLOAT32, DType
from .tiling import GemmTiling, SharedRegions

# The place of a buffer with a row block per step that one step reads, and the same read by all T steps.
ALL_STEPS: dict[Slot, Slot] = {"t": "all", "t+1": "all+1"}

# With Plan.layer_streams, at most this many layers run side by side: layer l uses the streams of layer
# l - SIDE_BY_SIDE, after it (so that a deep stack does not make thousands of streams and cuBLAS handles).
SIDE_BY_SIDE = 8


@dataclass(frozen=True)
class Target:
    """What the scheduler needs to know of the GPU for a persistent plan."""

    sm_count: int
    smem_per_block: int  # bytes of shared memory one block may have (the opt-in maximum)

    @property
    def name(self) -> str:
        return f"{self.sm_count} SMs, {self.smem_per_block // 1024} KiB of shared memory per block"


H100 = Target(132, 227 * 1024)  # also the H200's numbers; the CUDA runtime asks its own GPU


@dataclass(frozen=True)
class Access:
    """Where a value lives: rows of `buffer` with row stride `ld`, from column `col`.

    kind: `row` values are [rows, width]; `vec` values are [width], the same for every row;
    `col` values are [rows, 1], one number per row (a row reduction's), the same for every column;
    `scalar` values are one number. `block` skips that many blocks of B rows (a layer's part of a
    [layers, B, .] buffer). `dtype` is its buffer's, which a kernel reads and writes it in."""

    buffer: str
    kind: Literal["row", "vec", "col", "scalar"] = "row"
    ld: int = 0
    col: int = 0
    slot: Slot = "fixed"
    block: int = 0
    dtype: DType = FLOAT32

    def offset(self, t: int, batch: int) -> int:
        """The element offset of the access's first element at step t (see `address.access_offset`)."""
        return access_offset(self).evaluate(t=t, batch=batch)


@dataclass(frozen=True)
class Buffer:
    name: str
    rows: Rows
    width: int
    # input: x; init and final: a state's [layers, B, hidden] values before the first step and after
    # the last (named "init.<state>" and "final.<state>"); the rest are the run's own.
    # grad: a backward pass's gradient (it starts at zero); ones: T*B ones, for column sums by GEMM
    role: Literal["input", "init", "final", "output", "state", "gemm", "value", "weight", "stacked", "bias",
                  "grad", "ones"]
    # where a weight-like buffer's contents come from: param keys, stacked along N (for `stacked`),
    # or (param key or None for zeros) per column block (for `bias`)
    sources: tuple[str | None, ...] = ()
    widths: tuple[int, ...] = ()  # for bias buffers: the width of each source's column block
    dtype: DType = FLOAT32  # what its elements are stored in

    def elements(self, sizes: Sizes) -> int:
        return rows_of(self.rows).evaluate(seq=sizes.seq, batch=sizes.batch, layers=sizes.layers) * self.width

    def nbytes(self, sizes: Sizes) -> int:
        return self.elements(sizes) * self.dtype.itemsize

    @property
    def is_weight(self) -> bool:
        """Whether the caller's parameters fill it (from `sources`): it changes only where the caller says
        so, never in a run."""
        return self.role in ("weight", "stacked", "bias")


@dataclass
class GemmGroup:
    """Matmuls that share their left operand, run as one GEMM on weights stacked along N."""

    name: str
    matmuls: list[str]
    left: str
    weights: list[str]
    k_dim: str  # "input" or "hidden"
    n_dims: list[str]
    hoisted: bool
    stage: int
    folded: dict[str, str] = field(default_factory=dict)  # add node -> its matmul; bias added in the GEMM
    biases: dict[str, str] = field(default_factory=dict)  # folded add node -> the bias weight it adds

    def bias_of(self, add_id: str) -> str:
        return self.biases[add_id]


@dataclass(frozen=True)
class Const:
    """A literal operand of an instruction."""

    value: float


@dataclass(frozen=True)
class Instr:
    """One elementwise op of a kernel's body: `result = op(*args)`; each arg names a value the kernel
    reads (one of its inputs) or computed before it in the body, or is a literal."""

    result: str
    op: OpSpec
    args: tuple[str | Const, ...]


@dataclass(frozen=True)
class GradInstr:
    """One step of a kernel's reverse sweep: `result` is the gradient, with respect to argument `arg`
    of `op`, of sum(dy * y), where y = op(*args) is the value named `y` and `dy` names its gradient
    (the op table's derivative rule). Gradient names start with GRAD, so they never clash with a node's."""

    result: str
    op: OpSpec
    arg: int
    dy: str
    args: tuple[str | Const, ...]
    y: str


GRAD = "∂"  # the first character of a gradient's name: not a valid node id's


def grad_of(value: str) -> str:
    """The name of the gradient of a value (as the adjoint's inputs and outputs call it)."""
    return GRAD + value


@dataclass
class Island:
    """Elementwise nodes that run as one kernel, one thread per element of a [rows, width] block."""

    name: str
    nodes: list[str]  # in topological order
    width_dim: str  # "input" or "hidden"
    hoisted: bool
    stage: int
    inputs: list[str] = field(default_factory=list)  # values read from memory
    outputs: list[str] = field(default_factory=list)  # values written to memory
    body: tuple[Instr, ...] = ()  # the nodes as instructions, in the same order


@dataclass(frozen=True)
class GemmLaunch:
    """C = op(A) @ op(W) (+ bias): a forward GEMM, or one of a backward pass (see `backward_plan`)."""

    group: str
    # m is T*B (hoisted) or B; in a backward pass also 1 (a column sum) or the weight's K dimension
    # ("input" or "hidden": a weight's gradient)
    row_kind: Rows | Literal["input", "hidden"]
    m: int  # rows
    n: int
    k: int
    a: Access  # [M, K] rows of A, or [K, M] when trans_a
    w: str  # buffer holding the [K, N] weights, row-major ([N, K] when trans_w)
    c: Access
    bias: str | None  # a [N] buffer added to every row of C
    # cuBLAS's transpose flags and beta = 1: a backward pass's dA = dC @ W^T, dW += A^T @ dC
    trans_a: bool = False
    trans_w: bool = False
    accumulate: bool = False  # C += op(A) @ op(W) instead of C = ...
    multiply: DType = FLOAT32  # what its operands are rounded to as they are multiplied (see `precision`)
    w_dtype: DType = FLOAT32  # what W's buffer stores (set with the accesses' types: precision.retyped)

    def __post_init__(self):
        # (a GEMM on tensor cores adds the bias after its products, the others start C from it: the two
        # agree only where C does not accumulate)
        if self.bias and self.accumulate:
            raise ValueError(f"{self.group}: a GEMM adds a bias or accumulates onto C, not both")

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k


@dataclass(frozen=True)
class KernelLaunch:
    island: str
    row_kind: Rows  # rows is T*B (hoisted), B, or 1 (an island of [N] and scalar values only)
    rows: int
    width: int
    inputs: tuple[tuple[str, Access], ...]
    outputs: tuple[tuple[str, Access], ...]
    body: tuple[Instr | GradInstr, ...]
    hoisted: bool
    accumulate: bool = False  # outputs add into memory (a backward kernel's gradients) instead of storing
    overwrites: frozenset[str] = frozenset()  # buffers it stores into all the same (see `written_once`)

    def adds(self, acc: Access) -> bool:
        """Whether an output adds into memory at `acc` rather than storing there."""
        return self.accumulate and acc.buffer not in self.overwrites

    @property
    def reduces_rows(self) -> bool:
        """Whether its body sums rows: then it runs a block per row (see `reduction_kernel_source`)."""
        return any(instr.op.is_reduction for instr in self.body)


Launch = GemmLaunch | KernelLaunch


@dataclass(frozen=True)
class PersistentItem:
    """One launch of a step, run inside a persistent kernel by every block on its own rows and columns.

    Block p is column block p % C of row group p // C (C = blocks / row_groups). It owns, of every width
    W, the columns `owned(W, C, p % C)`: of a kernel's width, and of each column block of a GEMM's
    stacked output (`columns` lists their widths); and the rows `owned(batch, row_groups, p // C)`.
    Elementwise work reads and writes only its own elements, so it needs no other block; a GEMM reads
    all of K of its rows of the left operand, so a grid-wide barrier goes before it when other blocks
    wrote that operand since the last one (`barrier`). A kernel that reduces rows (`by_rows`) runs a
    block per row instead, as its own kernel would: block p takes rows p, p + blocks, ..., every column;
    so it reads what other blocks wrote, and they read what it writes."""

    launch: GemmLaunch | KernelLaunch
    barrier: bool
    columns: tuple[int, ...]
    # a kernel of [N] and scalar values only (the same every step): every block computes all of it
    whole: bool = False
    # a GEMM whose block of weight columns stays in shared memory for all steps (else read from L2)
    on_chip: bool = False
    # a GEMM whose block of output columns, every row of the batch, stays in shared memory for the
    # elementwise work that reads it (else it goes through global memory); the kernel then holds at
    # most the plan's batch
    output_on_chip: bool = False
    # of a GEMM: how the block's threads share it (see `tiling.GemmTiling`)
    tiling: GemmTiling | None = None

    @property
    def mma(self) -> bool:
        """A GEMM on tensor cores (its weights on chip: the fragments load from there); in float32 each
        product as three fp16 ones over rows and columns scaled by powers of two (a = a_hi + a_lo, a_hi *
        b_lo + a_lo * b_hi + a_hi * b_hi: see GemmTiling.f16x3)."""
        return self.tiling is not None and self.tiling.mma

    @property
    def in_registers(self) -> bool:
        """A GEMM of one row at a time whose products are in registers, its output kept on chip as the
        warps' partial sums, which the elementwise work adds up."""
        return self.tiling is not None and self.tiling.in_registers

    @property
    def by_rows(self) -> bool:
        """A kernel that reduces rows: run a block per row."""
        return isinstance(self.launch, KernelLaunch) and self.launch.reduces_rows


def owned(size: int, parts: int, part: int) -> tuple[int, int]:
    """The part [first, last) of a size split into `parts` parts of ceil(size / parts): a block's columns
    of a width, or its row group's rows of the batch."""
    unit = -(-size // parts)
    return min(size, part * unit), min(size, (part + 1) * unit)


@dataclass(frozen=True)
class Exchange:
    """A GEMM operand of a persistent launch that one of its elementwise launches writes (items[writer])
    and every block reads in full (its row group's rows, all of K): the steps' values
    go through an exchange buffer, two slots of [batch, width] (step, value) pairs, as well as to the
    operand's own buffer. A reader at step t wants what the writer wrote at step t + `lag` (-1: the step
    before, whose value at the first step is the operand's initial rows, which each block publishes for
    its own elements before the loop; 0: the same step, earlier in it). The operand starts at column
    `col` of its buffer; the writer may write it in several outputs side by side (a backward step's
    gradients of the stacked gates), each to the exchange's columns from its own column less `col`."""

    buffer: str
    writer: int
    width: int
    lag: int
    col: int


@dataclass(frozen=True)
class StateCopies:
    """A state of a persistent launch: its initial value, where the steps read it, its final value."""

    initial: Access
    read: Access
    final: Access


def state_copies(state_read: dict[str, Access], hidden: int, layer: int,
                 buffers: Mapping[str, Buffer] | None = None) -> tuple[StateCopies, ...]:
    """Of a layer, per state (in `state_read`'s order): its block of init.s, where its steps read it (see
    `LayerPlan.state_read`), and its block of final.s; each of its buffer's type in `buffers` (float32
    where not given)."""
    def access(name: str) -> Access:
        dtype = buffers[name].dtype if buffers is not None else FLOAT32
        return Access(name, "row", hidden, block=layer, dtype=dtype)

    return tuple(StateCopies(access(f"init.{s}"), read, access(f"final.{s}"))
                 for s, read in state_read.items())


@dataclass(frozen=True)
class PersistentLaunch:
    """Every step of one layer in one launch: `blocks` blocks run `items` once per step, with grid-wide
    barriers between them where `barrier` says (then all resident at once: `cooperative`)."""

    layer: int
    items: tuple[PersistentItem, ...]
    blocks: int
    threads: int
    batch: int  # the plan's, the most the kernel holds (its shared memory is sized for it)
    row_groups: int
    row_tile: int  # rows of a GEMM's left operand staged in shared memory at a time, all of K
    shared: SharedRegions  # dynamic shared memory per block: on-chip weights and outputs, the staged operand
    note: str = ""  # why weights stay off chip, when some do
    reverse: bool = False  # the steps from the last to the first: a backward pass's
    # GEMM operands that pass between the blocks through an exchange buffer of (step, value) pairs, read
    # when their step tags say they are written, instead of through memory after a grid-wide barrier
    exchange: tuple[Exchange, ...] = ()
    # Of a forward launch, each state's initial value (init.s), where the steps read it (slot 0 holds the
    # initial value, slot seq the final one) and where its final value goes (final.s): the kernel
    # copies its own elements of both, before its first step and after its last, instead of copies
    # before and after it.
    states: tuple[StateCopies, ...] = ()
    # Whether the blocks meet at a grid-wide barrier after copying the initial states in (a block reads
    # other blocks' elements of a state before the step's first barrier), and before copying the final
    # ones out (a block per row wrote a state): see `persistent._states_barriers`
    initial_barrier: bool = False
    final_barrier: bool = False
    # Whether its blocks wait for each other (at barriers, or for an exchange's values), so that all of
    # them must be resident at once: a cooperative launch. Otherwise (a recurrence of elementwise work
    # only, IndRNN's) each block owns its elements for every step, and the launch is an ordinary one,
    # which may start while the kernel before it ends (programmatic dependent launch).
    cooperative: bool = True

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory per block."""
        return COMPUTE.itemsize * self.shared.floats

    @property
    def column_blocks(self) -> int:
        return self.blocks // self.row_groups

    @property
    def group_rows(self) -> int:
        """The most rows of the plan's batch that a block owns."""
        return -(-self.batch // self.row_groups)

    def unit(self, width: int) -> int:
        """The most columns of a width that a block owns."""
        return -(-width // self.column_blocks)

    def rows(self, block: int, batch: int) -> tuple[int, int]:
        """The rows [first, last) of the batch that a block owns."""
        return owned(batch, self.row_groups, block // self.column_blocks)

    def columns(self, width: int, block: int) -> tuple[int, int]:
        """The columns [first, last) of a width that a block owns."""
        return owned(width, self.column_blocks, block % self.column_blocks)

    @property
    def waits_per_step(self) -> int:
        """The points of a step where a block waits for what other blocks wrote: at a grid-wide barrier,
        or for its operand's values in an exchange."""
        return sum(item.barrier for item in self.items)

    def grid_barrier(self, item: PersistentItem) -> bool:
        """Whether the blocks meet at a grid-wide barrier before the item: where the plan puts a barrier,
        but for a GEMM where the operands go through exchanges (it waits for its operand there)."""
        return item.barrier and not (self.exchange and isinstance(item.launch, GemmLaunch))

    @property
    def barriers_per_step(self) -> int:
        """Grid-wide barriers a step waits at."""
        return sum(self.grid_barrier(item) for item in self.items)

    @property
    def exchange_waits_per_step(self) -> int:
        """The points of a step where a block waits for its operand in an exchange."""
        return self.waits_per_step - self.barriers_per_step

    @property
    def waits_text(self) -> str:
        """How a step waits for other blocks, in words."""
        barriers = f"{self.barriers_per_step} grid-wide barrier(s)"
        if self.exchange:
            return (f"{self.exchange_waits_per_step} wait(s) per step for values in an exchange, "
                    + (barriers if self.barriers_per_step else "no grid-wide barrier"))
        return f"{barriers} per step"

    @property
    def label(self) -> str:
        return f"layer {self.layer}"


@dataclass(frozen=True)
class ParamPart:
    """A parameter key's place in a weight-like buffer: `rows` rows of `width` columns from column `col`,
    the buffer's rows `ld` floats long."""

    buffer: str
    key: str
    col: int
    width: int
    ld: int
    rows: int


@dataclass
class LayerPlan:
    layer: int
    input_size: int
    prologue: list[Launch]
    step: list[Launch]
    x: Access  # the layer's input at step t
    state_read: dict[str, Access]  # where each state is read at step t (slot 0 holds the initial value)
    output_seq: str  # the [T+1, B, hidden] buffer whose rows B.. hold the layer's output sequence
    persistent: PersistentLaunch | None = None  # the step loop as one launch, in place of `step`


@dataclass
class Plan:
    cell_name: str
    description: str
    schedule: str
    sizes: Sizes
    state_ids: tuple[str, ...]  # the cell's states, in the order of its updates
    params: dict[str, tuple[int, ...]]  # every parameter key a run needs, with its shape, in file order
    groups: list[GemmGroup]
    islands: list[Island]
    layers: list[LayerPlan]
    buffers: dict[str, Buffer]
    dead: list[str]
    cuda_graph: bool = False
    # When > 0, the hoisted launches (the prologue) run in chunks of this many steps on a second stream,
    # beside the recurrence: step t waits only for its own chunk, not for all T steps' GEMMs.
    chunk_steps: int = 0
    # With chunk_steps: each layer's steps (and its hoisted chunks) on streams of its own, so that layer l
    # runs its chunk j of steps beside layer l-1's chunk j+1: a wavefront of chunks (of SIDE_BY_SIDE
    # layers at most).
    layer_streams: bool = False
    saves_steps: bool = False  # every step's states, values and GEMM outputs kept (see make_plan)
    target: Target | None = None  # the GPU a persistent plan is made for; its backward pass is too
    tensor_cores: bool = False  # the GEMMs of its persistent kernels (and its backward's) on tensor cores
    precision: str = "fp32"  # what its GEMMs multiply in (see `precision`); each buffer has its own type

    @property
    def side_by_side(self) -> int:
        """How many layers run their steps at once: with `layer_streams`, as many as SIDE_BY_SIDE lets;
        otherwise one."""
        return min(self.sizes.layers, SIDE_BY_SIDE) if self.layer_streams else 1

    # -- what the plan says, for people and for `plan --json` -----------------------------------
    @property
    def launches_per_step(self) -> int:
        """Launches per step and layer: none where one persistent launch runs all of a layer's steps."""
        return 0 if self.layers[0].persistent else len(self.layers[0].step)

    def flops_per_step(self) -> int:
        """Floating-point operations of one step of one layer (GEMMs, and one per elementwise op)."""
        total = 0
        for launch in self.layers[0].step:
            match launch:
                case GemmLaunch():
                    total += launch.flops
                case KernelLaunch():
                    total += launch.rows * launch.width * len(launch.body)
                case _:
                    raise TypeError(f"unknown launch {launch!r}")
        return total

    def bytes_per_step(self) -> int:
        """Bytes one step of one layer reads and writes in global memory; a persistent launch's weights
        in shared memory are read once, not every step."""
        persistent = self.layers[0].persistent
        on_chip = {item.launch for item in persistent.items if item.on_chip} if persistent else set()
        total = 0
        for launch in self.layers[0].step:
            match launch:
                case GemmLaunch():
                    total += launch.m * launch.k * launch.a.dtype.itemsize
                    total += launch.m * launch.n * launch.c.dtype.itemsize
                    w = self.buffers[launch.w].dtype.itemsize
                    total += 0 if launch in on_chip else launch.k * launch.n * w
                    if launch.bias:
                        total += launch.m * launch.n * self.buffers[launch.bias].dtype.itemsize
                case KernelLaunch():
                    for _, acc in (*launch.inputs, *launch.outputs):
                        total += acc.dtype.itemsize * {"row": launch.rows * launch.width, "vec": launch.width,
                                                       "col": launch.rows, "scalar": 1}[acc.kind]
                case _:
                    raise TypeError(f"unknown launch {launch!r}")
        return total

    def buffer_elements(self, name: str) -> int:
        return self.buffers[name].elements(self.sizes)

    def group(self, name: str) -> GemmGroup:
        return next(g for g in self.groups if g.name == name)

    def island(self, name: str) -> Island:
        return next(i for i in self.islands if i.name == name)

    def param_parts(self) -> Iterator[ParamPart]:
        """Where each parameter key lives in the weight-like buffers: a weight as it is, a stacked
        weight's or a bias row's columns (a key may live in several)."""
        for b in self.buffers.values():
            if b.role == "weight":
                key = b.sources[0]
                shape = self.params[key]
                yield ParamPart(b.name, key, 0, shape[-1], shape[-1], math.prod(shape[:-1]))
            elif b.role in ("stacked", "bias"):
                widths = b.widths if b.role == "bias" else tuple(self.params[key][1] for key in b.sources)
                rows = 1 if b.role == "bias" else self.params[b.sources[0]][0]
                col = 0
                for key, width in zip(b.sources, widths, strict=True):
                    if key is not None:
                        yield ParamPart(b.name, key, col, width, sum(widths), rows)
                    col += width

    # -- the data a run starts from -------------------------------------------------------------
    def weight_arrays(self, params: dict[str, np.ndarray], dtype=np.float32) -> dict[str, np.ndarray]:
        """Every weight-like buffer, flat, built from the user's parameters (stacked where grouped)."""
        out: dict[str, np.ndarray] = {}
        for b in self.buffers.values():
            if b.role == "weight":
                out[b.name] = params[b.sources[0]].astype(dtype).reshape(-1)
            elif b.role == "stacked":
                out[b.name] = np.concatenate([params[k].astype(dtype) for k in b.sources], axis=1).reshape(-1)
            elif b.role == "bias":
                out[b.name] = np.concatenate([params[k].astype(dtype) if k else np.zeros(w, dtype)
                                              for k, w in zip(b.sources, b.widths, strict=True)])
        return out


def launch_name(launch: Launch) -> str:
    """The GEMM group or the island a launch runs."""
    match launch:
        case GemmLaunch():
            return launch.group
        case KernelLaunch():
            return launch.island
        case _:
            raise TypeError(f"unknown launch {launch!r}")
