"""One lowering of a Plan to a program of a few typed instructions, which every executor runs.

A `Program` is a list of instructions on streams: a GEMM, a kernel, a copy of a [batch, width] block,
an event recorded or waited for, and a loop over steps (with its direction) whose body holds GEMMs and
kernels; and, where a caller's tensors are of another type than the plan's buffers, the conversions at
a run's edges (`with_edges`, which only the PyTorch runner adds). The numpy executor, the CUDA executor
and the `.cu` exporter each execute it with one `match` that raises on an unknown instruction, so the
order of work, the streams and their events are decided here once, and a mistake in them shows on a
machine without a GPU too (see `execution_order`).

With `Plan.chunk_steps`, the hoisted launches run in chunks of steps on a second stream beside the
recurrence: step t waits only for its own chunk, and a chunk of layer l's hoisted work waits only for
the steps of layer l-1 it reads. With `Plan.layer_streams` as well, each layer has two streams of its
own (up to `SIDE_BY_SIDE` layers), so that its chunk of steps runs beside the next chunk of the layer
below; a step that reads the layer below's output itself (a residual's x) reads it after its chunk's
hoisted work, which waited for those steps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, replace

from .dtypes import DType
from .gemm_routes import Route, f16x3_layout, route
from .plan import Access, GemmLaunch, KernelLaunch, Launch, PersistentLaunch, Plan, state_copies

MAIN, SIDE = 0, 1  # the streams: the recurrence, and the hoisted launches beside it


@dataclass(frozen=True)
class Gemm:
    """C = A @ W (+ bias) on `rows` rows, by its `route` (see gemm_routes). With `steps`, a hoisted
    GEMM's rows of steps [first, last) only."""

    launch: GemmLaunch
    rows: int
    route: Route
    stream: int = MAIN
    steps: tuple[int, int] | None = None
    # On tensor cores: where in its stream's workspace (bytes) the GEMM before it on the stream left its
    # W's region (gemm_routes.F16x3Layout), the same W's, which this one reads instead of making it again
    # (see `w_regions_shared`); None: it makes its own. (The exported launcher, whose routes are decided
    # at run time, makes every GEMM's own.)
    w_made_at: int | None = None

    @property
    def w_region(self) -> int:
        """Where in its stream's workspace (bytes) a GEMM on tensor cores finds W's region: where the GEMM
        before made it, or at its own layout's `kept_at`."""
        if self.w_made_at is not None:
            return self.w_made_at
        return int(f16x3_layout(self.launch, self.rows, self.launch.k).kept_at)


def w_regions_shared(instructions: tuple[Instruction, ...]) -> tuple[Instruction, ...]:
    """The instructions with `w_made_at` set on each GEMM on tensor cores after one of the same W on the
    same stream (both split copies, `route` "f16x3"), with nothing between but GEMMs that use no split
    copies (a bias's column sum) and none that writes W: the LSTM's two weight gradients read the same
    gates' gradient as W, which is then split once. W's region stays where the first GEMM made it (at
    its layout's `kept_at`), so a GEMM shares it only where its own operands and sums end before that."""
    out: list[Instruction] = []
    last: Gemm | None = None  # the last GEMM that split W's copies
    for instr in instructions:
        if not isinstance(instr, Gemm) or instr.route != "f16x3" or instr.steps is not None:
            if not (isinstance(instr, Gemm) and instr.route in ("float32", "16-bit") and last is not None
                    and instr.stream == last.stream and instr.launch.c.buffer != last.launch.w):
                last = None
            out.append(instr)
            continue
        g = instr.launch
        if last is not None:
            h = last.launch
            if (h.w, h.trans_w, h.n, h.k, h.w_dtype, last.stream) == (g.w, g.trans_w, g.n, g.k, g.w_dtype,
                                                                      instr.stream) \
                    and h.c.buffer != g.w and instr.w_region <= last.w_region:
                instr = replace(instr, w_made_at=last.w_region)
        last = instr
        out.append(instr)
    return tuple(out)


@dataclass(frozen=True)
class Kernel:
    """A fused elementwise kernel on `rows` rows. With `steps`, a hoisted kernel's rows of steps [first,
    last) only."""

    launch: KernelLaunch
    rows: int
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
class Convert:
    """Copies `elements` elements from buffer src (from element `src_at`) to dst (from `dst_at`), each
    converted from src's type to dst's (conversions.py): a run's edge where its caller gives or takes a
    buffer in another type than the plan stores it in (see `with_edges`)."""

    src: str
    src_at: int
    src_dtype: DType
    dst: str
    dst_at: int
    dst_dtype: DType
    elements: int
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


Instruction = Gemm | Kernel | Copy | Convert | Record | Wait | Loop | Persistent


@dataclass(frozen=True)
class Program:
    plan: Plan
    instructions: tuple[Instruction, ...]
    streams: int  # 1; 2 when hoisted work runs beside the loop; 2 per layer with Plan.layer_streams
    events: int  # events are numbered 0 .. events-1, each recorded once
    # How many layers run their steps at once: each one's GEMMs get this share of the SMs (a GEMM that
    # spreads over the whole GPU would make the layers' steps wait for each other).
    sharing: int = 1


def element_offset(instr: Gemm | Kernel, acc: Access, t: int, batch: int) -> int:
    """Where an access of the instruction starts at step t, in elements of its buffer."""
    skip = instr.steps[0] * batch * acc.ld if instr.steps and acc.kind in ("row", "col") else 0
    return acc.offset(t, batch) + skip


def as_instruction(launch: Launch, batch: int, stream: int = MAIN,
                   steps: tuple[int, int] | None = None) -> Gemm | Kernel:
    """The instruction that runs a launch (of `steps` only, where given, each of `batch` rows)."""
    match launch:
        case GemmLaunch():
            rows = (steps[1] - steps[0]) * batch if steps else launch.m
            return Gemm(launch, rows, route(launch, rows), stream, steps)
        case KernelLaunch():
            return Kernel(launch, (steps[1] - steps[0]) * batch if steps else launch.rows, stream, steps)
        case _:
            raise TypeError(f"unknown launch {launch!r}")


def lower(plan: Plan, one_stream: bool = False) -> Program:
    """The program of a whole forward pass. `one_stream` runs the hoisted launches before each layer's
    loop on the main stream instead of in chunks beside it (what the exported .cu does), and the layers
    one after another."""
    T, H, B = plan.sizes.seq, plan.sizes.hidden, plan.sizes.batch
    chunk = 0 if one_stream else plan.chunk_steps
    sharing = plan.side_by_side if chunk else 1
    apart = sharing > 1  # each layer on a recurrence stream and a side one of its own
    streams = 2 * sharing if apart else 2 if chunk else 1
    out: list[Instruction] = []
    events = 0

    def event() -> int:
        nonlocal events
        events += 1
        return events - 1

    if streams > 1:  # the other streams start after what came before on the main one
        fork = event()
        out += [Record(fork, MAIN), *(Wait(fork, s) for s in range(1, streams))]
    prev_done: list[int] = []  # per chunk, an event after the previous layer's steps of that chunk
    for lp in plan.layers:
        main, side = (2 * (lp.layer % sharing), 2 * (lp.layer % sharing) + 1) if apart else (MAIN, SIDE)
        step = tuple(as_instruction(launch, B, main) for launch in lp.step)
        if lp.persistent:  # whose kernel copies the states in and out itself (`PersistentLaunch.states`)
            out += [as_instruction(launch, B) for launch in lp.prologue]
            out.append(Persistent(lp.persistent))
            continue
        copies = state_copies(lp.state_read, H, lp.layer, plan.buffers)
        out += [Copy(c.initial, c.read, H, 0, main) for c in copies]
        if not chunk:
            out += [as_instruction(launch, B) for launch in lp.prologue]
            out.append(Loop(step))
        else:
            chunks = [(first, min(T, first + chunk)) for first in range(0, T, chunk)]
            ready = []  # per chunk, an event after its hoisted launches on the side stream
            for j, steps in enumerate(chunks):
                if prev_done:
                    out.append(Wait(prev_done[j], side))
                for launch in lp.prologue:
                    if launch.row_kind == "seq":
                        out.append(as_instruction(launch, B, side, steps))
                    elif j == 0:  # [N] and scalar values: all of them with the first chunk
                        out.append(as_instruction(launch, B, side))
                ready.append(event())
                out.append(Record(ready[-1], side))
            prev_done = []
            for j, (first, last) in enumerate(chunks):
                out += [Wait(ready[j], main), Loop(step, first, last, stream=main)]
                prev_done.append(event())
                out.append(Record(prev_done[-1], main))
        out += [Copy(c.read, c.final, H, None, main) for c in copies]
    for s in range(1, streams):  # and the main one ends after everything on the others
        join = event()
        out += [Record(join, s), Wait(join, MAIN)]
    return Program(plan, tuple(out), streams, events, sharing)


def with_edges(program: Program, before: tuple[Convert, ...], after: tuple[Convert, ...]) -> Program:
    """The program with conversions on the main stream before all of it (the caller's inputs into the
    plan's buffers) and after all of it (the plan's outputs into the caller's): its side streams fork
    from the main one after the first and join it before the last."""
    assert all(c.stream == MAIN for c in (*before, *after)), "a run's edges are on its main stream"
    return replace(program, instructions=(*before, *program.instructions, *after))


def execution_order(program: Program, prefer: int = SIDE) -> Iterator[Instruction]:
    """The top-level instructions in an order the streams allow: each stream's own in program order, and
    none after a Wait before its event is recorded. `prefer` runs the work of that kind of stream as early
    as it may (SIDE: hoisted work as early as possible; MAIN: as late as the recurrence allows), and with
    a layer's streams of its own (`Plan.layer_streams`) an upper layer's before a lower one's, so that
    running both orders checks that every needed Wait is there.

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
            case Gemm() | Kernel() | Copy() | Convert() | Loop() | Persistent() | Wait():
                pass
            case _:
                raise TypeError(f"unknown instruction {instr!r}")
    queues = {s: deque(i for i in program.instructions if i.stream == s) for s in range(program.streams)}
    if any(i.stream not in queues for i in program.instructions):
        raise ValueError(f"an instruction names a stream beyond the program's {program.streams}")
    recorded: set[int] = set()
    order = sorted(queues, key=lambda s: (s % 2 != prefer, -s))  # a layer's streams: 2 * layer (+ 1)
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
