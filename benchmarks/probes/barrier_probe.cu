// What a grid-wide barrier costs on this GPU, per barrier, with every block resident (one per SM):
// cooperative groups' grid.sync() against a counter barrier with acquire/release atomics, and a thread
// block cluster's barrier (which spans only the cluster's blocks, for comparison).
//   nvcc -O3 -arch=sm_90 benchmarks/probes/barrier_probe.cu -o barrier_probe && ./barrier_probe
#include <cooperative_groups.h>
#include <cuda/atomic>
#include <cstdio>

namespace cg = cooperative_groups;

__global__ void grid_sync(int n) {
    cg::grid_group grid = cg::this_grid();
    for (int i = 0; i < n; ++i) grid.sync();
}

// Every block adds one to the count; the last to arrive resets it and moves the generation on, which
// the others wait for. Acquire and release order the blocks' memory around it.
__global__ void counter_sync(int n, unsigned* count, unsigned* generation) {
    cuda::atomic_ref<unsigned, cuda::thread_scope_device> c(*count), g(*generation);
    for (int i = 0; i < n; ++i) {
        __syncthreads();
        if (threadIdx.x == 0) {
            const unsigned gen = g.load(cuda::memory_order_relaxed);
            if (c.fetch_add(1, cuda::memory_order_acq_rel) == gridDim.x - 1) {
                c.store(0, cuda::memory_order_relaxed);
                g.store(gen + 1, cuda::memory_order_release);
            } else {
                while (g.load(cuda::memory_order_acquire) == gen) {}
            }
        }
        __syncthreads();
    }
}

__global__ void __cluster_dims__(8, 1, 1) cluster_sync(int n) {
    cg::cluster_group cluster = cg::this_cluster();
    for (int i = 0; i < n; ++i) cluster.sync();
}

int main() {
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    const int blocks = sms / 8 * 8, threads = 256, n = 10000;
    unsigned* counters;
    cudaMalloc(&counters, 2 * sizeof(unsigned));
    cudaMemset(counters, 0, 2 * sizeof(unsigned));
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    for (int kind = 0; kind < 3; ++kind) {
        float best = 1e30f;
        for (int rep = 0; rep < 5; ++rep) {
            int count = n;
            unsigned *c = counters, *g = counters + 1;
            cudaEventRecord(a);
            if (kind == 0) {
                void* args[] = {&count};
                cudaLaunchCooperativeKernel((void*)grid_sync, blocks, threads, args, 0, 0);
            } else if (kind == 1) {
                void* args[] = {&count, &c, &g};
                cudaLaunchCooperativeKernel((void*)counter_sync, blocks, threads, args, 0, 0);
            } else {
                cluster_sync<<<blocks, threads>>>(count);
            }
            cudaEventRecord(b);
            cudaEventSynchronize(b);
            float ms = 0;
            cudaEventElapsedTime(&ms, a, b);
            if (ms < best) best = ms;
        }
        const char* name[] = {"cooperative groups grid.sync()", "acquire/release counter", "cluster of 8: cluster.sync()"};
        printf("%-32s %d blocks x %d threads: %.3f us per barrier (%s)\n", name[kind], blocks, threads,
               best * 1e3f / n, cudaGetErrorString(cudaGetLastError()));
    }
    return 0;
}
