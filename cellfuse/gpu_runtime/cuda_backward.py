"""The backward pass of a CUDA executor's forward run: the backward Plan's launches on the GPU, reading the
forward run's saved buffers where they are, in the types they are stored in (the gradients it returns
float32; a 16-bit plan's see `backward_plan`).

    forward = CudaExecutor(make_plan(cell, sizes, schedule, device_target(), save_steps=True), params)
    out = forward.run(x, initial)
    grads = CudaBackward(forward).run(dy, dfinal)  # graph_model.Gradients: dx, dinitial, dparams

The gradient buffers, the adjoint kernels and the persistent kernels of reverse loops that run as one
(see `backward_plan`) join the forward executor's tables of addresses and kernels
(`CudaExecutor.add_kernels`; it unloads them when it closes), so that its one way of putting an
instruction on a stream (cuBLAS with the GEMM's transposes and beta, the kernels with their pointers at
step t, the cooperative launches) runs the backward program too. Where the forward plan runs from a CUDA
graph (the `graph`, `wavefront`, `persistent` and `tensor` rungs), so does the backward program, captured
at its first run: launched one by one from Python, its two launches a step would cost more host time than
the GPU spends on them (docs/results/2026-11-23-training.md).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..codegen.backward_plan import BackwardPlan, backward_plan
from ..codegen.dtypes import bits
from ..codegen.kernel_set import backward_kernels
from ..graph_model import CellError, Gradients
from .cuda_executor import _CUBLAS_WORKSPACE, CudaExecutor, aligned_offsets, compiled_kernels, split_bytes


class CudaBackward:
    """Device gradient buffers for a forward executor's plan (allocated once) and the backward program's
    launches. `run` reads what the executor's last forward run saved."""

    def __init__(self, forward: CudaExecutor):
        drv = forward.drv
        self.forward = forward
        self.plan: BackwardPlan = backward_plan(forward.plan)
        forward.add_kernels(*compiled_kernels(backward_kernels(self.plan)))

        sizes = {name: b.nbytes(forward.plan.sizes) for name, b in self.plan.buffers.items()}
        instructions = self.plan.instructions()
        splits = split_bytes(instructions, len(forward.streams))
        # Every gradient buffer in one span, those a run restarts (`BackwardPlan.restarted`) first, in
        # its first `restart_nbytes`: a copy of that part puts a seeded state back.
        order = sorted(sizes, key=lambda name: not self.plan.restarted(name))
        offsets, need = aligned_offsets([*(sizes[name] for name in order), *splits])
        free, _ = drv.mem_get_info()
        if need + _CUBLAS_WORKSPACE > free:
            raise CellError(f"out of GPU memory: the backward pass at these sizes needs {need / 2**20:.0f} "
                            f"MiB more, {free / 2**20:.0f} MiB are free")
        self.memory = drv.mem_alloc(need)
        restarted = sum(self.plan.restarted(name) for name in order)
        self.restart_nbytes = offsets[restarted] if restarted < len(offsets) else need
        at = [int(self.memory) + offset for offset in offsets]
        forward.addr.update(zip(order, at[:len(order)], strict=True))
        self.splits = at[len(order):]  # per stream, room for the operands of its GEMMs on tensor cores
        self.calls = [call for instr in instructions for call in forward._calls(instr, 0, None, self.splits)]
        self.graph_exec = None

    def capture_graph(self) -> None:
        """Captures one backward pass into a CUDA graph, which `enqueue` replays."""
        self.graph_exec = self.forward.capture(self.calls)

    def enqueue(self) -> None:
        """Puts one backward pass on the forward executor's streams: from its CUDA graph where the forward
        plan has one (captured at the first call), else launch by launch."""
        if not self.forward.plan.cuda_graph:
            for call in self.calls:
                call()
            return
        if self.graph_exec is None:
            self.capture_graph()
        self.forward.replay(self.graph_exec)

    def seed(self, dy: np.ndarray, dfinal: Mapping[str, np.ndarray] | None = None) -> None:
        """Puts the gradient buffers in the state a backward run starts from: the seeds, zeros elsewhere
        (every backward launch adds into its buffers), the ones; raises CellError for a seed that does
        not fit."""
        drv, addr = self.forward.drv, self.forward.addr
        seeds = self.plan.seeds(dy, dfinal, np.float32)  # (seeded buffers are float32: see backward_plan)
        for name, b in self.plan.buffers.items():
            if name in seeds:
                drv.memcpy_htod(addr[name], seeds[name])
            else:  # memset writes the value's bits in the buffer's type
                memset = drv.memset_d32 if b.dtype.itemsize == 4 else drv.memset_d16
                value = bits(b.dtype, self.plan.start_value(name))
                memset(addr[name], value, self.plan.buffer_elements(name))
        # These ran on the legacy default stream, which the executor's non-blocking streams do not wait for.
        drv.Context.synchronize()

    def run(self, dy: np.ndarray, dfinal: Mapping[str, np.ndarray] | None = None) -> Gradients:
        """The gradients of sum(dy * y) + sum(dfinal[s] * final[s]) for the forward run, float32 (see
        BackwardPlan.seeds for the seeds); raises CellError for a seed that does not fit."""
        drv, addr = self.forward.drv, self.forward.addr
        self.seed(dy, dfinal)
        self.enqueue()
        self.forward.stream.synchronize()

        def read(name: str) -> np.ndarray:
            out = np.empty(self.plan.buffer_elements(name), np.float32)
            drv.memcpy_dtoh(out, addr[name])
            return out

        return self.plan.gradients(read)

    def close(self) -> None:
        if self.graph_exec is not None:
            self.forward.release(self.graph_exec)
        self.memory.free()
