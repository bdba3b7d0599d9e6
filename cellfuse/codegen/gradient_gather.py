"""One kernel that gathers a backward run's gradients out of its gradient buffers (the CUDA runner's end
of a backward pass): each parameter's into the grouped gradients a backward pass returns (a stacked
buffer's keys side by side in one tensor, every other key's own tensor), each initial state's into a
tensor of its own. Each output element is the sum of its sources' elements (a parameter
read by several launches has a part in each of their buffers).

Torch's ops did this a part at a time (a view, a slice and a copy or an addition of each part, a stack
per state): about 0.25 ms of host time a training step for the LSTM on an H200, more than the backward
pass's own launches, for kernels that take microseconds on the GPU
(docs/results/2026-11-29-the-step-gemm-on-warpgroup-instructions.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .dtypes import FLOAT32, DType
from .segment_kernel import segment_kernel

GATHER_KERNEL = "cf_gather"


@dataclass(frozen=True)
class Source:
    """A float32 `rows` x `width` block of the gradient memory: element (r, c) at byte `at` + 4 (r * `ld` +
    c)."""

    at: int
    ld: int


@dataclass(frozen=True)
class Gather:
    """Elements `start` .. `start` + rows * width of output `out` (float32, contiguous), element (r, c) at
    `start` + r * width + c: the sum of each source's (r, c)."""

    out: int
    start: int
    rows: int
    width: int
    sources: tuple[Source, ...]

    @property
    def elements(self) -> int:
        return self.rows * self.width


def gather_kernel_source(gathers: Sequence[Gather], types: Mapping[int, DType] | None = None) -> str:
    """`cf_gather(const char* memory, float* o0, float* o1, ...)`, an output per `out` index (0 up to the
    largest): a thread per element, the grid striding over all of them. `types`: the element types of
    outputs other than float32 (a 16-bit caller's initial states' gradients), each sum rounded to it as
    it is stored."""
    if not gathers or not all(g.sources for g in gathers):
        raise ValueError("a gathering kernel needs at least one gather, each with a source")
    types = types or {}
    outputs = 1 + max(g.out for g in gathers)
    headers = sorted({t.header for t in types.values()} - {""})
    pointers = ", ".join(f"{types.get(i, FLOAT32).c}* __restrict__ o{i}" for i in range(outputs))
    segments = []
    for g in gathers:
        terms = " + ".join(f"((const float*)(memory + {s.at}LL))[r * {s.ld}LL + col]" for s in g.sources)
        segments.append((g.elements, f"r = k / {g.width}, col = k - r * {g.width}",
                         [f"o{g.out}[{g.start}LL + k] = {types.get(g.out, FLOAT32).store(terms)};"]))
    return "".join(f"#include <{h}>\n" for h in headers) + segment_kernel(
        f'extern "C" __global__ void {GATHER_KERNEL}(const char* __restrict__ memory, {pointers})', segments)


def total_elements(gathers: Sequence[Gather]) -> int:
    """The elements the kernel writes: a thread's work each (kernel_abi.grid_blocks of it)."""
    return sum(g.elements for g in gathers)
