"""Executes a Plan on an NVIDIA GPU: PyCUDA kernels in the primary context, cuBLAS through
nvmath-python's bindings for the GEMMs, one stream, float32; optionally the whole forward pass
captured once into a CUDA graph and replayed.

PyCUDA, nvmath and cuda.bindings are imported here only, and only when a GPU run is asked for.
"""

from __future__ import annotations

import logging
import re
import time
from functools import lru_cache

import numpy as np

from ..codegen import GemmLaunch, KernelLaunch, Plan, plan_kernels
from ..codegen.cuda_kernels import BLOCK, kernel_params
from ..graph_model import CellError, Forward

log = logging.getLogger(__name__)

_NAN_BITS = 0x7FC00000  # a float32 quiet NaN, to poison buffers before a checked run
_CUBLAS_WORKSPACE = 32 * 2**20
MAIN, SIDE = 0, 1  # the streams: the recurrence, and the hoisted launches beside it


class GpuUnavailable(CellError):
    """The CUDA backend cannot run here; the message says what is missing and how to get it."""


@lru_cache(maxsize=1)
def gpu_modules():
    """(pycuda.driver, SourceModule, cublas, cuda.bindings.driver), or GpuUnavailable."""
    try:
        import pycuda.driver as drv
        from pycuda.compiler import SourceModule
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
        cu = None  # CUDA graphs need cuda.bindings; direct launches do not
    return drv, SourceModule, cublas, cu


def device_description() -> str:
    drv = gpu_modules()[0]
    dev = drv.Context.get_device()
    version = drv.get_driver_version()
    return f"{dev.name()} (driver CUDA {version // 1000}.{version % 1000 // 10})"


@lru_cache(maxsize=64)
def _compile(source: str):
    drv, SourceModule, _, _ = gpu_modules()
    major, minor = drv.Context.get_device().compute_capability()
    try:
        return SourceModule(source, no_extern_c=True, arch=f"sm_{major}{minor}", options=["-O3"])
    except drv.CompileError as e:
        raise CellError("nvcc could not compile the generated kernels:\n"
                        + compile_error_lines(e.stderr or str(e), source)) from None
    except OSError as e:
        raise CellError(f"nvcc could not be run ({e}); is the CUDA toolkit on the PATH?") from None


def compile_error_lines(stderr: str, source: str) -> str:
    """nvcc's errors, each followed by the generated line it points at; nvcc's whole output if it names
    no line."""
    lines = source.split("\n")
    found = []
    for m in re.finditer(r"\((\d+)\): (?:catastrophic )?error: (.*)", stderr):
        number = int(m.group(1))
        text = lines[number - 1].strip() if 0 < number <= len(lines) else "(beyond the end of the source)"
        found.append(f"line {number}: {m.group(2).strip()}\n    {text}")
    return "\n".join(found) if found else stderr.strip()


def _cu_check(result):
    """cuda.bindings calls return (error, *values)."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise CellError(f"CUDA driver error {err}")
    return values[0] if len(values) == 1 else values


class CudaExecutor:
    """Device buffers for one plan (allocated once, reused by every run) and its launches."""

    def __init__(self, plan: Plan, params: dict[str, np.ndarray]):
        self.drv, _, self.cublas, self.cu = gpu_modules()
        drv = self.drv
        self.plan = plan
        t0 = time.perf_counter()
        kernels = plan_kernels(plan)
        module = _compile(kernels.module_source())
        self.compile_s = time.perf_counter() - t0
        self.funcs = {name: module.get_function(name) for name in kernels.sources}
        self.bias_rows = module.get_function("cf_bias_rows").prepare("PPiii")
        self.name_of = kernels.name_of

        sizes = {name: plan.buffer_elements(name) for name in plan.buffers}
        total = sum(sizes.values())
        free, _ = drv.mem_get_info()
        need = total * 4 + 2 * _CUBLAS_WORKSPACE
        if need > free:
            raise CellError(f"out of GPU memory: these sizes need {need / 2**20:.0f} MiB, "
                            f"{free / 2**20:.0f} MiB are free")
        self.memory = drv.mem_alloc(total * 4)
        self.addr: dict[str, int] = {}
        offset = int(self.memory)
        for name, n in sizes.items():
            self.addr[name] = offset
            offset += n * 4
        for name, arr in plan.weight_arrays(params, np.float32).items():
            drv.memcpy_htod(self.addr[name], np.ascontiguousarray(arr))
        self.weights = {name for name, b in plan.buffers.items()
                        if b.role in ("weight", "stacked", "bias")}

        # Two non-blocking (capturable) streams: the recurrence on the main one; with a chunked prologue,
        # the hoisted launches beside it on the side one, each with its own cuBLAS handle and workspace
        # (two GEMMs running at once must not share a workspace).
        self.streams = [drv.Stream(flags=1), drv.Stream(flags=1)]
        self.stream = self.streams[MAIN]
        self.handles, self.workspaces = [], []
        for stream in self.streams:
            handle = self.cublas.create()
            self.cublas.set_stream(handle, stream.handle)
            workspace = drv.mem_alloc(_CUBLAS_WORKSPACE)
            self.cublas.set_workspace(handle, int(workspace), _CUBLAS_WORKSPACE)
            self.handles.append(handle)
            self.workspaces.append(workspace)
        self._scalars = np.array([1.0, 0.0], np.float32)  # alpha and beta live here for cuBLAS
        self.init = drv.mem_alloc(max(1, len(plan.cell.updates)) * plan.sizes.layers * plan.sizes.batch
                                  * plan.sizes.hidden * 4)
        self.graph_exec = None
        self._prepared = {name: None for name in self.funcs}
        self.calls = self._build_calls()

    # -- the launches, with every address resolved once ----------------------------------------
    def _ptr(self, acc, t: int) -> int:
        return self.addr[acc.buffer] + 4 * acc.offset(t, self.plan.sizes.batch)

    def _event(self):
        return self.drv.Event(self.drv.event_flags.DISABLE_TIMING)

    def _build_calls(self) -> list:
        plan, T, B, H = self.plan, self.plan.sizes.seq, self.plan.sizes.batch, self.plan.sizes.hidden
        chunk = plan.chunk_steps
        calls = []
        state_ids = list(plan.cell.updates)
        if chunk:
            fork = self._event()  # the side stream starts after what came before on the main one
            calls += [("record", MAIN, fork), ("wait", SIDE, fork)]
        prev_done: list = []  # per chunk, an event after the previous layer's steps of that chunk
        for lp in plan.layers:
            for i, s in enumerate(state_ids):
                src = int(self.init) + 4 * ((i * plan.sizes.layers + lp.layer) * B * H)
                calls.append(("copy", MAIN, self._ptr(lp.state_read[s], 0), src, B * H * 4))
            ready = []  # per chunk, an event after its hoisted launches on the side stream
            if not chunk:
                for launch in lp.prologue:
                    calls += self._launch_calls(MAIN, launch, lp.layer, 0)
            for j, first in enumerate(range(0, T, chunk) if chunk else ()):
                if prev_done:
                    calls.append(("wait", SIDE, prev_done[j]))
                for launch in lp.prologue:
                    if launch.row_kind == "seq":
                        calls += self._launch_calls(SIDE, launch, lp.layer, 0, (first, min(T, first + chunk)))
                    elif j == 0:  # [N] and scalar values: all of them with the first chunk
                        calls += self._launch_calls(SIDE, launch, lp.layer, 0)
                ready.append(self._event())
                calls.append(("record", SIDE, ready[-1]))
            prev_done = []
            for t in range(T):
                if chunk and t % chunk == 0:
                    calls.append(("wait", MAIN, ready[t // chunk]))
                for launch in lp.step:
                    calls += self._launch_calls(MAIN, launch, lp.layer, t)
                if chunk and ((t + 1) % chunk == 0 or t == T - 1):
                    prev_done.append(self._event())
                    calls.append(("record", MAIN, prev_done[-1]))
        if chunk:
            join = self._event()  # and the main one ends after everything on the side one
            calls += [("record", SIDE, join), ("wait", MAIN, join)]
        return calls

    def _launch_calls(self, stream: int, launch, layer: int, t: int,
                      steps: tuple[int, int] | None = None) -> list:
        """The calls of one launch at step t, or, for a prologue launch over all steps, of its rows of
        steps [first, last) only."""
        B = self.plan.sizes.batch
        first, last = steps if steps else (0, None)
        chunk_rows = (last - first) * B if steps else None

        def ptr(acc) -> int:
            skip = first * B * acc.ld if acc.kind == "row" else 0
            return self._ptr(acc, t) + 4 * skip

        one, zero = self._scalars.ctypes.data, self._scalars.ctypes.data + 4
        if isinstance(launch, GemmLaunch):
            m = chunk_rows or launch.m
            out = []
            c = ptr(launch.c)
            if launch.bias:
                out.append(("bias", stream, _grid(m * launch.n), c, self.addr[launch.bias], m, launch.n,
                            launch.c.ld))
            out.append(("gemm", stream, launch.n, m, launch.k, one, self.addr[launch.w], launch.n,
                        ptr(launch.a), launch.a.ld, one if launch.bias else zero, c, launch.c.ld))
            return out
        assert isinstance(launch, KernelLaunch)
        name = self.name_of[(layer, launch.island)]
        params = kernel_params(launch)
        if self._prepared[name] is None:
            self._prepared[name] = self.funcs[name].prepare("P" * len(params) + "i")
        rows = chunk_rows or launch.rows
        args = [ptr(p.access) for p in params] + [rows]
        return [("kernel", stream, self._prepared[name], _grid(rows * launch.width), args)]

    def enqueue(self) -> None:
        """Puts one whole forward pass on the streams."""
        drv, sgemm, streams, handles = self.drv, self.cublas.sgemm, self.streams, self.handles
        N = 0  # CUBLAS_OP_N
        for call in self.calls:
            kind = call[0]
            if kind == "kernel":
                call[2].prepared_async_call((call[3], 1), (BLOCK, 1, 1), streams[call[1]], *call[4])
            elif kind == "gemm":
                sgemm(handles[call[1]], N, N, *call[2:])
            elif kind == "bias":
                self.bias_rows.prepared_async_call((call[2], 1), (BLOCK, 1, 1), streams[call[1]], *call[3:])
            elif kind == "copy":
                drv.memcpy_dtod_async(call[2], call[3], call[4], streams[call[1]])
            elif kind == "record":
                call[2].record(streams[call[1]])
            else:
                streams[call[1]].wait_for_event(call[2])

    def capture_graph(self) -> None:
        """Captures one forward pass into a CUDA graph, replayed by `forward`."""
        if self.cu is None:
            raise GpuUnavailable("CUDA graphs need NVIDIA's cuda-python (cuda.bindings): "
                                 "pip install cuda-python")
        cu = self.cu
        cs = cu.CUstream(self.stream.handle)
        _cu_check(cu.cuStreamBeginCapture(cs, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
        try:
            self.enqueue()
        finally:
            graph = _cu_check(cu.cuStreamEndCapture(cs))
        self.graph_exec = _cu_check(cu.cuGraphInstantiate(graph, 0))
        self._cs = cs

    def forward(self) -> None:
        """One forward pass on the stream: the graph replayed if one was captured, else direct launches."""
        if self.graph_exec is not None:
            _cu_check(self.cu.cuGraphLaunch(self.graph_exec, self._cs))
        else:
            self.enqueue()

    # -- data in and out ------------------------------------------------------------------------
    def load(self, x: np.ndarray, initial: dict[str, np.ndarray]) -> None:
        """Uploads x and the initial states; every other buffer is poisoned with NaN."""
        drv = self.drv
        for name in self.plan.buffers:
            if name not in self.weights:
                drv.memset_d32(self.addr[name], _NAN_BITS, self.plan.buffer_elements(name))
        drv.memcpy_htod(self.addr["x"], np.ascontiguousarray(x, np.float32))
        states = [np.ascontiguousarray(initial[s], np.float32) for s in self.plan.cell.updates]
        if states:
            drv.memcpy_htod(self.init, np.ascontiguousarray(np.stack(states)))
        # These ran on the legacy default stream, which the non-blocking streams do not wait for.
        drv.Context.synchronize()

    def results(self) -> Forward:
        plan, drv = self.plan, self.drv
        T, B, H = plan.sizes.seq, plan.sizes.batch, plan.sizes.hidden
        self.stream.synchronize()
        y = np.empty((T, B, H), np.float32)
        drv.memcpy_dtoh(y, self.addr[plan.layers[-1].output_seq] + 4 * B * H)
        final = {}
        for s in plan.cell.updates:
            per_layer = []
            for lp in plan.layers:
                buf = np.empty((B, H), np.float32)
                acc = lp.state_read[s]
                drv.memcpy_dtoh(buf, self._ptr(acc, T))
                per_layer.append(buf)
            final[s] = np.stack(per_layer)
        return Forward(y, final)

    def run(self, x: np.ndarray, initial: dict[str, np.ndarray]) -> Forward:
        self.load(x, initial)
        if self.plan.cuda_graph and self.graph_exec is None:
            self.capture_graph()
        self.forward()
        return self.results()

    def close(self) -> None:
        for handle, workspace in zip(self.handles, self.workspaces, strict=True):
            self.cublas.destroy(handle)
            workspace.free()
        self.memory.free()
        self.init.free()


def _grid(n: int) -> int:
    return max(1, min((n + BLOCK - 1) // BLOCK, 65535))
