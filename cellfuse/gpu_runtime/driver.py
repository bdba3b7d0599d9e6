"""The CUDA driver API through NVIDIA's cuda.bindings, for work put on a caller's stream: modules loaded
into the current context (the primary context of the device the caller has made current, as PyTorch does),
kernels launched from a table of arguments that is rewritten in place before each launch, streams and
events.

A launch costs one call into the driver and a few stores into a numpy array: the arguments' table is
built once per kernel call site, so that the host time of a whole forward pass stays below the GPU's.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

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


class Launch:
    """One call site of a kernel: its grid, block and shared memory fixed, its arguments in a table the
    driver reads through pointers. Every argument has an 8-byte slot; an int argument is read from the
    first 4 bytes of its slot (little-endian), so one uint64 array holds them all."""

    def __init__(self, function, name: str, grid: tuple[int, ...], block: int, args: list[int],
                 smem: int = 0):
        self.cu = bindings()
        self.function, self.name = function, name
        self.grid = (*grid, 1, 1)[:3]
        self.block, self.smem = block, smem
        self.values = np.zeros(max(1, len(args)), np.uint64)
        for i, value in enumerate(args):
            self.values[i] = value & 0xFFFFFFFFFFFFFFFF
        self.table = self.values.ctypes.data + 8 * np.arange(len(args), dtype=np.uint64)
        self.params = self.table.ctypes.data  # numpy's .ctypes costs microseconds: read once
        if smem > 48 * 1024:
            cu = self.cu
            check(cu.cuFuncSetAttribute(function, cu.CUfunction_attribute
                                        .CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem),
                  f"giving {name} {smem} bytes of shared memory")

    def set(self, i: int, value: int) -> None:
        self.values[i] = value

    def __call__(self, stream) -> None:
        gx, gy, gz = self.grid
        err, = self.cu.cuLaunchKernel(self.function, gx, gy, gz, self.block, 1, 1, self.smem, stream,
                                      self.params, 0)
        if int(err):
            fail(err, f"launching {self.name}")


class CooperativeLaunch(Launch):
    """A kernel whose blocks wait for each other: all of them resident at once."""

    def __call__(self, stream) -> None:
        gx, gy, gz = self.grid
        err, = self.cu.cuLaunchCooperativeKernel(self.function, gx, gy, gz, self.block, 1, 1, self.smem,
                                                 stream, self.params)
        if int(err):
            fail(err, f"launching {self.name}")


class EarlyLaunch(Launch):
    """A kernel allowed to start while the kernel before it on the stream ends (programmatic stream
    serialization, compute capability 9.0 on); it waits for it at its top (see persistent_cuda.skeleton's
    PDL_WAIT)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        cu = self.cu
        config = cu.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = self.grid
        config.blockDimX, config.blockDimY, config.blockDimZ = self.block, 1, 1
        config.sharedMemBytes = self.smem
        early = cu.CUlaunchAttribute()
        early.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        early.value.programmaticStreamSerializationAllowed = 1
        config.attrs = [early]
        config.numAttrs = 1
        self.config = config
        self._stream = None

    def __call__(self, stream) -> None:
        if stream is not self._stream:  # setting a field of the struct costs more than comparing
            self.config.hStream = self._stream = stream
        err, = self.cu.cuLaunchKernelEx(self.config, self.function, self.params, 0)
        if int(err):
            fail(err, f"launching {self.name}")


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


def as_stream(handle: int):
    """A cuda.bindings stream of a raw handle (such as torch.cuda.current_stream().cuda_stream)."""
    return bindings().CUstream(handle)
