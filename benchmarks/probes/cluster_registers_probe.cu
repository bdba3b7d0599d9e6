// Whether clusters that keep the LSTM's recurrent weights in registers, as tensor-core fragments, can run
// a step in well under the persistent rungs' microsecond. The persistent rungs spread U (4H x H) over
// every SM and exchange h through L2: every block reads all rows of h at every step, and a step costs
// about 1.1 us at B=1 and 2.4 at B=8 in bf16 on an H200 (grid-wide waits and staging through L2). The
// cluster probe of 2026-11-29 (cluster_lstm_probe.cu) kept U in one cluster's shared memory and
// multiplied on the CUDA cores: 3.4 us a step, bound by reading 128 KiB of shared memory a step.
//
// Here U in bf16 (2 MiB at H=512) is held by the 16 blocks of one cluster in their registers (128 KiB a
// block: 128 registers of each of 256 threads) as the A fragments of mma.sync m16n8k16, loaded once.
// Each block owns 32 hidden units (their 128 gate columns); a step multiplies them by h (bf16, in shared
// memory), sums the warps' shares of K, applies the cell, and writes its 32 new values of h (rounded to
// bf16) into every block of the cluster through distributed shared memory; one cluster barrier a step.
// The batch is split between clusters, R rows each (a multiple of 8, mma's N): the rows of a batch are
// independent, so clusters never wait for each other, and each holds its own copy of U.
//
// The input projection (x @ W + b) is taken as done (random gate inputs, as the hoisted GEMM gives).
// Checked against a float64 recurrence on the host with the same bf16 U and h rounded to bf16 before its
// product (as the kernel exchanges it); then timed (CUDA events, median of 20 launches of the sequence).
//
//     nvcc -O3 -arch=sm_90 -Ibenchmarks/probes benchmarks/probes/cluster_registers_probe.cu -o probe
//     ./probe B T [R WM [mma [flags]]]   (R rows a cluster, WM warps along the gate columns (0: the second
//     layout, below, R 8, 16, 24 or 40), mma=0: no
//     products; flags: the sum of NO_GX 1, NO_REMOTE 2, NO_CLUSTER_SYNC 4 (with 2 only), THROUGH_L2 8,
//     NO_CELL 16 (h the gates' sum): the NO_ ones for their time only)
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "probe_check.cuh"  // CHECK, median_event_ms

namespace cg = cooperative_groups;

constexpr int H = 512;             // hidden size (and K of the recurrent GEMM)
constexpr int CLUSTER = 16;        // blocks of a cluster (the largest an H100 or H200 allows)
constexpr int UNITS = H / CLUSTER; // hidden units of a block: 32
constexpr int COLS = 4 * UNITS;    // its gate columns: 128 (i, f, g, o of each unit)
constexpr int THREADS = 256, WARPS = THREADS / 32;
constexpr int M_TILES = COLS / 16, K_TILES = H / 16;  // 8 x 32 fragments of 16 x 16
constexpr int HS = H + 8;  // bf16 a row of h in shared memory: rows 16 bytes apart in the banks

// ablations and alternatives, for their time (NO_*: the results are then wrong)
constexpr int NO_GX = 1, NO_REMOTE = 2, NO_CLUSTER_SYNC = 4, THROUGH_L2 = 8, NO_CELL = 16;

// the logistic function as the generated kernels compute it (cellfuse/resources/cuda/math.cuh: the
// reciprocal and one Newton step, not IEEE division and its slow path); tanh(v) = 2 sigmoid(2 v) - 1
__device__ __forceinline__ float sigmoid(float a)
{
    const float z = expf(-fabsf(a)), d = 1.0f + z;
    const float r0 = __fdividef(1.0f, d), r = fmaf(fmaf(-d, r0, 1.0f), r0, r0);
    return (a >= 0.0f ? 1.0f : z) * r;
}
__device__ __forceinline__ float tanh_(float v) { return fmaf(2.0f, sigmoid(2.0f * v), -1.0f); }

__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                 "{%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// the gate column n of U (its row: n = q * H + j) that local column m of block `rank` is
__device__ __forceinline__ int column(int rank, int m) { return (m / UNITS) * H + rank * UNITS + m % UNITS; }

// u: [4H][H] bf16 (row n = gate column n); gx: [T][B][4H] the gates' inputs; y: [T][B][H]
template <int R, int WM, bool MMA>
__global__ void __launch_bounds__(THREADS, 1) lstm_registers(const __nv_bfloat16* __restrict__ u,
                                                             const float* __restrict__ gx,
                                                             float* __restrict__ y, int T, int B,
                                                             __nv_bfloat16* __restrict__ hg, int flags)
{
    constexpr int WK = WARPS / WM, MT = M_TILES / WM, KT = K_TILES / WK, NT = R / 8, RP = R + 1;
    extern __shared__ __align__(16) unsigned char smem[];
    __nv_bfloat16* hs = reinterpret_cast<__nv_bfloat16*>(smem);                 // [2][R][HS]
    float* red = reinterpret_cast<float*>(smem + 2 * R * HS * 2);               // [WK][COLS][RP]
    __nv_bfloat16* hnew = reinterpret_cast<__nv_bfloat16*>(red + WK * COLS * RP);  // [R][UNITS]
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = cluster.block_rank(), row0 = (blockIdx.x / CLUSTER) * R;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
    const int wm = warp % WM, wk = warp / WM;
    uint32_t a[MT][KT][4];  // this warp's fragments of U: MT x KT tiles, 4 registers a thread each
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        const int m = (wm * MT + mt) * 16 + g;
        const __nv_bfloat16* lo = u + (size_t)column(rank, m) * H;
        const __nv_bfloat16* hi = u + (size_t)column(rank, m + 8) * H;
#pragma unroll
        for (int kt = 0; kt < KT; ++kt) {
            const int k = (wk * KT + kt) * 16 + 2 * tg;
            a[mt][kt][0] = *reinterpret_cast<const uint32_t*>(lo + k);
            a[mt][kt][1] = *reinterpret_cast<const uint32_t*>(hi + k);
            a[mt][kt][2] = *reinterpret_cast<const uint32_t*>(lo + k + 8);
            a[mt][kt][3] = *reinterpret_cast<const uint32_t*>(hi + k + 8);
        }
    }
    for (int e = tid; e < 2 * R * HS; e += THREADS) hs[e] = __float2bfloat16_rn(0.0f);
    const int jj = tid & 31, rb = tid >> 5;  // the cell's thread: unit jj of rows rb, rb + 8, ...
    float c[NT] = {};
    // the gates' inputs of a step, loaded a step ahead: their latency behind the step before
    auto load_gin = [&](float (&gin)[NT][4], int t) {
#pragma unroll
        for (int i = 0; i < NT; ++i) {
            const int row = row0 + rb + 8 * i;
#pragma unroll
            for (int q = 0; q < 4; ++q)
                gin[i][q] = row < B && t < T && !(flags & NO_GX)
                                ? gx[((size_t)t * B + row) * 4 * H + q * H + rank * UNITS + jj] : 0.0f;
        }
    };
    float gin[NT][4];
    load_gin(gin, 0);
    cluster.sync();  // every block's h zeroed before any block writes the next
    for (int t = 0; t < T; ++t) {
        const __nv_bfloat16* h = hs + (t & 1) * R * HS;
        float acc[MT][NT][4] = {};
        if constexpr (MMA) {
#pragma unroll
            for (int kt = 0; kt < KT; ++kt) {
                const int k = (wk * KT + kt) * 16 + 2 * tg;
                uint32_t b[NT][2];
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    b[nt][0] = *reinterpret_cast<const uint32_t*>(h + (nt * 8 + g) * HS + k);
                    b[nt][1] = *reinterpret_cast<const uint32_t*>(h + (nt * 8 + g) * HS + k + 8);
                }
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) mma(acc[mt][nt], a[mt][kt], b[nt][0], b[nt][1]);
            }
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                float* out = red + ((size_t)wk * COLS + (wm * MT + mt) * 16 + g) * RP + nt * 8 + 2 * tg;
                out[0] = acc[mt][nt][0];
                out[1] = acc[mt][nt][1];
                out[8 * RP] = acc[mt][nt][2];
                out[8 * RP + 1] = acc[mt][nt][3];
            }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < NT; ++i) {
            const int r = rb + 8 * i, row = row0 + r;
            float s[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                s[q] = gin[i][q];
#pragma unroll
                for (int w = 0; w < WK; ++w) s[q] += red[((size_t)w * COLS + q * UNITS + jj) * RP + r];
            }
            float hv;
            if (flags & NO_CELL) {
                hv = s[0] + s[1] + s[2] + s[3];
            } else {
                const float ig = sigmoid(s[0]), fg = sigmoid(s[1]), gg = tanh_(s[2]), og = sigmoid(s[3]);
                c[i] = fg * c[i] + ig * gg;
                hv = og * tanh_(c[i]);
            }
            if (row < B) y[((size_t)t * B + row) * H + rank * UNITS + jj] = hv;
            hnew[r * UNITS + jj] = __float2bfloat16_rn(row < B ? hv : 0.0f);
        }
        load_gin(gin, t + 1);
        __syncthreads();
        __nv_bfloat16* next = hs + ((t + 1) & 1) * R * HS;
        if (flags & THROUGH_L2) {  // the block's values to global memory, the cluster's h read back after
            __nv_bfloat16* hgc = hg + ((size_t)((t + 1) & 1) * gridDim.x / CLUSTER + blockIdx.x / CLUSTER) * R * H;
            for (int e = tid; e < R * 4; e += THREADS) {
                const int r = e >> 2, part = e & 3;
                reinterpret_cast<uint4*>(hgc + r * H + rank * UNITS)[part] =
                    reinterpret_cast<const uint4*>(hnew + r * UNITS)[part];
            }
            if (flags & NO_CLUSTER_SYNC) __syncthreads(); else cluster.sync();
            for (int e = tid; e < R * H / 8; e += THREADS) {
                const int r = e / (H / 8), part = e % (H / 8);
                reinterpret_cast<uint4*>(next + r * HS)[part] = __ldcg(reinterpret_cast<const uint4*>(hgc + r * H) + part);
            }
            __syncthreads();
            continue;
        }
        // the block's R x 32 values into the next step's h of every block: 16 B pieces, 4 a row
        for (int e = tid; e < CLUSTER * R * 4; e += THREADS) {
            const int to = e / (R * 4), r = (e >> 2) % R, part = e & 3;
            __nv_bfloat16* remote = (flags & NO_REMOTE ? next : cluster.map_shared_rank(next, to))
                                    + r * HS + rank * UNITS;
            reinterpret_cast<uint4*>(remote)[part] = reinterpret_cast<const uint4*>(hnew + r * UNITS)[part];
        }
        if (flags & NO_CLUSTER_SYNC) __syncthreads(); else cluster.sync();  // the next h whole everywhere
    }
}

// The second layout: no cluster barrier a step, and no sum of warps' partial products. Warp w of a block
// owns 4 of its units (gate columns 4a + q of its one 16-row tile: unit a, gate q) over the whole of K,
// in chains of products summed in registers; a transpose among each 4 lanes through shuffles gives each
// lane the four gates of one (unit, row), on which it applies the cell. The block's new h (R rows of its
// 32 units, in a staging buffer) goes to every block of the cluster by one bulk copy each
// (`cp.async.bulk` into distributed shared memory), whose bytes count down the receiving block's mbarrier
// of that step's buffer; a block waits only for that mbarrier: every block's values of h arrived. The
// receiving buffer holds each sender's rows apart ([sender][row][32 units, 8 more of padding]), so that
// one copy fills a sender's part. Two buffers suffice: values for a buffer's next step are sent only
// after their sender has every block's values of the step between, each sent after its sender's products
// read the buffer; so do two staging buffers, read by copies that every receiver has waited for two steps
// later. Thread 0 arms a buffer's next phase (its bytes) once it has waited for the current one. (Its
// first state sent each lane's 8 bytes by `st.async` instead, 1024 stores into each block a step at 8
// rows: 2.22 us a step at B=8, record h200_2026-12-01_cluster_registers_probe_023bc14.txt, run 4.)
__device__ __forceinline__ uint32_t shared_address(const void* p)
{
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ uint32_t cluster_address(uint32_t local, int rank)
{
    uint32_t out;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(local), "r"(rank));
    return out;
}

__device__ __forceinline__ void arm(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void wait_phase(uint32_t bar, uint32_t parity)
{
    asm volatile("{\n\t.reg .pred done;\n"
                 "WAIT_%=:\n\t"
                 "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n\t"
                 "@!done bra WAIT_%=;\n}" ::"r"(bar), "r"(parity) : "memory");
}

// `bytes` of this block's shared memory at `from` to another block's at `remote`, counted down its mbarrier
__device__ __forceinline__ void send(uint32_t remote, uint32_t from, uint32_t bytes, uint32_t remote_bar)
{
    asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(remote), "r"(from), "r"(bytes), "r"(remote_bar) : "memory");
}

constexpr int HP = UNITS + 8;  // bf16 a sender's row in the receiving buffer: rows 16 bytes apart in the banks

// lane `from`'s value of slot `slot` (0 to 3) of v, as a select: a register array indexed by a value that
// differs between lanes would go to local memory
__device__ __forceinline__ float pick(const float (&v)[4], int slot)
{
    return slot == 0 ? v[0] : slot == 1 ? v[1] : slot == 2 ? v[2] : v[3];
}

template <int NT>
__global__ void __launch_bounds__(THREADS, 1) lstm_async(const __nv_bfloat16* __restrict__ u,
                                                         const float* __restrict__ gx,
                                                         float* __restrict__ y, int T, int B)
{
    constexpr int R = 8 * NT, SETS = NT == 1 ? 4 : NT == 2 ? 2 : 1;
    extern __shared__ __align__(16) unsigned char smem[];
    uint64_t* bars = reinterpret_cast<uint64_t*>(smem);                           // [2]
    __nv_bfloat16* hs = reinterpret_cast<__nv_bfloat16*>(smem + 16);              // [2][CLUSTER][R][HP]
    __nv_bfloat16* stage = hs + 2 * CLUSTER * R * HP;                             // [2][R][HP]
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = cluster.block_rank(), row0 = (blockIdx.x / CLUSTER) * R;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
    const int q = g & 3, gh = g >> 2;  // this lane's gate in the tile's rows g and g + 8, and its half
    uint32_t a[K_TILES][4];
    {
        // tile row r: unit r / 4 of the warp's 4, gate r % 4
        auto col = [&](int r) { return (r & 3) * H + rank * UNITS + warp * 4 + (r >> 2); };
        const __nv_bfloat16* lo = u + (size_t)col(g) * H;
        const __nv_bfloat16* hi = u + (size_t)col(g + 8) * H;
#pragma unroll
        for (int kt = 0; kt < K_TILES; ++kt) {
            const int k = kt * 16 + 2 * tg;
            a[kt][0] = *reinterpret_cast<const uint32_t*>(lo + k);
            a[kt][1] = *reinterpret_cast<const uint32_t*>(hi + k);
            a[kt][2] = *reinterpret_cast<const uint32_t*>(lo + k + 8);
            a[kt][3] = *reinterpret_cast<const uint32_t*>(hi + k + 8);
        }
    }
    // after the transpose this lane holds the gates of unit `unit` (of the warp's 4) of row nt * 8 + rrow
    const int unit = 2 * (q >> 1) + gh, rrow = 2 * tg + (q & 1);
    const int hcol = rank * UNITS + warp * 4 + unit;  // its column of h (and of y)
    const uint32_t part = R * HP * 2, bytes = CLUSTER * part;  // a sender's h, a step's into each block
    const uint32_t bar0 = shared_address(bars), hs0 = shared_address(hs), stage0 = shared_address(stage);
    for (int e = tid; e < 2 * CLUSTER * R * HP; e += THREADS) hs[e] = __float2bfloat16_rn(0.0f);
    if (tid == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar0));
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar0 + 8));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        if (T > 1) arm(bar0 + 8, bytes);  // h of step 1, into buffer 1
    }
    auto load_gin = [&](float (&gin)[NT][4], int t) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const int row = row0 + nt * 8 + rrow;
#pragma unroll
            for (int gate = 0; gate < 4; ++gate)
                gin[nt][gate] = row < B && t < T ? gx[((size_t)t * B + row) * 4 * H + gate * H + hcol] : 0.0f;
        }
    };
    float gin[NT][4], c[NT] = {};
    load_gin(gin, 0);
    uint32_t parity = 0;  // bit b: the parity of buffer b's phase waited for next
    cluster.sync();  // every block's barriers made and h zeroed before any block sends
    for (int t = 0; t < T; ++t) {
        const int buf = t & 1;
        if (t > 0) {
            wait_phase(bar0 + 8 * buf, (parity >> buf) & 1);
            parity ^= 1u << buf;
        }
        if (tid == 0 && t + 2 < T) arm(bar0 + 8 * buf, bytes);  // its next phase: h of step t + 2
        const __nv_bfloat16* h = hs + buf * CLUSTER * R * HP;
        float acc[SETS][NT][4] = {};
#pragma unroll
        for (int kt = 0; kt < K_TILES; ++kt) {
            // k = kt * 16 + 2 tg: sender kt / 2, its unit (kt % 2) * 16 + 2 tg
            const __nv_bfloat16* from = h + (kt >> 1) * R * HP + (kt & 1) * 16 + 2 * tg;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
                mma(acc[kt % SETS][nt], a[kt], *reinterpret_cast<const uint32_t*>(from + (nt * 8 + g) * HP),
                    *reinterpret_cast<const uint32_t*>(from + (nt * 8 + g) * HP + 8));
        }
        float hv[NT];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            float v[4];  // gate q of (unit gh, rows 2tg, 2tg + 1), (unit 2 + gh, the same rows)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                v[j] = acc[0][nt][j];
#pragma unroll
                for (int set = 1; set < SETS; ++set) v[j] += acc[set][nt][j];
            }
            // the 4 x 4 transpose among lanes 4 apart: slot s of v is (unit, row) s, to the lane of gate
            // s; this lane ends with the 4 gates of its own slot q
            const float own = pick(v, q);
            float gates[4] = {own, own, own, own};  // (slot q's own gate stays; the others are replaced)
#pragma unroll
            for (int r = 1; r < 4; ++r) {
                const float got = __shfl_xor_sync(0xffffffffu, pick(v, q ^ r), 4 * r);
                const int slot = q ^ r;  // the gate `got` is, of this lane's (unit, row)
                gates[0] = slot == 0 ? got : gates[0];
                gates[1] = slot == 1 ? got : gates[1];
                gates[2] = slot == 2 ? got : gates[2];
                gates[3] = slot == 3 ? got : gates[3];
            }
            const float ig = sigmoid(gates[0] + gin[nt][0]), fg = sigmoid(gates[1] + gin[nt][1]);
            const float gg = tanh_(gates[2] + gin[nt][2]), og = sigmoid(gates[3] + gin[nt][3]);
            c[nt] = fg * c[nt] + ig * gg;
            hv[nt] = og * tanh_(c[nt]);
            const int row = row0 + nt * 8 + rrow;
            if (row < B) y[((size_t)t * B + row) * H + hcol] = hv[nt];
        }
        load_gin(gin, t + 1);
        if (t + 1 < T) {
            const int next = (t + 1) & 1;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
                stage[(next * R + nt * 8 + rrow) * HP + warp * 4 + unit] = __float2bfloat16_rn(hv[nt]);
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // (the copies read them)
            __syncthreads();
            if (tid < CLUSTER)  // one copy a receiving block
                send(cluster_address(hs0 + (next * CLUSTER + rank) * part, tid), stage0 + next * part, part,
                     cluster_address(bar0 + 8 * next, tid));
        }
    }
    cluster.sync();  // no block leaves while another may still write into it
}

static float bf16_round(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// Runs `launch(config, u, gx, y, hg)` (hg: two steps of h of every cluster's rows in global memory, for
// THROUGH_L2) over B rows of T random steps, R rows a cluster: checks it against float64 where `check`,
// then times it.
template <typename Kernel, typename Launch>
static int run(Kernel kernel, Launch launch, size_t smem, int R, int B, int T, bool check, const char* what)
{
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    const float scale = 1.0f / std::sqrt((float)H);
    std::vector<__nv_bfloat16> u(4 * H * H);
    std::vector<float> ur(4 * H * H), gx((size_t)T * B * 4 * H);
    for (size_t e = 0; e < u.size(); ++e) {
        ur[e] = bf16_round(dist(rng) * scale);
        u[e] = __float2bfloat16_rn(ur[e]);
    }
    for (auto& v : gx) v = dist(rng);
    __nv_bfloat16 *du, *dhg;
    float *dgx, *dy;
    const int clusters = (B + R - 1) / R;
    CHECK(cudaMalloc(&du, u.size() * sizeof(__nv_bfloat16)));
    CHECK(cudaMalloc(&dgx, gx.size() * sizeof(float)));
    CHECK(cudaMalloc(&dy, (size_t)T * B * H * sizeof(float)));
    CHECK(cudaMalloc(&dhg, (size_t)2 * clusters * R * H * sizeof(__nv_bfloat16)));
    CHECK(cudaMemset(dhg, 0, (size_t)2 * clusters * R * H * sizeof(__nv_bfloat16)));
    CHECK(cudaMemcpy(du, u.data(), u.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dgx, gx.data(), gx.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    cudaFuncAttributes attributes;
    CHECK(cudaFuncGetAttributes(&attributes, kernel));
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(clusters * CLUSTER);
    config.blockDim = dim3(THREADS);
    config.dynamicSmemBytes = smem;
    cudaLaunchAttribute attribute;
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = CLUSTER;
    attribute.val.clusterDim.y = attribute.val.clusterDim.z = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
    int fit = 0;
    CHECK(cudaOccupancyMaxActiveClusters(&fit, kernel, &config));
    std::printf("B=%d T=%d R=%d %s: %d clusters of %d blocks, %d registers, %d spilled bytes, %.1f KiB "
                "shared; %d clusters fit at once\n", B, T, R, what, clusters, CLUSTER, attributes.numRegs,
                (int)attributes.localSizeBytes, smem / 1024.0, fit);
    if (fit < clusters) {
        std::printf("does not fit\n");
        return 0;
    }
    auto go = [&] { CHECK(launch(config, (const __nv_bfloat16*)du, (const float*)dgx, dy, dhg)); };
    go();
    CHECK(cudaDeviceSynchronize());
    int status = 0;
    if (check) {
        std::vector<float> y((size_t)T * B * H);
        CHECK(cudaMemcpy(y.data(), dy, y.size() * sizeof(float), cudaMemcpyDeviceToHost));
        double err = 0.0, mag = 0.0;
        // the reference, in float64, h rounded to bf16 for its product: the first row and the last (the
        // host's float64 is slow)
        for (int b : {0, B - 1}) {
            std::vector<double> h(H, 0.0), c(H, 0.0), hb(H, 0.0), gate(4 * H);
            for (int t = 0; t < T; ++t) {
                for (int n = 0; n < 4 * H; ++n) {
                    double s = gx[((size_t)t * B + b) * 4 * H + n];
                    const float* row = &ur[(size_t)n * H];
                    for (int k = 0; k < H; ++k) s += (double)row[k] * hb[k];
                    gate[n] = s;
                }
                for (int j = 0; j < H; ++j) {
                    const double i = 1 / (1 + std::exp(-gate[j])), f = 1 / (1 + std::exp(-gate[H + j]));
                    const double gg = std::tanh(gate[2 * H + j]), o = 1 / (1 + std::exp(-gate[3 * H + j]));
                    c[j] = f * c[j] + i * gg;
                    h[j] = o * std::tanh(c[j]);
                    const double got = y[((size_t)t * B + b) * H + j];
                    err = std::max(err, std::fabs(got - h[j]));
                    mag = std::max(mag, std::fabs(h[j]));
                    hb[j] = bf16_round((float)got);  // (the kernel's own h: a rounding that tips one way
                }                                    // there and the other here does not grow)
            }
        }
        std::printf("max abs error against float64 with the same bf16 U and h: %.2e (largest |y| %.3f)\n", err,
                    mag);
        status = err < 1e-3 ? 0 : 2;
    }
    const float ms = median_event_ms(go, 21);
    std::printf("recurrence of %d steps: median %.4f ms, %.3f us a step\n", T, ms, 1e3f * ms / T);
    CHECK(cudaFree(du));
    CHECK(cudaFree(dgx));
    CHECK(cudaFree(dy));
    CHECK(cudaFree(dhg));
    return status;
}

template <int R, int WM> static int run_registers(int B, int T, bool products, int flags)
{
    constexpr int WK = WARPS / WM;
    const size_t smem = (size_t)2 * R * HS * 2 + (size_t)WK * COLS * (R + 1) * 4 + (size_t)R * UNITS * 2;
    const bool check = products && !(flags & (NO_GX | NO_REMOTE | NO_CLUSTER_SYNC | NO_CELL));
    char what[64];
    std::snprintf(what, sizeof what, "WM=%d flags=%d%s", WM, flags, products ? "" : " (no products)");
    auto body = [&](auto kernel) {
        return run(kernel, [&](cudaLaunchConfig_t& config, const __nv_bfloat16* u, const float* gx, float* y,
                               __nv_bfloat16* hg) {
            return cudaLaunchKernelEx(&config, kernel, u, gx, y, T, B, hg, flags);
        }, smem, R, B, T, check, what);
    };
    return products ? body(lstm_registers<R, WM, true>) : body(lstm_registers<R, WM, false>);
}

template <int NT> static int run_async(int B, int T)
{
    const size_t smem = 16 + (size_t)2 * (CLUSTER + 1) * 8 * NT * HP * 2;
    auto kernel = lstm_async<NT>;
    return run(kernel, [&](cudaLaunchConfig_t& config, const __nv_bfloat16* u, const float* gx, float* y,
                           __nv_bfloat16*) { return cudaLaunchKernelEx(&config, kernel, u, gx, y, T, B); },
               smem, 8 * NT, B, T, true, "second layout (bulk copies counted by mbarriers)");
}

int main(int argc, char** argv)
{
    const int B = argc > 1 ? std::atoi(argv[1]) : 8, T = argc > 2 ? std::atoi(argv[2]) : 100;
    const int R = argc > 3 ? std::atoi(argv[3]) : 8, WM = argc > 4 ? std::atoi(argv[4]) : 2;
    const bool products = argc > 5 ? std::atoi(argv[5]) != 0 : true;
    const int flags = argc > 6 ? std::atoi(argv[6]) : 0;
    if (WM == 0) {  // the second layout
        if (R == 8) return run_async<1>(B, T);
        if (R == 16) return run_async<2>(B, T);
        if (R == 24) return run_async<3>(B, T);
        if (R == 40) return run_async<5>(B, T);
    }
#define CASE(r, wm) \
    if (R == r && WM == wm) return run_registers<r, wm>(B, T, products, flags);
    CASE(8, 1) CASE(8, 2) CASE(8, 4) CASE(8, 8)
    CASE(16, 2) CASE(16, 4) CASE(16, 8)
    CASE(24, 4) CASE(24, 8)
    CASE(32, 4) CASE(32, 8)
    CASE(40, 8)
#undef CASE
    std::fprintf(stderr, "no kernel for R=%d WM=%d\n", R, WM);
    return 1;
}
