// Device math of the op table and of the row sums, in every module of generated kernels.

// An op on constants whose float32 result underflows or overflows (1e-38f * 1e-38f) is the float32
// arithmetic the cell asks for, the numpy executor's too: no mistake for nvcc to warn of.
#pragma nv_diag_suppress 222

// The logistic function without overflow: expf only ever sees a non-positive argument. 1 / (1 + z),
// a divisor in [1, 2], is on the device the reciprocal instruction and one Newton step (within an ulp of
// IEEE division, without its checks for zero, huge and subnormal divisors and the slow path they branch
// to, which also kept the compiler from moving the loads of later values above it: with it, the LSTM's
// persistent kernel took longer at B=1, 8 and 64 on an H100:
// benchmarks/results/h100_2026-11-26_sigmoid_and_fixed_weights.json).
__device__ __forceinline__ float cf_sigmoid(float a) {
    const float z = expf(-fabsf(a)), d = 1.0f + z;
#ifdef __CUDA_ARCH__
    const float r0 = __fdividef(1.0f, d), r = fmaf(fmaf(-d, r0, 1.0f), r0, r0);
#else
    const float r = 1.0f / d;
#endif
    return (a >= 0.0f ? 1.0f : z) * r;
}

// The sum of v over each group of `lanes` lanes of a warp (a power of two, at most 32), in every lane
// of the group (on the device only: warps shuffle there).
__forceinline__ __device__ float cf_lanes_sum(float v, int lanes) {
    for (int offset = lanes / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// Over each group of `lanes` lanes (a power of two, at most 32), each lane holding the sum s of `count`
// values of a row and q, the sum of their squared deviations from their own mean: those of all the
// group's values, in every lane of it (Chan, Golub and LeVeque's pairwise update: two halves of n values
// each add (s_a - s_b)^2 / 2n to q).
__forceinline__ __device__ void cf_lanes_deviations(float& s, float& q, int lanes, float count) {
    for (int offset = lanes / 2; offset > 0; offset >>= 1, count *= 2.0f) {
        const float s2 = __shfl_xor_sync(0xffffffffu, s, offset);
        const float q2 = __shfl_xor_sync(0xffffffffu, q, offset);
        const float d = s - s2;
        q += q2 + d * d * (0.5f / count);
        s += s2;
    }
}

// The sum over a row of n values x of (x - m)^2, from their sum s and q, the sum of their squared
// deviations from their own mean: q + n (s / n - m)^2.
__forceinline__ __host__ __device__ float cf_deviations(float s, float q, float m, float n) {
    const float d = s / n - m;
    return fmaf(n * d, d, q);
}
