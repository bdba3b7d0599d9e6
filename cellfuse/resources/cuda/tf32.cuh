// A float32 value as two TF32 ones, for the GEMMs on tensor cores with float32's accuracy.
// Declared `__forceinline__ __device__`: device functions only (their bit casts are).

// v rounded to TF32's 10 bits of mantissa, to nearest, ties away from zero (what cvt.rna.tf32.f32
// does from sm_80 on; in integer arithmetic, so that the prelude builds for any target)
__forceinline__ __device__ float cf_tf32(float v) {
    return __uint_as_float((__float_as_uint(v) + 0x1000u) & 0xffffe000u);
}

// x as hi + lo, hi its rounding to TF32 and lo that of x - hi (exact in float32)
__forceinline__ __device__ void cf_tf32_pieces(float x, float& hi, float& lo) {
    // rounded past FLT_MAX (or x not finite): truncated instead, which keeps inf and NaN as they are (a
    // choice of values, not a branch: the warpgroup GEMM splits between its wgmmas)
    const float rounded = cf_tf32(x);
    hi = isfinite(rounded) ? rounded : __uint_as_float(__float_as_uint(x) & 0xffffe000u);
    lo = cf_tf32(isfinite(x) ? x - hi : 0.0f);
}
