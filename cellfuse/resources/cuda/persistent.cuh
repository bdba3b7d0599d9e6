// What a persistent kernel's blocks share: copies to shared memory, prefetches, the pairs of an
// exchange, the fp16 split and the product of tensor cores.

#include <cooperative_groups.h>
#include <cuda_fp16.h>

// 16 bytes from global to shared memory without a register, cached in L2 only: other blocks wrote them.
__device__ __forceinline__ void cf_copy16(float* shared, const float* global) {
    const unsigned to = (unsigned)__cvta_generic_to_shared(shared);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(to), "l"(global) : "memory");
}

// A hint: the 128-byte line at `p` into L2, where a load through L2 finds it later.
__device__ __forceinline__ void cf_prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];\n" :: "l"(p));
}

__device__ __forceinline__ void cf_copies_done() {
    asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// An exchange's (step tag, value) pair, 8 aligned bytes: stored at once and read at once, so that a
// reader that sees the tag it waits for sees the value that came with it.
__device__ __forceinline__ void cf_publish(unsigned long long* at, unsigned tag, float v) {
    const unsigned long long w = ((unsigned long long)tag << 32) | __float_as_uint(v);
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;\n" :: "l"(at), "l"(w) : "memory");
}

__device__ __forceinline__ void cf_peek(const unsigned long long* at, unsigned long long& a) {
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];\n" : "=l"(a) : "l"(at) : "memory");
}

__device__ __forceinline__ void cf_peek2(const unsigned long long* at, unsigned long long& a,
                                         unsigned long long& b) {
    asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];\n" : "=l"(a), "=l"(b) : "l"(at) : "memory");
}

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
__device__ __forceinline__ float cf_f16x3_scale(float m) {
    const int e = __float_as_int(m) >> 23;  // (m >= 0: no sign bit)
    return m == 0.0f || e == 255 ? 1.0f : __int_as_float(min(253, 268 - e) << 23);
}

// 1 / s of a scale s (a power of two, 2^-126 to 2^126), from its exponent bits: exact, and no division.
__device__ __forceinline__ float cf_f16x3_unscale(float s) {
    return __int_as_float((254 - (__float_as_int(s) >> 23)) << 23);
}

// The largest magnitude of four values (a NaN among them left out).
__device__ __forceinline__ float cf_abs_max(float4 v) {
    return fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
}

// Two scaled values' hi pieces packed in one register and their lo pieces (times 2^11) in another, the
// first value in the low half, as mma.sync takes a fragment's pairs.
__device__ __forceinline__ void cf_split_f16x3(float a, float b, unsigned& hi, unsigned& lo) {
    const __half2 h = __floats2half2_rn(a, b);
    const float2 back = __half22float2(h);
    const __half2 l = __floats2half2_rn((a - back.x) * 2048.0f, (b - back.y) * 2048.0f);
    hi = *reinterpret_cast<const unsigned*>(&h);
    lo = *reinterpret_cast<const unsigned*>(&l);
}

// The largest of a warp's values, in every lane.
__device__ __forceinline__ float cf_warp_max(float m) {
    for (int d = 16; d > 0; d /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, d));
    return m;
}

// The sum of `p[0], p[stride], ..., p[(N - 1) * stride]` as a tree: halves added, each summed the same way
// (fewer dependent adds than one after the other).
template <int N> struct cf_tree_sum {
    static __device__ __forceinline__ float of(const float* p, int stride) {
        return cf_tree_sum<N / 2>::of(p, stride) + cf_tree_sum<N - N / 2>::of(p + N / 2 * stride, stride);
    }
};
template <> struct cf_tree_sum<1> {
    static __device__ __forceinline__ float of(const float* p, int) { return p[0]; }
};

// A block's part of a GEMM's output kept as each warp's partial sums, [rows][WARPS][COLS]: c[i], i a
// row's start plus a column, adds the warps' partials of that column.
template <int COLS, int WARPS> struct cf_warp_sums {
    const float* p;
    __device__ __forceinline__ float operator[](int i) const { return cf_tree_sum<WARPS>::of(p + i, COLS); }
};

// c += a @ b on tensor cores in fp16: a 16 x 8 tile of C over sixteen k, accumulated in float32, the
// fragments as mma.sync lays them out.
__device__ __forceinline__ void cf_mma_f16(float (&c)[4], unsigned a0, unsigned a1, unsigned a2,
                                           unsigned a3, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
