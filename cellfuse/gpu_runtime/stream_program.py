"""A lowered program (a forward pass, or the backward pass of one) put on a caller's stream over the
caller's memory: the addresses of the buffers are given at every run, not fixed when the program is made.

This is how a PyTorch module runs CellFuse's kernels inside PyTorch's own tensors, on
torch.cuda.current_stream(), so that its work joins a CUDA graph that PyTorch captures, and its memory
comes from PyTorch's allocator. The caller (cellfuse.nn) owns every byte; the program owns only what does
not change from run to run: the loaded kernels, a cuBLAS handle per stream, the streams
beside the caller's (forked from it and joined back to it by the program's own events) and its calls,
as a launch list (launch_list.py) that makes them all in one call from Python.

    program = StreamProgram(plan, lower(plan).instructions, kernels, arch)
    at = program.resolve({"x": x_ptr, "init.h": ..., ...})  # every buffer of `program.buffers`
    program.run(at, stream_handle)  # or: program.bind(where each buffer is); program.run(bases, ...)

The GEMMs run as the Plan's routes say: float32 through cuBLAS; on tensor cores, each float32 product as
three fp16 ones through split copies and cuBLAS's fp16 GEMM over 3K, or as the warpgroup GEMM where it is
usable and measured faster for the shape (`route_choice`, once per shape and process). The split copies
need scratch memory (`scratch`, bytes per name, to be given with the buffers); what a GEMM on tensor cores
makes of a weight (W's copies and largest magnitudes, `pieces_name(w)`; the warpgroup GEMM's image of W,
`image_name(w)`) is made by `weights_changed` into memory the caller gives under that name (see
`images`), not by every run.

No call of `run` waits for the GPU or allocates: everything that does (compiling, loading, measuring)
happens when the program is made, so a program must be made before a CUDA graph capture begins. Runs of
one loaded module's kernels put on two streams are ordered: the second waits for what was put on the
first (a persistent kernel's exchanges are arrays of its module; see `run`).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence

import numpy as np

from ..codegen.conversions import conversion_name, conversions_source
from ..codegen.cuda_wgmma import SMEM_BYTES, SOURCE, THREADS, RowEnds, gemm_grid, row_ends
from ..codegen.gemm_routes import (
    GEMM_DEFAULT_ALGO,
    Ref,
    f16x3_layout,
    f16x3_steps,
    gemm_ex_types,
    workspace_bytes,
)
from ..codegen.kernel_abi import BLOCK, grid_blocks, kernel_params
from ..codegen.kernel_set import KernelSet
from ..codegen.lowering import (
    Convert,
    Copy,
    Gemm,
    Instruction,
    Kernel,
    Loop,
    Persistent,
    Record,
    Wait,
    element_offset,
)
from ..codegen.persistent_cuda import persistent_buffers
from ..codegen.plan import Plan
from ..graph_model import CellError
from . import driver
from .driver import check
from .event_timing import median_ms
from .kernel_cache import cubin, fitted
from .launch_list import CHECK_LAUNCHES, COOPERATIVE, EARLY, KERNEL, LaunchList
from .wgmma_gemms import Operands, usable

log = logging.getLogger(__name__)

_R_32F, _R_16F, _COMPUTE_32F = 0, 2, 68  # cudaDataType, cublasComputeType_t
_TIMED_RUNS = 5
MAX_KEPT_RUNS = 8  # runs a program keeps captured, by their bases (see StreamProgram.run)
# captures after which a program whose captured runs were replayed fewer than twice each on average stops
# capturing: its runs' bases come back too seldom (more of them in turn than it keeps) for captures to pay
CAPTURES_ON_TRIAL = 4 * MAX_KEPT_RUNS


def split_name(stream: int) -> str:
    return f"split:{stream}"


def _is_weight(plan: Plan, name: str) -> bool:
    """Whether a GEMM's W is one of the weights (`Buffer.is_weight`: they change only where the caller
    says so, `weights_changed`); a backward pass's W may be a gradient, of its own plan's buffers only."""
    buffer = plan.buffers.get(name)
    return buffer is not None and buffer.is_weight


def pieces_name(w: str, transposed: bool) -> str:
    """The name of W's region of the split copies (its copies and largest magnitudes; one per layout W is
    read in)."""
    return f"pieces:{w}:{'T' if transposed else 'N'}"


def image_name(w: str, transposed: bool) -> str:
    """The name of W's image for the warpgroup GEMM (one per layout W is read in)."""
    return f"image:{w}:{'T' if transposed else 'N'}"


class Changes:
    """A count of the changes that may make a kept run's replay from outside Python wrong (nn's C++ lanes,
    nn/quick_lane.py, which replay without asking here): the stream a loaded module's runs were last put
    on, a captured run released, and what a caller counts of its own (a packing of weights made, dropped
    or written). A lane made at one count replays only while the count is the same."""

    def __init__(self):
        self.value = 0
        self._lock = threading.Lock()  # (an increment of two threads at once must not count once)

    def bump(self) -> None:
        with self._lock:
            self.value += 1


CHANGES = Changes()

_loaded: dict[tuple, driver.Module] = {}  # (device ordinal, what, source, lane) -> its module
_last_stream: dict[int, int] = {}  # a loaded module's handle -> the stream its kernels were last put on
_turns: dict[int, threading.RLock] = {}  # a loaded module's handle -> its `turn` (see StreamProgram)
_route_choice: dict[tuple, str] = {}  # (device ordinal, SMs, shape) -> "wgmma" or "copies", for the process


def loaded_module(what: str, source: str, arch: str, lane: int = 0) -> driver.Module:
    """A module compiled for `arch` (or found in the kernel cache), loaded into the current context once
    per device and lane. A persistent kernel's exchanges are arrays of its module (one run at a time uses
    them): programs of the same kernels that run at once, side by side, are given lanes of their own, so
    that each loads the module for itself."""
    key = (driver.current_device(), what, source, lane)
    if key not in _loaded:
        _loaded[key] = driver.Module(cubin(source, arch), what)
    return _loaded[key]


def conversion(name: str, arch: str):
    """A kernel of codegen.conversions, from a module of them all (loaded once per device)."""
    return loaded_module("the conversions between types", conversions_source(), arch).function(name)


class _Resources:
    """What a program's calls share and keep: the loaded kernels, a cuBLAS handle per stream, alpha and
    beta.

    A handle works in cuBLAS's own workspace, which cublasSetStream picks for it: a workspace given by
    cublasSetWorkspace (8 MiB, tried) made cuBLAS choose algorithms whose gradients were 3x further
    from float64 (docs/results/2026-11-28-cellrnn-launch-list.md)."""

    def __init__(self, kernels: KernelSet, arch: str, capability: tuple[int, int], streams: int, what: str,
                 lane: int, sm_target: int = 0):
        """`sm_target`: the SMs cuBLAS picks the handles' kernels for (0: all of the GPU's)."""
        from nvmath.bindings import cublas

        self.cu, self.cublas = driver.bindings(), cublas
        self.capability = capability
        kernels, _ = fitted(kernels, arch)  # (its cubin kept for loaded_module)
        self.module = loaded_module(what, kernels.module_source(), arch, lane)
        self.name_of = kernels.name_of
        self.functions: dict[str, object] = {}
        self.handles = [cublas.create() for _ in range(streams)]
        self.sm_target = sm_target  # (0: all of them, as cuBLAS says it)
        for handle in self.handles if sm_target else ():
            cublas.set_sm_count_target(handle, sm_target)
        self.scalars = np.array([1.0, 0.0], np.float32)  # cuBLAS reads them when the GEMM is put on a stream

    def point(self, s: int, stream) -> None:
        self.cublas.set_stream(self.handles[s], int(stream))

    def function(self, name: str):
        if name not in self.functions:
            self.functions[name] = self.module.function(name)
        return self.functions[name]

    def conversion(self, name: str):
        if name not in self.functions:
            self.functions[name] = conversion(name, f"sm_{self.capability[0]}{self.capability[1]}")
        return self.functions[name]

    def wgmma_functions(self):
        module = loaded_module("the warpgroup GEMM", SOURCE, "sm_90a")
        return module.function("cf_wgmma_image"), module.function("cf_wgmma_gemm")

    def close(self) -> None:
        for handle in self.handles:
            self.cublas.destroy(handle)


class _Calls:
    """The calls of instructions as they are built: the buffers they address (by slot), the scratch the
    split copies need, and what the GEMMs on tensor cores make of the weights (W's copies, the warpgroup
    GEMMs' images of W: `images`, made by calls of their own, `image_calls`, on one stream)."""

    def __init__(self, res: _Resources, plan: Plan, sm_count: int, events: list, what: str):
        self.res, self.plan, self.sm_count, self.events = res, plan, sm_count, events
        self.buffers: dict[str, int] = {}  # buffer name -> slot
        self.scratch: dict[str, int] = {}  # name -> bytes
        self.images: dict[str, int] = {}  # pieces_name(w) or image_name(w) -> bytes
        self.calls = LaunchList(what)
        self.image_calls = LaunchList(f"{what}: the images of weights")

    def _slot(self, name: str) -> int:
        return self.buffers.setdefault(name, len(self.buffers))

    def finish(self, side_streams: list) -> None:
        """Both lists fixed (on the caller's stream and `side_streams`), each buffer a base of its own."""
        slots = [(slot, 0) for slot in range(len(self.buffers))]
        self.calls.finish(side_streams, self.res.handles)
        self.image_calls.finish()
        for listed in (self.calls, self.image_calls):
            listed.bind(slots)

    def _args(self, args: list) -> list:
        """(buffer, byte offset) pointers as (slot, byte offset); ints as they are."""
        return [a if isinstance(a, int) else (self._slot(a[0]), a[1]) for a in args]

    def _kernel(self, name: str, grid, block: int, args: list, stream: int, smem: int = 0,
                kind: int = KERNEL, function=None, calls: LaunchList | None = None,
                label: str | None = None) -> None:
        """A launch of a kernel whose arguments are (buffer, byte offset) pointers or ints, into `calls`
        (the run's own list unless given); `label` names it in errors (else its name)."""
        # (`is None`, not `or`: a list given must be used even while it is empty, or the first image's
        # kernel would go into the run's own list, unordered against the GEMMs on other streams that read
        # the image)
        (self.calls if calls is None else calls).kernel(function or self.res.function(name), label or name,
                                     grid if isinstance(grid, tuple) else (grid,), block, smem,
                                     self._args(args), stream, kind)

    def add(self, instr: Instruction, t: int) -> None:
        B = self.plan.sizes.batch
        match instr:
            case Gemm():
                self._gemm(instr, t)
            case Kernel(launch=k, rows=rows, stream=s):
                args = [(p.access.buffer, p.access.dtype.itemsize * element_offset(instr, p.access, t, B))
                        for p in kernel_params(k)]
                self._kernel(self.res.name_of[k], grid_blocks(rows * k.width), BLOCK, [*args, rows], s)
            case Copy(src=src, dst=dst, width=width, step=step, stream=s):
                at = self.plan.sizes.seq if step is None else step
                assert src.dtype == dst.dtype, f"a copy from {src.buffer} to {dst.buffer} converts"
                nbytes = B * width * src.dtype.itemsize
                self.calls.copy((self._slot(dst.buffer), dst.dtype.itemsize * dst.offset(at, B)),
                                (self._slot(src.buffer), src.dtype.itemsize * src.offset(at, B)), nbytes, s,
                                f"the copy of {src.buffer} to {dst.buffer}")
            case Convert(src=src, dst=dst, elements=n, stream=s):
                name = conversion_name(instr.dst_dtype, instr.src_dtype)
                self._kernel(name, grid_blocks(n), BLOCK,
                             [(dst, instr.dst_at * instr.dst_dtype.itemsize),
                              (src, instr.src_at * instr.src_dtype.itemsize), n], s,
                             function=self.res.conversion(name), label=f"the conversion of {src} to {dst}")
            case Record(event=e, stream=s):
                self.calls.record(self.events[e], s)
            case Wait(event=e, stream=s):
                self.calls.wait(self.events[e], s)
            case Loop(body=body):
                for step in instr.steps(self.plan.sizes.seq):
                    for inner in body:
                        self.add(inner, step)
            case Persistent(launch=p, stream=s):
                self._persistent(p, s)
            case _:
                raise TypeError(f"a stream program cannot run {instr!r}")

    def _persistent(self, p, s: int) -> None:
        name = self.res.name_of[p]
        function = self.res.function(name)
        early = self.res.capability >= (9, 0)
        kind = COOPERATIVE if p.cooperative else EARLY if early else KERNEL
        args = [self.plan.sizes.seq, self.plan.sizes.batch, *((b, 0) for b in persistent_buffers(p))]
        self._kernel(name, p.blocks, p.threads, args, s, p.smem_bytes, kind, function)
        if p.cooperative:
            per_sm = driver.resident_blocks(function, p.threads, p.smem_bytes)
            if per_sm * self.sm_count < p.blocks:
                raise CellError(f"the persistent kernel of {p.label} needs its {p.blocks} blocks resident at "
                                f"once, and this GPU holds {per_sm * self.sm_count} of them ({self.sm_count} "
                                f"SMs x {per_sm}, with {p.smem_bytes} bytes of shared memory each)")

    def _gemm(self, instr: Gemm, t: int) -> None:
        g, m, s = instr.launch, instr.rows, instr.stream
        B = self.plan.sizes.batch
        a = (g.a.buffer, g.a.dtype.itemsize * element_offset(instr, g.a, t, B))
        c = (g.c.buffer, g.c.dtype.itemsize * element_offset(instr, g.c, t, B))
        ldw = g.k if g.trans_w else g.n
        op = Operands(c[1], a[1], 0, 0, m, g.n, g.k, g.a.ld, ldw, g.c.ld, g.trans_w, bool(g.accumulate))
        if instr.route.startswith("f16x3"):  # the bias added after the GEMM
            ends = row_ends(self.plan, g, m, instr.steps)
            if (instr.route == "f16x3-or-wgmma" and usable(self.res.capability, op, ends.batch if ends else 0)
                    and route_choice(self.res, self.plan, g, op, a, c, s) == "wgmma"):
                self.wgmma(g, op, a, c, s, ends)
            else:
                self.copies(g, m, a, c, s, instr.w_made_at)
            return
        if g.bias:  # the bias rows first, then C accumulates A @ W onto them
            self._kernel("cf_bias_rows", grid_blocks(m * g.n), BLOCK, [c, (g.bias, 0), m, g.n, g.c.ld], s)
        accumulate = bool(g.bias or g.accumulate)
        if instr.route == "float32":
            self._sgemm(g, m, a, c, ldw, accumulate, s)
        else:
            self._gemm_ex(g, m, a, c, ldw, accumulate, s)

    def _sgemm(self, g, m: int, a, c, ldw: int, accumulate: bool, s: int) -> None:
        # Row-major C = op(A) @ op(W) is column-major C^T = op(W)^T @ op(A)^T: W goes first, and a
        # transposed operand (stored [N, K] or [K, M]) is cuBLAS's op T (1) with its own row length.
        one = self.res.scalars.ctypes.data
        beta = one if accumulate else one + 4
        self.calls.sgemm(self.res.handles[s], self._args(
            [int(g.trans_w), int(g.trans_a), g.n, m, g.k, one, (g.w, 0), ldw, a, g.a.ld, beta, c, g.c.ld]),
            s, f"cuBLAS's SGEMM of {g.group}")

    def _gemm_ex(self, g, m: int, a, c, ldw: int, accumulate: bool, s: int) -> None:
        """A GEMM of a 16-bit plan (as _sgemm's operands): cublasGemmEx in the operands' own type (see
        gemm_ex_types)."""
        one = self.res.scalars.ctypes.data
        beta = one if accumulate else one + 4
        types, compute = gemm_ex_types(g)
        self.calls.gemm_ex(self.res.handles[s], self._args(
            [int(g.trans_w), int(g.trans_a), g.n, m, g.k, one, (g.w, 0), types[0], ldw, a, types[1], g.a.ld,
             beta, c, types[2], g.c.ld, compute, GEMM_DEFAULT_ALGO]),
            s, f"cuBLAS's {g.multiply.name} GEMM of {g.group}")

    def copies(self, g, m: int, a, c, s: int, w_made_at: int | None = None) -> None:
        """Three fp16 products in the stream's scratch: the calls of gemm_routes.f16x3_steps, on stream s.
        W's region (its copies and largest magnitudes) is made by `weights_changed` into memory the caller
        gives under `pieces_name(w)` where W is a weight, else by every run in the scratch (by the GEMM
        before, at `w_made_at`, where that is given: see lowering.w_regions_shared)."""
        scratch = split_name(s)
        lay = f16x3_layout(g, m, g.k)
        weight = _is_weight(self.plan, g.w)
        self.scratch[scratch] = max(self.scratch.get(scratch, 0), workspace_bytes(g, m, "f16x3", weight))
        kept = (pieces_name(g.w, g.trans_w), 0) if weight else (
            scratch, int(lay.kept_at) if w_made_at is None else w_made_at)
        # by another GEMM of the same W
        made = kept[0] in self.images if weight else w_made_at is not None
        if weight:
            self.images[kept[0]] = int(lay.kept_bytes)
        where = {"a": a, "w": (g.w, 0), "c": c, "bias": (g.bias, 0) if g.bias else None,
                 "workspace": (scratch, 0), "kept": kept}

        def value(arg):
            if not isinstance(arg, Ref):
                return int(arg)
            at = where[arg.of]
            return 0 if at is None else (at[0], at[1] + int(arg.offset))

        for step in f16x3_steps(g, m, g.k):
            args = [value(arg) for arg in step.args]
            if step.of_w and weight:  # made when the weights change, on the stream given then
                if not made:
                    self._f16x3_kernel(step, args, g, 0, self.image_calls)
            elif step.of_w and made:
                continue
            elif step.kind in ("zero", "kernel"):
                self._f16x3_kernel(step, args, g, s, self.calls)
            else:
                split_w, ldw3, split_a, lda3, sums, ldd, (scalars, at) = args
                self.calls.gemm_ex(self.res.handles[s], self._args(
                    [int(g.trans_w), 0, g.n, m, 3 * g.k, (scalars, at), split_w, _R_16F, ldw3, split_a,
                     _R_16F, lda3, (scalars, at + 4), sums, _R_32F, ldd, _COMPUTE_32F, GEMM_DEFAULT_ALGO]),
                    s, f"{step.name} of {g.group}", device_scalars=True)

    def _f16x3_kernel(self, step, args: list, g, s: int, calls: LaunchList) -> None:
        """A "zero" or "kernel" step of gemm_routes.f16x3_steps into `calls`, on stream s."""
        if step.kind == "zero":
            calls.fill(self._args(args[:1])[0], 0, args[1], s, f"{step.name} of {g.group}")
        else:
            self._kernel(step.name, grid_blocks(int(step.threads)), BLOCK, args, s, calls=calls)

    def wgmma(self, g, op: Operands, a, c, s: int, ends: RowEnds | None = None) -> None:
        """W's image, then the warpgroup GEMM (adding g's bias, if it has one, in its epilogue): the image
        made by `weights_changed` where W is a weight the caller keeps an image of, else by every run into
        the stream's scratch. `ends`: where its rows are steps of a batch whose rows have lengths."""
        image_fn, gemm_fn = self.res.wgmma_functions()
        weight = _is_weight(self.plan, g.w)
        pieces = (image_name(g.w, g.trans_w), 0) if weight else (split_name(s), 0)
        nbytes = 4 * 2 * g.n * g.k
        image = ("cf_wgmma_image", (g.n * g.k + 255) // 256, 256,
                 [pieces, (g.w, 0), g.n, g.k, op.ldw, int(g.trans_w)])
        if weight:  # made when the weights change, on the stream given then
            if pieces[0] not in self.images:
                self._kernel(*image, 0, function=image_fn, calls=self.image_calls)
            self.images[pieces[0]] = nbytes
        else:
            self.scratch[pieces[0]] = max(self.scratch.get(pieces[0], 0), nbytes)
            self._kernel(*image, s, function=image_fn)
        bias = (g.bias, 0) if g.bias else 0
        lengths = [(ends.lengths, 0), ends.width, ends.batch, ends.first_step] if ends else [0, 0, 0, 0]
        self._kernel("cf_wgmma_gemm", gemm_grid(op.m, op.n, ends.batch if ends else 0), THREADS,
                     [c, a, pieces, bias, op.m, op.n, op.k, op.lda, op.ldc, int(op.accumulate), *lengths], s,
                     SMEM_BYTES, function=gemm_fn, label=f"cf_wgmma_gemm of {g.group}")


def route_choice(res: _Resources, plan: Plan, g, op: Operands, a, c, s: int) -> str:
    """The faster route of a GEMM the warpgroup GEMM could run, timed once per shape, share of the SMs
    (cuBLAS picks other kernels for fewer) and process on scratch memory as large as its operands, zeroed
    (the values do not change a GEMM's time, but the copies' pass returns at once where each operand has
    one scale, as zeros and most operands do: see gemm_splits.cuh)."""
    key = (driver.current_device(), res.sm_target, op.m, op.n, op.k, op.lda, op.ldw, op.ldc, op.trans_w,
           op.accumulate)
    if key in _route_choice:
        return _route_choice[key]
    cu = res.cu
    routes = {}
    for route in ("copies", "wgmma"):
        calls = _Calls(res, plan, 0, [], f"the {route} route of a GEMM")
        calls.copies(g, op.m, a, c, s) if route == "copies" else calls.wgmma(g, op, a, c, s)
        routes[route] = calls
    stream = driver.new_stream()
    names = {name for calls in routes.values() for name in calls.buffers}
    w_rows = op.n if op.trans_w else op.k
    largest = max(4 * (op.m * op.lda + a[1] // 4), 4 * w_rows * op.ldw, 4 * (op.m * op.ldc + c[1] // 4),
                  workspace_bytes(g, op.m, "f16x3-or-wgmma"))
    memory = {name: check(cu.cuMemAlloc(largest), "allocating scratch to time a GEMM") for name in names}
    try:
        for m in memory.values():
            check(cu.cuMemsetD32Async(m, 0, largest // 4, stream), "zeroing scratch to time a GEMM")
        for i in range(s + 1):
            res.point(i, stream)
        times = {}
        for route, calls in routes.items():
            at = [int(memory[name]) for name in calls.buffers]
            calls.finish([stream] * s)
            calls.image_calls.run(at, int(stream))
            def run(calls=calls, at=at) -> None:
                calls.calls.run(at, int(stream))
            times[route] = median_ms(driver, run, stream, _TIMED_RUNS)
    finally:
        check(cu.cuStreamSynchronize(stream), "timing a GEMM")
        for m in memory.values():
            check(cu.cuMemFree(m), "freeing scratch")
        check(cu.cuStreamDestroy(stream), "destroying a stream")
    _route_choice[key] = min(times, key=times.get)
    return _route_choice[key]


class StreamProgram:
    """A program's launches over buffers whose addresses `run` is given; see the module's docstring."""

    def __init__(self, plan: Plan, instructions: Sequence[Instruction], kernels: KernelSet, arch: str,
                 capability: tuple[int, int], sm_count: int, what: str, lane: int = 0, sharing: int = 1):
        """`lane`: which of the runs of these kernels that may run at once this program is (see
        loaded_module); `sharing`: how many layers run their steps at once (lowering.Program.sharing),
        each one's GEMMs picked by cuBLAS for that share of the SMs, as the CUDA executor's are."""
        self.plan, self.what = plan, what
        flat = list(_flat(instructions))
        streams = 1 + max((getattr(i, "stream", 0) for i in flat), default=0)
        events = 1 + max((i.event for i in flat if isinstance(i, (Record, Wait))), default=-1)
        self.res = _Resources(kernels, arch, capability, streams, what, lane,
                              max(1, sm_count // sharing) if sharing > 1 else 0)
        self.side_streams = [driver.new_stream() for _ in range(streams - 1)]
        self.events = [driver.new_event() for _ in range(events)]
        calls = _Calls(self.res, plan, sm_count, self.events, what)
        for instr in instructions:
            calls.add(instr, 0)
        # after `add`, whose timing of GEMM routes points the handles at a stream of its own
        for s, stream in enumerate(self.side_streams, start=1):
            self.res.point(s, stream)
        self.buffers, self.scratch, self.images = calls.buffers, calls.scratch, calls.images
        calls.finish(self.side_streams)
        self.calls, self._image_calls = calls.calls, calls.image_calls
        self._module_key = int(self.res.module.handle)
        # held by a caller from `order` until its run is on the stream: programs of one loaded module
        # (another runner's, of other sequence lengths, say) share its exchange arrays and its last stream,
        # so that another thread's run must not be put on a stream between the two (setdefault is atomic)
        self.turn = _turns.setdefault(self._module_key, threading.RLock())
        self._handover = driver.new_event()  # marks the other stream's work that a run waits for
        # whether capturing a run once and replaying it (see `capture`) pays: where the host puts launches
        # on the stream at every step (a loop over the steps), but not where each launch is checked (a
        # replay's fault would name no launch)
        self.capture_pays = any(isinstance(i, Loop) for i in instructions) and not CHECK_LAUNCHES
        self.ran = False  # whether a run was put on a stream yet
        self._capture_stream = None  # made at the first capture
        # runs captured by their bases, the most recently run last, and the bases of runs seen once (see
        # `run`); None where runs are not captured (each launch checked: a replay's fault names no launch)
        self._kept: OrderedDict[tuple[int, ...], object] | None = None if CHECK_LAUNCHES else OrderedDict()
        self._seen_once: OrderedDict[tuple[int, ...], None] = OrderedDict()
        self._captures = self._replays = 0
        self._cu_streams: dict[int, object] = {}  # raw handle -> cuda.bindings' stream (made once each)

    @property
    def names(self) -> list[str]:
        """What each launch runs, in order."""
        return self.calls.names

    def bind(self, binder: Sequence[tuple[int, int]], bases: int = 0) -> None:
        """Where each buffer (in the order of `buffers`) is in a run's memory: binder[i] = (which of the
        run's bases, the bytes after it); at first each buffer is a base of its own (see `resolve`)."""
        self.calls.bind(binder, bases)
        self._forget_kept()  # (captured with the buffers where the binder before put them)

    def resolve(self, addresses: Mapping[str, int]) -> list[int]:
        """The addresses in the order of `buffers`, or a CellError naming one not given."""
        try:
            return [addresses[name] for name in self.buffers]
        except KeyError as e:
            raise CellError(f"{self.what}: no memory given for buffer {e.args[0]!r}") from None

    def run(self, bases: Sequence[int], stream: int, keep: bool = False, at_first: bool = False) -> None:
        """Puts the whole program on `stream` (a raw CUstream handle) over a run's bases (see `bind`), its
        side streams forked from it and joined back to it by the program's events.

        `keep`: the caller's stream is not being captured, so the run may be a replay: the second run over
        the same bases captures the program over them into a CUDA graph, and later runs over them replay
        it, one call where the launch list makes every launch (on an H200 a cuBLAS GEMM costs the host
        about 10 us, a kernel's launch 5). A caller whose memory comes from torch's caching allocator finds
        the same addresses again call after call. The last MAX_KEPT_RUNS captured runs are kept. A replay
        or a capture that fails, or captures that do not pay (CAPTURES_ON_TRIAL), leave every later run to
        launch. Runs of one program are made one at a time (CudaRunner holds its lock around them, and
        around `bind`).

        `at_first`: captured at the first run over the bases already, for a caller that makes the next run
        over them another way once they are captured (a module's inference call made in one piece, whose
        C++ lane learns a run's bases from its captured graph): it learns them a sighting sooner. In a
        stack whose calls' memory comes back at a few addresses in turn, the lanes otherwise took twice
        as many calls to make every call."""
        graph = self._kept_run(tuple(bases), at_first) if keep and self._kept is not None else None
        if graph is not None:
            try:
                self.replay(graph, stream)
            except CellError as e:  # (out of memory, say: not the kernels', which would fail launched too)
                self._stop_keeping(f"a captured run could not be replayed ({e})")
            else:
                self._replays += 1
                self.ran = True
                return
        self.order(stream)
        self.calls.run(bases, stream)
        self.ran = True

    def _kept_run(self, bases: tuple[int, ...], at_first: bool = False):
        """The captured run over these bases: found, or captured where a run over them was seen before
        or `at_first` (None where not, or where the capture fails: from then on every run launches)."""
        kept = self._kept
        graph = kept.get(bases)
        if graph is not None:
            kept.move_to_end(bases)
            return graph
        if not at_first and bases not in self._seen_once:
            self._seen_once[bases] = None
            if len(self._seen_once) > 2 * MAX_KEPT_RUNS:
                self._seen_once.popitem(last=False)
            return None
        self._seen_once.pop(bases, None)
        if self._captures >= CAPTURES_ON_TRIAL and self._replays < 2 * self._captures:
            self._stop_keeping(f"{self._captures} captured runs were replayed {self._replays} times in all")
            return None
        try:
            graph = self.capture(bases)
        except CellError as e:  # (a DriverError among them)
            self._stop_keeping(f"a run could not be captured into a CUDA graph ({e})")
            return None
        self._captures += 1
        kept[bases] = graph
        if len(kept) > MAX_KEPT_RUNS:
            self.release(kept.popitem(last=False)[1])
        return graph

    def _stop_keeping(self, why: str) -> None:
        log.warning("%s: %s; launching its kernels at every run instead", self.what, why)
        self._forget_kept()
        self._kept = None

    def _forget_kept(self) -> None:
        """Every captured run released, and the runs seen once forgotten."""
        CHANGES.bump()
        # (taken out before any is released: a release that fails leaves none to be released again)
        kept, self._seen_once = self._kept, OrderedDict()
        if kept:
            graphs = list(kept.values())
            kept.clear()
            for graph in graphs:
                self.release(graph)

    def kept_graph(self, bases: Sequence[int]):
        """The captured run over these bases, where the program keeps one (None where not)."""
        return None if self._kept is None else self._kept.get(tuple(bases))

    def order(self, stream: int) -> None:
        """What is put on `stream` from now on made to follow every run put on another stream before (see
        `_after`). `run` and `replay` do it themselves; a caller that writes a captured run's memory
        before its replay does it first."""
        last = _last_stream.get(self._module_key)
        if last != stream and not self._capturing(stream):
            if last is not None and not self._capturing(last):
                self._after(last, stream)
            _last_stream[self._module_key] = stream
            CHANGES.bump()

    def follow(self, last: int, stream: int) -> None:
        """`stream` made to wait for everything put on `last` so far, where neither captures (see
        `_after`): for memory that runs of other modules read and write too."""
        if last != stream and not self._capturing(stream) and not self._capturing(last):
            self._after(last, stream)

    def capture(self, bases: Sequence[int]):
        """A run over these bases captured into a CUDA graph, instantiated, for `replay` (and `release`).
        The memory at the bases is the graph's from then on: every replay reads and writes it there. A
        program must have run once before (cuBLAS takes what it needs at its first GEMM on a stream).
        Captured on a stream of the program's own, kept for its captures."""
        if self._capture_stream is None:
            self._capture_stream = driver.new_stream()
        stream = self._capture_stream
        return driver.capture(stream, lambda: self.calls.run(bases, int(stream)),
                              f"capturing a run of {self.what}")

    def replay(self, graph, stream: int) -> None:
        """A captured run put on `stream` (ordered as `run` orders runs), in one call."""
        self.order(stream)
        cu_stream = self._cu_streams.get(stream)
        if cu_stream is None:
            if len(self._cu_streams) >= 64:  # (a process's streams are few; a bound all the same)
                self._cu_streams.clear()
            cu_stream = self._cu_streams[stream] = driver.as_stream(stream)
        err = self.res.cu.cuGraphLaunch(graph, cu_stream)[0]
        if int(err):  # (the message made only then: a replay is the whole host time of a call)
            driver.fail(err, f"replaying {self.what}")

    def release(self, graph) -> None:
        CHANGES.bump()  # (before: a lane must not replay it once it is destroyed)
        check(self.res.cu.cuGraphExecDestroy(graph), f"releasing a captured run of {self.what}")

    def _capturing(self, stream: int) -> bool:
        cu = self.res.cu
        status = check(cu.cuStreamIsCapturing(driver.as_stream(stream)), "asking whether a stream captures")
        return status != cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE

    def _after(self, last: int, stream: int) -> None:
        """`stream` made to wait for everything put on `last` so far: two runs of one module's kernels
        (modules of the same sizes share one, and its persistent kernels' exchanges) never overlap, on
        whichever streams they are put. Not under a CUDA graph capture of either stream, which holds no
        wait for work outside it (a replay's order with other work is the caller's to set, as for any
        replay). Runs made from two threads at once are ordered where their callers hold `turn` from
        `order` until the run is on its stream (CudaRunner does). What it does not cover: a last stream
        the caller has since destroyed (torch's streams are never destroyed; an external one may be)."""
        cu, doing = self.res.cu, "ordering a run after another"
        check(cu.cuEventRecord(self._handover, driver.as_stream(last)), doing)
        check(cu.cuStreamWaitEvent(driver.as_stream(stream), self._handover, 0), doing)

    def resolve_some(self, addresses: Mapping[str, int]) -> list[int]:
        """The addresses given, in the order of `buffers`; 0 for the others (for `weights_changed`)."""
        return [addresses.get(name, 0) for name in self.buffers]

    def weights_changed(self, at: list[int], stream: int) -> None:
        """Remakes what the GEMMs on tensor cores make of the weights (W's copies, the warpgroup GEMMs'
        images of W) from the weights (addresses in the order of `buffers`: those of the weights and of
        `images` are read), on `stream`."""
        if self._image_calls.names:
            self._image_calls.run(at, stream)

    def close(self) -> None:
        self._forget_kept()  # (before the kernels its graphs launch)
        self.res.close()
        cu = self.res.cu
        captures = [] if self._capture_stream is None else [self._capture_stream]
        for stream in [*self.side_streams, *captures]:
            check(cu.cuStreamDestroy(stream), "destroying a stream")
        for event in (*self.events, self._handover):
            check(cu.cuEventDestroy(event), "destroying an event")


def _flat(instructions: Sequence[Instruction]):
    for instr in instructions:
        yield from (instr.body if isinstance(instr, Loop) else (instr,))
