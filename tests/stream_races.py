"""Whether a lowered program's streams are ordered wherever two of them touch the same element: the
instructions walked in program order with a vector clock per stream (a Record keeps its stream's clock,
a Wait takes the larger of its own and the recorded one), every element of every buffer remembering the
stream and clock of its last write and, per stream, of its last read. An access is ordered after an
earlier one of another stream only where a chain of Records and Waits leads from that one to it.

The caller's stream (MAIN) writes the run's inputs before the program starts and reads and writes every
buffer after it ends (the next run, or the caller reading y), so that a stream that does not start after
the fork, or that the program does not join back to MAIN, shows as well. What a GPU runs between the
streams in any interleaving is checked, where the numpy executor's two orders (`execution_order`) check
two of them and only through the values they compute (a late final copy, or a join, changes no value).

    assert hazards(lower(plan)) == []
"""

from __future__ import annotations

import numpy as np

from cellfuse.codegen.kernel_abi import kernel_params
from cellfuse.codegen.lowering import (
    MAIN,
    Copy,
    Gemm,
    Instruction,
    Kernel,
    Loop,
    Persistent,
    Program,
    Record,
    Wait,
    as_instruction,
    element_offset,
)
from cellfuse.codegen.plan import Access, GemmLaunch, KernelLaunch
from cellfuse.gpu_runtime.numpy_executor import NumpyExecutor

BEFORE = "the caller, before the run"
AFTER = "the caller, after the run"


class Elements:
    """Each buffer's element numbers, addressed by the numpy executor's own `view`: the elements of an
    access's [rows, width] block starting at `offset` (its [width] vector, its [rows, 1] column or its one
    scalar) are the numbers its view holds."""

    view = NumpyExecutor.view

    def __init__(self, plan):
        self.buf = {name: np.arange(plan.buffer_elements(name)) for name in plan.buffers}

    def __call__(self, acc: Access, offset: int, rows: int, width: int) -> np.ndarray:
        return self.view(acc, offset, rows, width).ravel()


Accesses = list[tuple[str, np.ndarray, bool]]  # (buffer, its elements, written)


def accesses(program: Program, elements: Elements, instr: Instruction, t: int = 0) -> Accesses:
    """What an instruction (at step t) reads and writes; a loop's at every step, a persistent launch's at
    every step of its layer and its states' copies. A buffer added into is read and written."""
    B, T = program.plan.sizes.batch, program.plan.sizes.seq
    whole = elements.buf.__getitem__
    out: Accesses = []
    match instr:
        case Gemm(launch=g, rows=rows):
            at = element_offset(instr, g.a, t, B)
            a_rows, a_width = (g.k, rows) if g.trans_a else (rows, g.k)
            c = elements(g.c, element_offset(instr, g.c, t, B), rows, g.n)
            out += [(g.a.buffer, elements(g.a, at, a_rows, a_width), False), (g.w, whole(g.w), False),
                    *([(g.bias, whole(g.bias), False)] if g.bias else []), (g.c.buffer, c, True)]
            if g.accumulate:
                out.append((g.c.buffer, c, False))
        case Kernel(launch=k, rows=rows):
            for p in kernel_params(k):
                where = elements(p.access, element_offset(instr, p.access, t, B), rows, k.width)
                out.append((p.access.buffer, where, p.output))
                if p.output and k.adds(p.access):
                    out.append((p.access.buffer, where, False))
        case Copy(src=src, dst=dst, width=width, step=step):
            at = T if step is None else step
            out += [(src.buffer, elements(src, src.offset(at, B), B, width), False),
                    (dst.buffer, elements(dst, dst.offset(at, B), B, width), True)]
        case Loop(body=body):
            for step in instr.steps(T):
                for inner in body:
                    out += accesses(program, elements, inner, step)
        case Persistent(launch=p):
            for state in p.states:
                out += [(state.initial.buffer, elements(state.initial, state.initial.offset(0, B), B,
                                                        state.initial.ld), False),
                        (state.read.buffer, elements(state.read, state.read.offset(0, B), B,
                                                     state.initial.ld), True),
                        (state.read.buffer, elements(state.read, state.read.offset(T, B), B,
                                                     state.initial.ld), False),
                        (state.final.buffer, elements(state.final, state.final.offset(T, B), B,
                                                      state.initial.ld), True)]
            for step in range(T):
                for item in p.items:
                    if isinstance(item.launch, GemmLaunch | KernelLaunch):
                        out += accesses(program, elements, as_instruction(item.launch, B), step)
        case _:
            raise TypeError(f"no accesses known for {instr!r}")
    return out


def hazards(program: Program) -> list[str]:
    """Every pair of accesses to the same element by two streams, at least one a write, with no chain of
    Records and Waits between them (the first of each buffer and pair of what touched it), as text."""
    n = program.streams
    clock = np.full((n, n), -1)  # clock[s][u]: how far stream s knows stream u to have run
    np.fill_diagonal(clock, 0)
    recorded: dict[int, np.ndarray] = {}
    elements = Elements(program.plan)
    names = {name: numbers.size for name, numbers in elements.buf.items()}
    # per element: the stream, clock and name of its last write (the caller's, at MAIN's clock 0), and per
    # stream the clock of its last read
    writer = {b: np.full(size, MAIN) for b, size in names.items()}
    written_at = {b: np.zeros(size, np.int64) for b, size in names.items()}
    write_what = {b: np.zeros(size, np.int64) for b, size in names.items()}
    read_at = {b: np.full((n, size), -1, np.int64) for b, size in names.items()}
    read_what = {b: np.zeros((n, size), np.int64) for b, size in names.items()}
    what = [BEFORE]
    found: dict[tuple, str] = {}

    def unordered(s: int, streams: np.ndarray, clocks: np.ndarray) -> np.ndarray:
        """Which earlier accesses (by `streams` at `clocks`) stream s is not ordered after."""
        return (streams != s) & (clocks > clock[s][streams])

    def touch(s: int, label: int, buffer: str, where: np.ndarray, write: bool) -> None:
        if buffer not in writer:
            raise KeyError(f"{what[label]} touches '{buffer}', which is not a buffer of the plan")
        late = unordered(s, writer[buffer][where], written_at[buffer][where])
        for i in np.flatnonzero(late)[:1]:
            kind = "writes" if write else "reads"
            earlier = what[write_what[buffer][where[i]]]
            found.setdefault((buffer, earlier, what[label]),
                             f"{what[label]} (stream {s}) {kind} '{buffer}' [{where[i]}], written by "
                             f"{earlier} (stream {writer[buffer][where[i]]}) with no Wait between them")
        if write:
            for u in range(n):
                if u == s:
                    continue
                late = read_at[buffer][u][where] > clock[s][u]
                for i in np.flatnonzero(late)[:1]:
                    earlier = what[read_what[buffer][u][where[i]]]
                    found.setdefault((buffer, earlier, what[label]),
                                     f"{what[label]} (stream {s}) writes '{buffer}' [{where[i]}], read by "
                                     f"{earlier} (stream {u}) with no Wait between them")
            writer[buffer][where], written_at[buffer][where] = s, clock[s][s]
            write_what[buffer][where] = label
        else:
            read_at[buffer][s][where], read_what[buffer][s][where] = clock[s][s], label

    for number, instr in enumerate(program.instructions):
        s = instr.stream
        match instr:
            case Record(event=e):
                recorded[e] = clock[s].copy()
            case Wait(event=e):
                if e not in recorded:
                    found[("wait", e)] = f"stream {s} waits for event {e} before it is recorded"
                    continue
                clock[s] = np.maximum(clock[s], recorded[e])
            case _:
                clock[s][s] += 1
                what.append(f"instruction {number} ({type(instr).__name__})")
                label = len(what) - 1
                for buffer, where, write in accesses(program, elements, instr):
                    touch(s, label, buffer, where, write)
    clock[MAIN][MAIN] += 1
    what.append(AFTER)
    for buffer, everything in elements.buf.items():
        touch(MAIN, len(what) - 1, buffer, everything, False)
        touch(MAIN, len(what) - 1, buffer, everything, True)
    return list(found.values())
