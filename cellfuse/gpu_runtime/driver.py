"""The CUDA driver API through NVIDIA's cuda.bindings, for work put on a caller's stream: modules loaded
into the current context (the primary context of the device the caller has made current, as PyTorch does),
streams and events. The launches themselves go through the launch list (launch_list.py), in C, or, one at
a time, through libcuda's own entry point (`launch`).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from functools import lru_cache

from ..graph_model import CellError


class DriverError(CellError):
    """A CUDA driver call failed; the message names the call and what it was doing."""


@lru_cache(maxsize=1)
def bindings():
    """cuda.bindings.driver, or a CellError saying how to get it."""
    try:
        from cuda.bindings import driver
    except ImportError:
        raise CellError("running on a caller's stream needs NVIDIA's cuda-python (cuda.bindings): "
                        "pip install cuda-python (nvmath-python brings it)") from None
    return driver


def check(result, doing: str = ""):
    """The values of a cuda.bindings call, which returns (error, *values); DriverError if it failed."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        cu = bindings()
        _, name = cu.cuGetErrorName(err)
        _, text = cu.cuGetErrorString(err)
        what = f" while {doing}" if doing else ""
        raise DriverError(f"CUDA driver error {name.decode() if name else int(err)}{what}: "
                          f"{text.decode() if text else ''}")
    return values[0] if len(values) == 1 else values


def fail(err, doing: str) -> None:
    """Raises the DriverError of a call's error code."""
    check((err,), doing)


def use_primary_context(index: int) -> None:
    """The device's primary context made current on this thread where no context is: the CUDA runtime
    (PyTorch's) makes it current only on a thread that has set a device, and a new thread's first work on
    the default device sets none."""
    cu = bindings()
    if int(check(cu.cuCtxGetCurrent(), "asking for the current context")) == 0:
        device = check(cu.cuDeviceGet(index), "asking for a device")
        # (the runtime holds the context alive: its retain here is given back at once)
        context = check(cu.cuDevicePrimaryCtxRetain(device), "using the device's primary context")
        check(cu.cuCtxSetCurrent(context), "making the device's primary context current")
        check(cu.cuDevicePrimaryCtxRelease(device), "using the device's primary context")


def current_device() -> int:
    """The ordinal of the device whose context is current on this thread."""
    return int(check(bindings().cuCtxGetDevice(), "asking for the current device"))


class Module:
    """A cubin loaded into the current context; unloaded by `close`."""

    def __init__(self, cubin: bytes, what: str):
        self.cu = bindings()
        self.what = what
        self.handle = check(self.cu.cuModuleLoadData(cubin), f"loading {what}")

    def function(self, name: str):
        return check(self.cu.cuModuleGetFunction(self.handle, name.encode()),
                     f"finding {name} in {self.what}")

    def close(self) -> None:
        check(self.cu.cuModuleUnload(self.handle), f"unloading {self.what}")


class Event:
    """A timing event, with the methods of PyCUDA's that event_timing.median_ms calls (this module stands
    for PyCUDA's driver there)."""

    def __init__(self):
        self.cu = bindings()
        flags = self.cu.CUevent_flags.CU_EVENT_DEFAULT
        self.handle = check(self.cu.cuEventCreate(flags), "creating an event")

    def record(self, stream) -> None:
        check(self.cu.cuEventRecord(self.handle, stream), "recording an event")

    def synchronize(self) -> None:
        check(self.cu.cuEventSynchronize(self.handle), "waiting for an event")

    def time_since(self, start: Event) -> float:
        return check(self.cu.cuEventElapsedTime(start.handle, self.handle), "timing")

    def __del__(self):
        self.cu.cuEventDestroy(self.handle)


class Context:
    @staticmethod
    def synchronize() -> None:
        check(bindings().cuCtxSynchronize(), "waiting for the GPU")


def resident_blocks(function, threads: int, smem: int) -> int:
    """Blocks of the kernel that one SM holds at once."""
    return int(check(bindings().cuOccupancyMaxActiveBlocksPerMultiprocessor(function, threads, smem),
                     "asking for the kernel's occupancy"))


def new_stream():
    cu = bindings()
    return check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "creating a stream")


def new_event():
    cu = bindings()
    return check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING), "creating an event")


@lru_cache(maxsize=1)
def libcuda() -> ctypes.CDLL:
    """The driver's library, for the calls made without cuda.bindings (`launch`, the launch list's C, the
    kept calls' C++ lane), given its entry points' addresses (`entry_point`)."""
    return ctypes.CDLL("libcuda.so.1")


def entry_point(name: str) -> int:
    """The address of one of libcuda's functions."""
    return ctypes.cast(getattr(libcuda(), name), ctypes.c_void_p).value


@lru_cache(maxsize=1)
def _launch_kernel():
    pointer = ctypes.c_void_p
    prototype = ctypes.CFUNCTYPE(ctypes.c_int, pointer, *(ctypes.c_uint,) * 7, pointer, pointer, pointer)
    return prototype(entry_point("cuLaunchKernel"))


def launch(function: int, blocks: int, threads: int, stream: int, table: int, doing: str) -> None:
    """One launch of a kernel (`function`: its handle as an int) over a 1-D grid on a raw stream, its
    arguments' addresses in the table at `table`: straight to libcuda's cuLaunchKernel, a microsecond or
    two of Python where cuda.bindings' takes about ten (on an H200's host)."""
    err = _launch_kernel()(function, blocks, 1, 1, threads, 1, 1, 0, stream, table, None)
    if err:
        fail(err, doing)


def as_stream(handle: int):
    """A cuda.bindings stream of a raw handle (such as torch.cuda.current_stream().cuda_stream)."""
    return bindings().CUstream(handle)


def capture(stream, put: Callable[[], object], doing: str):
    """What `put()` puts on `stream` (and on the streams it forks from it and joins back to it) captured
    once into a CUDA graph, thread-local, and instantiated: cuGraphLaunch replays it, cuGraphExecDestroy
    frees it. A capture that `put` fails in is ended, its graph destroyed."""
    cu = bindings()
    check(cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), doing)
    try:
        put()
    except BaseException:
        err, graph = cu.cuStreamEndCapture(stream)
        if int(err) == 0:
            cu.cuGraphDestroy(graph)
        raise
    graph = check(cu.cuStreamEndCapture(stream), doing)
    try:
        return check(cu.cuGraphInstantiate(graph, 0), doing)
    finally:
        check(cu.cuGraphDestroy(graph), doing)  # the instantiated graph keeps what it needs
