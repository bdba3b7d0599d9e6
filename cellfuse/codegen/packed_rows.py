"""Two kernels that move a PackedSequence's rows between its packed data and a padded tensor, each in one
launch whose arguments carry the batch sizes by value, so that nothing about a batch's lengths goes
through host memory the GPU must copy first.

A PackedSequence's data holds step t's rows one after another, `sizes[t]` of them (the rows still
running at t, longest first: sizes do not increase), from row `offsets[t]` (the sizes' running sum);
each row W elements. The padded tensor is [T', B, W] with B = sizes[0] and T' >= T:

- `cf_unpack_rows` writes the padded x (zero past each row's length) from the data, and the steps-left
  state of the cell that runs each row to its own length (graph_model.lengths): element (l, b, j) of an
  [n, B, H] float tensor is row b's length, the count of steps whose size exceeds b.
- `cf_pack_rows` writes the data from a padded y (the rows past their lengths are not read).

Built to replace, on a GPU, a PackedSequence's padding by torch's ops (positions worked out on the host,
copied to the GPU, and a zero fill, an index_copy and an expand of the lengths' state): their host time
came before the first kernel of the call and the GPU waited for it
(docs/results/2026-11-29-packed-rows.md).
"""

from __future__ import annotations

from .kernel_abi import BITS_C, WARP, grid_blocks

UNPACK_ROWS = "cf_unpack_rows"
PACK_ROWS = "cf_pack_rows"
ARGS = "cf_rows_args"
# the most steps a launch's arguments hold (a power of two): sizes and offsets as ints, 16 KiB of the 32
# KiB that a kernel's arguments may take (CUDA 12.1 and later, compute capability 7.0 and later)
MAX_STEPS = 2048
MIN_CAPACITY = 64  # the fewest steps a kernel's arguments are made for


def capacity(steps: int) -> int:
    """The steps of the kernels' arguments a sequence of `steps` steps uses: the next power of two, at
    least MIN_CAPACITY (so that a few sources serve every length); ValueError above MAX_STEPS."""
    if not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"the packed rows' kernels take 1 to {MAX_STEPS} steps, not {steps}")
    return max(MIN_CAPACITY, 1 << (steps - 1).bit_length())


def launch_blocks(rows: int) -> int:
    """The blocks of a launch of either kernel over `rows` rows (of x and the steps-left state, or of the
    data): a warp a row, BLOCK threads a block, up to kernel_abi's largest grid. (A block a row, as
    before, moved the LSTM's rows at B=64, H=512 at under half of an H200's bandwidth: a row of 2 KiB is
    less work than a block's start.)"""
    return grid_blocks(rows * WARP)


def args_fields(steps_capacity: int) -> list[tuple[str, str, int]]:
    """The arguments' fields in their order in memory: (name, C type, count); the host writes the same
    layout (no padding: every field is aligned to its size)."""
    return [("src", "unsigned long long", 1), ("dst", "unsigned long long", 1),
            ("steps", "unsigned long long", 1), ("elements", "long long", 1),
            ("steps_elements", "long long", 1), ("T", "int", 1), ("B", "int", 1), ("W", "int", 1),
            ("H", "int", 1), ("sizes", "int", steps_capacity), ("offsets", "int", steps_capacity)]


def packed_rows_source(itemsize: int, steps_capacity: int) -> str:
    """Both kernels for elements of `itemsize` bytes and sequences of up to `steps_capacity` steps: a warp
    per row (`launch_blocks`), the grid's warps striding over the rows."""
    if itemsize not in BITS_C:
        raise ValueError(f"the packed rows' kernels move elements of 2 or 4 bytes, not {itemsize}")
    bits = BITS_C[itemsize]
    fields = "\n".join(f"    {ctype} {name}{f'[{count}]' if count > 1 else ''};"
                       for name, ctype, count in args_fields(steps_capacity))
    return f"""struct {ARGS} {{
{fields}
}};

// the count of steps whose size exceeds row b: row b's length (sizes do not increase)
__device__ __forceinline__ int cf_row_length(const {ARGS}& a, int b) {{
    int lo = 0, hi = a.T;
    while (lo < hi) {{
        const int mid = (lo + hi) >> 1;
        if (a.sizes[mid] > b) lo = mid + 1; else hi = mid;
    }}
    return lo;
}}

// a row of `bytes` bytes from s to d (zeros where s is null) by a warp's threads (`lane` each), as
// 16-byte words where the row's length and both places allow
__device__ __forceinline__ void cf_copy_row(const char* s, char* d, int bytes, int lane) {{
    if ((((unsigned long long)s | (unsigned long long)d | (unsigned long long)bytes) & 15) == 0) {{
        for (int i = lane * 16; i < bytes; i += 32 * 16)
            *(uint4*)(d + i) = s ? *(const uint4*)(s + i) : make_uint4(0, 0, 0, 0);
    }} else {{
        for (int i = lane * {itemsize}; i < bytes; i += 32 * {itemsize})
            *({bits}*)(d + i) = s ? *(const {bits}*)(s + i) : ({bits})0;
    }}
}}

// the calling thread's warp of the grid, the grid's warps and its lane
#define CF_WARPS_OF_THE_GRID \
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32; \
    const long long warps = (long long)gridDim.x * blockDim.x / 32; \
    const int lane = threadIdx.x % 32;

// a warp per row, striding: x's rows (t, b), then the steps-left state's rows (l, b)
extern "C" __global__ void {UNPACK_ROWS}(const __grid_constant__ {ARGS} a) {{
    CF_WARPS_OF_THE_GRID
    const int bytes = a.W * {itemsize};
    const long long rows = a.elements / a.W, steps_rows = a.steps_elements ? a.steps_elements / a.H : 0;
    for (long long r = warp; r < rows + steps_rows; r += warps) {{
        if (r < rows) {{
            const int t = (int)(r / a.B), b = (int)(r - (long long)t * a.B);
            const char* s = t < a.T && b < a.sizes[t]
                ? (const char*)a.src + ((long long)a.offsets[t] + b) * bytes : nullptr;
            cf_copy_row(s, (char*)a.dst + r * bytes, bytes, lane);
        }} else {{
            const long long k = r - rows;
            const float v = (float)cf_row_length(a, (int)(k % a.B));
            float* d = (float*)a.steps + k * a.H;
            for (int j = lane; j < a.H; j += 32) d[j] = v;
        }}
    }}
}}

// a warp per row of the data, striding
extern "C" __global__ void {PACK_ROWS}(const __grid_constant__ {ARGS} a) {{
    CF_WARPS_OF_THE_GRID
    const int bytes = a.W * {itemsize};
    const long long rows = a.elements / a.W;
    for (long long p = warp; p < rows; p += warps) {{
        int lo = 0, hi = a.T - 1;  // the step whose rows hold row p: the last offset not above it
        while (lo < hi) {{
            const int mid = (lo + hi + 1) >> 1;
            if (a.offsets[mid] <= p) lo = mid; else hi = mid - 1;
        }}
        cf_copy_row((const char*)a.src + ((long long)lo * a.B + (p - a.offsets[lo])) * bytes,
                    (char*)a.dst + p * bytes, bytes, lane);
    }}
}}
"""
