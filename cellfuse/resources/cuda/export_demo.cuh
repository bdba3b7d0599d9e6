// The demo program of an exported .cu (built with -DCELLFUSE_DEMO_MAIN): it checks and times the
// forward pass, and with a backward pass checks it against finite differences. The exported file defines,
// before it, CF_DEMO_FORWARD, CF_DEMO_WORKSPACE (and CF_DEMO_BACKWARD where it has a backward pass, and
// CF_DEMO_BIDIRECTIONAL where it has a launcher of both directions, which the demo then runs): its
// functions; CF_DEMO_PARAMS, CF_DEMO_INPUT and CF_DEMO_HIDDEN: its sizes; and CF_DEMO_PARAM_SIZES: the
// parameters' sizes, in floats, in order (of one direction).
#ifdef CELLFUSE_DEMO_MAIN
#include <stdio.h>
#include <stdlib.h>
#include <math.h>

#define CHECK(call) do { int e_ = (int)(call); if (e_) { \
    fprintf(stderr, "%s:%d: error %d\n", __FILE__, __LINE__, e_); exit(1); } } while (0)

static float* read_file(const char* path, size_t n) {
    FILE* f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "cannot open %s\n", path); exit(1); }
    float* h = (float*)malloc(n * sizeof(float));
    if (fread(h, sizeof(float), n, f) != n) {
        fprintf(stderr, "%s: expected %zu floats\n", path, n);
        exit(1);
    }
    fclose(f);
    return h;
}

#ifdef CF_DEMO_BIDIRECTIONAL
enum { CF_DEMO_DIRECTIONS = 2 };  /* the parameters of the forward direction, then the reverse one's */
static cublasHandle_t cf_demo_handle_reverse;
static cudaStream_t cf_demo_stream_reverse;
#else
enum { CF_DEMO_DIRECTIONS = 1 };
#endif

/* The pass the demo checks and times: the forward pass, or both directions' */
static int demo_forward(cublasHandle_t handle, cudaStream_t stream, int seq, int batch, const float* x,
                        const float* const* params, float* y, void* ws) {
#ifdef CF_DEMO_BIDIRECTIONAL
    return CF_DEMO_BIDIRECTIONAL(handle, cf_demo_handle_reverse, stream, cf_demo_stream_reverse, seq, batch,
                                 x, params, NULL, y, NULL, ws);
#else
    return CF_DEMO_FORWARD(handle, stream, seq, batch, x, params, NULL, y, NULL, ws);
#endif
}

static int cmp_float(const void* a, const void* b) {
    float x = *(const float*)a, y = *(const float*)b;
    return (x > y) - (x < y);
}

int main(int argc, char** argv) {
    int seq = argc > 2 ? atoi(argv[1]) : 100, batch = argc > 2 ? atoi(argv[2]) : 64;
    const char* prefix = argc > 3 ? argv[3] : NULL;
    const size_t sizes[] = {CF_DEMO_PARAM_SIZES};
    size_t total = 0;
    for (int i = 0; i < CF_DEMO_PARAMS * CF_DEMO_DIRECTIONS; ++i) total += sizes[i % CF_DEMO_PARAMS];
    size_t nx = (size_t)seq * batch * CF_DEMO_INPUT;
    size_t ny = (size_t)seq * batch * CF_DEMO_HIDDEN * CF_DEMO_DIRECTIONS;
    float *hp, *hx;
    char path[4096];
    if (prefix) {
        snprintf(path, sizeof path, "%s.params.f32", prefix); hp = read_file(path, total);
        snprintf(path, sizeof path, "%s.x.f32", prefix); hx = read_file(path, nx);
    } else {
        srand(0);
        hp = (float*)malloc((total ? total : 1) * sizeof(float));
        hx = (float*)malloc(nx * sizeof(float));
        float bound = 1.0f / sqrtf((float)CF_DEMO_HIDDEN);
        for (size_t i = 0; i < total; ++i) hp[i] = bound * (2.0f * rand() / RAND_MAX - 1.0f);
        for (size_t i = 0; i < nx; ++i) hx[i] = 2.0f * rand() / RAND_MAX - 1.0f;
    }
    float *dp, *dx, *dy;
    void* ws;
    CHECK(cudaMalloc(&dp, (total ? total : 1) * sizeof(float)));
    CHECK(cudaMalloc(&dx, nx * sizeof(float)));
    CHECK(cudaMalloc(&dy, ny * sizeof(float)));
    CHECK(cudaMalloc(&ws, CF_DEMO_WORKSPACE(seq, batch)));
    CHECK(cudaMemcpy(dp, hp, total * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dx, hx, nx * sizeof(float), cudaMemcpyHostToDevice));
    const float* params[CF_DEMO_PARAMS * CF_DEMO_DIRECTIONS + 1];
    size_t off = 0;
    for (int i = 0; i < CF_DEMO_PARAMS * CF_DEMO_DIRECTIONS; ++i) {
        params[i] = dp + off;
        off += sizes[i % CF_DEMO_PARAMS];
    }
    cublasHandle_t handle;
    CHECK(cublasCreate(&handle));
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
#ifdef CF_DEMO_BIDIRECTIONAL
    CHECK(cublasCreate(&cf_demo_handle_reverse));
    CHECK(cudaStreamCreate(&cf_demo_stream_reverse));
#endif
    CHECK(demo_forward(handle, stream, seq, batch, dx, params, dy, ws));
    CHECK(cudaStreamSynchronize(stream));
    float* hy = (float*)malloc(ny * sizeof(float));
    CHECK(cudaMemcpy(hy, dy, ny * sizeof(float), cudaMemcpyDeviceToHost));
    if (prefix) {
        snprintf(path, sizeof path, "%s.y.f32", prefix);
        FILE* f = fopen(path, "wb");
        if (!f || fwrite(hy, sizeof(float), ny, f) != ny) {
            fprintf(stderr, "cannot write %s\n", path);
            exit(1);
        }
        fclose(f);
    }
    enum { REPS = 20 };
    float ms[REPS];
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 3; ++i)
        CHECK(demo_forward(handle, stream, seq, batch, dx, params, dy, ws));
    for (int i = 0; i < REPS; ++i) {
        CHECK(cudaEventRecord(a, stream));
        CHECK(demo_forward(handle, stream, seq, batch, dx, params, dy, ws));
        CHECK(cudaEventRecord(b, stream));
        CHECK(cudaEventSynchronize(b));
        CHECK(cudaEventElapsedTime(&ms[i], a, b));
    }
    qsort(ms, REPS, sizeof(float), cmp_float);
    printf("seq %d batch %d: forward%s %.3f ms (median of %d), y[0] = %g\n", seq, batch,
           CF_DEMO_DIRECTIONS == 2 ? ", both directions," : "", ms[REPS / 2], REPS, hy[0]);
#ifdef CF_DEMO_BACKWARD
    /* The backward pass against finite differences of the forward, at three elements of the parameters
       (the first, the middle, the last): the loss is sum(seed * y), summed in double on the host. A cell
       with a kink (relu, max, abs) has many of them near any point, so the gradient must agree with the
       central difference or with one of the one-sided ones: a kink on one side spoils only that side's
       difference. */
    {
        float *dseed, *dgx, *dgp;
        float* hseed = (float*)malloc(ny * sizeof(float));
        for (size_t i = 0; i < ny; ++i) hseed[i] = 2.0f * rand() / RAND_MAX - 1.0f;
        CHECK(cudaMalloc(&dseed, ny * sizeof(float)));
        CHECK(cudaMalloc(&dgx, nx * sizeof(float)));
        CHECK(cudaMalloc(&dgp, (total ? total : 1) * sizeof(float)));
        CHECK(cudaMemcpy(dseed, hseed, ny * sizeof(float), cudaMemcpyHostToDevice));
        float* dparams[CF_DEMO_PARAMS + 1];
        off = 0;
        for (int i = 0; i < CF_DEMO_PARAMS; ++i) { dparams[i] = dgp + off; off += sizes[i]; }
        CHECK(CF_DEMO_FORWARD(handle, stream, seq, batch, dx, params, NULL, dy, NULL, ws));
        CHECK(CF_DEMO_BACKWARD(handle, stream, seq, batch, dx, params, dseed, NULL, dgx, NULL, dparams, ws));
        CHECK(cudaStreamSynchronize(stream));
        float* hg = (float*)malloc((total ? total : 1) * sizeof(float));
        CHECK(cudaMemcpy(hg, dgp, total * sizeof(float), cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int c = 0; c < 3 && total; ++c) {
            const size_t i = (size_t)c * (total - 1) / 2;
            const float keep = hp[i], eps = 1e-3f * fmaxf(1.0f, fabsf(keep));
            double loss[3];  /* at keep + eps, keep, keep - eps */
            for (int side = 0; side < 3; ++side) {
                const float v = side == 0 ? keep + eps : side == 1 ? keep : keep - eps;
                CHECK(cudaMemcpy(dp + i, &v, sizeof(float), cudaMemcpyHostToDevice));
                CHECK(CF_DEMO_FORWARD(handle, stream, seq, batch, dx, params, NULL, dy, NULL, ws));
                CHECK(cudaMemcpy(hy, dy, ny * sizeof(float), cudaMemcpyDeviceToHost));
                double sum = 0.0;
                for (size_t j = 0; j < ny; ++j) sum += (double)hseed[j] * hy[j];
                loss[side] = sum;
            }
            const double fd[3] = {(loss[0] - loss[2]) / (2.0 * eps), (loss[0] - loss[1]) / eps,
                                  (loss[1] - loss[2]) / eps};
            double err = 1e30;
            for (int k = 0; k < 3; ++k)  /* the floor: float32 rounding, over eps, for a gradient near 0 */
                err = fmin(err, fabs(fd[k] - hg[i]) / fmax(fmax(fabs(fd[k]), fabs((double)hg[i])), 1e-2));
            printf("backward: d loss / d params element %zu = %g, central difference %g, one-sided %g and %g "
                   "(relative %.1e)\n", i, hg[i], fd[0], fd[1], fd[2], err);
            if (err > 5e-2) bad = 1;
        }
        if (bad) {
            fprintf(stderr, "the backward pass disagrees with the finite differences\n");
            return 1;
        }
    }
#endif
    return 0;
}
#endif
