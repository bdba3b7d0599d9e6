"""The element types a plan's buffers are stored in. Every kernel computes in float32 (elementwise math,
GEMM accumulation); a buffer of another type converts as it is loaded and stored. Each type is one entry
of `DTYPES`: its C type, its size, its numpy type and those two conversions, so that the emitters ask
for them instead of writing `float`, and a new storage type is an addition to the table.

The numpy executor emulates a 16-bit type in float32 (or float64) arrays: `round_to` rounds values to the
nearest the type holds (ties to even, as __float2bfloat16_rn and __float2half_rn do on the GPU)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DType:
    name: str
    c: str  # the C type of an element in memory
    itemsize: int  # bytes
    numpy: str  # the numpy dtype of the same bits
    load_as: str = "{}"  # C: an element in memory (the {}) as the float32 kernels compute in
    store_as: str = "{}"  # C: a float32 value (the {}) as an element in memory
    header: str = ""  # the CUDA header that declares the C type, where one must be included
    cuda: int = 0  # its cudaDataType_t, for cuBLAS
    cuda_c: str = "CUDA_R_32F"  # the same, as C names it
    # the cublasComputeType_t of a GEMM of float32 operands rounded to this type as it multiplies them
    fast_compute: int = 68  # CUBLAS_COMPUTE_32F
    nan_bits: int = 0x7FC00000  # a quiet NaN's bits, to poison memory with
    suffix: str = ""  # of the CUDA library's functions for the type (mma16.cuh: cf_mma_bf16, ...)

    def load(self, element: str) -> str:
        return self.load_as.format(element)

    def store(self, value: str) -> str:
        return self.store_as.format(value)


FLOAT32 = DType("float32", "float", 4, "float32")
# (fast_compute: CUBLAS_COMPUTE_32F_FAST_16BF and _16F)
BFLOAT16 = DType("bfloat16", "__nv_bfloat16", 2, "uint16", "__bfloat162float({})", "__float2bfloat16_rn({})",
                 "cuda_bf16.h", cuda=14, cuda_c="CUDA_R_16BF", fast_compute=75, nan_bits=0x7FC0,
                 suffix="bf16")
FLOAT16 = DType("float16", "__half", 2, "float16", "__half2float({})", "__float2half_rn({})", "cuda_fp16.h",
                cuda=2, cuda_c="CUDA_R_16F", fast_compute=74, nan_bits=0x7E00, suffix="f16")
DTYPES = {t.name: t for t in (FLOAT32, BFLOAT16, FLOAT16)}
# the cublasComputeType_t of a GEMM of each dtype's fast_compute, as C names it
COMPUTE_C = {68: "CUBLAS_COMPUTE_32F", 74: "CUBLAS_COMPUTE_32F_FAST_16F", 75: "CUBLAS_COMPUTE_32F_FAST_16BF"}

# What kernels compute in: their registers, shared memory and accumulators
COMPUTE = FLOAT32


def round_to(dtype: DType, values: np.ndarray) -> np.ndarray:
    """`values` (float32 or float64) rounded to the nearest numbers `dtype` holds, in their own numpy
    type; a float64 value is rounded to float32 first, as a kernel computing in float32 would have it."""
    with np.errstate(over="ignore", invalid="ignore"):  # beyond the type's range is its infinity
        return _rounded(dtype, values)


def _rounded(dtype: DType, values: np.ndarray) -> np.ndarray:
    if dtype == FLOAT32:
        return values.astype(np.float32).astype(values.dtype, copy=False)
    if dtype == FLOAT16:
        return values.astype(np.float32).astype(np.float16).astype(values.dtype)
    if dtype == BFLOAT16:
        bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
        # add half of the dropped bits' range (less one, plus the kept last bit: ties go to even), then drop
        rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) & np.uint32(0xFFFF0000)).view(np.float32)
        # a NaN's payload could carry into its sign: NaNs stay as they are
        kept = np.where(np.isnan(rounded) | np.isnan(values), values, rounded)
        return kept.astype(values.dtype, copy=False)
    raise ValueError(f"no rounding to {dtype.name}")


def stored(dtype: DType, values: np.ndarray) -> np.ndarray:
    """float32 `values` as memory of `dtype` holds them: an array of its numpy type (a bf16 number's bits
    as uint16), contiguous, to copy to the GPU."""
    values = np.ascontiguousarray(values, np.float32)
    if dtype == FLOAT32:
        return values
    if dtype == FLOAT16:
        return values.astype(np.float16)
    if dtype == BFLOAT16:
        return (round_to(BFLOAT16, values).view(np.uint32) >> 16).astype(np.uint16)
    raise ValueError(f"no storage as {dtype.name}")


def bits(dtype: DType, value: float) -> int:
    """The bits of one `value` as memory of `dtype` holds it (what a memset of the type's width writes)."""
    return int(stored(dtype, np.array([value], np.float32)).view(np.uint32 if dtype.itemsize == 4
                                                                  else np.uint16)[0])


def loaded(dtype: DType, memory: np.ndarray) -> np.ndarray:
    """What `stored` made (copied back from the GPU) as float32 values."""
    if dtype == BFLOAT16:
        return (memory.astype(np.uint32) << 16).view(np.float32)
    return memory.astype(np.float32, copy=False)
