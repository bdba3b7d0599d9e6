// What the probes written in CUDA C++ share: a runtime call checked (a failure printed with the call, then
// exit), and the median time of a launch over CUDA events.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(call)                                                                                    \
    do {                                                                                               \
        cudaError_t e_ = (call);                                                                       \
        if (e_ != cudaSuccess) {                                                                       \
            std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_));                   \
            std::exit(1);                                                                              \
        }                                                                                              \
    } while (0)

// The median of `runs` timings of `launch()` on the default stream, each between two events, in ms.
template <typename Launch> float median_event_ms(Launch launch, int runs)
{
    cudaEvent_t start, end;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&end));
    std::vector<float> ms;
    for (int i = 0; i < runs; ++i) {
        CHECK(cudaEventRecord(start));
        launch();
        CHECK(cudaEventRecord(end));
        CHECK(cudaEventSynchronize(end));
        float m = 0;
        CHECK(cudaEventElapsedTime(&m, start, end));
        ms.push_back(m);
    }
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(end));
    std::sort(ms.begin(), ms.end());
    return ms[runs / 2];
}
