"""One lowering of a Plan to a program of a few typed instructions, which every executor runs.

A `Program` is a list of instructions on streams: a GEMM, a kernel, a copy of a [batch, width] block,
an event recorded or waited for, and a loop over steps (with its direction) whose body holds GEMMs and
kernels. The numpy executor, the CUDA executor and the `.cu` exporter each execute it with one `match`
that raises on an unknown instruction, so the order of work, the streams and their events are decided
here once, and a mistake in them shows on a machine without a GPU too (see `execution_order`).

With `Plan.chunk_steps`, the hoisted launches run in chunks of steps on a second stream beside the
recurrence: step t waits only for its own chunk, and a chunk of layer l's hoisted work waits only for
the steps of layer l-1 it reads.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from .plan import Access, GemmLaunch, KernelLaunch, Launch, PersistentLaunch, Plan, WavefrontLaunch

MAIN, SIDE = 0, 1  # the streams: the recurrence, and the hoisted launches beside it


@dataclass(frozen=True)
class Gemm:
    """C = A @ W (+ bias). With `steps`, a hoisted GEMM's rows of steps [first, last) only."""

    launch: GemmLaunch
    stream: int = MAIN
    steps: tuple[int, int] | None = None


@dataclass(frozen=True)
class Kernel:
    """A fused elementwise kernel. With `steps`, a hoisted kernel's rows of steps [first, last) only."""

    launch: KernelLaunch
    stream: int = MAIN
    steps: tuple[int, int] | None = None


@dataclass(frozen=True)
class Copy:
    """Copies a [batch, width] block from src to dst, both addressed at `step` (None: after the last
    step, t = seq)."""

    src: Access
    dst: Access
    width: int
    step: int | None
    stream: int = MAIN


@dataclass(frozen=True)
class Record:
    """Marks the point of `stream` that a Wait for `event` waits for."""

    event: int
    stream: int


@dataclass(frozen=True)
class Wait:
    """`stream` goes on only after the point where `event` was recorded."""

    event: int
    stream: int


@dataclass(frozen=True)
class Loop:
    """The body once per step t of [first, last) (last None: the sequence's end), in increasing order, or
    decreasing when `reverse`."""

    body: tuple[Gemm | Kernel, ...]
    first: int = 0
    last: int | None = None
    reverse: bool = False
    stream: int = MAIN

    def steps(self, seq: int) -> range:
        last = seq if self.last is None else self.last
        return range(last - 1, self.first - 1, -1) if self.reverse else range(self.first, last)


@dataclass(frozen=True)
class Persistent:
    """Every step of a layer in one cooperative launch, in increasing order, or decreasing where the
    launch is a backward pass's (see `PersistentLaunch`)."""

    launch: PersistentLaunch
    stream: int = MAIN


@dataclass(frozen=True)
class Wavefront:
    """Every step of every layer, in one cooperative launch (see `WavefrontLaunch`)."""

    launch: WavefrontLaunch
    stream: int = MAIN


Instruction = Gemm | Kernel | Copy | Record | Wait | Loop | Persistent | Wavefront


@dataclass(frozen=True)
class Program:
    plan: Plan
    instructions: tuple[Instruction, ...]
    streams: int  # 1, or 2 when hoisted work runs beside the loop
    events: int  # events are numbered 0 .. events-1, each recorded once


def launch_rows(instr: Gemm | Kernel, batch: int) -> int:
    """The rows the instruction computes: the launch's, or those of its steps."""
    if instr.steps:
        first, last = instr.steps
        return (last - first) * batch
    match instr.launch:
        case GemmLaunch() as g:
            return g.m
        case KernelLaunch() as k:
            return k.rows
        case other:
            raise TypeError(f"unknown launch {other!r}")


def element_offset(instr: Gemm | Kernel, acc: Access, t: int, batch: int) -> int:
    """Where an access of the instruction starts at step t, in elements of its buffer."""
    skip = instr.steps[0] * batch * acc.ld if instr.steps and acc.kind in ("row", "col") else 0
    return acc.offset(t, batch) + skip


def as_instruction(launch: Launch, stream: int = MAIN, steps: tuple[int, int] | None = None) -> Gemm | Kernel:
    """The instruction that runs a launch (of `steps` only, where given)."""
    match launch:
        case GemmLaunch():
            return Gemm(launch, stream, steps)
        case KernelLaunch():
            return Kernel(launch, stream, steps)
        case _:
            raise TypeError(f"unknown launch {launch!r}")


def lower(plan: Plan, one_stream: bool = False) -> Program:
    """The program of a whole forward pass. `one_stream` runs the hoisted launches before each layer's
    loop on the main stream instead of in chunks beside it (what the exported .cu does)."""
    T, H = plan.sizes.seq, plan.sizes.hidden
    chunk = 0 if one_stream else plan.chunk_steps
    out: list[Instruction] = []
    events = 0

    def event() -> int:
        nonlocal events
        events += 1
        return events - 1

    if chunk:  # the side stream starts after what came before on the main one
        fork = event()
        out += [Record(fork, MAIN), Wait(fork, SIDE)]
    if plan.wavefront:
        return _lower_wavefront(plan)
    prev_done: list[int] = []  # per chunk, an event after the previous layer's steps of that chunk
    for lp in plan.layers:
        for s in plan.state_ids:
            out.append(Copy(Access(f"init.{s}", "row", H, block=lp.layer), lp.state_read[s], H, 0))
        step = tuple(as_instruction(launch) for launch in lp.step)
        if lp.persistent:
            out += [as_instruction(launch) for launch in lp.prologue]
            out.append(Persistent(lp.persistent))
        elif not chunk:
            out += [as_instruction(launch) for launch in lp.prologue]
            out.append(Loop(step))
        else:
            chunks = [(first, min(T, first + chunk)) for first in range(0, T, chunk)]
            ready = []  # per chunk, an event after its hoisted launches on the side stream
            for j, steps in enumerate(chunks):
                if prev_done:
                    out.append(Wait(prev_done[j], SIDE))
                for launch in lp.prologue:
                    if launch.row_kind == "seq":
                        out.append(as_instruction(launch, SIDE, steps))
                    elif j == 0:  # [N] and scalar values: all of them with the first chunk
                        out.append(as_instruction(launch, SIDE))
                ready.append(event())
                out.append(Record(ready[-1], SIDE))
            prev_done = []
            for j, (first, last) in enumerate(chunks):
                out += [Wait(ready[j], MAIN), Loop(step, first, last)]
                prev_done.append(event())
                out.append(Record(prev_done[-1], MAIN))
        for s in plan.state_ids:
            out.append(Copy(lp.state_read[s], Access(f"final.{s}", "row", H, block=lp.layer), H, None))
    if chunk:  # and the main one ends after everything on the side one
        join = event()
        out += [Record(join, SIDE), Wait(join, MAIN)]
    return Program(plan, tuple(out), 2 if chunk else 1, events)


def _lower_wavefront(plan: Plan) -> Program:
    """Every layer's initial states, the first layer's hoisted launches (the others have none: they
    compute their input's part in their steps), the one launch, and every layer's final states."""
    H = plan.sizes.hidden
    out: list[Instruction] = [Copy(Access(f"init.{s}", "row", H, block=lp.layer), lp.state_read[s], H, 0)
                              for lp in plan.layers for s in plan.state_ids]
    out += [as_instruction(launch) for launch in plan.layers[0].prologue]
    out.append(Wavefront(plan.wavefront))
    out += [Copy(lp.state_read[s], Access(f"final.{s}", "row", H, block=lp.layer), H, None)
            for lp in plan.layers for s in plan.state_ids]
    return Program(plan, tuple(out), 1, 0)


def execution_order(program: Program, prefer: int = SIDE) -> Iterator[Instruction]:
    """The top-level instructions in an order the streams allow: each stream's own in program order, and
    none after a Wait before its event is recorded. `prefer` runs that stream's work as early as it may
    (SIDE: hoisted work as early as possible; MAIN: as late as the recurrence allows), so that running
    both orders checks that every needed Wait is there.

    Raises ValueError where a GPU would run the program wrongly: a Wait whose event is recorded only
    later in program order (CUDA would not wait at all), or an event recorded twice."""
    recorded_before: set[int] = set()
    for instr in program.instructions:
        match instr:
            case Record(event=e):
                if e in recorded_before:
                    raise ValueError(f"event {e} is recorded twice")
                recorded_before.add(e)
            case Wait(event=e) if e not in recorded_before:
                raise ValueError(f"stream {instr.stream} waits for event {e} before it is recorded")
            case Gemm() | Kernel() | Copy() | Loop() | Persistent() | Wavefront() | Wait():
                pass
            case _:
                raise TypeError(f"unknown instruction {instr!r}")
    queues = {s: deque(i for i in program.instructions if i.stream == s) for s in range(program.streams)}
    if any(i.stream not in queues for i in program.instructions):
        raise ValueError(f"an instruction names a stream beyond the program's {program.streams}")
    recorded: set[int] = set()
    order = sorted(queues, key=lambda s: s != prefer)
    while any(queues.values()):
        for s in order:
            head = queues[s][0] if queues[s] else None
            if head is None or isinstance(head, Wait) and head.event not in recorded:
                continue
            queues[s].popleft()
            if isinstance(head, Record):
                recorded.add(head.event)
            yield head
            break
        else:  # cannot happen once every Wait follows its Record: program order itself is a valid order
            raise ValueError("the streams wait for each other: no instruction can run")
