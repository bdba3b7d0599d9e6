"""A hoisted GEMM's sums left scaled for the persistent kernel that reads them.

On tensor cores a float32 GEMM outside the loop multiplies copies of its operands scaled by a power of two
per row of A and per column of W (gemm_routes), and a pass after it undoes the scales: it reads and writes
the whole output (the LSTM's input projection at T=100, B=64: 52 MB each way, 42 of the forward pass's
628 us on an H200). Where a persistent kernel is that output's only reader, the pass is left out and the
kernel undoes each value's two scales as it loads it (f16x3.cuh's cf_f16x3_unscaled, the pass's own
arithmetic), from the largest magnitudes the GEMM's splits found, which stay where the GEMM left them.
Where the warpgroup GEMM runs the shape instead (measured faster, against the copies without their
pass), its sums are values, and the kernel is given null for their maxima.

Only in a plan that saves no steps: a backward pass reads the hoisted outputs too. Only the last GEMM on
tensor cores of a layer's prologue: the next one's splits would write over the row maxima. Only where
every read of the output is an elementwise load of the kernel at its own step (not a block per row's,
nor a GEMM's operand), and only in a kernel with a GEMM of its own: there the values are loaded a step
ahead, beside their rows' maxima, and unscaled as the step uses them (persistent_cuda.elementwise); a
kernel of elementwise work alone (IndRNN's) loads chunks of steps at once, which unscaled as they came
took IndRNN's forward at B=64 on an H200 from 0.047 to 0.073 ms (its GEMM's pass, the warpgroup GEMM's
epilogue there, costs less).
"""

from __future__ import annotations

from dataclasses import replace

from .dtypes import FLOAT32
from .gemm_routes import route
from .persistent import reads, writes
from .plan import GemmLaunch, KernelLaunch, LayerPlan, Plan


def with_scaled_sums(plan: Plan) -> Plan:
    """The plan with each persistent layer's `scaled` set where its prologue's GEMM may leave its sums
    scaled (see the module's docstring)."""
    if plan.saves_steps or not any(lp.persistent for lp in plan.layers):
        return plan
    return replace(plan, layers=[_layer(lp, plan) for lp in plan.layers])


def _layer(lp: LayerPlan, plan: Plan) -> LayerPlan:
    if lp.persistent is None or not any(isinstance(item.launch, GemmLaunch) for item in lp.persistent.items):
        return lp
    on_tensor_cores = [launch for launch in lp.prologue if isinstance(launch, GemmLaunch)
                       and route(launch, launch.m).startswith("f16x3")]
    if not on_tensor_cores:
        return lp
    g = on_tensor_cores[-1]
    if g.bias or g.accumulate or g.multiply != FLOAT32 or g.c.dtype != FLOAT32 or not _read_as_own(
            g.c.buffer, lp, plan):
        return lp
    return replace(lp, persistent=replace(lp.persistent, scaled=(g.c.buffer,)))


def _read_as_own(buffer: str, lp: LayerPlan, plan: Plan) -> bool:
    """Whether the layer's persistent kernel alone reads `buffer`, each read an elementwise load of a row
    of the step, and nothing but its GEMM writes it."""
    items = lp.persistent.items
    for other in plan.layers:
        launches = [*other.prologue, *(other.step if other.persistent is None else ())]
        if any(buffer in reads(launch) for launch in launches):
            return False
        if sum(buffer in writes(launch) for launch in other.prologue) > (other is lp):
            return False
    for item in items:
        launch = item.launch
        if buffer in writes(launch):
            return False
        if buffer not in reads(launch):
            continue
        if not isinstance(launch, KernelLaunch) or item.whole or item.by_rows:
            return False
        if any(acc.buffer == buffer and (acc.kind != "row" or acc.slot != "t" or acc.block)
               for _, acc in launch.inputs):
            return False
    return True
