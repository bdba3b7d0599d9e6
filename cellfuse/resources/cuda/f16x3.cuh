// A float32 product on tensor cores as three fp16 ones: the scales and pieces that both the persistent
// kernels' step GEMMs and the split copies of the GEMMs outside the loop (gemm_splits.cuh) make. Every
// module has it through gemm_splits.cuh, before its kernels. Declared `__forceinline__ __device__`:
// device functions only (their bit casts and shuffles are).

#include <cuda_fp16.h>

// Each float32 product of a GEMM on tensor cores as three fp16 ones (fp16 multiplies at twice TF32's
// rate: the LSTM's step GEMM at B=64 took 1.26 us a step where three TF32 products took 2.35,
// benchmarks/probes/step_gemm_wgmma_probe.cu). A value, scaled so that its row's (or column's) largest
// magnitude lies in [2^14, 2^15), is an fp16 hi piece and an fp16 lo piece, lo = (v - hi) * 2^11: the
// value to 22 of its 24 bits, give or take 2^-50 of the largest (where lo is below fp16's normal range,
// for values under about 2^-26 of the largest: unlike 3xTF32's, the accuracy is relative to the row's
// and column's largest, not to each value).
// The products lo * lo are left out, as 3xTF32 leaves them; the scales are powers of two (exact), undone
// on the sums, which are float32's.

// The scale of values whose largest magnitude is m: 2^(14 - e) for m in [2^e, 2^(e + 1)), from m's
// exponent bits (2^126 at most, where m is tiny or subnormal, so that its inverse is a normal float); 1
// where m is zero or not finite (an inf's lo piece is then NaN: the products of its row or column are
// NaN, as 3xTF32's were).
__forceinline__ __device__ float cf_f16x3_scale(float m) {
    const int e = __float_as_int(m) >> 23;  // (m >= 0: no sign bit)
    return m == 0.0f || e == 255 ? 1.0f : __int_as_float(min(253, 268 - e) << 23);
}

// The power of two of cf_f16x3_scale(m): the scale is 2^cf_f16x3_exponent(m).
__forceinline__ __device__ int cf_f16x3_exponent(float m) {
    return (__float_as_int(cf_f16x3_scale(m)) >> 23) - 127;
}

// 1 / s of a scale s (a power of two, 2^-126 to 2^126), from its exponent bits: exact, and no division.
__forceinline__ __device__ float cf_f16x3_unscale(float s) {
    return __int_as_float((254 - (__float_as_int(s) >> 23)) << 23);
}

// The largest magnitude of four values (a NaN among them left out).
__forceinline__ __device__ float cf_abs_max(float4 v) {
    return fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
}

// Two scaled values' hi pieces packed in one register and their lo pieces (times 2^11) in another, the
// first value in the low half, as mma.sync takes a fragment's pairs.
__forceinline__ __device__ void cf_split_f16x3(float a, float b, unsigned& hi, unsigned& lo) {
    const __half2 h = __floats2half2_rn(a, b);
    const float2 back = __half22float2(h);
    const __half2 l = __floats2half2_rn((a - back.x) * 2048.0f, (b - back.y) * 2048.0f);
    hi = *reinterpret_cast<const unsigned*>(&h);
    lo = *reinterpret_cast<const unsigned*>(&l);
}

// The largest of a warp's values, in every lane.
__forceinline__ __device__ float cf_warp_max(float m) {
    for (int d = 16; d > 0; d /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, d));
    return m;
}
