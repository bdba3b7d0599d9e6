// GEMMs of a persistent kernel in bfloat16 or float16 (a 16-bit plan's). On tensor cores: two float32
// values rounded to the 16-bit type (to nearest, ties to even) and packed in one register, the first in
// the low half, as mma.sync takes a fragment's pairs; c += a @ b over sixteen k, accumulated in float32
// (fp16's product is persistent.cuh's cf_mma_f16, which float32's GEMMs use too).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

__device__ __forceinline__ unsigned cf_pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&v);
}

__device__ __forceinline__ unsigned cf_pack_f16(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&v);
}

__device__ __forceinline__ void cf_mma_bf16(float (&c)[4], unsigned a0, unsigned a1, unsigned a2,
                                            unsigned a3, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// A float32 value rounded to the 16-bit type and back: what the CUDA cores multiply where a 16-bit plan's
// GEMM runs on them (a product of two such values is exact in float32, as on tensor cores).
__device__ __forceinline__ float cf_round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

__device__ __forceinline__ float cf_round_f16(float v) { return __half2float(__float2half_rn(v)); }
