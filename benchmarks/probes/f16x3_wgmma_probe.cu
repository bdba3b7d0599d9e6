// Whether the GEMMs outside the loop, computed today as three fp16 products on copies (cf_f16x3_maxima,
// cf_split_f16x3_copies, cuBLAS's fp16 GEMM over 3K into float32, the pass cf_f16x3_unscale_sums:
// cellfuse/resources/cuda/gemm_splits.cuh), go faster as one warpgroup GEMM that splits x as it loads it
// and undoes the scales in its epilogue: the LSTM's input projection at T=100, B=64, I=H=512
// (x[6400, 512] @ W[512, 2048], float32 in and out).
//
// The split, as the copies' (float32's accuracy: every product to about 2^-22 of its row's and column's
// largest): each row of x scaled by the power of two that brings its largest magnitude into [0.5, 1)
// (its exponent found by a pass over x first), each column of W likewise (once per change of W, with W's
// image), each value v = hi + lo in fp16 (hi = fp16(v), lo = fp16(v - hi); lo's of small values are
// subnormal there, which costs at most 2^-25 of the row's or column's largest), and each product
// hi*HI + hi*LO + lo*HI in one float32 accumulator (three fp16 wgmmas of K = 16 a step, A from registers).
// The epilogue multiplies by 2^(row's exponent + column's) in one ldexpf. x stays float32 in global memory:
// each thread loads its rows' values of a stage (8 contiguous floats a row at BK = 32: K is permuted
// within a stage, on both sides, so that a thread's fragment values are contiguous) and splits them in
// registers; W's image holds its hi and lo pieces in the layout of the wgmma's B tiles (no swizzle), copied
// stage by stage with cp.async, or by one bulk copy a stage with an mbarrier ("bulk").
// Checked against double-precision sums at sampled elements before timing; the error reported relative to
// the largest |x| of the row times the largest |W| of the column times sqrt(K).
//   nvcc -O3 -gencode arch=compute_90a,code=sm_90a benchmarks/probes/f16x3_wgmma_probe.cu -lcublas \
//       -o f16x3_wgmma_probe
//   ./f16x3_wgmma_probe
#include <cublas_v2.h>
#include <cuda_fp16.h>
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

// -- wgmma of 64 x NI x 16 in fp16 into float32, A from registers (four b32 of two fp16 a thread: rows g
// and g + 8 of its warp's 16, K pairs 2t and 2t + 8 of the 16), B from shared memory (K-major, not
// transposed); the accumulators of a 64 x NI tile, NI / 2 a thread.
__device__ __forceinline__ void wgmma_n128(float* d, const uint32_t* a, uint64_t desc) {
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
        "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "
        "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "
        "%59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
          "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
          "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
          "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
          "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
          "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
          "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}

__device__ __forceinline__ void wgmma_n256(float* d, const uint32_t* a, uint64_t desc) {
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, "
        "%108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, "
        "%120, %121, %122, %123, %124, %125, %126, %127"
        "}, {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
          "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
          "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
          "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
          "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),
          "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
          "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
          "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]),
          "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),
          "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]),
          "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]),
          "+f"(d[126]), "+f"(d[127])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}

template <int NI>
__device__ __forceinline__ void wgmma(float* d, const uint32_t* a, uint64_t desc) {
    static_assert(NI == 128 || NI == 256, "the wrappers above");
    if constexpr (NI == 128) wgmma_n128(d, a, desc);
    else wgmma_n256(d, a, desc);
}

// two fp16 in a b32, the first in the low half (the lower K of a fragment's pair)
__device__ __forceinline__ uint32_t pair(__half first, __half second) {
    return (uint32_t)__half_as_ushort(first) | ((uint32_t)__half_as_ushort(second) << 16);
}

__device__ __forceinline__ void copy16(void* shared, const void* global) {
    const unsigned to = (unsigned)__cvta_generic_to_shared(shared);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(global) : "memory");
}

// A shared-memory matrix descriptor of a K-major B tile with no swizzle: core matrices of 8 columns of C by
// 8 fp16 values of K (8 rows of 16 bytes, 128 bytes together), the two of a step's K (16) 128 bytes apart
// (the leading byte offset) and the next 8 columns 256 bytes on (the stride byte offset).
__device__ __forceinline__ uint64_t b_descriptor(const __half* tile) {
    const uint64_t addr = (uint32_t)__cvta_generic_to_shared(tile);
    return ((addr & 0x3FFFF) >> 4) | ((uint64_t)(128 >> 4) << 16) | ((uint64_t)(256 >> 4) << 32);
}

// the exponent e of a largest magnitude m (m = f * 2^e, f in [0.5, 1)); 0 for 0 and for what is not finite
__device__ __forceinline__ int exponent_of(float m) {
    int e = 0;
    if (m > 0.0f && m <= 3.4e38f) frexpf(m, &e);
    return e;
}

// -- the exponents of x's rows (a warp a row) and of W's columns (a thread a column)
__global__ void row_exponents(const float* __restrict__ x, int* __restrict__ ea, int M, int K) {
    const int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    if (row >= M) return;
    float m = 0.0f;
    for (int k = 4 * lane; k < K; k += 128) {
        const float4 v = *reinterpret_cast<const float4*>(x + (size_t)row * K + k);
        m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
    for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) ea[row] = exponent_of(m);
}

__global__ void column_exponents(const float* __restrict__ w, int* __restrict__ ew, int K, int N) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    float m = 0.0f;
    for (int k = 0; k < K; ++k) m = fmaxf(m, fabsf(w[(size_t)k * N + n]));
    ew[n] = exponent_of(m);
}

// The image of W's B tiles (W [K, N] row-major, scaled by its columns' exponents): tile (n / BN, k / BK) of
// 2 * BK * BN fp16, hi then lo; in each, step s of the stage's BK / 16, group j of 8 columns, core matrix c
// (K 8 c .. 8 c + 7 of the step), column r of the group, value q of the core matrix's row. The step's K
// value 8 c + q is x's value PER t + 4 s + 2 c + q % 2 of the stage, t = q / 2 (PER = BK / 4): the thread
// t whose fragment holds that K loads x's PER contiguous values there. A thread per place of a tile's hi
// part, so that the writes are contiguous; W's reads are scattered, but W is small.
template <int BN, int BK>
__global__ void split_w(const float* __restrict__ w, const int* __restrict__ ew, __half* __restrict__ image,
                        int K, int N) {
    constexpr int PER = BK / 4;
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= K * N) return;
    const int tile = e / (BK * BN), at = e % (BK * BN);
    const int q = at % 8, r = (at / 8) % 8, c = (at / 64) % 2, j = (at / 128) % (BN / 8), s = at / (16 * BN);
    const int stages = K / BK, k = (tile % stages) * BK + PER * (q / 2) + 4 * s + 2 * c + q % 2;
    const int n = (tile / stages) * BN + j * 8 + r;
    const float v = ldexpf(w[(size_t)k * N + n], -ew[n]);
    const __half hi = __float2half_rn(v), lo = __float2half_rn(v - __half2float(hi));
    __half* const to = image + (size_t)tile * 2 * BK * BN + at;
    to[0] = hi;
    to[BK * BN] = lo;
}

// One block's tile of C[M, N] = X[M, K] @ W[K, N] (row-major; W given as its image, split_w, and its
// columns' exponents; x's rows' exponents by row_exponents): WG warpgroups' 64 rows from row m0 and BN
// columns from the image's tile column `tcol`, in wgmmas of NI columns, into the accumulators of the
// thread's warpgroup. A stage's wgmmas are committed as a group, one group in flight while the next is
// issued: two sets of split A in registers, and of x's values loaded ahead; STAGES stages of B in shared
// memory, STAGES - 2 of them loading ahead.
template <int BN, int BK, int WG, int NI, int STAGES>
struct Tile {
    static_assert(BN % NI == 0 && BK % 16 == 0 && BK <= 32 && STAGES >= 3, "shape");
    static constexpr int THREADS = 128 * WG, STAGE = 2 * BK * BN;  // fp16 of B's tile of a stage, hi and lo
    static constexpr int PER = BK / 4, STEPS = BK / 16, AHEAD = STAGES - 2;
    static constexpr int SMEM = STAGES * STAGE * (int)sizeof(__half);

    // x's PER values of the thread's row at a stage, scaled, as the A fragments of each step: hi and lo
    __device__ __forceinline__ static void split(const float4 (&a)[2][PER / 4], float scale0, float scale8,
                                                 uint32_t (&h)[STEPS][4], uint32_t (&l)[STEPS][4]) {
        const float* const v0 = reinterpret_cast<const float*>(a[0]);
        const float* const v8 = reinterpret_cast<const float*>(a[1]);
#pragma unroll
        for (int s = 0; s < STEPS; ++s)
#pragma unroll
            for (int f = 0; f < 4; ++f) {  // a0 (g, 2t), a1 (g + 8, 2t), a2 (g, 2t + 8), a3 (g + 8, 2t + 8)
                const float* const v = (f & 1) ? v8 : v0;
                const float scale = (f & 1) ? scale8 : scale0;
                const int at = 4 * s + 2 * (f >> 1);
                const float x0 = v[at] * scale, x1 = v[at + 1] * scale;
                const __half h0 = __float2half_rn(x0), h1 = __float2half_rn(x1);
                h[s][f] = pair(h0, h1);
                l[s][f] = pair(__float2half_rn(x0 - __half2float(h0)), __float2half_rn(x1 - __half2float(h1)));
            }
    }

    __device__ __forceinline__ static void run(float (&acc)[BN / NI][NI / 2], __half* smem, const float* x,
                                               const int* ea, const __half* image, int K, int m0, int tcol) {
        const int tid = threadIdx.x, warp = (tid % 128) / 32, lane = tid % 32;
        const int g = lane / 4, t = lane % 4;
        const int stages = K / BK;
        const __half* const tiles = image + (size_t)tcol * stages * STAGE;
        const int row = m0 + (tid / 128) * 64 + warp * 16 + g;
        const float* const xa = x + (size_t)row * K + PER * t;
        const float scale0 = ldexpf(1.0f, -ea[row]), scale8 = ldexpf(1.0f, -ea[row + 8]);
        auto load_stage = [&](int kb) {
            if (kb < stages) {
                const __half* const from = tiles + (size_t)kb * STAGE;
                __half* const to = smem + (kb % STAGES) * STAGE;
                for (int e = tid; e < STAGE / 8; e += THREADS) copy16(to + 8 * e, from + 8 * e);
            }
            asm volatile("cp.async.commit_group;\n" ::: "memory");
        };
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
            asm volatile("cp.async.wait_group %0;\n" ::"n"(AHEAD - 1) : "memory");
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            __syncthreads();  // stage kb is in shared memory; every wgmma of stage kb - 2 is done
            load_stage(kb + AHEAD);
            split(a, scale0, scale8, h, l);
            load_a(a, kb + 2);
            const __half* const b = smem + (kb % STAGES) * STAGE;
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
            for (int s = 0; s < STEPS; ++s)
#pragma unroll
                for (int i = 0; i < BN / NI; ++i) {
                    const __half* const bh = b + (size_t)s * BN * 16 + i * NI * 16;  // hi: step s, columns i*NI
                    const __half* const bl = bh + (size_t)BK * BN;
                    wgmma<NI>(acc[i], l[s], b_descriptor(bh));
                    wgmma<NI>(acc[i], h[s], b_descriptor(bl));
                    wgmma<NI>(acc[i], h[s], b_descriptor(bh));
                }
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        };
        for (int kb = 0; kb < AHEAD; ++kb) load_stage(kb);
        load_a(raw[0], 0);
        load_a(raw[1], 1);
        for (int kb = 0; kb < stages; kb += 2) {
            stage(kb, hi[0], lo[0], raw[0]);
            if (kb + 1 < stages) stage(kb + 1, hi[1], lo[1], raw[1]);
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    }

    // The thread's accumulators at their places in C, each times 2^(its row's exponent + its column's).
    __device__ __forceinline__ static void store(const float (&acc)[BN / NI][NI / 2], float* c, const int* ea,
                                                 const int* ew, int N, int m0, int n0) {
        const int tid = threadIdx.x, lane = tid % 32;
        const int row0 = m0 + (tid / 128) * 64 + ((tid % 128) / 32) * 16 + lane / 4, t = lane % 4;
        const int e0 = ea[row0], e8 = ea[row0 + 8];
#pragma unroll
        for (int i = 0; i < BN / NI; ++i)
#pragma unroll
            for (int v = 0; v < NI / 8; ++v) {
                const int col = n0 + i * NI + 8 * v + 2 * t;
                const int2 ec = *reinterpret_cast<const int2*>(ew + col);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int er = h ? e8 : e0;
                    *reinterpret_cast<float2*>(c + (size_t)(row0 + 8 * h) * N + col) =
                        make_float2(ldexpf(acc[i][4 * v + 2 * h], er + ec.x),
                                    ldexpf(acc[i][4 * v + 2 * h + 1], er + ec.y));
                }
            }
    }
};

// The same block's tile with its stages of B copied by one thread each as one bulk copy (no tensor map:
// the image is contiguous), its arrival signalled by an mbarrier (`full`) and its slot's release by each
// warp once its wgmmas on it are done (`empty`): no block-wide barrier in the loop.
template <int BN, int BK, int WG, int NI, int STAGES>
struct TileBulk {
    using Tl = Tile<BN, BK, WG, NI, STAGES>;
    static constexpr int THREADS = Tl::THREADS, STAGE = Tl::STAGE, PER = Tl::PER, STEPS = Tl::STEPS;
    static constexpr int AHEAD = STAGES - 2;
    static constexpr int SMEM = STAGES * STAGE * (int)sizeof(__half) + 2 * STAGES * 8;

    __device__ __forceinline__ static void run(float (&acc)[BN / NI][NI / 2], __half* smem, const float* x,
                                               const int* ea, const __half* image, int K, int m0, int tcol) {
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
        const __half* const tiles = image + (size_t)tcol * stages * STAGE;
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
                         ::"r"(full0 + 8 * slot), "n"(STAGE * 2) : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                         ::"r"(to), "l"(tiles + (size_t)kb * STAGE), "n"(STAGE * 2), "r"(full0 + 8 * slot)
                         : "memory");
        };
        const int row = m0 + (tid / 128) * 64 + warp * 16 + g;
        const float* const xa = x + (size_t)row * K + PER * t;
        const float scale0 = ldexpf(1.0f, -ea[row]), scale8 = ldexpf(1.0f, -ea[row + 8]);
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
            Tl::split(a, scale0, scale8, h, l);
            load_a(a, kb + 2);
            unsigned done = 0;
            while (!done)
                asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                             "selp.u32 %0, 1, 0, p;\n}\n"
                             : "=r"(done) : "r"(full0 + 8 * slot), "r"((kb / STAGES) & 1) : "memory");
            const __half* const b = smem + slot * STAGE;
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
            for (int s = 0; s < STEPS; ++s)
#pragma unroll
                for (int i = 0; i < BN / NI; ++i) {
                    const __half* const bh = b + (size_t)s * BN * 16 + i * NI * 16;
                    const __half* const bl = bh + (size_t)BK * BN;
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

template <int BN, int BK, int WG, int NI, int STAGES, bool BULK>
__global__ void __launch_bounds__(128 * WG, 1)
    gemm_tiles(int M, int N, int K, const float* __restrict__ x, const int* __restrict__ ea,
               const __half* __restrict__ image, const int* __restrict__ ew, float* __restrict__ c) {
    extern __shared__ __align__(128) __half smem[];
    float acc[BN / NI][NI / 2];
    const int m0 = blockIdx.y * 64 * WG;
    if constexpr (BULK) TileBulk<BN, BK, WG, NI, STAGES>::run(acc, smem, x, ea, image, K, m0, blockIdx.x);
    else Tile<BN, BK, WG, NI, STAGES>::run(acc, smem, x, ea, image, K, m0, blockIdx.x);
    Tile<BN, BK, WG, NI, STAGES>::store(acc, c, ea, ew, N, m0, blockIdx.x * BN);
}

// -- the route of today, for the comparison in one run: x's rows and W's columns scaled and split into
// fp16 copies along K ([x_hi, x_lo, x_hi] and [W_hi; W_hi; W_lo]: hi*HI + lo*HI + hi*LO), one fp16 GEMM
// over 3K into float32 (cuBLAS), and a pass that undoes the scales.
__global__ void split_x3(const float* __restrict__ x, const int* __restrict__ ea, __half* __restrict__ out,
                         int M, int K) {
    const size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)M * K) return;
    const size_t m = e / K, k = e % K;
    const float v = ldexpf(x[e], -ea[m]);
    const __half hi = __float2half_rn(v), lo = __float2half_rn(v - __half2float(hi));
    __half* const row = out + m * 3 * K;
    row[k] = hi;
    row[K + k] = lo;
    row[2 * K + k] = hi;
}

__global__ void split_w3(const float* __restrict__ w, const int* __restrict__ ew, __half* __restrict__ out,
                         int K, int N) {
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= K * N) return;
    const float v = ldexpf(w[e], -ew[e % N]);
    const __half hi = __float2half_rn(v), lo = __float2half_rn(v - __half2float(hi));
    out[e] = hi;
    out[(size_t)K * N + e] = hi;
    out[(size_t)2 * K * N + e] = lo;
}

__global__ void unscale(float* __restrict__ c, const int* __restrict__ ea, const int* __restrict__ ew, int M,
                        int N) {
    const size_t e = 4 * ((size_t)blockIdx.x * blockDim.x + threadIdx.x);
    if (e >= (size_t)M * N) return;
    const int m = (int)(e / N), n = (int)(e % N), er = ea[m];
    float4 v = *reinterpret_cast<float4*>(c + e);
    const int4 ec = *reinterpret_cast<const int4*>(ew + n);
    v.x = ldexpf(v.x, er + ec.x), v.y = ldexpf(v.y, er + ec.y), v.z = ldexpf(v.z, er + ec.z);
    v.w = ldexpf(v.w, er + ec.w);
    *reinterpret_cast<float4*>(c + e) = v;
}

// The largest error at sampled elements of C, relative to max|x row| * max|W column| * sqrt(K) there.
static double sampled_error(int M, int N, int K, const std::vector<float>& a, const std::vector<float>& b,
                            const std::vector<float>& c) {
    std::mt19937 rng(1);
    double worst = 0.0;
    for (int s = 0; s < 3000; ++s) {
        const int i = rng() % M, j = rng() % N;
        double sum = 0.0, ma = 0.0, mb = 0.0;
        for (int k = 0; k < K; ++k) {
            sum += (double)a[(size_t)i * K + k] * b[(size_t)k * N + j];
            ma = std::max(ma, (double)std::fabs(a[(size_t)i * K + k]));
            mb = std::max(mb, (double)std::fabs(b[(size_t)k * N + j]));
        }
        worst = std::max(worst, std::fabs(sum - c[(size_t)i * N + j]) / (ma * mb * std::sqrt((double)K)));
    }
    return worst;
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

constexpr int M = 6400, K = 512, N = 2048;  // the LSTM's input projection at T=100, B=64, I=H=512

struct Buffers {
    float *x, *w, *c;
    int *ea, *ew;
    __half *image, *x3, *w3;
};

template <int BN, int BK, int WG, int NI, int STAGES, bool BULK>
static void variant(const Buffers& d, const std::vector<float>& x, const std::vector<float>& w, float today_ms) {
    const int smem = BULK ? TileBulk<BN, BK, WG, NI, STAGES>::SMEM : Tile<BN, BK, WG, NI, STAGES>::SMEM;
    auto kernel = gemm_tiles<BN, BK, WG, NI, STAGES, BULK>;
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 128 * WG, smem));
    const dim3 grid(N / BN, M / (64 * WG));
    auto image = [&] {
        column_exponents<<<(N + 255) / 256, 256>>>(d.w, d.ew, K, N);
        split_w<BN, BK><<<(K * N + 255) / 256, 256>>>(d.w, d.ew, d.image, K, N);
    };
    auto gemm = [&] {
        row_exponents<<<(M * 32 + 255) / 256, 256>>>(d.x, d.ea, M, K);
        kernel<<<grid, 128 * WG, smem>>>(M, N, K, d.x, d.ea, d.image, d.ew, d.c);
    };
    CHECK(cudaMemset(d.c, 0, (size_t)M * N * 4));
    image();
    gemm();
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::vector<float> c((size_t)M * N);
    CHECK(cudaMemcpy(c.data(), d.c, c.size() * 4, cudaMemcpyDeviceToHost));
    const double err = sampled_error(M, N, K, x, w, c);
    const bool ok = err < 1e-6;
    std::printf("%s BN=%3d BK=%2d WG=%d NI=%3d stages=%d: %4d blocks of %3d threads, %6d bytes, %d a SM | "
                "error %.1e %s", BULK ? "bulk copies" : "cp.async   ", BN, BK, WG, NI, STAGES, grid.x * grid.y,
                128 * WG, smem, per_sm, err, ok ? "ok" : "WRONG");
    if (!ok) {
        std::printf("\n");
        return;
    }
    const float im = median_ms(image), g = median_ms(gemm);
    std::printf(" | W's image %.4f ms; rows' exponents + GEMM %.4f ms (today's route %.4f: %.2fx)\n", im, g,
                today_ms, today_ms / g);
}

int main() {
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("%s, %d SMs; the LSTM's input projection x[%d, %d] @ W[%d, %d], float32's accuracy from three "
                "fp16 products\n", prop.name, prop.multiProcessorCount, M, K, K, N);
    std::vector<float> x((size_t)M * K), w((size_t)K * N);
    std::mt19937 rng(0);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (size_t i = 0; i < x.size(); ++i) x[i] = normal(rng) * ((i / K) % 7 == 0 ? 1e-3f : 1.0f);  // rows apart
    for (float& v : w) v = normal(rng) / std::sqrt((float)K);
    Buffers d;
    CHECK(cudaMalloc(&d.x, x.size() * 4));
    CHECK(cudaMalloc(&d.w, w.size() * 4));
    CHECK(cudaMalloc(&d.c, (size_t)M * N * 4));
    CHECK(cudaMalloc(&d.ea, M * 4));
    CHECK(cudaMalloc(&d.ew, N * 4));
    CHECK(cudaMalloc(&d.image, w.size() * 2 * 2));
    CHECK(cudaMalloc(&d.x3, x.size() * 3 * 2));
    CHECK(cudaMalloc(&d.w3, w.size() * 3 * 2));
    CHECK(cudaMemcpy(d.x, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d.w, w.data(), w.size() * 4, cudaMemcpyHostToDevice));

    cublasHandle_t handle;
    cublasCreate(&handle);
    const float one = 1.0f, zero = 0.0f;
    // row-major C = A B is column-major C^T = B^T A^T
    auto sgemm = [&] {
        cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, N, M, K, &one, d.w, N, d.x, K, &zero, d.c, N);
    };
    auto w_copies = [&] {
        column_exponents<<<(N + 255) / 256, 256>>>(d.w, d.ew, K, N);
        split_w3<<<(K * N + 255) / 256, 256>>>(d.w, d.ew, d.w3, K, N);
    };
    auto x_copies = [&] {
        row_exponents<<<(M * 32 + 255) / 256, 256>>>(d.x, d.ea, M, K);
        split_x3<<<(unsigned)(((size_t)M * K + 255) / 256), 256>>>(d.x, d.ea, d.x3, M, K);
    };
    auto f16_gemm = [&] {
        cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, N, M, 3 * K, &one, d.w3, CUDA_R_16F, N, d.x3, CUDA_R_16F,
                     3 * K, &zero, d.c, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    };
    auto the_unscale = [&] {
        unscale<<<(unsigned)(((size_t)M * N / 4 + 255) / 256), 256>>>(d.c, d.ea, d.ew, M, N);
    };
    std::vector<float> c((size_t)M * N);
    sgemm();
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(c.data(), d.c, c.size() * 4, cudaMemcpyDeviceToHost));
    const double sgemm_err = sampled_error(M, N, K, x, w, c);
    w_copies();
    x_copies();
    f16_gemm();
    the_unscale();
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(c.data(), d.c, c.size() * 4, cudaMemcpyDeviceToHost));
    const double today_err = sampled_error(M, N, K, x, w, c);
    const float sgemm_ms = median_ms(sgemm), w_ms = median_ms(w_copies), x_ms = median_ms(x_copies);
    const float gemm_ms = median_ms(f16_gemm), unscale_ms = median_ms(the_unscale);
    const float today_ms = median_ms([&] {
        x_copies();
        f16_gemm();
        the_unscale();
    });
    std::printf("cuBLAS float32 GEMM %.4f ms (error %.1e)\n", sgemm_ms, sgemm_err);
    std::printf("today's route (error %.1e): x's exponents and copies %.4f ms, cuBLAS's fp16 GEMM over 3K %.4f, "
                "the pass %.4f; together %.4f ms (W's copies, once per change of W: %.4f)\n", today_err, x_ms,
                gemm_ms, unscale_ms, today_ms, w_ms);

    variant<256, 32, 1, 256, 4, false>(d, x, w, today_ms);
    variant<256, 32, 2, 256, 4, false>(d, x, w, today_ms);
    variant<256, 32, 2, 256, 4, true>(d, x, w, today_ms);
    variant<256, 16, 2, 256, 6, true>(d, x, w, today_ms);
    variant<128, 32, 1, 128, 4, false>(d, x, w, today_ms);
    variant<128, 32, 2, 128, 4, true>(d, x, w, today_ms);
    variant<128, 16, 2, 128, 6, true>(d, x, w, today_ms);
    cublasDestroy(handle);
    return 0;
}
