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
from .persistent import GemmTiling, gemm_tiling, k_stride
from .plan import Access, GemmLaunch, KernelLaunch, PersistentItem, PersistentLaunch

PERSISTENT_PRELUDE = """\
#include <cooperative_groups.h>

// 16 bytes from global to shared memory without a register, cached in L2 only: other blocks wrote them.
__device__ __forceinline__ void cf_copy16(float* shared, const float* global) {
    const unsigned to = (unsigned)__cvta_generic_to_shared(shared);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\\n" :: "r"(to), "l"(global) : "memory");
}

__device__ __forceinline__ void cf_copies_done() {
    asm volatile("cp.async.wait_all;\\n" ::: "memory");
}
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
    tilings = {i: gemm_tiling(item.columns, blocks, launch.row_tile, item.launch.k) for i, item in gemms}
    staged = max((tilings[i].padded_rows * k_stride(item.launch.k) for i, item in gemms), default=0)
    offset = staged
    if gemms:
        out.append("    float* const cf_stage = cf_smem;  // [rows][k]: a row tile of a GEMM's operand")
    for i, item in gemms:
        g, tl = item.launch, tilings[i]
        out += _column_map(i, item, blocks)
        if not item.on_chip:
            continue
        kp, ncp = k_stride(g.k), tl.padded_cols
        out.append(f"    float* const w{i} = cf_smem + {offset};  // [{ncp}][{kp}]: this block's columns of "
                   f"{comment_text(g.w)}, transposed")
        out.append(f"    for (int e = tid; e < {ncp * kp}; e += {threads}) {{")
        out.append(f"        const int c = e / {kp}, k = e - c * {kp}, n = cols{i}(c, blk);")
        out.append(f"        w{i}[e] = (k < {g.k} && n >= 0) ? {var[g.w]}[(size_t)k * {g.n} + n] : 0.0f;")
        out.append("    }")
        offset += kp * ncp
    for i, item in gemms:
        if item.output_on_chip:
            size = launch.batch * tilings[i].cols
            out.append(f"    float* const cf_c{i} = cf_smem + {offset};  // [batch][{tilings[i].cols}]: "
                       f"this block's columns of {comment_text(item.launch.group)}'s output")
            offset += size
    if staged:  # the columns past K of every staged row stay zero: the float4 sums run over them
        out.append(f"    for (int e = tid; e < {staged}; e += {threads}) cf_stage[e] = 0.0f;")
    assert 4 * offset == launch.smem_bytes, "the kernel's shared memory differs from the plan's"
    out.append("    __syncthreads();")
    on_chip = {item.launch.c.buffer: (i, item, tilings[i].cols) for i, item in gemms if item.output_on_chip}
    out.append("    for (int t = 0; t < seq; ++t) {")
    n = len(launch.items)
    for i, item in enumerate(launch.items):
        out.append("        {" + f"  // {comment_text(_item_name(item))}")
        if item.barrier:
            out.append("            grid.sync();")
        match item.launch:
            case GemmLaunch():
                out += _gemm(i, item, launch, tilings[i], var)
            case KernelLaunch():
                out += _elementwise(item, blocks, threads, var, on_chip)
                if _needs_sync(item, launch.items[(i + 1) % n]):
                    out.append("            __syncthreads();")
        out.append("        }")
    out.append("    }")
    out.append("}")
    return "\n".join(out) + "\n"


def _needs_sync(item: PersistentItem, after: PersistentItem) -> bool:
    """Whether the block's threads must wait for each other between an elementwise launch and the next:
    not where both give each thread the same elements (it reads only what it wrote itself). A GEMM
    starts with its own wait."""
    if isinstance(after.launch, GemmLaunch):
        return False
    same = (after.whole == item.whole and after.launch.width == item.launch.width
            and after.launch.rows == item.launch.rows)
    return not same


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


def _gemm(i: int, item: PersistentItem, launch: PersistentLaunch, tl: GemmTiling,
          var: dict[str, str]) -> list[str]:
    g: GemmLaunch = item.launch
    rt, kp, k4 = launch.row_tile, k_stride(g.k), -(-g.k // 4)
    tr, tc, split = tl.rows_per_thread, tl.cols_per_thread, tl.k_split
    per_pass = launch.threads // split  # output tiles the block computes at once
    ind = "            "
    vector = g.k % 4 == 0 and g.a.ld % 4 == 0 and g.a.col % 4 == 0
    lines = [f"{ind}const float* const a = {_at_step(var[g.a.buffer], g.a)};"]
    if not item.output_on_chip:
        lines.append(f"{ind}float* const c = {_at_step(var[g.c.buffer], g.c)};")
    lines += [f"{ind}for (int rb = 0; rb < batch; rb += {rt}) {{",
             f"{ind}    __syncthreads();  // the stage is free again"]
    # Stage rows rb.. of A, every k, from L2 (__ldcg: other blocks wrote them, and L1 is not coherent).
    if vector:  # asynchronous copies, all in flight at once, through L2 only (cp.async.cg)
        lines += [f"{ind}    if ((((size_t)a) & 15) == 0) {{",
                  f"{ind}        for (int e = tid; e < {rt * k4}; e += {launch.threads}) {{",
                  f"{ind}            const int r = e / {k4}, q = e - r * {k4};",
                  f"{ind}            float* const s = cf_stage + r * {kp} + 4 * q;",
                  f"{ind}            if (rb + r < batch) cf_copy16(s, a + (size_t)(rb + r) * {g.a.ld} + 4 * q);",
                  f"{ind}            else *(float4*)s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);",
                  f"{ind}        }}",
                  f"{ind}        cf_copies_done();",
                  f"{ind}    }} else"]
    lines += [f"{ind}    for (int e = tid; e < {rt * g.k}; e += {launch.threads}) {{",
              f"{ind}        const int r = e / {g.k}, k = e - r * {g.k};",
              f"{ind}        cf_stage[r * {kp} + k] = rb + r < batch ? __ldcg(a + (size_t)(rb + r) * {g.a.ld} + k)"
              " : 0.0f;",
              f"{ind}    }}",
              f"{ind}    __syncthreads();",
              f"{ind}    const int ks = tid % {split};",
              f"{ind}    for (int o = tid / {split}; o < {tl.output_threads}; o += {per_pass}) {{",
              f"{ind}        const int c0 = (o % {tl.col_threads}) * {tc}, r0 = (o / {tl.col_threads}) * {tr};",
              f"{ind}        float acc[{tr}][{tc}] = {{}};",
              f"{ind}        for (int q = ks; q < {k4}; q += {split}) {{",
              f"{ind}            float4 av[{tr}], wv[{tc}];",
              f"{ind}            #pragma unroll",
              f"{ind}            for (int y = 0; y < {tr}; ++y) av[y] = *(const float4*)(cf_stage + (r0 + y) * {kp} + 4 * q);",
              f"{ind}            #pragma unroll"]
    if item.on_chip:
        lines.append(f"{ind}            for (int x = 0; x < {tc}; ++x) wv[x] = *(const float4*)(w{i} + (c0 + x) * {kp} + 4 * q);")
    else:  # read from L2, where it never changes
        lines += [f"{ind}            for (int x = 0; x < {tc}; ++x) {{",
                  f"{ind}                const int n = cols{i}(c0 + x, blk), k = 4 * q;",
                  f"{ind}                const float* w = {var[g.w]} + n;",
                  f"{ind}                wv[x] = n < 0 ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : make_float4(",
                  f"{ind}                    __ldg(w + (size_t)k * {g.n}), k + 1 < {g.k} ? __ldg(w + (size_t)(k + 1) * {g.n}) : 0.0f,",
                  f"{ind}                    k + 2 < {g.k} ? __ldg(w + (size_t)(k + 2) * {g.n}) : 0.0f,",
                  f"{ind}                    k + 3 < {g.k} ? __ldg(w + (size_t)(k + 3) * {g.n}) : 0.0f);",
                  f"{ind}            }}"]
    lines += [f"{ind}            #pragma unroll",
              f"{ind}            for (int y = 0; y < {tr}; ++y)",
              f"{ind}                #pragma unroll",
              f"{ind}                for (int x = 0; x < {tc}; ++x)",
              f"{ind}                    acc[y][x] += av[y].x * wv[x].x + av[y].y * wv[x].y + av[y].z * wv[x].z"
              " + av[y].w * wv[x].w;",
              f"{ind}        }}"]
    if split > 1:  # the lanes of one tile are neighbours in a warp: add their partial sums
        mask = "0xffffffffu" if split == 32 else f"(0x{(1 << split) - 1:x}u << (tid & 31 & ~{split - 1}))"
        lines += [f"{ind}        #pragma unroll",
                  f"{ind}        for (int d = {split // 2}; d > 0; d /= 2)",
                  f"{ind}            #pragma unroll",
                  f"{ind}            for (int y = 0; y < {tr}; ++y)",
                  f"{ind}                #pragma unroll",
                  f"{ind}                for (int x = 0; x < {tc}; ++x)",
                  f"{ind}                    acc[y][x] += __shfl_xor_sync({mask}, acc[y][x], d);"]
    bias = f" + {var[g.bias]}[n]" if g.bias else ""
    store = (f"cf_c{i}[(rb + r0 + y) * {tl.cols} + c0 + x]" if item.output_on_chip
             else f"c[(size_t)(rb + r0 + y) * {g.c.ld} + n]")
    lines += [f"{ind}        if (ks == 0)",
              f"{ind}            #pragma unroll",
              f"{ind}            for (int x = 0; x < {tc}; ++x) {{",
              f"{ind}                const int n = cols{i}(c0 + x, blk);",
              f"{ind}                #pragma unroll",
              f"{ind}                for (int y = 0; y < {tr}; ++y)",
              f"{ind}                    if (n >= 0 && r0 + y < {rt} && rb + r0 + y < batch)",
              f"{ind}                        {store} = acc[y][x]{bias};",
              f"{ind}            }}",
              f"{ind}    }}",
              f"{ind}}}",
              f"{ind}__syncthreads();  // C is read next by other threads of the block"]
    return lines


def _elementwise(item: PersistentItem, blocks: int, threads: int, var: dict[str, str],
                 on_chip: dict[str, tuple[int, PersistentItem, int]]) -> list[str]:
    """An elementwise launch on the block's columns; a GEMM output kept on chip is read from there."""
    k: KernelLaunch = item.launch
    params = [Param(v, acc, False) for v, acc in k.inputs] + [Param(v, acc, True) for v, acc in k.outputs]
    names = [f"p{i}" for i in range(len(params))]
    ind = "            "
    lines, index = [], {}
    for i, (p, n) in enumerate(zip(params, names, strict=True)):
        if p.access.buffer in on_chip and not p.output:
            g, gemm, cols = on_chip[p.access.buffer]
            block = [sum(gemm.columns[:b]) for b in range(len(gemm.columns))].index(p.access.col)
            start, unit = sum(-(-w // blocks) for w in gemm.columns[:block]), -(-gemm.columns[block] // blocks)
            names[i] = f"cf_c{g}"
            index[i] = f"r * {cols} + {start} + j - blk * {unit}"
        else:
            lines.append(f"{ind}{'float*' if p.output else 'const float*'} const {n} = "
                         f"{_at_step(var[p.access.buffer], p.access)};")
    if item.whole:  # the same [N] and scalar values every step, computed by every block
        lines += [f"{ind}for (int e = tid; e < {k.rows * k.width}; e += {threads}) {{",
                  f"{ind}    const int r = e / {k.width}, j = e - r * {k.width};"]
    else:
        unit = -(-k.width // blocks)
        lines += [f"{ind}for (int e = tid; e < batch * {unit}; e += {threads}) {{",
                  f"{ind}    const int r = e / {unit}, j = blk * {unit} + e - r * {unit};",
                  f"{ind}    if (j >= {k.width}) continue;"]
    lines.append(f"{ind}    (void)r;")
    lines += element_body(params, names, k.body, ind + "    ", index)
    lines.append(f"{ind}}}")
    return lines

