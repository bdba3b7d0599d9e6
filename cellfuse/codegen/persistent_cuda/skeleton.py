"""A persistent kernel from top to bottom: its exchanges and device functions, its signature, each block's
rows and columns, the states copied in, shared memory set up, the loop over the steps with each step's
launches in order (and the barriers or exchanges between them), the states copied out."""

from __future__ import annotations

from collections.abc import Callable

from ..address import c_address
from ..c_text import comment_text
from ..cuda_rows import reduction_kernel_source
from ..kernel_abi import BLOCK, kernel_params
from ..plan import GemmLaunch, KernelLaunch, PersistentItem, PersistentLaunch
from ..tiling import FRAGMENT_REGISTERS
from . import gemm_fma, gemm_mma
from .context import Kernel
from .elementwise import (
    ahead,
    carry_in,
    depth,
    elementwise,
    fixed,
    load_ahead,
    load_at,
    load_fixed,
    load_next,
    prefetch,
    prefetch_rows,
    read_only,
    rotate,
)
from .exchange import publish_initial, published
from .shared_memory import shared_memory, weights_in_registers

KERNEL_START = (
    "extern __shared__ __align__(128) float cf_smem[];  // each part 32-byte aligned (see tiling.whole32)",
    "cooperative_groups::grid_group grid = cooperative_groups::this_grid();",
    "const int tid = threadIdx.x;",
    "(void)grid; (void)tid;",
)

# At the top of a launch whose blocks are independent: the executor launches it while the kernel before it
# on the stream may still run, its launch and its blocks' start hidden behind that kernel's last blocks
# (benchmarks/probes/indrnn_kernels_probe.py measured the gain:
# docs/results/2026-11-27-persistent-rungs-changes-14-to-19.md, change 19); it waits here for that kernel
# to end and its writes to be seen. Launched otherwise, the wait returns at once.
PDL_WAIT = (
    "#if __CUDA_ARCH__ >= 900",
    'asm volatile("griddepcontrol.wait;" ::: "memory");',
    "#endif",
)


def persistent_source(launch: PersistentLaunch, name: str, k_unroll: int = 0,
                      fragments: int = FRAGMENT_REGISTERS) -> str:
    """The source of a persistent launch's kernel (and the device functions and exchanges it uses); its
    GEMMs' loops over K unrolled `k_unroll` iterations at a time where they have more (see
    gemm_fma.k_loop_unroll), and fragments of W kept in at most `fragments` registers a thread (see
    gemm_mma.fragments)."""
    k = Kernel(launch, name, k_unroll, fragments)
    w = k.w
    for n, ex in enumerate(launch.exchange):
        w(f"// the exchange of {comment_text(ex.buffer)}: two slots of [batch][{ex.width}] (step tag, value) "
          "pairs; one run of the kernel at a time uses it",
          f"__device__ unsigned long long {name}_x{n}[{2 * launch.batch * ex.width}];", "")
    steps = (f"the backward pass of every step of layer {launch.layer}, from the last to the first,"
             if launch.reverse else f"every step of layer {launch.layer}")
    assert launch.threads == BLOCK, "a block per row runs the body of a kernel of BLOCK threads"
    # of each block per row: where it publishes what other blocks read from an exchange
    publishes = {i: published(k, i) for i, item in enumerate(launch.items) if item.by_rows}
    for i, item in enumerate(launch.items):
        if item.by_rows:
            w(reduction_kernel_source(item.launch, f"{name}_rows{i}", device=True,
                                      written=frozenset(k.written), published=publishes[i]))
    how = "cooperative launch" if launch.cooperative else "launch"
    w(f"// {steps} in one {how} of {launch.blocks} blocks of {launch.threads} threads",
      f"// ({launch.column_blocks} column blocks x {launch.row_groups} row groups), {launch.waits_text}, "
      f"{launch.smem_bytes} bytes of shared memory per block,",
      f"// a batch of at most {launch.batch}; arguments:",
      *(f"//   {k.var[b]}: {comment_text(b)}" for b in k.buffers),
      f'extern "C" __global__ void __launch_bounds__({launch.threads}, 1) {name}(')
    args = ["int seq", "int batch", *(f"{k.dtype[b].c}* {k.var[b]}" if b in k.written else
                                      f"const {k.dtype[b].c}* __restrict__ {k.var[b]}" for b in k.buffers)]
    with w.indented():
        w(*(f"{arg}," for arg in args[:-1]), f"{args[-1]})")
    with w.block("{"):
        w(*KERNEL_START)
        if not launch.cooperative:
            w(*PDL_WAIT)
        _body(k, publishes)
    return w.text()


def _body(k: Kernel, publishes: dict[int, dict[int, Callable[[str], str]]]) -> None:
    """What a block of the launch does, from its shared memory to its last step."""
    launch, w = k.launch, k.w
    columns = launch.column_blocks
    w(f"const int cb = blockIdx.x % {columns}, rg = blockIdx.x / {columns};",
      f"const int rows_per_group = (batch + {launch.row_groups - 1}) / {launch.row_groups};",
      "const int row0 = min(batch, rg * rows_per_group), rows = min(batch, row0 + rows_per_group) - row0;",
      "(void)cb; (void)rows;")
    if launch.states:
        _copy_states(k, "0", "initial", "read")
        w("grid.sync();  // every block's initial states are where the first step reads them"
          if launch.initial_barrier else
          "__syncthreads();  // the block's initial states are where its first step reads them")
    if launch.exchange:
        publish_initial(k)
    shared_memory(k)
    weights_in_registers(k)
    gemm_mma.load_fragments(k)
    loads, carried = ahead(k)
    steps = depth(k, loads) if loads else 0
    k.masked = bool(steps)
    nxt = {} if steps else read_only(k)
    if carried:
        carry_in(k, carried)
    if once := fixed(k):
        load_fixed(k, once)
    if nxt:  # the first step's, before the loop; each step then loads the next one's
        load_at(k, nxt, "seq - 1" if launch.reverse else "0")
    if steps:  # a chunk of steps' inputs loaded at once, then the steps, their loop unrolled
        with w.block(f"for (int t0 = 0; t0 < seq; t0 += {steps}) {{"):
            load_ahead(k, loads, steps)
            w("#pragma unroll")
            with w.block(f"for (int d = 0; d < {steps}; ++d) {{"):
                w("const int t = t0 + d;", "if (t >= seq) break;")
                _step(k, publishes, loads, carried, nxt, once)
    else:
        with w.block("for (int t = seq - 1; t >= 0; --t) {" if launch.reverse else
                     "for (int t = 0; t < seq; ++t) {"):
            _step(k, publishes, loads, carried, nxt, once)
    if launch.states:
        w("grid.sync();  // blocks per row wrote the final states" if launch.final_barrier else
          "__syncthreads();  // the block wrote its final states")
        _copy_states(k, "seq", "read", "final")


def _step(k: Kernel, publishes, loads, carried, nxt, once) -> None:
    """One step: its loads started, then its launches in order."""
    launch, w = k.launch, k.w
    skip = {i: {*loads.get(i, {}), *carried.get(i, {}), *nxt.get(i, {})} for i in {*loads, *carried, *nxt}}
    prefetched = prefetch(k, skip)
    for i, arrays in once.items():
        prefetched.setdefault(i, {}).update(arrays)
    for i, arrays in loads.items():
        prefetched.setdefault(i, {}).update({p_i: f"{array}[d]" for p_i, array in arrays.items()})
    if nxt:
        for i, arrays in rotate(k, nxt).items():
            prefetched.setdefault(i, {}).update(arrays)
        if not launch.waits_per_step:
            load_next(k, nxt)
    n, first_barrier = len(launch.items), True
    if not launch.waits_per_step:
        prefetch_rows(k)
    for i, item in enumerate(launch.items):
        with w.block("{" + f"  // {comment_text(_item_name(item))}"):
            if item.barrier:
                w("grid.sync();" if launch.grid_barrier(item) else
                  "// no barrier: the operand's rows are read from its exchange once written")
                if nxt and first_barrier:
                    load_next(k, nxt)
                if first_barrier:
                    prefetch_rows(k)
                first_barrier = False
            match item.launch:
                case GemmLaunch():
                    (gemm_mma if item.mma else gemm_fma).gemm(k, i, item)
                case KernelLaunch() if item.by_rows:
                    params = kernel_params(item.launch)
                    args = [c_address(k.var[p.access.buffer], p.access) for p in params]
                    tag = ", t" if publishes[i] else ""
                    w(f"{k.name}_rows{i}({', '.join(args)}, batch{tag});  // a block per row")
                case KernelLaunch():
                    elementwise(k, i, item, prefetched.get(i, {}), carried.get(i, {}))
                    if _needs_sync(item, launch.items[(i + 1) % n]):
                        w("__syncthreads();")


def _copy_states(k: Kernel, step: str, source: str, target: str) -> None:
    """The block's own elements of each state copied, at step `step`, from one of its places (see
    `StateCopies`) to another. An exported program's caller may pass no initial states (zeros then) and
    ask for no final ones: their pointers may be null."""
    launch, width, w = k.launch, k.launch.states[0].initial.ld, k.w
    unit = launch.unit(width)
    with w.block("{"):
        w(f"const int t = {step};")
        with w.block(f"for (int e = tid; e < rows * {unit}; e += {launch.threads}) {{"):
            w(f"const int r = row0 + e / {unit}, j = cb * {unit} + e % {unit};",
              f"if (j >= {width}) continue;")
            for state in launch.states:
                to, fro = getattr(state, target), getattr(state, source)
                value = fro.dtype.load(f"({c_address(k.var[fro.buffer], fro)})[(size_t)r * {fro.ld} + j]")
                if fro is state.initial:
                    value = f"{k.var[fro.buffer]} ? {value} : 0.0f"
                value = to.dtype.store(value)
                guard = f"if ({k.var[to.buffer]}) " if to is state.final else ""
                w(f"{guard}({c_address(k.var[to.buffer], to)})[(size_t)r * {to.ld} + j] = {value};")


def _item_name(item: PersistentItem) -> str:
    match item.launch:
        case GemmLaunch() as g:
            where = "in shared memory" if item.on_chip else "read from L2"
            what = "dA += dC @ W^T" if g.trans_w and g.accumulate else "A @ W"
            return f"{g.group}: this block's part of {what}, W {where}"
        case KernelLaunch() as k:
            return f"{k.island}: {', '.join(op.result for op in k.body) or 'stores'}"
        case other:
            raise TypeError(f"unknown launch {other!r}")


def _needs_sync(item: PersistentItem, after: PersistentItem) -> bool:
    """Whether the block's threads must wait for each other between an elementwise launch and the next:
    not where both give each thread the same elements (it reads only what it wrote itself). A GEMM starts
    with its own wait."""
    if isinstance(after.launch, GemmLaunch):
        return False
    same = (after.whole == item.whole and after.launch.width == item.launch.width
            and after.launch.rows == item.launch.rows)
    return not same
