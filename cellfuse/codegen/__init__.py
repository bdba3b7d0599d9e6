"""From a cell to a Plan for the whole sequence (the scheduler) and to CUDA C (the emitters).
Produces data and text only: no GPU, no Qt."""

from .plan import Access, Buffer, GemmGroup, GemmLaunch, Island, KernelLaunch, LayerPlan, Plan
from .scheduler import SCHEDULES, make_plan

__all__ = ["Access", "Buffer", "GemmGroup", "GemmLaunch", "Island", "KernelLaunch", "LayerPlan", "Plan",
           "SCHEDULES", "make_plan"]
