"""Host microseconds per call of what a CellRNN forward call is made of, on the GPU machine: a cuBLAS
SGEMM through nvmath, a kernel launch through cuda.bindings (plain, with a launch config, and through
ctypes straight into libcuda), torch.empty, and an empty autograd.Function.

    python3 benchmarks/probes/launch_costs.py
"""

from __future__ import annotations

import ctypes
import time

import numpy as np
import torch

from cellfuse.gpu_runtime import driver
from cellfuse.gpu_runtime.kernel_cache import cubin

SOURCE = 'extern "C" __global__ void k(float* p, int n) { if (threadIdx.x == 0 && n < 0) p[0] = 1; }'


def us(fn, calls: int = 2000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    took = time.perf_counter() - t
    torch.cuda.synchronize()
    return took / calls * 1e6


class Nothing(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.new_empty(0)

    @staticmethod
    def backward(ctx, g):
        return None


def main() -> None:
    from nvmath.bindings import cublas

    x = torch.zeros(1 << 20, device="cuda")
    stream = torch._C._cuda_getCurrentRawStream(0)
    major, minor = torch.cuda.get_device_capability(0)
    module = driver.Module(cubin(SOURCE, f"sm_{major}{minor}"), "probe")
    function = module.function("k")
    plain = driver.Launch(function, "k", (1,), 32, [x.data_ptr(), 1])
    early = driver.EarlyLaunch(function, "k", (1,), 32, [x.data_ptr(), 1])
    s = driver.as_stream(stream)
    handle = cublas.create()
    cublas.set_stream(handle, stream)
    scalars = np.array([1.0, 0.0], np.float32)
    one, zero = scalars.ctypes.data, scalars.ctypes.data + 4
    p = x.data_ptr()
    libcuda = ctypes.CDLL("libcuda.so.1")
    launch = libcuda.cuLaunchKernel
    pointer = ctypes.c_void_p
    launch.argtypes = [pointer, *[ctypes.c_uint] * 7, pointer, pointer, pointer]
    fn_ptr, stream_ptr = int(function), stream
    rows = {
        "cuBLAS sgemm (nvmath), 1 x 2048 x 512": lambda: cublas.sgemm(handle, 0, 0, 2048, 1, 512, one, p,
                                                                       2048, p, 512, zero, p, 2048),
        "cuLaunchKernel (cuda.bindings)": lambda: plain(s),
        "cuLaunchKernelEx with PDL (cuda.bindings)": lambda: early(s),
        "cuLaunchKernel (ctypes)": lambda: launch(fn_ptr, 1, 1, 1, 32, 1, 1, 0, stream_ptr, plain.params,
                                                  None),
        "torch.empty(4 KiB) on the GPU": lambda: torch.empty(1024, device="cuda"),
        "autograd.Function.apply, nothing in it": lambda: Nothing.apply(x),
        "torch._C._cuda_getCurrentRawStream": lambda: torch._C._cuda_getCurrentRawStream(0),
        "torch.cuda.is_current_stream_capturing": torch.cuda.is_current_stream_capturing,
    }
    for name, fn in rows.items():
        print(f"{name:45s} {us(fn):7.2f} us", flush=True)
    cublas.destroy(handle)


if __name__ == "__main__":
    main()
