"""How fast a plan could run on a GPU: the time its arithmetic alone would take at the GPU's peak, the time
its bytes alone would take at the memory's peak bandwidth, and the time of its per-step synchronisation
alone, beside which a measured time says what is left (`bench` records it for every schedule it times on
a GPU, from the GPU's attributes; `cellfuse plan` says it at an H100 SXM's published peaks).

The arithmetic: every GEMM's 2 m n k and one operation per element of each elementwise op (the plan's counts,
`Plan.flops_per_step` and the hoisted GEMMs), over T steps and every layer (and direction); a hoisted GEMM
that runs on tensor cores, or a persistent kernel's, at a third of the dense fp16 peak (three fp16 products
per float32 one), a
GEMM of a 16-bit plan at the dense bf16/fp16 peak, the rest at float32's. The bytes: what each launch reads
and writes in global memory as `Plan.bytes_per_step` counts them (a persistent kernel's weights kept on chip
read once), at the HBM's peak; values that pass between a persistent kernel's blocks through L2 are not
counted. The synchronisation: each step waits for the step before it across the whole GPU: a persistent step
once per barrier it has (at least one; none where its blocks never wait for each other, as IndRNN's), a step
of separate launches once per launch (each kernel boundary is at least a grid-wide barrier); GRID_BARRIER_S
each, as measured for cooperative groups' grid.sync() on an H200 (0.97 us) and an H100 (1.1 us):
benchmarks/results/h200_2026-11-25_probes.txt, docs/results/2026-11-23-persistent-and-wavefront-rungs.md.
The three add up to no faster than max(arithmetic, bytes) + synchronisation, `bound_ms`.

The peaks are the GPU's at its highest clock, from its SM count, clock and memory interface
(`Peaks.of_device`): per SM and clock, float32 256 operations (128 FMA units) and bf16/fp16 4096 (dense)
on compute capability 9.0; 256 (128 on 8.0) and 2048 on 8.x.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .gemm_routes import may_run_on_tensor_cores
from .plan import GemmLaunch, KernelLaunch, LayerPlan, Plan

GRID_BARRIER_S = 1.0e-6
# float32 and dense bf16/fp16 operations per SM per clock, by compute capability (major, minor)
_PER_SM_CLOCK = {(9, 0): (256, 4096), (8, 0): (128, 2048), (8, 6): (256, 2048), (8, 9): (256, 2048)}


@dataclass(frozen=True)
class Peaks:
    name: str
    fp32_flops: float  # per second
    memory_bytes: float  # per second
    sixteen_bit_flops: float  # bf16 or fp16 products on tensor cores (dense), per second

    @staticmethod
    def of_device(name: str, capability: tuple[int, int], sms: int, clock_khz: int, memory_clock_khz: int,
                  bus_bits: int) -> Peaks | None:
        """A GPU's peaks from its attributes; None where its compute capability is not in the table."""
        per_clock = _PER_SM_CLOCK.get(tuple(capability))
        if per_clock is None or not (sms and clock_khz and memory_clock_khz and bus_bits):
            return None
        fp32, sixteen = per_clock
        hz = clock_khz * 1e3
        return Peaks(name, sms * fp32 * hz, memory_clock_khz * 1e3 * 2 * bus_bits / 8, sms * sixteen * hz)


# NVIDIA's published figures: float32 66.9 TFLOP/s and dense bf16/fp16 989.4 TFLOP/s, HBM 3.35 TB/s on the
# H100 SXM, 4.8 TB/s on the H200 (the same SMs and clocks)
H100_SXM = Peaks("H100 SXM", 66.9e12, 3.35e12, 989.4e12)
PUBLISHED = {"H100 80GB HBM3": H100_SXM, "H200": Peaks("H200", 66.9e12, 4.8e12, 989.4e12)}


@dataclass(frozen=True)
class Roofline:
    arithmetic_ms: float
    memory_ms: float
    sync_ms: float

    @property
    def bound_ms(self) -> float:
        return max(self.arithmetic_ms, self.memory_ms) + self.sync_ms

    def to_json(self) -> dict[str, float]:
        return {**asdict(self), "bound_ms": self.bound_ms}

    def text(self) -> str:
        return (f"arithmetic {self.arithmetic_ms:.3f} ms, bytes {self.memory_ms:.3f} ms, synchronisation "
                f"{self.sync_ms:.3f} ms: at least {self.bound_ms:.3f} ms")


def _float32_rate(layer: LayerPlan, launch: GemmLaunch, peaks: Peaks, in_step: bool) -> float:
    """Float32 operations per second of a float32 GEMM: a step's where the persistent kernel multiplies
    with mma as three fp16 products each (a third of fp16's rate), a hoisted one's as three fp16 products
    where it may run on tensor cores, float32's otherwise."""
    if in_step:
        items = layer.persistent.items if layer.persistent is not None else ()
        on_cores = any(item.launch is launch and item.mma for item in items)
        return peaks.sixteen_bit_flops / 3 if on_cores else peaks.fp32_flops
    return peaks.sixteen_bit_flops / 3 if may_run_on_tensor_cores(launch) else peaks.fp32_flops


def _flops_seconds(layer: LayerPlan, launches, peaks: Peaks, in_step: bool) -> float:
    seconds = 0.0
    for launch in launches:
        match launch:
            case GemmLaunch() if launch.multiply.itemsize == 2:
                seconds += launch.flops / peaks.sixteen_bit_flops
            case GemmLaunch():
                seconds += launch.flops / _float32_rate(layer, launch, peaks, in_step)
            case KernelLaunch():
                seconds += launch.rows * launch.width * len(launch.body) / peaks.fp32_flops
    return seconds


def _prologue_bytes(plan: Plan, launches) -> int:
    """What the hoisted launches read and write: a GEMM's A, W, C (and the bias), a kernel's rows."""
    total = 0
    for launch in launches:
        if isinstance(launch, KernelLaunch):
            total += launch.rows * launch.width * sum(acc.dtype.itemsize for _, acc in
                                                      (*launch.inputs, *launch.outputs) if acc.kind == "row")
        elif isinstance(launch, GemmLaunch):
            total += (launch.m * launch.k * launch.a.dtype.itemsize
                      + launch.m * launch.n * launch.c.dtype.itemsize
                      + launch.k * launch.n * plan.buffers[launch.w].dtype.itemsize)
            if launch.bias:
                total += launch.n * plan.buffers[launch.bias].dtype.itemsize
    return total


def roofline(plan: Plan, peaks: Peaks, directions: int = 1) -> Roofline:
    """The plan's roofline on a GPU of these peaks (both directions of it side by side, with 2)."""
    T = plan.sizes.seq
    arithmetic = memory = sync = 0.0
    for layer in plan.layers:
        arithmetic += _flops_seconds(layer, layer.prologue, peaks, in_step=False)
        arithmetic += T * _flops_seconds(layer, layer.step, peaks, in_step=True)
        memory += _prologue_bytes(plan, layer.prologue) / peaks.memory_bytes
        persistent = layer.persistent
        if persistent is None:
            waits = len(layer.step)
        elif persistent.cooperative:  # its grid-wide barriers and waits for values in an exchange
            waits = max(1, persistent.waits_per_step)
        else:  # blocks that never wait for each other (IndRNN's): no step waits for the whole GPU
            waits = 0
        sync += T * waits * GRID_BARRIER_S
    memory += T * len(plan.layers) * plan.bytes_per_step() / peaks.memory_bytes
    return Roofline(1e3 * directions * arithmetic, 1e3 * directions * memory, 1e3 * sync)
