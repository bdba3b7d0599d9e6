"""The kernels a Plan needs: the fused elementwise kernels of its launches and the persistent kernel of each
persistent layer, each distinct source once, named after the cell."""

from __future__ import annotations

from dataclasses import dataclass

from .cuda_kernels import PRELUDE, c_name, c_stem, check_index_range, kernel_source
from .cuda_persistent import PERSISTENT_PRELUDE, persistent_source
from .plan import GemmLaunch, KernelLaunch, PersistentLaunch, Plan


@dataclass
class KernelSet:
    """The distinct kernels of a plan, and which kernel each kernel launch and persistent launch uses."""

    sources: dict[str, str]  # kernel name -> source
    name_of: dict[KernelLaunch | PersistentLaunch, str]  # launch -> kernel name

    def module_source(self) -> str:
        persistent = any(isinstance(launch, PersistentLaunch) for launch in self.name_of)
        return (PERSISTENT_PRELUDE if persistent else "") + PRELUDE + "\n" + "\n".join(self.sources.values())


def plan_kernels(plan: Plan) -> KernelSet:
    """One kernel per distinct body: the layers above the first share layer 0's kernels where their sizes
    agree. Raises CellError for sizes whose counts the kernels cannot hold (see check_index_range)."""
    check_index_range(plan)
    stem = c_stem(plan.cell_name)
    by_body: dict[str, str] = {}
    sources: dict[str, str] = {}
    name_of: dict[KernelLaunch | PersistentLaunch, str] = {}

    def add(launch: KernelLaunch | PersistentLaunch, body: str, name: str) -> None:
        if body not in by_body:
            by_body[body] = name
            sources[name] = body.replace("@NAME@", name)
        name_of[launch] = by_body[body]

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
    return KernelSet(sources, name_of)
