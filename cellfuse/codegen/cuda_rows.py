"""CUDA C for a kernel that reduces rows (a layer norm's, a row sum's): a block per row, each thread on the
columns j = threadIdx.x + k * BLOCK of it. Its body is cut into passes over the row at each reduction
(see `row_passes`), the row sums go through warp shuffles and shared memory (a variance's come with the
sum of what it deviates from: see `row_passes.Deviations`), and the values a later pass needs stay in
registers, so that a layer norm reads its row from global memory once. The adjoint of such a kernel (a
backward pass's, see `adjoint`) runs the same way: its gradients of columns are row sums too. A
persistent kernel runs the same body as a device function (`device`)."""

from __future__ import annotations

from collections.abc import Callable

from .c_text import CWriter, c_name, comment_text, float_literal
from .cuda_kernels import F, c_vars, expression, pointer_type, when_it_runs
from .dtypes import COMPUTE
from .kernel_abi import BLOCK, WARP, element_index, kernel_params
from .plan import GradInstr, Instr, KernelLaunch
from .row_passes import MAX_UNROLLED_COLUMNS, RowSums, instr_reads, row_sums, sums_the_row

# Floats per thread that a reducing kernel loads in its first pass for a later one, at most: enough for a
# layer norm's gains, biases and other operands.
EARLY_LOAD_FLOATS = 64


def reduction_kernel_source(launch: KernelLaunch, name: str, device: bool = False,
                            written: frozenset[str] = frozenset(),
                            published: dict[int, Callable[[str], str]] | None = None) -> str:
    """A kernel whose body reduces rows: a block per row (see the module's docstring). Pointers arrive
    already offset to the step's rows; the launch may have any number of blocks of BLOCK threads. A
    `device` function instead, with the same body, for a persistent kernel's blocks to run: it loads
    the buffers that the kernel writes (`written`) through L2 (`__ldcg`), what it adds to as well, since
    other blocks of the kernel wrote them, and an SM's L1 is not coherent with the others'; and it
    also publishes the outputs of `published` (the index of each among the kernel's parameters) to
    an exchange, by the statement given for a value (in r, j and the batch, `rows`, with the tag of its
    step `t`, an argument after the rows: see `persistent_cuda`).

    The body may be an adjoint's (see `adjoint`): its gradients are computed in the same passes, and a
    column's gradient, the sum over the row of what each element passes it, is one more row sum. A
    value is uniform over the row (one per row, computed by every thread of the block alike) where its
    kind is a column or a scalar; the others are computed per element, in the passes."""
    params = kernel_params(launch)
    pointer = [f"p{i}_{c_name(p.value)}" for i, p in enumerate(params)]
    inputs = {p.value: (p.access, n) for p, n in zip(params, pointer, strict=True) if not p.output}
    published = published or {}
    stores: dict[str, list[tuple[str, str, int]]] = {}  # value -> where it goes, how (+= or =), parameter
    for i, (p, n) in enumerate(zip(params, pointer, strict=True)):
        if p.output:
            assign = "+=" if launch.adds(p.access) else "="
            stores.setdefault(p.value, []).append((f"{n}[{element_index(p.access)}]", assign, i))
    rs = row_sums(launch)
    body, uniform, level, deviations = rs.body, rs.uniform, rs.level, rs.deviations
    passes = rs.passes
    # where each value is read: the pass of an elementwise use, or the pass before a row sum's result
    # (for deviation sums, x's own pass, and m where their row sum is taken)
    used: dict[str, set[int]] = {}
    for instr in body:
        if dev := deviations.get(instr.result):
            used.setdefault(dev.x, set()).add(level.get(dev.x, 0))
            used.setdefault(dev.m, set()).add(level[instr.result])
            continue
        for a in instr_reads(instr):
            used.setdefault(a, set()).add(level[instr.result] - sums_the_row(instr))
    read = [v for v in inputs if v in used or v in stores]
    per_element = [v for v in (*read, *(i.result for i in body)) if v not in uniform]
    made = {v: level[v] if v in level else min(used.get(v, {0})) for v in per_element}  # an input: first read
    columns = -(-launch.width // BLOCK)
    # A later pass's inputs are loaded in the first, while what the thread holds for them fits in
    # registers: their trips to memory then overlap the first pass's instead of following a row sum.
    early = 0
    for v in read:
        if v in made and made[v] > 0 and columns <= MAX_UNROLLED_COLUMNS \
                and early + columns <= EARLY_LOAD_FLOATS:
            made[v], early = 0, early + columns
    kept = [v for v in per_element if max(used.get(v, set()), default=-1) > made[v]]
    partial = rs.floats

    def load(v: str) -> str:
        acc, ptr = inputs[v]
        at = element_index(acc)
        return acc.dtype.load(f"__ldcg({ptr} + {at})" if device and acc.buffer in written else f"{ptr}[{at}]")

    def store(target: str, assign: str, value: str, i: int) -> str:
        """`target` (param i's element) set to, or added `value`."""
        dtype = params[i].access.dtype
        if assign == "=":
            return f"{target} = {dtype.store(value)};"
        if device or dtype != COMPUTE:  # what it adds to, other blocks may have written (through L2)
            old = f"__ldcg(&{target})" if device else target
            return f"{target} = {dtype.store(f'{dtype.load(old)} + {value}')};"
        return f"{target} += {value};"
    var = c_vars([*read, *(instr.result for instr in body)])
    width = float_literal(launch.width)

    def compute(instr: Instr | GradInstr) -> None:
        expr, what = expression(instr, var, width)
        w(f"const {F} {var[instr.result]} = {expr};  // {comment_text(what)}")

    covered = ", ".join(instr.result for instr in launch.body)
    how = ", row sums by warp shuffles and shared memory" if partial else ""
    w = CWriter()
    w("// " + comment_text(f"{launch.island}: {covered}"),
      f"// runs {when_it_runs(launch)}; a block per row of {launch.width} columns, {passes} pass(es) "
      f"over the row{how}",
      f"__device__ __forceinline__ void {name}(" if device else
      f'extern "C" __global__ void __launch_bounds__({BLOCK}) {name}(')
    args = [*(f"{pointer_type(p)} __restrict__ {n}"
              for p, n in zip(params, pointer, strict=True)), "int rows", *(["int t"] if published else [])]
    with w.indented():
        w(*(f"{arg}," for arg in args[:-1]), f"{args[-1]})")
    with w.block("{"):
        w(f"const int width = {launch.width};",
          f"constexpr int COLUMNS = {columns};  // of the row, per thread")
        if partial:
            w(f"constexpr int WARPS = {BLOCK // WARP};",
              f"__shared__ {F} cf_partial[{partial}];  // the warps' partial row sums")
        with w.block("for (int r = blockIdx.x; r < rows; r += gridDim.x) {  // alike for the whole block"):
            _rows(w, rs, read, kept, uniform, made, used, stores, published, var, width, columns, load, store,
                  compute)
    return w.text()


def _rows(w: CWriter, rs: RowSums, read, kept, uniform, made, used, stores, published, var, width, columns,
          load, store, compute) -> None:
    """The passes over row r, each its elementwise work and the row sums that end it."""
    body, level, deviations = rs.body, rs.level, rs.deviations
    for v in read:
        if v in uniform:
            w(f"const {F} {var[v]} = {load(v)};")
    for v in kept:
        w(f"{F} a_{var[v]}[COLUMNS];  // kept for a later pass")

    def store_uniform(v: str) -> None:
        for target, assign, i in stores.get(v, []):
            cond = "threadIdx.x == 0" + (" && r == 0" if target.endswith("[0]") else "")
            w(f"if ({cond}) {store(target, assign, var[v], i)}")

    for v in read:
        if v in uniform:
            store_uniform(v)
    totals: dict[str, tuple[str, str]] = {}  # x -> its row's sum and deviation sum, once gathered
    for step in range(rs.passes):
        for instr in body:  # what is uniform over the row, once the row sums it needs are done
            if level[instr.result] != step or instr.result not in uniform:
                continue
            if dev := deviations.get(instr.result):
                total = f"cf_deviations({', '.join(totals[dev.x])}, {var[dev.m]}, {width})"
                expr = instr.op.cuda.format(total, width=width)
                w(f"const {F} {var[instr.result]} = {expr};  // {instr.op.name}, from deviation sums")
                store_uniform(instr.result)
            elif not sums_the_row(instr):
                compute(instr)
                store_uniform(instr.result)
        plain, own, stats = rs.sums(step)
        work = [i for i in body if level[i.result] == step and i.result not in uniform]
        loads = [v for v in read if v not in uniform and made[v] == step]
        reads = [v for v in kept if made[v] < step and step in used.get(v, set())]
        if not (plain or stats or work or loads or reads):
            continue
        for i, red in enumerate(own):
            w(f"{F} s_{step}_{i} = 0.0f;  // {comment_text(red.result)}: the thread's part of the row sum")
        for i, x in enumerate(stats):
            w(f"{F} ds_{step}_{i} = 0.0f, dm_{step}_{i} = 0.0f, dq_{step}_{i} = 0.0f;  // "
              f"{comment_text(x)}: the thread's sum, mean and squared deviations from it")
        w(f"// pass {step + 1} over the row")
        if columns <= MAX_UNROLLED_COLUMNS:
            w("#pragma unroll")
        with w.block("for (int k = 0; k < COLUMNS; ++k) {"):
            w(f"const int j = threadIdx.x + k * {BLOCK};")
            with w.block("if (j < width) {"):
                for v in loads:
                    w(f"const {F} {var[v]} = {load(v)};")
                for v in reads:
                    w(f"const {F} {var[v]} = a_{var[v]}[k];")
                for instr in work:
                    compute(instr)
                for v in [*loads, *(i.result for i in work)]:
                    if v in kept:
                        w(f"a_{var[v]}[k] = {var[v]};")
                    for target, assign, i in stores.get(v, []):
                        vec = target.endswith("[j]")
                        w(f"{'if (r == 0) ' if vec else ''}{store(target, assign, var[v], i)}")
                        if i in published:
                            w(published[i](var[v]))
                for i, red in enumerate(own):
                    w(f"s_{step}_{i} += {var[red.args[0]]};")
                for i, x in enumerate(stats):  # Welford's update, k + 1 values so far (k a constant)
                    w(f"ds_{step}_{i} += {var[x]};")
                    with w.block("{"):
                        w(f"const {F} dv = {var[x]} - dm_{step}_{i};",
                          f"dm_{step}_{i} += dv * (1.0f / (k + 1));",
                          f"dq_{step}_{i} += dv * ({var[x]} - dm_{step}_{i});")
        if not (own or stats):
            continue
        with w.block("{  // the row sums: a warp's by shuffles, then the warps' in shared memory"):
            w(*(f"const {F} w_{i} = cf_lanes_sum(s_{step}_{i}, {WARP});" for i in range(len(own))),
              *(f"cf_lanes_deviations(ds_{step}_{i}, dq_{step}_{i}, {WARP}, COLUMNS);"
                for i in range(len(stats))),
              "__syncthreads();  // every thread has read the row sums before these")
            with w.block(f"if (threadIdx.x % {WARP} == 0) {{"):
                w(*(f"cf_partial[{i} * WARPS + threadIdx.x / {WARP}] = w_{i};" for i in range(len(own))))
                for i in range(len(stats)):
                    at = len(own) + 2 * i
                    w(f"cf_partial[{at} * WARPS + threadIdx.x / {WARP}] = ds_{step}_{i};",
                      f"cf_partial[{at + 1} * WARPS + threadIdx.x / {WARP}] = dq_{step}_{i};")
            w("__syncthreads();")
        sums = {}
        for i, red in enumerate(own):
            # each group of WARPS lanes sums the warps' sums: fewer shuffles than a warp's 32 lanes (zeros
            # past WARPS), and the same sum, in the same order
            sums[red.result] = f"t_{i}_{step}"
            w(f"const {F} t_{i}_{step} = "
              f"cf_lanes_sum(cf_partial[{i} * WARPS + threadIdx.x % WARPS], WARPS);")
        for i, x in enumerate(stats):
            at = len(own) + 2 * i
            totals[x] = (f"ts_{i}_{step}", f"tq_{i}_{step}")
            w(f"{F} ts_{i}_{step} = cf_partial[{at} * WARPS + threadIdx.x % WARPS];",
              f"{F} tq_{i}_{step} = cf_partial[{at + 1} * WARPS + threadIdx.x % WARPS];",
              f"cf_lanes_deviations(ts_{i}_{step}, tq_{i}_{step}, WARPS, {WARP} * COLUMNS);")
        for red in plain:
            total = sums.get(red.result) or totals[red.args[0]][0]
            w(f"const {F} {var[red.result]} = {red.op.cuda.format(total, width=width)};  // {red.op.name}")
            store_uniform(red.result)
