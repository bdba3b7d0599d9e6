"""A program's calls (kernel launches, cuBLAS GEMMs, copies, fills, events) made in one call from Python.

Python's share of a launch through cuda.bindings is several microseconds, and a small forward pass is
over on the GPU in about a hundred: launched one by one from Python, the GPU waits for the host. A
`LaunchList` is built once, as its program is made; a run hands the C code of
resources/host/launch_list.c the run's bases (tensors' addresses) and the stream, and it writes each
pointer argument (a base plus a fixed offset) into the argument tables and makes every call.

    calls = LaunchList("the LSTM's forward kernels")
    calls.kernel(function, "cf_step", (blocks,), 256, 0, [(slot_x, 0), (slot_y, 64), 100], stream=0)
    calls.sgemm(handle, ..., stream=0)
    calls.finish(side_streams, cublas_handles)
    calls.bind([(0, 0), (1, 0)])            # slot -> (base, offset): here each slot its own base
    calls.run([x_address, y_address], stream_handle)

The C code is built by nvcc at first use and kept in the kernel cache folder (kernel_cache.shared_library);
it links nothing and is given the driver's entry points (from libcuda) and cuBLAS's (from nvmath-python,
which found the cuBLAS the process uses).
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Sequence
from functools import lru_cache
from importlib import resources

import numpy as np

from ..graph_model import CellError
from . import driver
from .kernel_cache import shared_library

log = logging.getLogger(__name__)

KERNEL, COOPERATIVE, EARLY, COPY, RECORD, WAIT, SGEMM, GEMM_EX, FILL, GEMM_EX_DEVICE = range(10)
_CUBLAS_ERROR = 100000  # cf_run's code for a cuBLAS status s is this plus s
_MASK = 0xFFFFFFFFFFFFFFFF

# CELLFUSE_CHECK_LAUNCHES=1: every call waited for and checked, so that a kernel that faults is named (as
# CUDA_LAUNCH_BLOCKING does for torch's own); slow, for finding faults.
CHECK_LAUNCHES = os.environ.get("CELLFUSE_CHECK_LAUNCHES", "") not in ("", "0")

_p = ctypes.c_void_p


class Api(ctypes.Structure):
    """The entry points the C code calls (see launch_list.c's cf_api)."""

    _fields_ = [(name, _p) for name in ("launch", "launch_cooperative", "launch_ex", "copy", "record", "wait",
                                        "synchronize", "sgemm", "gemm_ex", "set_stream", "fill",
                                        "set_pointer_mode")]


class _Op(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("stream", ctypes.c_int32), ("function", _p),
                ("grid", ctypes.c_uint32 * 3), ("block", ctypes.c_uint32), ("smem", ctypes.c_uint32),
                ("first", ctypes.c_int32), ("args", ctypes.c_int32)]


class _Program(ctypes.Structure):
    _fields_ = [("api", _p), ("n_ops", ctypes.c_int32), ("n_patches", ctypes.c_int32),
                ("ops", _p), ("values", _p), ("params", _p), ("patch_value", _p), ("patch_base", _p),
                ("patch_offset", _p), ("streams", _p), ("handles", _p), ("handle_stream", _p),
                ("configs", _p)]


@lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """The launch list's C code, built (or found built) and loaded; its structures' sizes checked
    against this module's."""
    source = (resources.files("cellfuse.resources.host") / "launch_list.c").read_text("utf-8")
    path = shared_library(source, "launch_list")
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:  # a kept file cut short or overwritten: built again
        log.warning("the launch list's library %s does not load (%s); building it again", path, e)
        lib = ctypes.CDLL(str(shared_library(source, "launch_list", fresh=True)))
    sizes = (ctypes.c_int32 * 8)()
    lib.cf_sizes(sizes)
    ours = (ctypes.sizeof(Api), ctypes.sizeof(_Op), ctypes.sizeof(_Program))
    if tuple(sizes[:3]) != ours:
        raise CellError(f"the launch list's C structures are {tuple(sizes[:3])} bytes long and Python's "
                        f"{ours}: the two disagree")
    lib.cf_run.argtypes = (_p, ctypes.c_uint64, _p, ctypes.c_int, _p)
    lib.cf_run.restype = ctypes.c_int
    lib.cf_prepare.argtypes = (_p,)
    lib.config_bytes = sizes[3]
    return lib


@lru_cache(maxsize=1)
def _api() -> Api:
    """The entry points the C code calls: the CUDA driver's from libcuda, cuBLAS's from the library
    nvmath-python loaded."""
    from nvmath.bindings._internal import cublas as found

    def cublas(name: str) -> int:
        address = found._inspect_function_pointer(f"__{name}")
        if not address:
            raise CellError(f"cuBLAS's {name} was not found in the cuBLAS library nvmath-python loaded")
        return address

    return Api(*(driver.entry_point(name) for name in (
        "cuLaunchKernel", "cuLaunchCooperativeKernel", "cuLaunchKernelEx", "cuMemcpyDtoDAsync_v2",
        "cuEventRecord", "cuStreamWaitEvent", "cuCtxSynchronize")),
        *(cublas(name) for name in ("cublasSgemm_v2", "cublasGemmEx", "cublasSetStream_v2")),
        driver.entry_point("cuMemsetD32Async"), cublas("cublasSetPointerMode_v2"))


Pointer = tuple[int, int]  # (slot, byte offset): an argument that is a buffer's address plus an offset


class LaunchList:
    """The calls of a program as they are added, then (after `finish`) run together; see the module's
    docstring."""

    def __init__(self, what: str):
        self.what = what
        self.names: list[str] = []  # what each call runs, for errors
        self._ops: list[tuple] = []
        self._values: list[int] = []
        self._patches: list[tuple[int, int, int]] = []  # (value, slot, offset)
        self._program: _Program | None = None

    # -- building -------------------------------------------------------------------------------------
    def _add(self, kind: int, stream: int, function: int, args: Sequence[int | Pointer], name: str,
             grid: tuple[int, ...] = (1,), block: int = 1, smem: int = 0) -> None:
        first = len(self._values)
        for i, a in enumerate(args):
            if isinstance(a, tuple):
                self._patches.append((first + i, a[0], a[1]))
                self._values.append(0)
            else:
                self._values.append(int(a) & _MASK)
        self._ops.append((kind, stream, function, (*grid, 1, 1)[:3], block, smem, first, len(args)))
        self.names.append(name)

    def kernel(self, function, name: str, grid: tuple[int, ...], block: int, smem: int,
               args: Sequence[int | Pointer], stream: int, kind: int = KERNEL) -> None:
        """A kernel's launch; an int argument is read from its slot's first 4 bytes (little-endian)."""
        if smem > 48 * 1024:
            cu = driver.bindings()
            driver.check(cu.cuFuncSetAttribute(
                function, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem),
                f"giving {name} {smem} bytes of shared memory")
        self._add(kind, stream, int(function), args, name, grid, block, smem)

    def copy(self, dst: Pointer, src: Pointer, nbytes: int, stream: int, name: str) -> None:
        self._add(COPY, stream, 0, [dst, src, nbytes], name)

    def fill(self, dst: Pointer, pattern: int, words: int, stream: int, name: str) -> None:
        """`words` 32-bit words from dst set to `pattern` (the bits of a float32's 1.0, say)."""
        self._add(FILL, stream, 0, [dst, pattern, words], name)

    def record(self, event, stream: int) -> None:
        self._add(RECORD, stream, int(event), [], "an event")

    def wait(self, event, stream: int) -> None:
        self._add(WAIT, stream, int(event), [], "a wait")

    def sgemm(self, handle: int, args: Sequence[int | Pointer], stream: int, name: str) -> None:
        """cublasSgemm_v2 on the stream's handle; `args` after the handle, as cuBLAS takes them."""
        self._add(SGEMM, stream, 0, [handle, *args], name)

    def gemm_ex(self, handle: int, args: Sequence[int | Pointer], stream: int, name: str,
                device_scalars: bool = False) -> None:
        """cublasGemmEx on the stream's handle; `args` after the handle, as cuBLAS takes them, alpha and
        beta host addresses, or device ones with `device_scalars` (the handle's pointer mode DEVICE for
        this call alone)."""
        self._add(GEMM_EX_DEVICE if device_scalars else GEMM_EX, stream, 0, [handle, *args], name)

    def finish(self, side_streams: Sequence = (), handles: Sequence[int] = (),
               api: Api | None = None) -> None:
        """Fixes the calls: stream 0 is each run's, 1... are `side_streams`; `handles[s]` is the cuBLAS
        handle of stream s (its stream set by the caller, the first one's by each run). The first handle
        is the list's alone: the list remembers which stream it set it to. `api`: the entry points to
        call (the driver's and cuBLAS's unless given)."""
        lib = library()
        n = len(self._ops)
        ops = (_Op * max(1, n))()
        for op, (kind, stream, function, grid, block, smem, first, args) in zip(ops, self._ops, strict=False):
            op.kind, op.stream, op.function = kind, stream, function
            op.grid[:] = grid
            op.block, op.smem, op.first, op.args = block, smem, first, args
        values = np.array(self._values or [0], np.uint64)
        params = values.ctypes.data + 8 * np.arange(len(values), dtype=np.uint64)
        streams = (_p * (1 + len(side_streams)))(0, *(int(s) for s in side_streams))
        cublas = (_p * max(1, len(handles)))(*(int(h) for h in handles))
        configs = ctypes.create_string_buffer(lib.config_bytes * max(1, n))
        self._patch_value = np.array([v for v, _, _ in self._patches] or [0], np.int32)
        self._slots = [s for _, s, _ in self._patches]
        self._offsets = [o for _, _, o in self._patches]
        api = api or _api()
        self._keep = [ops, values, params, streams, cublas, configs, api]  # what the C reads, alive
        self._program = program = _Program(
            ctypes.addressof(api), n, len(self._patches), ctypes.addressof(ops),
            values.ctypes.data, params.ctypes.data, self._patch_value.ctypes.data, None, None,
            ctypes.addressof(streams), ctypes.addressof(cublas) if handles else None,
            _MASK,  # no stream: the first run sets the first handle's
            ctypes.addressof(configs))
        lib.cf_prepare(ctypes.addressof(program))
        self._address = ctypes.addressof(program)
        self._failed = ctypes.c_int32(0)
        self._failed_at = ctypes.addressof(self._failed)
        self._cf_run = lib.cf_run
        self.bind([(slot, 0) for slot in range(1 + max(self._slots, default=-1))])

    def bind(self, binder: Sequence[tuple[int, int]], bases: int = 0) -> None:
        """Where each slot's buffer is in a run's memory: binder[slot] = (which of the run's bases, the
        bytes after it); a run gives at most max(`bases`, those the binder names) bases."""
        if self._program is None:
            raise CellError(f"{self.what}: bound before it was finished")
        base = np.array([binder[s][0] for s in self._slots] or [0], np.int32)
        offset = np.array([binder[s][1] + o for s, o in zip(self._slots, self._offsets, strict=True)] or [0],
                          np.int64)
        self._keep_bound = (base, offset)
        self._program.patch_base, self._program.patch_offset = base.ctypes.data, offset.ctypes.data
        self._bases = (ctypes.c_uint64 * max(1, bases, 1 + max((b for b, _ in binder), default=-1)))()
        self._bases_at = ctypes.addressof(self._bases)

    # -- running --------------------------------------------------------------------------------------
    def run(self, bases: Sequence[int], stream: int) -> None:
        """Every call, in order, over a run's bases (addresses; see `bind`), stream 0 being `stream` (a raw
        CUstream handle)."""
        self._bases[:len(bases)] = bases
        err = self._cf_run(self._address, stream, self._bases_at, CHECK_LAUNCHES, self._failed_at)
        if err:
            self._fail(err)

    def _fail(self, err: int) -> None:
        i = self._failed.value
        name = "setting cuBLAS's stream" if i < 0 else f"running {self.names[i]}"
        if err >= _CUBLAS_ERROR:
            raise CellError(f"{self.what}: cuBLAS error {err - _CUBLAS_ERROR} while {name}")
        driver.fail(err, f"{name} ({self.what})")
