// Kernels the GEMMs of every module call around cuBLAS: the bias rows, the splits of three fp16 products.

#include "f16x3.cuh"

// Broadcasts a bias row into every row of a GEMM's output before the GEMM accumulates into it.
extern "C" __global__ void __launch_bounds__(256) cf_bias_rows(
    float* __restrict__ c, const float* __restrict__ bias, int rows, int n, int ldc)
{
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < (long long)rows * n;
         e += (long long)gridDim.x * blockDim.x) {
        const int r = (int)(e / n), j = (int)(e - (long long)r * n);
        c[(long long)r * ldc + j] = bias[j];
    }
}


// The GEMMs outside the time loop on tensor cores with float32's accuracy, each float32 product as
// three fp16 ones (f16x3.cuh): the largest magnitude of each row of A and each column of W
// (cf_f16x3_row_maxima, cf_f16x3_maxima), each operand scaled by its rows' or columns' powers of two
// and written as three copies of fp16 pieces along K (cf_split_f16x3_copies), one fp16 GEMM over 3K into
// float32 (cuBLAS), then a pass that undoes the scales and adds the bias (cf_f16x3_unscale_sums). On an H200
// the GEMM took half the time of 3xTF32's over 3K and was more accurate (the LSTM's input projection at
// B=64: 0.059 against 0.129 ms, 3.7e-6 against 6.2e-6 of the largest output from float64;
// benchmarks/results/h200_2026-11-30_f16x3_outside_gemm_probe.txt).
//
// A source [rows, cols] with row length ld is one operand, laid out as `layout` says:
//   CF_SIDE_BY_SIDE (0): K runs along the source's rows; the copies are [rows, 3 * cols]
//   CF_STACKED (1):      K runs down its columns; the copies are [3 * rows, cols]
//   CF_TRANSPOSED (2):   K runs down its columns; the copies are [cols, 3 * rows], K along each row, as
//                        cuBLAS reads an operand fastest (a weight gradient's x^T)
// so that its scales are its rows' where K runs along them (side by side) and its columns' otherwise.
//
// One scale serves a whole operand where its rows' (or columns') largest magnitudes lie within 2^20 of
// each other (their exponents within CF_ONE_SCALE_SPREAD): its pieces are then as accurate as with a
// scale each (docs/results/2026-12-02-c-one-scale-for-a-gemms-rows.md: up to 2^20 measured as accurate,
// 2^22 not). Where both operands have one, the GEMM undoes both by its alpha (read from device memory,
// written by A's split: the choice costs no wait for the host, and a captured graph reads it at every
// replay), and the pass has nothing left to do where there is no bias to add nor C to add onto: it
// returns at once. The choice is each operand's range: the largest of its maxima and the smallest of
// those that are not zero, folded on the GPU (CF_RANGE_WORDS words: the largest's bits, the complement
// of the smallest's, a count of the blocks of cf_f16x3_maxima done; zeroed before, as non-negative
// floats' bits order as their values do).
#define CF_SIDE_BY_SIDE 0
#define CF_STACKED 1
#define CF_TRANSPOSED 2
#define CF_MAX_ROWS 256  // the rows a block of cf_f16x3_maxima takes of 32 columns
#define CF_ONE_SCALE_SPREAD 19  // exponents 19 apart: a ratio below 2^20
#define CF_RANGE_WORDS 4

// A block's largest of two words per thread (blockDim.x a multiple of 32, at most 1024), in thread 0.
__forceinline__ __device__ void cf_block_max2(unsigned& a, unsigned& b) {
    __shared__ unsigned part[2][32];
    for (int d = 16; d > 0; d /= 2)
        a = max(a, __shfl_xor_sync(0xffffffffu, a, d)), b = max(b, __shfl_xor_sync(0xffffffffu, b, d));
    const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
    __syncthreads();
    if (threadIdx.x % 32 == 0) part[0][warp] = a, part[1][warp] = b;
    __syncthreads();
    if (threadIdx.x == 0)
        for (int i = 1; i < warps; ++i) a = max(a, part[0][i]), b = max(b, part[1][i]);
}

// A largest magnitude's share of its operand's range: its bits, and the complement of its bits where it is
// not zero (a row of zeros scales by anything).
__forceinline__ __device__ void cf_range_add(unsigned& hi, unsigned& lo, float m) {
    const unsigned bits = __float_as_uint(m);
    hi = max(hi, bits);
    if (bits) lo = max(lo, ~bits);
}

// The largest magnitude one scale is made from for every row (or column) of an operand of this range, or
// -1 where their exponents lie more than CF_ONE_SCALE_SPREAD apart (or one is not finite: its own
// scale, 1). A subnormal maximum counts as 2^-126, far below any ordinary largest.
__forceinline__ __device__ float cf_f16x3_one_max(const unsigned* __restrict__ range) {
    const unsigned hi = range[0], lo = ~range[1];
    if ((hi >> 23) >= 255) return -1.0f;
    if (range[1] == 0u) return __uint_as_float(hi);  // no value but zeros
    return (int)(hi >> 23) - (int)(lo >> 23) <= CF_ONE_SCALE_SPREAD ? __uint_as_float(hi) : -1.0f;
}

// The exponent e of the GEMM's alpha 2^-e, given each operand's cf_f16x3_one_max: both scales undone at
// once (their exponents' sum) where each operand has one and 2^-e is a normal float, else CF_NO_ALPHA
// (alpha 1: the pass undoes them).
#define CF_NO_ALPHA 1000
__forceinline__ __device__ int cf_f16x3_alpha_exponent(float one_a, float one_w) {
    if (one_a < 0.0f || one_w < 0.0f) return CF_NO_ALPHA;
    const int e = cf_f16x3_exponent(one_a) + cf_f16x3_exponent(one_w);
    return e < 127 && e > -127 ? e : CF_NO_ALPHA;
}

// The largest magnitude (NaN left out) of each row of a source whose K runs along its rows (side by
// side), into m[r], and their range into `range` (zeroed first): a warp a row. Launched with 256 threads a
// block, as many in all as `split_threads` counts for the layout.
extern "C" __global__ void __launch_bounds__(256) cf_f16x3_row_maxima(
    float* __restrict__ m, unsigned* __restrict__ range, const float* __restrict__ src, int rows, int cols,
    int ld)
{
    const bool whole = ((cols | ld) & 3) == 0 && (reinterpret_cast<size_t>(src) & 15) == 0;
    const int lane = threadIdx.x % 32, step = whole ? 128 : 32, first = whole ? 4 * lane : lane;
    const unsigned warps = gridDim.x * blockDim.x / 32;
    unsigned hi = 0, lo = 0;
    for (unsigned r = (blockIdx.x * blockDim.x + threadIdx.x) / 32; r < (unsigned)rows; r += warps) {
        const float* const s = src + (size_t)r * ld;
        float v = 0.0f;
        for (int j = first; j < cols; j += step)
            v = fmaxf(v, whole ? cf_abs_max(*reinterpret_cast<const float4*>(s + j)) : fabsf(s[j]));
        v = cf_warp_max(v);
        if (lane == 0) m[r] = v;
        cf_range_add(hi, lo, v);
    }
    cf_block_max2(hi, lo);
    if (threadIdx.x == 0) {
        if (hi) atomicMax(range, hi);
        if (lo) atomicMax(range + 1, lo);
    }
}

// The largest magnitude (NaN left out) of each column of a source whose K runs down its columns (stacked
// or transposed): blocks of 32 columns by CF_MAX_ROWS rows, each folding its columns' into m[c] by
// atomicMax on their bits (m and `range` zeroed first); the last block to finish folds every column's
// into `range`. Launched with 256 threads a block, as many in all as `maxima_threads` counts.
extern "C" __global__ void __launch_bounds__(256) cf_f16x3_maxima(
    float* __restrict__ m, unsigned* __restrict__ range, const float* __restrict__ src, int rows, int cols,
    int ld)
{
    __shared__ float part[8][32];
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    const unsigned across = (cols + 31) / 32, tiles = across * ((rows + CF_MAX_ROWS - 1) / CF_MAX_ROWS);
    for (unsigned t = blockIdx.x; t < tiles; t += gridDim.x) {
        const int c = 32 * (t % across) + tx, r0 = CF_MAX_ROWS * (t / across);
        const int r1 = min(rows, r0 + CF_MAX_ROWS);
        float v = 0.0f;
        if (c < cols)
            for (int r = r0 + ty; r < r1; r += 8) v = fmaxf(v, fabsf(src[(size_t)r * ld + c]));
        part[ty][tx] = v;
        __syncthreads();
        if (ty == 0 && c < cols) {
            for (int i = 1; i < 8; ++i) v = fmaxf(v, part[i][tx]);
            atomicMax(reinterpret_cast<unsigned*>(m) + c, __float_as_uint(v));
        }
        __syncthreads();
    }
    // (the threadFenceReduction pattern: this block's atomics seen by all before it counts itself done)
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(range + 2, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    unsigned hi = 0, lo = 0;
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        cf_range_add(hi, lo, __ldcg(m + c));
    cf_block_max2(hi, lo);
    if (threadIdx.x == 0) range[0] = hi, range[1] = lo;
}

// A value scaled by s as its three fp16 pieces: piece 0 hi, piece `lo_piece` lo (times 2^11, see
// f16x3.cuh), the other hi / 2^11; A's pieces (hi, hi / 2^11, lo) against W's (hi, lo, hi / 2^11) make
// hi*hi + hi*lo + lo*hi one GEMM over 3K, each product exact in float32.
__device__ __forceinline__ void cf_f16x3_pieces(float v, float s, int lo_piece, __half (&p)[3]) {
    const float x = v * s;
    const __half hi = __float2half_rn(x);
    const float back = __half2float(hi);
    const __half lo = __float2half_rn((x - back) * 2048.0f), small = __float2half_rn(back * (1.0f / 2048.0f));
    // (selected, not indexed by lo_piece: an index known only at run time puts p in local memory, which
    // made the split several times slower)
    p[0] = hi;
    p[1] = lo_piece == 1 ? lo : small;
    p[2] = lo_piece == 1 ? small : lo;
}

// Four values as their pieces (see cf_f16x3_pieces), piece q's four at p[q].
__device__ __forceinline__ void cf_f16x3_pieces4(const float (&x)[4], const float (&s)[4], int lo_piece,
                                                 __half (&p)[3][4]) {
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
        __half q[3];
        cf_f16x3_pieces(x[i], s[i], lo_piece, q);
        p[0][i] = q[0], p[1][i] = q[1], p[2][i] = q[2];
    }
}

// One operand's three copies (see above), scaled by its rows' largest magnitudes side by side and by its
// columns' otherwise, from `m` (cf_f16x3_row_maxima, cf_f16x3_maxima), or all by the largest of them where
// its range allows one scale (cf_f16x3_one_max). A's split (given W's range and where the GEMM's alpha
// and beta go, `scalars`; W's split null for both) writes them: alpha undoes both scales where both
// operands have one (cf_f16x3_alpha_exponent), else 1. Launched with 256 threads a block, as many in all as
// `split_threads` counts.
extern "C" __global__ void __launch_bounds__(256) cf_split_f16x3_copies(
    __half* __restrict__ out, const float* __restrict__ src, const float* __restrict__ m,
    const unsigned* __restrict__ range, const unsigned* __restrict__ w_range, float* __restrict__ scalars,
    int rows, int cols, int ld, int layout, int lo_piece)
{
    const float one = cf_f16x3_one_max(range);
    if (scalars && blockIdx.x == 0 && threadIdx.x == 0) {
        const int e = cf_f16x3_alpha_exponent(one, cf_f16x3_one_max(w_range));
        scalars[0] = e == CF_NO_ALPHA ? 1.0f : __int_as_float((127 - e) << 23), scalars[1] = 0.0f;
    }
    // Indices are 32-bit (a 64-bit division per element is dozens of instructions): a stacked source has
    // at most F16X3_MAX_K rows (gemm_routes), so that rows * cols < 2^32 wherever W fits in a GPU's
    // memory; the others count rows and tiles, not elements.
    if (layout == CF_SIDE_BY_SIDE) {
        const bool whole = ((cols | ld) & 3) == 0 && (reinterpret_cast<size_t>(src) & 15) == 0
                           && (reinterpret_cast<size_t>(out) & 7) == 0;
        const int lane = threadIdx.x % 32, step = whole ? 128 : 32, first = whole ? 4 * lane : lane;
        const unsigned warps = gridDim.x * blockDim.x / 32;
        for (unsigned r = (blockIdx.x * blockDim.x + threadIdx.x) / 32; r < (unsigned)rows; r += warps) {
            const float* const s = src + (size_t)r * ld;
            __half* const o = out + (size_t)r * 3 * cols;
            const float scale = cf_f16x3_scale(one >= 0.0f ? one : m[r]);
            const float sc[4] = {scale, scale, scale, scale};
            for (int j = first; j < cols; j += step) {
                if (whole) {
                    const float4 x4 = *reinterpret_cast<const float4*>(s + j);
                    const float x[4] = {x4.x, x4.y, x4.z, x4.w};
                    __align__(8) __half p[3][4];
                    cf_f16x3_pieces4(x, sc, lo_piece, p);
                    #pragma unroll
                    for (int q = 0; q < 3; ++q)
                        *reinterpret_cast<uint2*>(o + (size_t)q * cols + j)
                            = *reinterpret_cast<const uint2*>(p[q]);
                } else {
                    __half p[3];
                    cf_f16x3_pieces(s[j], scale, lo_piece, p);
                    #pragma unroll
                    for (int q = 0; q < 3; ++q) o[(size_t)q * cols + j] = p[q];
                }
            }
        }
        return;
    }
    if (layout == CF_TRANSPOSED) {
        // tiles of 32 x 32 through shared memory, so that both the loads (along a source row) and the
        // stores (along an output row) are coalesced
        __shared__ float tile[32][33];
        const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
        const unsigned across = (cols + 31) / 32, tiles = across * ((rows + 31) / 32);
        for (unsigned t = blockIdx.x; t < tiles; t += gridDim.x) {
            const int c0 = 32 * (t % across), k0 = 32 * (t / across);
            for (int i = ty; i < 32; i += 8) {
                const int k = k0 + i, c = c0 + tx;
                tile[i][tx] = k < rows && c < cols ? src[(size_t)k * ld + c] : 0.0f;
            }
            __syncthreads();
            for (int i = ty; i < 32; i += 8) {
                const int c = c0 + i, k = k0 + tx;
                if (c >= cols || k >= rows) continue;
                __half p[3];
                cf_f16x3_pieces(tile[tx][i], cf_f16x3_scale(one >= 0.0f ? one : m[c]), lo_piece, p);
                __half* const o = out + (size_t)c * 3 * rows + k;
                #pragma unroll
                for (int q = 0; q < 3; ++q) o[(size_t)q * rows] = p[q];
            }
            __syncthreads();
        }
        return;
    }
    // stacked: bound by memory, a thread takes 4 columns of a row at a time, in one 16-byte load and
    // three 8-byte stores where the row length and the pointers allow
    const unsigned groups = (cols + 3) / 4, total = (unsigned)rows * groups;
    const bool whole = ((cols | ld) & 3) == 0 && (reinterpret_cast<size_t>(src) & 15) == 0
                       && (reinterpret_cast<size_t>(out) & 7) == 0;
    const size_t piece = (size_t)rows * cols;  // copy to copy
    for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gridDim.x * blockDim.x) {
        const unsigned r = e / groups, j = 4 * (e - r * groups);
        const float* const s = src + (size_t)r * ld + j;
        __half* const o = out + (size_t)r * cols + j;
        float x[4] = {0.0f, 0.0f, 0.0f, 0.0f}, sc[4];
        if (whole) {
            const float4 v = *reinterpret_cast<const float4*>(s);
            x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
        } else {
            for (int i = 0; i < 4 && j + i < cols; ++i) x[i] = s[i];
        }
        #pragma unroll
        for (int i = 0; i < 4; ++i)
            sc[i] = cf_f16x3_scale(one >= 0.0f ? one : m[min((int)j + i, cols - 1)]);
        __align__(8) __half p[3][4];
        cf_f16x3_pieces4(x, sc, lo_piece, p);
        #pragma unroll
        for (int q = 0; q < 3; ++q) {
            __half* const to = o + q * piece;
            if (whole) {
                *reinterpret_cast<uint2*>(to) = *reinterpret_cast<const uint2*>(p[q]);
            } else {
                for (int i = 0; i < 4 && j + i < cols; ++i) to[i] = p[q][i];
            }
        }
    }
}

// C[rows, n] (row length ldc) = D's sums with A's scale (per row, from ma, or one for all, see
// cf_f16x3_one_max) and W's (per column, from mw, or one) undone, plus the bias where there is one (else
// null), plus C where the GEMM accumulates; D (row length ldd) is C itself where it does not. Where the
// GEMM's alpha undid the scales (cf_f16x3_alpha_exponent), only the bias and C are added, and with neither it
// returns at once. Both scales are undone at once, by their exponents' sum (ldexpf: one at a time, the
// first could leave float32's range that the result does not). Bound by memory: a thread takes 4 columns
// of a row, in 16-byte loads and stores where the row lengths and the pointers allow; its index 64-bit
// only where C has 2^32 groups of 4 or more (a 64-bit division per element is dozens of instructions).
// Launched with 256 threads a block, as many in all as `unscale_threads` counts.
extern "C" __global__ void __launch_bounds__(256) cf_f16x3_unscale_sums(
    float* c, const float* d, const float* __restrict__ ma, const unsigned* __restrict__ a_range,
    const float* __restrict__ mw, const unsigned* __restrict__ w_range, const float* __restrict__ bias,
    int rows, int n, int ldc, int ldd, int accumulate)
{
    const float one_a = cf_f16x3_one_max(a_range), one_w = cf_f16x3_one_max(w_range);
    const bool by_alpha = cf_f16x3_alpha_exponent(one_a, one_w) != CF_NO_ALPHA;
    if (by_alpha && !bias && !accumulate) return;
    // (scales undone here: each row's and column's exponent, or the operand's one; by the GEMM: none)
    const int ea1 = by_alpha || one_a < 0.0f ? 0 : cf_f16x3_exponent(one_a);
    const int ew1 = by_alpha || one_w < 0.0f ? 0 : cf_f16x3_exponent(one_w);
    const bool a_rows = !by_alpha && one_a < 0.0f, w_columns = !by_alpha && one_w < 0.0f;
    const unsigned groups = (n + 3) / 4;
    const unsigned long long total = (unsigned long long)rows * groups;
    const bool narrow = total <= 0xffffffffull;
    const bool whole = ((n | ldc | ldd) & 3) == 0
                       && ((reinterpret_cast<size_t>(c) | reinterpret_cast<size_t>(d)
                            | reinterpret_cast<size_t>(mw) | reinterpret_cast<size_t>(bias)) & 15) == 0;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long e = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += stride) {
        const unsigned r = narrow ? (unsigned)e / groups : (unsigned)(e / groups);
        const unsigned j = 4 * (unsigned)(e - (unsigned long long)r * groups);
        const int ea = a_rows ? cf_f16x3_exponent(ma[r]) : ea1;
        const float* const from = d + (size_t)r * ldd + j;
        float* const to = c + (size_t)r * ldc + j;
        float v[4], w[4], b[4] = {0.0f, 0.0f, 0.0f, 0.0f}, old[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const int count = min(4, n - (int)j);
        if (whole) {
            *reinterpret_cast<float4*>(v) = *reinterpret_cast<const float4*>(from);
            *reinterpret_cast<float4*>(w) = *reinterpret_cast<const float4*>(mw + j);
            if (bias) *reinterpret_cast<float4*>(b) = *reinterpret_cast<const float4*>(bias + j);
            if (accumulate) *reinterpret_cast<float4*>(old) = *reinterpret_cast<const float4*>(to);
        } else {
            for (int i = 0; i < count; ++i) {
                v[i] = from[i], w[i] = mw[j + i];
                if (bias) b[i] = bias[j + i];
                if (accumulate) old[i] = to[i];
            }
        }
        #pragma unroll
        for (int i = 0; i < 4; ++i)
            v[i] = old[i] + (ldexpf(v[i], -(ea + (w_columns ? cf_f16x3_exponent(w[i]) : ew1))) + b[i]);
        if (whole) {
            *reinterpret_cast<float4*>(to) = *reinterpret_cast<const float4*>(v);
        } else {
            for (int i = 0; i < count; ++i) to[i] = v[i];
        }
    }
}
