"""A persistent kernel's shared memory, as the plan lays it out (`PersistentLaunch.shared`): a pointer to
each part, the on-chip weights loaded before the loop (transposed, K contiguous, padded with zeros),
and the map from a block's columns of a GEMM to the columns of W and C."""

from __future__ import annotations

from ..c_text import comment_text
from ..cuda_kernels import F
from ..plan import GemmLaunch, PersistentItem
from ..tiling import WARPS, whole32
from .context import Kernel
from .staging import rounded

W_LOADS = 8  # loads of the on-chip weights a thread has in flight at once, before the loop


def w_index(g: GemmLaunch, k: str, n: str) -> str:
    """The element of the GEMM's right operand at row k, column n: of W [K, N], or, where the GEMM
    multiplies by W's transpose (dA = dC @ W^T), of W stored [N, K]."""
    return f"(size_t){n} * {g.k} + {k}" if g.trans_w else f"(size_t){k} * {g.n} + {n}"


def w_type(item: PersistentItem) -> str:
    """The C type of a GEMM's on-chip weights: float, or its 16-bit type where it keeps them so."""
    tl, g = item.tiling, item.launch
    if tl.w_itemsize == 4:
        return F
    assert g.multiply.itemsize == tl.w_itemsize, f"{g.group}: {tl.w_itemsize}-byte weights, {g.multiply.name}"
    return g.multiply.c


def shared_memory(k: Kernel) -> None:
    """Where each part of shared memory starts; the on-chip weights loaded, padding zeroed."""
    threads, shared, w = k.launch.threads, k.launch.shared, k.w
    if k.gemms:
        w(f"{F}* const cf_stage = cf_smem;  // [rows][k]: a row tile of a GEMM's operand")
    for i, item in k.gemms:
        g, tl = item.launch, item.tiling
        column_map(k, i, item)
        if item.on_chip:
            kp, ncp = tl.w_stride(g.k), tl.padded_cols
            what = f"rows of {comment_text(g.w)} (columns of its transpose)" if g.trans_w else (
                f"columns of {comment_text(g.w)}, transposed")
            # consecutive threads load consecutive elements of W's rows (of a transposed W, of its
            # columns), W_LOADS loads in flight: one at a time, each thread's loads down a column of W
            # held the tensor-core kernel back (ncu;
            # docs/results/2026-11-26-persistent-rungs-changes-1-to-13.md, change 10)
            along = f"c = e / {kp}, k = e - c * {kp}" if g.trans_w else f"k = e / {ncp}, c = e - k * {ncp}"
            t, value, stored = w_type(item), f"{k.var[g.w]}[{w_index(g, 'k', 'n')}]", "v[q]"
            if t == F:  # rounded as a 16-bit plan's CUDA cores multiply it
                value = rounded(g, value)
            else:  # kept in the GEMM's 16-bit type, rounded as it is stored
                stored = g.multiply.store(stored)
            at = f"cf_smem + {shared.weights_at(i)}"
            w(f"{t}* const w{i} = {at if t == F else f'reinterpret_cast<{t}*>({at})'};  "
              f"// [{ncp}][{kp}]: this block's {what}")
            with w.block(f"for (int e0 = tid; e0 < {ncp * kp}; e0 += {threads * W_LOADS}) {{"):
                w(f"{F} v[{W_LOADS}];", "#pragma unroll")
                with w.block(f"for (int q = 0; q < {W_LOADS}; ++q) {{"):
                    w(f"const int e = e0 + q * {threads}, {along}, n = cols{i}(c);",
                      f"v[q] = (e < {ncp * kp} && k < {g.k} && n >= 0) ? {value} : 0.0f;")
                w("#pragma unroll")
                with w.block(f"for (int q = 0; q < {W_LOADS}; ++q) {{"):
                    w(f"const int e = e0 + q * {threads}, {along};",
                      f"if (e < {ncp * kp}) w{i}[c * {kp} + k] = {stored};")
            if tl.f16x3:
                f16x3_weights(k, i, item)
        if item.output_on_chip and tl.in_registers:
            width = tl.cols_per_thread
            w(f"{F}* const cf_part{i} = cf_smem + {shared.output_at(i)};  // [rows][{WARPS}][{width}]: "
              f"each warp's partial sums of this block's part of {comment_text(g.group)}'s output",
              f"const cf_warp_sums<{width}, {WARPS}> cf_c{i} = {{cf_part{i}}};")
        elif item.output_on_chip:
            w(f"{F}* const cf_c{i} = cf_smem + {shared.output_at(i)};  // [rows][{tl.cols}]: this block's "
              f"part of {comment_text(g.group)}'s output")
    if shared.mma is not None:
        w(f"{F}* const cf_mma = cf_smem + {shared.mma};  // the warps' partial tiles of a GEMM's output, "
          "on tensor cores")
    if shared.stage:  # the columns past K of the staged rows start zero (the float4 sums run over them; a
        # GEMM zeroes them again where a longer one may have written there: staging.zero_past_k)
        w(f"for (int e = tid; e < {shared.stage}; e += {threads}) cf_stage[e] = 0.0f;")
    w("__syncthreads();")


def f16x3_weights(k: Kernel, i: int, item: PersistentItem) -> None:
    """The block's on-chip weights of a float32 GEMM on tensor cores split in place into fp16 pieces
    (f16x3.cuh's cf_split_f16x3), a warp a column: each float4 of four k becomes, in its own 16
    bytes, the hi pieces of those k (two registers of pairs, as mma.sync takes them) then their lo
    pieces; each column scaled by its own power of two, whose inverse `cf_wscale{i}` keeps (for the
    stores of C)."""
    tl, w = item.tiling, k.w
    kp, ncp = tl.w_stride(item.launch.k), tl.padded_cols
    w(f"{F}* const cf_wscale{i} = cf_smem + {k.launch.shared.weights_at(i) + whole32(ncp * kp)};  "
      f"// [{ncp}]: 1 / each column's scale",
      "__syncthreads();  // the weights whole, before a warp splits a column of them")
    with w.block(f"for (int c = tid / 32; c < {ncp}; c += {k.launch.threads // 32}) {{"):
        w(f"float4* const col = reinterpret_cast<float4*>(w{i} + c * {kp});",
          "float m = 0.0f;")
        with w.block(f"for (int q = tid & 31; q < {kp // 4}; q += 32) {{"):
            w("m = fmaxf(m, cf_abs_max(col[q]));")
        w("const float s = cf_f16x3_scale(cf_warp_max(m));")
        with w.block(f"for (int q = tid & 31; q < {kp // 4}; q += 32) {{"):
            w("const float4 v = col[q];",
              "uint4 p;",
              "cf_split_f16x3(v.x * s, v.y * s, p.x, p.z);",
              "cf_split_f16x3(v.z * s, v.w * s, p.y, p.w);",
              "reinterpret_cast<uint4*>(col)[q] = p;")
        w(f"if ((tid & 31) == 0) cf_wscale{i}[c] = cf_f16x3_unscale(s);")


def weights_in_registers(k: Kernel) -> None:
    """Of each GEMM whose products are in registers, the thread's two rows of the block's columns of W
    (its two k of K), from shared memory, once."""
    w = k.w
    for i, item in k.gemms:
        tl = item.tiling
        if not tl.in_registers:
            continue
        kk, width, kp = item.launch.k, tl.cols_per_thread, tl.w_stride(item.launch.k)
        w(f"{F} cf_w{i}[2][{width}];", "#pragma unroll")
        with w.block(f"for (int c = 0; c < {width}; ++c) {{"):
            w(f"cf_w{i}[0][c] = 2 * tid < {kk} ? w{i}[c * {kp} + 2 * tid] : 0.0f;",
              f"cf_w{i}[1][c] = 2 * tid < {kk} ? w{i}[c * {kp} + 2 * tid + 1] : 0.0f;")


def column_map(k: Kernel, i: int, item: PersistentItem) -> None:
    """A lambda from the block's column c of a GEMM to the column of W and C, or -1 for padding."""
    w = k.w
    with w.block(f"auto cols{i} = [cb](int c) -> int {{", "};"):
        start = offset = 0
        for width in item.columns:
            unit = k.launch.unit(width)
            w(f"if (c < {start + unit}) {{ const int j = cb * {unit} + c - {start}; "
              f"return j < {width} ? {offset} + j : -1; }}")
            start += unit
            offset += width
        w("return -1;")
