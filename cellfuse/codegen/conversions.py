"""Kernels that copy an array into another of another element type: where a 16-bit plan stores a buffer in
float32 that its caller gives or takes in the 16-bit type (an LSTM's c, say), a run converts it on its own
stream, inside its program (lowering.Convert), instead of a conversion of the caller's between calls: a
framework's conversion costs the host tens of microseconds inside a training step, a launch from a launch
list a few, a replayed CUDA graph none."""

from __future__ import annotations

from .dtypes import DTYPES, DType


def conversion_name(dst: DType, src: DType) -> str:
    """The kernel that converts elements of `src` into `dst`: (dst, src, int n)."""
    return f"cf_convert_{src.suffix or 'f32'}_to_{dst.suffix or 'f32'}"


def conversions_source() -> str:
    """Every conversion between two of the element types (DTYPES), each rounding to nearest, ties to even,
    as every kernel's store does; n elements, contiguous, in a grid-stride loop."""
    types = list(DTYPES.values())
    headers = sorted({t.header for t in types} - {""})
    out = [f"#include <{h}>" for h in headers]
    for dst in types:
        for src in types:
            if dst == src:
                continue
            out += [f'extern "C" __global__ void {conversion_name(dst, src)}({dst.c}* dst, '
                    f"const {src.c}* src, int n)",
                    "{",
                    "    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)n;",
                    "         i += (size_t)gridDim.x * blockDim.x)",
                    f"        dst[i] = {dst.store(src.load('src[i]'))};",
                    "}"]
    return "\n".join(out) + "\n"
