"""From a cell to a Plan for the whole sequence (the scheduler) and to CUDA C (the emitters).
Produces data and text only: no GPU, no Qt."""

from .cuda_export import CudaSource, emit, generate_cuda
from .kernel_set import KernelSet, plan_kernels
from .plan import Access, Buffer, GemmGroup, GemmLaunch, Island, KernelLaunch, LayerPlan, Plan
from .scheduler import SCHEDULES, make_plan

__all__ = ["CudaSource", "emit", "generate_cuda", "KernelSet", "plan_kernels", "Access", "Buffer",
           "GemmGroup", "GemmLaunch", "Island", "KernelLaunch", "LayerPlan", "Plan", "SCHEDULES", "make_plan"]
