// The warpgroup GEMM (sm_90a): C[m, n] (+)= x[m, k] @ W with float32's accuracy on TF32 tensor cores, x split
// into TF32 pieces as it is loaded, W through its image (see codegen/cuda_wgmma.py). The module that
// compiles it defines CF_COLUMNS (a block's columns of C), CF_STAGE_K (values of K in a stage), CF_STAGES
// and CF_SMEM (its dynamic shared memory); the wgmma wrapper and the fence below are written for 256
// columns and stages of 32.

#include "tf32.cuh"

static_assert(CF_COLUMNS == 256 && CF_STAGE_K == 32, "cf_wgmma_n256 and cf_wgmma_fence are for these");
#define CF_STAGE (2 * CF_STAGE_K * CF_COLUMNS)  // floats of a stage of B: hi, then lo
#define CF_PER (CF_STAGE_K / 4)                 // values of x a thread holds per row and stage
#define CF_STEPS (CF_STAGE_K / 8)               // wgmmas of K = 8 per stage and piece

// wgmma of 64 x 256 x 8 in TF32, A from registers, B from shared memory, accumulating into d.
__device__ __forceinline__ void cf_wgmma_n256(float* d, const unsigned* a, unsigned long long b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, "
        "%108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, "
        "%120, %121, %122, %123, %124, %125, %126, %127"
        "}, {%128, %129, %130, %131}, %132, p, 1, 1;\n}\n"
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
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// wgmma.fence with a stage's A fragments as its operands, so that the compiler splits x before it
// (not between the wgmmas, where ptxas would have to fence again).
__device__ __forceinline__ void cf_wgmma_fence(unsigned (&h)[CF_STEPS][4], unsigned (&l)[CF_STEPS][4]) {
    asm volatile("wgmma.fence.sync.aligned;\n"
                 : "+r"(h[0][0]), "+r"(h[0][1]), "+r"(h[0][2]), "+r"(h[0][3]), "+r"(h[1][0]), "+r"(h[1][1]),
                   "+r"(h[1][2]), "+r"(h[1][3]), "+r"(h[2][0]), "+r"(h[2][1]), "+r"(h[2][2]), "+r"(h[2][3]),
                   "+r"(h[3][0]), "+r"(h[3][1]), "+r"(h[3][2]), "+r"(h[3][3]), "+r"(l[0][0]), "+r"(l[0][1]),
                   "+r"(l[0][2]), "+r"(l[0][3]), "+r"(l[1][0]), "+r"(l[1][1]), "+r"(l[1][2]), "+r"(l[1][3]),
                   "+r"(l[2][0]), "+r"(l[2][1]), "+r"(l[2][2]), "+r"(l[2][3]), "+r"(l[3][0]), "+r"(l[3][1]),
                   "+r"(l[3][2]), "+r"(l[3][3])
                 :: "memory");
}

// A shared-memory matrix descriptor of a K-major B tile with no swizzle: core matrices of 8 columns of
// C by 4 TF32 values of K (8 rows of 16 bytes), the two of a wgmma's K 128 bytes apart (the leading
// byte offset) and the next 8 columns 256 bytes on (the stride byte offset).
__device__ __forceinline__ unsigned long long cf_b_descriptor(const float* tile) {
    const unsigned long long at = (unsigned)__cvta_generic_to_shared(tile);
    return ((at & 0x3FFFF) >> 4) | ((unsigned long long)(128 >> 4) << 16)
           | ((unsigned long long)(256 >> 4) << 32);
}

// W's image: tile (n / CF_COLUMNS, k / CF_STAGE_K) of CF_STAGE floats, hi then lo; in each, the step s
// of the stage's CF_STEPS, the group j of 8 columns, the half h of the step's 8 values of K, column r
// of the group, value q of a core matrix's row. A stage's value kk = k % CF_STAGE_K is held by the thread
// with t = kk / CF_PER (which loads x's CF_PER contiguous values there), as its value 2 s + h. A thread
// per place of a tile's hi part, so that the writes are contiguous (W's reads are not, but W is small).
// W is [k, n] with row length ldw, or [n, k] where trans_w.
extern "C" __global__ void __launch_bounds__(256) cf_wgmma_image(
    float* __restrict__ image, const float* __restrict__ w, int n, int k, int ldw, int trans_w)
{
    const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (long long)n * k) return;
    const int tile = (int)(e / (CF_STAGE / 2)), at = (int)(e % (CF_STAGE / 2));
    const int q = at % 4, r = at / 4 % 8, h = at / 32 % 2, j = at / 64 % (CF_COLUMNS / 8);
    const int s = at / (8 * CF_COLUMNS), stages = k / CF_STAGE_K;
    const int kk = (tile % stages) * CF_STAGE_K + q * CF_PER + 2 * s + h;
    const int nn = (tile / stages) * CF_COLUMNS + j * 8 + r;
    float hi, lo;
    cf_tf32_pieces(trans_w ? w[(size_t)nn * ldw + kk] : w[(size_t)kk * ldw + nn], hi, lo);
    float* const to = image + (size_t)tile * CF_STAGE + at;
    to[0] = hi;
    to[CF_STAGE / 2] = lo;
}

__device__ __forceinline__ void cf_wait(unsigned barrier, unsigned parity) {
    unsigned done = 0;
    while (!done)
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(barrier), "r"(parity) : "memory");
}

// C[m, n] = x[m, k] @ W (or += where `accumulate`), plus bias[n] in every row where `bias` is not null, W
// as its image; x's rows lda floats apart, 16-byte aligned, the bias 8-byte aligned. A block of 256
// threads per 128 rows (the last ones clamped to row m - 1 to load, not stored) by CF_COLUMNS columns,
// CF_SMEM bytes of dynamic shared memory.
// Where `lengths` is not null, x's rows are steps of `batch` rows of a batch whose rows have lengths of
// their own (row t * batch + b is row b at step first_step + t; row b's length is lengths[b * lengths_ld],
// a whole number; batch a multiple of 16), and a row past its length is taken to hold zeros (as a
// PackedSequence's padding does; the step's mask discards it, whatever it holds): a block then holds 8
// steps of 16 rows of the batch (a warp a step), and where every one of its 16 rows has ended before
// its first step, it multiplies nothing and stores what zero rows give. With the rows longest first, as
// a PackedSequence's are, that is a third of the blocks at lengths uniform in 10..100, B=64.
extern "C" __global__ void __launch_bounds__(256, 1) cf_wgmma_gemm(
    float* __restrict__ c, const float* __restrict__ x, const float* __restrict__ image,
    const float* __restrict__ bias, int m, int n, int k, int lda, int ldc, int accumulate,
    const float* __restrict__ lengths, int lengths_ld, int batch, int first_step)
{
    extern __shared__ __align__(128) float cf_smem[];
    const int tid = threadIdx.x, lane = tid % 32, g = lane / 4, t = lane % 4;
    int row = blockIdx.y * 128 + (tid / 32) * 16 + g;  // the thread's rows: row and row + 8
    bool ended = false;  // (the same in every thread of the block)
    if (lengths) {
        const int groups = batch / 16, step = blockIdx.y / groups * 8, first = blockIdx.y % groups * 16;
        float longest = 0.0f;
        #pragma unroll
        for (int i = 0; i < 16; ++i)
            longest = fmaxf(longest, __ldg(lengths + (size_t)(first + i) * lengths_ld));
        ended = longest <= (float)(first_step + step);
        row = (step + tid / 32) * batch + first + g;
    }
    const int stages = ended ? 0 : k / CF_STAGE_K;  // (a block whose rows have all ended runs none)
    const float* const tiles = image + (size_t)blockIdx.x * (k / CF_STAGE_K) * CF_STAGE;
    const float* const x0 = x + (size_t)min(row, m - 1) * lda + CF_PER * t;
    const float* const x8 = x + (size_t)min(row + 8, m - 1) * lda + CF_PER * t;
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
                     ::"r"(full + 8 * slot), "n"(CF_STAGE * 4) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
                     "[%0], [%1], %2, [%3];\n"
                     ::"r"((unsigned)__cvta_generic_to_shared(cf_smem + slot * CF_STAGE)),
                     "l"(tiles + (size_t)kb * CF_STAGE), "n"(CF_STAGE * 4), "r"(full + 8 * slot) : "memory");
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
    float acc[CF_COLUMNS / 2];
    #pragma unroll
    for (int j = 0; j < CF_COLUMNS / 2; ++j) acc[j] = 0.0f;
    unsigned hi[2][CF_STEPS][4], lo[2][CF_STEPS][4];
    // One stage: the next one's copy started, x's values split into the A fragments (a0 row g, k-slot
    // t; a1 row g + 8; a2 and a3 k-slot t + 4), then, B's stage in shared memory, three wgmmas per step
    // committed as a group; at the end the group before it is done, and its slot released.
    const auto stage = [&](int kb, unsigned (&h)[CF_STEPS][4], unsigned (&l)[CF_STEPS][4],
                           float4 (&a)[2][CF_PER / 4]) {
        if (tid == 0) load_stage(kb + CF_STAGES - 2);
        #pragma unroll
        for (int s = 0; s < CF_STEPS; ++s)
            #pragma unroll
            for (int f = 0; f < 4; ++f) {
                const float4& r4 = a[f & 1][(2 * s + (f >> 1)) / 4];
                const int at = (2 * s + (f >> 1)) % 4;
                float vh, vl;
                cf_tf32_pieces(at == 0 ? r4.x : at == 1 ? r4.y : at == 2 ? r4.z : r4.w, vh, vl);
                h[s][f] = __float_as_uint(vh);
                l[s][f] = __float_as_uint(vl);
            }
        load_x(a, kb + 2);
        const int slot = kb % CF_STAGES;
        cf_wait(full + 8 * slot, (kb / CF_STAGES) & 1);
        const float* const b = cf_smem + slot * CF_STAGE;
        cf_wgmma_fence(h, l);
        #pragma unroll
        for (int s = 0; s < CF_STEPS; ++s) {
            const float* const b_hi = b + s * CF_COLUMNS * 8;
            const float* const b_lo = b_hi + CF_STEPS * CF_COLUMNS * 8;
            cf_wgmma_n256(acc, l[s], cf_b_descriptor(b_hi));  // the small products first
            cf_wgmma_n256(acc, h[s], cf_b_descriptor(b_lo));
            cf_wgmma_n256(acc, h[s], cf_b_descriptor(b_hi));
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
    // acc[4 v + 2 h + i] is C's (row + 8 h, 8 v + 2 t + i) in the block's columns
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
        if (row + 8 * h >= m) continue;
        float* const out = c + (size_t)(row + 8 * h) * ldc + blockIdx.x * CF_COLUMNS + 2 * t;
        #pragma unroll
        for (int v = 0; v < CF_COLUMNS / 8; ++v) {
            float2 sum = make_float2(acc[4 * v + 2 * h], acc[4 * v + 2 * h + 1]);
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
