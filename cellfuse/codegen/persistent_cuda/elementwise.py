"""The elementwise work of a persistent kernel: each launch's body on the block's own elements, and the
loads that start ahead of it. A step loads at its top what nothing before the launch writes
(`prefetch`); the next step's read-only inputs while it waits at its barrier (`read_only`); the inputs the
same for every step once, before the loop (`fixed`). A launch whose blocks never wait (no GEMM, no
barrier) loads a chunk of steps' inputs at once (`ahead`) and carries its state in registers from step to
step (`carried`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from ..address import c_address
from ..c_text import comment_text
from ..cuda_kernels import F, element_body, pointer_type
from ..kernel_abi import element_index, kernel_params
from ..persistent import writes
from ..plan import KernelLaunch, PersistentItem
from ..row_passes import loaded
from .context import Kernel
from .exchange import at_columns, exchanged_outputs, publish

PREFETCH_ELEMENTS = 4  # per thread, at most, for an elementwise launch's loads to start the step early
AHEAD_REGISTERS = 64  # per thread, at most, for the inputs of the steps ahead in a launch with no barrier
AHEAD_STEPS = 16  # steps whose inputs a launch with no barrier loads at once, at most
# The slot a step writes and the next step reads: of the state a launch with no barrier carries in
# registers from one step to the next.
_NEXT_SLOT = {"t%2": "(t+1)%2", "t": "t+1"}

Arrays = dict[int, dict[int, str]]  # per launch (item index), param index -> a register array


def row_inputs(item: PersistentItem, kind: str = "row") -> list[int]:
    """The param indices of an elementwise launch's inputs that its body reads element by element (or, of
    kind "vec", column by column: the same for every row)."""
    params = kernel_params(item.launch)
    used = set(loaded(params, item.launch.body).values())
    return [p_i for p_i, p in enumerate(params) if p_i in used and p.access.kind == kind]


def unwritten(k: Kernel, item: PersistentItem) -> list[int]:
    """Those of `row_inputs` that nothing of the kernel writes (nor a GEMM on chip): they may be loaded
    steps ahead."""
    params = kernel_params(item.launch)
    elsewhere = k.written | k.on_chip.keys()
    return [p_i for p_i in row_inputs(item) if params[p_i].access.buffer not in elsewhere]


def _elementwise_items(k: Kernel) -> Iterator[tuple[int, PersistentItem]]:
    """The launches that run on the block's own elements (not a block per row, nor all of [N] values)."""
    for i, item in enumerate(k.launch.items):
        if isinstance(item.launch, KernelLaunch) and not (item.whole or item.by_rows):
            yield i, item


def ahead(k: Kernel) -> tuple[Arrays, dict[int, dict[int, tuple[int, str]]]]:
    """For a forward launch of elementwise work only, with no barrier (each thread owns its elements for
    all steps): per launch, the inputs that no launch of the kernel writes (loaded a chunk of steps ahead:
    param index -> register array [steps][elements]), and the state it reads that it wrote itself the step
    before (param index -> (the output's param index, register array)), which stays in registers from
    step to step. The step's loads would otherwise each wait a round trip to memory, one step after the
    other."""
    launch = k.launch
    if launch.reverse or k.gemms or launch.waits_per_step:
        return {}, {}
    loads: Arrays = {}
    carried: dict[int, dict[int, tuple[int, str]]] = {}
    for i, item in enumerate(launch.items):
        if item.whole or item.by_rows:
            continue
        if inputs := unwritten(k, item):
            loads[i] = {p_i: f"cf_ahead{i}_{p_i}" for p_i in inputs}
        params = kernel_params(item.launch)
        others = set().union(*(writes(o.launch) for o in launch.items if o is not item))
        for p_i in row_inputs(item):
            acc = params[p_i].access
            slot = _NEXT_SLOT.get(acc.slot)
            if acc.buffer not in k.written or acc.buffer in others or slot is None:
                continue
            out = [q for q, o in enumerate(params) if o.output and o.access == replace(acc, slot=slot)]
            if out:
                carried.setdefault(i, {})[p_i] = (out[0], f"cf_carry{i}_{p_i}")
    return loads, carried


def depth(k: Kernel, loads: Arrays) -> int:
    """Steps whose inputs are loaded at once: as many as AHEAD_REGISTERS hold."""
    per_step = sum(len(arrays) * k.elements(k.launch.items[i])[0] for i, arrays in loads.items())
    return max(1, min(AHEAD_STEPS, AHEAD_REGISTERS // per_step))


def read_only(k: Kernel) -> Arrays:
    """Per elementwise launch, the inputs that no launch of the kernel writes (the forward's input
    projections, the saved steps a backward pass reads): param index -> the register array that holds the
    next step's. A step loads them for the step after it, so that their round trip to memory runs beside
    its barrier and GEMM instead of ahead of its elementwise work."""
    out: Arrays = {}
    for i, item in _elementwise_items(k):
        if k.elements(item)[0] <= PREFETCH_ELEMENTS and (inputs := unwritten(k, item)):
            out[i] = {p_i: f"cf_next{i}_{p_i}" for p_i in inputs}
    return out


def fixed(k: Kernel) -> Arrays:
    """Per elementwise launch, the inputs the same for every row and step (a bias, a peephole's or a norm's
    weights), loaded once, before the loop: param index -> the register array that holds them. Loaded
    every step, each waited its trip to L1 behind the step's other work."""
    out: Arrays = {}
    for i, item in _elementwise_items(k):
        params = kernel_params(item.launch)
        vectors = [p_i for p_i in row_inputs(item, "vec")
                   if not params[p_i].output and params[p_i].access.buffer not in k.written]
        if vectors and k.elements(item)[0] <= PREFETCH_ELEMENTS:
            out[i] = {p_i: f"cf_fixed{i}_{p_i}" for p_i in vectors}
    return out


def prefetch(k: Kernel, skip: dict[int, set[int]]) -> Arrays:
    """Loads, at the top of the step, of the elementwise inputs that nothing before their launch in the
    step writes (and that are not on chip), but those of `skip` (per launch, param indices)."""
    out: Arrays = {}
    written: set[str] = set()
    w = k.w
    for i, item in enumerate(k.launch.items):
        if isinstance(item.launch, KernelLaunch) and not (item.whole or item.by_rows):
            most = k.elements(item)[0]
            params = kernel_params(item.launch)
            later = written | k.on_chip.keys() | k.written_by_rows  # (not before the barrier)
            early = [p_i for p_i in row_inputs(item) if p_i not in skip.get(i, set())
                     and params[p_i].access.buffer not in later]
            if early and most <= PREFETCH_ELEMENTS:
                if not out:  # the previous step's writes, by any thread of the block, are done
                    w("__syncthreads();")
                out[i] = {p_i: f"pf{i}_{p_i}" for p_i in early}
                w(*(f"{F} {array}[{most}];" for array in out[i].values()))
                element_loads(k, item, out[i])
        written |= writes(item.launch)
    return out


def load_fixed(k: Kernel, arrays_of: Arrays) -> None:
    """The loads of `fixed`'s inputs into their register arrays, before the loop."""
    for i, arrays in arrays_of.items():
        item = k.launch.items[i]
        k.w(*(f"{F} {array}[{k.elements(item)[0]}];" for array in arrays.values()))
        element_loads(k, item, arrays)


def load_at(k: Kernel, inputs: Arrays, step: str, declare: bool = True) -> None:
    """Loads of elementwise inputs into their register arrays at step `step` (a C expression), the arrays
    declared first unless `declare` is false."""
    w = k.w
    for i, arrays in inputs.items():
        item = k.launch.items[i]
        most = k.elements(item)[0]
        if declare:
            w(*(f"{F} {array}[{most}];" for array in arrays.values()))
        with w.block("{"):
            w(f"const int t = {step};")
            element_loads(k, item, arrays)


def rotate(k: Kernel, nxt: Arrays) -> Arrays:
    """At the top of a step: this step's inputs taken from the registers the step before filled; per
    launch, param index -> this step's register array."""
    now: Arrays = {}
    for i, arrays in nxt.items():
        most = k.elements(k.launch.items[i])[0]
        now[i] = {}
        for p_i, array in arrays.items():
            now[i][p_i] = f"cf_now{i}_{p_i}"
            k.w(f"{F} cf_now{i}_{p_i}[{most}];",
                f"for (int u = 0; u < {most}; ++u) cf_now{i}_{p_i}[u] = {array}[u];")
    return now


def load_next(k: Kernel, nxt: Arrays) -> None:
    """The next step's loads started, after the step's first barrier where it has one: started before it,
    the LSTM's step took longer on an H100 (docs/results/2026-11-26-persistent-rungs-changes-1-to-13.md,
    change 1)."""
    step, more = ("t - 1", "t > 0") if k.launch.reverse else ("t + 1", "t + 1 < seq")
    with k.w.block(f"if ({more}) {{"):
        k.w(f"const int cf_step = {step};")
        load_at(k, nxt, "cf_step", declare=False)


def prefetch_rows(k: Kernel) -> None:
    """The step's rows that a kernel run a block per row reads and nothing of the kernel writes (the hoisted
    GEMMs' outputs, the saved steps of a backward pass), each block its own, into L2 while it waits and
    runs the step's GEMMs: the block per row loads them from there."""
    threads, w = k.launch.threads, k.w
    for item in k.launch.items:
        if not item.by_rows:
            continue
        for p in kernel_params(item.launch):
            acc = p.access
            if p.output or acc.kind != "row" or acc.buffer in k.written:
                continue
            w(f"for (int r = blockIdx.x; r < batch; r += gridDim.x)  // {comment_text(p.value)}",
              f"    for (int e = 32 * tid; e < {item.launch.width}; e += {32 * threads})",
              f"        cf_prefetch_l2({c_address(k.var[acc.buffer], acc)} + (size_t)r * {acc.ld} + e);")


@contextmanager
def element_loop(k: Kernel, item: PersistentItem) -> Iterator[None]:
    """The loop over a thread's elements of a launch. Where `masked`, an element past the block's is not
    skipped but has `cf_ok` false: its loads read element 0 and it stores nothing. A branch per load and
    store, around each of a chunk's steps, made IndRNN's kernel slower on an H100 (measured with
    benchmarks/probes/indrnn_kernels_probe.py: docs/results/2026-11-27-persistent-rungs-changes-14-to-19.md,
    change 19)."""
    most, count, where = k.elements(item)
    with k.w.block(f"for (int u = 0; u < {most}; ++u) {{"):
        k.w(f"const int e = tid + u * {k.launch.threads};")
        if k.masked:
            k.w(where, f"const bool cf_ok = e < {count} && j < {item.launch.width};", "(void)cf_ok;")
        else:
            k.w(f"if (e >= {count}) break;", where, f"if (j >= {item.launch.width}) continue;")
        yield


def element_loads(k: Kernel, item: PersistentItem, registers: dict[int, str]) -> None:
    """The loop over a thread's elements (see `element_loop`), loading the inputs of `registers` (param
    index -> register array, indexed by u) at step t."""
    params = kernel_params(item.launch)
    with element_loop(k, item):
        if all(params[p_i].access.kind == "vec" for p_i in registers):  # the same for every row
            k.w("(void)r;")
        for p_i, register in registers.items():
            acc = params[p_i].access
            at = f"cf_ok ? {element_index(acc)} : 0" if k.masked else element_index(acc)
            k.w(f"{register}[u] = {acc.dtype.load(f'({c_address(k.var[acc.buffer], acc)})[{at}]')};")


def carry_in(k: Kernel, carried: dict[int, dict[int, tuple[int, str]]]) -> None:
    """The carried states' registers, loaded with the state before the first step."""
    registers = {i: {p_i: array for p_i, (_, array) in arrays.items()} for i, arrays in carried.items()}
    load_at(k, registers, "0")


def load_ahead(k: Kernel, loads: Arrays, steps: int) -> None:
    """The inputs of steps t0 .. t0 + steps - 1 (those before seq), every load in flight at once."""
    w = k.w
    for i, arrays in loads.items():
        item = k.launch.items[i]
        most = k.elements(item)[0]
        w(*(f"{F} {array}[{steps}][{most}];" for array in arrays.values()), "#pragma unroll")
        with w.block(f"for (int d = 0; d < {steps}; ++d) {{"):
            w("const int t = t0 + d;", "if (t >= seq) break;")
            element_loads(k, item, {p_i: f"{array}[d]" for p_i, array in arrays.items()})


def elementwise(k: Kernel, i: int, item: PersistentItem, prefetched: dict[int, str],
                carried: dict[int, tuple[int, str]]) -> None:
    """An elementwise launch on the block's own elements (or all of them, for [N] and scalar values); a
    GEMM output on chip is read from there, a prefetched input from its registers, a carried state from its
    registers (and the new state put there)."""
    launch: KernelLaunch = item.launch
    w = k.w
    params = kernel_params(launch)
    names = [f"p{n}" for n in range(len(params))]
    index: dict[int, str] = {}
    unused = set(range(len(params))) - set(loaded(params, launch.body).values())
    unused -= {n for n, p in enumerate(params) if p.output}
    for n, p in enumerate(params):
        if n in unused:  # an adjoint need not read every input of its kernel
            continue
        if n in prefetched:
            names[n], index[n] = prefetched[n], "u"
        elif n in carried:
            names[n], index[n] = carried[n][1], "u"
        elif p.access.buffer in k.on_chip and not p.output:
            g, gemm = k.on_chip[p.access.buffer]
            block = [sum(gemm.columns[:b]) for b in range(len(gemm.columns))].index(p.access.col)
            start = sum(map(k.launch.unit, gemm.columns[:block]))
            unit = k.launch.unit(gemm.columns[block])
            row = gemm.tiling.output_stride
            names[n], index[n] = f"cf_c{g}", f"(r - row0) * {row} + {start} + j - cb * {unit}"
        else:
            w(f"{pointer_type(p)} const {names[n]} = {c_address(k.var[p.access.buffer], p.access)};")
    _, count, where = k.elements(item)
    valid = None
    if prefetched or carried:  # the element loop of the prefetch, so that u picks the same elements
        loop = element_loop(k, item)
        valid = "cf_ok" if k.masked else None
    else:
        loop = w.block(f"for (int e = tid; e < {count}; e += {k.launch.threads}) {{")
    with loop:
        if not (prefetched or carried):
            w(where, f"if (j >= {launch.width}) continue;")
        w("(void)r;")
        for n, p in enumerate(params):  # other blocks wrote it: through L2, which is coherent, not L1
            if p.output or n in index or n in unused:
                continue
            # a column (the first column's block wrote it), or what a block per row wrote
            if p.access.kind == "col" or p.access.buffer in k.written_by_rows:
                at = f"({valid} ? {element_index(p.access)} : 0)" if valid else element_index(p.access)
                w(f"const {F} cf_l2_{n}[1] = {{{p.access.dtype.load(f'__ldcg({names[n]} + {at})')}}};")
                names[n], index[n] = f"cf_l2_{n}", "0"
        copies = {out: f"{array}[u]" for out, array in carried.values()}
        # the values other blocks read from an exchange: put there too, with the step's tag, each output at
        # its columns of the exchange
        published = exchanged_outputs(k, i, params)
        for n, _, _ in published:
            w(f"{F} cf_pub{n};")
            copies[n] = f"cf_pub{n}"
        element_body(w, params, names, launch.body, index, launch.adds, copies, valid)
        for n, x, ex in published:
            w(publish(k, ex, at_columns(k, n, x, ex, params), "t + 2", f"cf_pub{n}"))
