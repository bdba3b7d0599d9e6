// Whether the tensor rung's per-step GEMM pays on the warpgroup instructions (wgmma, sm_90a) instead of
// mma.sync. The LSTM at B=64, H=512 in float32 (3xTF32): the persistent kernel's 128 blocks are 32 column
// blocks x 4 row groups; each block multiplies its row group's 16 rows of h (16 x 512) by its 64 gate
// columns of U (512 x 64, in shared memory) every step, about 2.25 us of the kernel's 5.6 us a step on an
// H200 (benchmarks/step_profile.py). Here only that part runs: every step each block stages its 16 rows
// of h from global memory (a new h each step), multiplies them and writes its 16 x 64 results, the steps
// separated by block barriers (no exchange between blocks, no cell):
//   mma       as the generated kernel does it: 8 warps, each a 16 x 32 tile over a quarter of K, every
//             product as three mma.sync.m16n8k8 TF32 ones, the warps' partial tiles added in shared
//             memory; U's slice float32 in shared memory, split into TF32 pieces at every product
//   mma16     the same with 16 warps (512 threads), 8 over each tile's K
//   mma_tma   mma with h's rows staged by the tensor memory accelerator (one bulk copy a row)
//   mma_direct mma.sync with each warp all 64 columns over its eighth of K, loading its own fragments of
//             h from global memory into registers: no stage in shared memory, no block barrier between
//             the loads and the products
//   mma_f16x3 mma with each product as three fp16 mma.sync.m16n8k16 ones (fp16 multiplies at twice
//             TF32's rate): values split into an fp16 hi piece and an fp16 lo piece scaled by 2^11, the
//             small products summed apart and scaled back; float32's accuracy only while every value
//             and its pieces stay in fp16's range (|v| < 65504; below 2^-14 hi loses bits): the
//             small and the large scale of the check say how far
//   wgmma2    the product transposed (C^T = U^T h^T: M = the block's 64 columns, N = its 16 rows), as
//             wgmma.m64n16k8: 2 warpgroups, each over half of K; U's TF32 hi piece in shared memory (the A
//             descriptor's), its lo piece in registers (A from registers), h's hi and lo pieces staged
//             into shared memory; three wgmmas per 8 of K
//   wgmma2n32 the same with h's hi and lo pieces one B operand of 32 rows: two wgmmas per 8 of K, one
//             m64n32k8 (U's hi piece by both of h's, A read once) and one m64n16k8 (U's lo by h's hi)
//   wgmma2n32r the same, h loaded a row at a time (as the generated kernel's polls take it)
//   wgmma4    wgmma2 with 4 warpgroups (512 threads), each over a quarter of K
//   wgmma4n32 wgmma2n32 with 4 warpgroups
// Each variant's results are checked against a float64 product on the host at three scales of U and h
// (an LSTM's, small, large), then timed at the first: with the products, without them (the staging and
// the stores alone) and with no steps (what a launch does before its loop), so that the products' own
// time and the rest of a step show. Values are split into TF32 pieces as the generated kernels split
// them (two instructions, persistent.cuh's cf_split_tf32).
//
//     nvcc -O3 -gencode arch=compute_90a,code=sm_90a benchmarks/probes/step_gemm_wgmma_probe.cu \
//         -o /tmp/step_gemm_wgmma_probe && /tmp/step_gemm_wgmma_probe
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "probe_check.cuh"  // CHECK, median_event_ms

constexpr int T = 100, B = 64, K = 512, N = 2048;  // steps, rows of h, K, gate columns
constexpr int COLS = 64, ROWS = 16;                // a block's
constexpr int COL_BLOCKS = N / COLS, ROW_GROUPS = B / ROWS;
constexpr int STRIDE = K + 16;                     // the generated kernel's row length in shared memory

// as the generated kernels split a float32 value (persistent.cuh's cf_split_tf32): hi its 13 low bits
// cleared, lo = v - hi, whose low bits the tensor cores leave out as they do hi's (two instructions)
__device__ __forceinline__ void split(float v, unsigned& hi, unsigned& lo) {
    hi = __float_as_uint(v) & 0xffffe000u;
    lo = __float_as_uint(v - __uint_as_float(hi));
}

__device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// a float32 value pair as fp16 pieces: hi (rounded), lo = (v - hi) * 2^11 (rounded), so that lo keeps
// the 11 bits after hi's at fp16's exponents; each pair packed into one register (the first value low)
__device__ __forceinline__ void split16(float v0, float v1, unsigned& hi, unsigned& lo) {
    const __half2 h = __floats2half2_rn(v0, v1);
    const __half2 l = __floats2half2_rn((v0 - __low2float(h)) * 2048.0f, (v1 - __high2float(h)) * 2048.0f);
    hi = *reinterpret_cast<const unsigned*>(&h);
    lo = *reinterpret_cast<const unsigned*>(&l);
}

__device__ __forceinline__ void mma16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- mma.sync, as generated ----

template <int W>
constexpr int mma_smem() { return (ROWS * STRIDE + COLS * STRIDE + W * 512) * 4 + 8; }

__device__ __forceinline__ void wait_parity(unsigned barrier, unsigned parity) {
    unsigned done = 0;
    while (!done)
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(barrier), "r"(parity) : "memory");
}

// warps: two tiles of 16 x 32, W / 2 warps over each one's K; TMA: h's rows staged by the tensor memory
// accelerator (a bulk copy of each row, issued by one thread, an mbarrier saying when all have come);
// F16: each product as three fp16 ones (hi * hi, and hi * lo + lo * hi, lo scaled by 2^11, summed
// apart and scaled back at the end), U's pieces made once into shared memory (two fp16 arrays where the
// float32 one was), h's split at every product
template <int W, bool TMA = false, bool F16 = false>
__global__ void __launch_bounds__(32 * W, 1) step_mma(const float* __restrict__ u, const float* __restrict__ h,
                                                   float* __restrict__ out, int products, int steps) {
    extern __shared__ __align__(128) float smem[];
    float* const stage = smem;                   // [16][STRIDE]
    float* const w0 = stage + ROWS * STRIDE;     // [64][STRIDE]: the block's columns of U, transposed
    float* const part = w0 + COLS * STRIDE;      // [8 warps][16 x 32]
    const int tid = threadIdx.x, lane = tid & 31, cb = blockIdx.x % COL_BLOCKS, rg = blockIdx.x / COL_BLOCKS;
    constexpr int THREADS = 32 * W, SPLIT = W / 2;
    __half* const whi = reinterpret_cast<__half*>(w0);  // (F16) [64][STRIDE] each
    __half* const wlo = whi + COLS * STRIDE;
    for (int e = tid; e < K * COLS; e += THREADS) {
        const int k = e / COLS, c = e % COLS;
        const float v = u[(size_t)k * N + cb * COLS + c];
        if (F16) {
            whi[c * STRIDE + k] = __float2half_rn(v);
            wlo[c * STRIDE + k] = __float2half_rn((v - __half2float(whi[c * STRIDE + k])) * 2048.0f);
        } else {
            w0[c * STRIDE + k] = v;
        }
    }
    const unsigned arrived = (unsigned)__cvta_generic_to_shared(part + W * 512);
    if (TMA && tid == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(arrived) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    for (int t = 0; t < steps; ++t) {
        __syncthreads();
        if (TMA) {
            if (tid == 0) {
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the stage's last reads
                asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                             ::"r"(arrived), "n"(ROWS * K * 4) : "memory");
                for (int r = 0; r < ROWS; ++r)
                    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
                                 "[%0], [%1], %2, [%3];\n"
                                 ::"r"((unsigned)__cvta_generic_to_shared(stage + r * STRIDE)),
                                 "l"(h + ((size_t)t * B + rg * ROWS + r) * K), "n"(K * 4), "r"(arrived)
                                 : "memory");
            }
            wait_parity(arrived, t & 1);
        } else {  // all of a thread's loads in flight at once, as the generated kernel's polls of h are
            constexpr int PER = ROWS * K / 4 / THREADS;
            float4 v[PER];
            #pragma unroll
            for (int i = 0; i < PER; ++i) {
                const int e = tid + i * THREADS, r = e / (K / 4), k4 = e % (K / 4);
                v[i] = *(const float4*)(h + ((size_t)t * B + rg * ROWS + r) * K + 4 * k4);
            }
            #pragma unroll
            for (int i = 0; i < PER; ++i) {
                const int e = tid + i * THREADS, r = e / (K / 4), k4 = e % (K / 4);
                *(float4*)(stage + r * STRIDE + 4 * k4) = v[i];
            }
        }
        __syncthreads();
        {
            const int o = tid / 32, tile = o / SPLIT, ks = o % SPLIT;
            const float* const at = stage + (lane >> 2) * STRIDE + 4 * (lane & 3);
            const float* const wt = w0 + (tile * 32 + (lane >> 2)) * STRIDE + 4 * (lane & 3);
            float acc[4][4] = {}, small[4][4] = {};
            if (products > 0 && F16) {
                // the k of a product in the generated 16-bit kernels' order: lane q's float4 of a row holds
                // k 4q .. 4q + 3, the first pair in slots 2q, 2q + 1, the second in 2q + 8, 2q + 9 (A and
                // U alike, so the sum over K is the same)
                const int kw = (tile * 32 + (lane >> 2)) * STRIDE + 4 * (lane & 3);
                #pragma unroll
                for (int k = ks * 16; k < K; k += 16 * SPLIT) {
                    const float4 a4[2] = {*(const float4*)(at + k), *(const float4*)(at + 8 * STRIDE + k)};
                    unsigned ah[4], al[4];
                    split16(a4[0].x, a4[0].y, ah[0], al[0]);
                    split16(a4[1].x, a4[1].y, ah[1], al[1]);
                    split16(a4[0].z, a4[0].w, ah[2], al[2]);
                    split16(a4[1].z, a4[1].w, ah[3], al[3]);
                    #pragma unroll
                    for (int x = 0; x < 4; ++x) {
                        const uint2 bh = *(const uint2*)(whi + kw + x * 8 * STRIDE + k);
                        const uint2 bl = *(const uint2*)(wlo + kw + x * 8 * STRIDE + k);
                        mma16(small[x], ah, bl.x, bl.y);
                        mma16(small[x], al, bh.x, bh.y);
                        mma16(acc[x], ah, bh.x, bh.y);
                    }
                }
                #pragma unroll
                for (int x = 0; x < 4; ++x)
                    #pragma unroll
                    for (int i = 0; i < 4; ++i) acc[x][i] += small[x][i] * (1.0f / 2048.0f);
            } else if (products > 0) {
                #pragma unroll
                for (int k = ks * 16; k < K; k += 16 * SPLIT) {
                    const float4 a4[2] = {*(const float4*)(at + k), *(const float4*)(at + 8 * STRIDE + k)};
                    unsigned ah[2][4], al[2][4];
                    #pragma unroll
                    for (int y = 0; y < 2; ++y) {
                        split(a4[y].x, ah[0][y], al[0][y]);
                        split(a4[y].y, ah[0][y + 2], al[0][y + 2]);
                        split(a4[y].z, ah[1][y], al[1][y]);
                        split(a4[y].w, ah[1][y + 2], al[1][y + 2]);
                    }
                    #pragma unroll
                    for (int x = 0; x < 4; ++x) {
                        const float4 w4 = *(const float4*)(wt + x * 8 * STRIDE + k);
                        unsigned wh[4], wl[4];
                        split(w4.x, wh[0], wl[0]);
                        split(w4.y, wh[1], wl[1]);
                        split(w4.z, wh[2], wl[2]);
                        split(w4.w, wh[3], wl[3]);
                        #pragma unroll
                        for (int p = 0; p < 2; ++p) {
                            mma(acc[x], al[p], wh[2 * p], wh[2 * p + 1]);
                            mma(acc[x], ah[p], wl[2 * p], wl[2 * p + 1]);
                            mma(acc[x], ah[p], wh[2 * p], wh[2 * p + 1]);
                        }
                    }
                }
            }
            #pragma unroll
            for (int m = 0; m < 16; ++m) part[o * 512 + m * 32 + lane] = acc[m / 4][m % 4];
        }
        __syncthreads();
        #pragma unroll
        for (int q = 0; q < 1024 / THREADS; ++q) {
            const int e = tid + q * THREADS, tile = e / 512, y = e % 512 / 32, x = e % 32;
            const int at = (4 * (x / 8) + 2 * (y / 8) + x % 2) * 32 + 4 * (y % 8) + x % 8 / 2;
            float v = 0.0f;
            #pragma unroll
            for (int s = 0; s < SPLIT; ++s) v += part[(tile * SPLIT + s) * 512 + at];
            out[((size_t)t * B + rg * ROWS + y) * N + cb * COLS + tile * 32 + x] = v;
        }
    }
}

// ---- mma.sync, each warp loading its own fragments of h ----

constexpr int DIRECT_SMEM = (COLS * STRIDE + 8 * ROWS * COLS) * 4;

// 8 warps, each all 64 columns (eight products side by side) over its eighth of K (64 k): each lane
// loads its fragments of h's rows (g and g + 8) straight from global memory into registers, all at once,
// so that no block barrier stands between the loads and the products (as a warp polling its own part of
// the exchange would start as soon as its part came); the warps' partial tiles added in shared memory
__global__ void __launch_bounds__(256, 1) step_direct(const float* __restrict__ u, const float* __restrict__ h,
                                                     float* __restrict__ out, int products, int steps) {
    extern __shared__ __align__(128) float smem[];
    float* const w0 = smem;                      // [64][STRIDE]: the block's columns of U, transposed
    float* const part = w0 + COLS * STRIDE;      // [8 warps][16 x 64], in mma.sync's order
    const int tid = threadIdx.x, lane = tid & 31, ks = tid / 32;
    const int cb = blockIdx.x % COL_BLOCKS, rg = blockIdx.x / COL_BLOCKS;
    for (int e = tid; e < K * COLS; e += 256) {
        const int k = e / COLS, c = e % COLS;
        w0[c * STRIDE + k] = u[(size_t)k * N + cb * COLS + c];
    }
    const float* const wt = w0 + (lane >> 2) * STRIDE + 4 * (lane & 3);
    for (int t = 0; t < steps; ++t) {
        __syncthreads();  // the partial tiles are free again (and, at t = 0, U is in)
        const float* const at = h + ((size_t)t * B + rg * ROWS + (lane >> 2)) * K + 4 * (lane & 3);
        float4 a4[4][2];
        #pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int k = ks * 64 + i * 16;
            a4[i][0] = *(const float4*)(at + k);
            a4[i][1] = *(const float4*)(at + 8 * K + k);
        }
        float acc[8][4] = {};
        if (products > 0) {
            #pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int k = ks * 64 + i * 16;
                unsigned ah[2][4], al[2][4];
                #pragma unroll
                for (int y = 0; y < 2; ++y) {
                    split(a4[i][y].x, ah[0][y], al[0][y]);
                    split(a4[i][y].y, ah[0][y + 2], al[0][y + 2]);
                    split(a4[i][y].z, ah[1][y], al[1][y]);
                    split(a4[i][y].w, ah[1][y + 2], al[1][y + 2]);
                }
                #pragma unroll
                for (int x = 0; x < 8; ++x) {
                    const float4 w4 = *(const float4*)(wt + x * 8 * STRIDE + k);
                    unsigned wh[4], wl[4];
                    split(w4.x, wh[0], wl[0]);
                    split(w4.y, wh[1], wl[1]);
                    split(w4.z, wh[2], wl[2]);
                    split(w4.w, wh[3], wl[3]);
                    #pragma unroll
                    for (int p = 0; p < 2; ++p) {
                        mma(acc[x], al[p], wh[2 * p], wh[2 * p + 1]);
                        mma(acc[x], ah[p], wl[2 * p], wl[2 * p + 1]);
                        mma(acc[x], ah[p], wh[2 * p], wh[2 * p + 1]);
                    }
                }
            }
        } else {  // the loads kept (their values summed into the tile), the products left out
            #pragma unroll
            for (int i = 0; i < 4; ++i)
                #pragma unroll
                for (int y = 0; y < 2; ++y) acc[0][y] += a4[i][y].x + a4[i][y].y + a4[i][y].z + a4[i][y].w;
        }
        #pragma unroll
        for (int m = 0; m < 32; ++m) part[ks * 1024 + m * 32 + lane] = acc[m / 4][m % 4];
        __syncthreads();
        // element (y, x) of a warp's tile is register 4 (x / 8) + 2 (y / 8) + x % 2 of lane 4 (y % 8) + x % 8 / 2
        #pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int e = tid + q * 256, y = e / 64, x = e % 64;
            const int at_tile = (4 * (x / 8) + 2 * (y / 8) + x % 2) * 32 + 4 * (y % 8) + x % 8 / 2;
            float v = 0.0f;
            #pragma unroll
            for (int s = 0; s < 8; ++s) v += part[s * 1024 + at_tile];
            out[((size_t)t * B + rg * ROWS + y) * N + cb * COLS + x] = v;
        }
    }
}

// ---- wgmma, transposed ----

// A K-major operand with no swizzle: core matrices of 8 rows (of M or N) by 4 values of K, 128 bytes
// each; the two of a k8 step 128 bytes apart (leading byte offset), the next 8 rows 256 bytes on (stride
// byte offset). Element (row, k) of such an image of `rows` rows, per k8 step rows * 8 floats:
__host__ __device__ constexpr int image_at(int rows, int row, int k) {
    return (k / 8) * rows * 8 + (row / 8) * 64 + (k % 8 / 4) * 32 + (row % 8) * 4 + k % 4;
}

__device__ __forceinline__ unsigned long long descriptor(const float* tile) {
    const unsigned long long at = (unsigned)__cvta_generic_to_shared(tile);
    return ((at & 0x3FFFF) >> 4) | ((unsigned long long)(128 >> 4) << 16) | ((unsigned long long)(256 >> 4) << 32);
}

__device__ __forceinline__ void wgmma_ss(float (&d)[8], unsigned long long a, unsigned long long b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7}, "
                 "%8, %9, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "l"(a), "l"(b));
}

__device__ __forceinline__ void wgmma_rs(float (&d)[8], const unsigned (&a)[4], unsigned long long b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7}, "
                 "{%8, %9, %10, %11}, %12, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

__device__ __forceinline__ void wgmma_ss32(float (&d)[16], unsigned long long a, unsigned long long b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, "
                 "%8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
                   "+f"(d[15])
                 : "l"(a), "l"(b));
}

template <int R>
__device__ __forceinline__ void wgmma_fence(float (&d)[R]) {
    #pragma unroll
    for (int i = 0; i < R; i += 8)
        asm volatile("wgmma.fence.sync.aligned;\n"
                     : "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]),
                       "+f"(d[i + 6]), "+f"(d[i + 7])
                     :: "memory");
}

// floats per row of the warpgroups' partial C: a warp's stores of its fragments and the threads' reads of
// a row fall in distinct banks
constexpr int PART = COLS + 4;

template <int WG, bool N32>
constexpr int wgmma_smem() { return (COLS * K + 2 * ROWS * K + WG * ROWS * PART) * 4; }

template <int WG, bool N32, bool ROWWISE = false>
__global__ void __launch_bounds__(128 * WG, 1) step_wgmma(const float* __restrict__ u, const float* __restrict__ h,
                                                          float* __restrict__ out, int products, int steps) {
    constexpr int THREADS = 128 * WG, KS = K / WG, S = KS / 8;  // a warpgroup's K and its k8 steps
    extern __shared__ __align__(128) float smem[];
    float* const uhi = smem;                 // U^T's hi pieces: image of 64 rows (the block's columns)
    float* const hhi = uhi + COLS * K;       // h's pieces: images of 16 rows (N32: one of 32, hi then lo)
    float* const hlo = hhi + ROWS * K;
    float* const part = hlo + ROWS * K;      // [WG][16][PART]: the warpgroups' partial C
    const int tid = threadIdx.x, lane = tid & 31, g = lane / 4, q = lane % 4;
    const int wg = tid / 128, w = tid / 32 % 4, cb = blockIdx.x % COL_BLOCKS, rg = blockIdx.x / COL_BLOCKS;
    for (int e = tid; e < K * COLS; e += THREADS) {
        const int k = e / COLS, c = e % COLS;
        uhi[image_at(COLS, c, k)] = __uint_as_float(__float_as_uint(u[(size_t)k * N + cb * COLS + c]) & 0xffffe000u);
    }
    // U^T's lo pieces as A fragments: rows 16 w + g (+ 8) of the block's columns, k q (+ 4) of each step
    unsigned ulo[S][4];
    #pragma unroll
    for (int s = 0; s < S; ++s)
        #pragma unroll
        for (int f = 0; f < 4; ++f) {
            const int c = 16 * w + g + 8 * (f & 1), k = wg * KS + 8 * s + q + 4 * (f >> 1);
            unsigned hi;
            split(u[(size_t)k * N + cb * COLS + c], hi, ulo[s][f]);
        }
    for (int t = 0; t < steps; ++t) {
        __syncthreads();
        // eight rows' 16 bytes at a time: a warp's stores are four whole 128-byte rows of the banks (or,
        // ROWWISE, a row's 512 bytes, as the generated kernel's polls take them, the stores 8-way
        // conflicts); all of a thread's loads in flight at once, as the generated kernel's polls of h are
        constexpr int PER = ROWS * K / 4 / THREADS;
        float4 vs[PER];
        #pragma unroll
        for (int i = 0; i < PER; ++i) {
            const int e = tid + i * THREADS;
            const int r = ROWWISE ? e / (K / 4) : e % 8 + 8 * (e / (2 * K));
            const int k = ROWWISE ? 4 * (e % (K / 4)) : 4 * (e / 8 % (K / 4));
            vs[i] = *(const float4*)(h + ((size_t)t * B + rg * ROWS + r) * K + k);
        }
        #pragma unroll
        for (int i = 0; i < PER; ++i) {
            const int e = tid + i * THREADS;
            const int r = ROWWISE ? e / (K / 4) : e % 8 + 8 * (e / (2 * K));
            const int k = ROWWISE ? 4 * (e % (K / 4)) : 4 * (e / 8 % (K / 4));
            const float4 v = vs[i];
            unsigned hi[4], lo[4];
            split(v.x, hi[0], lo[0]);
            split(v.y, hi[1], lo[1]);
            split(v.z, hi[2], lo[2]);
            split(v.w, hi[3], lo[3]);
            *(uint4*)(hhi + (N32 ? image_at(2 * ROWS, r, k) : image_at(ROWS, r, k))) =
                make_uint4(hi[0], hi[1], hi[2], hi[3]);
            *(uint4*)(N32 ? hhi + image_at(2 * ROWS, r + ROWS, k) : hlo + image_at(ROWS, r, k)) =
                make_uint4(lo[0], lo[1], lo[2], lo[3]);
        }
        if (products >= 0) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // the stage, for the wgmmas
        __syncthreads();
        float acc[8] = {}, both[16] = {};  // both: C^T's columns 0..15 by hi, 16..31 by lo of h
        if (products > 0) {
            wgmma_fence(acc);
            if (N32) wgmma_fence(both);
            #pragma unroll
            for (int s = 0; s < S; ++s) {
                const int step = wg * S + s;
                const unsigned long long a = descriptor(uhi + step * COLS * 8);
                if (N32) {
                    const unsigned long long b = descriptor(hhi + step * 2 * ROWS * 8);
                    wgmma_rs(acc, ulo[s], b);  // its first 16 rows: h's hi pieces
                    wgmma_ss32(both, a, b);
                } else {
                    const unsigned long long bh = descriptor(hhi + step * ROWS * 8);
                    wgmma_rs(acc, ulo[s], bh);  // the small products first
                    wgmma_ss(acc, a, descriptor(hlo + step * ROWS * 8));
                    wgmma_ss(acc, a, bh);
                }
            }
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            if (N32)
                #pragma unroll
                for (int j = 0; j < 8; ++j) acc[j] += both[j] + both[j + 8];
        }
        // acc[4 v + 2 y + i] is C^T's (16 w + g + 8 y, 8 v + 2 q + i)
        #pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int c = 16 * w + g + 8 * (j / 2 % 2), r = 8 * (j / 4) + 2 * q + j % 2;
            part[(wg * ROWS + r) * PART + c] = acc[j];
        }
        __syncthreads();
        for (int e = tid; e < COLS * ROWS; e += THREADS) {
            const int c = e % COLS, r = e / COLS;
            float v = 0.0f;
            #pragma unroll
            for (int p = 0; p < WG; ++p) v += part[(p * ROWS + r) * PART + c];
            out[((size_t)t * B + rg * ROWS + r) * N + cb * COLS + c] = v;
        }
    }
}

// ---- host ----

struct Variant {
    const char* name;
    void (*kernel)(const float*, const float*, float*, int, int);
    int threads, smem;
};

int main() {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> u0((size_t)K * N), h0((size_t)T * B * K), u(u0.size()), h(h0.size());
    for (auto& v : u0) v = dist(rng);
    for (auto& v : h0) v = dist(rng);
    float *du, *dh, *dout;
    CHECK(cudaMalloc(&du, u.size() * 4));
    CHECK(cudaMalloc(&dh, h.size() * 4));
    CHECK(cudaMalloc(&dout, (size_t)T * B * N * 4));
    // U within `su` and h within `sh`, on the host and the GPU
    const auto scaled = [&](float su, float sh) {
        for (size_t i = 0; i < u.size(); ++i) u[i] = u0[i] * su;
        for (size_t i = 0; i < h.size(); ++i) h[i] = h0[i] * sh;
        CHECK(cudaMemcpy(du, u.data(), u.size() * 4, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(dh, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    };
    // the scales the results are checked at: the timed one (an LSTM's U and h), small values (fp16's
    // subnormals), large ones (within fp16's range)
    const float scales[][2] = {{0.05f, 1.0f}, {1e-3f, 1e-2f}, {4.0f, 100.0f}};
    const Variant variants[] = {
        {"mma", step_mma<8>, 256, mma_smem<8>()},
        {"mma16", step_mma<16>, 512, mma_smem<16>()},
        {"mma_tma", step_mma<8, true>, 256, mma_smem<8>()},
        {"mma_f16x3", step_mma<8, false, true>, 256, mma_smem<8>()},
        {"mma_direct", step_direct, 256, DIRECT_SMEM},
        {"wgmma2", step_wgmma<2, false>, 256, wgmma_smem<2, false>()},
        {"wgmma2n32", step_wgmma<2, true>, 256, wgmma_smem<2, true>()},
        {"wgmma2n32r", step_wgmma<2, true, true>, 256, wgmma_smem<2, true>()},
        {"wgmma4", step_wgmma<4, false>, 512, wgmma_smem<4, false>()},
        {"wgmma4n32", step_wgmma<4, true>, 512, wgmma_smem<4, true>()},
    };
    std::vector<float> got((size_t)T * B * N);
    cudaEvent_t start, end;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&end));
    std::printf("T=%d B=%d K=%d N=%d, %d blocks (%d column blocks x %d row groups); errors at U within %g, "
                "%g, %g and h within %g, %g, %g; timed at the first\n", T, B, K, N, COL_BLOCKS * ROW_GROUPS,
                COL_BLOCKS, ROW_GROUPS, scales[0][0], scales[1][0], scales[2][0], scales[0][1], scales[1][1],
                scales[2][1]);
    for (const Variant& v : variants) {
        CHECK(cudaFuncSetAttribute(v.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, v.smem));
        cudaFuncAttributes attr;
        CHECK(cudaFuncGetAttributes(&attr, v.kernel));
        double errors[3];
        for (int sc = 2; sc >= 0; --sc) {  // (the timed scale last: its data stay for the timing)
            scaled(scales[sc][0], scales[sc][1]);
            CHECK(cudaMemset(dout, 0, (size_t)T * B * N * 4));
            v.kernel<<<COL_BLOCKS * ROW_GROUPS, v.threads, v.smem>>>(du, dh, dout, 1, T);
            CHECK(cudaGetLastError());
            CHECK(cudaDeviceSynchronize());
            CHECK(cudaMemcpy(got.data(), dout, got.size() * 4, cudaMemcpyDeviceToHost));
            double worst = 0.0;  // |error| / sum |terms|, over steps 0 and T - 1
            for (int t : {0, T - 1})
                for (int b = 0; b < B; ++b)
                    for (int n = 0; n < N; ++n) {
                        double ref = 0.0, mag = 0.0;
                        for (int k = 0; k < K; ++k) {
                            const double p = (double)h[((size_t)t * B + b) * K + k] * u[(size_t)k * N + n];
                            ref += p;
                            mag += std::fabs(p);
                        }
                        worst = std::max(worst, std::fabs(got[((size_t)t * B + b) * N + n] - ref) / mag);
                    }
            errors[sc] = worst;
        }
        const double worst = std::max({errors[0], errors[1], errors[2]});
        // [products + 2]: no steps (what a launch does before its loop); without the products and the
        // proxy fence (wgmma); without the products; with them
        float ms[4];
        for (int products = 1; products >= -2; --products) {
            std::vector<float> runs;
            for (int i = 0; i < 21; ++i) {
                CHECK(cudaEventRecord(start));
                v.kernel<<<COL_BLOCKS * ROW_GROUPS, v.threads, v.smem>>>(du, dh, dout, products,
                                                                         products == -2 ? 0 : T);
                CHECK(cudaEventRecord(end));
                CHECK(cudaEventSynchronize(end));
                float m;
                CHECK(cudaEventElapsedTime(&m, start, end));
                runs.push_back(m);
            }
            std::sort(runs.begin(), runs.end());
            ms[products + 2] = runs[runs.size() / 2];
        }
        std::printf("%-10s %3d registers, %6d bytes of shared memory: errors %.2e %.2e %.2e (%s); %.4f ms, "
                    "without the "
                    "products %.4f ms (and without the proxy fence %.4f), no steps %.4f ms: the products %.3f us "
                    "a step, the rest of a step %.3f us\n",
                    v.name, attr.numRegs, v.smem, errors[0], errors[1], errors[2],
                    worst < 1e-6 ? "float32's" : "NOT float32's", ms[3],
                    ms[2], ms[1], ms[0], (ms[3] - ms[2]) * 1e3 / T, (ms[2] - ms[0]) * 1e3 / T);
    }
    return 0;
}
