"""What every GEMM of a persistent kernel does around its products: its operand's and output's pointers
at the step, the rows of its operand staged in shared memory, and the store of an output value."""

from __future__ import annotations

from ..address import c_address
from ..cuda_kernels import F
from ..dtypes import FLOAT32
from ..plan import GemmLaunch, PersistentItem
from .context import Kernel

# registers of a 16-bit operand's values a thread loads at once as it stages them: with 16, the bf16 LSTM's
# training step at B=256 took 3.21 ms, with 32 3.14 (float32's asynchronous copies: 3.11), at B=64 both
# 1.13 (benchmarks/results/h200_2026-12-01_sixteen_bit_staging_in_flight_ab_a69c1c9.txt)
IN_FLIGHT_WORDS = 32


def rounded(g: GemmLaunch, value: str) -> str:
    """`value` as the GEMM multiplies it on the CUDA cores: rounded to its 16-bit type (mma16.cuh), or as it
    is in float32."""
    return value if g.multiply == FLOAT32 else f"cf_round_{g.multiply.suffix}({value})"


def operand(g: GemmLaunch, at: str, rounding: bool = True) -> str:
    """The operand's element at offset `at` from `a`, with `rounding` as the GEMM multiplies it on the CUDA
    cores: a float32 one `rounded`, a 16-bit one (a reverse loop's dC, see backward_plan.sixteen_bit_grads)
    as it is."""
    value = g.a.dtype.load(f"__ldcg(a + {at})")
    return rounded(g, value) if rounding and g.a.dtype == FLOAT32 else value


def pointers(k: Kernel, item: PersistentItem) -> None:
    """`a`, the block's first row of the operand at step t (unless it comes from an exchange), and `c`, of
    the output (unless it stays on chip)."""
    g: GemmLaunch = item.launch
    # the products' float4 loads from the stage and the stores are float32's; the operand is staged from
    # float32 or from the 16-bit type
    assert g.c.dtype == FLOAT32, f"{g.group}: a persistent GEMM writes float32"
    assert g.a.dtype in (FLOAT32, g.multiply), f"{g.group}: its operand is float32 or {g.multiply.name}"
    if g.a.buffer not in k.exchange:
        k.w(f"const {g.a.dtype.c}* const a = {c_address(k.var[g.a.buffer], g.a)} + (size_t)row0 * {g.a.ld};")
    if not item.output_on_chip:
        k.w(f"{F}* const c = {c_address(k.var[g.c.buffer], g.c)} + (size_t)row0 * {g.c.ld};")


def stage(k: Kernel, g: GemmLaunch, first: str, width: int, stride: int, rounding: bool = False) -> None:
    """Stages rows rb.. of the block's rows of A, columns `first` .. + `width` of K (zeros past K), at
    `stride` floats a row: asynchronous copies, all in flight at once, where A's rows allow them. With
    `rounding`, each value as the GEMM multiplies it on the CUDA cores (`rounded`): each thread rounds
    the values it copied once its copies are done. A 16-bit operand is loaded into registers and stored
    converted (`sixteen_bit_stage`), its values the GEMM's type already."""
    rt, threads, w = k.launch.row_tile, k.launch.threads, k.w
    past = f"{first} + " if first != "0" else ""
    clip = width < g.k  # a chunk of K, the last one possibly past its end
    fours = g.k % 4 == 0 and g.a.ld % 4 == 0 and g.a.col % 4 == 0 and width % 4 == 0
    if fours and g.a.dtype != FLOAT32:
        sixteen_bit_stage(k, g, past, width, stride, clip)
    elif fours:
        w4 = width // 4
        with w.block("if ((((size_t)a) & 15) == 0) {", "} else"):
            with w.block(f"for (int e = tid; e < {rt * w4}; e += {threads}) {{"):
                w(f"const int r = e / {w4}, q = e - r * {w4};",
                  f"{F}* const s = cf_stage + r * {stride} + 4 * q;",
                  f"if (rb + r < rows{f' && {past}4 * q < {g.k}' if clip else ''})",
                  f"    cf_copy16(s, a + (size_t)(rb + r) * {g.a.ld} + {past}4 * q);",
                  "else *(float4*)s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);")
            w("cf_copies_done();")
            if rounding:
                with w.block(f"for (int e = tid; e < {rt * w4}; e += {threads}) {{"):
                    w(f"float4* const s = (float4*)(cf_stage + (e / {w4}) * {stride} + 4 * (e % {w4}));",
                      f"*s = make_float4({', '.join(rounded(g, f's->{c}') for c in 'xyzw')});")
    with w.block(f"for (int e = tid; e < {rt * width}; e += {threads}) {{"):
        value = operand(g, f"(size_t)(rb + r) * {g.a.ld} + {past}k", rounding)
        w(f"const int r = e / {width}, k = e - r * {width};",
          f"cf_stage[r * {stride} + k] =",
          f"    rb + r < rows{f' && {past}k < {g.k}' if clip else ''} ? {value} : 0.0f;")


def sixteen_bit_stage(k: Kernel, g: GemmLaunch, past: str, width: int, stride: int, clip: bool) -> None:
    """`stage` of a 16-bit operand whose K, rows and chunk come in fours: each thread loads four values (8
    bytes) at a time, IN_FLIGHT_WORDS registers of them all at once before it converts any and stores
    them as a float4 (a warp's stores side by side, free of bank conflicts). Loaded and stored one at a
    time, each load waited for, the bf16 LSTM's training step at B=256 took 5% longer than with
    float32's asynchronous copies."""
    rt, threads, w = k.launch.row_tile, k.launch.threads, k.w
    per, t = width // 4, g.a.dtype.c
    total = rt * per
    batch = max(1, min(IN_FLIGHT_WORDS // 2, -(-total // threads)))
    where = f"const int e = e0 + i * {threads}, r = e / {per}, q = e - r * {per};"
    four = ", ".join(g.a.dtype.load(f"h[{i}]") for i in range(4))
    with w.block("if ((((size_t)a) & 7) == 0) {", "} else"):
        with w.block(f"for (int e0 = tid; e0 < {total}; e0 += {threads * batch}) {{"):
            w(f"uint2 u[{batch}];", "#pragma unroll")
            with w.block(f"for (int i = 0; i < {batch}; ++i) {{"):
                src = f"a + (size_t)(rb + r) * {g.a.ld} + {past}4 * q"
                w(where,
                  f"u[i] = e < {total} && rb + r < rows{f' && {past}4 * q < {g.k}' if clip else ''}",
                  f"    ? __ldcg((const uint2*)({src})) : make_uint2(0u, 0u);")
            w("#pragma unroll")
            with w.block(f"for (int i = 0; i < {batch}; ++i) {{"):
                w(where,
                  f"const {t}* const h = (const {t}*)&u[i];",
                  f"if (e < {total}) *(float4*)(cf_stage + r * {stride} + 4 * q) = make_float4({four});")


def zero_past_k(k: Kernel, g: GemmLaunch, rows: int, stride: int, multiple: int,
                last: int | None = None) -> None:
    """Zeroes the staged rows' columns from K up to K rounded up to `multiple` (what the products read past
    K: float4s on the CUDA cores, blocks of sixteen k on tensor cores), where K is not a multiple of it:
    the kernel's GEMMs share the stage, and one with longer rows may have left its values there (an inf or
    NaN times W's zero padding is NaN; on tensor cores any value there would count in its row's scale).
    `last`: the first column of the last chunk of K, where K is staged in chunks (`kc` the chunk's)."""
    pad = -g.k % multiple
    if not pad:
        return
    start = last or 0
    k.w(("" if last is None else f"if (kc == {last}) ")
        + f"for (int e = tid; e < {rows * pad}; e += {k.launch.threads}) "
        f"cf_stage[(e / {pad}) * {stride} + {g.k - start} + e % {pad}] = 0.0f;")


def store(k: Kernel, i: int, item: PersistentItem, row: str, col: str, value: str, old: str = "") -> str:
    """The statement that puts a GEMM's `value` at `row` of the block's rows and `col` of its columns (n:
    the column of C): into shared memory where the output stays on chip, else to C, with the bias; added
    to what is there for a GEMM that accumulates (to `old`, where that was loaded)."""
    g: GemmLaunch = item.launch
    at = (f"cf_c{i}[({row}) * {item.tiling.cols} + {col}]" if item.output_on_chip
          else f"c[(size_t)({row}) * {g.c.ld} + n]")
    bias = f" + {k.var[g.bias]}[n]" if g.bias else ""
    if old:
        return f"{at} = {old} + {value}{bias};"
    return f"{at} {'+=' if g.accumulate else '='} {value}{bias};"
