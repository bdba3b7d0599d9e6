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
// (cf_f16x3_maxima, or the split itself), each operand scaled by its rows' or columns' powers of two
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
#define CF_SIDE_BY_SIDE 0
#define CF_STACKED 1
#define CF_TRANSPOSED 2
#define CF_MAX_ROWS 256  // the rows a block of cf_f16x3_maxima takes of 32 columns

// The largest magnitude (NaN left out) of each column of a source whose K runs down its columns (stacked
// or transposed; side by side, the split finds its rows' itself): blocks of 32 columns by CF_MAX_ROWS
// rows, each folding its columns' into m[c] by atomicMax on their bits, which order non-negative floats
// as their values do (m zeroed first). Launched with 256 threads a block, as many in all as
// `maxima_threads` counts.
extern "C" __global__ void __launch_bounds__(256) cf_f16x3_maxima(
    float* __restrict__ m, const float* __restrict__ src, int rows, int cols, int ld)
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
}

// A value scaled by s as its three fp16 pieces: piece 0 hi, piece `lo_piece` lo (times 2^11, see
// f16x3.cuh), the other hi / 2^11; A's pieces (hi, hi / 2^11, lo) against W's (hi, lo, hi / 2^11) make
// hi*hi + hi*lo + lo*hi one GEMM over 3K, each product exact in float32.
__device__ __forceinline__ void cf_f16x3_pieces(float v, float s, int lo_piece, __half (&p)[3]) {
    const float x = v * s;
    const __half hi = __float2half_rn(x);
    const float back = __half2float(hi);
    p[0] = hi;
    p[lo_piece] = __float2half_rn((x - back) * 2048.0f);
    p[3 - lo_piece] = __float2half_rn(back * (1.0f / 2048.0f));
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

// One operand's three copies (see above), scaled by its rows' largest magnitudes, which side by side it
// finds itself (one warp a row, reading the row twice: the second time from the cache) and writes to `m`,
// and otherwise by its columns' from `m` (cf_f16x3_maxima). Launched with 256 threads a block, as many in
// all as `split_threads` counts.
extern "C" __global__ void __launch_bounds__(256) cf_split_f16x3_copies(
    __half* __restrict__ out, const float* __restrict__ src, float* __restrict__ m, int rows, int cols,
    int ld, int layout, int lo_piece)
{
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
            float v = 0.0f;
            for (int j = first; j < cols; j += step)
                v = fmaxf(v, whole ? cf_abs_max(*reinterpret_cast<const float4*>(s + j)) : fabsf(s[j]));
            v = cf_warp_max(v);
            if (lane == 0) m[r] = v;
            const float scale = cf_f16x3_scale(v);
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
                cf_f16x3_pieces(tile[tx][i], cf_f16x3_scale(m[c]), lo_piece, p);
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
        for (int i = 0; i < 4; ++i) sc[i] = cf_f16x3_scale(m[min((int)j + i, cols - 1)]);
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

// C[rows, n] (row length ldc) = D's sums with A's scale (per row, from ma) and W's (per column, from mw)
// undone, plus the bias where there is one (else null), plus C where the GEMM accumulates; D (row length
// ldd) is C itself where it does not. Both scales are undone at once, by their exponents' sum (ldexpf:
// one at a time, the first could leave float32's range that the result does not). Bound by memory: a
// thread takes 4 columns of a row, in 16-byte loads and stores where the row lengths and the pointers
// allow; its index 64-bit only where C has 2^32 groups of 4 or more (a 64-bit division per element is
// dozens of instructions). Launched with 256 threads a block, as many in all as `unscale_threads` counts.
extern "C" __global__ void __launch_bounds__(256) cf_f16x3_unscale_sums(
    float* c, const float* d, const float* __restrict__ ma, const float* __restrict__ mw,
    const float* __restrict__ bias, int rows, int n, int ldc, int ldd, int accumulate)
{
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
        const int ea = cf_f16x3_exponent(ma[r]);
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
        for (int i = 0; i < 4; ++i) v[i] = old[i] + (ldexpf(v[i], -(ea + cf_f16x3_exponent(w[i]))) + b[i]);
        if (whole) {
            *reinterpret_cast<float4*>(to) = *reinterpret_cast<const float4*>(v);
        } else {
            for (int i = 0; i < count; ++i) to[i] = v[i];
        }
    }
}
