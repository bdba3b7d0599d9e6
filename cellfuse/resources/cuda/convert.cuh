// The exported launcher's edges in a 16-bit precision: its caller's float32 arrays into the plan's
// buffers of another type, and back (rounding to nearest, ties to even, as every kernel's store does).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

__device__ __forceinline__ float cf_as_float(float v) { return v; }
__device__ __forceinline__ float cf_as_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float cf_as_float(__half v) { return __half2float(v); }
__device__ __forceinline__ void cf_set(float* p, float v) { *p = v; }
__device__ __forceinline__ void cf_set(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void cf_set(__half* p, float v) { *p = __float2half_rn(v); }

// n elements of src into dst.
template <typename To, typename From>
__global__ void cf_convert(To* dst, const From* src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        cf_set(dst + i, cf_as_float(src[i]));
}

// rows x cols elements of src, whose rows are lds apart, into dst, whose rows are ldd apart.
template <typename To, typename From>
__global__ void cf_convert_rows(To* dst, int ldd, const From* src, int lds, int rows, int cols)
{
    const size_t n = (size_t)rows * cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / cols, c = i % cols;
        cf_set(dst + r * ldd + c, cf_as_float(src[r * lds + c]));
    }
}

