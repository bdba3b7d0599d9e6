// Whether a plain tensor-core GEMM in 3xTF32 (float32's accuracy) beats cuBLAS's float32 GEMM at the
// shapes of an LSTM's hoisted and weight-gradient GEMMs (T*B = 6400 rows, hidden 512, 4 gates): the
// question before the `tensor` rung also takes those GEMMs off cuBLAS. cuBLAS's TF32 (one product,
// not float32-accurate) is timed for scale. Each result is checked against double-precision sums at
// sampled elements first. The kernel is plain: 128 x 128 tiles of C, no split of K (so dW's shape,
// with 512 rows, fills only 64 blocks), two stages of cp.async.
//   nvcc -O3 -arch=sm_90 benchmarks/probes/tf32x3_gemm_probe.cu -lcublas -o tf32x3_gemm_probe && ./tf32x3_gemm_probe
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace wmma = nvcuda::wmma;

#define CHECK(x)                                                                        \
    do {                                                                                \
        cudaError_t e = (x);                                                            \
        if (e != cudaSuccess) {                                                         \
            std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
            std::exit(1);                                                               \
        }                                                                               \
    } while (0)

constexpr int BM = 128, BN = 128, BK = 32;  // a block's tile of C, and the K it stages at a time
constexpr int WM = 64, WN = 32;             // a warp's tile of C: 4 x 2 fragments of 16 x 16
constexpr int THREADS = 256;                // 8 warps: 2 x 4 of them over the block's tile
constexpr int LDA = BK + 4, LDB = BN + 4;   // padded rows: fewer bank conflicts, 16-byte multiples
constexpr int STAGE = BM * LDA + BK * LDB;  // floats of one stage of A and B

__device__ __forceinline__ void copy16(float* shared, const float* global) {
    const unsigned to = (unsigned)__cvta_generic_to_shared(shared);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(global) : "memory");
}

template <typename Fragment>
__device__ __forceinline__ void split_tf32(Fragment& hi, Fragment& lo) {
#pragma unroll
    for (int e = 0; e < hi.num_elements; ++e) {
        const float v = hi.x[e];
        hi.x[e] = wmma::__float_to_tf32(v);
        lo.x[e] = wmma::__float_to_tf32(v - hi.x[e]);
    }
}

// C[M, N] = A[M, K] @ B[K, N], all row-major; M, N multiples of 128 and K of 32. Two stages of A and B
// in shared memory, the next one loading (cp.async) while the tensor cores work on this one.
__global__ void __launch_bounds__(THREADS) gemm_tf32x3(int M, int N, int K, const float* __restrict__ A,
                                                       const float* __restrict__ B, float* __restrict__ C) {
    extern __shared__ __align__(128) float smem[];
    const int tid = threadIdx.x, warp = tid / 32;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    const int wr = (warp / 4) * WM, wc = (warp % 4) * WN;
    auto load = [&](int stage, int k0) {
        float* as = smem + stage * STAGE;
        float* bs = as + BM * LDA;
        for (int e = tid; e < BM * BK / 4; e += THREADS) {  // A: 128 rows of 32
            const int r = e / (BK / 4), q = e % (BK / 4);
            copy16(as + r * LDA + 4 * q, A + (size_t)(row0 + r) * K + k0 + 4 * q);
        }
        for (int e = tid; e < BK * BN / 4; e += THREADS) {  // B: 32 rows of 128
            const int r = e / (BN / 4), q = e % (BN / 4);
            copy16(bs + r * LDB + 4 * q, B + (size_t)(k0 + r) * N + col0 + 4 * q);
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    };
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc[4][2];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
    load(0, 0);
    const int steps = K / BK;
    for (int s = 0; s < steps; ++s) {
        if (s + 1 < steps) {
            load((s + 1) % 2, (s + 1) * BK);
            asm volatile("cp.async.wait_group 1;\n" ::: "memory");
        } else {
            asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        }
        __syncthreads();
        const float* as = smem + (s % 2) * STAGE;
        const float* bs = as + BM * LDA;
#pragma unroll
        for (int k = 0; k < BK; k += 8) {
            wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> a_hi[4], a_lo[4];
            wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> b_hi[2], b_lo[2];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                wmma::load_matrix_sync(a_hi[i], as + (wr + 16 * i) * LDA + k, LDA);
                split_tf32(a_hi[i], a_lo[i]);
            }
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                wmma::load_matrix_sync(b_hi[j], bs + k * LDB + wc + 16 * j, LDB);
                split_tf32(b_hi[j], b_lo[j]);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    wmma::mma_sync(acc[i][j], a_lo[i], b_hi[j], acc[i][j]);
                    wmma::mma_sync(acc[i][j], a_hi[i], b_lo[j], acc[i][j]);
                    wmma::mma_sync(acc[i][j], a_hi[i], b_hi[j], acc[i][j]);
                }
        }
        __syncthreads();  // the stage is free for the load after next
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
            wmma::store_matrix_sync(C + (size_t)(row0 + wr + 16 * i) * N + col0 + wc + 16 * j, acc[i][j], N,
                                    wmma::mem_row_major);
}

// The largest error at sampled elements, relative to the largest magnitude of C there.
static double sampled_error(int M, int N, int K, const std::vector<float>& a, const std::vector<float>& b,
                            const std::vector<float>& c) {
    std::mt19937 rng(1);
    double err = 0.0, scale = 0.0;
    for (int s = 0; s < 2000; ++s) {
        const int i = rng() % M, j = rng() % N;
        double sum = 0.0;
        for (int k = 0; k < K; ++k) sum += (double)a[(size_t)i * K + k] * b[(size_t)k * N + j];
        err = std::max(err, std::fabs(sum - c[(size_t)i * N + j]));
        scale = std::max(scale, std::fabs(sum));
    }
    return err / scale;
}

template <typename F>
static float median_ms(F&& run) {
    cudaEvent_t t0, t1;
    CHECK(cudaEventCreate(&t0));
    CHECK(cudaEventCreate(&t1));
    run();  // warm
    std::vector<float> ms;
    for (int r = 0; r < 20; ++r) {
        CHECK(cudaEventRecord(t0));
        run();
        CHECK(cudaEventRecord(t1));
        CHECK(cudaEventSynchronize(t1));
        float m = 0.0f;
        CHECK(cudaEventElapsedTime(&m, t0, t1));
        ms.push_back(m);
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

int main() {
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("%s\n", prop.name);
    cublasHandle_t handle;
    cublasCreate(&handle);
    const int smem = 2 * STAGE * (int)sizeof(float);
    CHECK(cudaFuncSetAttribute(gemm_tf32x3, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    struct Shape { const char* what; int M, N, K; };
    const Shape shapes[] = {{"x @ W (hoisted, forward)", 6400, 2048, 512},
                            {"dG @ W^T (dx, backward)", 6400, 512, 2048},
                            {"dW's shape (X^T @ dG)", 512, 2048, 6400}};
    std::printf("%-26s %8s %8s %8s | %10s %10s %10s\n", "GEMM", "M", "N", "K", "sgemm ms", "tf32 ms",
                "3xtf32 ms");
    for (const Shape& sh : shapes) {
        const int M = sh.M, N = sh.N, K = sh.K;
        std::vector<float> a((size_t)M * K), b((size_t)K * N), c((size_t)M * N);
        std::mt19937 rng(0);
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        for (float& v : a) v = u(rng);
        for (float& v : b) v = u(rng) / 22.6f;
        float *da, *db, *dc;
        CHECK(cudaMalloc(&da, a.size() * 4));
        CHECK(cudaMalloc(&db, b.size() * 4));
        CHECK(cudaMalloc(&dc, c.size() * 4));
        CHECK(cudaMemcpy(da, a.data(), a.size() * 4, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(db, b.data(), b.size() * 4, cudaMemcpyHostToDevice));
        const float one = 1.0f, zero = 0.0f;
        double err[3];
        float ms[3];
        for (int which = 0; which < 3; ++which) {
            auto run = [&] {
                if (which == 2) {
                    gemm_tf32x3<<<dim3(N / BN, M / BM), THREADS, smem>>>(M, N, K, da, db, dc);
                } else {  // row-major C = A B is column-major C^T = B^T A^T
                    cublasSetMathMode(handle, which == 1 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
                    cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, db, N, da, K, &zero, dc, N);
                }
            };
            CHECK(cudaMemset(dc, 0, c.size() * 4));
            run();
            CHECK(cudaDeviceSynchronize());
            CHECK(cudaMemcpy(c.data(), dc, c.size() * 4, cudaMemcpyDeviceToHost));
            err[which] = sampled_error(M, N, K, a, b, c);
            ms[which] = median_ms(run);
        }
        std::printf("%-26s %8d %8d %8d | %10.4f %10.4f %10.4f   rel. error %.1e %.1e %.1e\n", sh.what, M, N, K,
                    ms[0], ms[1], ms[2], err[0], err[1], err[2]);
        CHECK(cudaFree(da));
        CHECK(cudaFree(db));
        CHECK(cudaFree(dc));
    }
    cublasDestroy(handle);
    return 0;
}
