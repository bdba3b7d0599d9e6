"""Executes a Plan's lowered program on an NVIDIA GPU: PyCUDA kernels in the primary context, cuBLAS
through nvmath-python's bindings for the GEMMs, float32, on the streams the program names (hoisted work
beside the recurrence; in a wavefront, each layer on streams of its own); optionally the whole forward
pass captured once into a CUDA graph and replayed.

PyCUDA, nvmath and cuda.bindings are imported here only, and only when a GPU run is asked for.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import replace
from functools import lru_cache, partial

import numpy as np

from ..codegen import Plan, plan_kernels
from ..codegen.cuda_wgmma import row_ends
from ..codegen.dtypes import loaded, stored
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
    Copy,
    Gemm,
    Instruction,
    Kernel,
    Loop,
    Persistent,
    Record,
    Wait,
    element_offset,
    lower,
)
from ..codegen.persistent_cuda import persistent_buffers
from ..codegen.plan import PersistentLaunch, Target
from ..codegen.roofline import Peaks
from ..graph_model import CellError, Forward
from .driver import capture, check
from .f16x3_gemms import Shape, TensorCoreGemms, alignment
from .kernel_cache import cubin, fitted
from .wgmma_gemms import Operands, WgmmaGemms, usable

log = logging.getLogger(__name__)

ALIGNMENT = 256  # bytes: where each device buffer starts
_CUBLAS_WORKSPACE = 32 * 2**20


class GpuUnavailable(CellError):
    """The CUDA backend cannot run here; the message says what is missing and how to get it."""


@lru_cache(maxsize=1)
def gpu_modules():
    """(pycuda.driver, cublas, cuda.bindings.driver), or GpuUnavailable."""
    try:
        import pycuda.driver as drv
    except ImportError:
        raise GpuUnavailable("the CUDA backend needs PyCUDA and nvmath-python: install them with "
                             "\"pip install -e '.[gpu]'\" on a machine with an NVIDIA GPU and CUDA") from None
    try:
        import pycuda.autoprimaryctx  # noqa: F401  (makes the primary context current)
    except Exception as e:  # PyCUDA raises its own error types, without a common public base
        raise GpuUnavailable(f"no usable NVIDIA GPU: {e}") from None
    try:
        from nvmath.bindings import cublas
    except ImportError:
        raise GpuUnavailable("the CUDA backend needs nvmath-python for cuBLAS: "
                             "pip install nvmath-python") from None
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        cu = None  # CUDA graphs and the persistent kernels' launches need cuda.bindings; the others do not
    return drv, cublas, cu


def device_description() -> str:
    drv = gpu_modules()[0]
    dev = drv.Context.get_device()
    version = drv.get_driver_version()
    return f"{dev.name()} (driver CUDA {version // 1000}.{version % 1000 // 10})"


def _arch() -> str:
    major, minor = gpu_modules()[0].Context.get_device().compute_capability()
    return f"sm_{major}{minor}"


def _compile(source: str, arch: str | None = None) -> bytes:
    """The cubin of a module, for this GPU (or for `arch`, such as sm_90a's own instructions), from the
    kernel cache."""
    return cubin(source, arch or _arch())


def compiled_kernels(kernels: KernelSet) -> tuple[KernelSet, bytes]:
    """A plan's kernels as they are compiled for this GPU (see kernel_cache.fitted), and their cubin."""
    return fitted(kernels, _arch())


@lru_cache(maxsize=1)
def warpgroup_gemms() -> WgmmaGemms | None:
    """The warpgroup GEMM, compiled at its first use (for sm_90a); None where nvcc cannot build it (a CUDA
    toolkit before 12.0 has no sm_90a), which the log says once: the copies and cuBLAS then run every GEMM
    on tensor cores."""
    try:
        return WgmmaGemms(gpu_modules()[0], _compile)
    except CellError as e:
        log.warning("the warpgroup GEMM does not build here, so every GEMM on tensor cores goes through "
                    "cuBLAS: %s", e)
        return None


class CudaExecutor:
    """Device buffers for one plan (allocated once, reused by every run) and its program's launches."""

    def __init__(self, plan: Plan, params: dict[str, np.ndarray]):
        self.drv, self.cublas, self.cu = gpu_modules()
        drv = self.drv
        self.plan = plan
        self.program = lower(plan)
        t0 = time.perf_counter()
        kernels, cubin = compiled_kernels(plan_kernels(plan))
        self.compile_s = time.perf_counter() - t0
        self.funcs: dict = {}  # kernel name -> PyCUDA function
        self._prepared: dict = {}  # kernel name -> the function prepared for its arguments, at first use
        self.persistent: dict[str, _PersistentKernel] = {}  # persistent kernel name -> its launches
        self.name_of: dict = {}  # launch -> kernel name
        self._cu_modules: list = []  # modules loaded through the driver API, for the persistent kernels
        self.capability = drv.Context.get_device().compute_capability()
        module = self.add_kernels(kernels, cubin)
        self.bias_rows = module.get_function("cf_bias_rows").prepare("PPiii")
        # gemm_splits.cuh's kernels of the GEMMs on tensor cores (gemm_routes.f16x3_steps), by name
        self.f16x3_kernels = {name: module.get_function(name).prepare(types) for name, types in (
            ("cf_f16x3_row_maxima", "PPPiii"), ("cf_f16x3_maxima", "PPPiii"),
            ("cf_split_f16x3_copies", "PPPPPPiiiii"), ("cf_f16x3_unscale_sums", "PPPPPPPiiiii"))}

        self.weights = {name for name, b in plan.buffers.items() if b.is_weight}
        sizes = {name: b.nbytes(plan.sizes) for name, b in plan.buffers.items()}
        # (the forward pass keeps what its GEMMs make of every weight: `image_bytes`)
        splits = split_bytes(self.program.instructions, self.program.streams, self.weights)
        images = image_bytes(self.program.instructions, self.weights, self.capability == (9, 0))
        offsets, span = aligned_offsets([*sizes.values(), *splits, *images.values()])
        free, _ = drv.mem_get_info()
        need = span + self.program.streams * _CUBLAS_WORKSPACE
        if need > free:
            raise CellError(f"out of GPU memory: these sizes need {need / 2**20:.0f} MiB, "
                            f"{free / 2**20:.0f} MiB are free")
        self.memory = drv.mem_alloc(span)
        at = [int(self.memory) + offset for offset in offsets]
        self.addr: dict[str, int] = dict(zip(sizes, at[:len(sizes)], strict=True))
        # per stream, the workspace of its GEMMs on tensor cores (see f16x3_layout)
        self.splits = at[len(sizes):len(sizes) + len(splits)]
        # per GEMM of the weights on tensor cores and route, where the forward pass keeps what it makes of W
        # (the copies' W region, the warpgroup GEMM's image)
        self.image_at = dict(zip(images, at[len(sizes) + len(splits):], strict=True))
        for name, arr in plan.weight_arrays(params, np.float32).items():
            drv.memcpy_htod(self.addr[name], stored(plan.buffers[name].dtype, arr))
        # (a copy from pageable memory may return before it lands, on the legacy default stream, which the
        # non-blocking streams below, where W's images are made from these weights, do not wait for)
        drv.Context.synchronize()

        # Non-blocking (capturable) streams, the first layer's recurrence on the first; each with its own
        # cuBLAS handle and workspace (two GEMMs running at once must not share a workspace). Where the
        # program's layers run side by side, its GEMMs go through a second handle per stream, for which
        # cuBLAS picks its kernels for their share of the SMs; a backward pass (one layer at a time, on
        # the first stream) uses the first, for all of them. The two handles of a stream share its
        # workspace: the stream runs one GEMM at a time.
        self.streams = [drv.Stream(flags=1) for _ in range(self.program.streams)]
        self.stream = self.streams[0]
        self.workspaces = [drv.mem_alloc(_CUBLAS_WORKSPACE) for _ in self.streams]
        self._on_handle: dict[int, tuple[object, int, int]] = {}  # handle -> its stream, workspace, SMs
        self.f16x3_gemms = TensorCoreGemms(drv, device_description(), _CUBLAS_WORKSPACE)
        pairs = list(zip(self.streams, self.workspaces, strict=True))
        self.handles = [self._handle(stream, workspace) for stream, workspace in pairs]
        self.forward_handles = self.handles
        if self.program.sharing > 1:
            share = max(1, device_target().sm_count // self.program.sharing)
            self.forward_handles = [self._handle(stream, workspace, share) for stream, workspace in pairs]
        self._scalars = np.array([1.0, 0.0], np.float32)  # alpha and beta live here for cuBLAS
        self.events = [drv.Event(drv.event_flags.DISABLE_TIMING) for _ in range(self.program.events)]
        self.graph_exec = None
        self._cs = self.cu.CUstream(self.stream.handle) if self.cu is not None else None  # for graphs
        # Every launch of a forward pass with its addresses resolved once; `enqueue` only calls them. What
        # its GEMMs on tensor cores make of the weights (W's copies, the warpgroup GEMM's image of W) is
        # made apart, when the weights are written (see `weights_changed`): on an H100 that made IndRNN's
        # forward at B=64 faster (docs/results/2026-11-27-persistent-rungs-changes-14-to-19.md, change 19).
        self.image_calls: dict[tuple, list[Callable[[], object]]] = {}
        self.calls = [call for instr in self.program.instructions
                      for call in self._calls(instr, 0, self.forward_handles, images=self.image_calls)]
        self.weights_changed()

    def _handle(self, stream, workspace, sms: int | None = None) -> int:
        """A cuBLAS handle on the stream, with the workspace, picking its kernels for `sms` SMs where
        given (for all of them otherwise); the fp16 GEMMs through it go to `f16x3_gemms` with the same."""
        handle = self.cublas.create()
        self.cublas.set_stream(handle, stream.handle)
        self.cublas.set_workspace(handle, int(workspace), _CUBLAS_WORKSPACE)
        if sms is not None:
            self.cublas.set_sm_count_target(handle, sms)
        self._on_handle[handle] = (stream, int(workspace), sms or 0)
        return handle

    def add_kernels(self, kernels: KernelSet, cubin: bytes):
        """Makes a compiled module of kernels launchable by `_calls` (the executor's own, or a backward
        pass's): its plain kernels through PyCUDA, its persistent ones a second time through the driver
        API, whose launches they need (see _PersistentKernel). Returns the PyCUDA module."""
        module = self.drv.module_from_buffer(cubin)
        persistent = {name for launch, name in kernels.name_of.items()
                      if isinstance(launch, PersistentLaunch)}
        self.funcs.update({name: module.get_function(name) for name in kernels.sources
                           if name not in persistent})
        if persistent:
            cu_module, functions = _persistent_functions(self.cu, cubin, kernels, self.capability >= (9, 0))
            self._cu_modules.append(cu_module)
            self.persistent.update(functions)
        self.name_of.update(kernels.name_of)
        return module

    def _ptr(self, instr: Gemm | Kernel, acc, t: int) -> int:
        return self.addr[acc.buffer] + acc.dtype.itemsize * element_offset(instr, acc, t,
                                                                          self.plan.sizes.batch)

    def _copies(self, g, op: Operands, s: int, handles: list[int], kept: tuple[int, list] | None = None,
                w_made_at: int | None = None) -> list[Callable[[], object]]:
        """A GEMM on tensor cores as three fp16 products, its workspace at `op.pieces`: the calls of
        gemm_routes.f16x3_steps, its fp16 GEMM by cuBLASLt's algorithm measured fastest for the shape.
        Where `kept` is given (an address, a list), W's region is there and the calls that make it go into
        the list (on the executor's stream, for `weights_changed`), not among those returned; where
        `w_made_at` is (the instruction's, see lowering.w_regions_shared), the GEMM before made it there
        in the workspace."""
        stream, workspace, sms = self._on_handle[handles[s]]
        lay = f16x3_layout(g, op.m, g.k)
        at = int(lay.kept_at) if w_made_at is None else w_made_at
        where = {"a": op.x, "w": op.w, "c": op.c, "bias": op.bias, "workspace": op.pieces,
                 "kept": kept[0] if kept else op.pieces + at}

        def value(arg) -> int:
            return where[arg.of] + int(arg.offset) if isinstance(arg, Ref) else int(arg)

        out: list[Callable[[], object]] = []
        for step in f16x3_steps(g, op.m, g.k):
            args = [value(a) for a in step.args]
            if kept and step.of_w:
                kept[1].append(self._f16x3_kernel(step, args, self.stream))
            elif step.of_w and w_made_at is not None:
                continue
            elif step.kind in ("zero", "kernel"):
                out.append(self._f16x3_kernel(step, args, stream))
            else:
                split_w, ldw3, split_a, lda3, sums, ldd, scalars = args
                shape = Shape(g.trans_w, g.n, op.m, 3 * g.k, ldw3, lda3, ldd, sms,
                              (alignment(split_w), alignment(split_a), alignment(sums)))
                chosen = self.f16x3_gemms.chosen(shape, stream, workspace)  # measured now, not while captured
                out.append(partial(self.f16x3_gemms.call, chosen, stream, workspace, scalars, split_w,
                                   split_a, scalars + 4, sums))
        return out

    def _f16x3_kernel(self, step, args: list[int], stream) -> Callable[[], object]:
        """The call of a "zero" or "kernel" step of gemm_routes.f16x3_steps, its arguments resolved."""
        if step.kind == "zero":
            return partial(self.drv.memset_d32_async, args[0], 0, args[1], stream)
        return partial(self.f16x3_kernels[step.name].prepared_async_call, (grid_blocks(int(step.threads)), 1),
                       (BLOCK, 1, 1), stream, *args)

    def _route(self, g, op: Operands, s: int, handles: list[int], kept: bool) -> str:
        """Which route runs a GEMM on tensor cores that the warpgroup GEMM could run: the one measured
        faster for its shape, once per process (on scratch memory as large as its operands, so that no
        buffer of the executor changes; a shape already measured costs nothing more). Where the forward
        pass keeps what each route makes of W (`kept`), that is made once before the timing and not
        timed, as the stream programs time it."""
        gemms = warpgroup_gemms()
        stream, _, sms = self._on_handle[handles[s]]
        key = (device_description(), op.m, op.n, op.k, op.lda, op.ldw, op.ldc, op.trans_w, op.accumulate, sms,
               kept)
        if key not in gemms.chosen:
            w_rows = op.n if op.trans_w else op.k
            offsets, span = aligned_offsets([4 * op.m * op.lda, 4 * w_rows * op.ldw, 4 * op.m * op.ldc,
                                             workspace_bytes(g, op.m, "f16x3-or-wgmma"),
                                             int(f16x3_layout(g, op.m, g.k).kept_bytes), 4 * 2 * g.n * g.k])
            scratch = self.drv.mem_alloc(span)
            try:
                # zeroed (see stream_program.route_choice), before anything on the executor's streams,
                # which do not wait for the legacy stream
                self.drv.memset_d32(scratch, 0, span // 4)
                self.drv.Context.synchronize()
                x, w, c, pieces, region, image = (int(scratch) + offset for offset in offsets)
                on = replace(op, c=c, x=x, w=w, pieces=pieces, lengths=0)  # (timed as if every row ran)
                if kept:
                    made: list[Callable[[], object]] = []
                    copies = self._copies(g, on, s, handles, (region, made))
                    imaged = replace(on, pieces=image)
                    for call in [*made, gemms.image_call(imaged, stream)]:
                        call()
                    self.stream.synchronize()  # (W's copies were made on it)
                    routes = {"copies": copies, "wgmma": [gemms.gemm_call(imaged, stream)]}
                else:
                    routes = {"copies": self._copies(g, on, s, handles), "wgmma": gemms.calls(on, stream)}
                gemms.chosen[key] = gemms.faster(routes, stream)
            finally:
                stream.synchronize()
                scratch.free()
        return gemms.chosen[key]

    def _calls(self, instr: Instruction, t: int, handles: list[int] | None = None,
               splits: list[int] | None = None,
               images: dict[tuple, list[Callable[[], object]]] | None = None) -> list[Callable[[], object]]:
        """The calls that put one instruction at step t on its stream, its GEMMs through `handles` (per
        stream; the executor's own by default), those on tensor cores splitting their operands into
        `splits` (per stream, as `split_bytes` counts them; the executor's own by default). Where
        `images` is given, a GEMM on tensor cores of the weights reads what it makes of W (W's copies, or
        the warpgroup GEMM's image of W) where `image_at` keeps it, and the calls that make it go into
        `images` (once per weight, layout and route) instead of before the GEMM."""
        handles = handles or self.handles
        splits = splits or self.splits
        B = self.plan.sizes.batch
        match instr:
            case Gemm(launch=g, rows=m, route=route, stream=s, w_made_at=w_made_at):
                one, zero = self._scalars.ctypes.data, self._scalars.ctypes.data + 4
                c = self._ptr(instr, g.c, t)
                a = self._ptr(instr, g.a, t)
                # (on tensor cores the bias is added after the GEMM; cuBLAS's float32 and 16-bit GEMMs
                # accumulate onto its rows)
                out: list[Callable[[], object]] = []
                if g.bias and route in ("float32", "16-bit"):
                    out.append(partial(self.bias_rows.prepared_async_call, (grid_blocks(m * g.n), 1),
                                       (BLOCK, 1, 1), self.streams[s], c, self.addr[g.bias], m, g.n, g.c.ld))
                beta = one if g.bias or g.accumulate else zero
                # Row-major C = op(A) @ op(W) is column-major C^T = op(W)^T @ op(A)^T: W goes first, and a
                # transposed operand (stored [N, K] or [K, M]) is cuBLAS's op T (1) with its own row length.
                ldw = g.k if g.trans_w else g.n
                if route == "float32":
                    out.append(partial(self.cublas.sgemm, handles[s], int(g.trans_w), int(g.trans_a), g.n, m,
                                       g.k, one, self.addr[g.w], ldw, a, g.a.ld, beta, c, g.c.ld))
                    return out
                if route == "16-bit":
                    (w_type, a_type, c_type), compute = gemm_ex_types(g)
                    out.append(partial(self.cublas.gemm_ex, handles[s], int(g.trans_w), int(g.trans_a), g.n,
                                       m, g.k, one, self.addr[g.w], w_type, ldw, a, a_type, g.a.ld, beta, c,
                                       c_type, g.c.ld, compute, GEMM_DEFAULT_ALGO))
                    return out
                ends = row_ends(self.plan, g, m, instr.steps)
                op = Operands(c, a, self.addr[g.w], splits[s], m, g.n, g.k, g.a.ld, ldw, g.c.ld, g.trans_w,
                              bool(g.accumulate), self.addr[g.bias] if g.bias else 0,
                              *((self.addr[ends.lengths], ends.width, ends.batch, ends.first_step) if ends
                                else ()))
                wgmma = (route == "f16x3-or-wgmma" and usable(self.capability, op)
                         and warpgroup_gemms() is not None)
                copies_key = (image_key(g), "copies")
                kept = images is not None and copies_key in self.image_at
                if wgmma and self._route(g, op, s, handles, kept) == "wgmma":
                    gemms, key = warpgroup_gemms(), (image_key(g), "wgmma")
                    if images is None or key not in self.image_at:  # W's image made by every run
                        return gemms.calls(op, self.streams[s])
                    op = replace(op, pieces=self.image_at[key])
                    images.setdefault(key, [gemms.image_call(op, self.stream)])
                    return [gemms.gemm_call(op, self.streams[s])]
                if not kept:  # W's copies made by every run (or by the GEMM before, see w_made_at)
                    return self._copies(g, op, s, handles, w_made_at=w_made_at)
                made: list[Callable[[], object]] = []
                calls = self._copies(g, op, s, handles, (self.image_at[copies_key], made))
                images.setdefault(copies_key, made)
                return calls
            case Kernel(launch=k, rows=rows, stream=s):
                name = self.name_of[k]
                params = kernel_params(k)
                if self._prepared.get(name) is None:
                    self._prepared[name] = self.funcs[name].prepare("P" * len(params) + "i")
                args = [self._ptr(instr, p.access, t) for p in params] + [rows]
                return [partial(self._prepared[name].prepared_async_call, (grid_blocks(rows * k.width), 1),
                                (BLOCK, 1, 1), self.streams[s], *args)]
            case Copy(src=src, dst=dst, width=width, step=step, stream=s):
                at = self.plan.sizes.seq if step is None else step
                assert src.dtype == dst.dtype, f"a copy from {src.buffer} to {dst.buffer} converts"
                to, fro = (self.addr[a.buffer] + a.dtype.itemsize * a.offset(at, B) for a in (dst, src))
                return [partial(self.drv.memcpy_dtod_async, to, fro, B * width * src.dtype.itemsize,
                                self.streams[s])]
            case Record(event=e, stream=s):
                return [partial(self.events[e].record, self.streams[s])]
            case Wait(event=e, stream=s):
                return [partial(self.streams[s].wait_for_event, self.events[e])]
            case Loop(body=body):
                return [call for step in instr.steps(self.plan.sizes.seq) for inner in body
                        for call in self._calls(inner, step, handles, splits, images)]
            case Persistent(launch=p, stream=s):
                kernel = self.persistent[self.name_of[p]]
                pointers = [self.addr[b] for b in persistent_buffers(p)]
                return [kernel.call(p, [self.plan.sizes.seq, B], pointers, self.streams[s])]
            case _:
                raise TypeError(f"the CUDA executor cannot run {instr!r}")

    def weights_changed(self) -> None:
        """Remakes, on the stream, what the forward pass keeps of the weights from run to run (W's copies
        of its GEMMs on tensor cores, the images of W that its warpgroup GEMMs read): to be called once the
        weights' buffers are written, before the next forward pass; the executor calls it for the weights
        it is made with."""
        for calls in self.image_calls.values():
            for call in calls:
                call()

    def enqueue(self) -> None:
        """Puts one whole forward pass on the streams."""
        for call in self.calls:
            call()

    def capture(self, calls: list[Callable[[], object]]):
        """The calls (launches on the executor's streams, which end joined to the first) captured once
        into a CUDA graph, instantiated for `replay`."""
        if self.cu is None:
            raise GpuUnavailable("CUDA graphs need NVIDIA's cuda-python (cuda.bindings): "
                                 "pip install cuda-python")

        def put() -> None:
            for call in calls:
                call()

        return capture(self._cs, put, "capturing a forward pass")

    def replay(self, graph_exec) -> None:
        check(self.cu.cuGraphLaunch(graph_exec, self._cs))

    def release(self, graph_exec) -> None:
        check(self.cu.cuGraphExecDestroy(graph_exec))

    def capture_graph(self) -> None:
        """Captures one forward pass into a CUDA graph, replayed by `forward`."""
        self.graph_exec = self.capture(self.calls)

    def forward(self) -> None:
        """One forward pass on the stream: the graph replayed if one was captured, else direct launches."""
        if self.graph_exec is not None:
            self.replay(self.graph_exec)
        else:
            self.enqueue()

    # -- data in and out ------------------------------------------------------------------------
    def load(self, x: np.ndarray, initial: dict[str, np.ndarray]) -> None:
        """Uploads x and the initial states; every other buffer is poisoned with NaN."""
        drv, buffers = self.drv, self.plan.buffers
        for name, b in buffers.items():
            if name not in self.weights:
                memset = drv.memset_d32 if b.dtype.itemsize == 4 else drv.memset_d16
                memset(self.addr[name], b.dtype.nan_bits, self.plan.buffer_elements(name))
        drv.memcpy_htod(self.addr["x"], stored(buffers["x"].dtype, x))
        for s in self.plan.state_ids:
            drv.memcpy_htod(self.addr[f"init.{s}"], stored(buffers[f"init.{s}"].dtype, initial[s]))
        # These ran on the legacy default stream, which the non-blocking streams do not wait for.
        drv.Context.synchronize()

    def results(self) -> Forward:
        plan, drv = self.plan, self.drv
        T, B, H, L = plan.sizes.seq, plan.sizes.batch, plan.sizes.hidden, plan.sizes.layers
        self.stream.synchronize()

        def read(name: str, shape: tuple[int, ...], skip: int = 0) -> np.ndarray:
            """The buffer's elements after the first `skip`, as float32 values."""
            dtype = plan.buffers[name].dtype
            memory = np.empty(shape, dtype.numpy)
            drv.memcpy_dtoh(memory, self.addr[name] + skip * dtype.itemsize)
            return loaded(dtype, memory)

        y = read(plan.layers[-1].output_seq, (T, B, H), B * H)
        return Forward(y, {s: read(f"final.{s}", (L, B, H)) for s in plan.state_ids})

    def run(self, x: np.ndarray, initial: dict[str, np.ndarray]) -> Forward:
        self.load(x, initial)
        if self.plan.cuda_graph and self.graph_exec is None:
            self.capture_graph()
        self.forward()
        return self.results()

    def close(self) -> None:
        if self.graph_exec is not None:
            self.release(self.graph_exec)
        for handle in dict.fromkeys([*self.handles, *self.forward_handles]):
            self.cublas.destroy(handle)
        self.f16x3_gemms.close()
        for workspace in self.workspaces:
            workspace.free()
        for cu_module in self._cu_modules:
            check(self.cu.cuModuleUnload(cu_module))
        self.memory.free()


def aligned_offsets(nbytes: list[int]) -> tuple[list[int], int]:
    """Where arrays of these numbers of bytes go, one after another, each from a multiple of ALIGNMENT
    bytes (cuBLAS's fastest kernels want their operands there), and the bytes they span."""
    offsets, end = [], 0
    for n in nbytes:
        offsets.append(end)
        end += -(-n // ALIGNMENT) * ALIGNMENT
    return offsets, end


def _tensor_core_gemms(instructions):
    """The program's GEMMs on tensor cores with float32's accuracy (those of a loop's body once each)."""
    for instr in instructions:
        for inner in instr.body if isinstance(instr, Loop) else (instr,):
            if isinstance(inner, Gemm) and inner.route.startswith("f16x3"):
                yield inner


def split_bytes(instructions, streams: int, kept: Collection[str] = ()) -> list[int]:
    """Per stream, the bytes of workspace its largest GEMM on tensor cores needs (gemm_routes.workspace_bytes;
    0 where none runs on tensor cores): one GEMM at a time per stream, so they share it. A GEMM whose W is
    among `kept` has what it makes of W kept elsewhere (made when the weights change)."""
    need = [0] * streams
    for gemm in _tensor_core_gemms(instructions):
        g = gemm.launch
        need[gemm.stream] = max(need[gemm.stream], workspace_bytes(g, gemm.rows, gemm.route, g.w in kept))
    return need


def image_key(g) -> tuple:
    """What W's image depends on: W's buffer and its layout (the GEMMs of a loop's steps share one)."""
    return g.w, g.n, g.k, g.trans_w


def image_bytes(instructions, weights: set[str], wgmma: bool) -> dict[tuple, int]:
    """What a forward pass keeps of its weights between runs, made when they change: per GEMM of the
    weights on tensor cores, by (`image_key`, route), the bytes of W's region of the split copies
    (gemm_routes.F16x3Layout: W's copies and largest magnitudes) and, where the warpgroup GEMM may run it
    (its route, and `wgmma`: this GPU has sm_90a's instructions), of W's image for it (hi and lo, 2 k n
    floats). Both where both may run: the route is measured per shape, and two GEMMs of one W may differ."""
    kept: dict[tuple, int] = {}
    for gemm in _tensor_core_gemms(instructions):
        g = gemm.launch
        if g.w not in weights:
            continue
        kept[(image_key(g), "copies")] = int(f16x3_layout(g, gemm.rows, g.k).kept_bytes)
        if wgmma and gemm.route == "f16x3-or-wgmma":
            kept[(image_key(g), "wgmma")] = 4 * 2 * g.n * g.k
    return kept


def device_peaks() -> Peaks | None:
    """This GPU's peak arithmetic and memory bandwidth (roofline.Peaks), or None where its attributes do
    not say them."""
    drv = gpu_modules()[0]
    dev = drv.Context.get_device()
    attr = drv.device_attribute
    try:
        clock, memory_clock, bus = (dev.get_attribute(getattr(attr, name)) for name in
                                    ("CLOCK_RATE", "MEMORY_CLOCK_RATE", "GLOBAL_MEMORY_BUS_WIDTH"))
    except (AttributeError, drv.Error):  # attributes a newer CUDA may no longer have
        return None
    return Peaks.of_device(dev.name(), dev.compute_capability(), dev.get_attribute(attr.MULTIPROCESSOR_COUNT),
                           clock, memory_clock, bus)


def device_target() -> Target:
    """This GPU's numbers for a persistent plan."""
    drv = gpu_modules()[0]
    dev = drv.Context.get_device()
    attr = drv.device_attribute
    return Target(dev.get_attribute(attr.MULTIPROCESSOR_COUNT),
                  dev.get_attribute(attr.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN))


class _PersistentKernel:
    """A persistent kernel, launched through the driver API (PyCUDA has neither launch it needs):
    cooperatively where its blocks wait for each other; otherwise as an ordinary kernel, with programmatic
    stream serialization where the GPU has it (`early`: compute capability 9.0 on), so that it starts
    while the kernel before it ends (the kernel waits for it at its top: see persistent_cuda.skeleton's
    PDL_WAIT)."""

    def __init__(self, cu, function, early: bool):
        self.cu, self.function, self.early = cu, function, early

    def call(self, launch: PersistentLaunch, ints: list[int], pointers: list[int],
             stream) -> Callable[[], object]:
        """The call that launches it: for a cooperative launch all blocks resident at once, or a CellError
        saying why not."""
        cu = self.cu
        check(cu.cuFuncSetAttribute(
            self.function, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            launch.smem_bytes))
        # The driver reads each argument through a pointer: the call holds the values and their table.
        values = [np.array([v], np.int32) for v in ints] + [np.array([p], np.uint64) for p in pointers]
        table = np.array([v.ctypes.data for v in values], np.uint64)
        if not launch.cooperative:
            return partial(self._launch_early, self._config(launch, stream), table, values)
        per_sm = check(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(self.function, launch.threads,
                                                                           launch.smem_bytes))
        target = device_target()
        if per_sm * target.sm_count < launch.blocks:
            raise CellError(f"the persistent kernel of {launch.label} needs its {launch.blocks} blocks "
                            f"resident at once, and this GPU holds {per_sm * target.sm_count} of them "
                            f"({target.sm_count} SMs x {per_sm}, with {launch.smem_bytes} bytes of shared "
                            "memory each); plan it for this GPU's target")
        return partial(self._launch, launch, cu.CUstream(stream.handle), table, values)

    def _config(self, launch: PersistentLaunch, stream):
        cu = self.cu
        config = cu.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = launch.blocks, 1, 1
        config.blockDimX, config.blockDimY, config.blockDimZ = launch.threads, 1, 1
        config.sharedMemBytes = launch.smem_bytes
        config.hStream = cu.CUstream(stream.handle)
        config.numAttrs = 0
        if self.early:
            early = cu.CUlaunchAttribute()
            early.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            early.value.programmaticStreamSerializationAllowed = 1
            config.attrs = [early]
            config.numAttrs = 1
        return config

    def _launch(self, launch: PersistentLaunch, stream, table: np.ndarray,
                values: list[np.ndarray]) -> None:
        del values  # held by the partial, so that the table's pointers stay valid
        check(self.cu.cuLaunchCooperativeKernel(self.function, launch.blocks, 1, 1, launch.threads, 1, 1,
                                                    launch.smem_bytes, stream, table.ctypes.data))

    def _launch_early(self, config, table: np.ndarray, values: list[np.ndarray]) -> None:
        del values  # (as in _launch)
        check(self.cu.cuLaunchKernelEx(config, self.function, table.ctypes.data, 0))


def _persistent_functions(cu, cubin: bytes, kernels,
                          early: bool) -> tuple[object, dict[str, _PersistentKernel]]:
    """The module loaded a second time, through the driver API (PyCUDA exposes no handle of its own
    module or functions, which the persistent kernels' launches need), and its persistent kernels (see
    _PersistentKernel for `early`)."""
    if cu is None:
        raise GpuUnavailable("the persistent schedule's launches need NVIDIA's cuda-python "
                             "(cuda.bindings): pip install cuda-python")
    module = check(cu.cuModuleLoadData(cubin))
    return module, {name: _PersistentKernel(cu, check(cu.cuModuleGetFunction(module, name.encode())),
                                            early)
                    for launch, name in kernels.name_of.items()
                    if isinstance(launch, PersistentLaunch)}
