"""A GEMM of a persistent kernel on tensor cores (`mma.sync`; each float32 product as three fp16 ones over
values scaled per row and per column, float32's error for values within 2^-26 of their row's and column's
largest: f16x3.cuh's cf_split_f16x3; in a 16-bit plan, one bf16 or fp16 product, its operands rounded
to the type as they are taken into registers): per tile of rows and chunk of K, the chunk staged (or its
rows taken from their exchange), each warp's tile of C over its share of the chunk, the warps that share a
tile adding their partial tiles through shared memory."""

from __future__ import annotations

from ..cuda_kernels import F
from ..dtypes import FLOAT32
from ..plan import GemmLaunch, PersistentItem
from ..tiling import MMA_K_BLOCK, MMA_M, MMA_N, WARPS, GemmTiling
from .context import Kernel
from .exchange import poll_rows
from .gemm_fma import k_loop_unroll
from .shared_memory import w_type
from .staging import pointers, stage, store, zero_past_k


def fragments(k: Kernel) -> dict[int, int]:
    """Of the kernel's GEMMs on tensor cores, those whose warps keep fragments of W in registers for the
    whole run (item index -> how many of a warp's iterations over K take theirs from registers, the first
    ones; the others load theirs from shared memory at every step): a 16-bit W (two k a register), all of
    K in one chunk, each warp one tile and one share of K (so that its fragments never change), the GEMMs
    in order, each given what is left of the kernel's budget of registers for them (`k.fragments`, at
    most tiling.FRAGMENT_REGISTERS: less where the kernel is written again because it spilled registers,
    see gpu_runtime.kernel_cache.fitted); none where its loops over K unroll less (`k.k_unroll`: the loop
    of kept fragments is unrolled whole).
    Loading all of them from shared memory at every step took the bf16 LSTM's forward at B=64 a ninth of
    its kernel's time (benchmarks/results/h200_2026-12-01_step_profile_no_w_loads_cd06826.txt)."""
    kept, left = {}, 0 if k.k_unroll else k.fragments
    for i, item in k.gemms:
        tl, g = item.tiling, item.launch
        if not item.mma or tl.f16x3 or tl.w_itemsize != 2 or -(-g.k // tl.k_chunk) > 1:
            continue
        if tl.output_threads * tl.k_split > WARPS:
            continue
        blocks = -(-tl.k_chunk // MMA_K_BLOCK)
        iters = -(-blocks // tl.k_split)
        each = (tl.cols_per_thread // MMA_N) * 2  # registers an iteration's fragments take
        if n := min(iters, left // each):
            kept[i], left = n, left - n * each
    return kept


def load_fragments(k: Kernel) -> None:
    """Before the loop, each warp's fragments of W kept in registers (see `fragments`) from shared memory:
    cf_wf{i}[iteration][product], the lane's two registers of each mma.sync product."""
    w = k.w
    for i, kept in fragments(k).items():
        item = k.launch.items[i]
        tl, g = item.tiling, item.launch
        nb, kp, split = tl.cols_per_thread // MMA_N, tl.w_stride(g.k), tl.k_split
        w(f"uint2 cf_wf{i}[{kept}][{nb}];")
        with w.block("{"):
            w("const int o = tid / 32, lane = tid & 31, kc = 0;",
              "(void)kc;",
              f"const int tile = o / {split}, ks = o % {split};",
              f"const {w_type(item)}* const wt = w{i} + ((tile % {tl.col_threads}) * {tl.cols_per_thread} + "
              f"(lane >> 2)) * {kp} + 4 * (lane & 3);",
              "#pragma unroll")
            with w.block(f"for (int j = 0; j < {kept}; ++j) {{"):
                w(f"const int k = (ks + j * {split}) * {MMA_K_BLOCK};",
                  "#pragma unroll",
                  f"for (int x = 0; x < {nb}; ++x)",
                  f"    cf_wf{i}[j][x] = o < {tl.output_threads * split} && k < {_k_end(tl, g)}",
                  f"        ? *(const uint2*)(wt + x * {MMA_N * kp} + k) : make_uint2(0u, 0u);")


def _k_end(tl: GemmTiling, g: GemmLaunch) -> str:
    """Where a chunk's k end (kc, the chunk's first column): the chunk's blocks of sixteen k, the last
    chunk's ending with K's last block (the rows of W end there)."""
    chunk = tl.k_chunk
    blocks = -(-chunk // MMA_K_BLOCK)
    return (str(MMA_K_BLOCK * blocks) if g.k % chunk == 0
            else f"min({MMA_K_BLOCK * blocks}, {MMA_K_BLOCK * -(-g.k // MMA_K_BLOCK)} - kc)")


def gemm(k: Kernel, i: int, item: PersistentItem) -> None:
    """Per tile of rows and chunk of K, each warp's tile of C over its share of the chunk, sixteen k at a
    time, its partial tile carried in shared memory from one chunk to the next; then the warps' partial
    tiles added up and stored by all the block's threads, through the column map and the bias. A float32
    product is three fp16 ones (see `_f16x3_products`), over the chunk's rows scaled each by its own
    power of two (`_row_scales`, each warp over its share of K) and W's columns by theirs
    (`f16x3_weights`): the small products summed apart, and the scales undone as the warp's partial tile
    of the chunk is stored.

    A lane of group g (lane / 4) and place q (lane % 4) holds, for each mma.sync product (m16n8k16, a pair
    of k in each register), rows g and g + 8 of A and column g of W (of the product's eight columns), at
    the product's k 2q, 2q + 1, 2q + 8 and 2q + 9. Those k are taken in an order of their own, so that each
    row a lane reads is one float4: the K_BLOCK's k 4q and 4q + 1 in slots 2q and 2q + 1, 4q + 2 and 4q + 3
    in slots 2q + 8 and 2q + 9 (A and W in the same order: the sum over K is the same)."""
    g: GemmLaunch = item.launch
    tl: GemmTiling = item.tiling
    w = k.w
    threads, rt, kp = k.launch.threads, k.launch.row_tile, tl.w_stride(g.k)
    split, tiles, nt = tl.k_split, tl.output_threads, tl.col_threads
    chunk, stride = tl.k_chunk, tl.stage_stride(g.k)
    wc = tl.cols_per_thread  # a warp tile's columns
    nb = wc // MMA_N  # its products side by side
    regs = 4 * nb  # of its accumulators
    area = MMA_M * wc
    chunks = -(-g.k // chunk)
    blocks = -(-chunk // MMA_K_BLOCK)
    end = _k_end(tl, g)
    iters = -(-blocks // split)
    kept = fragments(k).get(i, 0)
    assert tl.f16x3 == (g.multiply == FLOAT32), f"{g.group}: {g.multiply.name} products, f16x3 {tl.f16x3}"
    pointers(k, item)
    with w.block(f"for (int rb = 0; rb < rows; rb += {rt}) {{"):
        with w.block(f"for (int kc = 0; kc < {chunks * chunk}; kc += {chunk}) {{"):
            w("__syncthreads();  // the stage and the partial tiles are free again")
            if g.a.buffer in k.exchange:  # (one chunk: all of K, see persistent.exchanges)
                poll_rows(k, *k.exchange[g.a.buffer], stride)
            else:
                stage(k, g, "kc", chunk, stride)
            zero_past_k(k, g, tl.padded_rows, stride, MMA_K_BLOCK, (chunks - 1) * chunk if chunks > 1
                        else None)
            w("__syncthreads();",
              "const int lane = tid & 31;")
            with w.block(f"for (int o = tid / 32; o < {tiles * split}; o += {WARPS}) {{"):
                w(f"const int tile = o / {split}, ks = o % {split};",
                  f"const {F}* const at = cf_stage + ((tile / {nt}) * {MMA_M} + (lane >> 2)) * {stride} + "
                  "4 * (lane & 3);",
                  f"const {w_type(item)}* const wt = w{i} + ((tile % {nt}) * {wc} + (lane >> 2)) * {kp} + "
                  "kc + 4 * (lane & 3);",
                  f"{F}* const part = cf_mma + (size_t)o * {regs * 32} + lane;  // [{regs}][32]",
                  f"{F} acc[{nb}][4];")
                if tl.f16x3:  # the small products apart, every chunk from zero (its own rows' scales)
                    _row_scales(k, split, stride, end, iters)
                    w(f"{F} small[{nb}][4];",
                      "#pragma unroll",
                      f"for (int m = 0; m < {regs}; ++m) acc[m / 4][m % 4] = small[m / 4][m % 4] = 0.0f;")
                else:
                    w("#pragma unroll",
                      f"for (int m = 0; m < {regs}; ++m)",
                      f"    acc[m / 4][m % 4] = {'kc ? part[m * 32] : 0.0f' if chunks > 1 else '0.0f'};")
                if kept:  # the iterations counted, so that each knows its fragments
                    loop = (f"for (int j = 0; j < {iters}; ++j) {{", f"const int k = (ks + j * {split}) * "
                            f"{MMA_K_BLOCK};", f"if (k >= {end}) break;")
                else:
                    loop = (f"for (int k = ks * {MMA_K_BLOCK}; k < {end}; k += {split * MMA_K_BLOCK}) {{",)
                w("#pragma unroll" if kept else k_loop_unroll(k, iters))
                with w.block(loop[0]):
                    w(*loop[1:],
                      f"const float4 a4[2] = {{*(const float4*)(at + k), "
                      f"*(const float4*)(at + {8 * stride} + k)}};")
                    if tl.f16x3:
                        _f16x3_products(k, nb, kp)
                    else:
                        _sixteen_bit_products(k, g, nb, kp, tl.w_itemsize == 2,
                                              f"j < {kept} ? cf_wf{i}[j][x] : " if kept else "")
                # element m of the lane's tile: row g + 8 (m % 4 / 2), column 8 (m / 4) + 2q + m % 2; the
                # rows' scales undone here, W's columns' (the same in every chunk) as C is stored: a partial
                # sum keeps its column's scale (at most 2^15 over the column's largest), so it overflows
                # only where K times its row's largest passes 2^113
                if tl.f16x3:
                    w(f"const {F} i0 = cf_f16x3_unscale(s0), i1 = cf_f16x3_unscale(s1);",
                      "#pragma unroll")
                    with w.block(f"for (int m = 0; m < {regs}; ++m) {{"):
                        w(f"const {F} v = (acc[m / 4][m % 4] + small[m / 4][m % 4] * (1.0f / 2048.0f)) * "
                          "(m % 4 < 2 ? i0 : i1);",
                          f"part[m * 32] = {'kc ? part[m * 32] + v : v' if chunks > 1 else 'v'};")
                else:
                    w("#pragma unroll",
                      f"for (int m = 0; m < {regs}; ++m) part[m * 32] = acc[m / 4][m % 4];")
        # element (y, x) of a warp tile is register 4 (x / 8) + 2 (y / 8) + x % 2 of lane 4 (y % 8) + x % 8
        # / 2: mma.sync's layout of C (the thread's elements unrolled, their loads before any test: all in
        # flight at once)
        w("__syncthreads();",
          "#pragma unroll")
        with w.block(f"for (int q = 0; q < {-(-tiles * area // threads)}; ++q) {{"):
            w(f"const int e = tid + q * {threads};")
            if tiles * area % threads:
                w(f"if (e >= {tiles * area}) break;")
            w(f"const int tile = e / {area}, y = e % {area} / {wc}, x = e % {wc};",
              f"const int r = (tile / {nt}) * {MMA_M} + y;",
              f"const int cc = (tile % {nt}) * {wc} + x;  // the block's column",
              "const int at = (4 * (x / 8) + 2 * (y / 8) + x % 2) * 32 + 4 * (y % 8) + x % 8 / 2;",
              f"{F} v = 0.0f;",
              "#pragma unroll",
              f"for (int s = 0; s < {split}; ++s) "
              f"v += cf_mma[(size_t)(tile * {split} + s) * {regs * 32} + at];",
              *([f"v *= cf_wscale{i}[cc];"] if tl.f16x3 else []),
              f"const int n = cols{i}(cc);",
              f"if (n >= 0 && r < {rt} && rb + r < rows)",
              f"    {store(k, i, item, 'rb + r', 'cc', 'v')}")
    w("__syncthreads();  // C is read next by other threads of the block")


def _row_scales(k: Kernel, split: int, stride: int, end: str, iters: int) -> None:
    """s0 and s1, the scales of the warp's rows g and g + 8 for their split into fp16 pieces
    (f16x3.cuh's cf_f16x3_scale of their largest magnitude over the k the warp multiplies, which its
    four lanes of each row read): each warp its own, so that no barrier waits for them (a pass over the
    whole staged rows and a barrier after it took 0.8 us of the LSTM's 5.6 us step at B=64); the warps
    that share a tile add their partial tiles once each has undone its own scales."""
    w = k.w
    w("float m0 = 0.0f, m1 = 0.0f;",
      k_loop_unroll(k, iters))
    with w.block(f"for (int k = ks * {MMA_K_BLOCK}; k < {end}; k += {split * MMA_K_BLOCK}) {{"):
        w("m0 = fmaxf(m0, cf_abs_max(*(const float4*)(at + k)));",
          f"m1 = fmaxf(m1, cf_abs_max(*(const float4*)(at + {8 * stride} + k)));")
    w("#pragma unroll")
    with w.block("for (int d = 1; d < 4; d *= 2) {  // the row's four lanes"):
        w("m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, d));",
          "m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, d));")
    w(f"const {F} s0 = cf_f16x3_scale(m0), s1 = cf_f16x3_scale(m1);")


def _f16x3_products(k: Kernel, nb: int, kp: int) -> None:
    """The products of one block of sixteen k, from the float4s a4 of A's rows g and g + 8 (see `gemm`),
    each float32 product as three fp16 ones (m16n8k16): A's values scaled by their rows' s0 and s1 and
    split here, W's split in shared memory already (a float4 of four k: their hi pieces, then their lo
    pieces, see `f16x3_weights`); hi * lo and lo * hi summed apart, in `small`, and hi * hi in `acc`."""
    k.w("unsigned ah[4], al[4];",
        "cf_split_f16x3(a4[0].x * s0, a4[0].y * s0, ah[0], al[0]);",
        "cf_split_f16x3(a4[1].x * s1, a4[1].y * s1, ah[1], al[1]);",
        "cf_split_f16x3(a4[0].z * s0, a4[0].w * s0, ah[2], al[2]);",
        "cf_split_f16x3(a4[1].z * s1, a4[1].w * s1, ah[3], al[3]);",
        "#pragma unroll")
    with k.w.block(f"for (int x = 0; x < {nb}; ++x) {{"):
        k.w(f"const uint4 w4 = *(const uint4*)(wt + x * {MMA_N * kp} + k);",
            "cf_mma_f16(small[x], ah[0], ah[1], ah[2], ah[3], w4.z, w4.w);",
            "cf_mma_f16(small[x], al[0], al[1], al[2], al[3], w4.x, w4.y);",
            "cf_mma_f16(acc[x], ah[0], ah[1], ah[2], ah[3], w4.x, w4.y);")


def _sixteen_bit_products(k: Kernel, g: GemmLaunch, nb: int, kp: int, packed: bool, kept: str = "") -> None:
    """The products of one block of sixteen k in the GEMM's 16-bit type, from the float4s a4 of A's rows
    g and g + 8 (see `gemm`), each of the warp tile's nb tiles of eight columns one mma.sync. W's four k
    are one float4, rounded and packed here, or (`packed`: kept in the 16-bit type) already the two
    registers, in 8 bytes (the first k in the low half, as in memory), those of the iterations that
    keep them in registers for the run taken from there (`kept`: the choice, see `fragments`)."""
    t = g.multiply.suffix
    k.w(f"const unsigned a0 = cf_pack_{t}(a4[0].x, a4[0].y), a1 = cf_pack_{t}(a4[1].x, a4[1].y),",
        f"               a2 = cf_pack_{t}(a4[0].z, a4[0].w), a3 = cf_pack_{t}(a4[1].z, a4[1].w);",
        "#pragma unroll")
    with k.w.block(f"for (int x = 0; x < {nb}; ++x) {{"):
        if packed:
            k.w(f"const uint2 w2 = {kept}*(const uint2*)(wt + x * {MMA_N * kp} + k);",
                f"cf_mma_{t}(acc[x], a0, a1, a2, a3, w2.x, w2.y);")
        else:
            k.w(f"const float4 w4 = *(const float4*)(wt + x * {MMA_N * kp} + k);",
                f"cf_mma_{t}(acc[x], a0, a1, a2, a3, cf_pack_{t}(w4.x, w4.y), cf_pack_{t}(w4.z, w4.w));")
