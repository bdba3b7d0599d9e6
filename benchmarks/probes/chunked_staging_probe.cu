// Where the tensor rung's backward step GEMM spends its time, and whether staging its operand differently
// pays. The LSTM at B=64, H=512 in float32: the backward persistent kernel's 128 blocks are 32 column
// blocks x 4 row groups; each block multiplies its row group's 16 rows of the gates' gradients (16 x 2048)
// by its 16 columns of U^T (2048 x 16, in shared memory) every step, K staged 512 columns at a time, 8
// warps splitting K (each only four blocks of 16 k a chunk), each float32 product as three fp16 ones over
// rows and columns scaled by powers of two, as codegen/persistent_cuda/gemm_mma.py generates it. On an
// H200 the kernel took 7.8 us a step outside its products (benchmarks/step_profile.py). Here only the
// GEMM runs: every step each block stages its rows (a new operand each step, from global memory through
// L2), multiplies them and writes its 16 x 16 results, the steps separated by block barriers:
//   chunks512     as generated: per chunk of 512 columns, a barrier, the chunk copied and waited for, a
//                 barrier, the products, each warp's partial tile added into shared memory
//   chunks1024    the same in chunks of 1024 columns (two rounds a step instead of four)
//   chunks512x2   chunks of 512 in two buffers: the next chunk's copies issued before the products of
//                 this one, so that they fly while it multiplies (not across steps: a step's operand is
//                 not written before the step)
// Each variant's results are checked against a float64 product on the host (two steps), then timed:
// with the products, without them (the staging, barriers and stores alone), and with no steps.
//
//     nvcc -O3 -arch=sm_90 benchmarks/probes/chunked_staging_probe.cu -o /tmp/chunked_staging_probe &&
//         /tmp/chunked_staging_probe
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "probe_check.cuh"  // CHECK, median_event_ms

// the generated kernels' helpers: cf_f16x3_scale, cf_split_f16x3, cf_mma_f16, cf_copy16, ...
#include "../../cellfuse/resources/cuda/f16x3.cuh"
#include "../../cellfuse/resources/cuda/persistent.cuh"

constexpr int T = 100, B = 64, K = 2048, N = 512;  // steps, rows, K, columns
constexpr int COLS = 16, ROWS = 16, WARPS = 8, THREADS = 32 * WARPS;
constexpr int COL_BLOCKS = N / COLS, ROW_GROUPS = B / ROWS;
constexpr int KP = K + 16;  // U^T's row length in shared memory (K in an odd number of 16-k blocks)

__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int PENDING> __device__ __forceinline__ void wait_groups() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
}

template <int CHUNK, int BUFFERS>
constexpr int smem_bytes() { return (BUFFERS * ROWS * (CHUNK + 16) + COLS * KP + COLS + WARPS * 8 * 32) * 4; }

// rows rg's chunk kc of step t into `stage` (its copies committed as one group)
template <int CHUNK>
__device__ __forceinline__ void issue(float* stage, const float* a, int t, int rg, int kc) {
    constexpr int Q = CHUNK / 4;
    for (int e = threadIdx.x; e < ROWS * Q; e += THREADS) {
        const int r = e / Q, q = e % Q;
        cf_copy16(stage + r * (CHUNK + 16) + 4 * q, a + ((size_t)t * B + rg * ROWS + r) * K + kc + 4 * q);
    }
    commit();
}

template <int CHUNK, int BUFFERS>
__global__ void __launch_bounds__(THREADS, 1) step(const float* __restrict__ u, const float* __restrict__ a,
                                                  float* __restrict__ out, int products, int steps) {
    constexpr int SS = CHUNK + 16, CHUNKS = K / CHUNK, SPLIT = WARPS;
    extern __shared__ __align__(128) float smem[];
    float* const stage = smem;                        // [BUFFERS][ROWS][SS]
    float* const w = stage + BUFFERS * ROWS * SS;     // [COLS][KP]: U^T's block columns, split in place
    float* const wscale = w + COLS * KP;              // [COLS]
    float* const part = wscale + COLS;                // [WARPS][8][32]
    const int tid = threadIdx.x, lane = tid & 31, o = tid / 32, cb = blockIdx.x % COL_BLOCKS,
              rg = blockIdx.x / COL_BLOCKS;
    for (int e = tid; e < COLS * KP; e += THREADS) {
        const int c = e / KP, k = e % KP;
        w[e] = k < K ? u[(size_t)k * N + cb * COLS + c] : 0.0f;
    }
    __syncthreads();
    for (int c = o; c < COLS; c += WARPS) {  // each column split in place, scaled by its own power of two
        float4* const col = reinterpret_cast<float4*>(w + c * KP);
        float m = 0.0f;
        for (int q = lane; q < KP / 4; q += 32) m = fmaxf(m, cf_abs_max(col[q]));
        const float s = cf_f16x3_scale(cf_warp_max(m));
        for (int q = lane; q < KP / 4; q += 32) {
            const float4 v = col[q];
            uint4 p;
            cf_split_f16x3(v.x * s, v.y * s, p.x, p.z);
            cf_split_f16x3(v.z * s, v.w * s, p.y, p.w);
            reinterpret_cast<uint4*>(col)[q] = p;
        }
        if (lane == 0) wscale[c] = cf_f16x3_unscale(s);
    }
    for (int t = 0; t < steps; ++t) {
        if (BUFFERS == 2) {
            __syncthreads();  // (the last step's products are done with both buffers)
            issue<CHUNK>(stage, a, t, rg, 0);
        }
        for (int ci = 0; ci < CHUNKS; ++ci) {
            const int kc = ci * CHUNK;
            float* const buf = stage + (BUFFERS == 2 ? (ci & 1) : 0) * ROWS * SS;
            __syncthreads();  // the stage (the other buffer) and the partial tiles are free again
            if (BUFFERS == 2) {
                if (ci + 1 < CHUNKS) {
                    issue<CHUNK>(stage + ((ci + 1) & 1) * ROWS * SS, a, t, rg, kc + CHUNK);
                    wait_groups<1>();
                } else {
                    wait_groups<0>();
                }
            } else {
                issue<CHUNK>(buf, a, t, rg, kc);
                wait_groups<0>();
            }
            __syncthreads();
            const float* const at = buf + (lane >> 2) * SS + 4 * (lane & 3);
            const float* const wt = w + (lane >> 2) * KP + kc + 4 * (lane & 3);
            float acc[2][4] = {}, small[2][4] = {};
            float m0 = 0.0f, m1 = 0.0f;
            #pragma unroll
            for (int k = o * 16; k < CHUNK; k += SPLIT * 16) {
                m0 = fmaxf(m0, cf_abs_max(*(const float4*)(at + k)));
                m1 = fmaxf(m1, cf_abs_max(*(const float4*)(at + 8 * SS + k)));
            }
            #pragma unroll
            for (int d = 1; d < 4; d *= 2) {
                m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, d));
                m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, d));
            }
            const float s0 = cf_f16x3_scale(m0), s1 = cf_f16x3_scale(m1);
            if (products) {
                #pragma unroll
                for (int k = o * 16; k < CHUNK; k += SPLIT * 16) {
                    const float4 a0 = *(const float4*)(at + k), a1 = *(const float4*)(at + 8 * SS + k);
                    unsigned ah[4], al[4];
                    cf_split_f16x3(a0.x * s0, a0.y * s0, ah[0], al[0]);
                    cf_split_f16x3(a1.x * s1, a1.y * s1, ah[1], al[1]);
                    cf_split_f16x3(a0.z * s0, a0.w * s0, ah[2], al[2]);
                    cf_split_f16x3(a1.z * s1, a1.w * s1, ah[3], al[3]);
                    #pragma unroll
                    for (int x = 0; x < 2; ++x) {
                        const uint4 w4 = *(const uint4*)(wt + x * 8 * KP + k);
                        cf_mma_f16(small[x], ah[0], ah[1], ah[2], ah[3], w4.z, w4.w);
                        cf_mma_f16(small[x], al[0], al[1], al[2], al[3], w4.x, w4.y);
                        cf_mma_f16(acc[x], ah[0], ah[1], ah[2], ah[3], w4.x, w4.y);
                    }
                }
            }
            const float i0 = cf_f16x3_unscale(s0), i1 = cf_f16x3_unscale(s1);
            #pragma unroll
            for (int m = 0; m < 8; ++m) {
                const float v = (acc[m / 4][m % 4] + small[m / 4][m % 4] * (1.0f / 2048.0f)) *
                                (m % 4 < 2 ? i0 : i1);
                float& p = part[(o * 8 + m) * 32 + lane];
                p = ci ? p + v : v;
            }
        }
        __syncthreads();
        {  // element (y, x): register 4 (x / 8) + 2 (y / 8) + x % 2 of lane 4 (y % 8) + x % 8 / 2
            const int y = tid / 16, x = tid % 16;
            const int at = (4 * (x / 8) + 2 * (y / 8) + x % 2) * 32 + 4 * (y % 8) + x % 8 / 2;
            float v = 0.0f;
            #pragma unroll
            for (int s = 0; s < WARPS; ++s) v += part[s * 256 + at];
            out[((size_t)t * B + rg * ROWS + y) * N + cb * COLS + x] = v * wscale[x];
        }
    }
}

struct Variant {
    const char* name;
    void (*kernel)(const float*, const float*, float*, int, int);
    int smem;
};

int main() {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> u((size_t)K * N), a((size_t)T * B * K);
    for (auto& v : u) v = dist(rng) * 0.05f;
    for (auto& v : a) v = dist(rng) * 0.01f;
    float *du, *da, *dout;
    CHECK(cudaMalloc(&du, u.size() * 4));
    CHECK(cudaMalloc(&da, a.size() * 4));
    CHECK(cudaMalloc(&dout, (size_t)T * B * N * 4));
    CHECK(cudaMemcpy(du, u.data(), u.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(da, a.data(), a.size() * 4, cudaMemcpyHostToDevice));
    const Variant variants[] = {
        {"chunks512", step<512, 1>, smem_bytes<512, 1>()},
        {"chunks1024", step<1024, 1>, smem_bytes<1024, 1>()},
        {"chunks512x2", step<512, 2>, smem_bytes<512, 2>()},
    };
    std::vector<float> got((size_t)T * B * N);
    cudaEvent_t start, end;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&end));
    std::printf("T=%d B=%d K=%d N=%d, %d blocks (%d column blocks x %d row groups) of %d threads\n", T, B, K,
                N, COL_BLOCKS * ROW_GROUPS, COL_BLOCKS, ROW_GROUPS, THREADS);
    for (const Variant& v : variants) {
        CHECK(cudaFuncSetAttribute(v.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, v.smem));
        CHECK(cudaMemset(dout, 0, got.size() * 4));
        v.kernel<<<COL_BLOCKS * ROW_GROUPS, THREADS, v.smem>>>(du, da, dout, 1, T);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaMemcpy(got.data(), dout, got.size() * 4, cudaMemcpyDeviceToHost));
        double worst = 0.0;  // |error| / sum |terms|, over steps 0 and T - 1
        for (int t : {0, T - 1})
            for (int b = 0; b < B; ++b)
                for (int n = 0; n < N; ++n) {
                    double ref = 0.0, mag = 0.0;
                    for (int k = 0; k < K; ++k) {
                        const double p = (double)a[((size_t)t * B + b) * K + k] * u[(size_t)k * N + n];
                        ref += p;
                        mag += std::fabs(p);
                    }
                    worst = std::max(worst, std::fabs(got[((size_t)t * B + b) * N + n] - ref) / mag);
                }
        float ms[3];  // with the products, without them, no steps
        for (int mode = 0; mode < 3; ++mode) {
            std::vector<float> runs;
            for (int i = 0; i < 21; ++i) {
                CHECK(cudaEventRecord(start));
                v.kernel<<<COL_BLOCKS * ROW_GROUPS, THREADS, v.smem>>>(du, da, dout, mode == 0,
                                                                     mode == 2 ? 0 : T);
                CHECK(cudaEventRecord(end));
                CHECK(cudaEventSynchronize(end));
                float t;
                CHECK(cudaEventElapsedTime(&t, start, end));
                runs.push_back(t);
            }
            std::sort(runs.begin(), runs.end());
            ms[mode] = runs[runs.size() / 2];
        }
        std::printf("%-12s %6d bytes of shared memory: error %.2e (%s); %.4f ms, without the products "
                    "%.4f ms, no steps %.4f ms: a step %.3f us, of which the products %.3f us\n",
                    v.name, v.smem, worst, worst < 1e-6 ? "float32's" : "NOT float32's", ms[0], ms[1], ms[2],
                    1e3 * (ms[0] - ms[2]) / T, 1e3 * (ms[0] - ms[1]) / T);
    }
    return 0;
}
