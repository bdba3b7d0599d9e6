"""CUDA C for a persistent launch: one cooperative kernel that runs every step of a layer.

Block `blk` is column block `cb` of row group `rg` (see `PersistentItem`). Before its loop it copies its
columns of the recurrent weights into shared memory, transposed so that K is contiguous, padded with
zeros. Per step it first loads what the step's elementwise work reads and nothing in the step writes
(the hoisted GEMMs' rows of this step, biases, its own states), so that those loads fly while it waits
at the barrier; then it runs the step's launches in order. A GEMM stages its rows of the left operand,
all of K, with asynchronous copies through L2 (other blocks wrote them, and L1 is not coherent between
SMs), and keeps its output in shared memory where only its own elementwise work reads it; an
elementwise launch runs the body of the hoisted rung's fused kernel on the block's own elements. Where
the plan waits for other blocks, a cooperative-groups grid barrier (cheaper on an H100 than a barrier of
acquire/release atomics: see benchmarks/barrier_probe.cu), or, where the plan passes the operand through
an exchange (`PersistentLaunch.exchange`), none before the GEMM: its writer (an elementwise launch, or
a block per row, whose device function publishes as it stores) also stores each value with its step's
tag in the exchange, and the GEMM stages its rows from there once their tags are the step's.
"""

from __future__ import annotations

from dataclasses import replace

from .cuda_kernels import (
    BLOCK,
    ROW_EXPR,
    Param,
    comment_text,
    element_body,
    element_index,
    kernel_params,
    loaded,
    reduction_kernel_source,
)
from .persistent import (
    MMA_K_BLOCK,
    MMA_M,
    MMA_N,
    WARPS,
    GemmTiling,
    final_states_barrier,
    gemm_tiling,
    independent_blocks,
    initial_states_barrier,
    output_floats,
    whole32,
    writes,
)
from .plan import Access, Exchange, GemmLaunch, KernelLaunch, PersistentItem, PersistentLaunch


def _tree_sum(terms: list[str]) -> str:
    """The terms added in pairs, the pairs in pairs, and so on."""
    while len(terms) > 1:
        pairs = [f"({terms[n]} + {terms[n + 1]})" for n in range(0, len(terms) - 1, 2)]
        terms = pairs + terms[len(terms) & ~1:]
    return terms[0]


PERSISTENT_PRELUDE = """\
#include <cooperative_groups.h>

// 16 bytes from global to shared memory without a register, cached in L2 only: other blocks wrote them.
__device__ __forceinline__ void cf_copy16(float* shared, const float* global) {
    const unsigned to = (unsigned)__cvta_generic_to_shared(shared);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\\n" :: "r"(to), "l"(global) : "memory");
}

// A hint: the 128-byte line at `p` into L2, where a load through L2 finds it later.
__device__ __forceinline__ void cf_prefetch_l2(const float* p) {
    asm volatile("prefetch.global.L2 [%0];\\n" :: "l"(p));
}

__device__ __forceinline__ void cf_copies_done() {
    asm volatile("cp.async.wait_all;\\n" ::: "memory");
}

// An exchange's (step tag, value) pair, 8 aligned bytes: stored at once and read at once, so that a
// reader that sees the tag it waits for sees the value that came with it.
__device__ __forceinline__ void cf_publish(unsigned long long* at, unsigned tag, float v) {
    const unsigned long long w = ((unsigned long long)tag << 32) | __float_as_uint(v);
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;\\n" :: "l"(at), "l"(w) : "memory");
}

__device__ __forceinline__ void cf_peek(const unsigned long long* at, unsigned long long& a) {
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];\\n" : "=l"(a) : "l"(at) : "memory");
}

__device__ __forceinline__ void cf_peek2(const unsigned long long* at, unsigned long long& a,
                                         unsigned long long& b) {
    asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];\\n" : "=l"(a), "=l"(b) : "l"(at) : "memory");
}

// A float32 value split in two TF32 ones (10 bits of mantissa each): hi, its 13 low bits cleared, and
// lo = v - hi, exact in float32, whose low bits the tensor cores leave out as they do hi's. Two
// instructions: cvt.rna.tf32.f32, which rounds instead, compiles to five on an H100 (the LSTM's
// persistent kernel at B=64 took 0.770 ms with it, 0.699 with this, 0.634 with no split at all).
__device__ __forceinline__ void cf_split_tf32(float v, unsigned& hi, unsigned& lo) {
    hi = __float_as_uint(v) & 0xffffe000u;
    lo = __float_as_uint(v - __uint_as_float(hi));
}

// A block's part of a GEMM's output kept as each warp's partial sums, [rows][warps][COLS]: c[i], i a
// row's start plus a column, adds the warps' partials of that column, as a tree (fewer dependent adds).
template <int COLS> struct cf_warp_sums {
    const float* p;
    __device__ __forceinline__ float operator[](int i) const {
        return WARP_SUMS;
    }
};

// c += a @ b on tensor cores: a 16 x 8 tile of C over eight k, the fragments as mma.sync lays them out.
__device__ __forceinline__ void cf_mma_tf32(float (&c)[4], unsigned a0, unsigned a1, unsigned a2,
                                            unsigned a3, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
""".replace("WARP_SUMS", _tree_sum([f"p[i + {w} * COLS]" for w in range(WARPS)]))

PREFETCH_ELEMENTS = 4  # per thread, at most, for an elementwise launch's loads to start the step early
AHEAD_REGISTERS = 64  # per thread, at most, for the inputs of the steps ahead in a launch with no barrier
AHEAD_STEPS = 16  # steps whose inputs a launch with no barrier loads at once, at most
POLL_PIECES = 16  # loads of an exchange's pairs a thread has in flight at once, at most
W_LOADS = 8  # loads of the on-chip weights a thread has in flight at once, before the loop
POLL_ROUNDS = 1 << 24  # rounds of polling an exchange, at most (seconds; a step waits microseconds)
FULL_UNROLL = 32  # iterations of a GEMM's loop over K, at most, unrolled whole (else two at a time)
# The slot a step writes and the next step reads: of the state a launch with no barrier carries in
# registers from one step to the next.
_NEXT_SLOT = {"t%2": "(t+1)%2", "t": "t+1"}
IND = "            "  # the body of one launch in the step loop


def persistent_buffers(launch: PersistentLaunch) -> list[str]:
    """The buffers the kernel reads or writes, in the order of its pointer arguments (after seq, batch)."""
    names: dict[str, None] = {}
    for item in launch.items:
        match item.launch:
            case GemmLaunch() as g:
                names.update(dict.fromkeys([g.a.buffer, g.w, g.c.buffer, *([g.bias] if g.bias else [])]))
            case KernelLaunch() as k:
                names.update(dict.fromkeys(acc.buffer for _, acc in (*k.inputs, *k.outputs)))
            case other:
                raise TypeError(f"unknown launch {other!r}")
    for state in launch.states:
        names.update(dict.fromkeys([state.initial.buffer, state.read.buffer, state.final.buffer]))
    return list(names)


def _at_step(var: str, acc: Access) -> str:
    """The address of an access's first element at step t, in a kernel with `batch` as an argument."""
    row = ROW_EXPR[acc.slot].format(t="t")
    rows = " + ".join(part for part in (f"(size_t){acc.block} * batch" if acc.block else "",
                                        row if row != "0" and acc.kind in ("row", "col") else "") if part)
    parts = [var] + ([f"({rows}) * {acc.ld}"] if rows else []) + ([str(acc.col)] if acc.col else [])
    return " + ".join(parts)


class _Kernel:
    """The text of one persistent kernel, written line by line. `var` names the kernel's pointer
    arguments, `written` those it writes."""

    def __init__(self, launch: PersistentLaunch, name: str):
        self.launch, self.name = launch, name
        self.buffers = persistent_buffers(launch)
        self.var = {b: f"b{i}" for i, b in enumerate(self.buffers)}
        self.written = set().union(*(writes(item.launch) for item in launch.items),
                                   (state.final.buffer for state in launch.states))
        self.gemms = [(i, item) for i, item in enumerate(launch.items) if isinstance(item.launch, GemmLaunch)]
        # (the plan chose which GEMMs multiply in registers: their tiling is that one)
        self.tilings = {i: gemm_tiling(item.columns, launch.column_blocks, launch.row_tile, item.launch.k,
                                       item.mma, item.in_registers) for i, item in self.gemms}
        # GEMM outputs in shared memory: buffer -> (the GEMM's index, its item)
        self.on_chip = {item.launch.c.buffer: (i, item) for i, item in self.gemms if item.output_on_chip}
        # what kernels that run a block per row write: other blocks read it, after a barrier, through L2
        self.written_by_rows = set().union(*(writes(item.launch) for item in launch.items if item.by_rows))
        # exchanged operands: buffer -> (its index, its Exchange)
        self.exchange = {ex.buffer: (n, ex) for n, ex in enumerate(launch.exchange)}
        # of each block per row that writes an exchanged operand: where it publishes (see `_published`)
        self.published = {i: self._published(i) for i, item in enumerate(launch.items) if item.by_rows}
        # In a launch whose steps' inputs are loaded ahead, a thread's elements are not skipped by branches
        # but masked (see `_element_loop`); set by `body`.
        self.masked = False
        self.lines: list[str] = []

    def w(self, *lines: str) -> None:
        self.lines += lines

    def source(self) -> str:
        """A kernel of its own: every step of the layer."""
        launch = self.launch
        for n, ex in enumerate(launch.exchange):
            self.w(f"// the exchange of {comment_text(ex.buffer)}: two slots of [batch][{ex.width}] "
                   "(step tag, value) pairs; one run of the kernel at a time uses it",
                   f"__device__ unsigned long long {self.name}_x{n}[{2 * launch.batch * ex.width}];", "")
        steps = (f"the backward pass of every step of layer {launch.layer}, from the last to the first,"
                 if launch.reverse else f"every step of layer {launch.layer}")
        assert launch.threads == BLOCK, "a block per row runs the body of a kernel of BLOCK threads"
        for i, item in enumerate(launch.items):
            if item.by_rows:
                self.w(reduction_kernel_source(item.launch, f"{self.name}_rows{i}", device=True,
                                               written=frozenset(self.written), published=self.published[i]))
        how = "launch" if independent_blocks(launch) else "cooperative launch"
        self.w(f"// {steps} in one {how} of {launch.blocks} blocks of {launch.threads} threads",
               f"// ({launch.column_blocks} column blocks x {launch.row_groups} row groups), "
               f"{launch.waits_text}, {launch.smem_bytes} bytes of "
               "shared memory per block,",
               f"// a batch of at most {launch.batch}; arguments:")
        self.w(*signature(self.buffers, self.var, self.written, launch.threads, self.name),
               "{", *KERNEL_START)
        if independent_blocks(launch):
            self.w(*PDL_WAIT)
        self.body()
        self.w("}")
        return "\n".join(self.lines) + "\n"

    def body(self) -> None:
        """What a block of the launch does, from its shared memory to its last step."""
        launch = self.launch
        columns = launch.column_blocks
        self.w(f"    const int cb = blockIdx.x % {columns}, rg = blockIdx.x / {columns};",
               f"    const int rows_per_group = (batch + {launch.row_groups - 1}) / {launch.row_groups};",
               "    const int row0 = min(batch, rg * rows_per_group), "
               "rows = min(batch, row0 + rows_per_group) - row0;",
               "    (void)cb; (void)rows;")
        if launch.states:
            self._copy_states("0", "initial", "read")
            self.w("    grid.sync();  // every block's initial states are where the first step reads them"
                   if initial_states_barrier(launch) else
                   "    __syncthreads();  // the block's initial states are where its first step reads them")
        if launch.exchange:
            self._publish_initial()
        self._shared_memory()
        self._weights_in_registers()
        ahead, carried = self._ahead()
        depth = self._depth(ahead) if ahead else 0
        self.masked = bool(depth)
        nxt = {} if depth else self._read_only()
        if carried:
            self._carry_in(carried)
        if fixed := self._fixed():
            self._load_fixed(fixed)
        if nxt:  # the first step's, before the loop; each step then loads the next one's
            self._load_at(nxt, "seq - 1" if launch.reverse else "0", "    ")
        if depth:  # a chunk of steps' inputs loaded at once, then the steps, their loop unrolled
            self.w(f"    for (int t0 = 0; t0 < seq; t0 += {depth}) {{")
            self._load_ahead(ahead, depth)
            self.w("    #pragma unroll",
                   f"    for (int d = 0; d < {depth}; ++d) {{",
                   "        const int t = t0 + d;",
                   "        if (t >= seq) break;")
        elif launch.reverse:
            self.w("    for (int t = seq - 1; t >= 0; --t) {")
        else:
            self.w("    for (int t = 0; t < seq; ++t) {")
        skip = {i: {*ahead.get(i, {}), *carried.get(i, {}), *nxt.get(i, {})}
                for i in {*ahead, *carried, *nxt}}
        prefetched = self._prefetch(skip)
        for i, arrays in fixed.items():
            prefetched.setdefault(i, {}).update(arrays)
        for i, arrays in ahead.items():
            prefetched.setdefault(i, {}).update({p_i: f"{array}[d]" for p_i, array in arrays.items()})
        if nxt:
            for i, arrays in self._rotate(nxt).items():
                prefetched.setdefault(i, {}).update(arrays)
            if not launch.waits_per_step:
                self._load_next(nxt, "        ")
        n, first_barrier = len(launch.items), True
        if not launch.waits_per_step:
            self._prefetch_rows("        ")
        for i, item in enumerate(launch.items):
            self.w("        {" + f"  // {comment_text(_item_name(item))}")
            if item.barrier:
                self.w(f"{IND}grid.sync();" if launch.grid_barrier(item) else
                       f"{IND}// no barrier: the operand's rows are read from its exchange once written")
                if nxt and first_barrier:
                    self._load_next(nxt, IND)
                if first_barrier:
                    self._prefetch_rows(IND)
                first_barrier = False
            match item.launch:
                case GemmLaunch():
                    self._gemm(i, item)
                case KernelLaunch() if item.by_rows:
                    params = kernel_params(item.launch)
                    args = [_at_step(self.var[p.access.buffer], p.access) for p in params]
                    step = ", t" if self.published[i] else ""
                    self.w(f"{IND}{self.name}_rows{i}({', '.join(args)}, batch{step});  // a block per row")
                case KernelLaunch():
                    self._elementwise(i, item, prefetched.get(i, {}), carried.get(i, {}))
                    if _needs_sync(item, launch.items[(i + 1) % n]):
                        self.w(f"{IND}__syncthreads();")
            self.w("        }")
        self.w("    }")
        if depth:
            self.w("    }")
        if launch.states:
            self.w("    grid.sync();  // blocks per row wrote the final states"
                   if final_states_barrier(launch) else
                   "    __syncthreads();  // the block wrote its final states")
            self._copy_states("seq", "read", "final")

    def _copy_states(self, step: str, source: str, target: str) -> None:
        """The block's own elements of each state copied, at step `step`, from one of its places (see
        `StateCopies`) to another. An exported program's caller may pass no initial states (zeros
        then) and ask for no final ones: their pointers may be null."""
        launch, width = self.launch, self.launch.states[0].initial.ld
        unit = launch.unit(width)
        self.w("    {",
               f"        const int t = {step};",
               f"        for (int e = tid; e < rows * {unit}; e += {launch.threads}) {{",
               f"            const int r = row0 + e / {unit}, j = cb * {unit} + e % {unit};",
               f"            if (j >= {width}) continue;")
        for state in launch.states:
            to, fro = getattr(state, target), getattr(state, source)
            value = f"({_at_step(self.var[fro.buffer], fro)})[(size_t)r * {fro.ld} + j]"
            if fro is state.initial:
                value = f"{self.var[fro.buffer]} ? {value} : 0.0f"
            guard = f"if ({self.var[to.buffer]}) " if to is state.final else ""
            at = f"({_at_step(self.var[to.buffer], to)})[(size_t)r * {to.ld} + j]"
            self.w(f"            {guard}{at} = {value};")
        self.w("        }",
               "    }")

    def _exchange_at(self, n: int, ex, slot: str, row: str, col: str, batch: str = "batch") -> str:
        """The address of an exchange's pair at row `row`, column `col` of the slot `slot` & 1 (a value
        written at step t goes to slot t & 1, the initial state's to slot 1)."""
        return (f"{self.name}_x{n} + (size_t)(({slot}) & 1) * {batch} * {ex.width} "
                f"+ (size_t)({row}) * {ex.width}" + (f" + {col}" if col != "0" else ""))

    def _exchanged_outputs(self, i: int, params: list) -> list[tuple[int, int, Exchange]]:
        """The outputs of item i (a kernel with those parameters) that other blocks read from an
        exchange: (the output's index among the parameters, the exchange's index, the Exchange)."""
        return [(n, *self.exchange[p.access.buffer]) for n, p in enumerate(params)
                if p.output and p.access.buffer in self.exchange
                and self.exchange[p.access.buffer][1].writer == i]

    def _at_columns(self, n: int, x: int, ex: Exchange, params: list, batch: str = "batch") -> str:
        """Where output n of an exchange's writer goes in it at row r, column j of the step t: at its
        columns of the exchange."""
        col = params[n].access.col - ex.col
        return self._exchange_at(x, ex, "t", "r", f"j + {col}" if col else "j", batch)

    def _published(self, i: int) -> dict[int, str]:
        """Of a block per row that writes an exchanged operand (item i), where each such output (by its
        index among the kernel's parameters) goes in its exchange, in the terms of the device function
        (the batch is `rows` there)."""
        params = kernel_params(self.launch.items[i].launch)
        return {n: self._at_columns(n, x, ex, params, "rows")
                for n, x, ex in self._exchanged_outputs(i, params)}

    def _publish_initial(self) -> None:
        """Before the loop, each block's own elements of every exchange: both slots cleared (tag 0, which
        no step waits for, so that no pair of an earlier run is taken for one of this run's), and, for
        an operand the first step reads from before the loop (the initial state), its values with the
        tag of step -1; then one grid-wide barrier, after which every block sees them. A value written
        at step t has the tag t + 2."""
        launch = self.launch
        for n, ex in enumerate(launch.exchange):
            unit = launch.unit(ex.width)
            self.w(f"    for (int e = tid; e < rows * {unit}; e += {launch.threads}) {{",
                   f"        const int r = row0 + e / {unit}, j = cb * {unit} + e % {unit}, t = 0;",
                   "        (void)t;",
                   f"        if (j >= {ex.width}) continue;",
                   f"        cf_publish({self._exchange_at(n, ex, '0', 'r', 'j')}, 0u, 0.0f);")
            if ex.lag == -1:
                a = next(item.launch.a for item in launch.items
                         if isinstance(item.launch, GemmLaunch) and item.launch.a.buffer == ex.buffer)
                self.w(f"        cf_publish({self._exchange_at(n, ex, '1', 'r', 'j')}, 1u,",
                       f"                   ({_at_step(self.var[a.buffer], a)})[(size_t)r * {a.ld} + j]);")
            else:
                self.w(f"        cf_publish({self._exchange_at(n, ex, '1', 'r', 'j')}, 0u, 0.0f);")
            self.w("    }")
        self.w("    grid.sync();  // every block's clearing and initial values are visible")

    def _shared_memory(self) -> None:
        """Where each part of shared memory starts; the on-chip weights loaded, padding zeroed."""
        launch, threads = self.launch, self.launch.threads
        staged = max((whole32(self.tilings[i].padded_rows * self.tilings[i].stage_stride(item.launch.k))
                      for i, item in self.gemms), default=0)
        offset = staged
        if self.gemms:
            self.w("    float* const cf_stage = cf_smem;  // [rows][k]: a row tile of a GEMM's operand")
        for i, item in self.gemms:
            g, tl = item.launch, self.tilings[i]
            self._column_map(i, item)
            if item.on_chip:
                kp, ncp = tl.w_stride(g.k), tl.padded_cols
                what = f"rows of {comment_text(g.w)} (columns of its transpose)" if g.trans_w else (
                    f"columns of {comment_text(g.w)}, transposed")
                # consecutive threads load consecutive elements of W's rows (of a transposed W, of its
                # columns), W_LOADS loads in flight: one at a time, each thread's 132 loads down a column
                # of W held 5% of the samples of the LSTM's tensor-core kernel at B=64 (ncu)
                along = (f"c = e / {kp}, k = e - c * {kp}" if g.trans_w else
                         f"k = e / {ncp}, c = e - k * {ncp}")
                self.w(f"    float* const w{i} = cf_smem + {offset};  // [{ncp}][{kp}]: this block's {what}",
                       f"    for (int e0 = tid; e0 < {ncp * kp}; e0 += {threads * W_LOADS}) {{",
                       f"        float v[{W_LOADS}];",
                       "        #pragma unroll",
                       f"        for (int q = 0; q < {W_LOADS}; ++q) {{",
                       f"            const int e = e0 + q * {threads}, {along}, n = cols{i}(c);",
                       f"            v[q] = (e < {ncp * kp} && k < {g.k} && n >= 0) ? "
                       f"{self.var[g.w]}[{_w_index(g, 'k', 'n')}] : 0.0f;",
                       "        }",
                       "        #pragma unroll",
                       f"        for (int q = 0; q < {W_LOADS}; ++q) {{",
                       f"            const int e = e0 + q * {threads}, {along};",
                       f"            if (e < {ncp * kp}) w{i}[c * {kp} + k] = v[q];",
                       "        }",
                       "    }")
                offset += whole32(kp * ncp)
            if item.output_on_chip and tl.in_registers:
                width = tl.cols_per_thread
                self.w(f"    float* const cf_part{i} = cf_smem + {offset};  // [rows][{WARPS}][{width}]: "
                       f"each warp's partial sums of this block's part of {comment_text(g.group)}'s output",
                       f"    const cf_warp_sums<{width}> cf_c{i} = {{cf_part{i}}};")
            elif item.output_on_chip:
                self.w(f"    float* const cf_c{i} = cf_smem + {offset};  // [rows][{tl.cols}]: this block's "
                       f"part of {comment_text(g.group)}'s output")
            if item.output_on_chip:
                offset += output_floats(self.launch.group_rows, tl)
        scratch = max((tl.mma_floats for tl in self.tilings.values()), default=0)
        if scratch:
            self.w(f"    float* const cf_mma = cf_smem + {offset};  // the warps' partial tiles of a GEMM's "
                   "output, on tensor cores")
            offset += scratch
        if staged:  # the columns past K of every staged row stay zero: the float4 sums run over them
            self.w(f"    for (int e = tid; e < {staged}; e += {threads}) cf_stage[e] = 0.0f;")
        assert 4 * offset == launch.smem_bytes, "the kernel's shared memory differs from the plan's"
        self.w("    __syncthreads();")

    def _weights_in_registers(self) -> None:
        """Of each GEMM whose products are in registers, the thread's two rows of the block's columns of W
        (its two k of K), from shared memory, once."""
        for i, item in self.gemms:
            tl = self.tilings[i]
            if not tl.in_registers:
                continue
            k, width, kp = item.launch.k, tl.cols_per_thread, tl.w_stride(item.launch.k)
            self.w(f"    float cf_w{i}[2][{width}];",
                   "    #pragma unroll",
                   f"    for (int c = 0; c < {width}; ++c) {{",
                   f"        cf_w{i}[0][c] = 2 * tid < {k} ? w{i}[c * {kp} + 2 * tid] : 0.0f;",
                   f"        cf_w{i}[1][c] = 2 * tid < {k} ? w{i}[c * {kp} + 2 * tid + 1] : 0.0f;",
                   "    }")

    def _column_map(self, i: int, item: PersistentItem) -> None:
        """A lambda from the block's column c of a GEMM to the column of W and C, or -1 for padding."""
        self.w(f"    auto cols{i} = [cb](int c) -> int {{")
        start = offset = 0
        for width in item.columns:
            unit = self.launch.unit(width)
            self.w(f"        if (c < {start + unit}) {{ const int j = cb * {unit} + c - {start}; "
                   f"return j < {width} ? {offset} + j : -1; }}")
            start += unit
            offset += width
        self.w("        return -1;", "    };")

    # -- elementwise work ---------------------------------------------------------------------------
    def _elements(self, item: PersistentItem) -> tuple[int, str, str]:
        """(the most elements a thread takes, the element count, how element e maps to r and j)."""
        k: KernelLaunch = item.launch
        if item.whole:  # the same [N] and scalar values every step, computed by every block
            return (-(-k.rows * k.width // self.launch.threads), str(k.rows * k.width),
                    f"const int r = e / {k.width}, j = e - r * {k.width};")
        unit = self.launch.unit(k.width)
        return (-(-self.launch.group_rows * unit // self.launch.threads), f"rows * {unit}",
                f"const int r = row0 + e / {unit}, j = cb * {unit} + e % {unit};")

    def _params(self, k: KernelLaunch) -> list[Param]:
        return [Param(v, acc, False) for v, acc in k.inputs] + [Param(v, acc, True) for v, acc in k.outputs]

    def _prefetch(self, skip: dict[int, set[int]]) -> dict[int, dict[int, str]]:
        """Loads, at the top of the step, of the elementwise inputs that nothing before their launch in
        the step writes (and that are not on chip), but those of `skip` (per launch, param indices);
        per launch, param index -> register array."""
        out: dict[int, dict[int, str]] = {}
        written: set[str] = set()
        for i, item in enumerate(self.launch.items):
            if isinstance(item.launch, KernelLaunch) and not (item.whole or item.by_rows):
                most = self._elements(item)[0]
                params = self._params(item.launch)
                later = written | self.on_chip.keys() | self.written_by_rows  # (not before the barrier)
                early = [p_i for p_i in self._row_inputs(item) if p_i not in skip.get(i, set())
                         and params[p_i].access.buffer not in later]
                if early and most <= PREFETCH_ELEMENTS:
                    if not out:  # the previous step's writes, by any thread of the block, are done
                        self.w("        __syncthreads();")
                    out[i] = {p_i: f"pf{i}_{p_i}" for p_i in early}
                    self.w(*(f"        float {array}[{most}];" for array in out[i].values()))
                    self._element_loads(item, out[i], "        ")
            written |= writes(item.launch)
        return out

    # -- a launch with no barrier: its steps' inputs loaded ahead, its state carried in registers ------
    def _ahead(self) -> tuple[dict[int, dict[int, str]], dict[int, dict[int, tuple[int, str]]]]:
        """For a forward launch of elementwise work only, with no barrier (each thread owns its elements
        for all steps): per launch, the inputs that no launch of the kernel writes (loaded a chunk of
        steps ahead: param index -> register array [steps][elements]), and the state it reads that it
        wrote itself the step before (param index -> (the output's param index, register array)), which
        stays in registers from step to step. The step's loads would otherwise each wait a round trip
        to memory, one step after the other."""
        launch = self.launch
        if launch.reverse or self.gemms or launch.waits_per_step:
            return {}, {}
        ahead: dict[int, dict[int, str]] = {}
        carried: dict[int, dict[int, tuple[int, str]]] = {}
        for i, item in enumerate(launch.items):
            if item.whole or item.by_rows:
                continue
            if unwritten := self._unwritten(item):
                ahead[i] = {p_i: f"cf_ahead{i}_{p_i}" for p_i in unwritten}
            params = self._params(item.launch)
            others = set().union(*(writes(o.launch) for o in launch.items if o is not item))
            for p_i in self._row_inputs(item):
                acc = params[p_i].access
                slot = _NEXT_SLOT.get(acc.slot)
                if acc.buffer not in self.written or acc.buffer in others or slot is None:
                    continue
                out = [q for q, o in enumerate(params) if o.output and o.access == replace(acc, slot=slot)]
                if out:
                    carried.setdefault(i, {})[p_i] = (out[0], f"cf_carry{i}_{p_i}")
        return ahead, carried

    def _row_inputs(self, item: PersistentItem, kind: str = "row") -> list[int]:
        """The param indices of an elementwise launch's inputs that its body reads element by element
        (or, of kind "vec", column by column: the same for every row)."""
        params = self._params(item.launch)
        used = set(loaded(params, item.launch.body).values())
        return [p_i for p_i, p in enumerate(params) if p_i in used and p.access.kind == kind]

    def _unwritten(self, item: PersistentItem) -> list[int]:
        """Those of `_row_inputs` that nothing of the kernel writes (nor a GEMM on chip): they may be
        loaded steps ahead."""
        params = self._params(item.launch)
        return [p_i for p_i in self._row_inputs(item) if params[p_i].access.buffer not in
                self.written | self.on_chip.keys()]

    def _read_only(self) -> dict[int, dict[int, str]]:
        """Per elementwise launch, the inputs that no launch of the kernel writes (the forward's input
        projections, the saved steps a backward pass reads): param index -> the register array that holds
        the next step's. A step loads them for the step after it, so that their round trip to memory
        runs beside its barrier and GEMM instead of ahead of its elementwise work."""
        out: dict[int, dict[int, str]] = {}
        for i, item in enumerate(self.launch.items):
            if not isinstance(item.launch, KernelLaunch) or item.whole or item.by_rows:
                continue
            if self._elements(item)[0] <= PREFETCH_ELEMENTS and (unwritten := self._unwritten(item)):
                out[i] = {p_i: f"cf_next{i}_{p_i}" for p_i in unwritten}
        return out

    def _fixed(self) -> dict[int, dict[int, str]]:
        """Per elementwise launch, the inputs the same for every row and step (a bias, a peephole's or a
        norm's weights), loaded once, before the loop: param index -> the register array that holds
        them. Loaded every step, each waited its trip to L1 behind the step's other work."""
        out: dict[int, dict[int, str]] = {}
        for i, item in enumerate(self.launch.items):
            if not isinstance(item.launch, KernelLaunch) or item.whole or item.by_rows:
                continue
            params = self._params(item.launch)
            vectors = [p_i for p_i in self._row_inputs(item, "vec")
                       if not params[p_i].output and params[p_i].access.buffer not in self.written]
            if vectors and self._elements(item)[0] <= PREFETCH_ELEMENTS:
                out[i] = {p_i: f"cf_fixed{i}_{p_i}" for p_i in vectors}
        return out

    def _load_fixed(self, fixed: dict[int, dict[int, str]]) -> None:
        """The loads of `_fixed`'s inputs into their register arrays, before the loop."""
        for i, arrays in fixed.items():
            item = self.launch.items[i]
            self.w(*(f"    float {array}[{self._elements(item)[0]}];" for array in arrays.values()))
            self._element_loads(item, arrays, "    ")

    def _load_at(self, inputs: dict[int, dict[int, str]], step: str, indent: str,
                 declare: bool = True) -> None:
        """Loads of elementwise inputs (per launch, param index -> register array) at step `step` (a C
        expression) into their register arrays, declared first unless `declare` is false."""
        for i, arrays in inputs.items():
            item = self.launch.items[i]
            most = self._elements(item)[0]
            if declare:
                self.w(*(f"{indent}float {array}[{most}];" for array in arrays.values()))
            self.w(f"{indent}{{", f"{indent}    const int t = {step};")
            self._element_loads(item, arrays, indent + "    ")
            self.w(f"{indent}}}")

    def _rotate(self, nxt: dict[int, dict[int, str]]) -> dict[int, dict[int, str]]:
        """At the top of a step: this step's inputs taken from the registers the step before filled; per
        launch, param index -> this step's register array."""
        now: dict[int, dict[int, str]] = {}
        for i, arrays in nxt.items():
            most = self._elements(self.launch.items[i])[0]
            now[i] = {}
            for p_i, array in arrays.items():
                now[i][p_i] = f"cf_now{i}_{p_i}"
                self.w(f"        float cf_now{i}_{p_i}[{most}];",
                       f"        for (int u = 0; u < {most}; ++u) cf_now{i}_{p_i}[u] = {array}[u];")
        return now

    def _load_next(self, nxt: dict[int, dict[int, str]], indent: str) -> None:
        """The next step's loads started, after the step's first barrier where it has one: started before
        it, the LSTM's step at B=64 took 3% longer on an H100."""
        step, more = ("t - 1", "t > 0") if self.launch.reverse else ("t + 1", "t + 1 < seq")
        self.w(f"{indent}if ({more}) {{", f"{indent}    const int cf_step = {step};")
        self._load_at(nxt, "cf_step", indent + "    ", declare=False)
        self.w(f"{indent}}}")

    def _prefetch_rows(self, indent: str) -> None:
        """The step's rows that a kernel run a block per row reads and nothing of the kernel writes (the
        hoisted GEMMs' outputs, the saved steps of a backward pass), each block its own, into L2 while it
        waits and runs the step's GEMMs: the block per row loads them from there."""
        threads = self.launch.threads
        for item in self.launch.items:
            if not item.by_rows:
                continue
            for p in kernel_params(item.launch):
                acc = p.access
                if p.output or acc.kind != "row" or acc.buffer in self.written:
                    continue
                self.w(f"{indent}for (int r = blockIdx.x; r < batch; r += gridDim.x)  // "
                       f"{comment_text(p.value)}",
                       f"{indent}    for (int e = 32 * tid; e < {item.launch.width}; e += {32 * threads})",
                       f"{indent}        cf_prefetch_l2({_at_step(self.var[acc.buffer], acc)} + "
                       f"(size_t)r * {acc.ld} + e);")

    def _depth(self, ahead: dict[int, dict[int, str]]) -> int:
        """Steps whose inputs are loaded at once: as many as AHEAD_REGISTERS hold."""
        per_step = sum(len(arrays) * self._elements(self.launch.items[i])[0] for i, arrays in ahead.items())
        return max(1, min(AHEAD_STEPS, AHEAD_REGISTERS // per_step))

    def _element_loop(self, item: PersistentItem, indent: str) -> None:
        """The loop over a thread's elements of a launch, open. Where `masked`, an element past the
        block's is not skipped but has `cf_ok` false: its loads read element 0 and it stores nothing.
        A branch per load and store, around each of a chunk's steps, made IndRNN's kernel at B=64 about
        2.3 us slower on an H100 (benchmarks/indrnn_kernels_probe.py)."""
        most, count, where = self._elements(item)
        self.w(f"{indent}for (int u = 0; u < {most}; ++u) {{",
               f"{indent}    const int e = tid + u * {self.launch.threads};")
        if self.masked:
            self.w(f"{indent}    {where}",
                   f"{indent}    const bool cf_ok = e < {count} && j < {item.launch.width};",
                   f"{indent}    (void)cf_ok;")
            return
        self.w(f"{indent}    if (e >= {count}) break;",
               f"{indent}    {where}",
               f"{indent}    if (j >= {item.launch.width}) continue;")

    def _element_loads(self, item: PersistentItem, registers: dict[int, str], indent: str) -> None:
        """The loop over a thread's elements (see `_element_loop`), loading the inputs of `registers`
        (param index -> register array, indexed by u) at step t."""
        params = self._params(item.launch)
        self._element_loop(item, indent)
        if all(params[p_i].access.kind == "vec" for p_i in registers):  # the same for every row
            self.w(f"{indent}    (void)r;")
        for p_i, register in registers.items():
            acc = params[p_i].access
            at = f"cf_ok ? {element_index(acc)} : 0" if self.masked else element_index(acc)
            self.w(f"{indent}    {register}[u] = ({_at_step(self.var[acc.buffer], acc)})[{at}];")
        self.w(f"{indent}}}")

    def _carry_in(self, carried: dict[int, dict[int, tuple[int, str]]]) -> None:
        """The carried states' registers, loaded with the state before the first step."""
        registers = {i: {p_i: array for p_i, (_, array) in arrays.items()} for i, arrays in carried.items()}
        self._load_at(registers, "0", "    ")

    def _load_ahead(self, ahead: dict[int, dict[int, str]], depth: int) -> None:
        """The inputs of steps t0 .. t0 + depth - 1 (those before seq), every load in flight at once."""
        for i, arrays in ahead.items():
            item = self.launch.items[i]
            most = self._elements(item)[0]
            self.w(*(f"        float {array}[{depth}][{most}];" for array in arrays.values()),
                   "        #pragma unroll",
                   f"        for (int d = 0; d < {depth}; ++d) {{",
                   "            const int t = t0 + d;",
                   "            if (t >= seq) break;")
            self._element_loads(item, {p_i: f"{array}[d]" for p_i, array in arrays.items()}, "            ")
            self.w("        }")

    def _elementwise(self, i: int, item: PersistentItem, prefetched: dict[int, str],
                     carried: dict[int, tuple[int, str]]) -> None:
        """An elementwise launch on the block's own elements (or all of them, for [N] and scalar values);
        a GEMM output on chip is read from there, a prefetched input from its registers, a carried
        state from its registers (and the new state put there)."""
        k: KernelLaunch = item.launch
        params = self._params(k)
        names = [f"p{n}" for n in range(len(params))]
        index: dict[int, str] = {}
        unused = set(range(len(params))) - set(loaded(params, k.body).values())
        unused -= {n for n, p in enumerate(params) if p.output}
        for n, p in enumerate(params):
            if n in unused:  # an adjoint need not read every input of its kernel
                continue
            if n in prefetched:
                names[n], index[n] = prefetched[n], "u"
            elif n in carried:
                names[n], index[n] = carried[n][1], "u"
            elif p.access.buffer in self.on_chip and not p.output:
                g, gemm = self.on_chip[p.access.buffer]
                block = [sum(gemm.columns[:b]) for b in range(len(gemm.columns))].index(p.access.col)
                start = sum(map(self.launch.unit, gemm.columns[:block]))
                unit = self.launch.unit(gemm.columns[block])
                row = self.tilings[g].output_stride
                names[n], index[n] = f"cf_c{g}", f"(r - row0) * {row} + {start} + j - cb * {unit}"
            else:
                self.w(f"{IND}{'float*' if p.output else 'const float*'} const {names[n]} = "
                       f"{_at_step(self.var[p.access.buffer], p.access)};")
        most, count, where = self._elements(item)
        valid = None
        if prefetched or carried:  # the element loop of the prefetch, so that u picks the same elements
            self._element_loop(item, IND)
            valid = "cf_ok" if self.masked else None
        else:
            self.w(f"{IND}for (int e = tid; e < {count}; e += {self.launch.threads}) {{",
                   f"{IND}    {where}",
                   f"{IND}    if (j >= {k.width}) continue;")
        self.w(f"{IND}    (void)r;")
        for n, p in enumerate(params):  # other blocks wrote it: through L2, which is coherent, not L1
            if p.output or n in index or n in unused:
                continue
            # a column (the first column's block wrote it), or what a block per row wrote
            if p.access.kind == "col" or p.access.buffer in self.written_by_rows:
                at = f"({valid} ? {element_index(p.access)} : 0)" if valid else element_index(p.access)
                self.w(f"{IND}    const float cf_l2_{n}[1] = {{__ldcg({names[n]} + {at})}};")
                names[n], index[n] = f"cf_l2_{n}", "0"
        copies = {out: f"{array}[u]" for out, array in carried.values()}
        # the values other blocks read from an exchange: put there too, with the step's tag, each output
        # at its columns of the exchange
        published = self._exchanged_outputs(i, params)
        for n, _, _ in published:
            self.w(f"{IND}    float cf_pub{n};")
            copies[n] = f"cf_pub{n}"
        self.w(*element_body(params, names, k.body, IND + "    ", index, k.adds, copies, valid))
        for n, x, ex in published:
            self.w(f"{IND}    cf_publish({self._at_columns(n, x, ex, params)}, t + 2, cf_pub{n});")
        self.w(f"{IND}}}")

    # -- a GEMM -------------------------------------------------------------------------------------
    def _gemm(self, i: int, item: PersistentItem) -> None:
        g: GemmLaunch = item.launch
        tl: GemmTiling = self.tilings[i]
        launch, var = self.launch, self.var
        rt, stride, k4 = launch.row_tile, tl.stage_stride(g.k), -(-g.k // 4)
        tr, tc, split = tl.rows_per_thread, tl.cols_per_thread, tl.k_split
        threads = launch.threads
        if g.a.buffer not in self.exchange:
            self.w(f"{IND}const float* const a = {_at_step(var[g.a.buffer], g.a)} + (size_t)row0 * {g.a.ld};")
        if not item.output_on_chip:
            self.w(f"{IND}float* const c = {_at_step(var[g.c.buffer], g.c)} + (size_t)row0 * {g.c.ld};")
        if tl.in_registers:
            self._products_in_registers(i, item)
            return
        self.w(f"{IND}for (int rb = 0; rb < rows; rb += {rt}) {{")
        if item.mma:
            self._mma(i, item)
            return
        self.w(f"{IND}    __syncthreads();  // the stage is free again")
        if g.a.buffer in self.exchange:
            self._poll(*self.exchange[g.a.buffer], stride, IND + "    ")
        else:
            self._stage(g, "0", g.k, stride, IND + "    ")
        self.w(f"{IND}    __syncthreads();")
        self.w(f"{IND}    const int ks = tid % {split};",
               f"{IND}    for (int o = tid / {split}; o < {tl.output_threads}; o += {threads // split}) {{",
               f"{IND}        const int c0 = (o % {tl.col_threads}) * {tc};",
               f"{IND}        const int r0 = (o / {tl.col_threads}) * {tr};",
               f"{IND}        float acc[{tr}][{tc}] = {{}};")
        # Where C adds into memory, its old values are loaded ahead of the products, all at once: the
        # compiler would wait for each in turn at `+=`, between stores it cannot tell apart.
        old = g.accumulate and not item.output_on_chip
        scatter, n_out, owner = _reduction(tr * tc, split)
        first = " + ".join(f"((ks & {d}) ? {half} : 0)" for d, half in scatter) or "0"
        self.w(f"{IND}        const int f0 = {first};  // the lane's first output of the tile (y * {tc} + x)",
               f"{IND}        const bool owner = {owner};  // this lane stores them")
        where = (f"const int f = f0 + m, y = f / {tc}, x = f % {tc}, n = cols{i}(c0 + x);",
                 f"n >= 0 && r0 + y < {rt} && rb + r0 + y < rows")
        if old:
            self.w(f"{IND}        float cf_old[{n_out}];",
                   f"{IND}        #pragma unroll",
                   f"{IND}        for (int m = 0; m < {n_out}; ++m) {{",
                   f"{IND}            {where[0]}",
                   f"{IND}            cf_old[m] = owner && {where[1]}",
                   f"{IND}                ? c[(size_t)(rb + r0 + y) * {g.c.ld} + n] : 0.0f;",
                   f"{IND}        }}")
        # The operands of the next four k are loaded into registers while those of these four are
        # multiplied (two register sets): with two warps per scheduler, nothing else hides the wait for
        # shared memory. Each product is a chain of fmaf: a*b + c*d + ... compiles to an FMUL and an FADD
        # more per four k.
        iters = -(-k4 // split)
        self.w(f"{IND}        float4 av[2][{tr}], wv[2][{tc}];",
               f"{IND}        if (ks < {k4}) {{")
        self._operands(i, item, "0", "ks", IND + "            ")
        self.w(f"{IND}        }}",
               f"{IND}        #pragma unroll{'' if iters <= FULL_UNROLL else ' 2'}",
               f"{IND}        for (int it = 0; it < {iters}; ++it) {{",
               f"{IND}            const int q = ks + it * {split}, cur = it & 1;",
               f"{IND}            if (q >= {k4}) break;",
               f"{IND}            if (q + {split} < {k4}) {{")
        self._operands(i, item, "cur ^ 1", f"q + {split}", IND + "                ")
        self.w(f"{IND}            }}",
               f"{IND}            #pragma unroll",
               f"{IND}            for (int y = 0; y < {tr}; ++y)",
               f"{IND}                #pragma unroll",
               f"{IND}                for (int x = 0; x < {tc}; ++x) {{",
               f"{IND}                    const float4 a4 = av[cur][y], w4 = wv[cur][x];",
               f"{IND}                    acc[y][x] = fmaf(a4.w, w4.w, fmaf(a4.z, w4.z, "
               "fmaf(a4.y, w4.y, fmaf(a4.x, w4.x, acc[y][x]))));",
               f"{IND}                }}",
               f"{IND}        }}")
        # The k_split lanes of a tile, neighbours in a warp, add up their partial sums (`_lane_sums`).
        mask = "0xffffffffu" if split == 32 else f"(0x{(1 << split) - 1:x}u << (tid & 31 & ~{split - 1}))"
        self.w(f"{IND}        float v[{tr * tc}];",
               f"{IND}        #pragma unroll",
               f"{IND}        for (int m = 0; m < {tr * tc}; ++m) v[m] = acc[m / {tc}][m % {tc}];")
        self.w(*_lane_sums(split, tr * tc, mask, IND + "        "))
        self.w(f"{IND}        if (owner)",
               f"{IND}            #pragma unroll",
               f"{IND}            for (int m = 0; m < {n_out}; ++m) {{",
               f"{IND}                {where[0]}",
               f"{IND}                if ({where[1]})",
               f"{IND}                    "
               f"{self._store(i, item, 'rb + r0 + y', 'c0 + x', 'v[m]', 'cf_old[m]' if old else '')}",
               f"{IND}            }}",
               f"{IND}    }}",
               f"{IND}}}",
               f"{IND}__syncthreads();  // C is read next by other threads of the block")

    def _products_in_registers(self, i: int, item: PersistentItem) -> None:
        """A GEMM one row at a time, its products in registers (see GemmTiling): per row, each thread's two
        k of the operand (polled from its exchange, or loaded), times its two rows of W; the warp's
        lanes' products added by shuffles, halving the values each lane keeps as the tile's do; each
        warp's partial row into shared memory."""
        g: GemmLaunch = item.launch
        width, k = self.tilings[i].cols_per_thread, g.k
        self.w(f"{IND}__syncthreads();  // the partial sums are free again",
               f"{IND}for (int rb = 0; rb < rows; ++rb) {{",
               f"{IND}    float a0 = 0.0f, a1 = 0.0f;",
               f"{IND}    if (2 * tid < {k}) {{")
        if g.a.buffer in self.exchange:
            n, ex = self.exchange[g.a.buffer]
            slot = "t + 1" if ex.lag else "t"  # as in `_poll`
            self.w(f"{IND}        const unsigned want = t + {2 + ex.lag};",
                   f"{IND}        const unsigned long long* const p = "
                   f"{self._exchange_at(n, ex, slot, 'row0 + rb', '2 * tid')};",
                   f"{IND}        unsigned long long w0, w1;",
                   f"{IND}        cf_peek2(p, w0, w1);",
                   f"{IND}        for (unsigned cf_round = 1; (unsigned)(w0 >> 32) != want "
                   "|| (unsigned)(w1 >> 32) != want; ++cf_round) {",
                   f"{IND}            if (cf_round == {POLL_ROUNDS}u) __trap();  // a fault, not a hang, "
                   "should a value never come",
                   f"{IND}            cf_peek2(p, w0, w1);",
                   f"{IND}        }}",
                   f"{IND}        a0 = __uint_as_float((unsigned)w0);",
                   f"{IND}        a1 = __uint_as_float((unsigned)w1);")
        else:
            self.w(f"{IND}        a0 = __ldcg(a + (size_t)rb * {g.a.ld} + 2 * tid);",
                   f"{IND}        a1 = __ldcg(a + (size_t)rb * {g.a.ld} + 2 * tid + 1);")
        # the lanes together again (their polls ended apart) before they shuffle: diverged, every
        # shuffle takes the slow path (the LSTM's step at B=1 took 2.0 us instead of 1.2)
        self.w(f"{IND}    }}",
               f"{IND}    __syncwarp();",
               f"{IND}    float v[{width}];",
               f"{IND}    #pragma unroll",
               f"{IND}    for (int c = 0; c < {width}; ++c)",
               f"{IND}        v[c] = fmaf(a1, cf_w{i}[1][c], a0 * cf_w{i}[0][c]);",
               f"{IND}    const int ks = tid & 31;")
        scatter, _, owner = _reduction(width, 32)  # as a tile's k_split lanes add theirs
        self.w(*_lane_sums(32, width, "0xffffffffu", IND + "    "))
        column = " + ".join(f"((ks & {d}) ? {half} : 0)" for d, half in scatter) or "0"
        self.w(f"{IND}    if ({owner})",
               f"{IND}        cf_part{i}[(rb * {WARPS} + tid / 32) * {width} + {column}] = v[0];",
               f"{IND}}}",
               f"{IND}__syncthreads();  // the partial sums are read next by other threads of the block")

    def _operands(self, i: int, item: PersistentItem, buf: str, q: str, ind: str) -> None:
        """Loads into register set `buf` of the GEMM's operands at float4 `q` of K: the thread's rows of
        the staged A, and its columns of W (in shared memory, or read from L2, where it never changes)."""
        g: GemmLaunch = item.launch
        tl: GemmTiling = self.tilings[i]
        stride, kp = tl.stage_stride(g.k), tl.w_stride(g.k)
        self.w(f"{ind}#pragma unroll",
               f"{ind}for (int y = 0; y < {tl.rows_per_thread}; ++y)",
               f"{ind}    av[{buf}][y] = *(const float4*)(cf_stage + (r0 + y) * {stride} + 4 * ({q}));",
               f"{ind}#pragma unroll")
        if item.on_chip:
            self.w(f"{ind}for (int x = 0; x < {tl.cols_per_thread}; ++x)",
                   f"{ind}    wv[{buf}][x] = *(const float4*)(w{i} + (c0 + x) * {kp} + 4 * ({q}));")
            return
        w = self.var[g.w]
        loads = [f"k + {d} < {g.k} ? __ldg({w} + {_w_index(g, f'(k + {d})', 'n')}) : 0.0f"
                 for d in range(1, 4)]
        self.w(f"{ind}for (int x = 0; x < {tl.cols_per_thread}; ++x) {{",
               f"{ind}    const int n = cols{i}(c0 + x), k = 4 * ({q});",
               f"{ind}    wv[{buf}][x] = n < 0 ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : make_float4(",
               f"{ind}        __ldg({w} + {_w_index(g, 'k', 'n')}),",
               *(f"{ind}        {load}{',' if d < 2 else ');'}" for d, load in enumerate(loads)),
               f"{ind}}}")

    def _poll(self, n: int, ex, stride: int, ind: str) -> None:
        """Stages rows rb.. of the block's rows of an exchanged operand from its exchange: the pairs (two
        at a time where the width is even) loaded all at once, then, in rounds, those whose tag is not
        yet the step's loaded again, all at once, until every one is. (The first loads written as a
        round of the loop instead, from tags of 0, cost ptxas 30 of the LSTM kernel's 158 registers and
        the LSTM 8% at B=8 on an H100.)"""
        launch, k = self.launch, ex.width
        per = 2 if k % 2 == 0 else 1
        pieces = launch.row_tile * k // per
        chunk = min(POLL_PIECES, -(-pieces // launch.threads))
        peek = "cf_peek2(p, w[u][0], w[u][1])" if per == 2 else "cf_peek(p, w[u][0])"
        stale = " || ".join(f"(unsigned)(w[u][{v}] >> 32) != want" for v in range(per))
        slot = "t + 1" if ex.lag else "t"  # of the value written at step t - 1, or at step t
        # the pairs thread tid loads (u-th of its chunk): element e of the rows, of row r, at p
        element = f"const int e = {per} * (e0 + tid + u * {launch.threads}), r = e / {k};"
        # p as the rows' start + e where row groups split the rows (on an H100, B=64: the layer-normalised
        # LSTM 1.115 -> 1.045 ms, Cho's GRU 0.875 -> 0.815, the LSTM 0.805 -> 0.778), but through row
        # r where every block polls every row: there its quicker polls cost the LSTM at B=8 4% (0.271 ->
        # 0.283; benchmarks/results/h100_2026-11-26_exchange_address_variants.json)
        split = launch.row_groups > 1
        start = self._exchange_at(n, ex, slot, "row0 + rb", "0")
        p = "rows_at + e" if split else self._exchange_at(n, ex, slot, "row0 + rb + r", f"e - r * {k}")
        at = f"const unsigned long long* const p = {p};"
        self.w(f"{ind}{{",
               f"{ind}    const unsigned want = t + {2 + ex.lag};",
               *((f"{ind}    const unsigned long long* const rows_at = {start};",) if split else ()),
               f"{ind}    for (int e0 = 0; e0 < {pieces}; e0 += {chunk * launch.threads}) {{",
               f"{ind}        unsigned long long w[{chunk}][{per}];",
               f"{ind}        #pragma unroll",
               f"{ind}        for (int u = 0; u < {chunk}; ++u) {{",
               f"{ind}            {element}",
               f"{ind}            {at}",
               f"{ind}            if (e < {pieces * per} && rb + r < rows) {peek};",
               f"{ind}        }}",
               f"{ind}        for (unsigned cf_round = 0;; ++cf_round) {{  // rounds, each one trip to L2",
               f"{ind}            if (cf_round == {POLL_ROUNDS}u) __trap();  // a fault, not a hang, "
               "should a value never come",
               f"{ind}            bool ready = true;",
               f"{ind}            #pragma unroll",
               f"{ind}            for (int u = 0; u < {chunk}; ++u) {{",
               f"{ind}                {element}",
               f"{ind}                {at}",
               f"{ind}                if (e < {pieces * per} && rb + r < rows && ({stale})) {{",
               f"{ind}                    ready = false;",
               f"{ind}                    {peek};",
               f"{ind}                }}",
               f"{ind}            }}",
               f"{ind}            if (ready) break;",
               f"{ind}        }}",
               f"{ind}        #pragma unroll",
               f"{ind}        for (int u = 0; u < {chunk}; ++u) {{",
               f"{ind}            {element}",
               f"{ind}            if (e >= {pieces * per}) break;",
               f"{ind}            #pragma unroll",
               f"{ind}            for (int v = 0; v < {per}; ++v)",
               f"{ind}                cf_stage[r * {stride} + e - r * {k} + v] =",
               f"{ind}                    rb + r < rows ? __uint_as_float((unsigned)w[u][v]) : 0.0f;",
               f"{ind}        }}",
               f"{ind}    }}",
               f"{ind}}}")

    def _stage(self, g: GemmLaunch, first: str, width: int, stride: int, ind: str) -> None:
        """Stages rows rb.. of the block's rows of A, columns `first` .. + `width` of K (zeros past K), at
        `stride` floats a row: asynchronous copies, all in flight at once, where A's rows allow them."""
        rt, threads = self.launch.row_tile, self.launch.threads
        past = f"{first} + " if first != "0" else ""
        clip = width < g.k  # a chunk of K, the last one possibly past its end
        if g.k % 4 == 0 and g.a.ld % 4 == 0 and g.a.col % 4 == 0 and width % 4 == 0:
            w4 = width // 4
            self.w(f"{ind}if ((((size_t)a) & 15) == 0) {{",
                   f"{ind}    for (int e = tid; e < {rt * w4}; e += {threads}) {{",
                   f"{ind}        const int r = e / {w4}, q = e - r * {w4};",
                   f"{ind}        float* const s = cf_stage + r * {stride} + 4 * q;",
                   f"{ind}        if (rb + r < rows{f' && {past}4 * q < {g.k}' if clip else ''})",
                   f"{ind}            cf_copy16(s, a + (size_t)(rb + r) * {g.a.ld} + {past}4 * q);",
                   f"{ind}        else *(float4*)s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);",
                   f"{ind}    }}",
                   f"{ind}    cf_copies_done();",
                   f"{ind}}} else")
        self.w(f"{ind}for (int e = tid; e < {rt * width}; e += {threads}) {{",
               f"{ind}    const int r = e / {width}, k = e - r * {width};",
               f"{ind}    cf_stage[r * {stride} + k] =",
               f"{ind}        rb + r < rows{f' && {past}k < {g.k}' if clip else ''} ? "
               f"__ldcg(a + (size_t)(rb + r) * {g.a.ld} + {past}k) : 0.0f;",
               f"{ind}}}")

    def _store(self, i: int, item: PersistentItem, row: str, col: str, value: str, old: str = "") -> str:
        """The statement that puts a GEMM's `value` at `row` of the block's rows and `col` of its columns
        (n: the column of C): into shared memory where the output stays on chip, else to C, with the
        bias; added to what is there for a GEMM that accumulates (to `old`, where that was loaded)."""
        g: GemmLaunch = item.launch
        at = (f"cf_c{i}[({row}) * {self.tilings[i].cols} + {col}]" if item.output_on_chip
              else f"c[(size_t)({row}) * {g.c.ld} + n]")
        bias = f" + {self.var[g.bias]}[n]" if g.bias else ""
        if old:
            return f"{at} = {old} + {value}{bias};"
        return f"{at} {'+=' if g.accumulate else '='} {value}{bias};"

    def _mma(self, i: int, item: PersistentItem) -> None:
        """The body of a GEMM's row-tile loop on tensor cores: per chunk of K, the chunk staged (or its
        rows taken from their exchange), then each warp's tile of C over its share of the chunk, sixteen
        k at a time, each product in three TF32 ones, the small ones first, its partial tile carried in
        shared memory from one chunk to the next; then the warps' partial tiles added up and stored by
        all the block's threads, through the column map and the bias.

        A lane of group g (lane / 4) and place q (lane % 4) holds, for the mma.sync products, rows g and
        g + 8 of A and column g of W (of each product's eight columns), at k q and q + 4 of each product.
        Those k are taken in an order of their own: the first product of a K_BLOCK reads the block's k
        4q and 4q + 1, the second 4q + 2 and 4q + 3, so that each row a lane reads is one float4 (A and
        W in the same order, the sum over K is the same)."""
        g: GemmLaunch = item.launch
        tl: GemmTiling = self.tilings[i]
        threads, rt, kp = self.launch.threads, self.launch.row_tile, tl.w_stride(g.k)
        split, tiles, nt = tl.k_split, tl.output_threads, tl.col_threads
        chunk, stride = tl.k_chunk, tl.stage_stride(g.k)
        wc = tl.cols_per_thread  # a warp tile's columns
        nb = wc // MMA_N  # its products side by side
        regs = 4 * nb  # of its accumulators
        area = MMA_M * wc
        chunks = -(-g.k // chunk)
        ind = IND + "        "
        # the last chunk may end before the others do: no k past K's last block (the rows of W end there)
        blocks = -(-chunk // MMA_K_BLOCK)
        end = (str(MMA_K_BLOCK * blocks) if g.k % chunk == 0
               else f"min({MMA_K_BLOCK * blocks}, {MMA_K_BLOCK * -(-g.k // MMA_K_BLOCK)} - kc)")
        iters = -(-blocks // split)
        self.w(f"{IND}    for (int kc = 0; kc < {chunks * chunk}; kc += {chunk}) {{",
               f"{IND}        __syncthreads();  // the stage and the partial tiles are free again")
        if g.a.buffer in self.exchange:  # (one chunk: all of K, see persistent.exchanges)
            self._poll(*self.exchange[g.a.buffer], stride, ind)
        else:
            self._stage(g, "kc", chunk, stride, ind)
        self.w(f"{ind}__syncthreads();",
               f"{ind}const int lane = tid & 31;",
               f"{ind}for (int o = tid / 32; o < {tiles * split}; o += {WARPS}) {{",
               f"{ind}    const int tile = o / {split}, ks = o % {split};",
               f"{ind}    const float* const at = cf_stage + ((tile / {nt}) * {MMA_M} + (lane >> 2)) * "
               f"{stride} + 4 * (lane & 3);",
               f"{ind}    const float* const wt = w{i} + ((tile % {nt}) * {wc} + (lane >> 2)) * {kp} + kc + "
               "4 * (lane & 3);",
               f"{ind}    float* const part = cf_mma + (size_t)o * {regs * 32} + lane;  // [{regs}][32]",
               f"{ind}    float acc[{nb}][4];",
               f"{ind}    #pragma unroll",
               f"{ind}    for (int m = 0; m < {regs}; ++m)",
               f"{ind}        acc[m / 4][m % 4] = {'kc ? part[m * 32] : 0.0f' if chunks > 1 else '0.0f'};",
               f"{ind}    #pragma unroll{'' if iters <= FULL_UNROLL else ' 2'}",
               f"{ind}    for (int k = ks * {MMA_K_BLOCK}; k < {end}; k += {split * MMA_K_BLOCK}) {{",
               f"{ind}        const float4 a4[2] = {{*(const float4*)(at + k), "
               f"*(const float4*)(at + {8 * stride} + k)}};",
               f"{ind}        unsigned ah[2][4], al[2][4];  // [product][fragment register]",
               f"{ind}        #pragma unroll",
               f"{ind}        for (int y = 0; y < 2; ++y) {{  // rows g and g + 8",
               f"{ind}            cf_split_tf32(a4[y].x, ah[0][y], al[0][y]);",
               f"{ind}            cf_split_tf32(a4[y].y, ah[0][y + 2], al[0][y + 2]);",
               f"{ind}            cf_split_tf32(a4[y].z, ah[1][y], al[1][y]);",
               f"{ind}            cf_split_tf32(a4[y].w, ah[1][y + 2], al[1][y + 2]);",
               f"{ind}        }}",
               f"{ind}        #pragma unroll",
               f"{ind}        for (int x = 0; x < {nb}; ++x) {{",
               f"{ind}            const float4 w4 = *(const float4*)(wt + x * {MMA_N * kp} + k);",
               f"{ind}            unsigned wh[4], wl[4];",
               f"{ind}            cf_split_tf32(w4.x, wh[0], wl[0]);",
               f"{ind}            cf_split_tf32(w4.y, wh[1], wl[1]);",
               f"{ind}            cf_split_tf32(w4.z, wh[2], wl[2]);",
               f"{ind}            cf_split_tf32(w4.w, wh[3], wl[3]);",
               f"{ind}            #pragma unroll",
               f"{ind}            for (int p = 0; p < 2; ++p) {{",
               f"{ind}                cf_mma_tf32(acc[x], al[p][0], al[p][1], al[p][2], al[p][3], "
               "wh[2 * p], wh[2 * p + 1]);",
               f"{ind}                cf_mma_tf32(acc[x], ah[p][0], ah[p][1], ah[p][2], ah[p][3], "
               "wl[2 * p], wl[2 * p + 1]);",
               f"{ind}                cf_mma_tf32(acc[x], ah[p][0], ah[p][1], ah[p][2], ah[p][3], "
               "wh[2 * p], wh[2 * p + 1]);",
               f"{ind}            }}",
               f"{ind}        }}",
               f"{ind}    }}",
               f"{ind}    #pragma unroll",
               f"{ind}    for (int m = 0; m < {regs}; ++m) part[m * 32] = acc[m / 4][m % 4];",
               f"{ind}}}",
               f"{IND}    }}",
               f"{IND}    __syncthreads();",
               # element (y, x) of a warp tile is register 4 (x / 8) + 2 (y / 8) + x % 2 of lane
               # 4 (y % 8) + x % 8 / 2: mma.sync's layout of C
               # (the thread's elements unrolled, their loads before any test: all in flight at once)
               f"{IND}    #pragma unroll",
               f"{IND}    for (int q = 0; q < {-(-tiles * area // threads)}; ++q) {{",
               f"{IND}        const int e = tid + q * {threads};",
               *([f"{IND}        if (e >= {tiles * area}) break;"] if tiles * area % threads else []),
               f"{IND}        const int tile = e / {area}, y = e % {area} / {wc}, x = e % {wc};",
               f"{IND}        const int r = (tile / {nt}) * {MMA_M} + y;",
               f"{IND}        const int cc = (tile % {nt}) * {wc} + x;  // the block's column",
               f"{IND}        const int at = (4 * (x / 8) + 2 * (y / 8) + x % 2) * 32 + 4 * (y % 8) + "
               "x % 8 / 2;",
               f"{IND}        float v = 0.0f;",
               f"{IND}        #pragma unroll",
               f"{IND}        for (int s = 0; s < {split}; ++s) v += cf_mma[(size_t)(tile * {split} + s) * "
               f"{regs * 32} + at];",
               f"{IND}        const int n = cols{i}(cc);",
               f"{IND}        if (n >= 0 && r < {rt} && rb + r < rows)",
               f"{IND}            {self._store(i, item, 'rb + r', 'cc', 'v')}",
               f"{IND}    }}",
               f"{IND}}}",
               f"{IND}__syncthreads();  // C is read next by other threads of the block")


KERNEL_START = (
    "    extern __shared__ __align__(128) float cf_smem[];  // each part 32-byte aligned (see whole32)",
    "    cooperative_groups::grid_group grid = cooperative_groups::this_grid();",
    "    const int tid = threadIdx.x;",
    "    (void)grid; (void)tid;",
)

# At the top of a launch whose blocks are independent: the executor launches it while the kernel before it
# on the stream may still run, its launch and its blocks' start hidden behind that kernel's last blocks
# (on an H100 IndRNN's forward at B=64 took 0.3-1.1 us less so, in two runs of
# benchmarks/indrnn_kernels_probe.py); it waits here for that kernel to end and its writes to be seen.
# Launched otherwise, the wait returns at once.
PDL_WAIT = (
    "#if __CUDA_ARCH__ >= 900",
    '    asm volatile("griddepcontrol.wait;" ::: "memory");',
    "#endif",
)


def signature(buffers: list[str], var: dict[str, str], written: set[str], threads: int,
              name: str) -> list[str]:
    """The comment on a persistent kernel's arguments, and its signature."""
    sig = [f"    {'float*' if b in written else 'const float* __restrict__'} {var[b]}" for b in buffers]
    return [*(f"//   {var[b]}: {comment_text(b)}" for b in buffers),
            f'extern "C" __global__ void __launch_bounds__({threads}, 1) {name}(',
            ",\n".join(["    int seq", "    int batch", *sig]) + ")"]


def persistent_source(launch: PersistentLaunch, name: str) -> str:
    return _Kernel(launch, name).source()


def _w_index(g: GemmLaunch, k: str, n: str) -> str:
    """The element of the GEMM's right operand at row k, column n: of W [K, N], or, where the GEMM
    multiplies by W's transpose (dA = dC @ W^T), of W stored [N, K]."""
    return f"(size_t){n} * {g.k} + {k}" if g.trans_w else f"(size_t){k} * {g.n} + {n}"


def _lane_sums(split: int, outputs: int, mask: str, ind: str) -> list[str]:
    """The shuffles by which `split` neighbouring lanes (ks, their index among them), each with partial
    sums v[0..outputs), add them up (see `_reduction`): halving, where the outputs allow it, the values
    each lane sends and keeps (a lane keeps the sums of one half and sends the other), so that each lane
    ends with its own share of the outputs and a shuffle carries one value of one output, not of all of
    them; then, the outputs no longer halving, every lane left adds them all."""
    scatter, n_out, _ = _reduction(outputs, split)
    lines = []
    for d, half in scatter:
        lines += [f"{ind}#pragma unroll",
                  f"{ind}for (int m = 0; m < {half}; ++m) {{",
                  f"{ind}    const float keep = (ks & {d}) ? v[m + {half}] : v[m], "
                  f"send = (ks & {d}) ? v[m] : v[m + {half}];",
                  f"{ind}    v[m] = keep + __shfl_xor_sync({mask}, send, {d});",
                  f"{ind}}}"]
    d = split // 2 >> len(scatter)
    while d >= 1:
        lines += [f"{ind}#pragma unroll",
                  f"{ind}for (int m = 0; m < {n_out}; ++m)",
                  f"{ind}    v[m] += __shfl_xor_sync({mask}, v[m], {d});"]
        d //= 2
    return lines


def _reduction(outputs: int, split: int) -> tuple[list[tuple[int, int]], int, str]:
    """How the `split` lanes of a register tile of `outputs` values add up their partial sums: the
    shuffle distances at which each lane keeps half of its values (with that half's size), the number of
    outputs each lane is left with, and which lanes store them (a C condition on ks)."""
    scatter, d, n = [], split // 2, outputs
    while d >= 1 and n % 2 == 0:
        n //= 2
        scatter.append((d, n))
        d //= 2
    return scatter, n, f"(ks & {2 * d - 1}) == 0" if d else "true"


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
    not where both give each thread the same elements (it reads only what it wrote itself). A GEMM
    starts with its own wait."""
    if isinstance(after.launch, GemmLaunch):
        return False
    same = (after.whole == item.whole and after.launch.width == item.launch.width
            and after.launch.rows == item.launch.rows)
    return not same
