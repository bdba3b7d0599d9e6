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

UNPACK_ROWS = "cf_unpack_rows"
PACK_ROWS = "cf_pack_rows"
ARGS = "cf_rows_args"
# the most steps a launch's arguments hold (a power of two): sizes and offsets as ints, 16 KiB of the 32
# KiB that a kernel's arguments may take (CUDA 12.1 and later, compute capability 7.0 and later)
MAX_STEPS = 2048
MIN_CAPACITY = 64  # the fewest steps a kernel's arguments are made for

_BITS = {2: "unsigned short", 4: "unsigned int"}  # elements moved as their bits


def capacity(steps: int) -> int:
    """The steps of the kernels' arguments a sequence of `steps` steps uses: the next power of two, at
    least MIN_CAPACITY (so that a few sources serve every length); ValueError above MAX_STEPS."""
    if not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"the packed rows' kernels take 1 to {MAX_STEPS} steps, not {steps}")
    return max(MIN_CAPACITY, 1 << (steps - 1).bit_length())


def args_fields(steps_capacity: int) -> list[tuple[str, str, int]]:
    """The arguments' fields in their order in memory: (name, C type, count); the host writes the same
    layout (no padding: every field is aligned to its size)."""
    return [("src", "unsigned long long", 1), ("dst", "unsigned long long", 1),
            ("steps", "unsigned long long", 1), ("elements", "long long", 1),
            ("steps_elements", "long long", 1), ("T", "int", 1), ("B", "int", 1), ("W", "int", 1),
            ("H", "int", 1), ("sizes", "int", steps_capacity), ("offsets", "int", steps_capacity)]


def packed_rows_source(itemsize: int, steps_capacity: int) -> str:
    """Both kernels for elements of `itemsize` bytes and sequences of up to `steps_capacity` steps; a
    thread per element, the grid striding over all of them (kernel_abi.grid_blocks)."""
    if itemsize not in _BITS:
        raise ValueError(f"the packed rows' kernels move elements of 2 or 4 bytes, not {itemsize}")
    bits = _BITS[itemsize]
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

extern "C" __global__ void {UNPACK_ROWS}(const __grid_constant__ {ARGS} a) {{
    const {bits}* __restrict__ src = (const {bits}*)a.src;
    {bits}* __restrict__ dst = ({bits}*)a.dst;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long total = a.elements + a.steps_elements;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total; e += stride) {{
        if (e < a.elements) {{
            const long long r = e / a.W;
            const int w = (int)(e - r * a.W), b = (int)(r % a.B), t = (int)(r / a.B);
            {bits} v = 0;
            if (t < a.T && b < a.sizes[t]) v = src[((long long)a.offsets[t] + b) * a.W + w];
            dst[e] = v;
        }} else {{
            const long long k = e - a.elements;
            ((float*)a.steps)[k] = (float)cf_row_length(a, (int)((k / a.H) % a.B));
        }}
    }}
}}

extern "C" __global__ void {PACK_ROWS}(const __grid_constant__ {ARGS} a) {{
    const {bits}* __restrict__ src = (const {bits}*)a.src;
    {bits}* __restrict__ dst = ({bits}*)a.dst;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < a.elements; e += stride) {{
        const long long p = e / a.W;
        const int w = (int)(e - p * a.W);
        int lo = 0, hi = a.T - 1;  // the step whose rows hold row p of the data: the last offset not above it
        while (lo < hi) {{
            const int mid = (lo + hi + 1) >> 1;
            if (a.offsets[mid] <= p) lo = mid; else hi = mid - 1;
        }}
        dst[e] = src[((long long)lo * a.B + (p - a.offsets[lo])) * a.W + w];
    }}
}}
"""
