"""A GEMM of a persistent kernel on the CUDA cores (float32 FMAs): per tile of rows, the block's rows of
the operand staged in shared memory (or taken from its exchange), each thread's register tile of C summed
over its share of K, the lanes that share a tile adding their partial sums by shuffles; or, one row at a
time, the products in registers (see `tiling.GemmTiling`)."""

from __future__ import annotations

from ..cuda_kernels import F
from ..dtypes import FLOAT32
from ..plan import GemmLaunch, PersistentItem
from ..tiling import WARPS, GemmTiling
from .context import Kernel
from .exchange import poll_pair, poll_rows
from .shared_memory import w_index
from .staging import operand, pointers, stage, store, zero_past_k

FULL_UNROLL = 32  # iterations of a GEMM's loop over K, at most, unrolled whole (else two at a time)


def k_loop_unroll(k: Kernel, iters: int) -> str:
    """The pragma over a GEMM's loop over K of `iters` iterations (a thread's, or a warp's): unrolled
    whole up to FULL_UNROLL, two at a time past it; `k.k_unroll` at a time where the kernel asks for it
    and the loop has more. A loop unrolled whole keeps every iteration's loads in flight at once, which
    is what makes it fast, and what made some kernels use more registers than a thread has (the LSTM's
    forward on tensor cores planned for half an H200's SMs, B=64: 16 iterations a warp, 216 bytes of
    spills, 1.23 ms; unrolled 8, none and 0.90 ms); where nothing spills, unrolling 8 at a time lost 1%
    to 28% (benchmarks/results/h200_2026-11-30_unroll_8_over_8_e25739a.txt)."""
    if iters > FULL_UNROLL:
        return "#pragma unroll 2"
    return f"#pragma unroll {k.k_unroll}" if 0 < k.k_unroll < iters else "#pragma unroll"


def gemm(k: Kernel, i: int, item: PersistentItem) -> None:
    g: GemmLaunch = item.launch
    tl: GemmTiling = item.tiling
    launch, w = k.launch, k.w
    rt, stride, k4 = launch.row_tile, tl.stage_stride(g.k), -(-g.k // 4)
    tr, tc, split = tl.rows_per_thread, tl.cols_per_thread, tl.k_split
    pointers(k, item)
    if tl.in_registers:
        products_in_registers(k, i, item)
        return
    with w.block(f"for (int rb = 0; rb < rows; rb += {rt}) {{"):
        w("__syncthreads();  // the stage is free again")
        if g.a.buffer in k.exchange:
            poll_rows(k, *k.exchange[g.a.buffer], stride)
        else:
            stage(k, g, "0", g.k, stride, rounding=g.multiply != FLOAT32)
        zero_past_k(k, g, tl.padded_rows, stride, 4)
        w("__syncthreads();",
          f"const int ks = tid % {split};")
        step = launch.threads // split
        with w.block(f"for (int o = tid / {split}; o < {tl.output_threads}; o += {step}) {{"):
            w(f"const int c0 = (o % {tl.col_threads}) * {tc};",
              f"const int r0 = (o / {tl.col_threads}) * {tr};",
              f"{F} acc[{tr}][{tc}] = {{}};")
            # Where C adds into memory, its old values are loaded ahead of the products, all at once: the
            # compiler would wait for each in turn at `+=`, between stores it cannot tell apart.
            old = g.accumulate and not item.output_on_chip
            scatter, n_out, owner = _reduction(tr * tc, split)
            first = " + ".join(f"((ks & {d}) ? {half} : 0)" for d, half in scatter) or "0"
            w(f"const int f0 = {first};  // the lane's first output of the tile (y * {tc} + x)",
              f"const bool owner = {owner};  // this lane stores them")
            where = (f"const int f = f0 + m, y = f / {tc}, x = f % {tc}, n = cols{i}(c0 + x);",
                     f"n >= 0 && r0 + y < {rt} && rb + r0 + y < rows")
            if old:
                w(f"{F} cf_old[{n_out}];", "#pragma unroll")
                with w.block(f"for (int m = 0; m < {n_out}; ++m) {{"):
                    w(where[0],
                      f"cf_old[m] = owner && {where[1]}",
                      f"    ? c[(size_t)(rb + r0 + y) * {g.c.ld} + n] : 0.0f;")
            # The operands of the next four k are loaded into registers while those of these four are
            # multiplied (two register sets): with two warps per scheduler, nothing else hides the wait
            # for shared memory. Each product is a chain of fmaf: a*b + c*d + ... compiles to an FMUL and
            # an FADD more per four k.
            iters = -(-k4 // split)
            w(f"float4 av[2][{tr}], wv[2][{tc}];")
            with w.block(f"if (ks < {k4}) {{"):
                operands(k, i, item, "0", "ks")
            w(k_loop_unroll(k, iters))
            with w.block(f"for (int it = 0; it < {iters}; ++it) {{"):
                w(f"const int q = ks + it * {split}, cur = it & 1;",
                  f"if (q >= {k4}) break;")
                with w.block(f"if (q + {split} < {k4}) {{"):
                    operands(k, i, item, "cur ^ 1", f"q + {split}")
                w("#pragma unroll",
                  f"for (int y = 0; y < {tr}; ++y)",
                  "    #pragma unroll")
                with w.indented(), w.block(f"for (int x = 0; x < {tc}; ++x) {{"):
                    w("const float4 a4 = av[cur][y], w4 = wv[cur][x];",
                      "acc[y][x] = fmaf(a4.w, w4.w, fmaf(a4.z, w4.z, fmaf(a4.y, w4.y, fmaf(a4.x, w4.x, "
                      "acc[y][x]))));")
            # The k_split lanes of a tile, neighbours in a warp, add up their partial sums (`lane_sums`).
            mask = "0xffffffffu" if split == 32 else f"(0x{(1 << split) - 1:x}u << (tid & 31 & ~{split - 1}))"
            w(f"{F} v[{tr * tc}];",
              "#pragma unroll",
              f"for (int m = 0; m < {tr * tc}; ++m) v[m] = acc[m / {tc}][m % {tc}];")
            lane_sums(k, split, tr * tc, mask)
            w("if (owner)", "    #pragma unroll")
            with w.indented(), w.block(f"for (int m = 0; m < {n_out}; ++m) {{"):
                w(where[0],
                  f"if ({where[1]})",
                  f"    {store(k, i, item, 'rb + r0 + y', 'c0 + x', 'v[m]', 'cf_old[m]' if old else '')}")
    w("__syncthreads();  // C is read next by other threads of the block")


def products_in_registers(k: Kernel, i: int, item: PersistentItem) -> None:
    """A GEMM one row at a time, its products in registers (see GemmTiling): per row, each thread's two k
    of the operand (polled from its exchange, or loaded), times its two rows of W; the warp's lanes'
    products added by shuffles, halving the values each lane keeps as the tile's do; each warp's partial
    row into shared memory."""
    g: GemmLaunch = item.launch
    width, w = item.tiling.cols_per_thread, k.w
    w("__syncthreads();  // the partial sums are free again")
    with w.block("for (int rb = 0; rb < rows; ++rb) {"):
        w(f"{F} a0 = 0.0f, a1 = 0.0f;")
        with w.block(f"if (2 * tid < {g.k}) {{"):
            if g.a.buffer in k.exchange:
                poll_pair(k, *k.exchange[g.a.buffer])
            else:
                w(f"a0 = {operand(g, f'(size_t)rb * {g.a.ld} + 2 * tid')};",
                  f"a1 = {operand(g, f'(size_t)rb * {g.a.ld} + 2 * tid + 1')};")
        # the lanes together again (their polls ended apart) before they shuffle: diverged, every shuffle
        # takes the slow path (docs/results/2026-11-27-persistent-rungs-changes-14-to-19.md, change 16)
        w("__syncwarp();",
          f"{F} v[{width}];",
          "#pragma unroll",
          f"for (int c = 0; c < {width}; ++c)",
          f"    v[c] = fmaf(a1, cf_w{i}[1][c], a0 * cf_w{i}[0][c]);",
          "const int ks = tid & 31;")
        scatter, _, owner = _reduction(width, 32)  # as a tile's k_split lanes add theirs
        lane_sums(k, 32, width, "0xffffffffu")
        column = " + ".join(f"((ks & {d}) ? {half} : 0)" for d, half in scatter) or "0"
        w(f"if ({owner})",
          f"    cf_part{i}[(rb * {WARPS} + tid / 32) * {width} + {column}] = v[0];")
    w("__syncthreads();  // the partial sums are read next by other threads of the block")


def operands(k: Kernel, i: int, item: PersistentItem, buf: str, q: str) -> None:
    """Loads into register set `buf` of the GEMM's operands at float4 `q` of K: the thread's rows of the
    staged A, and its columns of W (in shared memory, or read from L2, where it never changes)."""
    g: GemmLaunch = item.launch
    tl: GemmTiling = item.tiling
    stride, kp, w = tl.stage_stride(g.k), tl.w_stride(g.k), k.w
    w("#pragma unroll",
      f"for (int y = 0; y < {tl.rows_per_thread}; ++y)",
      f"    av[{buf}][y] = *(const float4*)(cf_stage + (r0 + y) * {stride} + 4 * ({q}));",
      "#pragma unroll")
    if item.on_chip:
        w(f"for (int x = 0; x < {tl.cols_per_thread}; ++x)",
          f"    wv[{buf}][x] = *(const float4*)(w{i} + (c0 + x) * {kp} + 4 * ({q}));")
        return
    var = k.var[g.w]
    loads = [f"k + {d} < {g.k} ? __ldg({var} + {w_index(g, f'(k + {d})', 'n')}) : 0.0f" for d in range(1, 4)]
    with w.block(f"for (int x = 0; x < {tl.cols_per_thread}; ++x) {{"):
        w(f"const int n = cols{i}(c0 + x), k = 4 * ({q});",
          f"wv[{buf}][x] = n < 0 ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : make_float4(",
          f"    __ldg({var} + {w_index(g, 'k', 'n')}),",
          *(f"    {load}{',' if d < 2 else ');'}" for d, load in enumerate(loads)))


def lane_sums(k: Kernel, split: int, outputs: int, mask: str) -> None:
    """The shuffles by which `split` neighbouring lanes (ks, their index among them), each with partial sums
    v[0..outputs), add them up (see `_reduction`): halving, where the outputs allow it, the values each
    lane sends and keeps (a lane keeps the sums of one half and sends the other), so that each lane ends
    with its own share of the outputs and a shuffle carries one value of one output, not of all of them;
    then, the outputs no longer halving, every lane left adds them all."""
    scatter, n_out, _ = _reduction(outputs, split)
    w = k.w
    for d, half in scatter:
        w("#pragma unroll")
        with w.block(f"for (int m = 0; m < {half}; ++m) {{"):
            w(f"const {F} keep = (ks & {d}) ? v[m + {half}] : v[m], "
              f"send = (ks & {d}) ? v[m] : v[m + {half}];",
              f"v[m] = keep + __shfl_xor_sync({mask}, send, {d});")
    d = split // 2 >> len(scatter)
    while d >= 1:
        w("#pragma unroll",
          f"for (int m = 0; m < {n_out}; ++m)",
          f"    v[m] += __shfl_xor_sync({mask}, v[m], {d});")
        d //= 2


def _reduction(outputs: int, split: int) -> tuple[list[tuple[int, int]], int, str]:
    """How the `split` lanes of a register tile of `outputs` values add up their partial sums: the shuffle
    distances at which each lane keeps half of its values (with that half's size), the number of outputs
    each lane is left with, and which lanes store them (a C condition on ks)."""
    scatter, d, n = [], split // 2, outputs
    while d >= 1 and n % 2 == 0:
        n //= 2
        scatter.append((d, n))
        d //= 2
    return scatter, n, f"(ks & {2 * d - 1}) == 0" if d else "true"
