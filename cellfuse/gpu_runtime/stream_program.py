"""A lowered program (a forward pass, or the backward pass of one) put on a caller's stream over the
caller's memory: the addresses of the buffers are given at every run, not fixed when the program is made.

This is how a PyTorch module runs CellFuse's kernels inside PyTorch's own tensors, on
torch.cuda.current_stream(), so that its work joins a CUDA graph that PyTorch captures, and its memory
comes from PyTorch's allocator. The caller (cellfuse.nn) owns every byte; the program owns only what does
not change from run to run: the loaded kernels, a cuBLAS handle and workspace per stream, the streams
beside the caller's (forked from it and joined back to it by the program's own events) and the tables
of arguments of its launches.

    program = StreamProgram(plan, lower(plan).instructions, kernels, arch)
    at = program.resolve({"x": x_ptr, "init.h": ..., ...})  # every buffer of `program.buffers`
    program.run(at, stream_handle)

The GEMMs run as the Plan's routes say: float32 through cuBLAS; on tensor cores, 3xTF32, as split copies
and cuBLAS's TF32 GEMM over 3K, or as the warpgroup GEMM where it is usable and measured faster for the
shape (`route_choice`, once per shape and process). The split copies need scratch memory (`scratch`,
bytes per name, to be given with the buffers); a warpgroup GEMM of a weight reads W's image, made by
`weights_changed` into memory the caller gives under `image_name(w)` (see `images`).

No call of `run` waits for the GPU or allocates: everything that does (compiling, loading, measuring)
happens when the program is made, so a program must be made before a CUDA graph capture begins.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..codegen.cuda_wgmma import SMEM_BYTES, SOURCE, THREADS, gemm_grid
from ..codegen.gemm_routes import split_threads, tf32x3_layout
from ..codegen.kernel_abi import BLOCK, kernel_params
from ..codegen.kernel_set import KernelSet
from ..codegen.lowering import Copy, Gemm, Instruction, Kernel, Loop, Persistent, Record, Wait, element_offset
from ..codegen.persistent_cuda import persistent_buffers
from ..codegen.plan import Plan
from ..graph_model import CellError
from . import driver
from .driver import CooperativeLaunch, EarlyLaunch, Launch, check
from .kernel_cache import cubin
from .wgmma_gemms import Operands, usable

# CELLFUSE_CHECK_LAUNCHES=1: every launch waited for and checked, so that a kernel that faults is named
# (as CUDA_LAUNCH_BLOCKING does for torch's own); slow, for finding faults.
CHECK_LAUNCHES = os.environ.get("CELLFUSE_CHECK_LAUNCHES", "") not in ("", "0")
CUBLAS_WORKSPACE = 8 * 2**20  # bytes per stream's cuBLAS handle
_R_32F, _COMPUTE_32F_FAST_TF32, _GEMM_DEFAULT = 0, 77, -1  # cudaDataType, cublasComputeType_t, algo
_TIMED_RUNS = 5


def split_name(stream: int) -> str:
    return f"split:{stream}"


def image_name(w: str, transposed: bool) -> str:
    """The name of W's image for the warpgroup GEMM (one per layout W is read in)."""
    return f"image:{w}:{'T' if transposed else 'N'}"


_loaded: dict[tuple, driver.Module] = {}  # (device ordinal, what, source) -> its module, for the process
_route_choice: dict[tuple, str] = {}  # (device ordinal, shape) -> "wgmma" or "copies", for the process


def _module(what: str, source: str, arch: str) -> driver.Module:
    """A module compiled for `arch` (or found in the kernel cache), loaded into the current context once
    per device."""
    key = (driver.current_device(), what, source)
    if key not in _loaded:
        _loaded[key] = driver.Module(cubin(source, arch), what)
    return _loaded[key]


@dataclass(frozen=True)
class _Pointer:
    """Argument `arg` of a launch is buffer `slot`'s address plus `offset` bytes."""

    arg: int
    slot: int
    offset: int


class _KernelCall:
    def __init__(self, launch: Launch, pointers: list[_Pointer], stream: int):
        self.launch, self.pointers, self.stream = launch, pointers, stream

    def __call__(self, at: list[int], streams: list, bound: bool = False) -> None:
        if not bound:
            values = self.launch.values
            for p in self.pointers:
                values[p.arg] = at[p.slot] + p.offset
        self.launch(streams[self.stream])


# A launch, given the buffers' addresses, the streams, and whether the addresses are those of the call
# before (a kernel's table of arguments then holds them already).
Call = Callable[[list[int], list, bool], None]


class _Resources:
    """What a program's calls share and keep: the loaded kernels, a cuBLAS handle per stream (each with
    its workspace), alpha and beta."""

    def __init__(self, kernels: KernelSet, arch: str, capability: tuple[int, int], streams: int, what: str):
        from nvmath.bindings import cublas

        self.cu, self.cublas = driver.bindings(), cublas
        self.capability = capability
        self.module = _module(what, kernels.module_source(), arch)
        self.name_of = kernels.name_of
        self.functions: dict[str, object] = {}
        self.workspaces = [check(self.cu.cuMemAlloc(CUBLAS_WORKSPACE), "allocating cuBLAS's workspace")
                           for _ in range(streams)]
        self.handles = []
        for workspace in self.workspaces:
            handle = cublas.create()
            cublas.set_workspace(handle, int(workspace), CUBLAS_WORKSPACE)
            self.handles.append(handle)
        self.scalars = np.array([1.0, 0.0], np.float32)  # cuBLAS reads them when the GEMM is put on a stream

    def function(self, name: str):
        if name not in self.functions:
            self.functions[name] = self.module.function(name)
        return self.functions[name]

    def wgmma_functions(self):
        module = _module("the warpgroup GEMM", SOURCE, "sm_90a")
        return module.function("cf_wgmma_image"), module.function("cf_wgmma_gemm")

    def close(self) -> None:
        for handle in self.handles:
            self.cublas.destroy(handle)
        for workspace in self.workspaces:
            check(self.cu.cuMemFree(workspace), "freeing cuBLAS's workspace")


class _Calls:
    """The calls of instructions as they are built: the buffers they address (by slot), the scratch the
    split copies need, and the images of weights that the warpgroup GEMMs read."""

    def __init__(self, res: _Resources, plan: Plan, sm_count: int, events: list):
        self.res, self.plan, self.sm_count, self.events = res, plan, sm_count, events
        self.buffers: dict[str, int] = {}  # buffer name -> slot
        self.scratch: dict[str, int] = {}  # name -> bytes
        self.images: dict[str, int] = {}  # image_name(w) -> bytes
        self.image_calls: dict[str, Call] = {}
        self.calls: list[Call] = []
        self.names: list[str] = []  # what each call runs, for errors

    def _append(self, call: Call, name: str) -> None:
        self.calls.append(call)
        self.names.append(name)

    def _slot(self, name: str) -> int:
        return self.buffers.setdefault(name, len(self.buffers))

    def _kernel(self, name: str, grid, block: int, args: list, stream: int, smem: int = 0,
                kind: type[Launch] = Launch, function=None) -> _KernelCall:
        """A call of a kernel whose arguments are (buffer, byte offset) pointers or ints."""
        values = [a if isinstance(a, int) else 0 for a in args]
        launch = kind(function or self.res.function(name), name, grid if isinstance(grid, tuple) else (grid,),
                      block, values, smem)
        pointers = [_Pointer(i, self._slot(a[0]), a[1]) for i, a in enumerate(args) if not isinstance(a, int)]
        return _KernelCall(launch, pointers, stream)

    def add(self, instr: Instruction, t: int) -> None:
        B = self.plan.sizes.batch
        cu = self.res.cu
        match instr:
            case Gemm():
                self._gemm(instr, t)
            case Kernel(launch=k, rows=rows, stream=s):
                args = [(p.access.buffer, p.access.dtype.itemsize * element_offset(instr, p.access, t, B))
                        for p in kernel_params(k)]
                name = self.res.name_of[k]
                self._append(self._kernel(name, _grid(rows * k.width), BLOCK, [*args, rows], s), name)
            case Copy(src=src, dst=dst, width=width, step=step, stream=s):
                at = self.plan.sizes.seq if step is None else step
                assert src.dtype == dst.dtype, f"a copy from {src.buffer} to {dst.buffer} converts"
                nbytes = B * width * src.dtype.itemsize
                to = (self._slot(dst.buffer), dst.dtype.itemsize * dst.offset(at, B))
                fro = (self._slot(src.buffer), src.dtype.itemsize * src.offset(at, B))

                def copy(a: list[int], streams: list, bound: bool = False, to=to, fro=fro, nbytes=nbytes,
                         s=s) -> None:
                    check(cu.cuMemcpyDtoDAsync(a[to[0]] + to[1], a[fro[0]] + fro[1], nbytes, streams[s]),
                          "copying a state")
                self._append(copy, f"the copy of {src.buffer} to {dst.buffer}")
            case Record(event=e, stream=s):
                self._append(lambda a, streams, bound=False, event=self.events[e], s=s: check(
                    cu.cuEventRecord(event, streams[s]), "recording an event"), "an event")
            case Wait(event=e, stream=s):
                self._append(lambda a, streams, bound=False, event=self.events[e], s=s: check(
                    cu.cuStreamWaitEvent(streams[s], event, 0), "waiting for an event"), "a wait")
            case Loop(body=body):
                for step in instr.steps(self.plan.sizes.seq):
                    for inner in body:
                        self.add(inner, step)
            case Persistent(launch=p, stream=s):
                self._append(self._persistent(p, s), self.res.name_of[p])
            case _:
                raise TypeError(f"a stream program cannot run {instr!r}")

    def _persistent(self, p, s: int) -> _KernelCall:
        name = self.res.name_of[p]
        function = self.res.function(name)
        early = self.res.capability >= (9, 0)
        kind = CooperativeLaunch if p.cooperative else EarlyLaunch if early else Launch
        args = [self.plan.sizes.seq, self.plan.sizes.batch, *((b, 0) for b in persistent_buffers(p))]
        call = self._kernel(name, p.blocks, p.threads, args, s, p.smem_bytes, kind, function)
        if p.cooperative:
            per_sm = driver.resident_blocks(function, p.threads, p.smem_bytes)
            if per_sm * self.sm_count < p.blocks:
                raise CellError(f"the persistent kernel of {p.label} needs its {p.blocks} blocks resident at "
                                f"once, and this GPU holds {per_sm * self.sm_count} of them ({self.sm_count} "
                                f"SMs x {per_sm}, with {p.smem_bytes} bytes of shared memory each)")
        return call

    def _gemm(self, instr: Gemm, t: int) -> None:
        g, m, s = instr.launch, instr.rows, instr.stream
        B = self.plan.sizes.batch
        a = (g.a.buffer, g.a.dtype.itemsize * element_offset(instr, g.a, t, B))
        c = (g.c.buffer, g.c.dtype.itemsize * element_offset(instr, g.c, t, B))
        if g.bias:  # the bias rows first, then C accumulates A @ W onto them
            self._append(self._kernel("cf_bias_rows", _grid(m * g.n), BLOCK,
                                      [c, (g.bias, 0), m, g.n, g.c.ld], s), "cf_bias_rows")
        accumulate = bool(g.bias or g.accumulate)
        ldw = g.k if g.trans_w else g.n
        if instr.route == "float32":
            self._append(self._sgemm(g, m, a, c, ldw, accumulate, s), f"cuBLAS's SGEMM of {g.group}")
            return
        op = Operands(c[1], a[1], 0, 0, m, g.n, g.k, g.a.ld, ldw, g.c.ld, g.trans_w, accumulate)
        if (instr.route == "tf32x3-wgmma" and usable(self.res.capability, op)
                and route_choice(self.res, self.plan, g, op, a, c, s) == "wgmma"):
            self.wgmma(g, op, a, c, s)
        else:
            self.copies(g, m, a, c, accumulate, s)

    def _sgemm(self, g, m: int, a, c, ldw: int, accumulate: bool, s: int) -> Call:
        # Row-major C = op(A) @ op(W) is column-major C^T = op(W)^T @ op(A)^T: W goes first, and a
        # transposed operand (stored [N, K] or [K, M]) is cuBLAS's op T (1) with its own row length.
        sa, sw, sc = self._slot(a[0]), self._slot(g.w), self._slot(c[0])
        one = self.res.scalars.ctypes.data
        beta = one if accumulate else one + 4
        sgemm, handles = self.res.cublas.sgemm, self.res.handles
        tw, ta, n, k, lda, ldc = int(g.trans_w), int(g.trans_a), g.n, g.k, g.a.ld, g.c.ld

        def call(at: list[int], streams: list, bound: bool = False) -> None:
            sgemm(handles[s], tw, ta, n, m, k, one, at[sw], ldw, at[sa] + a[1], lda, beta, at[sc] + c[1], ldc)
        return call

    def copies(self, g, m: int, a, c, accumulate: bool, s: int) -> None:
        """3xTF32 as split copies: A's pieces (hi, hi, lo) and W's (hi, lo, hi) along K into the stream's
        scratch, then one TF32 GEMM over 3K (see tf32x3_layout)."""
        a_split, w_split, lda3, ldw3, w_at = (tuple(int(v) for v in e) if isinstance(e, tuple) else int(e)
                                              for e in tf32x3_layout(g, m, g.k))
        scratch = split_name(s)
        self.scratch[scratch] = max(self.scratch.get(scratch, 0), 4 * 3 * (m * g.k + g.k * g.n))
        for to, fro, (rows, cols, ld, layout, lo) in (((scratch, 0), a, a_split),
                                                      ((scratch, 4 * w_at), (g.w, 0), w_split)):
            self._append(self._kernel("cf_split_tf32x3", _grid(int(split_threads(rows, cols, layout))),
                                      BLOCK, [to, fro, rows, cols, ld, layout, lo], s), "cf_split_tf32x3")
        sp, sc = self._slot(scratch), self._slot(c[0])
        one = self.res.scalars.ctypes.data
        beta = one if accumulate else one + 4
        gemm_ex, handles = self.res.cublas.gemm_ex, self.res.handles
        tw, n, k3, ldc, w_off = int(g.trans_w), g.n, 3 * g.k, g.c.ld, 4 * w_at

        def gemm(at: list[int], streams: list, bound: bool = False) -> None:
            gemm_ex(handles[s], tw, 0, n, m, k3, one, at[sp] + w_off, _R_32F, ldw3, at[sp], _R_32F, lda3,
                    beta, at[sc] + c[1], _R_32F, ldc, _COMPUTE_32F_FAST_TF32, _GEMM_DEFAULT)
        self._append(gemm, f"cuBLAS's TF32 GEMM of {g.group}")

    def wgmma(self, g, op: Operands, a, c, s: int) -> None:
        """W's image, then the warpgroup GEMM: the image made by `weights_changed` where W is a weight the
        caller keeps an image of, else by every run into the stream's scratch."""
        image_fn, gemm_fn = self.res.wgmma_functions()
        weight = self.plan.buffers[g.w].role in ("weight", "stacked", "bias")
        pieces = (image_name(g.w, g.trans_w), 0) if weight else (split_name(s), 0)
        nbytes = 4 * 2 * g.n * g.k
        image = self._kernel("cf_wgmma_image", (g.n * g.k + 255) // 256, 256,
                             [pieces, (g.w, 0), g.n, g.k, op.ldw, int(g.trans_w)], s, function=image_fn)
        if weight:
            self.images[pieces[0]] = nbytes
            self.image_calls[pieces[0]] = image
        else:
            self.scratch[pieces[0]] = max(self.scratch.get(pieces[0], 0), nbytes)
            self._append(image, "cf_wgmma_image")
        self._append(self._kernel("cf_wgmma_gemm", gemm_grid(op.m, op.n), THREADS,
                                       [c, a, pieces, op.m, op.n, op.k, op.lda, op.ldc, int(op.accumulate)],
                                       s, SMEM_BYTES, function=gemm_fn), f"cf_wgmma_gemm of {g.group}")


def route_choice(res: _Resources, plan: Plan, g, op: Operands, a, c, s: int) -> str:
    """The faster route of a GEMM the warpgroup GEMM could run, timed once per shape and process on
    scratch memory as large as its operands (their values do not change the time)."""
    key = (driver.current_device(), op.m, op.n, op.k, op.lda, op.ldw, op.ldc, op.trans_w, op.accumulate)
    if key in _route_choice:
        return _route_choice[key]
    cu = res.cu
    routes = {}
    for route in ("copies", "wgmma"):
        calls = _Calls(res, plan, 0, [])
        calls.copies(g, op.m, a, c, op.accumulate, s) if route == "copies" else calls.wgmma(g, op, a, c, s)
        routes[route] = calls
    stream = driver.new_stream()
    names = {name for calls in routes.values() for name in (*calls.buffers, *calls.images)}
    w_rows = op.n if op.trans_w else op.k
    largest = 4 * max(op.m * op.lda + a[1] // 4, w_rows * op.ldw, op.m * op.ldc + c[1] // 4,
                      3 * (op.m * op.k + op.k * op.n))
    memory = {name: check(cu.cuMemAlloc(largest), "allocating scratch to time a GEMM") for name in names}
    try:
        for handle in res.handles:
            res.cublas.set_stream(handle, int(stream))
        streams = [stream] * (s + 1)
        times = {}
        for route, calls in routes.items():
            at = [int(memory[name]) for name in calls.buffers]
            for image in calls.image_calls.values():
                image(at, streams)
            def run(calls=calls, at=at) -> None:
                for call in calls.calls:
                    call(at, streams)
            times[route] = _median_ms(cu, run, stream)
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
                 capability: tuple[int, int], sm_count: int, what: str):
        self.plan, self.what = plan, what
        flat = list(_flat(instructions))
        streams = 1 + max((getattr(i, "stream", 0) for i in flat), default=0)
        events = 1 + max((i.event for i in flat if isinstance(i, (Record, Wait))), default=-1)
        self.res = _Resources(kernels, arch, capability, streams, what)
        self.side_streams = [driver.new_stream() for _ in range(streams - 1)]
        self.events = [driver.new_event() for _ in range(events)]
        calls = _Calls(self.res, plan, sm_count, self.events)
        for instr in instructions:
            calls.add(instr, 0)
        # after `add`, whose timing of GEMM routes points the handles at a stream of its own
        for handle, stream in zip(self.res.handles[1:], self.side_streams, strict=True):
            self.res.cublas.set_stream(handle, int(stream))
        self.calls, self.names, self.buffers = calls.calls, calls.names, calls.buffers
        self.scratch, self.images, self._image_calls = calls.scratch, calls.images, calls.image_calls
        self._main_stream: int | None = None  # the stream the first handle was last set to
        self._streams: list = []  # it and the side streams, as cuda.bindings takes them
        self._bound: list[int] | None = None  # the addresses the kernels' tables hold

    def resolve(self, addresses: Mapping[str, int]) -> list[int]:
        """The addresses in the order of `buffers`, or a CellError naming one not given."""
        try:
            return [addresses[name] for name in self.buffers]
        except KeyError as e:
            raise CellError(f"{self.what}: no memory given for buffer {e.args[0]!r}") from None

    def run(self, at: list[int], stream: int) -> None:
        """Puts the whole program on `stream` (a raw CUstream handle) over buffers at the addresses `at`
        (in the order of `buffers`; see `resolve`), its side streams forked from it and joined back to it
        by the program's events."""
        if stream != self._main_stream:
            self.res.cublas.set_stream(self.res.handles[0], stream)
            self._main_stream = stream
            self._streams = [driver.as_stream(stream), *self.side_streams]
        streams = self._streams
        if CHECK_LAUNCHES:
            self._run_checked(at, streams)
            return
        bound = at == self._bound  # the caching allocator often gives a call the memory of the one before
        for call in self.calls:
            call(at, streams, bound)
        self._bound = at

    def _run_checked(self, at: list[int], streams: list) -> None:
        """Each call waited for, so that a fault names the kernel that made it."""
        cu = self.res.cu
        for call, name in zip(self.calls, self.names, strict=True):
            call(at, streams, False)
            check(cu.cuCtxSynchronize(), f"running {name} ({self.what})")

    def resolve_some(self, addresses: Mapping[str, int]) -> list[int]:
        """The addresses given, in the order of `buffers`; 0 for the others (for `weights_changed`)."""
        return [addresses.get(name, 0) for name in self.buffers]

    def weights_changed(self, at: list[int], stream: int) -> None:
        """Remakes W's images for the warpgroup GEMMs from the weights (addresses in the order of
        `buffers`: those of the weights and images are read), on `stream`."""
        if not self._image_calls:
            return
        streams = [driver.as_stream(stream)] * (1 + len(self.side_streams))
        for call in self._image_calls.values():
            call(at, streams, False)

    def close(self) -> None:
        self.res.close()
        cu = self.res.cu
        for stream in self.side_streams:
            check(cu.cuStreamDestroy(stream), "destroying a stream")
        for event in self.events:
            check(cu.cuEventDestroy(event), "destroying an event")


def _flat(instructions: Sequence[Instruction]):
    for instr in instructions:
        yield from (instr.body if isinstance(instr, Loop) else (instr,))


def _median_ms(cu, run: Callable[[], object], stream, runs: int = _TIMED_RUNS) -> float:
    start, end = (check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DEFAULT), "creating an event")
                  for _ in "se")
    try:
        run()  # warm
        times = []
        for _ in range(runs):
            check(cu.cuEventRecord(start, stream), "timing")
            run()
            check(cu.cuEventRecord(end, stream), "timing")
            check(cu.cuEventSynchronize(end), "timing")
            times.append(check(cu.cuEventElapsedTime(start, end), "timing"))
        return statistics.median(times)
    finally:
        check(cu.cuEventDestroy(start), "destroying an event")
        check(cu.cuEventDestroy(end), "destroying an event")


def _grid(n: int) -> int:
    return max(1, min((n + BLOCK - 1) // BLOCK, 65535))
