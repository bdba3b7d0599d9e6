"""Four kernels that move a batch's rows into the padded tensor the cell runs over, or back, each in one
launch whose arguments carry the rows' lengths by value (a PackedSequence's batch sizes, or each row's
length), so that nothing about a batch's lengths goes through host memory the GPU must copy first.

A PackedSequence's data holds step t's rows one after another, `sizes[t]` of them (the rows still
running at t, longest first: sizes do not increase), from row `offsets[t]` (the sizes' running sum);
each row W elements. The padded tensor is [T', B, W] with B = sizes[0] and T' >= T:

- `cf_unpack_rows` writes the padded x (zero past each row's length) from the data, and the steps-left
  state of the cell that runs each row to its own length (graph_model.lengths): element (l, b, j) of an
  [n, B, H] float tensor is row b's length, the count of steps whose size exceeds b.
- `cf_pack_rows` writes the data from a padded y (the rows past their lengths are not read).

A padded x [T, B, W] whose rows have lengths of their own (CellRNN's `lengths=`, any order) may hold
anything past them, NaN included, which the cell would carry into its states (0 * NaN is NaN):

- `cf_zero_rows` copies x (any strides of its first two dimensions: a batch-first x as it is) zeroing
  each row's steps past its length, and writes the steps-left state as `cf_unpack_rows` does, the lengths
  in its arguments (`lengths_args_fields`).
- `cf_reverse_rows` reverses each row of x (the same arguments) in time over its own length: row b's step
  t is its step L_b - 1 - t where t < L_b, and stays in place after, as a bidirectional layer's reverse
  direction reads its input and gives back its output. (An exported program's launcher writes a kernel
  of the same name and work of its own, codegen.cuda_export: it reads the lengths from the steps-left
  state in device memory, as a program given no lengths on the host must.)

Built to replace, on a GPU, a PackedSequence's padding by torch's ops (positions worked out on the host,
copied to the GPU, and a zero fill, an index_copy and an expand of the lengths' state): their host time
came before the first kernel of the call and the GPU waited for it
(docs/results/2026-11-29-packed-rows.md); likewise the padding of a call with lengths (a mask made from
the steps-left state, a torch.where, the lengths copied to the GPU from pinned memory: 0.2 ms of a kept
call's host time, 0.4 from a synchronised device, where the GPU took 0.6 ms), and the reversal of rows of
lengths of their own (a gather by an index made on the host and copied from pinned memory: 0.15 ms of a
bidirectional call's host time before its directions' launches on an H200).
"""

from __future__ import annotations

from .kernel_abi import BITS_C, WARP, grid_blocks

UNPACK_ROWS = "cf_unpack_rows"
PACK_ROWS = "cf_pack_rows"
ZERO_ROWS = "cf_zero_rows"
REVERSE_ROWS = "cf_reverse_rows"
ARGS = "cf_rows_args"
LENGTHS_ARGS = "cf_lengths_args"
# the most steps (or rows' lengths) a launch's arguments hold (a power of two): sizes and offsets as ints,
# 16 KiB of the 32 KiB that a kernel's arguments may take (CUDA 12.1 and later, compute capability 7.0
# and later)
MAX_STEPS = 2048
MIN_CAPACITY = 64  # the fewest steps a kernel's arguments are made for


def capacity(steps: int) -> int:
    """The steps (or rows' lengths) of the kernels' arguments a sequence of `steps` steps (a batch of
    `steps` rows) uses: the next power of two, at least MIN_CAPACITY (so that a few sources serve every
    length); ValueError above MAX_STEPS."""
    if not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"the packed rows' kernels take 1 to {MAX_STEPS} steps, not {steps}")
    return max(MIN_CAPACITY, 1 << (steps - 1).bit_length())


def launch_blocks(rows: int) -> int:
    """The blocks of a launch of any of the kernels over `rows` rows (of x and the steps-left state, or of
    the data): a warp a row, BLOCK threads a block, up to kernel_abi's largest grid. (A block a row, as
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


def lengths_args_fields(rows_capacity: int) -> list[tuple[str, str, int]]:
    """cf_zero_rows's (and cf_reverse_rows's) arguments' fields, as args_fields: x's strides (in
    elements) of a step and of a row, then each row's length, `rows_capacity` ints (64 bytes before them:
    no padding at the end either)."""
    return [("src", "unsigned long long", 1), ("dst", "unsigned long long", 1),
            ("steps", "unsigned long long", 1), ("t_stride", "long long", 1), ("b_stride", "long long", 1),
            ("steps_elements", "long long", 1), ("T", "int", 1), ("B", "int", 1), ("W", "int", 1),
            ("H", "int", 1), ("lengths", "int", rows_capacity)]


def _c_fields(fields: list[tuple[str, str, int]]) -> str:
    """A C struct's fields, one a line."""
    return "\n".join(f"    {ctype} {name}{f'[{count}]' if count > 1 else ''};"
                     for name, ctype, count in fields)


def packed_rows_source(itemsize: int, steps_capacity: int) -> str:
    """The four kernels for elements of `itemsize` bytes and sequences of up to `steps_capacity` steps
    (batches of up to as many rows, for cf_zero_rows and cf_reverse_rows): a warp per row
    (`launch_blocks`), the grid's warps striding over the rows."""
    if itemsize not in BITS_C:
        raise ValueError(f"the packed rows' kernels move elements of 2 or 4 bytes, not {itemsize}")
    bits = BITS_C[itemsize]
    return f"""struct {ARGS} {{
{_c_fields(args_fields(steps_capacity))}
}};

struct {LENGTHS_ARGS} {{
{_c_fields(lengths_args_fields(steps_capacity))}
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

// a warp per row, striding: x's rows (t, b), zero past row b's length, then the steps-left state's rows
// (l, b)
extern "C" __global__ void {ZERO_ROWS}(const __grid_constant__ {LENGTHS_ARGS} a) {{
    CF_WARPS_OF_THE_GRID
    const int bytes = a.W * {itemsize};
    const long long rows = (long long)a.T * a.B, steps_rows = a.steps_elements ? a.steps_elements / a.H : 0;
    for (long long r = warp; r < rows + steps_rows; r += warps) {{
        if (r < rows) {{
            const int t = (int)(r / a.B), b = (int)(r - (long long)t * a.B);
            const char* s = t < a.lengths[b]
                ? (const char*)a.src + (t * a.t_stride + b * a.b_stride) * {itemsize} : nullptr;
            cf_copy_row(s, (char*)a.dst + r * bytes, bytes, lane);
        }} else {{
            const long long k = r - rows;
            const float v = (float)a.lengths[k % a.B];
            float* d = (float*)a.steps + k * a.H;
            for (int j = lane; j < a.H; j += 32) d[j] = v;
        }}
    }}
}}

// a warp per row (t, b) of the reversed x, striding: row b's step lengths[b] - 1 - t of x, or step t past
// its length
extern "C" __global__ void {REVERSE_ROWS}(const __grid_constant__ {LENGTHS_ARGS} a) {{
    CF_WARPS_OF_THE_GRID
    const int bytes = a.W * {itemsize};
    const long long rows = (long long)a.T * a.B;
    for (long long r = warp; r < rows; r += warps) {{
        const int t = (int)(r / a.B), b = (int)(r - (long long)t * a.B), length = a.lengths[b];
        const long long from = t < length ? length - 1 - t : t;
        cf_copy_row((const char*)a.src + (from * a.t_stride + b * a.b_stride) * {itemsize},
                    (char*)a.dst + r * bytes, bytes, lane);
    }}
}}
"""
