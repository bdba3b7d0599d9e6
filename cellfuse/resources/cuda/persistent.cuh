// What a persistent kernel's blocks share: copies to shared memory, prefetches, the pairs of an
// exchange and the product of tensor cores (the fp16 split is f16x3.cuh's, in every module).

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
