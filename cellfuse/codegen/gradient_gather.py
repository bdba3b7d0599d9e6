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
    """A rows x width block of output `out`, element (r, c) at `start` + r * width + c (or, with `strides`
    (row, column), at `start` + r * row + c * column: a block of a parameter's gradient that the weights
    read transposed, say): the sum of each source's (r, c)."""

    out: int
    start: int
    rows: int
    width: int
    sources: tuple[Source, ...]
    strides: tuple[int, int] | None = None

    @property
    def elements(self) -> int:
        return self.rows * self.width

    def place(self) -> str:
        """The kernel's declarations of r and col from k, the element's index: in the order of the output's
        elements where a row's are not next to each other in it (so that the stores are coalesced)."""
        rs, cs = self.strides or (self.width, 1)
        if cs != 1 and rs == 1:
            return f"col = k / {self.rows}, r = k - col * {self.rows}"
        return f"r = k / {self.width}, col = k - r * {self.width}"

    def target(self) -> str:
        """The index of the element's place in the output."""
        if self.strides is None:
            return f"{self.start}LL + k"
        rs, cs = self.strides
        return f"{self.start}LL + r * {rs}LL + " + ("col" if cs == 1 else f"col * {cs}LL")


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
        store = types.get(g.out, FLOAT32).store(terms)
        segments.append((g.elements, g.place(), [f"o{g.out}[{g.target()}] = {store};"]))
    return "".join(f"#include <{h}>\n" for h in headers) + segment_kernel(
        f'extern "C" __global__ void {GATHER_KERNEL}(const char* __restrict__ memory, {pointers})', segments)


def total_elements(gathers: Sequence[Gather]) -> int:
    """The elements the kernel writes: a thread's work each (kernel_abi.grid_blocks of it)."""
    return sum(g.elements for g in gathers)
