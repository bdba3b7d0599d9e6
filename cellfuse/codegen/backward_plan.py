"""The backward Plan: the gradients of a forward run, planned from the forward Plan's own launches.

For seeds dy (of the output sequence) and dfinal (of the final states), a backward pass gives the
gradient of sum(dy * y) + sum(dfinal * final) with respect to x, every initial state and every
parameter, as `graph_model.backward` does in float64 for reference. It mirrors the forward Plan of any
rung of the `graph` family (naive, combined, fused, hoisted, graph, wavefront), made with `save_steps`:

- A reverse time loop per layer, the last layer first. Step t walks the forward step's launches
  backwards: each elementwise kernel becomes its adjoint (`adjoint.py`), and each GEMM C = A @ W
  becomes dA += dC @ W^T on the same stacked weights (one GEMM per GEMM group, so the gradients of a
  combined group's matmuls are summed by the GEMM itself).
- After the loop: the forward's hoisted launches backwards, over all T steps at once (a hoisted
  kernel's adjoint in one launch, dx of a hoisted GEMM in one GEMM); then every weight's gradient as
  one GEMM over all T steps, dW += A^T @ dC, and column sums (a GEMM with a row of ones) for folded
  biases and the [N] values that kernels broadcast over their rows; then the kernels of [N] values
  only (`one` rows), whose inputs do not change with t, once, from their outputs' summed gradients.

Saved or recomputed. The backward pass reads what the forward plan with `save_steps` keeps of every
step: each state's value, each GEMM's output and each value a kernel writes to memory for another
launch. What a kernel computes inside itself is not kept: its adjoint recomputes the kernel's body in
registers from the kernel's saved inputs, then sweeps it in reverse. Elementwise work is cheap beside
the memory traffic of writing every intermediate value of every step and reading it back, so the
backward pass stores nothing the forward kernels did not already write.

Gradients live in buffers of their own (`grad_of` of the forward buffer's name, of the same rows and
width: states keep seq+1 row blocks, GEMM outputs and step values one per step); a gradient buffer
starts at zero and every backward launch adds into it (cuBLAS's beta = 1, kernels' `+=`), so a value
read by several launches collects each one's gradient; except a buffer that one kernel writes whole,
each element once, which that kernel overwrites (`written_once`): it need not load the zeros first.
Two such buffers that the kernel fills with the same values (the LSTM's gradients of x @ W and h @ U,
both their sum's) are one (`same_gradients`): stored once, and read by both weights' gradients.
Within one launch no two threads add into the same element: a [N] value that a kernel broadcasts over
its rows gets its gradient per row into a buffer of that kernel's own (T*B rows), summed after the loop;
where only that sum is wanted (a weight's gradient), a kernel of the loop adds each step's into the same
B rows, so that the sum after the loop adds B rows, not T*B.

Row reductions. A row reduction's result is a column, [batch, 1] (the `col` kind of an access), which
spreads over the row in the ops that read it. Its gradient is one number per row: the adjoint of a
kernel that reads a column sums over the row what each element passes it, and the adjoint of the
reduction spreads that number back over the row of its argument (see `adjoint`). So the adjoint of a
kernel that reduces rows or reads a column reduces rows itself, and runs as a reduction kernel, a block
per row (`cuda_kernels.reduction_kernel_source`); the numpy executor runs its body over whole rows. A
column's gradient buffer is of width 1, like the column's own; where a column crosses kernels (each
node its own kernel in `naive`), every kernel that reads it adds its row sums there, and the adjoint of
the kernel that computes it reads them, as for any value. A block owns its row, so no two threads add
into one element there either.

A persistent forward plan keeps its steps' launches beside its cooperative ones: its
backward pass is planned from those launches as the graph rung's (see `_Layer`), and then, where it
fits, each layer's reverse loop runs as one persistent launch of its own (`LayerBackward.persistent`),
made by the forward's machinery for the same GPU: the step's adjoint kernels on each block's own
elements, and each dA += dC @ W^T with the block's rows of W (its columns of W^T) in shared memory, a
grid-wide barrier before it (every block wrote dC). An LSTM's backward step then has one barrier, as
its forward step does. An adjoint that reduces rows runs a block per row there, as in the forward step.

In 16 bits (a bf16 or fp16 forward plan), as PyTorch's mixed precision does: the backward pass reads the
forward's saved values in the types they were stored in, and every gradient is float32 (the parameters'
accumulated in float32 over all steps), except the gradient of a GEMM's output whose GEMM multiplied
16-bit values (`sixteen_bit_grads`): the adjoint kernel stores it rounded to the 16-bit type, so that
both GEMMs that read it (dA += dC @ W^T and dW += A^T @ dC) multiply 16-bit operands on tensor cores,
accumulating in float32, as the forward GEMM did. Every GEMM multiplies in the 16-bit type, as every
forward GEMM of the plan does: one whose operands are float32 (a float32 state's) rounds them as it
multiplies them; a persistent reverse loop keeps its W^T on chip in the 16-bit type, as the forward
loop keeps W; and a weights' gradient over a float32 operand that a persistent loop rounded (its h)
multiplies a 16-bit copy of it (`sixteen_bit_operands`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np

from ..graph_model import OPS, CellError, Gradients
from .adjoint import adjoint
from .dtypes import FLOAT32, DType
from .lowering import Instruction, Loop, Persistent, as_instruction, w_regions_shared
from .persistent import persistent_launch, written
from .plan import (
    ALL_STEPS,
    Access,
    Buffer,
    GemmLaunch,
    GradInstr,
    Instr,
    KernelLaunch,
    Launch,
    PersistentLaunch,
    Plan,
    grad_of,
)
from .precision import PRECISIONS, Float32Only, retyped, sixteen_bit_copy

ONES = "ones"  # T*B ones: the left operand of a column sum (of float32 rows; `ones_name` for 16-bit rows)


@dataclass(frozen=True)
class LayerBackward:
    """One layer's backward launches: `step` once per step, t from T-1 down to 0, then `after` once.
    Where `persistent` is given, it runs every step of `step` in one cooperative launch."""

    layer: int
    step: tuple[Launch, ...]
    after: tuple[Launch, ...]
    persistent: PersistentLaunch | None = None


@dataclass
class BackwardPlan:
    forward: Plan
    buffers: dict[str, Buffer]  # gradient buffers (zeroed before a run) and the ones
    layers: list[LayerBackward]  # in the order they run: the last layer first
    overwritten: frozenset[str] = frozenset()  # gradient buffers stored, not added to (see written_once)

    @property
    def launches_per_step(self) -> int:
        """Launches per step and layer: none where one persistent launch runs all of a layer's steps."""
        return 0 if self.layers[0].persistent else len(self.layers[0].step)

    def instructions(self) -> tuple[Instruction, ...]:
        """The program of the whole backward pass: per layer, the reverse loop, then what follows it."""
        out: list[Instruction] = []
        batch = self.forward.sizes.batch
        for lb in self.layers:
            if lb.persistent:
                out.append(Persistent(lb.persistent))
            else:
                out.append(Loop(tuple(as_instruction(launch, batch) for launch in lb.step), reverse=True))
            out += [as_instruction(launch, batch) for launch in lb.after]
        return w_regions_shared(tuple(out))

    def buffer_elements(self, name: str) -> int:
        return self.buffers[name].elements(self.forward.sizes)

    def without_input_grad(self) -> BackwardPlan:
        """The same pass where nothing asks for x's gradient (x needs none: a first layer over data): the
        GEMMs that write only dx left out, the first layer's input GEMM's dA (for the LSTM at B=64, T=100,
        I=H=512, 0.13 ms of its 1.7 on an H200). dx's buffer is left as it starts. A persistent launch
        keeps what it computes."""
        dx = grad_of("x")

        def kept(launches: tuple[Launch, ...]) -> tuple[Launch, ...]:
            return tuple(launch for launch in launches
                         if not (isinstance(launch, GemmLaunch) and launch.c.buffer == dx))
        layers = [replace(lb, step=lb.step if lb.persistent else kept(lb.step), after=kept(lb.after))
                  for lb in self.layers]
        return replace(self, layers=layers)

    # -- the seeds a run starts from and the gradients it ends with ------------------------------------
    def seeds(self, dy: np.ndarray, dfinal: Mapping[str, np.ndarray] | None,
              dtype=np.float32) -> dict[str, np.ndarray]:
        """The gradient buffers that hold seeds, whole and flat: dy [T, B, hidden] at `dy_place`,
        dfinal[state] [L, B, hidden] (any states, or none) at `state_grad` after each layer's last step,
        added to their `start_value`. Every other gradient buffer holds its `start_value`. Raises
        CellError for a seed that does not fit."""
        plan = self.forward
        s = plan.sizes
        T, B, H, L = s.seq, s.batch, s.hidden, s.layers
        dfinal = dict(dfinal or {})
        _check_seed("dy", dy, (T, B, H))
        for state, seed in dfinal.items():
            if state not in plan.state_ids:
                raise CellError(f"dfinal: '{state}' is not a state of cell '{plan.cell_name}' "
                                f"(states: {', '.join(plan.state_ids) or 'none'})")
            _check_seed(f"dfinal '{state}'", seed, (L, B, H))
        out: dict[str, np.ndarray] = {}

        def add(name: str, at: int, seed: np.ndarray) -> None:
            if name not in out:
                out[name] = np.full(self.buffer_elements(name), self.start_value(name), dtype)
            out[name][at:at + seed.size] += seed.astype(dtype).reshape(-1)

        add(*self.dy_place(), dy)
        for state, seed in dfinal.items():
            for layer in range(L):
                add(*self.state_grad(state, layer, s.seq), seed[layer])
        return out

    def restarted(self, name: str) -> bool:
        """Whether every run must put the buffer back to its start value: one the backward launches add
        into must; the `ones` (never written) and one that a kernel overwrites whole (whose NaN start only
        shows a read before the write) keep theirs from one run to the next."""
        return name not in self.overwritten and self.buffers[name].role != "ones"

    def start_value(self, name: str) -> float:
        """What a gradient buffer holds before the seeds are added: 0, since backward launches add into
        their buffers; 1 in the `ones` buffer, the left operand of the column sums; NaN in a buffer that
        one kernel overwrites whole (see `written_once`), so that a read of an element it has not
        written yet shows."""
        if name in self.overwritten:
            return float("nan")
        return 1.0 if self.buffers[name].role == "ones" else 0.0

    def dy_place(self) -> tuple[str, int]:
        """The gradient buffer and element offset of y [T, B, hidden]: the last layer's output sequence
        from its second row block (the first holds the initial state)."""
        s = self.forward.sizes
        return grad_of(self.forward.layers[-1].output_seq), s.batch * s.hidden

    def gradients(self, read: Callable[[str], np.ndarray]) -> Gradients:
        """The gradients of x, of every initial state and of every parameter key, each in its shape, from
        the gradient buffers after a run (`read(name)` gives one whole and flat). Stacked weights and bias
        rows are split back into the keys they were built from; a key used in several places gets the
        sum of its parts."""
        plan = self.forward
        s = plan.sizes
        B, H = s.batch, s.hidden
        dx = read(grad_of("x")).reshape(s.seq, B, s.input)
        dinitial = {}
        for state in plan.state_ids:
            parts = []
            for layer in range(s.layers):
                name, at = self.state_grad(state, layer, 0)
                parts.append(read(name)[at:at + B * H].reshape(B, H))
            dinitial[state] = np.stack(parts)
        dparams = {key: np.zeros(shape, dx.dtype) for key, shape in plan.params.items()}
        for part in plan.param_parts():
            g = read(grad_of(part.buffer)).reshape(part.rows, part.ld)
            dparams[part.key] += g[:, part.col:part.col + part.width].reshape(plan.params[part.key])
        return Gradients(dx.copy(), dinitial, dparams)

    def state_grad(self, state: str, layer: int, t: int) -> tuple[str, int]:
        """The gradient buffer and element offset of a layer's state before step t (t = T: after the last)."""
        acc = self.forward.layers[layer].state_read[state]
        return grad_of(acc.buffer), acc.offset(t, self.forward.sizes.batch)


def grad(acc: Access) -> Access:
    """The gradient of what an access reads or writes: the same place in the gradient buffer."""
    return replace(acc, buffer=grad_of(acc.buffer))


def all_steps(acc: Access) -> Access:
    """An access of one step as the access of all T steps at once (T*B rows)."""
    return replace(acc, slot=ALL_STEPS.get(acc.slot, acc.slot))


def backward_plan(forward: Plan) -> BackwardPlan:
    """The backward Plan of a forward Plan made with `save_steps`; raises CellError for one without."""
    if not forward.saves_steps:
        raise CellError(f"the backward pass of '{forward.cell_name}' reads every step of the forward pass: "
                        "make the forward plan with save_steps=True")
    sixteen = sixteen_bit_grads(forward)
    buffers = {grad_of(b.name): Buffer(grad_of(b.name), b.rows, b.width, "grad",
                                       dtype=sixteen.get(grad_of(b.name), FLOAT32))
               for b in forward.buffers.values() if b.role not in ("init", "final")}
    buffers[ONES] = Buffer(ONES, "seq", 1, "ones")
    builders = [_Layer(forward, lp.layer, buffers) for lp in reversed(forward.layers)]
    launched = [b.launches() for b in builders]
    seeded = {grad_of(lp.output_seq) for lp in forward.layers}
    seeded |= {grad_of(acc.buffer) for lp in forward.layers for acc in lp.state_read.values()}
    once = written_once([launch for step, after in launched for launch in (*step, *after)], buffers, seeded)
    if same := same_gradients([launch for step, _ in launched for launch in step], buffers, once):
        launched = [(renamed(step, same), renamed(after, same)) for step, after in launched]
        once -= same.keys()
        for name in same:
            del buffers[name]
    twins = sixteen_bit_twins([launch for step, _ in launched for launch in step], buffers, once)
    launched = [(step, sixteen_bit_operands(after, twins, forward, buffers, once))
                for step, after in launched]

    def stores(launch: Launch) -> Launch:
        if not isinstance(launch, KernelLaunch):
            return launch
        return replace(launch, overwrites=frozenset(acc.buffer for _, acc in launch.outputs
                                                    if acc.buffer in once))

    dtypes = {name: b.dtype for name, b in (*forward.buffers.items(), *buffers.items())}
    multiply = PRECISIONS[forward.precision]

    def typed(launch: Launch) -> Launch:
        """Every access in its buffer's type (a gradient's access made from the forward's has the forward
        buffer's), every GEMM multiplying in the plan's type."""
        return retyped(launch, dtypes, multiply)

    layers = []
    for b, (step, after) in zip(builders, launched, strict=True):
        step, after = (tuple(typed(stores(launch)) for launch in part) for part in (step, after))
        layers.append(LayerBackward(b.lp.layer, step, after, b.persistent(list(step))))
    return BackwardPlan(forward, buffers, layers, frozenset(once))


def sixteen_bit_grads(forward: Plan) -> dict[str, DType]:
    """The gradient buffers stored in 16 bits, with their types: those of the GEMM outputs whose GEMMs
    multiply 16-bit operands (their weights' type; a GEMM's left operand has its weights' type), and of
    a persistent loop's GEMMs, which round their float32 operand and weights to the plan's type as they
    multiply them (precision._persistent_operands): the reverse loop then stages dC in half the bytes,
    and each layer of an LSTM stores its gradients of x @ W and h @ U, the same values in one type, once
    (`same_gradients`; an upper layer's x @ W multiplies a 16-bit copy of the outputs below:
    precision._sixteen_bit_operand_copies). Raises Float32Only where such a gradient would also be seeded or
    read as a float32 one: a GEMM writing into a buffer of another role than its own outputs', or two
    GEMMs of different types into one (in whichever order they come)."""
    types: dict[str, dict[DType, GemmLaunch]] = {}  # a gradient buffer -> each type a GEMM gives it
    for lp in forward.layers:
        looped = lp.step if lp.persistent else ()
        for g in (*lp.prologue, *lp.step):
            if not isinstance(g, GemmLaunch):
                continue
            w = forward.buffers[g.w].dtype
            if w == FLOAT32 and g in looped and forward.buffers[g.c.buffer].role == "gemm":
                w = PRECISIONS[forward.precision]
            types.setdefault(grad_of(g.c.buffer), {}).setdefault(w, g)
    out: dict[str, DType] = {}
    for name, given in types.items():
        sixteen = [w for w in given if w != FLOAT32]
        if not sixteen:
            continue
        g = given[sixteen[0]]
        if len(given) > 1 or forward.buffers[g.c.buffer].role != "gemm":
            raise Float32Only(f"the backward pass of '{forward.cell_name}' in {forward.precision} would "
                              f"mix 16-bit and float32 gradients in '{g.c.buffer}' (GEMM {g.group}): it "
                              "runs in float32 only")
        out[name] = sixteen[0]
    return out


def same_gradients(launches: list[Launch], buffers: dict[str, Buffer], once: set[str]) -> dict[str, str]:
    """Gradient buffers that hold what another holds, element for element -> that other one. A kernel of
    the loop that writes two `written_once` buffers of one shape, each of its columns of one the same
    value as the same columns of the other, writes them both whole: the LSTM's step kernel, whose
    gradients of x @ W and h @ U are both the gradient of their sum (an add passes its result's gradient
    on as it is). One buffer then does for both: the kernel stores it once, and the two weights'
    gradients read the same operand (which the GEMMs on tensor cores then split once)."""
    same: dict[str, str] = {}
    for name, kept in _stored_alike(launches, buffers, once):
        if kept not in same and name not in same and buffers[name].dtype == buffers[kept].dtype:
            same[name] = kept
    return same


def sixteen_bit_twins(launches: list[Launch], buffers: dict[str, Buffer], once: set[str]) -> dict[str, str]:
    """Float32 gradient buffers whose every element a 16-bit one holds too, rounded -> that 16-bit one: on
    the `naive` rung, Cho's GRU's and the MGU's gradient of h @ U (float32: h is a float32 state, its
    GEMM multiplies float32 operands) and that of x @ W, the same values, stored in 16 bits."""
    pairs = _stored_alike(launches, buffers, once)
    return {name: kept for name, kept in (*pairs, *((k, n) for n, k in pairs))
            if buffers[name].dtype == FLOAT32 and buffers[kept].dtype != FLOAT32}


def _stored_alike(launches: list[Launch], buffers: dict[str, Buffer], once: set[str]
                  ) -> list[tuple[str, str]]:
    """(buffer, an earlier one) pairs of `written_once` buffers of one shape that one kernel of the loop
    writes whole, each of its columns of one the same value as the same columns of the other, in any
    types."""
    pairs = []
    for launch in launches:
        if not isinstance(launch, KernelLaunch):
            continue
        value = _passed_on(launch.body)
        stored: dict[str, dict[int, tuple[str, Access]]] = {}
        for v, acc in launch.outputs:
            if acc.buffer in once:
                stored.setdefault(acc.buffer, {})[acc.col] = (value.get(v, v),
                                                              replace(acc, buffer="", dtype=FLOAT32))
        names = list(stored)
        for i, name in enumerate(names):
            b = buffers[name]
            for kept in names[:i]:
                k = buffers[kept]
                if (b.rows, b.width) == (k.rows, k.width) and stored[name] == stored[kept]:
                    pairs.append((name, kept))
    return pairs


def sixteen_bit_operands(after: list[Launch], twins: dict[str, str], forward: Plan,
                         buffers: dict[str, Buffer], once: set[str]) -> list[Launch]:
    """The launches after a loop with each weights' gradient dW += A^T @ dC whose A is float32 (a
    persistent loop's h, which its GEMM rounded as it multiplied it, or a float32 state) and whose dC is
    16-bit, or float32 with a 16-bit twin (`sixteen_bit_twins`), multiplying 16-bit operands: dC or its
    twin, and A converted to that type first by a kernel of its own (a new buffer of the gradient memory,
    which it overwrites whole: added to `buffers` and `once`). cuBLAS multiplies float32 operands at a
    third of the rate of 16-bit ones, as precisely as TF32 (the LSTM's dU at B=64: 0.095 ms against 0.036
    on an H200, benchmarks/results/h200_2026-12-01_float32_operand_gemm_probe.txt), and one GEMM
    multiplies operands of one type."""
    out: list[Launch] = []
    made: set[str] = set()
    for launch in after:
        dc = twins.get(launch.w, launch.w) if isinstance(launch, GemmLaunch) and launch.trans_a else None
        if dc is None or buffers[dc].dtype == FLOAT32 or forward.buffers[launch.a.buffer].dtype != FLOAT32:
            out.append(launch)
            continue
        dtype = buffers[dc].dtype
        # A is [K, M]: T*B rows of the operand's width, from the step A's access starts at (the first
        # step's h, or the second's, "all+1"), copied to the start of the copy
        stored = forward.buffers[launch.a.buffer].width
        buffer, kernel = sixteen_bit_copy(launch.a, launch.k, launch.m, stored, dtype, "grad")
        if buffer.name not in made:
            made.add(buffer.name)
            buffers[buffer.name] = buffer
            once.add(buffer.name)
            # (a backward pass's kernel, after the loop; its output stored, not added: in `once`)
            out.append(replace(kernel, accumulate=True))
        out.append(replace(launch, a=kernel.outputs[0][1], w=dc))
    return out


def _passed_on(body: tuple[Instr | GradInstr, ...]) -> dict[str, str]:
    """The values of a body that are another value as it is: the gradient an add passes each argument
    (its derivative rule is dy itself) -> the value it is, followed back to one that is not."""
    value: dict[str, str] = {}
    for instr in body:
        if isinstance(instr, GradInstr) and instr.op.cuda_grad[instr.arg] == "{dy}":
            value[instr.result] = value.get(instr.dy, instr.dy)
    return value


def renamed(launches: list[Launch], same: dict[str, str]) -> list[Launch]:
    """The launches with each buffer of `same` read and written as the one it names; a kernel's store
    into the same place twice (the same value, see same_gradients) made once, and what only the store
    left out read dropped from its body."""
    def at(acc: Access) -> Access:
        return replace(acc, buffer=same[acc.buffer]) if acc.buffer in same else acc

    out: list[Launch] = []
    for launch in launches:
        if isinstance(launch, GemmLaunch):
            out.append(replace(launch, a=at(launch.a), c=at(launch.c), w=same.get(launch.w, launch.w)))
            continue
        places: dict[Access, str] = {}
        for v, acc in launch.outputs:
            places.setdefault(at(acc), v)
        outputs = tuple((v, acc) for acc, v in places.items())
        body = launch.body if len(outputs) == len(launch.outputs) else _live(launch.body, outputs)
        out.append(replace(launch, inputs=tuple((v, at(acc)) for v, acc in launch.inputs), outputs=outputs,
                           body=body))
    return out


def _live(body: tuple[Instr | GradInstr, ...], outputs: tuple[tuple[str, Access], ...]
          ) -> tuple[Instr | GradInstr, ...]:
    """The instructions of a body that the outputs need."""
    need = {v for v, _ in outputs}
    kept = []
    for instr in reversed(body):
        if instr.result not in need:
            continue
        kept.append(instr)
        need |= {a for a in instr.args if isinstance(a, str)}
        if isinstance(instr, GradInstr):
            need |= {instr.dy, instr.y}
    return tuple(reversed(kept))


def written_once(launches: list[Launch], buffers: dict[str, Buffer], seeded: set[str]) -> set[str]:
    """The gradient buffers that one kernel alone writes, each element once: a step's kernel each step's
    rows, or a kernel after the loop all T steps' rows at once, its outputs side by side across the
    buffer's whole width. Such a kernel stores its gradients there instead of adding them to zeros: it
    need not load what memory holds, and the buffer need not be zeroed first. Seeded buffers, and those
    a GEMM writes (cuBLAS adds with beta = 1), are not."""
    writes: dict[str, list[tuple[int, Launch, Access]]] = {}
    for n, launch in enumerate(launches):
        for acc in written(launch):
            writes.setdefault(acc.buffer, []).append((n, launch, acc))
    once = set()
    for name, places in writes.items():
        buffer = buffers.get(name)
        if buffer is None or buffer.role != "grad" or buffer.rows != "seq" or name in seeded:
            continue
        (n, launch, _), accs = places[0], [acc for _, _, acc in places]
        if any(m != n for m, _, _ in places) or not isinstance(launch, KernelLaunch):
            continue
        every_step = {"batch": "t", "seq": "all"}.get(launch.row_kind)  # the rows of each step, or of all
        if any(acc.kind != "row" or acc.ld != buffer.width or acc.block or acc.slot != every_step
               for acc in accs):
            continue
        if sorted(acc.col for acc in accs) == [i * launch.width for i in range(len(accs))] \
                and len(accs) * launch.width == buffer.width:
            once.add(name)
    return once


class _Layer:
    """The backward launches of one layer."""

    def __init__(self, forward: Plan, layer: int, buffers: dict[str, Buffer]):
        self.plan, self.buffers = forward, buffers
        self.lp = forward.layers[layer]
        self.rows = forward.sizes.seq * forward.sizes.batch  # T*B: the rows of all steps
        # The launches of the graph rung, also those of a persistent plan, whose backward pass
        # is therefore the graph rung's.
        self.forward_launches = [*self.lp.prologue, *self.lp.step]
        # the 16-bit copies the prologue makes of a float32 operand for GEMMs (precision.
        # _sixteen_bit_operand_copies) -> (the place they copy, the copy): the gradient of a GEMM's
        # operand that is such a copy adds straight into that place's, with no kernel between
        kernels_read = {acc.buffer for lp in forward.layers for k in (*lp.prologue, *lp.step)
                        if isinstance(k, KernelLaunch) for _, acc in k.inputs}
        self.copied = {k.outputs[0][1].buffer: (k.inputs[0][1], k.outputs[0][1]) for k in self.lp.prologue
                       if _converts(k) and k.outputs[0][1].buffer not in kernels_read}
        for copy in self.copied:
            del buffers[grad_of(copy)]
        for k in self.kernels():
            for instr in k.body:
                if instr.op.grad is None or instr.op.cuda_grad is None:
                    raise CellError(f"node '{instr.result}' (kernel {k.island}): op '{instr.op.name}' has no "
                                    "derivative in the op table, so the backward pass has no plan for it")
        self.varies = self._varies()
        # the kernel that writes each value to memory
        self.producer = {v: k for k in self.kernels() for v, _ in k.outputs}
        # per-row gradients of [N] values that row kernels broadcast: (kernel, value) -> their buffer. Where
        # they are only summed after the loop (a weight's, or a value of [N] values only), a kernel of the
        # loop adds each step's into the same B rows: the column sum then adds B rows, not T*B.
        self.parts: dict[tuple[str, str], str] = {}
        for k in self.kernels(rows=True):
            for v, acc in k.inputs:
                if acc.kind in ("vec", "scalar") and self.varies[v]:
                    if acc.kind == "scalar":
                        raise CellError(f"kernel {k.island} reads a scalar '{v}' that varies: scalars are "
                                        "constants")
                    name = f"{grad_of(f'l{layer}.{k.island}')}.{v}"
                    summed = self.producer.get(v) is None or self.producer[v].row_kind == "one"
                    rows = "batch" if summed and k.row_kind == "batch" else "seq"
                    buffers[name] = Buffer(name, rows, k.width, "grad")
                    self.parts[k.island, v] = name

    def kernels(self, rows: bool | None = None) -> list[KernelLaunch]:
        """The layer's kernels in forward order: those with rows, those of [N] values only, or all."""
        return [k for k in self.forward_launches if isinstance(k, KernelLaunch)
                and (rows is None or (k.row_kind != "one") == rows)]

    def _varies(self) -> dict[str, bool]:
        """Which values depend on x, a state or a weight (only they have gradients): every row value and
        column (a row reduction's), and what a kernel computes from a weight."""
        varies: dict[str, bool] = {}
        for k in self.kernels():
            for v, acc in k.inputs:
                if v not in varies:  # a row value, a weight, or a value of a kernel of another phase
                    varies[v] = acc.kind in ("row", "col") or self.plan.buffers[acc.buffer].role == "weight"
            for instr in k.body:
                varies[instr.result] = any(varies[a] for a in instr.args if isinstance(a, str))
        return varies

    # -- launches ------------------------------------------------------------------------------------
    def launches(self) -> tuple[list[Launch], list[Launch]]:
        """The launches of one step of the reverse loop, and those after it."""
        step: list[Launch] = []
        for launch in reversed(self.lp.step):
            step += self.reverse(launch)
        after: list[Launch] = []
        for launch in reversed(self.lp.prologue):
            after += self.reverse(launch)
        for launch in self.forward_launches:
            if isinstance(launch, GemmLaunch):
                after += self.weight_grads(launch)
        for (island, v), name in self.parts.items():
            if self.producer.get(v) is None or self.producer[v].row_kind == "one":
                k = next(k for k in self.kernels() if k.island == island)
                acc = dict(k.inputs)[v]
                after.append(self.column_sum(f"sum {island}.{v}", name, k.width,
                                             Access(grad_of(acc.buffer), "row", k.width, acc.col)))
        for k in reversed(self.kernels(rows=False)):
            after += self.adjoint(k)
        return step, after

    def persistent(self, step: list[Launch]) -> PersistentLaunch | None:
        """The reverse loop as one persistent launch, for a persistent forward plan; else None."""
        plan = self.plan
        if plan.target is None or not step:
            return None
        columns = [(launch.n,) if isinstance(launch, GemmLaunch) else (launch.width,) for launch in step]
        return persistent_launch(self.lp.layer, step, columns, plan.sizes.hidden, plan.sizes.batch,
                                 plan.target, saved=True, reverse=True, mma=plan.tensor_cores,
                                 sixteen_bit=plan.precision != "fp32")

    def reverse(self, launch: Launch) -> list[Launch]:
        """The backward launches of a forward launch of the loop or the prologue, in that place."""
        match launch:
            case GemmLaunch():
                return [self.grad_a(launch)]
            case KernelLaunch() if launch.row_kind == "one":
                return []  # after the loop, once (see `launches`)
            case KernelLaunch() if launch.outputs[0][1].buffer in self.copied:
                return []  # its GEMMs' gradient of the copy went to the place it copies (`grad_a`)
            case KernelLaunch():
                return self.adjoint(launch)
            case _:
                raise TypeError(f"unknown launch {launch!r}")

    def grad_a(self, g: GemmLaunch) -> GemmLaunch:
        """dA += dC @ W^T (where A is a copy made in the prologue, into the gradient of what it copies)."""
        into = grad(g.a)
        if g.a.buffer in self.copied:
            source, whole = self.copied[g.a.buffer]
            if g.a != whole:
                raise CellError(f"GEMM {g.group} of layer {self.lp.layer} reads part of the copy "
                                f"{g.a.buffer}, whose gradient goes to what it copies whole")
            into = grad(source)
        return GemmLaunch(f"{g.group} dA", g.row_kind, g.m, g.k, g.n, grad(g.c), g.w, into, None,
                          trans_w=True, accumulate=True)

    def weight_grads(self, g: GemmLaunch) -> list[GemmLaunch]:
        """dW += A^T @ dC over all steps, and the column sums of dC for a folded bias."""
        if g.c.col != 0 or g.c.ld != g.n or self.plan.buffers[g.c.buffer].width != g.n:
            raise CellError(f"GEMM {g.group} of layer {self.lp.layer} does not write all of its output "
                            "buffer: its weights' gradient reads that buffer whole")
        k_dim = self.plan.group(g.group).k_dim
        out = [GemmLaunch(f"{g.group} dW", k_dim, g.k, g.n, self.rows, all_steps(g.a), grad_of(g.c.buffer),
                          Access(grad_of(g.w), "row", g.n), None, trans_a=True, accumulate=True)]
        if g.bias:
            out.append(self.column_sum(f"{g.group} dbias", grad_of(g.c.buffer), g.n,
                                       Access(grad_of(g.bias), "row", g.n)))
        return out

    def column_sum(self, name: str, rows: str, width: int, into: Access) -> GemmLaunch:
        """into += the sum of the rows of a [count, width] buffer (T*B rows, or B that every step added
        to): ones[1, count] @ rows."""
        count = self.plan.sizes.batch if self.buffers[rows].rows == "batch" else self.rows
        dtype = self.buffers[rows].dtype
        ones = ones_name(dtype)
        self.buffers.setdefault(ones, Buffer(ones, "seq", 1, "ones", dtype=dtype))
        return GemmLaunch(name, "one", 1, width, count, Access(ones, "row", count), rows, into, None,
                          accumulate=True)

    def adjoint(self, k: KernelLaunch) -> list[KernelLaunch]:
        """The adjoint kernel of a kernel: its inputs and its outputs' gradients in, its inputs' gradients
        added out; none where no input's gradient is wanted."""
        outputs = [v for v in dict.fromkeys(v for v, _ in k.outputs) if self.varies[v]]
        adj = adjoint(k.body, {v: acc.kind for v, acc in k.inputs}, outputs)
        slot = "t" if k.row_kind == "batch" else "all"
        inputs, sums = list(k.inputs), []
        for o in outputs:
            sources = self.output_grads(k, o, slot)
            if len(sources) == 1:
                inputs.append((grad_of(o), sources[0]))
                continue
            names = [f"{grad_of(o)}@{i}" for i in range(len(sources))]
            inputs += zip(names, sources, strict=True)
            total = names[0]
            for i, name in enumerate(names[1:], 1):
                result = grad_of(o) if i == len(names) - 1 else f"{grad_of(o)}@+{i}"
                sums.append(Instr(result, OPS["add"], (total, name)))
                total = result
        stores = []
        for v, acc in k.inputs:
            if not self.varies[v] or v not in adj.grads:
                continue
            if acc.kind in ("row", "col") or k.row_kind == "one":
                stores.append((adj.grads[v], grad(acc)))
            else:  # a [N] value broadcast over the kernel's rows: its gradient per row, summed later
                part = self.parts[k.island, v]  # of B rows that every step adds to, or of every step's
                stores.append((adj.grads[v], Access(part, "row", k.width, 0,
                                                    "fixed" if self.buffers[part].rows == "batch" else slot)))
        if not stores:
            return []
        return [KernelLaunch(f"{k.island}_grad", k.row_kind, k.rows, k.width, tuple(inputs), tuple(stores),
                             (*sums, *adj.body), k.hoisted, accumulate=True)]

    def output_grads(self, k: KernelLaunch, value: str, slot: str) -> list[Access]:
        """Where the gradient of a kernel's output is found, in parts that add up: the gradient of each
        place it is stored, or, for a [N] value that a kernel with rows computes, the per-row gradients
        of the kernels that read it."""
        out = []
        for v, acc in k.outputs:
            if v != value:
                continue
            if acc.kind in ("row", "col") or k.row_kind == "one":
                out.append(grad(acc))
                continue
            for (island, read), name in self.parts.items():
                if read != value:
                    continue
                reader = next(r for r in self.kernels() if r.island == island)
                if reader.row_kind == "seq" and slot == "t":
                    raise CellError(f"kernel {reader.island} runs before the loop and reads '{value}', "
                                    f"which kernel {k.island} computes in every step")
                out.append(Access(name, "row", k.width, 0, slot))
            if any(value in (v for v, _ in r.inputs) for r in self.kernels(rows=False)):
                raise CellError(f"kernel {k.island} computes '{value}' per row and a kernel of [N] values "
                                "reads it: the plan mixes two rungs")
        return out


def _converts(k: Launch) -> bool:
    """Whether a forward launch is a kernel that stores its one input, as it is, into one output of
    another type."""
    return (isinstance(k, KernelLaunch) and k.body == () and len(k.inputs) == len(k.outputs) == 1
            and k.inputs[0][0] == k.outputs[0][0] and k.inputs[0][1].dtype != k.outputs[0][1].dtype)


def ones_name(dtype: DType) -> str:
    """The buffer of ones that sums rows of this type (cuBLAS multiplies operands of one type)."""
    return ONES if dtype == FLOAT32 else f"{ONES}.{dtype.name}"


def _check_seed(what: str, value: object, shape: tuple[int, ...]) -> None:
    if not isinstance(value, np.ndarray) or not np.issubdtype(value.dtype, np.floating):
        raise CellError(f"{what} must be a float array of shape {list(shape)}, got {type(value).__name__}")
    if value.shape != shape:
        raise CellError(f"{what} has shape {list(value.shape)}, expected {list(shape)}")
