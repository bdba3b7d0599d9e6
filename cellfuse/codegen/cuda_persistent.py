"""CUDA C for a persistent launch: one cooperative kernel that runs every step of a layer.

Before its loop each block copies its columns of the recurrent weights into shared memory (padded with
zeros to whole tiles). Per step it runs the step's launches in order, each on its own columns: a GEMM
stages its left operand through shared memory in tiles of rows by k (read with `__ldcg`, from L2, since
other blocks wrote it and L1 is not coherent between SMs), every thread keeping a register tile of
outputs; an elementwise launch runs the same body as the fused kernel of the hoisted rung. A
cooperative-groups grid barrier goes where the plan says.
"""

from __future__ import annotations

from .cuda_kernels import ROW_EXPR, Param, comment_text, element_body
from .persistent import gemm_tiling, padded_k
from .plan import Access, GemmLaunch, KernelLaunch, PersistentItem, PersistentLaunch

PERSISTENT_PRELUDE = """\
#include <cooperative_groups.h>
"""


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
    return list(names)


def _written(launch: PersistentLaunch) -> set[str]:
    out = set()
    for item in launch.items:
        match item.launch:
            case GemmLaunch() as g:
                out.add(g.c.buffer)
            case KernelLaunch() as k:
                out |= {acc.buffer for _, acc in k.outputs}
    return out


def _at_step(var: str, acc: Access) -> str:
    """The address of an access's first element at step t, in a kernel with `batch` as an argument."""
    row = ROW_EXPR[acc.slot].format(t="t")
    rows = " + ".join(part for part in (f"(size_t){acc.block} * batch" if acc.block else "",
                                        row if row != "0" and acc.kind == "row" else "") if part)
    parts = [var] + ([f"({rows}) * {acc.ld}"] if rows else []) + ([str(acc.col)] if acc.col else [])
    return " + ".join(parts)


def persistent_source(launch: PersistentLaunch, name: str) -> str:
    buffers = persistent_buffers(launch)
    written = _written(launch)
    var = {b: f"b{i}" for i, b in enumerate(buffers)}
    blocks, threads = launch.blocks, launch.threads
    out = [f"// every step of layer {launch.layer} in one cooperative launch of {blocks} blocks of {threads} "
           f"threads,",
           f"// {launch.barriers_per_step} grid-wide barrier(s) per step, {launch.smem_bytes} bytes of "
           "shared memory per block; arguments:"]
    out += [f"//   {var[b]}: {comment_text(b)}" for b in buffers]
    sig = [f"    {'float*' if b in written else 'const float* __restrict__'} {var[b]}" for b in buffers]
    out.append(f'extern "C" __global__ void __launch_bounds__({threads}, 1) {name}(')
    out.append(",\n".join(["    int seq", "    int batch", *sig]) + ")")
    out.append("{")
    out.append("    extern __shared__ float cf_smem[];")
    out.append("    cooperative_groups::grid_group grid = cooperative_groups::this_grid();")
    out.append("    const int blk = blockIdx.x, tid = threadIdx.x;")
    out.append("    (void)grid; (void)blk;")
    gemms = [(i, item) for i, item in enumerate(launch.items) if isinstance(item.launch, GemmLaunch)]
    staged = max((gemm_tiling(item.columns, blocks, launch.row_tile).padded_rows for _, item in gemms),
                 default=0)
    offset = 0
    if gemms:
        out.append(f"    float* const cf_stage = cf_smem;  // [{launch.k_tile}][{staged}]: a GEMM's operand")
        out.append(f"    float* const cf_partial = cf_smem + {staged * launch.k_tile};  // [{threads}]")
        out.append("    (void)cf_partial;  // used where a small batch splits K between threads")
        offset = staged * launch.k_tile + threads
    for i, item in gemms:
        g, tiling = item.launch, gemm_tiling(item.columns, blocks, launch.row_tile)
        out += _column_map(i, item, blocks)
        if not item.on_chip:
            continue
        kp, ncp = padded_k(g.k, launch.k_tile), tiling.padded_cols
        out.append(f"    float* const w{i} = cf_smem + {offset};  // [{kp}][{ncp}]: this block's columns of "
                   f"{comment_text(g.w)}")
        out.append(f"    for (int e = tid; e < {kp * ncp}; e += {threads}) {{")
        out.append(f"        const int k = e / {ncp}, c = e - k * {ncp}, n = cols{i}(c, blk);")
        out.append(f"        w{i}[e] = (k < {g.k} && n >= 0) ? {var[g.w]}[(size_t)k * {g.n} + n] : 0.0f;")
        out.append("    }")
        offset += kp * ncp
    assert 4 * offset == launch.smem_bytes, "the kernel's shared memory differs from the plan's"
    out.append("    __syncthreads();")
    out.append("    for (int t = 0; t < seq; ++t) {")
    for i, item in enumerate(launch.items):
        out.append("        {" + f"  // {comment_text(_item_name(item))}")
        if item.barrier:
            out.append("            grid.sync();")
        match item.launch:
            case GemmLaunch():
                out += _gemm(i, item, launch, var)
            case KernelLaunch():
                out += _elementwise(item, blocks, threads, var)
        out.append("            __syncthreads();")
        out.append("        }")
    out.append("    }")
    out.append("}")
    return "\n".join(out) + "\n"


def _item_name(item: PersistentItem) -> str:
    match item.launch:
        case GemmLaunch() as g:
            where = "in shared memory" if item.on_chip else "read from L2"
            return f"{g.group}: this block's columns of A @ W, W {where}"
        case KernelLaunch() as k:
            return f"{k.island}: {', '.join(op.result for op in k.body) or 'stores'}"
        case other:
            raise TypeError(f"unknown launch {other!r}")


def _column_map(i: int, item: PersistentItem, blocks: int) -> list[str]:
    """A lambda from a block's column c of the GEMM to the column of W and C, or -1 for padding."""
    lines = [f"    auto cols{i} = [](int c, int b) -> int {{"]
    start = offset = 0
    for width in item.columns:
        unit = -(-width // blocks)
        lines.append(f"        if (c < {start + unit}) {{ const int j = b * {unit} + c - {start}; "
                     f"return j < {width} ? {offset} + j : -1; }}")
        start += unit
        offset += width
    lines.append("        return -1;")
    lines.append("    };")
    return lines


def _gemm(i: int, item: PersistentItem, launch: PersistentLaunch, var: dict[str, str]) -> list[str]:
    g: GemmLaunch = item.launch
    tl = gemm_tiling(item.columns, launch.blocks, launch.row_tile)
    rt, kt, rows = launch.row_tile, launch.k_tile, tl.padded_rows
    tr, tc = tl.rows_per_thread, tl.cols_per_thread
    no, threads = tl.row_threads * tl.col_threads, launch.threads
    ind = "            "
    lines = [f"{ind}const float* const a = {_at_step(var[g.a.buffer], g.a)};",
             f"{ind}float* const c = {_at_step(var[g.c.buffer], g.c)};",
             f"{ind}const int oi = tid % {no}, ks = tid / {no};",
             f"{ind}const int c0 = oi % {tl.col_threads}, r0 = (oi / {tl.col_threads}) * {tr};",
             f"{ind}int n[{tc}];",
             f"{ind}#pragma unroll",
             f"{ind}for (int j = 0; j < {tc}; ++j) n[j] = cols{i}(c0 + j * {tl.col_threads}, blk);",
             f"{ind}for (int rb = 0; rb < batch; rb += {rt}) {{",
             f"{ind}    float acc[{tr}][{tc}] = {{}};",
             f"{ind}    for (int k0 = 0; k0 < {g.k}; k0 += {kt}) {{",
             f"{ind}        __syncthreads();",
             f"{ind}        for (int e = tid; e < {rows * kt}; e += {threads}) {{",
             f"{ind}            const int r = e / {kt}, kk = e - r * {kt};",
             f"{ind}            cf_stage[kk * {rows} + r] = (r < {rt} && rb + r < batch && k0 + kk < {g.k})",
             f"{ind}                ? __ldcg(a + (size_t)(rb + r) * {g.a.ld} + k0 + kk) : 0.0f;",
             f"{ind}        }}",
             f"{ind}        __syncthreads();",
             f"{ind}        if (ks < {tl.k_split}) {{",
             f"{ind}            #pragma unroll 4",
             f"{ind}            for (int kk = ks; kk < {kt}; kk += {tl.k_split}) {{",
             f"{ind}                float av[{tr}], wv[{tc}];",
             f"{ind}                #pragma unroll",
             f"{ind}                for (int q = 0; q < {tr}; ++q) av[q] = cf_stage[kk * {rows} + r0 + q];",
             f"{ind}                #pragma unroll"]
    if item.on_chip:
        ncp = tl.padded_cols
        lines.append(f"{ind}                for (int j = 0; j < {tc}; ++j) "
                     f"wv[j] = w{i}[(k0 + kk) * {ncp} + c0 + j * {tl.col_threads}];")
    else:
        lines.append(f"{ind}                for (int j = 0; j < {tc}; ++j)")
        lines.append(f"{ind}                    wv[j] = (n[j] >= 0 && k0 + kk < {g.k})")
        lines.append(f"{ind}                        ? __ldg({var[g.w]} + (size_t)(k0 + kk) * {g.n} + n[j])")
        lines.append(f"{ind}                        : 0.0f;")
    lines += [f"{ind}                #pragma unroll",
              f"{ind}                for (int q = 0; q < {tr}; ++q)",
              f"{ind}                    #pragma unroll",
              f"{ind}                    for (int j = 0; j < {tc}; ++j) acc[q][j] += av[q] * wv[j];",
              f"{ind}            }}",
              f"{ind}        }}",
              f"{ind}    }}"]
    if tl.k_split > 1:  # then each thread holds one output: add the k_split partial sums
        lines += [f"{ind}    __syncthreads();",
                  f"{ind}    cf_partial[tid] = acc[0][0];",
                  f"{ind}    __syncthreads();",
                  f"{ind}    if (ks == 0)",
                  f"{ind}        for (int q = 1; q < {tl.k_split}; ++q)",
                  f"{ind}            acc[0][0] += cf_partial[q * {no} + oi];"]
    bias = f" + {var[g.bias]}[n[j]]" if g.bias else ""
    lines += [f"{ind}    if (ks == 0)",
              f"{ind}        #pragma unroll",
              f"{ind}        for (int q = 0; q < {tr}; ++q)",
              f"{ind}            #pragma unroll",
              f"{ind}            for (int j = 0; j < {tc}; ++j)",
              f"{ind}                if (r0 + q < {rt} && rb + r0 + q < batch && n[j] >= 0)",
              f"{ind}                    c[(size_t)(rb + r0 + q) * {g.c.ld} + n[j]] = acc[q][j]{bias};",
              f"{ind}}}"]
    return lines


def _elementwise(item: PersistentItem, blocks: int, threads: int, var: dict[str, str]) -> list[str]:
    k: KernelLaunch = item.launch
    params = [Param(v, acc, False) for v, acc in k.inputs] + [Param(v, acc, True) for v, acc in k.outputs]
    names = [f"p{i}" for i in range(len(params))]
    ind = "            "
    lines = [f"{ind}{'float*' if p.output else 'const float*'} const {n} = "
             f"{_at_step(var[p.access.buffer], p.access)};" for p, n in zip(params, names, strict=True)]
    if item.whole:  # the same [N] and scalar values every step, computed by every block
        lines += [f"{ind}for (int e = tid; e < {k.rows * k.width}; e += {threads}) {{",
                  f"{ind}    const int r = e / {k.width}, j = e - r * {k.width};"]
    else:
        unit = -(-k.width // blocks)
        lines += [f"{ind}for (int e = tid; e < batch * {unit}; e += {threads}) {{",
                  f"{ind}    const int r = e / {unit}, j = blk * {unit} + e - r * {unit};",
                  f"{ind}    if (j >= {k.width}) continue;"]
    lines.append(f"{ind}    (void)r;")
    lines += element_body(params, names, k.body, ind + "    ")
    lines.append(f"{ind}}}")
    return lines

