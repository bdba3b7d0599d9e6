/* A program's launches put on a stream in one call from Python.
 *
 * Python builds a program once (its kernels, grids, argument tables, cuBLAS calls, copies, fills and
 * events) and
 * then, at every run, gives the bases of the run's memory (a tensor's address, say) and the stream; this
 * code writes each pointer argument (a base plus a fixed offset) into the argument tables and makes the
 * calls. That is one call from Python per forward or backward pass instead of one per launch: Python's
 * share of a launch costs several microseconds, the driver's about one.
 *
 * It loads nothing and links nothing: the driver's and cuBLAS's entry points are given by the caller
 * (gpu_runtime/launch_list.py), as cuBLAS comes from wherever the process found it. */
#include <cuda.h>
#include <stddef.h>
#include <stdint.h>

enum { CF_KERNEL, CF_COOPERATIVE, CF_EARLY, CF_COPY, CF_RECORD, CF_WAIT, CF_SGEMM, CF_GEMM_EX, CF_FILL,
       CF_GEMM_EX_DEVICE };
enum { CF_POINTER_MODE_HOST, CF_POINTER_MODE_DEVICE };  /* cublasPointerMode_t */

/* cuBLAS's entry points, declared here so that no cuBLAS header is needed: handles are pointers, its
 * enums ints, its status an int (0: success). */
typedef int (*cf_sgemm)(void *, int, int, int, int, int, const float *, const float *, int, const float *,
                        int, const float *, float *, int);
typedef int (*cf_gemm_ex)(void *, int, int, int, int, int, const void *, const void *, int, int, const void *,
                          int, int, const void *, void *, int, int, int, int);
typedef int (*cf_set_stream)(void *, CUstream);
typedef int (*cf_set_pointer_mode)(void *, int);

typedef struct {
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       CUstream, void **, void **);
    CUresult (*launch_cooperative)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   unsigned, CUstream, void **);
    CUresult (*launch_ex)(const CUlaunchConfig *, CUfunction, void **, void **);
    CUresult (*copy)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*record)(CUevent, CUstream);
    CUresult (*wait)(CUstream, CUevent, unsigned);
    CUresult (*synchronize)(void);
    cf_sgemm sgemm;
    cf_gemm_ex gemm_ex;
    cf_set_stream set_stream;
    CUresult (*fill)(CUdeviceptr, unsigned, size_t, CUstream);
    cf_set_pointer_mode set_pointer_mode;
} cf_api;

/* One call. Its arguments are `args` 8-byte slots of `values` from `first`; a kernel reads them through
 * `params` (one pointer per slot, from `first` too), an int argument from its slot's first 4 bytes. */
typedef struct {
    int32_t kind, stream;
    void *function;           /* the kernel, or the event of a record or a wait */
    uint32_t grid[3], block, smem;
    int32_t first, args;
} cf_op;

typedef struct {
    const cf_api *api;
    int32_t n_ops, n_patches;
    const cf_op *ops;
    uint64_t *values;
    void **params;
    /* before a run: values[patch_value[j]] = bases[patch_base[j]] + patch_offset[j] */
    const int32_t *patch_value, *patch_base;
    const int64_t *patch_offset;
    CUstream *streams;        /* [0] is the caller's, set by each run; the others are the program's */
    void *const *handles;     /* a cuBLAS handle per stream, [0] pointed at streams[0] by a run */
    CUstream handle_stream;   /* the stream handles[0] was last set to */
    CUlaunchConfig *configs;  /* per op, for the early launches */
} cf_program;

/* The error of the call that failed: its index in *failed, the driver's CUresult (or cuBLAS's status
 * plus 100000) returned. With `checked`, each call is waited for, so that a faulting kernel is named. */
int cf_run(cf_program *p, uint64_t stream, const uint64_t *bases, int checked, int32_t *failed)
{
    const cf_api *api = p->api;
    CUstream caller = (CUstream)(uintptr_t)stream;
    for (int32_t j = 0; j < p->n_patches; ++j)
        p->values[p->patch_value[j]] = bases[p->patch_base[j]] + (uint64_t)p->patch_offset[j];
    p->streams[0] = caller;
    if (p->handles && p->handles[0] && p->handle_stream != caller) {
        int status = api->set_stream(p->handles[0], caller);
        if (status) { *failed = -1; return 100000 + status; }
        p->handle_stream = caller;
    }
    for (int32_t i = 0; i < p->n_ops; ++i) {
        const cf_op *op = &p->ops[i];
        CUstream s = p->streams[op->stream];
        uint64_t *v = p->values + op->first;
        void **params = p->params + op->first;
        int err = 0;
        switch (op->kind) {
        case CF_KERNEL:
            err = api->launch((CUfunction)op->function, op->grid[0], op->grid[1], op->grid[2], op->block, 1, 1,
                              op->smem, s, params, NULL);
            break;
        case CF_COOPERATIVE:
            err = api->launch_cooperative((CUfunction)op->function, op->grid[0], op->grid[1], op->grid[2],
                                          op->block, 1, 1, op->smem, s, params);
            break;
        case CF_EARLY:
            p->configs[i].hStream = s;
            err = api->launch_ex(&p->configs[i], (CUfunction)op->function, params, NULL);
            break;
        case CF_COPY:  /* dst, src, bytes */
            err = api->copy((CUdeviceptr)v[0], (CUdeviceptr)v[1], (size_t)v[2], s);
            break;
        case CF_FILL:  /* dst, a 32-bit pattern, words */
            err = api->fill((CUdeviceptr)v[0], (unsigned)v[1], (size_t)v[2], s);
            break;
        case CF_RECORD:
            err = api->record((CUevent)op->function, s);
            break;
        case CF_WAIT:
            err = api->wait(s, (CUevent)op->function, 0);
            break;
        case CF_SGEMM: {  /* handle, op W, op A, n, m, k, alpha, W, ldw, A, lda, beta, C, ldc */
            int status = api->sgemm((void *)v[0], (int)v[1], (int)v[2], (int)v[3], (int)v[4], (int)v[5],
                                    (const float *)v[6], (const float *)v[7], (int)v[8], (const float *)v[9],
                                    (int)v[10], (const float *)v[11], (float *)v[12], (int)v[13]);
            err = status ? 100000 + status : 0;
            break;
        }
        case CF_GEMM_EX:
        case CF_GEMM_EX_DEVICE: {  /* handle, op W, op A, n, m, k, alpha, W, type, ldw, A, type, lda, beta, C,
                                      type, ldc, compute type, algorithm; alpha and beta host addresses, or
                                      device ones (the handle's pointer mode set for this call alone) */
            const int device = op->kind == CF_GEMM_EX_DEVICE;
            int status = device ? api->set_pointer_mode((void *)v[0], CF_POINTER_MODE_DEVICE) : 0;
            if (!status)
                status = api->gemm_ex((void *)v[0], (int)v[1], (int)v[2], (int)v[3], (int)v[4], (int)v[5],
                                      (const void *)v[6], (const void *)v[7], (int)v[8], (int)v[9],
                                      (const void *)v[10], (int)v[11], (int)v[12], (const void *)v[13],
                                      (void *)v[14], (int)v[15], (int)v[16], (int)v[17], (int)v[18]);
            if (device) {
                const int reset = api->set_pointer_mode((void *)v[0], CF_POINTER_MODE_HOST);
                status = status ? status : reset;
            }
            err = status ? 100000 + status : 0;
            break;
        }
        default:
            err = -1;
        }
        if (!err && checked)
            err = api->synchronize();
        if (err) { *failed = i; return err; }
    }
    return 0;
}

/* Fills the launch configurations of the early launches from their ops: each may start while the kernel
 * before it on its stream ends (programmatic stream serialization; it waits for it at its top). */
static CUlaunchAttribute early_attribute = {
    .id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
    .value = {.programmaticStreamSerializationAllowed = 1},
};

void cf_prepare(cf_program *p)
{
    for (int32_t i = 0; i < p->n_ops; ++i) {
        const cf_op *op = &p->ops[i];
        if (op->kind != CF_EARLY)
            continue;
        CUlaunchConfig *c = &p->configs[i];
        c->gridDimX = op->grid[0];
        c->gridDimY = op->grid[1];
        c->gridDimZ = op->grid[2];
        c->blockDimX = op->block;
        c->blockDimY = c->blockDimZ = 1;
        c->sharedMemBytes = op->smem;
        c->hStream = NULL;
        c->attrs = &early_attribute;
        c->numAttrs = 1;
    }
}

/* The size of the structures, for the caller's check that its layout of them is this one. */
int cf_sizes(int32_t *out)
{
    out[0] = (int32_t)sizeof(cf_api);
    out[1] = (int32_t)sizeof(cf_op);
    out[2] = (int32_t)sizeof(cf_program);
    out[3] = (int32_t)sizeof(CUlaunchConfig);
    out[4] = (int32_t)sizeof(CUlaunchAttribute);
    return 5;
}
