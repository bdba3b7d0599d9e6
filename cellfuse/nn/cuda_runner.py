"""A CellRNN's plans run on a CUDA device in torch's own tensors, on torch's current stream.

Every call takes its memory from torch's caching allocator: y (with the initial state's row before it,
as the plan's output sequence has it) and each final state are tensors of their own; everything else a
forward run writes is one uint8 tensor, the `reserve`, which a training forward returns for autograd to
keep until the backward pass, and an inference forward drops when it returns (the allocator reuses it
once the stream has passed the run). The kernels read x and the initial states where they are. The
exception is an inference call of a program that launches at every step (the rungs up to `graph`): it
replays a CUDA graph of the program over memory the runner keeps (see _Replay). The
parameters are packed into the weight buffers the kernels read (stacked along N where GEMMs share an
operand) only when they change: their version counters and addresses tell, so a forward pass of unchanged
weights copies nothing; under a CUDA graph capture they are always packed, so that a replay reads the
parameters as they are then. Modules of the same cell and sizes share a runner, and each module's
parameters keep packed weights of their own in it (the last MAX_PACKINGS modules'), so that a model of
several such modules packs nothing when it calls them in turn. The forward, training and backward
programs (loaded modules of their own) all read a module's packing, on whichever streams they are called:
a run on another stream than the packing's last one waits for that stream's work so far, and the caching
allocator is told every stream that read it.

No call synchronises with the host. Making a runner's programs compiles (or finds in the kernel cache),
loads and measures, so the first call at a size must come before any CUDA graph capture of it, as torch
asks of any warm-up; so must the first backward pass of an x that needs no gradient (its own program:
see BACKWARD_NO_DX), where a captured one will be. Parameters packed under a capture in a layout not
packed before are packed by torch's ops (the packing kernel of a layout is made, compiled and loaded,
outside captures only).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch

from ..codegen import gradient_gather, kernel_set
from ..codegen.backward_plan import BackwardPlan
from ..codegen.conversions import conversion_name
from ..codegen.dtypes import FLOAT32, DType, bits
from ..codegen.kernel_abi import BLOCK, grid_blocks
from ..codegen.lowering import Convert, lower, with_edges
from ..codegen.pack_kernel import PACK_KERNEL, PackCopy, pack_kernel_source, total_elements
from ..codegen.plan import ParamPart, Plan
from ..gpu_runtime.launch_list import LaunchList
from ..gpu_runtime.stream_program import CHANGES, conversion, loaded_module
from ..graph_model import CellError
from ..graph_model.lengths import STEPS_LEFT
from . import quick_lane
from .kept_tensors import kept_tensors
from .packed_for import PackedFor, owner
from .runners import TORCH_DTYPES, Plans, Runner
from .tensor_layout import TensorLayout
from .zeros import Zeros, made_here

log = logging.getLogger(__name__)

ALIGNMENT = 256  # bytes: where each buffer starts in a piece of memory (cuBLAS's fastest kernels want it)
MAX_PACKINGS = 8  # modules whose packed weights a runner keeps at once
MAX_PACK_KERNELS = 8  # layouts of parameters whose packing kernel a runner keeps
_LANE_TYPES = (torch.Tensor, torch.nn.Parameter)  # what a lane takes (no subclass: it reads the C++ tensor)
# the backward programs: the whole pass, and the pass without x's gradient (BackwardPlan.without_input_grad)
BACKWARD, BACKWARD_NO_DX = "backward", "backward without dx"
BACKWARDS = (BACKWARD, BACKWARD_NO_DX)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


def _in_place(t: torch.Tensor) -> torch.Tensor:
    """The tensor where the kernels can read it: contiguous, at a 16-byte address (their widest loads);
    copied only where it is not."""
    if not t.is_contiguous() or t.data_ptr() % 16:
        return t.clone(memory_format=torch.contiguous_format)
    return t


class Memory:
    """Where each buffer of a training forward plan and its backward plan lives: in the caller's tensors
    (x, the initial states, y's sequence, the final states), in the packed weights, in the reserve, or in
    a backward run's gradient memory. Scratch for GEMMs on tensor cores comes after the reserve's buffers
    (and the gradients'), sized for the copies route, the larger of the two.

    A 16-bit plan keeps some of those in float32 where its caller's are in x's type (the steps-left state
    of a PackedSequence's call is float32 for both): when a backward pass follows, the training run keeps
    them in the reserve (`kept`: y's sequence and those initial states, which the backward pass reads
    there; `converted`: those final states), converting the caller's initial states into it first and
    its y and final states out of it last, in the run's own program (`edges`). Calls without a backward
    pass convert with torch's ops (CudaRunner._forward)."""

    def __init__(self, plan: Plan, backward: BackwardPlan | None):
        from ..gpu_runtime.cuda_executor import split_bytes
        from ..gpu_runtime.stream_program import split_name

        self.output = plan.layers[-1].output_seq
        x_type = plan.buffers["x"].dtype
        # the types the caller gives and takes them in
        self.caller_types = {self.output: x_type,
                             **{f"{e}.{s}": caller_state_type(s, x_type)
                                for s in plan.state_ids for e in ("init", "final")}}
        differ = [name for name, dtype in self.caller_types.items()
                  if backward is not None and plan.buffers[name].dtype != dtype]
        self.kept = [name for name in differ if not name.startswith("final.")]
        self.converted = [name for name in differ if name.startswith("final.")]
        self.edges = self._edges(plan)
        external = {"x", self.output, *(f"{e}.{s}" for s in plan.state_ids for e in ("init", "final"))}
        external -= set(differ)
        weights = [name for name, b in plan.buffers.items() if b.is_weight]
        own = [name for name in plan.buffers if name not in external and name not in weights]
        program = lower(plan)
        # (the programs keep what their GEMMs make of the weights: stream_program's `images`)
        splits = split_bytes(program.instructions, program.streams, weights)
        self.scratch = scratch = {split_name(s): n for s, n in enumerate(splits) if n}
        self.reserve, self.reserve_bytes = _layout([(n, plan.buffers[n].nbytes(plan.sizes)) for n in own]
                                                   + list(scratch.items()))
        self.weights = {n: plan.buffers[n].nbytes(plan.sizes) for n in weights}
        if backward is not None:
            instructions = backward.instructions()
            splits = split_bytes(instructions, 1 + max((getattr(i, "stream", 0) for i in instructions),
                                                          default=0), weights)
            self.grad_scratch = scratch = {split_name(s): n for s, n in enumerate(splits) if n}
            # those a run must start at zero first, together, so that the memsets of `zeroed` clear them;
            # a buffer that a kernel overwrites whole, and the scratch, need no start
            order = sorted(backward.buffers, key=lambda n: not backward.restarted(n))
            grads = [(n, backward.buffers[n].nbytes(plan.sizes)) for n in order]
            self.grads, self.grad_bytes = _layout(grads + list(scratch.items()))
            restarted = [n for n in order if backward.restarted(n)]
            self.restart_bytes = (self.grads[restarted[-1]] + _aligned(backward.buffers[restarted[-1]]
                                                                       .nbytes(plan.sizes))
                                  if restarted else 0)
            name, at = backward.dy_place()
            start = self.grads[name] + 4 * at
            self.dy = (start, start + 4 * plan.sizes.seq * plan.sizes.batch * plan.sizes.hidden)
            # what the start of a run zeroes: the restarted buffers but dy's place, which dy's copy then
            # overwrites (as large as y: most of them)
            self.zeroed = [(a, b) for a, b in ((0, min(start, self.restart_bytes)),
                                               (self.dy[1], self.restart_bytes)) if b > a]

    def _edges(self, plan: Plan) -> tuple[tuple[Convert, ...], tuple[Convert, ...]]:
        """The conversions before a training run (each kept initial state from the caller's, `caller(name)`)
        and after it (y's sequence, its first B rows the initial slot, and each converted final state
        into the caller's)."""
        s = plan.sizes
        states, rows = s.layers * s.batch * s.hidden, s.batch * s.hidden

        def convert(src: str, dst: str, n: int, src_at: int = 0) -> Convert:
            def dtype(name: str) -> DType:
                theirs = name.removeprefix("caller.")
                return self.caller_types[theirs] if theirs != name else plan.buffers[name].dtype
            return Convert(src, src_at, dtype(src), dst, 0, dtype(dst), n)
        before = tuple(convert(caller(name), name, states) for name in self.kept if name != self.output)
        after = tuple(convert(self.output, caller(self.output), s.seq * rows, rows)
                      for name in self.kept if name == self.output)
        return before, after + tuple(convert(name, caller(name), states) for name in self.converted)


def caller(name: str) -> str:
    """The buffer of the caller's tensor that a run's edge converts `name` from or into."""
    return f"caller.{name}"


def caller_state_type(state: str, x_type: DType) -> DType:
    """The type a caller gives and takes a state in: x's, but the steps-left state of a PackedSequence's
    call, which is float32 (its counts past 256 are not all bf16's)."""
    return FLOAT32 if state == STEPS_LEFT else x_type


def _views(memory: torch.Tensor, extents: dict[str, tuple], names) -> dict[str, torch.Tensor]:
    """Views of the buffers `names` in a piece of memory, by their (offset, bytes[, torch dtype])."""
    return {name: _view(memory, *extents[name]) for name in names}


def _view(memory: torch.Tensor, at: int, nbytes: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return memory[at:at + nbytes].view(dtype)


class _LazyViews(dict):
    """Float32 views of a piece of memory's buffers, each made when first asked for: a backward run
    reads a few of its many buffers, and each view costs microseconds of host time."""

    def __init__(self, memory: torch.Tensor, extents: dict[str, tuple[int, int]]):
        super().__init__()
        self.memory, self.extents = memory, extents

    def __missing__(self, name: str) -> torch.Tensor:
        view = self[name] = _view(self.memory, *self.extents[name])
        return view


def _layout(sizes: list[tuple[str, int]]) -> tuple[dict[str, int], int]:
    offsets, end = {}, 0
    for name, nbytes in sizes:
        offsets[name] = end
        end += _aligned(nbytes)
    return offsets, end


class CudaRunner(Runner):
    """The plans' programs on one CUDA device, made at the first call that needs each."""

    def __init__(self, plans: Plans, device: torch.device, lane: int = 0):
        """`lane`: which of the runs of the same kernels that may run at once this runner's are (a layer's
        two directions side by side): each lane loads the kernels' module for itself."""
        super().__init__(plans)
        self.device, self.lane = device, lane
        self.index = device.index if device.index is not None else torch.cuda.current_device()
        self._programs: dict[str, object] = {}
        self._replays: dict[str, _Replay] = {}  # the forward program's captured run, where it has one
        # their graphs, cuBLAS handles, streams and events go when the runner does (dropped from the
        # process's cache)
        weakref.finalize(self, _close, self._programs, self._replays).atexit = False
        self.memory = Memory(plans.train, plans.backward)
        self.infer_memory = Memory(plans.forward, None)
        # the weight buffers of both forward plans (the same where their rungs are), packed side by side
        weights = {**self.memory.weights, **self.infer_memory.weights}
        for name, nbytes in self.infer_memory.weights.items():
            if self.memory.weights.get(name, nbytes) != nbytes:
                raise CellError(f"weight buffer {name!r} differs between the plans of '{plans.schedule}' and "
                                f"'{plans.train.schedule}'")
        self.weight_at, self.weight_bytes = _layout(list(weights.items()))
        # where each weight and gradient buffer is, its bytes and its type: the sizes' expressions evaluated
        # once
        buffers = {**plans.forward.buffers, **plans.train.buffers}
        self._weight_extents = {name: (self.weight_at[name], nbytes, TORCH_DTYPES[buffers[name].dtype.name])
                                for name, nbytes in weights.items()}
        sizes = plans.train.sizes
        self._grad_extents = {name: (self.memory.grads[name], b.nbytes(sizes))
                              for name, b in plans.backward.buffers.items()}
        # a training run's y in the reserve (Memory.kept), and the caller's types of the states, in which a
        # training run takes the initial states and gives back the final states and the initial states'
        # gradients (where the plan's differ, the run converts them: Memory.edges)
        self._y_kept = self.memory.output in self.memory.kept
        self._caller_states = [self.memory.caller_types[f"init.{s}"] for s in plans.train.state_ids]
        self._caller_state_dtypes = [TORCH_DTYPES[t.name] for t in self._caller_states]
        self.packing = [(self.layout, set(self.memory.weights))]
        if set(self.infer_memory.weights) - set(self.memory.weights):
            self.packing.append((TensorLayout(plans.forward, plans.backward),
                                 set(self.infer_memory.weights) - set(self.memory.weights)))
        # per module (its first parameter's id, or None for tensors that are no module's): the weight
        # buffers, then W's images, and the parameters they were packed from
        self._packings: OrderedDict[int | None, tuple[torch.Tensor, PackedFor]] = OrderedDict()
        self._captured: set[int] = set()  # the packings' addresses that a CUDA graph captured
        self._graphs_memory: list[torch.Tensor] = []  # captured packings no longer in use here (_add_images)
        self._uses: dict[int, _Uses] = {}  # a packing's address -> the streams its runs were put on
        self._images: dict[str, int] = {}  # W's images the programs read: name -> bytes
        # the packing's launch lists by the parameters' layout (dtypes, shapes, strides; see _pack_call), the
        # least recently used first
        self._pack_calls: OrderedDict[tuple, LaunchList | None] = OrderedDict()
        self._image_at: dict[str, int] = {}  # where each is in a packing
        s = plans.train.sizes
        self._sizes = (s.seq, s.batch, s.hidden, s.layers)
        self._empty = torch.empty(0, dtype=torch.uint8, device=device)  # the reserve of a run that saves none
        # the types y and each state are stored in (a 16-bit plan's may differ from the caller's), and
        # whether y and the final states can share one piece of memory (of one type)
        plan = plans.forward
        self._y_dtype = TORCH_DTYPES[plan.buffers[plan.layers[-1].output_seq].dtype.name]
        self._state_dtypes = [TORCH_DTYPES[plan.buffers[f"init.{s}"].dtype.name] for s in plan.state_ids]
        self._one_type = all(dtype == self._y_dtype for dtype in self._state_dtypes)
        self._inference_layout()
        self._zeros = Zeros()  # modules' initial zeros in the types the plan stores them in
        self._block_run = None  # (program, bases, packed weights, stream) of the last call in one piece
        # the gradients' gathering, by (with dx, the weight_views.Places written into or None)
        self._gathers: dict[tuple, LaunchList | None] = {}

    @property
    def captured(self) -> bool:
        """Whether a CUDA graph captured any of its packed weights (ops keeps such a runner)."""
        return bool(self._captured)

    # -- programs -------------------------------------------------------------------------------------
    def _program(self, which: str):
        """The forward (`forward`, `train`) or a backward (BACKWARD, BACKWARD_NO_DX) program, made at its
        first use."""
        if which not in self._programs:
            from ..gpu_runtime.stream_program import StreamProgram

            major, minor = torch.cuda.get_device_capability(self.index)
            props = torch.cuda.get_device_properties(self.index)
            sharing = 1
            if which in BACKWARDS:
                backward = self.plans.backward
                if which == BACKWARD_NO_DX:
                    backward = backward.without_input_grad()
                plan, instructions = self.plans.train, backward.instructions()
                kernels = kernel_set.backward_kernels(backward)
            else:
                plan = self.plans.forward if which == "forward" else self.plans.train
                lowered = lower(plan)
                if which == "train":
                    lowered = with_edges(lowered, *self.memory.edges)
                instructions, sharing = lowered.instructions, lowered.sharing
                kernels = kernel_set.plan_kernels(plan)
            program = StreamProgram(plan, instructions, kernels, f"sm_{major}{minor}", (major, minor),
                                    props.multi_processor_count, f"{plan.cell_name}'s {which} kernels",
                                    self.lane, sharing)
            self._programs[which] = program
            self._check_scratch(which, program)
            if program.images.keys() - self._images.keys():
                self._add_images(program.images)
            for name, p in self._programs.items():
                p.bind(self._binder(name, p), self.STATES + 2 * len(self.plans.train.state_ids))
        return self._programs[which]

    def _add_images(self, images: dict[str, int]) -> None:
        """W's images that a new program reads: room is made for them after the weights in every packing
        made from now on. The packings made so far are made again at their next use, but the memory of
        those that a user's CUDA graph captured stays the graph's (its replays pack and read it there)."""
        self._images.update(images)
        CHANGES.bump()
        self._graphs_memory += [memory for memory, _ in self._packings.values()
                                if memory.data_ptr() in self._captured]
        self._packings.clear()
        self._uses.clear()
        self._place_images()
        for replay in self._replays.values():  # (their graphs read the packings as they were)
            replay.close()

    def _place_images(self) -> None:
        images, _ = _layout(list(self._images.items()))
        self._image_at = {name: self.weight_bytes + at for name, at in images.items()}

    def _check_scratch(self, which: str, program) -> None:
        memory = self.infer_memory if which == "forward" else self.memory
        have = memory.grad_scratch if which in BACKWARDS else memory.scratch
        for name, nbytes in program.scratch.items():
            if nbytes > have.get(name, 0):
                raise CellError(f"{program.what}: scratch {name!r} needs {nbytes} bytes, and the call's "
                                f"memory holds {have.get(name, 0)} for it")

    def _weights(self, params: Sequence[torch.Tensor], stream: int, program, capturing: bool) -> int:
        """The address of the packed weights and images of these parameters' module, packed again where
        they are not its parameters as they are now (packed_for.PackedFor says), or a CUDA graph is being
        captured (`capturing`: the current stream); for a run of `program` on `stream`."""
        memory, packed_for = self._packing(params)
        base = memory.data_ptr()
        uses = self._uses.get(base)
        if uses is None:
            uses = self._uses[base] = _Uses()
        self._follow(uses, program, stream)
        if not capturing:  # (a capture's memory is the graph's to keep)
            _record(uses.streams, stream, (memory,))
        if capturing or not packed_for.matches(params):
            CHANGES.bump()  # (a lane replays over the packing as it was)
            if not self._packed_in_one_call(base, params, stream, capturing):
                for layout, buffers in self.packing:
                    layout.pack(_views(memory, self._weight_extents, buffers), params, buffers)
            addresses = {name: base + at for name, at in (*self.weight_at.items(), *self._image_at.items())}
            remake_images(self._programs.values(), addresses, stream)
            if capturing:  # a replay reads what the capture's packing wrote then, where it is: kept
                packed_for.forget()
                self._captured.add(memory.data_ptr())
            else:
                packed_for.remember(params)
        return base

    @cached_property
    def _pack_parts(self) -> list[tuple[int, int, ParamPart, torch.dtype]] | None:
        """(parameter index in the order of `keys`, the byte of the packing it goes to, its part, the
        buffer's type) of every part the packing copies; None where the layouts' keys differ or a
        parameter goes into buffers of different types (TensorLayout.pack's torch ops pack those)."""
        keys = self.layout.keys
        if any(layout.keys != keys for layout, _ in self.packing):
            return None
        parts, dtypes = [], {}
        for layout, buffers in self.packing:
            for part in layout.parts:
                if part.buffer not in buffers:
                    continue
                index, (at, _, dtype) = keys.index(part.key), self._weight_extents[part.buffer]
                if dtypes.setdefault(index, dtype) != dtype:
                    return None
                parts.append((index, at + part.col * dtype.itemsize, part, dtype))
        return parts or None

    def _pack_call(self, params: Sequence[torch.Tensor], capturing: bool = False) -> LaunchList | None:
        """The packing of parameters laid out as these (dtypes, shapes, strides) into the weight buffers
        as one launch-list call of one kernel (codegen.pack_kernel; bases: the packing's memory, then each
        parameter in the order of `keys`), made at the first packing of such parameters outside a CUDA
        graph capture (`capturing`: loading a module there would break it) and kept (the last
        MAX_PACK_KERNELS layouts'); None where a parameter is not of its buffers' type or its elements are
        not where strides say (torch's ops then pack, converting), or the kernel cannot be made. After an
        optimizer's step each training forward packs: with torch's ops, four a part, the runner's forward
        took 0.55 ms of host time for the LSTM at B=64 on an H200, with a 2D copy per part 0.25
        (docs/results/2026-11-29-cellrnn-lane.md), whose issuing the kernel saves."""
        parts = self._pack_parts
        if parts is None:
            return None
        layout = tuple((p.dtype, p.shape, p.stride()) for p in params)
        if layout in self._pack_calls:
            self._pack_calls.move_to_end(layout)
            return self._pack_calls[layout]
        if capturing:
            return None
        copies = []
        for index, at, part, dtype in parts:
            p = params[index]
            strides = _strides(p, part.rows, part.width)
            if p.dtype != dtype or strides is None:
                copies = None
                break
            copies.append(PackCopy(at, part.ld, part.rows, part.width, dtype.itemsize, *strides))
        calls = None if copies is None else self._pack_kernel(copies, [index for index, *_ in parts],
                                                              len(params))
        self._pack_calls[layout] = calls
        if len(self._pack_calls) > MAX_PACK_KERNELS:
            self._pack_calls.popitem(last=False)
        return calls

    def _pack_kernel(self, copies: list[PackCopy], sources: list[int], n_params: int) -> LaunchList | None:
        major, minor = torch.cuda.get_device_capability(self.index)
        what = f"the packing of {self.plans.train.cell_name}'s weights"
        try:
            module = loaded_module(what, pack_kernel_source(copies), f"sm_{major}{minor}")
            function = module.function(PACK_KERNEL)
        except CellError as e:
            log.warning("%s could not be made (%s); packing with torch's ops", what, e)
            return None
        calls = LaunchList(what)
        calls.kernel(function, what, (grid_blocks(total_elements(copies)),), BLOCK, 0,
                     [(0, 0), *((1 + index, 0) for index in sources)], 0)
        calls.finish()
        # a run's bases are the packing and every parameter, also those no launch reads (a cell's weight
        # that no node uses): room for all of them
        calls.bind([(slot, 0) for slot in range(1 + n_params)], bases=1 + n_params)
        return calls

    def _packed_in_one_call(self, base: int, params: Sequence[torch.Tensor], stream: int,
                            capturing: bool = False) -> bool:
        """Whether the parameters were packed at `base` by _pack_call (False where they cannot be: then
        torch's ops pack them; where its run fails, they do from then on)."""
        calls = self._pack_call(params, capturing)
        if calls is None:
            return False
        try:
            calls.run([base, *(p.data_ptr() for p in params)], stream)
        except CellError as e:
            log.warning("%s; packing with torch's ops from now on", e)
            self.__dict__["_pack_parts"] = None
            return False
        return True

    @staticmethod
    def _follow(uses: _Uses, program, stream: int) -> None:
        """A run on another stream than the packing's last one waits for what was put there: the runner's
        other programs (loaded modules of their own, whose `order` does not see this one's runs) read the
        packing, and a run may write it (packing anew)."""
        if uses.last != stream:
            if uses.last is not None:
                program.follow(uses.last, stream)
            uses.last = stream
            CHANGES.bump()

    def _packing(self, params: Sequence[torch.Tensor]) -> tuple[torch.Tensor, PackedFor]:
        """The packed weights of the parameters' module (found by its first Parameter's id: a module made
        where a freed one was may find the freed one's, which its PackedFor then tells apart), made where
        it has none; those of freed modules go first, then the least recently used, but never those a
        CUDA graph captured."""
        first = owner(params[0]) if params else None
        key = None if first is None else id(first)
        found = self._packings.get(key)
        if found is not None:
            self._packings.move_to_end(key)
            return found
        evictable = [k for k, (memory, _) in self._packings.items()
                     if memory.data_ptr() not in self._captured]
        gone = [k for k in evictable if self._packings[k][1].gone()]
        for k in gone or evictable[:max(0, len(self._packings) + 1 - MAX_PACKINGS)]:
            self._uses.pop(self._packings.pop(k)[0].data_ptr(), None)
            CHANGES.bump()
        _, images = _layout(list(self._images.items()))
        # (zeros: a bias buffer's columns that no parameter gives, where a cell folds a bias into some of
        # the GEMMs that share an operand and not others, are zeros, as Plan.weight_arrays makes them)
        memory = torch.zeros(self.weight_bytes + images, dtype=torch.uint8, device=self.device)
        found = self._packings[key] = (memory, PackedFor())
        return found

    # -- runs -----------------------------------------------------------------------------------------
    # A call's memory: the bases its buffers are found at, in this order, then the initial states' and the
    # final states' tensors (see `_binder`).
    RESERVE, PACKED, X, OUT, GRADS, STATES = range(6)

    def _binder(self, which: str, program) -> list[tuple[int, int]]:
        """Per buffer of the program, in its order: which base of a call its address is at, and the bytes
        after it."""
        memory = self.infer_memory if which == "forward" else self.memory
        ids = self.plans.train.state_ids
        out = []
        for name in program.buffers:
            if which in BACKWARDS and name in memory.grads:
                out.append((self.GRADS, memory.grads[name]))
            elif name in memory.reserve:
                out.append((self.RESERVE, memory.reserve[name]))
            elif name in self.weight_at:
                out.append((self.PACKED, self.weight_at[name]))
            elif name in self._image_at:
                out.append((self.PACKED, self._image_at[name]))
            elif name == "x":
                out.append((self.X, 0))
            elif name in (memory.output, caller(memory.output)):  # (the second where the first is kept)
                out.append((self.OUT, 0))
            elif name.removeprefix("caller.").startswith(("init.", "final.")):
                kind, state = name.removeprefix("caller.").split(".", 1)
                out.append((self.STATES + ids.index(state) + (len(ids) if kind == "final" else 0), 0))
            else:
                raise CellError(f"{program.what}: buffer {name!r} has no place in a call's memory")
        return out

    def _state_in(self, s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """An initial state in the type its plan stores it in (a 16-bit plan keeps some float32): converted
        at every call where it is not, but for a module's kept zeros (zeros.made_here, which no one
        writes) the runner's own kept zeros of that type. Under a CUDA graph capture, kept zeros are
        zeros of the graph's own instead, made by its replays: the kept ones go when other shapes come
        (zeros.MAX_ZEROS), while the graph lives on."""
        if made_here(s) and torch.cuda.is_current_stream_capturing():
            return torch.zeros(tuple(s.shape), dtype=dtype, device=s.device)
        if s.dtype == dtype:
            return _in_place(s)
        if made_here(s):
            return self._zeros(tuple(s.shape), dtype, s.device)
        return s.to(dtype, memory_format=torch.contiguous_format)

    def forward(self, x, states, params, save, shared=False):
        program = self._program("train" if save else "forward")
        with program.turn, kept_tensors():  # (its packings, zeros and replays' memory are kept)
            return self._forward(program, x, states, params, save, shared)

    def _forward(self, program, x, states, params, save, shared):
        which = "train" if save else "forward"
        self._block_run = None
        stream = torch._C._cuda_getCurrentRawStream(self.index)
        program.order(stream)  # (before the packing, which may write what a run on another stream reads)
        capturing = torch.cuda.is_current_stream_capturing()
        packed = self._weights(params, stream, program, capturing)
        if not save and program.capture_pays and program.ran and not capturing:
            # (captured from the second run on: the first made cuBLAS ready on its stream)
            replay = self._replays.get(which) or _Replay(self, program, x, (self._replays, which))
            try:
                y, finals = replay.run(x, states, packed, stream)
            except CellError as e:  # (a DriverError among them) launched from then on, as before
                log.warning("%s: a run could not be captured into a CUDA graph (%s); launching its kernels "
                            "at every call instead", program.what, e)
                program.capture_pays = False
                replay.drop()
            else:
                return y, finals, self._empty if shared else x.new_empty(0, dtype=torch.uint8)
        x = _in_place(x)
        memory = self.memory if save else self.infer_memory
        types = self._caller_state_dtypes if save else self._state_dtypes
        states = [self._state_in(s, dtype) for s, dtype in zip(states, types, strict=True)]
        T, B, H, L = self._sizes
        if shared and not save and self._one_type:  # one allocation, in the time of a call that returns
            block = torch.empty(self._block_elements, dtype=self._y_dtype, device=x.device)  # (microseconds)
            base, size = block.data_ptr(), self._y_dtype.itemsize
            out, scratch = base, base + self._outputs_end * size
            finals = [base + at * size for at in self._finals_at]
            reserve = self._empty
        else:  # tensors of their own: autograd holds each for as long as it needs it
            block = None
            reserve = torch.empty(memory.reserve_bytes, dtype=torch.uint8, device=x.device)
            scratch = reserve.data_ptr()
            if save and self._y_kept:  # (the run converts its y in the reserve into this one)
                y = torch.empty((T, B, H), dtype=x.dtype, device=x.device)
                out = y.data_ptr()
            else:
                whole = torch.empty((T + 1, B, H), dtype=self._y_dtype, device=x.device)
                y, out = whole[1:], whole.data_ptr()
            finals = [torch.empty((L, B, H), dtype=dtype, device=x.device) for dtype in types]
        bases = [scratch, packed, x.data_ptr(), out, 0, *(s.data_ptr() for s in states),
                 *(f if block is not None else f.data_ptr() for f in finals)]
        program.run(bases, stream, not capturing, at_first=block is not None)
        if block is not None and not capturing:
            self._block_run = (program, bases, packed, stream)
        if block is None and not save:  # no steps to keep: an empty reserve, its scratch freed only once
            reserve = reserve.new_empty(0)  # the run is queued (another thread's allocation could take it)
        if block is not None:
            y, finals = self._inference_outputs(block, x.dtype)
            return y, finals, reserve
        if save:  # (in the caller's types already)
            return y, finals, reserve
        # in x's type, as the initial states are given (a 16-bit plan keeps some states, and so maybe y,
        # in float32)
        y = y if y.dtype == x.dtype else y.to(x.dtype)
        return y, [f if f.dtype == x.dtype else f.to(x.dtype) for f in finals], reserve

    def call_lane(self, lane, x: torch.Tensor, params: Sequence[torch.Tensor], zeros: Sequence[torch.Tensor],
                  batch_first: bool, rows: tuple[int, int, int] | None = None):
        """A C++ lane (quick_lane) for inference calls like the one this runner just made, in one piece of
        memory, of x (as the module was given it: [B, T, I] where batch_first; cast where autocast cast
        it), these parameters and the module's kept zeros (`rows`: and of PackedSequences, see
        quick_lane.make): `lane` taught that call's captured run where it is still current, else a new
        one; `lane` as it is where that call was not a replay of a captured run, and None where no lane
        can make such calls (no lane could be built, the parameters are packed at every call, y and the
        states are stored in types of their own, the zeros are of more than one type: a 16-bit
        PackedSequence's, whose steps-left state is float32). Where y and every state are stored in one
        type other than x's (a 16-bit plan that keeps them float32), the lane runs over the runner's zeros
        of that type, as the call did, and gives its outputs back in x's type; not for PackedSequences.
        Called with the runner's lock held, right after the call."""
        made, self._block_run = self._block_run, None
        if made is None or quick_lane.module() is None:
            return lane
        program, bases, packed, stream = made
        graph = program.kept_graph(bases)
        if graph is None:
            return lane
        if lane is None or not lane.current():
            first = owner(params[0]) if params else None
            found = None if first is None else self._packings.get(id(first))
            if (found is None or not found[1].matches(params)
                    or self._y_dtype != x.dtype and (not self._one_type or rows is not None)
                    or any(z.dtype != zeros[0].dtype for z in zeros)  # (a 16-bit PackedSequence's)
                    or not all(type(t) in _LANE_TYPES for t in (x, *params, *zeros))):
                return None
            if self._y_dtype != x.dtype:  # (the zeros the call ran over: see _state_in)
                zeros = [self._zeros(tuple(z.shape), self._y_dtype, z.device) for z in zeros]
            try:
                with kept_tensors():  # (what the lane allocates, it keeps)
                    lane = quick_lane.make(x, params, zeros, batch_first, self._sizes, self._block_elements,
                                           self._outputs_end, self._finals_at, packed, stream,
                                           (self.lock, program.turn), program, rows=rows)
            except (ValueError, CellError, OSError) as e:  # (the call itself was made: it stands)
                log.warning("%s: no C++ lane for calls like this one (%s); they run in Python",
                            program.what, e)
                return None
            # (the versions the lane holds must be the packed ones: another thread may have changed a
            # parameter in place since `matches`, which bumps no count)
            if not found[1].matches(params):
                return None
        lane.learn(bases, int(graph))
        return lane

    def _inference_layout(self) -> None:
        """Where y's sequence (the initial states' row, then y), each final state and the scratch are in
        the one tensor (of y's type) of a forward run without saved steps, in elements: every piece
        256-byte aligned."""
        T, B, H, L = self._sizes
        size = self._y_dtype.itemsize
        step = _aligned(L * B * H * size) // size
        at = _aligned((T + 1) * B * H * size) // size
        self._finals_at = [at + i * step for i in range(len(self._state_dtypes))]
        self._outputs_end = at + len(self._state_dtypes) * step
        self._block_elements = self._outputs_end + -(-self.infer_memory.reserve_bytes // size)

    def _inference_outputs(self, block: torch.Tensor, dtype: torch.dtype):
        """y and the final states in such a tensor: views made with as_strided (one op each, as the calls
        that return in microseconds want), of the tensor, or of its outputs converted to `dtype` in one op
        where the plan stores them in another type."""
        T, B, H, L = self._sizes
        if block.dtype != dtype:
            block = block[:self._outputs_end].to(dtype)
        row = B * H
        y = block.as_strided((T, B, H), (row, H, 1), row)
        return y, [block.as_strided((L, B, H), (row, H, 1), at) for at in self._finals_at]

    def backward(self, dy, dfinals, x, states, params, y, reserve, input_grad=True, into=None):
        """dx (None without `input_grad`), the initial states' gradients and the parameters' grouped
        (TensorLayout.gradients); with `into` (the parameters' weight_views.Places, where
        `places_gradients` says yes), the gradients of the tensors the parameters are views of instead."""
        program = self._program(BACKWARD if input_grad else BACKWARD_NO_DX)
        with program.turn:
            return self._backward(program, dy, dfinals, x, states, params, y, reserve, input_grad, into)

    def places_gradients(self, input_grad: bool, into) -> bool:
        """Whether a backward call can give the gradients of the tensors that the parameters are views of
        (`into`: their weight_views.Places) in one kernel: one that can be made, made here (outside a CUDA
        graph capture only). A drop-in's views of torch's parameters (the gates' rows, transposed) then
        cost no torch op (a join of the gates' rows took four of them and 0.1 ms of host time a training
        step)."""
        if (input_grad, into) not in self._gathers and torch.cuda.is_current_stream_capturing():
            return False
        return self._gather(input_grad, into) is not None

    @cached_property
    def _starts(self) -> LaunchList:
        """The gradient memory's start values and dy put there in one call (bases: the memory, dy): the
        buffers the launches add into zeroed, the ones filled, dy copied where the forward pass wrote y
        (where nothing else is: the same as adding it onto zeros, as `TensorLayout.seed` does), converted
        to float32 from a 16-bit x's type as it is copied (the gradients are float32). A call of torch's
        each would cost the host more than the GPU takes to do them all."""
        memory, extents, backward = self.memory, self._grad_extents, self.plans.backward
        calls = LaunchList(f"the start of {self.plans.train.cell_name}'s backward pass")
        for start, end in memory.zeroed:
            calls.fill((0, start), 0, (end - start) // 4, 0, "the zeroing of the gradients")
        for name, b in backward.buffers.items():
            if backward.start_value(name) == 1.0:  # (a 16-bit one twice in each 32-bit word)
                at, nbytes = extents[name]
                one = bits(b.dtype, 1.0)
                calls.fill((0, at), one if b.dtype.itemsize == 4 else one * 0x10001, -(-nbytes // 4), 0,
                           f"the ones of {name}")
        start, end = memory.dy
        dy_type = self.plans.train.buffers["x"].dtype  # (y's as the caller has it, and so dy's)
        if dy_type == FLOAT32:
            calls.copy((0, start), (1, 0), end - start, 0, "the copy of dy")
        else:
            name, n = conversion_name(FLOAT32, dy_type), (end - start) // 4
            major, minor = torch.cuda.get_device_capability(self.index)
            calls.kernel(conversion(name, f"sm_{major}{minor}"), "the conversion of dy", (grid_blocks(n),),
                         BLOCK, 0, [(0, start), (1, 0), n], 0)
        calls.finish()
        return calls

    def _backward(self, program, dy, dfinals, x, states, params, y, reserve, input_grad, into):
        # (dy held by a name until its copy is queued: a copy made here and freed at once could be given
        # to another thread's allocation on the same stream, written before the copy read it)
        x, states, dy = _in_place(x), [_in_place(s) for s in states], _in_place(dy)
        memory = self.memory
        T, B, H, L = self._sizes
        row = B * H * y.element_size()
        y_kept = self._y_kept  # (then y is a copy in x's type: the run's is in the reserve)
        if (not y_kept and y.storage_offset() * y.element_size() < row
                or reserve.numel() != memory.reserve_bytes):
            raise CellError("the backward pass was given a y or saved steps that its forward run did not "
                            "make")
        if dy.dtype != y.dtype or tuple(dy.shape) != (T, B, H):
            raise CellError(f"the backward pass was given dy {dy.dtype} {list(dy.shape)}, and its forward "
                            f"run made y {y.dtype} {[T, B, H]}")
        stream = torch._C._cuda_getCurrentRawStream(self.index)
        program.order(stream)  # (before the packing: see forward)
        capturing = torch.cuda.is_current_stream_capturing()
        packed = self._weights(params, stream, program, capturing)
        grads = torch.empty(memory.grad_bytes, dtype=torch.uint8, device=x.device)
        self._starts.run([grads.data_ptr(), dy.data_ptr()], stream)
        views = _LazyViews(grads, self._grad_extents)
        self.layout.seed_finals(views, dfinals)
        bases = [reserve.data_ptr(), packed, x.data_ptr(), 0 if y_kept else y.data_ptr() - row,
                 grads.data_ptr(), *(s.data_ptr() for s in states), *([0] * len(states))]
        program.run(bases, stream, not capturing)
        # (the kernel is made outside a capture only: see _gather)
        if capturing and (input_grad, into) not in self._gathers:
            return self.layout.gradients(views, input_grad)
        gather = self._gather(input_grad, into)
        if gather is None:
            return self.layout.gradients(views, input_grad)
        shapes = self._grouped_shapes if into is None else into.sources
        grouped = [torch.empty(shape, dtype=torch.float32, device=x.device) for shape in shapes]
        dinitial = [torch.empty((L, B, H), dtype=t, device=x.device) for t in self._caller_state_dtypes]
        dx = [torch.empty(x.shape, dtype=x.dtype, device=x.device)] if input_grad else []
        gather.run([grads.data_ptr(), *(t.data_ptr() for t in (*grouped, *dinitial, *dx))], stream)
        return dx[0] if input_grad else None, dinitial, grouped

    @cached_property
    def _grouped_shapes(self) -> list[tuple[int, ...]]:
        return self.layout.grouped_shapes()

    def _gather(self, input_grad: bool, into=None) -> LaunchList | None:
        """What TensorLayout.gradients does, as one launch-list call of one kernel
        (codegen.gradient_gather; bases: the gradient memory, each grouped gradient, or with `into` each
        gradient of the tensors the parameters are views of, each state's in the caller's type, and with
        `input_grad` dx in x's type), made at the first backward run of each kind outside a CUDA graph
        capture (loading a module there would break it) and kept (`_gathers`); None where the kernel
        cannot be made (torch's ops then gather) or `into` cannot be written so."""
        key = (input_grad, into)
        if key in self._gathers:
            return self._gathers[key]
        offsets = {name: at for name, (at, _) in self._grad_extents.items()}
        gathers = self.layout.gathers(offsets, input_grad, into)
        calls = None
        if gathers:  # (none: no parameter, no state and no dx, nothing to gather)
            major, minor = torch.cuda.get_device_capability(self.index)
            what = f"the gathering of {self.plans.train.cell_name}'s gradients"
            # (the outputs after the grouped gradients: each state's, then dx)
            after = [*self._caller_states, *([self.plans.train.buffers["x"].dtype] if input_grad else [])]
            first = len(self._grouped_shapes if into is None else into.sources)
            types = {first + i: t for i, t in enumerate(after) if t != FLOAT32}
            try:
                module = loaded_module(what, gradient_gather.gather_kernel_source(gathers, types),
                                       f"sm_{major}{minor}")
                function = module.function(gradient_gather.GATHER_KERNEL)
            except CellError as e:
                log.warning("%s could not be made (%s); gathering with torch's ops", what, e)
            else:
                calls = LaunchList(what)
                outputs = first + len(after)
                calls.kernel(function, what, (grid_blocks(gradient_gather.total_elements(gathers)),), BLOCK,
                             0, [(slot, 0) for slot in range(1 + outputs)], 0)
                calls.finish()
        self._gathers[key] = calls
        return calls


def remake_images(programs: Iterable, addresses: dict[str, int], stream: int) -> None:
    """What the programs make of the weights (their `images`, at `addresses` in a packing), made again on
    `stream` after the weights changed: each image once where it can be. Programs that read the same image
    (the forward and training programs read W's copies, both backward programs W^T's) share its region,
    so a program whose images a program before it has made is skipped, the programs with most images
    first."""
    made: set[str] = set()
    for program in sorted(programs, key=lambda p: -len(p.images)):
        if program.images.keys() <= made:
            continue
        program.weights_changed(program.resolve_some(addresses), stream)
        made |= program.images.keys()


def _strides(p: torch.Tensor, rows: int, width: int) -> tuple[int, int] | None:
    """The strides, in elements, of a parameter read as `rows` x `width` (a [rows, width] tensor, a row
    [width], or any contiguous one of so many elements), or None where it is none of those."""
    if p.dim() == 2 and tuple(p.shape) == (rows, width):
        return p.stride(0), p.stride(1)
    if p.dim() == 1 and rows == 1 and p.shape[0] == width:
        return width * p.stride(0), p.stride(0)
    if p.is_contiguous() and p.numel() == rows * width:
        return width, 1
    return None


def _record(streams: set[int], stream: int, memory: Sequence[torch.Tensor]) -> None:
    """Memory used on `stream` (the current one), made known to the caching allocator where `streams`,
    those it was used on so far, lack it: the allocator gives memory back for reuse only once every
    stream that used it is past it."""
    if stream not in streams:
        current = torch.cuda.current_stream(memory[0].device)
        for t in memory:
            t.record_stream(current)
        streams.add(stream)


@dataclass
class _Uses:
    """The streams whose runs read a packing, and the last of them."""

    streams: set[int] = field(default_factory=set)
    last: int | None = None


class _Replay:
    """A forward program that launches at every step (the rungs up to `graph`), captured into a CUDA graph
    over memory of its own and replayed at every inference call: one call puts the whole pass on the
    stream, where the launch list would put hundreds from the host. A call copies x and the initial
    states into that memory and y and the final states out of it, into tensors of their own (in x's
    type). The memory is one call's, shared by every module the runner serves (calls are ordered on the
    streams: see StreamProgram.order), and kept by the last MAX_REPLAYS replays of the process to run (an
    older one is dropped, its memory given back, unless another thread runs it then; its runner makes it
    again at its next call). A graph is captured per address of packed weights (a module's; the last
    MAX_PACKINGS kept: packed weights found again at the same address are laid out the same, whichever
    module's they are)."""

    def __init__(self, runner: CudaRunner, program, x: torch.Tensor, home: tuple[dict, str]):
        """`home`: the runner's replays and this one's key in them."""
        T, B, H, L = runner._sizes
        device, self.program = x.device, program
        with torch.inference_mode(False):  # written at every call, in inference mode or not
            self.x = torch.empty(x.shape, dtype=x.dtype, device=device)
            dtypes = runner._state_dtypes
            self.states = [torch.empty((L, B, H), dtype=dtype, device=device) for dtype in dtypes]
            self._whole = torch.empty((T + 1, B, H), dtype=runner._y_dtype, device=device)
            self.finals = [torch.empty((L, B, H), dtype=dtype, device=device) for dtype in dtypes]
            self._scratch = torch.empty(runner.infer_memory.reserve_bytes, dtype=torch.uint8, device=device)
            self.y = self._whole[1:]
        self.graphs: OrderedDict[int, object] = OrderedDict()  # packed weights' address -> graph
        # the streams its memory was used on (see _record)
        self._streams = {torch._C._cuda_getCurrentRawStream(runner.index)}
        self._home, self._lock = home, runner.lock
        replays, which = home
        replays[which] = self
        with _live_lock:
            _live[id(self)] = self
            others = [r for r in _live.values() if r is not self]  # the least recently run first
        excess = len(others) + 1 - MAX_REPLAYS
        for other in others:
            if excess <= 0:
                break
            if other._lock.acquire(blocking=False):  # one that another thread runs now is kept
                try:
                    other.drop()  # (dropping one twice, from two threads, changes nothing)
                finally:
                    other._lock.release()
                excess -= 1

    def run(self, x: torch.Tensor, states: Sequence[torch.Tensor], packed: int, stream: int
            ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        graph = self._graph(packed)
        with _live_lock:
            _live.move_to_end(id(self))
        _record(self._streams, stream, (self.x, *self.states, self._whole, *self.finals, self._scratch))
        self.x.copy_(x)  # (after the caller's StreamProgram.order: a replay on another stream may read it)
        for mine, s in zip(self.states, states, strict=True):
            mine.copy_(s)
        self.program.replay(graph, stream)
        dtype = x.dtype
        return self.y.to(dtype, copy=True), [f.to(dtype, copy=True) for f in self.finals]

    def _graph(self, packed: int):
        graph = self.graphs.get(packed)
        if graph is not None:
            self.graphs.move_to_end(packed)
            return graph
        while len(self.graphs) >= MAX_PACKINGS:
            self.program.release(self.graphs.popitem(last=False)[1])
        bases = [self._scratch.data_ptr(), packed, self.x.data_ptr(), self._whole.data_ptr(), 0,
                 *(s.data_ptr() for s in self.states), *(f.data_ptr() for f in self.finals)]
        graph = self.graphs[packed] = self.program.capture(bases)
        return graph

    def close(self) -> None:
        """Its graphs released (captured again at its next run)."""
        graphs, self.graphs = self.graphs, OrderedDict()  # (taken first: two closes release each once)
        for graph in graphs.values():
            self.program.release(graph)

    def drop(self) -> None:
        """Its graphs released, and it out of its runner and of the process's live replays: its memory goes
        back to the caching allocator once nothing refers to it."""
        self.close()
        with _live_lock:
            _live.pop(id(self), None)
        replays, which = self._home
        if replays.get(which) is self:
            replays.pop(which, None)


MAX_REPLAYS = 4  # replays that keep their memory at once, in the process
_live: OrderedDict[int, _Replay] = OrderedDict()  # by id, the least recently run first
# _live's changes, from any thread; a replay is dropped only by a thread that holds its runner's lock
_live_lock = threading.RLock()  # (reentrant: a runner's finalizer may drop its replay inside)


def _close(programs: dict, replays: dict) -> None:
    for replay in list(replays.values()):  # (before the programs whose kernels their graphs launch)
        replay.drop()
    for program in programs.values():
        program.close()
    programs.clear()

