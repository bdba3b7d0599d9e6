"""The element types a plan's buffers are stored in. Every kernel computes in float32 (elementwise math,
GEMM accumulation); a buffer of another type converts as it is loaded and stored. Each type is one entry
of `DTYPES`: its C type, its size, its numpy type and those two conversions, so that the emitters ask
for them instead of writing `float`, and a new storage type is an addition to the table."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str
    c: str  # the C type of an element in memory
    itemsize: int  # bytes
    numpy: str  # the numpy dtype of the same bits
    load_as: str = "{}"  # C: an element in memory (the {}) as the float32 kernels compute in
    store_as: str = "{}"  # C: a float32 value (the {}) as an element in memory

    def load(self, element: str) -> str:
        return self.load_as.format(element)

    def store(self, value: str) -> str:
        return self.store_as.format(value)


FLOAT32 = DType("float32", "float", 4, "float32")
DTYPES = {t.name: t for t in (FLOAT32,)}

# What kernels compute in: their registers, shared memory and accumulators
COMPUTE = FLOAT32
