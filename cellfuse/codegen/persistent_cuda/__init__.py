"""CUDA C for a persistent launch: one kernel that runs every step of a layer (see `persistent` for the
plan it follows).

Block `blk` is column block `cb` of row group `rg` (see `PersistentItem`). Before its loop it copies its
columns of the recurrent weights into shared memory, transposed so that K is contiguous, padded with
zeros. Per step it first loads what the step's elementwise work reads and nothing in the step writes (the
hoisted GEMMs' rows of this step, biases, its own states), so that those loads fly while it waits at the
barrier; then it runs the step's launches in order. A GEMM stages its rows of the left operand, all of K,
with asynchronous copies through L2 (other blocks wrote them, and L1 is not coherent between SMs), and
keeps its output in shared memory where only its own elementwise work reads it; an elementwise launch
runs the body of the hoisted rung's fused kernel on the block's own elements. Where the plan waits for
other blocks, a cooperative-groups grid barrier (cheaper on an H100 than a barrier of acquire/release
atomics, measured with benchmarks/probes/barrier_probe.cu:
docs/results/2026-11-23-persistent-and-wavefront-rungs.md), or, where the plan passes the operand through
an exchange (`PersistentLaunch.exchange`), none before the GEMM: its writer (an elementwise launch, or a
block per row, whose device function publishes as it stores) also stores each value with its step's tag
in the exchange, and the GEMM stages its rows from there once their tags are the step's.

The parts, each a module: `skeleton` (the kernel from top to bottom), `shared_memory`, `elementwise`,
`exchange`, `staging`, `gemm_fma` (CUDA cores) and `gemm_mma` (tensor cores); `context` holds what they
all read.
"""

from ..cuda_library import cuda_library
from .context import persistent_buffers
from .skeleton import persistent_source

# What a persistent kernel's blocks share, at the top of a module with persistent kernels; and what those
# whose GEMMs multiply in 16 bits on tensor cores add.
PERSISTENT_PRELUDE = cuda_library("persistent.cuh")
MMA16_PRELUDE = cuda_library("mma16.cuh")

__all__ = ["MMA16_PRELUDE", "PERSISTENT_PRELUDE", "persistent_buffers", "persistent_source"]
