"""Executes a Plan's lowered program with numpy: the same buffers, stacked weights, instructions, streams
and addresses as the CUDA executor, so that a scheduling bug shows on a machine without a GPU too.

The streams are interleaved as `execution_order` allows: by default the hoisted work runs as early as
its events let it, and `prefer=MAIN` runs it as late as the recurrence lets it; a Wait missing from the
program makes one of the two read a buffer nothing wrote (every buffer starts as NaN).

A persistent launch runs as its blocks would, each on its own rows and columns: between two grid-wide
barriers the blocks run one after another (in increasing order, or decreasing with `reverse_blocks`), each
all of its work up to the next barrier, possibly into the next step (the step before, in a backward
pass's reverse launch). A barrier missing from the plan then makes a block read another's value before
or after it was written, and the result differs from the reference. That shows in the first steps run;
after `CHECKED_STEPS` of them, where a correct plan gives the same either way, the blocks run together,
each launch on all rows and columns at once, so that a numpy timing of the persistent rung is not a
timing of running a hundred blocks one by one.

A plan in a 16-bit precision runs emulated: its buffers are arrays of the executor's type, and what is
stored into a 16-bit buffer is rounded to that type (`dtypes.round_to`), as are a GEMM's operands."""

from __future__ import annotations

import numpy as np

from ..codegen.dtypes import FLOAT32, round_to
from ..codegen.lowering import (
    SIDE,
    Copy,
    Gemm,
    Instruction,
    Kernel,
    Loop,
    Persistent,
    Record,
    Wait,
    as_instruction,
    element_offset,
    execution_order,
    lower,
)
from ..codegen.plan import (
    Access,
    Const,
    GemmLaunch,
    GradInstr,
    Instr,
    KernelLaunch,
    PersistentItem,
    PersistentLaunch,
    Plan,
)
from ..graph_model import Forward

CHECKED_STEPS = 3  # steps of a persistent launch run block by block


def run_body(body: tuple[Instr | GradInstr, ...], values: dict[str, np.ndarray], dtype: np.dtype) -> None:
    """Computes a kernel's body over arrays, adding each result to `values`: an op of the table by its
    numpy meaning, a gradient by its derivative rule. A row reduction (of a value, or of an adjoint's
    gradients) sums the arrays' last axis: the arrays must hold whole rows."""
    def arg(a: str | Const) -> np.ndarray:
        return dtype.type(a.value) if isinstance(a, Const) else values[a]

    with np.errstate(all="ignore"):  # a NaN or infinity is reported where the output is checked
        for instr in body:
            match instr:
                case Instr(result=result, op=op, args=args):
                    out = op.numpy(*map(arg, args))
                case GradInstr(result=result, op=op, arg=k, dy=dy, args=args, y=y):
                    out = op.grad[k](values[dy], *map(arg, args), values[y])
                case other:
                    raise TypeError(f"unknown instruction of a body: {other!r}")
            values[result] = np.asarray(out).astype(dtype, copy=False)


class NumpyExecutor:
    def __init__(self, plan: Plan, params: dict[str, np.ndarray], dtype=np.float32, prefer: int = SIDE,
                 reverse_blocks: bool = False):
        self.plan, self.dtype, self.prefer = plan, np.dtype(dtype), prefer
        self.reverse_blocks = reverse_blocks
        self.program = lower(plan)
        self.batch, self.seq = plan.sizes.batch, plan.sizes.seq
        self.buf = {name: np.empty(plan.buffer_elements(name), self.dtype) for name in plan.buffers}
        # the buffers stored in a 16-bit type (a backward pass adds its own)
        self.rounded = {name: b.dtype for name, b in plan.buffers.items() if b.dtype != FLOAT32}
        self.weights = {name: self.round(name, w)
                        for name, w in plan.weight_arrays(params, self.dtype).items()}
        self.buf.update(self.weights)

    def round(self, buffer: str, values: np.ndarray) -> np.ndarray:
        """`values` as buffer `buffer` holds them."""
        return round_to(self.rounded[buffer], values) if buffer in self.rounded else values

    @staticmethod
    def _operand(values: np.ndarray, multiply) -> np.ndarray:
        """A GEMM's operand as it multiplies it: rounded to its `multiply` type."""
        return values if multiply == FLOAT32 else round_to(multiply, values)

    def view(self, acc: Access, offset: int, rows: int, width: int) -> np.ndarray:
        """The [rows, width] block (or [width] vector, [rows, 1] column, or one scalar) of an access starting
        at `offset`."""
        flat = self.buf[acc.buffer]
        if acc.kind == "scalar":
            return flat[offset:offset + 1]
        if acc.kind == "vec":
            return flat[offset:offset + width]
        if acc.kind == "col":  # one number per row, spread over the columns by broadcasting
            width = 1
        end = offset + (rows - 1) * acc.ld + width
        if end > flat.size:
            raise IndexError(f"access {acc} at element {offset} runs past buffer '{acc.buffer}'")
        size = flat.itemsize
        return np.lib.stride_tricks.as_strided(flat[offset:end], (rows, width), (acc.ld * size, size))

    def execute(self, instr: Instruction, t: int = 0) -> None:
        B = self.batch
        match instr:
            case Gemm(launch=g):
                rows = instr.rows
                at = element_offset(instr, g.a, t, B)
                a = self.view(g.a, at, g.k, rows).T if g.trans_a else self.view(g.a, at, rows, g.k)
                w = self.buf[g.w].reshape(g.n, g.k).T if g.trans_w else self.buf[g.w].reshape(g.k, g.n)
                c = self.view(g.c, element_offset(instr, g.c, t, B), rows, g.n)
                product = self._operand(a, g.multiply) @ self._operand(w, g.multiply)
                if g.accumulate:
                    c += product
                else:
                    c[...] = product
                if g.bias:
                    c += self.buf[g.bias]
                if g.c.buffer in self.rounded:
                    c[...] = self.round(g.c.buffer, c)
            case Kernel(launch=k):
                self.kernel(instr, t, (0, instr.rows), (0, k.width))
            case Copy(src=src, dst=dst, width=width, step=step):
                at = self.seq if step is None else step
                self.view(dst, dst.offset(at, B), B, width)[...] = self.round(
                    dst.buffer, self.view(src, src.offset(at, B), B, width))
            case Loop(body=body):
                for step in instr.steps(self.seq):
                    for inner in body:
                        self.execute(inner, step)
            case Persistent(launch=p):
                self.persistent(p)
            case Record() | Wait():
                pass  # the order of `execution_order` already respects them
            case _:
                raise TypeError(f"the numpy executor cannot run {instr!r}")

    def kernel(self, instr: Kernel, t: int, rows: tuple[int, int], columns: tuple[int, int],
               part: int | None = None) -> None:
        """A kernel's rows [first, last) and columns [first, last) at step t: those of column block
        `part` of a persistent launch, or all of them."""
        k, B = instr.launch, self.batch
        row, count = rows[0], rows[1] - rows[0]
        first, width = columns[0], columns[1] - columns[0]
        if width == 0 or count == 0:  # a block of a persistent kernel that owns none of them
            return

        def at(acc: Access) -> tuple[Access, int, int, int]:
            shift = {"row": row * acc.ld + first, "vec": first, "col": row * acc.ld, "scalar": 0}[acc.kind]
            return acc, element_offset(instr, acc, t, B) + shift, count, width

        values = {v: self.view(*at(acc)) for v, acc in k.inputs}
        run_body(k.body, values, self.dtype)
        for v, acc in k.outputs:
            if acc.kind == "col" and part is not None and first != 0:
                continue  # one number per row: the block that owns the first column writes it, as on the GPU
            dst = self.view(*at(acc))
            value = np.broadcast_to(values[v], dst.shape) if values[v].ndim else values[v]
            if k.adds(acc):
                dst += value
            else:
                dst[...] = value
            if acc.buffer in self.rounded:
                dst[...] = self.round(acc.buffer, dst)

    def persistent(self, launch: PersistentLaunch) -> None:
        """Every step of a persistent launch, block by block between barriers (see the module's doc), each
        block copying its own elements of the states in before its first step and out after its last,
        as the kernel does."""
        steps = range(self.seq - 1, -1, -1) if launch.reverse else range(self.seq)
        # the blocks' work between barriers: (step, item), or (step, "in" / "out") for the states' copies
        spans: list[list[tuple[int, PersistentItem | str]]] = [[]]
        if launch.states:
            spans[-1].append((0, "in"))
            if launch.initial_barrier or launch.exchange:  # (publishing to an exchange ends in one)
                spans.append([])
        for t in steps:
            for item in launch.items:
                if item.barrier:
                    spans.append([])
                spans[-1].append((t, item))
        if launch.states:
            if launch.final_barrier:
                spans.append([])
            spans[-1].append((self.seq, "out"))
        blocks = range(launch.blocks - 1, -1, -1) if self.reverse_blocks else range(launch.blocks)
        for span in spans:
            past = all((self.seq - 1 - t if launch.reverse else t) >= CHECKED_STEPS for t, _ in span)
            for block in [None] if past else blocks:  # past the first steps: all rows and columns at once
                for t, item in span:
                    if isinstance(item, str):
                        self.copy_states(launch, item, block)
                    elif block is None:
                        self.execute(as_instruction(item.launch, self.batch), t)
                    else:
                        self.block_item(item, launch, block, t)

    def copy_states(self, launch: PersistentLaunch, way: str, block: int | None) -> None:
        """A block's own elements of a persistent launch's states (every block's where `block` is None)
        copied in ("in": initial value to slot 0) or out ("out": slot seq to final value)."""
        B = self.batch
        for state in launch.states:
            src, dst, at = ((state.initial, state.read, 0) if way == "in" else
                            (state.read, state.final, self.seq))
            width = state.initial.ld
            (r0, r1), (c0, c1) = (((0, B), (0, width)) if block is None else
                                  (launch.rows(block, B), launch.columns(width, block)))
            if r0 == r1:
                continue
            to, fro = (self.view(acc, acc.offset(at, B) + r0 * acc.ld, r1 - r0, width) for acc in (dst, src))
            to[:, c0:c1] = fro[:, c0:c1]

    def block_item(self, item: PersistentItem, launch: PersistentLaunch, block: int, t: int) -> None:
        """One block's part of one launch of a persistent kernel at step t."""
        B = self.batch
        first_row, last_row = launch.rows(block, B)
        match item.launch:
            case GemmLaunch() as g:
                if first_row == last_row:
                    return
                a = self._operand(self.view(g.a, g.a.offset(t, B) + first_row * g.a.ld, last_row - first_row,
                                            g.k), g.multiply)
                w = self._operand(self.buf[g.w].reshape(g.n, g.k).T if g.trans_w
                                  else self.buf[g.w].reshape(g.k, g.n), g.multiply)
                start = 0
                for width in item.columns:
                    first, last = (start + c for c in launch.columns(width, block))
                    start += width
                    if first == last:
                        continue
                    at = g.c.offset(t, B) + first_row * g.c.ld + first
                    c = self.view(g.c, at, last_row - first_row, last - first)
                    if g.accumulate:
                        c += a @ w[:, first:last]
                    else:
                        c[...] = a @ w[:, first:last]
                    if g.bias:
                        c += self.buf[g.bias][first:last]
            case KernelLaunch() as k:
                instr = Kernel(k, k.rows)
                if item.whole:
                    self.kernel(instr, t, (0, k.rows), (0, k.width))
                elif item.by_rows:  # rows block, block + blocks, ..., whole
                    for r in range(block, B, launch.blocks):
                        self.kernel(instr, t, (r, r + 1), (0, k.width))
                else:
                    self.kernel(instr, t, (first_row, last_row), launch.columns(k.width, block),
                                block % launch.column_blocks)
            case other:
                raise TypeError(f"unknown launch {other!r}")

    def run(self, x: np.ndarray, initial: dict[str, np.ndarray]) -> Forward:
        plan, (T, B, H) = self.plan, (self.seq, self.batch, self.plan.sizes.hidden)
        # Every buffer but the weights starts as NaN, so that reading what nothing wrote shows in the output.
        for name, b in self.buf.items():
            if name not in self.weights:
                b.fill(np.nan)
        self.buf["x"][:] = self.round("x", x.astype(self.dtype).reshape(-1))
        for s in plan.state_ids:
            self.buf[f"init.{s}"][:] = self.round(f"init.{s}", initial[s].astype(self.dtype).reshape(-1))
        for instr in execution_order(self.program, self.prefer):
            self.execute(instr)
        y = self.buf[plan.layers[-1].output_seq][B * H:].reshape(T, B, H)
        final = {s: self.buf[f"final.{s}"].reshape(plan.sizes.layers, B, H).astype(np.float32)
                 for s in plan.state_ids}
        return Forward(y.astype(np.float32), final)
