// Kernels the GEMMs of every module call around cuBLAS: the bias rows, the 3xTF32 splits.

#include "tf32.cuh"

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


// One operand of a GEMM on tensor cores with float32's accuracy (3xTF32): each x is hi + lo, hi its
// rounding to TF32 and lo that of x - hi (exact in float32), so that hi*hi' + hi*lo' + lo*hi' misses the
// product x*x' by about 2^-21 of it, and each of the three TF32 products is exact in float32. The source,
// [rows, cols] with row length ld, is written three times, piece p lo where p == lo_piece and hi
// elsewhere, one copy after the other along the GEMM's K axis, as `layout` says:
//   CF_SIDE_BY_SIDE (0): K runs along the source's rows; out is [rows, 3 * cols]
//   CF_STACKED (1):      K runs down its columns; out is [3 * rows, cols]
//   CF_TRANSPOSED (2):   K runs down its columns; out is [cols, 3 * rows], K along each row, as cuBLAS's
//                        TF32 GEMMs read an operand fastest (read transposed instead, a weight gradient's
//                        x^T took longer on an H100:
//                        benchmarks/results/h100_2026-11-26_tf32x3_cublas_layouts.json)
// A's pieces (hi, hi, lo) against W's (hi, lo, hi) make the three products one GEMM over 3K. Launched
// with 256 threads a block, as many in all as `split_threads` counts.
#define CF_SIDE_BY_SIDE 0
#define CF_STACKED 1
#define CF_TRANSPOSED 2
extern "C" __global__ void __launch_bounds__(256) cf_split_tf32x3(
    float* __restrict__ out, const float* __restrict__ src, int rows, int cols, int ld, int layout,
    int lo_piece)
{
    // Indices are 32-bit (a 64-bit division per element is dozens of instructions): rows * cols < 2^32
    // wherever the three copies, 12 bytes an element, fit in a GPU's memory.
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
                float hi, lo;
                cf_tf32_pieces(tile[tx][i], hi, lo);
                float* const o = out + (size_t)c * 3 * rows + k;
                #pragma unroll
                for (int p = 0; p < 3; ++p) o[(size_t)p * rows] = p == lo_piece ? lo : hi;
            }
            __syncthreads();
        }
        return;
    }
    // A split is bound by memory: a thread takes 4 columns of a row at a time, in one 16-byte load and
    // three 16-byte stores where the row length and the pointers allow.
    const unsigned groups = (cols + 3) / 4, total = (unsigned)rows * groups;
    const bool whole = ((cols | ld) & 3) == 0
                       && ((reinterpret_cast<size_t>(src) | reinterpret_cast<size_t>(out)) & 15) == 0;
    const size_t piece = layout == CF_STACKED ? (size_t)rows * cols : (size_t)cols;  // copy to copy
    const size_t out_row = layout == CF_STACKED ? (size_t)cols : 3 * (size_t)cols;
    for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gridDim.x * blockDim.x) {
        const unsigned r = e / groups, j = 4 * (e - r * groups);
        const float* const s = src + (size_t)r * ld + j;
        float* const o = out + (size_t)r * out_row + j;
        float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (whole) {
            x = *reinterpret_cast<const float4*>(s);
        } else {
            x.x = s[0];
            if (j + 1 < cols) x.y = s[1];
            if (j + 2 < cols) x.z = s[2];
            if (j + 3 < cols) x.w = s[3];
        }
        float4 hi, lo;
        cf_tf32_pieces(x.x, hi.x, lo.x);
        cf_tf32_pieces(x.y, hi.y, lo.y);
        cf_tf32_pieces(x.z, hi.z, lo.z);
        cf_tf32_pieces(x.w, hi.w, lo.w);
        #pragma unroll
        for (int p = 0; p < 3; ++p) {
            const float4 v = p == lo_piece ? lo : hi;
            float* const to = o + p * piece;
            if (whole) {
                *reinterpret_cast<float4*>(to) = v;
            } else {
                to[0] = v.x;
                if (j + 1 < cols) to[1] = v.y;
                if (j + 2 < cols) to[2] = v.z;
                if (j + 3 < cols) to[3] = v.w;
            }
        }
    }
}
