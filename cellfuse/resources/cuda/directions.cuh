// The kernels of an exported bidirectional launcher. `left`, where given, is the steps-left state of a
// cell that runs each batch row to its own length ([batch][left_width], each row's length in each of its
// elements, a whole number): a row is reversed within its length, the steps past it staying in place;
// where it is NULL, every row is the whole sequence long.
__device__ __forceinline__ int cf_reversed_step(int t, int seq, int b, const float* left, int left_width) {
    const int n = left ? (int)left[(size_t)b * left_width] : seq;
    return t < n ? n - 1 - t : t;
}

// dst [seq][batch][width]: src's rows, each reversed in time.
extern "C" __global__ void __launch_bounds__(256) cf_reverse_rows(
    const float* __restrict__ src, float* __restrict__ dst, int seq, int batch, int width,
    const float* __restrict__ left, int left_width)
{
    const size_t n = (size_t)seq * batch * width;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        const int t = (int)(e / ((size_t)batch * width)), b = (int)(e / width % batch), j = (int)(e % width);
        dst[e] = src[((size_t)cf_reversed_step(t, seq, b, left, left_width) * batch + b) * width + j];
    }
}

// y [seq][batch][2 hidden]: the forward direction's output yf, then the reverse direction's yr (which
// ran over each row reversed in time) back in the steps' order.
extern "C" __global__ void __launch_bounds__(256) cf_join_directions(
    const float* __restrict__ yf, const float* __restrict__ yr, float* __restrict__ y, int seq, int batch,
    int hidden, const float* __restrict__ left, int left_width)
{
    const size_t n = (size_t)seq * batch * 2 * hidden;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        const int t = (int)(e / ((size_t)batch * 2 * hidden)), b = (int)(e / (2 * hidden) % batch);
        const int j = (int)(e % (2 * hidden));
        y[e] = j < hidden ? yf[((size_t)t * batch + b) * hidden + j]
                          : yr[((size_t)cf_reversed_step(t, seq, b, left, left_width) * batch + b) * hidden
                               + j - hidden];
    }
}
