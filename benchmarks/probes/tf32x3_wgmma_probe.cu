// Whether a 3xTF32 GEMM that splits its operands as it loads them, on the H100's warpgroup tensor-core
// instructions (wgmma), can take IndRNN's hoisted input GEMM (x @ W: T*B = 6400 rows, 512 by 512) below
// what cuBLAS's TF32 GEMM takes on split copies (the splits included), and with a plain recurrence kernel
// after it, the whole forward below 0.05 ms. x stays float32 in global memory: each thread loads its rows'
// elements of a stage into registers and splits them there (x = hi + lo, the A fragments of wgmma), so
// there are no split copies of x; W is split once into an image of the B tiles in shared memory, hi and lo,
// copied stage by stage with cp.async. Each product is lo*hi + hi*lo + hi*hi (three TF32 wgmmas), summed in
// float32: float32's accuracy, checked against double-precision sums at sampled elements before timing.
// K is permuted within each stage (the same permutation on both sides), so that a thread's A elements of
// a stage are contiguous in x: two 16-byte loads per row instead of eight 4-byte ones.
//   nvcc -O3 -gencode arch=compute_90a,code=sm_90a benchmarks/probes/tf32x3_wgmma_probe.cu -lcublas \
//       -o tf32x3_wgmma_probe
//   ./tf32x3_wgmma_probe
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#define CHECK(x)                                                                             \
    do {                                                                                     \
        cudaError_t e = (x);                                                                 \
        if (e != cudaSuccess) {                                                              \
            std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

// -- wgmma with A from registers (four TF32 values a thread: rows g and g + 8 of its warp's 16, k-slots
// t and t + 4 of the 8) and B from shared memory; the accumulators of a 64 x N tile, N / 2 a thread.
__device__ __forceinline__ void wgmma_n64(float* d, const uint32_t* a, uint64_t desc, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
        "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), 
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), 
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), 
          "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), 
          "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_n128(float* d, const uint32_t* a, uint64_t desc, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
        "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "
        "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "
        "%59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), 
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), 
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), 
          "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), 
          "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), 
          "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), 
          "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), 
          "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), 
          "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));
}

__device__ __forceinline__ void wgmma_n256(float* d, const uint32_t* a, uint64_t desc, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
        "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "
        "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "
        "%59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, "
        "%78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, "
        "%97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, "
        "%113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "{%128, %129, %130, %131}, %132, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), 
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), 
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), 
          "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), 
          "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), 
          "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), 
          "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), 
          "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), 
          "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), 
          "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), 
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), 
          "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), 
          "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), 
          "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), 
          "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), 
          "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), 
          "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), 
          "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));
}

template <int NI>
__device__ __forceinline__ void wgmma(float* d, const uint32_t* a, uint64_t desc) {
    if constexpr (NI == 64) wgmma_n64(d, a, desc, 1);
    else if constexpr (NI == 128) wgmma_n128(d, a, desc, 1);
    else wgmma_n256(d, a, desc, 1);
}

__device__ __forceinline__ uint32_t tf32(float v) {
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(v));
    return r;
}

__device__ __forceinline__ void copy16(float* shared, const float* global) {
    const unsigned to = (unsigned)__cvta_generic_to_shared(shared);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(global) : "memory");
}

// A shared-memory matrix descriptor of a K-major B tile with no swizzle: core matrices of 8 columns of
// C by 4 TF32 values of K (8 rows of 16 bytes, 128 bytes together), the two of a step's K (8) 128 bytes
// apart (the leading byte offset) and the next 8 columns 256 bytes on (the stride byte offset).
__device__ __forceinline__ uint64_t b_descriptor(const float* tile) {
    const uint64_t addr = (uint32_t)__cvta_generic_to_shared(tile);
    return ((addr & 0x3FFFF) >> 4) | ((uint64_t)(128 >> 4) << 16) | ((uint64_t)(256 >> 4) << 32);
}

// The image of W's B tiles: tile (n / BN, k / BK) of 2 * BK * BN floats, hi then lo; in each, step s of the
// stage's BK / 8, group of 8 columns j, half c of the step's 8 values of K, column r of the group, value q
// of a core matrix's row. A stage's element kk = k % BK is held by the thread with t = kk / (BK / 4) (its
// BK / 4 contiguous elements), as its value 2 s + c. A thread per place in a tile's hi part, so that the
// writes are contiguous; W's reads are scattered, but W is small.
template <int BN, int BK>
__global__ void split_w(const float* __restrict__ w, float* __restrict__ image, int K, int N) {
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= K * N) return;
    const int tile = e / (BK * BN), at = e % (BK * BN);
    const int q = at % 4, r = (at / 4) % 8, c = (at / 32) % 2, j = (at / 64) % (BN / 8), s = at / (8 * BN);
    const int stages = K / BK, k = (tile % stages) * BK + q * (BK / 4) + 2 * s + c;
    const int n = (tile / stages) * BN + j * 8 + r;
    const float v = w[(size_t)k * N + n];
    const uint32_t hi = tf32(v), lo = tf32(v - __uint_as_float(hi));
    float* const to = image + (size_t)tile * 2 * BK * BN + at;
    to[0] = __uint_as_float(hi);
    to[BK * BN] = __uint_as_float(lo);
}

// One block's share of C[M, N] = X[M, K] @ W[K, N] (row-major; W given as its image, split_w): the tile of
// WG warpgroups' 64 rows from row m0 and BN columns from the image's tile column `tcol`, over the stages
// [k0, k1) of K, into the accumulators of the thread's warpgroup (acc, zeroed first). Each warpgroup's
// tile in wgmmas of NI columns. A stage's wgmmas are committed as a group, and INFLIGHT groups run while
// the next one is issued: INFLIGHT + 1 sets of split A in registers, and of x's elements loaded ahead;
// STAGES stages of B in shared memory, STAGES - 1 - INFLIGHT of them loading ahead.
template <int BN, int BK, int WG, int NI, int STAGES, int INFLIGHT = 1>
struct Tile {
    static_assert(BN % NI == 0 && BK % 16 == 0 && STAGES >= INFLIGHT + 2, "shape");
    static constexpr int THREADS = 128 * WG, STAGE = 2 * BK * BN;  // B's tile of a stage, hi and lo
    static constexpr int PER = BK / 4, STEPS = BK / 8, SETS = INFLIGHT + 1, AHEAD = STAGES - 1 - INFLIGHT;
    static constexpr int SMEM = STAGES * STAGE * (int)sizeof(float);

    __device__ __forceinline__ static void run(float (&acc)[BN / NI][NI / 2], float* smem, const float* x,
                                               const float* image, int K, int m0, int tcol, int k0, int k1) {
        const int tid = threadIdx.x, warp = (tid % 128) / 32, lane = tid % 32;
        const int g = lane / 4, t = lane % 4;
        const int stages = K / BK;
        const float* const tiles = image + (size_t)tcol * stages * STAGE;
        const float* const xa = x + (size_t)(m0 + (tid / 128) * 64 + warp * 16 + g) * K + PER * t;
        auto load_stage = [&](int kb) {
            if (kb < k1) {
                const float* const from = tiles + (size_t)kb * STAGE;
                float* const to = smem + (kb % STAGES) * STAGE;
                for (int e = tid; e < STAGE / 4; e += THREADS) copy16(to + 4 * e, from + 4 * e);
            }
            asm volatile("cp.async.commit_group;\n" ::: "memory");
        };
        float4 raw[SETS][2][PER / 4];  // x's rows g and g + 8 at a stage, as loaded
        auto load_a = [&](float4 (&to)[2][PER / 4], int kb) {
            if (kb < k1)
#pragma unroll
                for (int h = 0; h < 2; ++h)
#pragma unroll
                    for (int v = 0; v < PER / 4; ++v)
                        to[h][v] = __ldg(reinterpret_cast<const float4*>(xa + (size_t)8 * h * K + kb * BK) + v);
        };
#pragma unroll
        for (int i = 0; i < BN / NI; ++i)
#pragma unroll
            for (int j = 0; j < NI / 2; ++j) acc[i][j] = 0.0f;
        uint32_t hi[SETS][STEPS][4], lo[SETS][STEPS][4];
        auto stage = [&](int kb, uint32_t (&h)[STEPS][4], uint32_t (&l)[STEPS][4], float4 (&a)[2][PER / 4]) {
            asm volatile("cp.async.wait_group %0;\n" ::"n"(AHEAD - 1) : "memory");
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            __syncthreads();  // stage kb is in shared memory; every wgmma of stage kb - SETS is done
            load_stage(kb + AHEAD);
#pragma unroll
            for (int s = 0; s < STEPS; ++s)
#pragma unroll
                for (int f = 0; f < 4; ++f) {  // a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4)
                    const float4& r4 = a[f & 1][(2 * s + (f >> 1)) / 4];
                    const int at = (2 * s + (f >> 1)) % 4;
                    const float v = at == 0 ? r4.x : at == 1 ? r4.y : at == 2 ? r4.z : r4.w;
                    h[s][f] = tf32(v);
                    l[s][f] = tf32(v - __uint_as_float(h[s][f]));
                }
            load_a(a, kb + SETS);
            const float* const b = smem + (kb % STAGES) * STAGE;
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
            for (int s = 0; s < STEPS; ++s)
#pragma unroll
                for (int i = 0; i < BN / NI; ++i) {
                    const float* const bh = b + (size_t)s * BN * 8 + i * NI * 8;  // hi: step s, columns i*NI
                    const float* const bl = bh + (size_t)STEPS * BN * 8;
                    wgmma<NI>(acc[i], l[s], b_descriptor(bh));
                    wgmma<NI>(acc[i], h[s], b_descriptor(bl));
                    wgmma<NI>(acc[i], h[s], b_descriptor(bh));
                }
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(INFLIGHT) : "memory");
        };
        __syncthreads();  // a previous tile's last stages are no longer read
        for (int kb = k0; kb < k0 + AHEAD; ++kb) load_stage(kb);
#pragma unroll
        for (int p = 0; p < SETS; ++p) load_a(raw[p], k0 + p);
        for (int kb = k0; kb < k1; kb += SETS)
#pragma unroll
            for (int p = 0; p < SETS; ++p)
                if (kb + p < k1) stage(kb + p, hi[p], lo[p], raw[p]);
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    }

    // The thread's accumulators at their places in C.
    __device__ __forceinline__ static void store(const float (&acc)[BN / NI][NI / 2], float* c, int N, int m0,
                                                 int n0) {
        const int tid = threadIdx.x, lane = tid % 32;
        const int row0 = m0 + (tid / 128) * 64 + ((tid % 128) / 32) * 16 + lane / 4, t = lane % 4;
#pragma unroll
        for (int i = 0; i < BN / NI; ++i)
#pragma unroll
            for (int v = 0; v < NI / 8; ++v)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    *reinterpret_cast<float2*>(c + (size_t)(row0 + 8 * h) * N + n0 + i * NI + 8 * v + 2 * t) =
                        make_float2(acc[i][4 * v + 2 * h], acc[i][4 * v + 2 * h + 1]);
    }
};

// A block per tile of C.
template <int BN, int BK, int WG, int NI, int STAGES, int INFLIGHT>
__global__ void __launch_bounds__(128 * WG, 1)
    gemm_tiles(int M, int N, int K, const float* __restrict__ x, const float* __restrict__ image,
               float* __restrict__ c) {
    using Tl = Tile<BN, BK, WG, NI, STAGES, INFLIGHT>;
    extern __shared__ __align__(128) float smem[];
    float acc[BN / NI][NI / 2];
    const int m0 = blockIdx.y * 64 * WG;
    Tl::run(acc, smem, x, image, K, m0, blockIdx.x, 0, K / BK);
    Tl::store(acc, c, N, m0, blockIdx.x * BN);
}

// The same block's share with its stages of B copied by one thread each as one bulk copy (the tensor
// memory accelerator, no tensor map: the image is contiguous), its arrival signalled by an mbarrier
// (`full`) and its slot's release by each warp once its wgmmas on it are done (`empty`): no block-wide
// barrier in the loop, and no thread but one issuing copies.
template <int BN, int BK, int WG, int NI, int STAGES>
struct TileBulk {
    static_assert(BN % NI == 0 && BK % 16 == 0 && STAGES >= 3, "shape");
    static constexpr int THREADS = 128 * WG, STAGE = 2 * BK * BN, PER = BK / 4, STEPS = BK / 8;
    static constexpr int AHEAD = STAGES - 2;
    static constexpr int SMEM = STAGES * STAGE * (int)sizeof(float) + 2 * STAGES * 8;

    __device__ __forceinline__ static void run(float (&acc)[BN / NI][NI / 2], float* smem, const float* x,
                                               const float* image, int K, int m0, int tcol) {
        const int tid = threadIdx.x, warp = (tid % 128) / 32, lane = tid % 32;
        const int g = lane / 4, t = lane % 4;
        const int stages = K / BK;
        uint64_t* const bars = reinterpret_cast<uint64_t*>(smem + STAGES * STAGE);  // full, then empty
        const unsigned full0 = (unsigned)__cvta_generic_to_shared(bars);
        const unsigned empty0 = full0 + 8 * STAGES;
        if (tid == 0)
            for (int s = 0; s < STAGES; ++s) {
                asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(full0 + 8 * s));
                asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(empty0 + 8 * s), "r"(THREADS / 32));
            }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        __syncthreads();
        const float* const tiles = image + (size_t)tcol * stages * STAGE;
        auto produce = [&](int kb) {  // by thread 0: stage kb into its slot, once the slot's last use is done
            if (kb >= stages) return;
            const int slot = kb % STAGES;
            if (kb >= STAGES) {
                const unsigned parity = (kb / STAGES - 1) & 1;
                unsigned done = 0;
                while (!done)
                    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                                 "selp.u32 %0, 1, 0, p;\n}\n"
                                 : "=r"(done) : "r"(empty0 + 8 * slot), "r"(parity) : "memory");
            }
            const unsigned to = (unsigned)__cvta_generic_to_shared(smem + slot * STAGE);
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                         ::"r"(full0 + 8 * slot), "n"(STAGE * 4) : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                         ::"r"(to), "l"(tiles + (size_t)kb * STAGE), "n"(STAGE * 4), "r"(full0 + 8 * slot)
                         : "memory");
        };
        const float* const xa = x + (size_t)(m0 + (tid / 128) * 64 + warp * 16 + g) * K + PER * t;
        float4 raw[2][2][PER / 4];  // x's rows g and g + 8 at a stage, as loaded
        auto load_a = [&](float4 (&to)[2][PER / 4], int kb) {
            if (kb < stages)
#pragma unroll
                for (int h = 0; h < 2; ++h)
#pragma unroll
                    for (int v = 0; v < PER / 4; ++v)
                        to[h][v] = __ldg(reinterpret_cast<const float4*>(xa + (size_t)8 * h * K + kb * BK) + v);
        };
#pragma unroll
        for (int i = 0; i < BN / NI; ++i)
#pragma unroll
            for (int j = 0; j < NI / 2; ++j) acc[i][j] = 0.0f;
        uint32_t hi[2][STEPS][4], lo[2][STEPS][4];
        auto stage = [&](int kb, uint32_t (&h)[STEPS][4], uint32_t (&l)[STEPS][4], float4 (&a)[2][PER / 4]) {
            if (tid == 0) produce(kb + AHEAD);
            const int slot = kb % STAGES;
#pragma unroll
            for (int s = 0; s < STEPS; ++s)
#pragma unroll
                for (int f = 0; f < 4; ++f) {  // a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4)
                    const float4& r4 = a[f & 1][(2 * s + (f >> 1)) / 4];
                    const int at = (2 * s + (f >> 1)) % 4;
                    const float v = at == 0 ? r4.x : at == 1 ? r4.y : at == 2 ? r4.z : r4.w;
                    h[s][f] = tf32(v);
                    l[s][f] = tf32(v - __uint_as_float(h[s][f]));
                }
            load_a(a, kb + 2);
            unsigned done = 0;
            while (!done)
                asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                             "selp.u32 %0, 1, 0, p;\n}\n"
                             : "=r"(done) : "r"(full0 + 8 * slot), "r"((kb / STAGES) & 1) : "memory");
            const float* const b = smem + slot * STAGE;
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
            for (int s = 0; s < STEPS; ++s)
#pragma unroll
                for (int i = 0; i < BN / NI; ++i) {
                    const float* const bh = b + (size_t)s * BN * 8 + i * NI * 8;  // hi: step s, columns i*NI
                    const float* const bl = bh + (size_t)STEPS * BN * 8;
                    wgmma<NI>(acc[i], l[s], b_descriptor(bh));
                    wgmma<NI>(acc[i], h[s], b_descriptor(bl));
                    wgmma<NI>(acc[i], h[s], b_descriptor(bh));
                }
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
            if (kb > 0 && lane == 0)  // this warp's wgmmas of stage kb - 1 are done
                asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(empty0 + 8 * ((kb - 1) % STAGES))
                             : "memory");
        };
        if (tid == 0)
            for (int kb = 0; kb < AHEAD; ++kb) produce(kb);
        load_a(raw[0], 0);
        load_a(raw[1], 1);
        for (int kb = 0; kb < stages; kb += 2) {
            stage(kb, hi[0], lo[0], raw[0]);
            if (kb + 1 < stages) stage(kb + 1, hi[1], lo[1], raw[1]);
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    }
};

template <int BN, int BK, int WG, int NI, int STAGES>
__global__ void __launch_bounds__(128 * WG, 1)
    gemm_tiles_bulk(int M, int N, int K, const float* __restrict__ x, const float* __restrict__ image,
                    float* __restrict__ c) {
    extern __shared__ __align__(128) float smem[];
    float acc[BN / NI][NI / 2];
    const int m0 = blockIdx.y * 64 * WG;
    TileBulk<BN, BK, WG, NI, STAGES>::run(acc, smem, x, image, K, m0, blockIdx.x);
    Tile<BN, BK, WG, NI, STAGES>::store(acc, c, N, m0, blockIdx.x * BN);
}

// The tensor cores' own pace, for scale: each of 2 warpgroups a block issues wgmmas of 64 x 256 x 8 on
// one shared-memory tile of B and fixed registers of A, STEPS at a time, as the GEMM does; nothing loaded.
__global__ void __launch_bounds__(256, 1) wgmma_pace(float* out, int rounds) {
    extern __shared__ __align__(128) float smem[];
    for (int e = threadIdx.x; e < 2 * 8 * 256; e += 256) smem[e] = 1e-3f * (e % 7);
    __syncthreads();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    float acc[128];
#pragma unroll
    for (int j = 0; j < 128; ++j) acc[j] = 0.0f;
    const uint32_t a[4] = {tf32(1.0f), tf32(0.5f), tf32(0.25f), tf32(2.0f)};
    for (int r = 0; r < rounds; ++r) {
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int s = 0; s < 6; ++s) wgmma<256>(acc, a, b_descriptor(smem + (s % 2) * 8 * 256));
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < 128; ++j) sum += acc[j];
    out[blockIdx.x * 256 + threadIdx.x] = sum;
}

// -- what cuBLAS does today: x and W split into copies ([x_hi, x_lo, x_hi] and [W_hi; W_hi; W_lo]) and one
// TF32 GEMM over 3K; and the recurrence after either GEMM.
__global__ void split_x3(const float* __restrict__ x, float* __restrict__ out, int M, int K) {
    const size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)M * K) return;
    const size_t m = e / K, k = e % K;
    const float v = x[e], hi = __uint_as_float(tf32(v)), lo = __uint_as_float(tf32(v - hi));
    float* const row = out + m * 3 * K;
    row[k] = hi;
    row[K + k] = lo;
    row[2 * K + k] = hi;
}

__global__ void split_w3(const float* __restrict__ w, float* __restrict__ out, int K, int N) {
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= K * N) return;
    const float v = w[e], hi = __uint_as_float(tf32(v)), lo = __uint_as_float(tf32(v - hi));
    out[e] = hi;
    out[(size_t)K * N + e] = hi;
    out[(size_t)2 * K * N + e] = lo;
}

// IndRNN's recurrence: h_t = relu(pre_t + u * h_{t-1} + b), a thread per element (batch x hidden).
__global__ void __launch_bounds__(256) scan(const float* __restrict__ pre, const float* __restrict__ u,
                                            const float* __restrict__ b, float* __restrict__ hs, int seq,
                                            int n, int width) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float uu = u[i % width], bb = b[i % width];
    float h = 0.0f;
#pragma unroll 8
    for (int t = 0; t < seq; ++t) {
        const float v = pre[(size_t)t * n + i] + uu * h + bb;
        h = v > 0.0f ? v : 0.0f;
        hs[(size_t)t * n + i] = h;
    }
}

// The largest error at sampled elements of C, relative to the largest magnitude of C there.
static double sampled_error(int M, int N, int K, const std::vector<float>& a, const std::vector<float>& b,
                            const std::vector<float>& c) {
    std::mt19937 rng(1);
    double err = 0.0, scale = 0.0;
    for (int s = 0; s < 3000; ++s) {
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
    for (int r = 0; r < 3; ++r) run();  // warm
    std::vector<float> ms;
    for (int r = 0; r < 50; ++r) {
        CHECK(cudaEventRecord(t0));
        run();
        CHECK(cudaEventRecord(t1));
        CHECK(cudaEventSynchronize(t1));
        float m = 0.0f;
        CHECK(cudaEventElapsedTime(&m, t0, t1));
        ms.push_back(m);
    }
    std::sort(ms.begin(), ms.end());
    CHECK(cudaEventDestroy(t0));
    CHECK(cudaEventDestroy(t1));
    return ms[ms.size() / 2];
}

constexpr int T = 100, B = 64, H = 512, M = T * B, K = H, N = H;

struct Buffers {
    float *x, *w, *u, *b, *image, *c, *hs, *x3, *w3;
};

template <int BN, int BK, int WG, int NI, int STAGES, int INFLIGHT = 1, bool BULK = false>
static void variant(const Buffers& d, const std::vector<float>& x, const std::vector<float>& w,
                    float cublas_forward_ms) {
    const int smem = BULK ? TileBulk<BN, BK, WG, NI, STAGES>::SMEM : Tile<BN, BK, WG, NI, STAGES, INFLIGHT>::SMEM;
    auto kernel = BULK ? gemm_tiles_bulk<BN, BK, WG, NI, STAGES> : gemm_tiles<BN, BK, WG, NI, STAGES, INFLIGHT>;
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 128 * WG, smem));
    const dim3 grid(N / BN, M / (64 * WG));
    auto split = [&] { split_w<BN, BK><<<(K * N + 255) / 256, 256>>>(d.w, d.image, K, N); };
    auto gemm = [&] { kernel<<<grid, 128 * WG, smem>>>(M, N, K, d.x, d.image, d.c); };
    auto forward = [&] {
        split();
        gemm();
        scan<<<B * H / 256, 256>>>(d.c, d.u, d.b, d.hs, T, B * H, H);
    };
    CHECK(cudaMemset(d.c, 0, (size_t)M * N * 4));
    split();
    gemm();
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::vector<float> c((size_t)M * N);
    CHECK(cudaMemcpy(c.data(), d.c, c.size() * 4, cudaMemcpyDeviceToHost));
    const double err = sampled_error(M, N, K, x, w, c);
    const bool ok = err < 1e-5;
    std::printf("%s BN=%3d BK=%2d WG=%d NI=%3d stages=%d in flight=%d: %3d blocks of %3d threads, %6d bytes, "
                "%d a SM | rel. error %.1e %s",
                BULK ? "bulk copies " : "cp.async    ", BN, BK, WG, NI, STAGES, INFLIGHT, grid.x * grid.y, 128 * WG, smem, per_sm, err, ok ? "ok" : "WRONG");
    if (!ok) {
        std::printf("\n");
        return;
    }
    const float s = median_ms(split), g = median_ms(gemm), f = median_ms(forward);
    std::printf(" | split W %.4f ms, GEMM %.4f ms, forward %.4f ms (cuBLAS's %.4f: %.2fx)\n", s, g, f,
                cublas_forward_ms, cublas_forward_ms / f);
}

int main() {
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("%s, %d SMs; IndRNN's input GEMM x[%d, %d] @ W[%d, %d] and its recurrence (T=%d, B=%d)\n",
                prop.name, prop.multiProcessorCount, M, K, K, N, T, B);
    std::vector<float> x((size_t)M * K), w((size_t)K * N), u(H), b(H);
    std::mt19937 rng(0);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& v : x) v = normal(rng);
    for (float& v : w) v = normal(rng) / std::sqrt((float)K);
    for (float& v : u) v = normal(rng) * 0.5f;
    for (float& v : b) v = normal(rng) * 0.1f;
    Buffers d;
    CHECK(cudaMalloc(&d.x, x.size() * 4));
    CHECK(cudaMalloc(&d.w, w.size() * 4));
    CHECK(cudaMalloc(&d.u, H * 4));
    CHECK(cudaMalloc(&d.b, H * 4));
    CHECK(cudaMalloc(&d.image, w.size() * 2 * 4));
    CHECK(cudaMalloc(&d.c, (size_t)M * N * 4));
    CHECK(cudaMalloc(&d.hs, (size_t)M * N * 4));
    CHECK(cudaMalloc(&d.x3, x.size() * 3 * 4));
    CHECK(cudaMalloc(&d.w3, w.size() * 3 * 4));
    CHECK(cudaMemcpy(d.x, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d.w, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d.u, u.data(), H * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d.b, b.data(), H * 4, cudaMemcpyHostToDevice));

    cublasHandle_t handle;
    cublasCreate(&handle);
    const float one = 1.0f, zero = 0.0f;
    // row-major C = A B is column-major C^T = B^T A^T
    auto sgemm = [&] {
        cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH);
        cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, d.w, N, d.x, K, &zero, d.c, N);
    };
    auto splits = [&] {
        split_x3<<<(unsigned)(((size_t)M * K + 255) / 256), 256>>>(d.x, d.x3, M, K);
        split_w3<<<(K * N + 255) / 256, 256>>>(d.w, d.w3, K, N);
    };
    auto tf32x3 = [&] {
        cublasSetMathMode(handle, CUBLAS_TF32_TENSOR_OP_MATH);
        cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, N, M, 3 * K, &one, d.w3, N, d.x3, 3 * K, &zero, d.c, N);
    };
    auto the_scan = [&] { scan<<<B * H / 256, 256>>>(d.c, d.u, d.b, d.hs, T, B * H, H); };
    std::vector<float> c((size_t)M * N);
    sgemm();
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(c.data(), d.c, c.size() * 4, cudaMemcpyDeviceToHost));
    const double sgemm_err = sampled_error(M, N, K, x, w, c);
    splits();
    tf32x3();
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(c.data(), d.c, c.size() * 4, cudaMemcpyDeviceToHost));
    const double tf32x3_err = sampled_error(M, N, K, x, w, c);
    const float sgemm_ms = median_ms(sgemm), splits_ms = median_ms(splits), tf32x3_ms = median_ms(tf32x3);
    const float scan_ms = median_ms(the_scan);
    const float cublas_forward = median_ms([&] {
        splits();
        tf32x3();
        the_scan();
    });
    std::printf("cuBLAS float32 GEMM %.4f ms (rel. error %.1e)\n", sgemm_ms, sgemm_err);
    std::printf("cuBLAS TF32 GEMM over 3K on split copies %.4f ms (rel. error %.1e), the splits %.4f ms\n",
                tf32x3_ms, tf32x3_err, splits_ms);
    std::printf("recurrence kernel %.4f ms; splits + cuBLAS + recurrence %.4f ms\n", scan_ms, cublas_forward);

    variant<256, 16, 2, 256, 5, 1>(d, x, w, cublas_forward);
    variant<256, 16, 2, 256, 5, 1, true>(d, x, w, cublas_forward);
    variant<256, 16, 2, 256, 6, 1, true>(d, x, w, cublas_forward);
    variant<256, 32, 2, 256, 3, 1, true>(d, x, w, cublas_forward);
    variant<256, 16, 1, 256, 6, 1, true>(d, x, w, cublas_forward);
    variant<128, 32, 1, 128, 3, 1>(d, x, w, cublas_forward);
    variant<128, 32, 1, 128, 3, 1, true>(d, x, w, cublas_forward);
    variant<128, 16, 1, 128, 6, 1, true>(d, x, w, cublas_forward);
    variant<128, 32, 2, 128, 4, 1, true>(d, x, w, cublas_forward);
    {
        const int sms = prop.multiProcessorCount, rounds = 2000;
        int khz = 0;
        CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
        float* out;
        CHECK(cudaMalloc(&out, (size_t)sms * 256 * 4));
        CHECK(cudaFuncSetAttribute(wgmma_pace, cudaFuncAttributeMaxDynamicSharedMemorySize, 2 * 8 * 256 * 4));
        const float ms = median_ms([&] { wgmma_pace<<<sms, 256, 2 * 8 * 256 * 4>>>(out, rounds); });
        const double macs = (double)sms * 2 * rounds * 6 * 64 * 256 * 8;
        std::printf("wgmma's pace alone (m64n256k8 TF32, A in registers): %.1f TF32 TFLOP/s (%.0f multiply-adds "
                    "a clock and SM at %d MHz)\n", 2 * macs / ms / 1e9, macs / (ms * 1e-3) / sms / (khz * 1e3),
                    khz / 1000);
        CHECK(cudaFree(out));
    }
    cublasDestroy(handle);
    return 0;
}
