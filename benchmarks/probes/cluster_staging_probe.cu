// Whether the blocks of a thread-block cluster can share the staging of h that takes half of the tensor
// rung's step. The LSTM's forward kernel at B=64, H=512 (benchmarks/step_profile.py at 809c487): of its
// 4.9 us a step on an H200's 132 SMs, 2.4 us are each block waiting for the step's h in the exchange and
// staging its row group's rows of it (16 rows x 512); planned for 66 SMs (one of two directions) a block
// has 32 rows and the staging 4.3 us. Here only that runs: every step each of the grid's blocks (32
// column blocks x ROW_GROUPS row groups, one a SM) makes its 16 units of h for its rows from the h it
// staged (a made-up update that reads another block's unit, so that each step needs the one before),
// publishes them as (step tag, value) pairs in an exchange as the generated kernels do (persistent.cuh's
// cf_publish), then stages every unit of its rows once their tags are the step's:
//   CLUSTER 1   each block polls all 512 units of its rows (as generated)
//   CLUSTER 2,4 the blocks of a cluster (neighbouring column blocks of one row group) each poll their
//               share of the units and store each value into every block's stage of the cluster
//               (distributed shared memory), then one cluster barrier
// and, as a floor, no staging at all (each block reads its own units only: no wait for others). The
// stages are double-buffered by the step's parity, so that a block of the cluster may store the next
// step's h while another still reads this one's. Each variant's h after T steps is checked against the
// same update on the host; then timed (CUDA events, median of 20 launches of T steps), in us a step.
//
//     nvcc -O3 -arch=sm_90 benchmarks/probes/cluster_staging_probe.cu -o /tmp/cluster_staging_probe &&
//         /tmp/cluster_staging_probe
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe_check.cuh"  // CHECK, median_event_ms

// cf_publish, cf_peek2: the generated kernels' exchange
#include "../../cellfuse/resources/cuda/persistent.cuh"

namespace cg = cooperative_groups;

constexpr int T = 100, B = 64, H = 512, COL_BLOCKS = 32, UNITS = H / COL_BLOCKS, THREADS = 256;
constexpr int RUNS = 20;

// the made-up update: unit u of a row from unit (7u + 1) % H of the h before (another block's)
__host__ __device__ inline float update(float before, int u) { return 0.5f * before + 0.001f * (u % 17); }
__host__ __device__ inline int source_unit(int u) { return (7 * u + 1) % H; }

// x: the exchange, two slots of [B][H] pairs; h0: [B][H]; out: h after the last step, [B][H]; tags of this
// launch start past `base`, so that no pair of an earlier launch passes for one of this one
template <int ROW_GROUPS, int CLUSTER, bool STAGE>
__global__ void __launch_bounds__(THREADS, 1) staging(unsigned long long* x, const float* h0, float* out,
                                                      unsigned base)
{
    constexpr int ROWS = B / ROW_GROUPS, SHARE = H / CLUSTER;
    extern __shared__ float stage[];  // [2][ROWS][H]
    const int tid = threadIdx.x, cb = blockIdx.x % COL_BLOCKS, rg = blockIdx.x / COL_BLOCKS;
    const int row0 = rg * ROWS;
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = CLUSTER > 1 ? (int)cluster.block_rank() : 0;
    for (int e = tid; e < ROWS * H; e += THREADS)  // (both parities: unstaged, the others' units stay h0)
        stage[e] = stage[ROWS * H + e] = h0[(size_t)row0 * H + e];
    __syncthreads();
    for (int t = 0; t < T; ++t) {
        const float* before = stage + ((t + 1) & 1) * ROWS * H;
        float* now = stage + (t & 1) * ROWS * H;
        unsigned long long* slot = x + (size_t)(t & 1) * B * H;
        const unsigned tag = base + t + 1;
        // this block's units of this step, published (and, with no staging, kept for itself)
        for (int e = tid; e < ROWS * UNITS; e += THREADS) {
            const int r = e / UNITS, u = cb * UNITS + e % UNITS;
            const float v = update(before[r * H + source_unit(u)], u);
            cf_publish(slot + (size_t)(row0 + r) * H + u, tag, v);
            if (!STAGE) now[r * H + u] = v;
        }
        if (STAGE) {
            // this block's share of the units of its rows, two pairs a load, at most 16 loads of a thread in
            // flight (as the generated poll, exchange.POLL_PIECES), polled until every tag is the step's,
            // stored into the stage of every block of the cluster
            constexpr int PAIRS = ROWS * SHARE / 2, EACH = PAIRS / THREADS, CHUNK = EACH < 16 ? EACH : 16;
            static_assert(PAIRS % THREADS == 0 && EACH % CHUNK == 0, "a thread's pairs");
            for (int i0 = 0; i0 < EACH; i0 += CHUNK) {
                unsigned long long w[CHUNK][2];
                #pragma unroll
                for (int i = 0; i < CHUNK; ++i) {
                    const int e = 2 * (tid + (i0 + i) * THREADS), r = e / SHARE, u = rank * SHARE + e % SHARE;
                    cf_peek2(slot + (size_t)(row0 + r) * H + u, w[i][0], w[i][1]);
                }
                for (unsigned round = 0;; ++round) {
                    if (round == (1u << 24)) __trap();
                    bool ready = true;
                    #pragma unroll
                    for (int i = 0; i < CHUNK; ++i) {
                        if ((unsigned)(w[i][0] >> 32) != tag || (unsigned)(w[i][1] >> 32) != tag) {
                            const int e = 2 * (tid + (i0 + i) * THREADS), r = e / SHARE;
                            const int u = rank * SHARE + e % SHARE;
                            cf_peek2(slot + (size_t)(row0 + r) * H + u, w[i][0], w[i][1]);
                            ready = false;
                        }
                    }
                    if (ready) break;
                }
                #pragma unroll
                for (int i = 0; i < CHUNK; ++i) {
                    const int e = 2 * (tid + (i0 + i) * THREADS), r = e / SHARE, u = rank * SHARE + e % SHARE;
                    const float2 v = make_float2(__uint_as_float((unsigned)w[i][0]),
                                                 __uint_as_float((unsigned)w[i][1]));
                    #pragma unroll
                    for (int c = 0; c < CLUSTER; ++c) {
                        float* to = CLUSTER > 1 ? cluster.map_shared_rank(now, c) : now;
                        *reinterpret_cast<float2*>(to + r * H + u) = v;
                    }
                }
            }
        }
        if (CLUSTER > 1) {
            cluster.sync();  // every block's share of this step is in every stage of the cluster
        } else {
            __syncthreads();
        }
    }
    if (cb == 0) {  // (every block of a row group holds the same h)
        const float* last = stage + ((T - 1) & 1) * ROWS * H;
        for (int e = tid; e < ROWS * H; e += THREADS)
            if (STAGE || e % H / UNITS == cb) out[(size_t)row0 * H + e] = last[e];
    }
}

unsigned tags = 0;  // the tags every launch so far has used: the next one's start past them

template <int ROW_GROUPS, int CLUSTER, bool STAGE>
void run(const char* what, unsigned long long* x, const float* h0, float* out, const std::vector<float>& want)
{
    constexpr int ROWS = B / ROW_GROUPS;
    auto kernel = staging<ROW_GROUPS, CLUSTER, STAGE>;
    // one block a SM: every block must be resident at once (each waits for all the others' h)
    const int smem = std::max(2 * ROWS * H * 4, 120 * 1024);
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(COL_BLOCKS * ROW_GROUPS);
    config.blockDim = dim3(THREADS);
    config.dynamicSmemBytes = smem;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = CLUSTER;
    attribute[0].val.clusterDim.y = attribute[0].val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
    int clusters = 0;
    CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
    if (clusters * CLUSTER < COL_BLOCKS * ROW_GROUPS) {
        std::printf("%-34s %d blocks in clusters of %d: only %d clusters resident at once, skipped\n", what,
                    COL_BLOCKS * ROW_GROUPS, CLUSTER, clusters);
        return;
    }
    auto launch = [&] {
        CHECK(cudaLaunchKernelEx(&config, kernel, x, h0, out, tags));
        tags += T + 1;
    };
    CHECK(cudaMemset(out, 0, sizeof(float) * B * H));
    launch();
    CHECK(cudaDeviceSynchronize());
    std::vector<float> got(B * H);
    CHECK(cudaMemcpy(got.data(), out, sizeof(float) * B * H, cudaMemcpyDeviceToHost));
    double worst = 0;
    for (int e = 0; e < B * H; ++e)
        if (STAGE || e % H / UNITS == 0) worst = std::max(worst, (double)std::fabs(got[e] - want[e]));
    const float median = median_event_ms(launch, RUNS);
    std::printf("%-34s %3d blocks, %2d rows a block: %6.2f us a step (%.3f ms), max |error| %.1e %s\n", what,
                COL_BLOCKS * ROW_GROUPS, ROWS, 1000.0 * median / T, median, worst,
                worst <= 1e-5 ? "ok" : "WRONG");
}

int main()
{
    std::vector<float> h(B * H), next(B * H);
    for (int e = 0; e < B * H; ++e) h[e] = std::sin(0.001f * e);
    unsigned long long* x;
    float *h0, *out;
    CHECK(cudaMalloc(&x, sizeof(unsigned long long) * 2 * B * H));
    CHECK(cudaMalloc(&h0, sizeof(float) * B * H));
    CHECK(cudaMalloc(&out, sizeof(float) * B * H));
    CHECK(cudaMemset(x, 0, sizeof(unsigned long long) * 2 * B * H));
    CHECK(cudaMemcpy(h0, h.data(), sizeof(float) * B * H, cudaMemcpyHostToDevice));
    std::vector<float> want = h;  // staged: every unit from the step before
    for (int t = 0; t < T; ++t) {
        for (int e = 0; e < B * H; ++e) next[e] = update(want[e - e % H + source_unit(e % H)], e % H);
        want.swap(next);
    }
    // no staging: a block reads only its own units (its first column block's, cb = 0, checked), whose
    // sources lie in other blocks' units and stay the initial h there
    std::vector<float> alone = h;
    for (int t = 0; t < T; ++t) {
        for (int e = 0; e < B * H; ++e) {
            const int u = e % H, s = source_unit(u);
            next[e] = u / UNITS == 0 ? update(alone[e - u + s], u) : alone[e];
        }
        alone.swap(next);
    }
    std::printf("T=%d steps of h [%d x %d], %d column blocks\n", T, B, H, COL_BLOCKS);
    run<4, 1, true>("staged (as generated)", x, h0, out, want);
    run<4, 2, true>("staged, clusters of 2", x, h0, out, want);
    run<4, 4, true>("staged, clusters of 4", x, h0, out, want);
    run<4, 1, false>("not staged (the floor)", x, h0, out, alone);
    run<2, 1, true>("staged (as generated)", x, h0, out, want);
    run<2, 2, true>("staged, clusters of 2", x, h0, out, want);
    run<2, 4, true>("staged, clusters of 4", x, h0, out, want);
    run<2, 1, false>("not staged (the floor)", x, h0, out, alone);
    return 0;
}
