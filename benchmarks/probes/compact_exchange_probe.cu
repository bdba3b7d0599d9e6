// Whether an exchange of h in half the bytes stages faster. The generated persistent kernels publish each
// value of h as an 8-byte (step tag, value) pair (persistent.cuh's cf_publish), so that a block staging its
// rows of h reads 8 bytes a value from L2: at B=64, H=512 on 128 blocks, 64 KiB a block and 8 MiB in all a
// step, which is most of the step's staging (1.36 us of the tensor rung's 4.9 us a step on an H200:
// cluster_staging_probe.cu). Here two values share one 8-byte word, each value's lowest mantissa bit
// carrying one bit of a 2-bit tag (the step + 1, mod 4: a slot is rewritten every other step, so the tag it
// holds before the step's value comes differs from the awaited one by 2): 4 bytes a value, the value itself
// rounded to 23 bits (the tensor rungs' three fp16 products keep 22 of them, a 16-bit plan 8 or 11).
// Every step each block (COL_BLOCKS x ROW_GROUPS, one a SM) makes its units of h for its rows from the h it
// staged (a made-up update that reads another block's unit, so that each step needs the one before),
// publishes them, then stages every unit of its rows once their tags are the step's:
//   pairs     as generated: (tag, value) pairs, two pairs a 16-byte load
//   compact   two values a word, four values a 16-byte load; the pair of values made by a shuffle
// and, as a floor, no staging at all. Each variant's h after T steps is checked against the same update
// on the host (with the compact words' rounding); then timed (CUDA events, median of 20 launches of T
// steps), in us a step.
//
//     nvcc -O3 -arch=sm_90 benchmarks/probes/compact_exchange_probe.cu -o /tmp/compact_exchange_probe &&
//         /tmp/compact_exchange_probe
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "probe_check.cuh"  // CHECK, median_event_ms

// cf_publish, cf_peek2: the generated kernels' exchange
#include "../../cellfuse/resources/cuda/persistent.cuh"

namespace cg = cooperative_groups;

constexpr int T = 100, H = 512, THREADS = 256, RUNS = 20;

enum Mode { PAIRS, COMPACT, FLOOR, SYNCED, SYNC_ONLY };

// the made-up update: unit u of a row from unit (7u + 1) % H of the h before (another block's)
__host__ __device__ inline float update(float before, int u) { return 0.5f * before + 0.001f * (u % 17); }
__host__ __device__ inline int source_unit(int u) { return (7 * u + 1) % H; }
// a value with its lowest mantissa bit set to `bit`: what a compact word holds
__host__ __device__ inline unsigned with_bit(float v, unsigned bit) {
    unsigned b;
    std::memcpy(&b, &v, 4);
    return (b & ~1u) | bit;
}

// x: the exchange, two slots of [B][H] pairs (or [B][H / 2] words); h0: [B][H]; out: h after the last step
template <int B, int COL_BLOCKS, int ROW_GROUPS, Mode MODE>
__global__ void __launch_bounds__(THREADS, 1) staging(unsigned long long* x, const float* h0, float* out)
{
    constexpr int ROWS = B / ROW_GROUPS, UNITS = H / COL_BLOCKS;
    constexpr int WIDTH = MODE == COMPACT ? H / 2 : H;  // words a row of a slot
    extern __shared__ float stage[];  // [2][ROWS][H]
    cg::grid_group grid = cg::this_grid();
    const int tid = threadIdx.x, cb = blockIdx.x % COL_BLOCKS, rg = blockIdx.x / COL_BLOCKS;
    const int row0 = rg * ROWS;
    for (int e = tid; e < ROWS * H; e += THREADS)  // (both parities: unstaged, the others' units stay h0)
        stage[e] = stage[ROWS * H + e] = h0[(size_t)row0 * H + e];
    // this block's words of both slots cleared to a tag that the slot's first step does not wait for
    for (int e = tid; e < ROWS * UNITS; e += THREADS) {
        const int r = e / UNITS, u = cb * UNITS + e % UNITS;
        if (MODE == COMPACT) {
            if (u % 2 == 0) {
                const unsigned long long w0 = 3ull | (1ull << 32);  // slot 0 awaits tag 1 first: 3 (bits 1, 1)
                x[(size_t)(row0 + r) * WIDTH + u / 2] = w0;
                x[(size_t)B * WIDTH + (size_t)(row0 + r) * WIDTH + u / 2] = 0ull;  // slot 1 awaits 2: 0
            }
        } else {
            cf_publish(x + (size_t)(row0 + r) * WIDTH + u, 0u, 0.0f);
            cf_publish(x + (size_t)B * WIDTH + (size_t)(row0 + r) * WIDTH + u, 0u, 0.0f);
        }
    }
    grid.sync();
    for (int t = 0; t < T; ++t) {
        const float* before = stage + ((t + 1) & 1) * ROWS * H;
        float* now = stage + (t & 1) * ROWS * H;
        unsigned long long* slot = x + (size_t)(t & 1) * B * WIDTH;
        const unsigned tag = t + 1;
        // this block's units of this step, published (and, with no staging, kept for itself)
        for (int e0 = 0; e0 < ROWS * UNITS; e0 += THREADS) {
            const int e = e0 + tid, r = e / UNITS, u = cb * UNITS + e % UNITS;
            const float v = e < ROWS * UNITS ? update(before[r * H + source_unit(u)], u) : 0.0f;
            if (MODE == COMPACT) {  // (e, e + 1) in lanes (2i, 2i + 1): units u, u + 1 of row r
                const float other = __shfl_xor_sync(0xffffffffu, v, 1);
                if (e < ROWS * UNITS && u % 2 == 0) {
                    const unsigned long long w = ((unsigned long long)with_bit(other, (tag >> 1) & 1) << 32) |
                                                 with_bit(v, tag & 1);
                    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;\n" ::"l"(slot + (size_t)(row0 + r) * WIDTH + u / 2),
                                 "l"(w) : "memory");
                }
            } else if (e < ROWS * UNITS) {
                cf_publish(slot + (size_t)(row0 + r) * WIDTH + u, tag, v);
                if (MODE == FLOOR || MODE == SYNC_ONLY) now[r * H + u] = v;
            }
        }
        if (MODE == SYNCED || MODE == SYNC_ONLY) grid.sync();
        if (MODE != FLOOR && MODE != SYNC_ONLY) {
            // every unit of the block's rows, 16 bytes a load, at most 16 loads of a thread in flight (as the
            // generated poll, exchange.POLL_PIECES), polled until every tag is the step's
            constexpr int PER = MODE == COMPACT ? 4 : 2;  // values a load
            constexpr int LOADS = ROWS * H / PER, EACH = (LOADS + THREADS - 1) / THREADS;
            constexpr int CHUNK = EACH < 16 ? EACH : 16;
            static_assert((LOADS < THREADS || LOADS % THREADS == 0) && EACH % CHUNK == 0, "a thread's loads");
            const unsigned long long pattern = (tag & 1) | ((unsigned long long)((tag >> 1) & 1) << 32);
            for (int i0 = 0; i0 < EACH; i0 += CHUNK) {
                unsigned long long w[CHUNK][2];
                #pragma unroll
                for (int i = 0; i < CHUNK; ++i) {
                    const int e = PER * (tid + (i0 + i) * THREADS), r = e / H, u = e % H;
                    w[i][0] = w[i][1] = MODE == COMPACT ? pattern : ((unsigned long long)tag << 32);
                    if (e < ROWS * H) cf_peek2(slot + (size_t)(row0 + r) * WIDTH + u * 2 / PER, w[i][0], w[i][1]);
                }
                for (unsigned round = 0;; ++round) {
                    if (round == (1u << 24) || (MODE == SYNCED && round == 1)) __trap();
                    bool ready = true;
                    #pragma unroll
                    for (int i = 0; i < CHUNK; ++i) {
                        const bool stale = MODE == COMPACT
                            ? (((w[i][0] ^ pattern) | (w[i][1] ^ pattern)) & 0x100000001ull) != 0
                            : (unsigned)(w[i][0] >> 32) != tag || (unsigned)(w[i][1] >> 32) != tag;
                        if (stale) {
                            const int e = PER * (tid + (i0 + i) * THREADS), r = e / H, u = e % H;
                            cf_peek2(slot + (size_t)(row0 + r) * WIDTH + u * 2 / PER, w[i][0], w[i][1]);
                            ready = false;
                        }
                    }
                    if (ready) break;
                }
                #pragma unroll
                for (int i = 0; i < CHUNK; ++i) {
                    const int e = PER * (tid + (i0 + i) * THREADS), r = e / H, u = e % H;
                    if (e >= ROWS * H) break;
                    if (MODE == COMPACT) {
                        *reinterpret_cast<float4*>(now + r * H + u) =
                            make_float4(__uint_as_float((unsigned)w[i][0]), __uint_as_float((unsigned)(w[i][0] >> 32)),
                                        __uint_as_float((unsigned)w[i][1]), __uint_as_float((unsigned)(w[i][1] >> 32)));
                    } else {
                        *reinterpret_cast<float2*>(now + r * H + u) =
                            make_float2(__uint_as_float((unsigned)w[i][0]), __uint_as_float((unsigned)w[i][1]));
                    }
                }
            }
        }
        __syncthreads();
    }
    if (cb == 0) {  // (every block of a row group holds the same h)
        const float* last = stage + ((T - 1) & 1) * ROWS * H;
        for (int e = tid; e < ROWS * H; e += THREADS)
            if ((MODE != FLOOR && MODE != SYNC_ONLY) || e % H / UNITS == cb) out[(size_t)row0 * H + e] = last[e];
    }
}

template <int B, int COL_BLOCKS, int ROW_GROUPS, Mode MODE>
void run(const char* what)
{
    constexpr int ROWS = B / ROW_GROUPS, UNITS = H / COL_BLOCKS;
    std::vector<float> h(B * H), next(B * H);
    for (int e = 0; e < B * H; ++e) h[e] = std::sin(0.001f * e);
    std::vector<float> want = h;
    for (int t = 0; t < T; ++t) {
        for (int e = 0; e < B * H; ++e) {
            const int u = e % H, s = source_unit(u);
            if (MODE == FLOOR || MODE == SYNC_ONLY) {
                next[e] = u / UNITS == 0 ? update(want[e - u + s], u) : want[e];
            } else {
                float v = update(want[e - u + s], u);
                if (MODE == COMPACT) {
                    const unsigned tag = t + 1, b = with_bit(v, u % 2 == 0 ? tag & 1 : (tag >> 1) & 1);
                    std::memcpy(&v, &b, 4);
                }
                next[e] = v;
            }
        }
        want.swap(next);
    }
    unsigned long long* x;
    float *h0, *out;
    CHECK(cudaMalloc(&x, sizeof(unsigned long long) * 2 * B * H));
    CHECK(cudaMalloc(&h0, sizeof(float) * B * H));
    CHECK(cudaMalloc(&out, sizeof(float) * B * H));
    CHECK(cudaMemcpy(h0, h.data(), sizeof(float) * B * H, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(out, 0, sizeof(float) * B * H));
    auto kernel = staging<B, COL_BLOCKS, ROW_GROUPS, MODE>;
    const int smem = std::max(2 * ROWS * H * 4, 120 * 1024);  // one block a SM, as the generated kernels
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    void* args[] = {&x, &h0, &out};
    auto launch = [&] {
        CHECK(cudaLaunchCooperativeKernel((void*)kernel, COL_BLOCKS * ROW_GROUPS, THREADS, args, smem));
    };
    launch();
    CHECK(cudaDeviceSynchronize());
    std::vector<float> got(B * H);
    CHECK(cudaMemcpy(got.data(), out, sizeof(float) * B * H, cudaMemcpyDeviceToHost));
    double worst = 0;
    for (int e = 0; e < B * H; ++e)
        if ((MODE != FLOOR && MODE != SYNC_ONLY) || e % H / UNITS == 0) worst = std::max(worst, (double)std::fabs(got[e] - want[e]));
    const float median = median_event_ms(launch, RUNS);
    std::printf("B=%-3d %-8s %3d blocks, %2d rows a block: %6.2f us a step (%.3f ms), max |error| %.1e %s\n", B,
                what, COL_BLOCKS * ROW_GROUPS, ROWS, 1000.0 * median / T, median, worst,
                worst <= 1e-6 ? "ok" : "WRONG");
    CHECK(cudaFree(x));
    CHECK(cudaFree(h0));
    CHECK(cudaFree(out));
}

template <int B, int COL_BLOCKS, int ROW_GROUPS>
void all()
{
    run<B, COL_BLOCKS, ROW_GROUPS, PAIRS>("pairs");
    run<B, COL_BLOCKS, ROW_GROUPS, COMPACT>("compact");
    run<B, COL_BLOCKS, ROW_GROUPS, FLOOR>("floor");
    run<B, COL_BLOCKS, ROW_GROUPS, SYNCED>("synced");
    run<B, COL_BLOCKS, ROW_GROUPS, SYNC_ONLY>("synconly");
}

int main()
{
    std::printf("T=%d steps of h [B x %d]\n", T, H);
    all<64, 32, 4>();   // the tensor rung's LSTM at B=64 on all SMs
    all<64, 32, 2>();   // one direction of two, on half the SMs
    all<8, 128, 1>();   // B=8
    all<128, 32, 4>();  // B=128, 32 rows a block
    all<8, 64, 1>();    // B=8 on 64 blocks
    all<8, 32, 1>();    // B=8 on 32 blocks
    all<1, 128, 1>();   // B=1
    return 0;
}
