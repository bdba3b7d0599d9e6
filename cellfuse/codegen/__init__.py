"""From a cell to a Plan for the whole sequence (the scheduler) and to CUDA C (the emitters).
Produces data and text only: no GPU, no Qt."""

from ..graph_model import Cell, Sizes
from .backward_plan import backward_plan
from .cuda_export import CudaSource, emit
from .kernel_set import KernelSet, plan_kernels
from .plan import Access, Buffer, GemmGroup, GemmLaunch, Island, KernelLaunch, LayerPlan, Plan
from .scheduler import SCHEDULES, make_plan


def generate_cuda(cell: Cell, sizes: Sizes, schedule: str = "hoisted", backward: bool = False) -> CudaSource:
    """The self-contained .cu of a cell for one schedule (see `cuda_export`); with `backward`, its forward
    pass saves every step and a backward launcher follows it."""
    plan = make_plan(cell, sizes, schedule, save_steps=backward)
    return emit(plan, backward_plan(plan) if backward else None)


__all__ = ["CudaSource", "emit", "generate_cuda", "KernelSet", "plan_kernels", "Access", "Buffer",
           "GemmGroup", "GemmLaunch", "Island", "KernelLaunch", "LayerPlan", "Plan", "SCHEDULES", "make_plan"]
