// A candidate for the warpgroup GEMM (cellfuse/resources/cuda/wgmma.cuh, today 3xTF32): C[m, n] (+)= x[m, k]
// @ W as three fp16 products on wgmma, with the scales and pieces of the split copies' route (f16x3.cuh:
// x's rows and W's columns scaled by powers of two into [2^14, 2^15), lo pieces times 2^11), the small
// products (lo*HI, hi*LO) summed in an accumulator apart from hi*HI, and the scales undone in the
// epilogue with the bias. Built as a drop-in for wgmma.cuh (the same launch shape, W's image of hi and
// lo pieces then its columns' maxima, x's rows' maxima found by a kernel of their own first) and run by
// wgmma_f16x3_probe.py, which says where its time goes. Right (the package's GPU tests of the warpgroup
// GEMM passed with it: every element within 2^-20 of the sum of its terms' magnitudes, rows 2^-60 to
// 2^60 and columns 2^-10 to 2^10 apart), but slower than the copies and cuBLAS at the LSTM's shapes:
// its epilogue (ldexpf per element) takes a fifth of its time (results page 2026-11-30-c).
// Compiled with cellfuse's f16x3.cuh in front and CF_COLUMNS 128, CF_STAGE_K 32, CF_STAGES, CF_SMEM
// defined, as the probe does.

#include "f16x3.cuh"

static_assert(CF_COLUMNS == 128 && CF_STAGE_K == 32, "cf_wgmma_n128, cf_wgmma_fence and the image are for these");
#define CF_STAGE (2 * CF_STAGE_K * CF_COLUMNS)  // fp16 of a stage of B: hi, then lo
#define CF_PER (CF_STAGE_K / 4)                 // values of x a thread holds per row and stage
#define CF_STEPS (CF_STAGE_K / 16)              // wgmmas of K = 16 per stage and product

// wgmma of 64 x 128 x 16 in fp16 into float32, A from registers (four b32 of two fp16 a thread: rows g and
// g + 8 of its warp's 16, K pairs 2t and 2t + 8 of the 16), B from shared memory (K-major), accumulating
// into d (64 a thread).
__device__ __forceinline__ void cf_wgmma_n128(float* d, const unsigned* a, unsigned long long b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
          "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
          "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
          "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// wgmma.fence with a stage's A fragments as its operands, so that the compiler splits x before it
// (not between the wgmmas, where ptxas would have to fence again).
__device__ __forceinline__ void cf_wgmma_fence(unsigned (&h)[CF_STEPS][4], unsigned (&l)[CF_STEPS][4]) {
    asm volatile("wgmma.fence.sync.aligned;\n"
                 : "+r"(h[0][0]), "+r"(h[0][1]), "+r"(h[0][2]), "+r"(h[0][3]), "+r"(h[1][0]), "+r"(h[1][1]),
                   "+r"(h[1][2]), "+r"(h[1][3]), "+r"(l[0][0]), "+r"(l[0][1]), "+r"(l[0][2]), "+r"(l[0][3]),
                   "+r"(l[1][0]), "+r"(l[1][1]), "+r"(l[1][2]), "+r"(l[1][3])
                 :: "memory");
}

// A shared-memory matrix descriptor of a K-major B tile with no swizzle: core matrices of 8 columns of
// C by 8 fp16 values of K (8 rows of 16 bytes), the two of a wgmma's K 128 bytes apart (the leading
// byte offset) and the next 8 columns 256 bytes on (the stride byte offset).
__device__ __forceinline__ unsigned long long cf_b_descriptor(const __half* tile) {
    const unsigned long long at = (unsigned)__cvta_generic_to_shared(tile);
    return ((at & 0x3FFFF) >> 4) | ((unsigned long long)(128 >> 4) << 16)
           | ((unsigned long long)(256 >> 4) << 32);
}

// W's columns' largest magnitudes (NaN left out), as n floats after the image's 2 k n fp16.
__device__ __forceinline__ float* cf_wgmma_column_maxima(__half* image, int n, int k) {
    return reinterpret_cast<float*>(image + (size_t)2 * n * k);
}

// W's columns' largest magnitudes (NaN left out), a thread a column (W's rows are read across the
// threads where W is [k, n]). W is [k, n] with row length ldw, or [n, k] where trans_w.
extern "C" __global__ void __launch_bounds__(256) cf_wgmma_columns(
    __half* __restrict__ image, const float* __restrict__ w, int n, int k, int ldw, int trans_w)
{
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= n) return;
    float m = 0.0f;
    for (int kk = 0; kk < k; ++kk) m = fmaxf(m, fabsf(trans_w ? w[(size_t)col * ldw + kk] : w[(size_t)kk * ldw + col]));
    cf_wgmma_column_maxima(image, n, k)[col] = m;
}

// W's image (its columns' maxima found first, cf_wgmma_columns): each value, scaled by its column's
// cf_f16x3_scale, as hi and lo pieces (cf_split_f16x3's) at their places: tile (n / CF_COLUMNS,
// k / CF_STAGE_K) of CF_STAGE fp16, hi then lo; in each, step s of the stage's CF_STEPS, group j of 8
// columns, core matrix c (K 8 c to 8 c + 7 of the step), column r of the group, value q of the core
// matrix's row. The step's K 8 c + q is the stage's value CF_PER (q / 2) + 4 s + 2 c + q % 2: the thread
// t = q / 2, whose A fragments hold that K, loads x's CF_PER contiguous values there. A thread per place
// of a tile's hi part, so that the writes are contiguous (W's reads are not, but W is small).
extern "C" __global__ void __launch_bounds__(256) cf_wgmma_image(
    __half* __restrict__ image, const float* __restrict__ w, int n, int k, int ldw, int trans_w)
{
    const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (long long)n * k) return;
    const int tile = (int)(e / (CF_STAGE / 2)), at = (int)(e % (CF_STAGE / 2));
    const int q = at % 8, r = at / 8 % 8, c = at / 64 % 2, j = at / 128 % (CF_COLUMNS / 8);
    const int s = at / (16 * CF_COLUMNS), stages = k / CF_STAGE_K;
    const int kk = (tile % stages) * CF_STAGE_K + CF_PER * (q / 2) + 4 * s + 2 * c + q % 2;
    const int col = (tile / stages) * CF_COLUMNS + j * 8 + r;
    const float v = (trans_w ? w[(size_t)col * ldw + kk] : w[(size_t)kk * ldw + col])
                    * cf_f16x3_scale(cf_wgmma_column_maxima(image, n, k)[col]);
    unsigned hi, lo;
    cf_split_f16x3(v, 0.0f, hi, lo);
    __half* const to = image + (size_t)tile * CF_STAGE + at;
    to[0] = __ushort_as_half((unsigned short)hi);
    to[CF_STAGE / 2] = __ushort_as_half((unsigned short)lo);
}

// The largest magnitude (NaN left out) of each of x's rows, a warp a row: the scales of its pieces.
// x's rows lda floats apart, 16-byte aligned, k a multiple of 4.
extern "C" __global__ void __launch_bounds__(256) cf_wgmma_row_maxima(
    float* __restrict__ maxima, const float* __restrict__ x, int m, int k, int lda)
{
    const int row = (int)(((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32), lane = threadIdx.x % 32;
    if (row >= m) return;
    const float4* const from = reinterpret_cast<const float4*>(x + (size_t)row * lda);
    float v = 0.0f;
    for (int i = lane; i < k / 4; i += 32) v = fmaxf(v, cf_abs_max(from[i]));
    v = cf_warp_max(v);
    if (lane == 0) maxima[row] = v;
}

__device__ __forceinline__ void cf_wait(unsigned barrier, unsigned parity) {
    unsigned done = 0;
    while (!done)
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(barrier), "r"(parity) : "memory");
}

// C[m, n] = x[m, k] @ W (or += where `accumulate`), plus bias[n] in every row where `bias` is not null, W
// as its image, x's rows' largest magnitudes in x_maxima (cf_wgmma_row_maxima); x's rows lda floats
// apart, 16-byte aligned, the bias 8-byte aligned. A block of 256 threads per 128 rows (the last ones
// clamped to row m - 1 to load, not stored) by CF_COLUMNS columns, CF_SMEM bytes of dynamic shared
// memory. Each product is lo*HI + hi*LO + hi*HI, the first two (lo is 2^11 times its piece) summed apart
// from the third and both unscaled in the epilogue: the accuracy of the split copies' route
// (gemm_splits.cuh) with none of its copies or its pass.
extern "C" __global__ void __launch_bounds__(256, 1) cf_wgmma_gemm(
    float* __restrict__ c, const float* __restrict__ x, const float* __restrict__ x_maxima,
    __half* __restrict__ image, const float* __restrict__ bias, int m, int n, int k, int lda, int ldc,
    int accumulate)
{
    extern __shared__ __align__(128) __half cf_smem[];
    const int tid = threadIdx.x, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int row = blockIdx.y * 128 + (tid / 32) * 16 + g;  // the thread's rows: row and row + 8
    const int r0 = min(row, m - 1), r8 = min(row + 8, m - 1);
    const int stages = k / CF_STAGE_K;
    const __half* const tiles = image + (size_t)blockIdx.x * stages * CF_STAGE;
    const float* const x0 = x + (size_t)r0 * lda + CF_PER * t;
    const float* const x8 = x + (size_t)r8 * lda + CF_PER * t;
    const float scale0 = cf_f16x3_scale(x_maxima[r0]), scale8 = cf_f16x3_scale(x_maxima[r8]);
    // each slot's mbarriers, after the slots: `full` (its stage has arrived), `empty` (every warp is done
    // with it)
    const unsigned full = (unsigned)__cvta_generic_to_shared(cf_smem + CF_STAGES * CF_STAGE);
    const unsigned empty = full + 8 * CF_STAGES;
    if (tid == 0)
        for (int s = 0; s < CF_STAGES; ++s) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(full + 8 * s) : "memory");
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 8;\n" ::"r"(empty + 8 * s) : "memory");
        }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    __syncthreads();
    const auto load_stage = [&](int kb) {  // by thread 0: B's stage kb, once its slot's last stage is done
        if (kb >= stages) return;
        const int slot = kb % CF_STAGES;
        if (kb >= CF_STAGES) cf_wait(empty + 8 * slot, (kb / CF_STAGES - 1) & 1);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                     ::"r"(full + 8 * slot), "n"(CF_STAGE * 2) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
                     "[%0], [%1], %2, [%3];\n"
                     ::"r"((unsigned)__cvta_generic_to_shared(cf_smem + slot * CF_STAGE)),
                     "l"(tiles + (size_t)kb * CF_STAGE), "n"(CF_STAGE * 2), "r"(full + 8 * slot) : "memory");
    };
    float4 raw[2][2][CF_PER / 4];  // x's values of the thread's rows at two stages, as loaded
    const auto load_x = [&](float4 (&to)[2][CF_PER / 4], int kb) {
        if (kb < stages)
            #pragma unroll
            for (int v = 0; v < CF_PER / 4; ++v) {
                to[0][v] = __ldg(reinterpret_cast<const float4*>(x0 + kb * CF_STAGE_K) + v);
                to[1][v] = __ldg(reinterpret_cast<const float4*>(x8 + kb * CF_STAGE_K) + v);
            }
    };
    float big[CF_COLUMNS / 2], small[CF_COLUMNS / 2];  // hi*HI; lo*HI + hi*LO (2^11 times theirs)
    #pragma unroll
    for (int j = 0; j < CF_COLUMNS / 2; ++j) big[j] = small[j] = 0.0f;
    unsigned hi[2][CF_STEPS][4], lo[2][CF_STEPS][4];
    // One stage: the next one's copy started, x's values scaled and split into the A fragments (a0 row
    // g, K pair 2t; a1 row g + 8; a2 and a3 the pair 2t + 8), then, B's stage in shared memory, three
    // wgmmas per step committed as a group; at the end the group before it is done, and its slot released.
    const auto stage = [&](int kb, unsigned (&h)[CF_STEPS][4], unsigned (&l)[CF_STEPS][4],
                           float4 (&a)[2][CF_PER / 4]) {
        if (tid == 0) load_stage(kb + CF_STAGES - 2);
        #pragma unroll
        for (int s = 0; s < CF_STEPS; ++s)
            #pragma unroll
            for (int f = 0; f < 4; ++f) {
                const float* const v = reinterpret_cast<const float*>(a[f & 1]) + 4 * s + 2 * (f >> 1);
                const float scale = (f & 1) ? scale8 : scale0;
                cf_split_f16x3(v[0] * scale, v[1] * scale, h[s][f], l[s][f]);
            }
        load_x(a, kb + 2);
        const int slot = kb % CF_STAGES;
        cf_wait(full + 8 * slot, (kb / CF_STAGES) & 1);
        const __half* const b = cf_smem + slot * CF_STAGE;
        cf_wgmma_fence(h, l);
        #pragma unroll
        for (int s = 0; s < CF_STEPS; ++s) {
            const __half* const b_hi = b + s * 16 * CF_COLUMNS;
            const __half* const b_lo = b_hi + CF_STAGE / 2;
            cf_wgmma_n128(small, l[s], cf_b_descriptor(b_hi));
            cf_wgmma_n128(small, h[s], cf_b_descriptor(b_lo));
            cf_wgmma_n128(big, h[s], cf_b_descriptor(b_hi));
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        if (kb > 0 && lane == 0)
            asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n"
                         ::"r"(empty + 8 * ((kb - 1) % CF_STAGES)) : "memory");
    };
    if (tid == 0)
        for (int kb = 0; kb < CF_STAGES - 2; ++kb) load_stage(kb);
    load_x(raw[0], 0);
    load_x(raw[1], 1);
    for (int kb = 0; kb < stages; kb += 2) {  // two at a time: the registers of each set are named
        stage(kb, hi[0], lo[0], raw[0]);
        if (kb + 1 < stages) stage(kb + 1, hi[1], lo[1], raw[1]);
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    // big[4 v + 2 h + i] is C's (row + 8 h, 8 v + 2 t + i) in the block's columns, times 2^(its row's
    // exponent + its column's); both undone at once (one at a time, the first could leave float32's
    // range that the result does not)
    const float* const w_maxima = cf_wgmma_column_maxima(image, n, k) + blockIdx.x * CF_COLUMNS + 2 * t;
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
        if (row + 8 * h >= m) continue;
        const int e = cf_f16x3_exponent(x_maxima[h ? r8 : r0]);
        float* const out = c + (size_t)(row + 8 * h) * ldc + blockIdx.x * CF_COLUMNS + 2 * t;
        #pragma unroll
        for (int v = 0; v < CF_COLUMNS / 8; ++v) {
            const float2 wm = *reinterpret_cast<const float2*>(w_maxima + 8 * v);
            const int at = 4 * v + 2 * h;
            float2 sum = make_float2(
                ldexpf(big[at] + small[at] * (1.0f / 2048.0f), -(e + cf_f16x3_exponent(wm.x))),
                ldexpf(big[at + 1] + small[at + 1] * (1.0f / 2048.0f), -(e + cf_f16x3_exponent(wm.y))));
            if (bias) {
                const float2 b = *reinterpret_cast<const float2*>(bias + blockIdx.x * CF_COLUMNS + 2 * t + 8 * v);
                sum.x += b.x;
                sum.y += b.y;
            }
            if (accumulate) {
                const float2 old = *reinterpret_cast<const float2*>(out + 8 * v);
                sum.x += old.x;
                sum.y += old.y;
            }
            *reinterpret_cast<float2*>(out + 8 * v) = sum;
        }
    }
}
