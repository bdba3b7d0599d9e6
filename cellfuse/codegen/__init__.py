"""From a cell to a Plan for the whole sequence (the scheduler) and to CUDA C (the emitters).
Produces data and text only: no GPU, no Qt."""

from collections.abc import Collection
from dataclasses import replace

from ..graph_model import Cell, CellError, Sizes
from .backward_plan import backward_plan
from .cuda_export import CudaSource, Fit, emit, has_exchanges
from .kernel_set import KernelSet, plan_kernels
from .plan import H100, Access, Buffer, GemmGroup, GemmLaunch, Island, KernelLaunch, LayerPlan, Plan
from .precision import Float32Only
from .scheduler import SCHEDULES, make_plan


def generate_cuda(cell: Cell, sizes: Sizes, schedule: str = "hoisted", backward: bool = False,
                  bidirectional: bool = False, precision: str = "fp32",
                  float32_states: Collection[str] | None = None, fit: Fit | None = None) -> CudaSource:
    """The self-contained .cu of a cell for one schedule (see `cuda_export`); with `backward`, its forward
    pass saves every step and a backward launcher follows it; with `bidirectional`, a launcher of one
    layer's two directions side by side follows the forward one (its persistent kernels planned for half
    of the SMs each, where they can run at once). In a 16-bit `precision` (keeping `float32_states` in
    float32; None: those that accumulate) the forward pass alone, of one direction, so far. The kernels
    as `fit` makes them where given (see cuda_export.Fit)."""
    if precision != "fp32":
        if bidirectional:
            raise Float32Only("--bidirectional exports float32 launchers only so far")
        if backward:
            raise Float32Only(f"--backward exports float32 launchers only so far: leave out --backward to "
                              f"export the forward pass in {precision}")
        return emit(make_plan(cell, sizes, schedule, precision=precision, float32_states=float32_states),
                    fit=fit)
    if bidirectional:
        if backward:
            raise CellError("--bidirectional exports the forward pass of both directions; a backward pass is "
                            "exported for one direction (leave out --bidirectional)")
        if sizes.layers != 1:
            raise CellError(f"--bidirectional exports one layer, not {sizes.layers}: a stack of "
                            "bidirectional layers runs through cellfuse.nn")
        plan = make_plan(cell, sizes, schedule, replace(H100, sm_count=H100.sm_count // 2))
        if not has_exchanges(plan):
            return emit(plan, bidirectional=True, fit=fit)
    plan = make_plan(cell, sizes, schedule, save_steps=backward)
    return emit(plan, backward_plan(plan) if backward else None, bidirectional, fit)


__all__ = ["CudaSource", "Fit", "emit", "generate_cuda", "KernelSet", "plan_kernels", "Access", "Buffer",
           "GemmGroup", "GemmLaunch", "Island", "KernelLaunch", "LayerPlan", "Plan", "SCHEDULES", "make_plan"]
