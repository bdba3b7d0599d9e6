"""A plan's precision: what its buffers are stored in, and what its GEMMs multiply in.

In float32 (`fp32`) every buffer is float32 and a GEMM multiplies in float32 (or, on tensor cores, each
product as three fp16 ones, to its accuracy).
In `bf16` or `fp16` the input, the weights, the outputs, the step values and the states are stored in
the 16-bit type, a GEMM multiplies 16-bit operands into float32 (accumulating in float32), and every
kernel computes in float32 as always, converting as it loads and stores. Some buffers stay float32:

- the states that accumulate over time (an LSTM's c, a GRU's h, sLSTM's n and m: a state the step adds
  something to, `accumulating_states`), with their initial and final values, unless the caller names
  the states to keep in float32 itself; a 16-bit state that adds small updates to itself every step loses
  them to rounding.
- the GEMMs' outputs (float32 accumulators that the next kernel reads; a bias added to them first), and
  the biases.
- the weights of a GEMM whose left operand is a float32 state: cuBLAS multiplies operands of one type,
  so that GEMM reads both in float32 and multiplies them on tensor cores with cuBLAS's "fast" compute
  type for the 16-bit type, at least as precisely as 16-bit operands (on an H200 as TF32 does, and at
  TF32's rate, a third of 16-bit operands': h200_2026-12-01_float32_operand_gemm_probe.txt of
  benchmarks/results). A persistent loop's GEMMs round such operands and weights to the 16-bit type as
  they multiply them (`_persistent_operands`): their outputs' gradients are 16-bit, and the weights'
  gradients multiply 16-bit copies of the operands (backward_plan.sixteen_bit_grads and
  sixteen_bit_operands). Where another GEMM multiplies the same weights by a 16-bit operand through
  cuBLAS, it reads a 16-bit copy of them (`_sixteen_bit_weight_copies`). A GEMM outside the loop (over
  all steps) never multiplies a float32 operand: it reads a 16-bit copy of it that a kernel before it
  makes (`_sixteen_bit_operand_copies`: an upper layer's input, where the outputs below are float32).

`with_precision` sets these types on a float32 plan: each Buffer's, then every Access's to its buffer's
and every GEMM's `multiply`, in one pass over the plan's launches (`retyped`, which the backward plan
uses too).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

from ..graph_model import Cell, CellError
from .dtypes import BFLOAT16, FLOAT16, FLOAT32, DType
from .plan import Access, Buffer, GemmLaunch, KernelLaunch, Launch, Plan

PRECISIONS: dict[str, DType] = {"fp32": FLOAT32, "bf16": BFLOAT16, "fp16": FLOAT16}

# What one rounding to a 16-bit type may change a number by, relative to it: half the spacing of its
# numbers at 1 (8 and 11 significant bits).
UNIT = {"bf16": 2.0**-8, "fp16": 2.0**-11}
# A 16-bit forward pass's largest error over its outputs and final states, relative to their largest
# magnitude, against the float64 reference, in units of its type's rounding: every template at T=20 and
# 100, two layers, emulated, came within 0.3 to 1.9 units (the residual LSTM's largest), so rounding does
# not compound over the steps; the bound allows twice that.
BOUND_UNITS = 4.0
FLOAT32_TOLERANCE = 1e-4  # the same for float32 (GEMMs on tensor cores and float32 GEMMs alike)
# A 16-bit backward pass's largest error over the gradients (of x, the initial states and every parameter),
# each relative to its own largest magnitude or `gradient_floor` of the largest of all gradients where that
# is more, in units of its type's rounding: every template at T=20, B=8, I=H=32, one and two layers, from
# zero states, emulated, came within 0.8 to 5.1 units (the layer-normalised LSTM's largest, in `naive`,
# where every node's value is stored rounded), PyTorch's own LSTM and GRU with bf16 weights and inputs
# within 1.7 and 2.5 on the same sizes; the bound allows twice the forward's. Except across a kink: where
# a pre-activation of relu lies within a rounding of 0, the 16-bit run takes the other side's derivative
# (IndRNN in bf16: 42 units), as any run in that precision would.
GRADIENT_BOUND_UNITS = 8.0
# Each gradient's error counts relative to its own largest value, or to a fraction of the largest of all
# gradients where that is more. In float32, so that an absolute error of one float32 rounding (2^-23) of
# the largest gradient passes FLOAT32_TOLERANCE whatever the gradient: a gradient that float32 rounds to 0
# (a saturated sigmoid's derivative) or that is 0 in exact arithmetic (the sLSTM's input-gate bias: its
# output is the same for any common shift of the input gate's pre-activations) comes out of float32's sums
# over every step and row as rounding noise, which is not an error of 1. In 16 bits, gradients a hundred
# times smaller than the largest carry its rounding, not their own.
FLOAT32_GRADIENT_FLOOR = 2.0**-23 / FLOAT32_TOLERANCE
SIXTEEN_BIT_GRADIENT_FLOOR = 1e-2


class Float32Only(CellError):
    """A plan asked for in a 16-bit precision that its rung (or pass) runs in float32 only so far: not a
    fault of the cell or its sizes, which callers that try every rung (the benchmark) leave out."""


def forward_tolerance(precision: str) -> float:
    """The relative error a forward pass in `precision` is allowed against the float64 reference."""
    return FLOAT32_TOLERANCE if precision == "fp32" else BOUND_UNITS * UNIT[precision]


def gradient_floor(precision: str) -> float:
    """The fraction of the largest gradient that each gradient's error counts relative to at least."""
    return FLOAT32_GRADIENT_FLOOR if precision == "fp32" else SIXTEEN_BIT_GRADIENT_FLOOR


def gradient_tolerance(precision: str) -> float:
    """The relative error a 16-bit backward pass's gradients are allowed against the float64 reference
    (see GRADIENT_BOUND_UNITS; float32's is its forward's)."""
    return FLOAT32_TOLERANCE if precision == "fp32" else GRADIENT_BOUND_UNITS * UNIT[precision]


# Ops through which a state's value passes on into its update as a share of itself, not squashed or
# multiplied by a weight: a path of these from a state to its update, through an add or sub, is the state
# added to itself.
_CARRYING = {"add", "sub", "mul", "neg", "max", "min"}
_ADDING = {"add", "sub"}

_SIXTEEN_BIT_ROLES = {"input", "init", "final", "output", "state", "value", "weight", "stacked"}


def check_precision(precision: str) -> DType:
    if precision not in PRECISIONS:
        raise CellError(f"unknown precision {precision!r} (precisions: {', '.join(PRECISIONS)})")
    return PRECISIONS[precision]


def accumulating_states(cell: Cell) -> set[str]:
    """The states whose update is the state plus something: reached from the state node through
    `_CARRYING` ops alone, at least one of them adding."""
    nodes = cell.by_id()
    out = set()
    for state, update in cell.updates.items():
        # from the update back to the state: (node, whether an adding op was passed)
        stack, seen = [(update, False)], set()
        while stack:
            node_id, added = stack.pop()
            if (node_id, added) in seen:
                continue
            seen.add((node_id, added))
            node = nodes[node_id]
            if node_id == state:
                if added:
                    out.add(state)
                    break
                continue
            if node.op in _CARRYING:
                stack.extend((a, added or node.op in _ADDING) for a in node.args)
    return out


def with_precision(plan: Plan, cell: Cell, precision: str, float32_states: Collection[str] | None = None
                   ) -> Plan:
    """The float32 `plan` of `cell` in `precision` (see the module's doc). `float32_states`: the states kept
    in float32 (None: those that accumulate)."""
    dtype = check_precision(precision)
    if dtype == FLOAT32:
        return plan
    keep = accumulating_states(cell) if float32_states is None else set(float32_states)
    unknown = keep - set(plan.state_ids)
    if unknown:
        raise CellError(f"float32 states {sorted(unknown)} are not states of cell '{cell.name}' "
                        f"(its states: {', '.join(plan.state_ids)})")
    operands = _persistent_operands(plan, precision)
    keep |= {s for s in plan.state_ids if any(lp.state_read[s].buffer in operands for lp in plan.layers)}
    dtypes = {name: dtype if b.role in _SIXTEEN_BIT_ROLES and name not in operands else FLOAT32
              for name, b in plan.buffers.items()}
    for s in keep:
        dtypes[f"init.{s}"] = dtypes[f"final.{s}"] = FLOAT32
        for lp in plan.layers:  # a state that lives in the output sequence takes the outputs with it
            dtypes[lp.state_read[s].buffer] = FLOAT32
    plan = _sixteen_bit_operand_copies(plan, dtypes, dtype)
    for g in _gemms(plan):
        if dtypes[g.a.buffer] == FLOAT32:
            dtypes[g.w] = FLOAT32
    plan = _sixteen_bit_weight_copies(plan, dtypes, dtype)
    return dataclasses.replace(retyped(plan, dtypes, dtype), precision=precision,
                               buffers={name: dataclasses.replace(b, dtype=dtypes[name])
                                        for name, b in plan.buffers.items()})


def _sixteen_bit_operand_copies(plan: Plan, dtypes: dict[str, DType], dtype: DType) -> Plan:
    """`plan` with each GEMM of a prologue (outside the loop, over all steps) whose operand is float32 (the
    layer below's outputs where they are a float32 state's sequence, a GRU's h, or a persistent loop's
    operand) multiplying a copy of it in the 16-bit type instead, which a kernel before it in the
    prologue makes (a buffer of its own, added to `dtypes`), and its weights with it: cuBLAS multiplies
    float32 operands at a third of the rate of 16-bit ones (the LSTM's x @ W at B=64 on an H200: 0.123
    ms as three fp16 products, 0.039 in bf16; converting the operand, 0.017). The copy rounds the layer's
    input once, as the first layer's x is rounded."""
    buffers, layers = dict(plan.buffers), []
    for lp in plan.layers:
        prologue: list[Launch] = []
        made: dict[Access, Access] = {}
        for g in lp.prologue:
            if not isinstance(g, GemmLaunch) or dtypes[g.a.buffer] != FLOAT32:
                prologue.append(g)
                continue
            into = made.get((g.a, g.k))
            if into is None:
                stored = plan.buffers[g.a.buffer].width
                buffer, kernel = sixteen_bit_copy(g.a, g.m, g.k, stored, dtype, "value")
                buffers[buffer.name], dtypes[buffer.name] = buffer, dtype
                prologue.append(kernel)
                into = made[g.a, g.k] = kernel.outputs[0][1]
            prologue.append(dataclasses.replace(g, a=into))
        layers.append(dataclasses.replace(lp, prologue=prologue))
    return dataclasses.replace(plan, layers=layers, buffers=buffers)


def sixteen_bit_copy(acc: Access, rows: int, width: int, stored: int, dtype: DType, role: str
                     ) -> tuple[Buffer, KernelLaunch]:
    """A copy in `dtype` of `rows` rows and `width` columns of the buffer `acc` reads (`stored` columns
    wide), from the step `acc` starts at on (a layer's copy of its own steps), and the kernel that stores
    it (its output's access: where a GEMM reads the copy): a buffer of `role` named by the columns where
    it copies some of them (GEMMs over two matmuls' columns of one output)."""
    cols = "" if (acc.col, width) == (0, stored) else f".cols{acc.col}-{acc.col + width}"
    name = f"{acc.buffer}{cols}.{acc.slot}.{dtype.name}"
    into = Access(name, "row", width, slot="all")
    return (Buffer(name, "seq", width, role, dtype=dtype),
            KernelLaunch(f"{acc.buffer}{cols} in {dtype.name}", "seq", rows, width, ((name, acc),),
                         ((name, into),), (), hoisted=True))


def _sixteen_bit_weight_copies(plan: Plan, dtypes: dict[str, DType], dtype: DType) -> Plan:
    """`plan` with each cuBLAS GEMM of a 16-bit operand whose weights are float32 (a weight that another
    GEMM multiplies by a float32 operand, a state's, say) reading a copy of them in the 16-bit type
    instead: a weight buffer of its own, made from the same parameter (whose gradient then adds up the
    gradients of both: Plan.param_parts), added to `dtypes`. cuBLAS multiplies operands of one type; a
    persistent loop's GEMM, which rounds its weights as it loads them, needs none."""
    copies: dict[str, str] = {}
    for lp in plan.layers:
        for g in (*lp.prologue, *(() if lp.persistent else lp.step)):
            if (isinstance(g, GemmLaunch) and dtypes[g.a.buffer] != FLOAT32 and dtypes[g.w] == FLOAT32
                    and plan.buffers[g.w].role == "weight"):
                copies[g.w] = f"{g.w}.{dtype.name}"
                dtypes[copies[g.w]] = dtype
    if not copies:
        return plan

    def copied(launches: list[Launch]) -> list[Launch]:
        return [dataclasses.replace(g, w=copies[g.w])
                if isinstance(g, GemmLaunch) and g.w in copies and dtypes[g.a.buffer] != FLOAT32 else g
                for g in launches]

    buffers = dict(plan.buffers)
    for name, copy in copies.items():
        buffers[copy] = dataclasses.replace(buffers[name], name=copy)
    layers = [dataclasses.replace(lp, prologue=copied(lp.prologue),
                                  step=lp.step if lp.persistent else copied(lp.step)) for lp in plan.layers]
    return dataclasses.replace(plan, layers=layers, buffers=buffers)


def _persistent_operands(plan: Plan, precision: str) -> set[str]:
    """The buffers a persistent kernel's GEMMs read as their left operand, kept float32: the kernels
    stage them in float32 and round them as they multiply them (on tensor cores as they take them into
    registers, on the CUDA cores as they stage them; the weights as they load them into shared memory).
    Only where the weights are on chip: weights read from L2 at every step are not rounded."""
    if plan.target is None:
        return set()
    operands = set()
    for lp in plan.layers:
        for item in lp.persistent.items:
            if isinstance(item.launch, GemmLaunch):
                if not (item.mma or item.on_chip):
                    raise Float32Only(f"the weights of {item.launch.group} do not fit on chip at hidden size "
                                      f"{plan.sizes.hidden}: its GEMM would read them from L2 at every step, "
                                      f"in float32; in {precision} the rungs up to 'wavefront' run it")
                operands.add(item.launch.a.buffer)
    return operands


def _gemms(plan: Plan):
    for lp in plan.layers:
        for launch in (*lp.prologue, *lp.step):
            if isinstance(launch, GemmLaunch):
                yield launch


def retyped(value, dtypes: dict[str, DType], multiply: DType):
    """`value` with every Access in it (through dataclasses, lists, tuples and dicts) given its buffer's
    type and every GEMM launch multiplying in `multiply`; the same object where nothing in it changes."""
    if isinstance(value, Access):
        dtype = dtypes.get(value.buffer, value.dtype)
        return value if dtype == value.dtype else dataclasses.replace(value, dtype=dtype)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = ({"multiply": multiply, "w_dtype": dtypes.get(value.w, value.w_dtype)}
                   if isinstance(value, GemmLaunch) else {})
        for f in dataclasses.fields(value):
            if f.init:
                old = getattr(value, f.name)
                new = retyped(old, dtypes, multiply)
                if new is not old:
                    changes[f.name] = new
        return dataclasses.replace(value, **changes) if changes else value
    if isinstance(value, (list, tuple)):
        items = [retyped(v, dtypes, multiply) for v in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, dict):
        items = {k: retyped(v, dtypes, multiply) for k, v in value.items()}
        return value if all(items[k] is value[k] for k in value) else items
    return value
