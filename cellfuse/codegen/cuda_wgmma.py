"""A GEMM with float32's accuracy on the warpgroup tensor-core instructions of sm_90a (wgmma), which
splits its operands as it loads them: the alternative to `cf_split_tf32x3`'s copies and cuBLAS's TF32
GEMM over 3K for a hoisted GEMM, the faster of the two measured per shape (see gpu_runtime.wgmma_gemms).

C[m, n] (+)= x[m, k] @ W[k, n], x row-major. W goes first into an image of the GEMM's B tiles, TF32 hi
and lo (`cf_wgmma_image`, W's 2 * k * n floats); x stays float32 where it is: each thread loads its
rows' elements of a stage into registers and splits them there, as the A fragments of the wgmmas. Each
product is lo*hi + hi*lo + hi*hi, summed in float32. K is permuted within each stage, on both sides
alike, so that a thread's elements of x in a stage are contiguous. Measured on an H100 for IndRNN's input
GEMM (6400 x 512 x 512): about 0.042 ms for the image and the GEMM (ncu: 0.004 and 0.038), against 0.062
for the splits (0.022 in a CUDA graph) and cuBLASLt's GEMM over 3K (0.040); the variants of
benchmarks/tf32x3_wgmma_probe.cu chose these tiles.

Blocks of two warpgroups own 128 rows by 256 columns of C; B's stages of 32 values of K go through
shared memory, each one bulk copy (the tensor memory accelerator's, from the image, which is
contiguous) issued by one thread, one stage ahead; mbarriers say when a stage has arrived and when every
warp is done with its slot, so no block-wide barrier stops the loop. A stage's wgmmas run while the
next one's are issued. (In the probe, cp.async by every thread with a barrier per stage of 16 took
0.042-0.044 ms where this took 0.040-0.042.)
"""

from __future__ import annotations

from .cuda_kernels import TF32_PIECES

COLUMNS = 256  # of C, a block's
ROWS = 128  # of C, a block's: two warpgroups of 64
STAGE_K = 32  # values of K in a stage of shared memory
STAGES = 3
THREADS = 2 * 128
SMEM_BYTES = STAGES * 2 * STAGE_K * COLUMNS * 4 + 2 * STAGES * 8  # the stages, then their mbarriers


def wgmma_shape_fits(n: int, k: int, trans_a: bool) -> bool:
    """Whether a GEMM's shape suits the kernel: x not transposed, whole tiles of columns and stages of K
    (the rows may end anywhere)."""
    return not trans_a and n % COLUMNS == 0 and k % STAGE_K == 0 and n > 0 and k > 0


def gemm_grid(m: int, n: int) -> tuple[int, int]:
    return n // COLUMNS, (m + ROWS - 1) // ROWS


def _wgmma_wrapper() -> str:
    """wgmma of 64 x 256 x 8 in TF32, A from registers, B from shared memory, accumulating into d."""
    acc = COLUMNS // 2
    regs = ", ".join(f"%{i}" for i in range(acc))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(acc))
    return (
        "__device__ __forceinline__ void cf_wgmma_n256(float* d, const unsigned* a, unsigned long long b) {\n"
        "    asm volatile(\n"
        '        "{\\n.reg .pred p;\\nsetp.ne.b32 p, 1, 0;\\n"\n'
        f'        "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32 {{{regs}}}, "\n'
        f'        "{{%{acc}, %{acc + 1}, %{acc + 2}, %{acc + 3}}}, %{acc + 4}, p, 1, 1;\\n}}\\n"\n'
        f"        : {outs}\n"
        '        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));\n'
        "}\n")


def _fence() -> str:
    """wgmma.fence with a stage's A fragments as its operands, so that the compiler splits x before it
    (not between the wgmmas, where ptxas would have to fence again)."""
    pieces = [f'"+r"({p}[{s}][{f}])' for p in ("h", "l") for s in range(STAGE_K // 8) for f in range(4)]
    return ("__device__ __forceinline__ void cf_wgmma_fence(unsigned (&h)[CF_STEPS][4], "
            "unsigned (&l)[CF_STEPS][4]) {\n"
            f'    asm volatile("wgmma.fence.sync.aligned;\\n" : {", ".join(pieces)} :: "memory");\n'
            "}\n")


SOURCE = TF32_PIECES + "\n" + _wgmma_wrapper() + f"""
#define CF_COLUMNS {COLUMNS}
#define CF_STAGE_K {STAGE_K}
#define CF_STAGES {STAGES}
#define CF_STAGE (2 * CF_STAGE_K * CF_COLUMNS)  // floats of a stage of B: hi, then lo
#define CF_PER (CF_STAGE_K / 4)                 // values of x a thread holds per row and stage
#define CF_STEPS (CF_STAGE_K / 8)               // wgmmas of K = 8 per stage and piece
#define CF_SMEM {SMEM_BYTES}

""" + _fence() + """
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
        asm volatile("{\\n.reg .pred p;\\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\\n"
                     "selp.u32 %0, 1, 0, p;\\n}\\n" : "=r"(done) : "r"(barrier), "r"(parity) : "memory");
}

// C[m, n] = x[m, k] @ W (or += where `accumulate`), W as its image; x's rows lda floats apart, 16-byte
// aligned. A block of 256 threads per 128 rows (the last ones clamped to row m - 1 to load, not stored)
// by CF_COLUMNS columns, CF_SMEM bytes of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(256, 1) cf_wgmma_gemm(
    float* __restrict__ c, const float* __restrict__ x, const float* __restrict__ image, int m, int n,
    int k, int lda, int ldc, int accumulate)
{
    extern __shared__ __align__(128) float cf_smem[];
    const int tid = threadIdx.x, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int row = blockIdx.y * 128 + (tid / 32) * 16 + g;  // the thread's rows: row and row + 8
    const int stages = k / CF_STAGE_K;
    const float* const tiles = image + (size_t)blockIdx.x * stages * CF_STAGE;
    const float* const x0 = x + (size_t)min(row, m - 1) * lda + CF_PER * t;
    const float* const x8 = x + (size_t)min(row + 8, m - 1) * lda + CF_PER * t;
    // each slot's mbarriers, after the slots: `full` (its stage has arrived), `empty` (every warp is done
    // with it)
    const unsigned full = (unsigned)__cvta_generic_to_shared(cf_smem + CF_STAGES * CF_STAGE);
    const unsigned empty = full + 8 * CF_STAGES;
    if (tid == 0)
        for (int s = 0; s < CF_STAGES; ++s) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\\n" ::"r"(full + 8 * s) : "memory");
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 8;\\n" ::"r"(empty + 8 * s) : "memory");
        }
    asm volatile("fence.mbarrier_init.release.cluster;\\n" ::: "memory");
    __syncthreads();
    const auto load_stage = [&](int kb) {  // by thread 0: B's stage kb, once its slot's last stage is done
        if (kb >= stages) return;
        const int slot = kb % CF_STAGES;
        if (kb >= CF_STAGES) cf_wait(empty + 8 * slot, (kb / CF_STAGES - 1) & 1);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\\n"
                     ::"r"(full + 8 * slot), "n"(CF_STAGE * 4) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
                     "[%0], [%1], %2, [%3];\\n"
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
        asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;\\n" ::: "memory");
        if (kb > 0 && lane == 0)
            asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\\n"
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
    asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");
    // acc[4 v + 2 h + i] is C's (row + 8 h, 8 v + 2 t + i) in the block's columns
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
        if (row + 8 * h >= m) continue;
        float* const out = c + (size_t)(row + 8 * h) * ldc + blockIdx.x * CF_COLUMNS + 2 * t;
        #pragma unroll
        for (int v = 0; v < CF_COLUMNS / 8; ++v) {
            float2 sum = make_float2(acc[4 * v + 2 * h], acc[4 * v + 2 * h + 1]);
            if (accumulate) {
                const float2 old = *reinterpret_cast<const float2*>(out + 8 * v);
                sum.x += old.x;
                sum.y += old.y;
            }
            *reinterpret_cast<float2*>(out + 8 * v) = sum;
        }
    }
}
"""
