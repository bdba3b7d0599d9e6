// Fills a backward pass's buffer of ones (the column sums of a bias's gradient read it).
extern "C" __global__ void cf_fill_ones(float* p, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = 1.0f;
}
