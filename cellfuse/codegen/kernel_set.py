"""The kernels a Plan needs: the fused elementwise kernels of its launches and the persistent kernel of each
persistent layer, each distinct source once, named after the cell."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, replace

from .backward_plan import BackwardPlan
from .c_text import c_name, c_stem
from .cuda_kernels import PRELUDE, elementwise_kernel_source, reduces_rows
from .cuda_rows import reduction_kernel_source
from .dtypes import FLOAT32
from .kernel_abi import check_index_range
from .persistent_cuda import MMA16_PRELUDE, PERSISTENT_PRELUDE, persistent_source
from .plan import GemmLaunch, KernelLaunch, PersistentLaunch, Plan
from .tiling import FRAGMENT_REGISTERS


@dataclass
class KernelSet:
    """The distinct kernels of a plan, and which kernel each kernel launch and persistent launch uses."""

    sources: dict[str, str]  # kernel name -> source
    name_of: dict[KernelLaunch | PersistentLaunch, str]  # launch -> kernel name

    by_body: dict[str, str] = field(default_factory=dict, repr=False)  # source with @NAME@ -> kernel name

    def add(self, launch: KernelLaunch | PersistentLaunch, body: str, name: str) -> None:
        """A launch of the kernel `body` (its name written @NAME@): named `name`, or the name of the same
        body added before."""
        if body not in self.by_body:
            self.by_body[body] = name
            self.sources[name] = body.replace("@NAME@", name)
        self.name_of[launch] = self.by_body[body]

    def persistent_launches(self) -> dict[str, PersistentLaunch]:
        """Each persistent kernel's name -> the first launch of it (a launch of every one the same)."""
        launches: dict[str, PersistentLaunch] = {}
        for launch, name in self.name_of.items():
            if isinstance(launch, PersistentLaunch):
                launches.setdefault(name, launch)
        return launches

    def rewritten(self, names: Collection[str], k_unroll: int = 0,
                  fragments: int = FRAGMENT_REGISTERS) -> KernelSet:
        """The same kernels, the persistent kernels `names` written with their GEMMs' loops over K
        unrolled `k_unroll` iterations at a time (see persistent_cuda.gemm_fma.k_loop_unroll) and at most
        `fragments` registers a thread for fragments of W (persistent_cuda.gemm_mma.fragments; 0: none)."""
        launches = self.persistent_launches()
        sources = dict(self.sources)
        for name in names:
            sources[name] = persistent_source(launches[name], name, k_unroll, fragments)
        return replace(self, sources=sources, name_of=dict(self.name_of), by_body=dict(self.by_body))

    def module_source(self) -> str:
        persistent = [launch for launch in self.name_of if isinstance(launch, PersistentLaunch)]
        accesses = [acc for launch in self.name_of if isinstance(launch, KernelLaunch)
                    for _, acc in (*launch.inputs, *launch.outputs)]
        accesses += [acc for launch in persistent for item in launch.items
                      if isinstance(item.launch, KernelLaunch)
                      for _, acc in (*item.launch.inputs, *item.launch.outputs)]
        headers = sorted({acc.dtype.header for acc in accesses} - {""})
        sixteen_bit = any(isinstance(item.launch, GemmLaunch) and item.launch.multiply != FLOAT32
                          for launch in persistent for item in launch.items)
        preludes = (PERSISTENT_PRELUDE if persistent else "") + (MMA16_PRELUDE if sixteen_bit else "")
        return ("".join(f"#include <{h}>\n" for h in headers) + preludes + PRELUDE + "\n"
                + "\n".join(self.sources.values()))


def kernel_source(launch: KernelLaunch, name: str) -> str:
    """The source of a fused kernel: a thread per element, or a block per row where it reduces rows."""
    if reduces_rows(launch):
        return reduction_kernel_source(launch, name)
    return elementwise_kernel_source(launch, name)


def plan_kernels(plan: Plan) -> KernelSet:
    """One kernel per distinct body: the layers above the first share layer 0's kernels where their sizes
    agree. Raises CellError for sizes whose counts the kernels cannot hold (see check_index_range)."""
    check_index_range(plan)
    stem = c_stem(plan.cell_name)
    kernels = KernelSet({}, {})
    add = kernels.add
    for lp in plan.layers:
        suffix = f"_l{lp.layer}" if lp.layer else ""
        launches = (*lp.prologue, *(() if lp.persistent else lp.step))
        for launch in launches:
            match launch:
                case KernelLaunch():
                    add(launch, kernel_source(launch, "@NAME@"), f"cf_{stem}_{c_name(launch.island)}{suffix}")
                case GemmLaunch():
                    pass  # cuBLAS runs it
                case _:
                    raise TypeError(f"unknown launch {launch!r}")
        if lp.persistent:
            add(lp.persistent, persistent_source(lp.persistent, "@NAME@"), f"cf_{stem}_persistent{suffix}")
    return kernels


def backward_kernels(plan: BackwardPlan) -> KernelSet:
    """The adjoint kernels of a backward plan and the persistent kernel of each layer whose reverse loop
    is one, each distinct source once (cuBLAS runs its other GEMMs). Its buffers and launches have the
    forward plan's sizes, which `check_index_range` of that plan bounds."""
    check_index_range(plan.forward)
    stem = c_stem(plan.forward.cell_name)
    kernels = KernelSet({}, {})
    for lb in plan.layers:
        suffix = f"_l{lb.layer}" if lb.layer else ""
        for launch in (*(() if lb.persistent else lb.step), *lb.after):
            if isinstance(launch, KernelLaunch):
                kernels.add(launch, kernel_source(launch, "@NAME@"),
                            f"cf_{stem}_{c_name(launch.island)}{suffix}")
        if lb.persistent:
            kernels.add(lb.persistent, persistent_source(lb.persistent, "@NAME@"),
                        f"cf_{stem}_persistent_backward{suffix}")
    return kernels
