"""IndRNN's forward at B=64 (T=100, input = hidden = 512) under `persistent`: the executor's (the
warpgroup GEMM reading W's image, kept apart; the persistent scan launched early, programmatic dependent
launch) beside variants, each variant's whole forward replayed from a CUDA graph: where the time goes,
and which change would shorten it.

Variants:
- W's image made by every run (as before it was kept apart), and parts of the forward alone (their
  outputs then are not checked, only timed);
- scan: the generated kernel launched without programmatic dependent launch; with parts of its text
  taken out (cooperative groups' grid object, the masks of its elements: right at these sizes, where
  every thread has one element); a plain thread-per-element scan with the same arguments.
(Earlier versions: at 76a1f60, the GEMM with other stages, PDL triggers at the GEMM's start or after its
main loop, 32 steps ahead, none faster:
benchmarks/results/h100_2026-11-27_indrnn_kernels_probe_76a1f60.json; at 9465bdc, the element loops' guards
as branches taken out, 2.3 us faster, which the kernel's masks now are:
benchmarks/results/h100_2026-11-27_indrnn_kernels_probe_9465bdc.json.)
Every variant's output is compared with the executor's, and the executor's with the float64 reference,
before anything is timed. The variants are timed in turns (ROUNDS of them), each turn the median of RUNS
replays, so that a drift of the GPU's clock reaches all of them alike.

    python3 benchmarks/probes/indrnn_kernels_probe.py --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import UTC, datetime
from functools import partial

import numpy as np

import cellfuse.codegen.persistent_cuda as cuda_persistent
import cellfuse.gpu_runtime.cuda_executor as cuda_executor
from cellfuse.codegen import make_plan, plan_kernels
from cellfuse.gpu_runtime.cuda_executor import CudaExecutor, _compile, device_description
from cellfuse.gpu_runtime.driver import check as _cu_check
from cellfuse.gpu_runtime.event_timing import median_ms
from cellfuse.graph_model import Sizes, init_params, load_template
from cellfuse.graph_model.reference import run_reference

T, B, H = 100, 64, 512
ROUNDS, RUNS = 7, 40
WAIT = 'asm volatile("griddepcontrol.wait;" ::: "memory");'
PLAIN_SCAN = r"""
// the generated kernel's arguments: u, the states' slots (slot t: h before step t), xW, b, h0, final h
extern "C" __global__ void __launch_bounds__(256) plain_scan(
    int seq, int batch, const float* __restrict__ u, float* __restrict__ hs, const float* __restrict__ xw,
    const float* __restrict__ b, const float* __restrict__ h0, float* __restrict__ final_h)
{
    @WAIT@
    const int n = batch * 512, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float uu = u[i % 512], bb = b[i % 512];
    float h = h0 ? h0[i] : 0.0f;
    hs[i] = h;
    #pragma unroll @UNROLL@
    for (int t = 0; t < seq; ++t) {
        h = fmaxf(xw[(size_t)t * n + i] + uu * h + bb, 0.0f);
        hs[(size_t)(t + 1) * n + i] = h;
    }
    if (final_h) final_h[i] = h;
}
"""


class DriverKernel:
    """A kernel launched through the driver API: plainly, or with programmatic stream serialization."""

    def __init__(self, cu, cubin: bytes, name: str, smem: int = 0):
        self.cu = cu
        self.module = _cu_check(cu.cuModuleLoadData(cubin))
        self.function = _cu_check(cu.cuModuleGetFunction(self.module, name.encode()))
        self.smem = smem
        if smem:
            _cu_check(cu.cuFuncSetAttribute(
                self.function, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem))

    def call(self, grid, threads: int, stream, args: list, pdl: bool = False):
        cu = self.cu
        values = [np.array([v], np.int32 if kind == "i" else np.uint64) for kind, v in args]
        table = np.array([v.ctypes.data for v in values], np.uint64)
        config = cu.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = (*grid, 1) if len(grid) == 2 else (grid[0], 1, 1)
        config.blockDimX, config.blockDimY, config.blockDimZ = threads, 1, 1
        config.sharedMemBytes = self.smem
        config.hStream = cu.CUstream(stream.handle)
        if pdl:
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            config.attrs = [attr]
            config.numAttrs = 1
        else:
            config.numAttrs = 0

        def launch(values=values):
            _cu_check(cu.cuLaunchKernelEx(config, self.function, table.ctypes.data, 0))
        return launch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json")
    args = p.parse_args(argv)
    cell = load_template("indrnn")
    cuda_executor.CudaExecutor._route = lambda *a: "wgmma"  # the route this probe studies
    target = cuda_executor.device_target()
    plan = make_plan(cell, Sizes(T, B, H, H), "persistent", target)
    params = init_params(cell, 1, H, H, 0)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((T, B, H)).astype(np.float32)
    (state,) = plan.state_ids
    h0 = rng.uniform(0, 1, (1, B, H)).astype(np.float32)
    ref = run_reference(cell, params, {"x": x, state: h0})
    ex = CudaExecutor(plan, params)
    drv, cu, stream = ex.drv, ex.cu, ex.stream
    ex.load(x, {state: h0})
    gemm, scan = ex.calls  # the GEMM (W's image kept apart), the persistent kernel
    ((image,),) = ex.image_calls.values()  # (the route measured for this shape: the warpgroup GEMM)
    assert scan.func.__name__ == "_launch_early", [c.func for c in ex.calls]
    (_, _, _, c, xp, pieces, m, n, k, lda, ldc, acc) = gemm.args
    persistent = next(i for i in ex.program.instructions if type(i).__name__ == "Persistent").launch
    buffers = cuda_persistent.persistent_buffers(persistent)
    scan_args = [("i", T), ("i", B)] + [("p", ex.addr[b]) for b in buffers]
    y_at = ex.addr[plan.layers[-1].output_seq] + 4 * B * H

    def output() -> np.ndarray:
        stream.synchronize()
        y = np.empty((T, B, H), np.float32)
        drv.memcpy_dtoh(y, y_at)
        return y

    # the executor's forward, checked against the reference
    ex.capture_graph()
    ex.forward()
    y_exec = output()
    scale = float(np.abs(ref.y).max())
    error = float(np.abs(y_exec - ref.y).max()) / scale
    assert error < 1e-4, f"the executor's forward: error {error:.2e} of the largest output"
    print(f"{device_description()}; the executor's forward: error {error:.1e}", flush=True)

    variants: dict[str, list] = {"executor": [gemm, scan]}
    checked = {"executor"}
    variants["executor, W's image made by every run"] = [image, gemm, scan]
    variants["parts: GEMM alone"] = [gemm]
    variants["parts: scan alone"] = [scan]
    variants["parts: image alone"] = [image]

    def plain(kernel: DriverKernel, pdl: bool = True, blocks: int = persistent.blocks):
        return kernel.call((blocks,), persistent.threads, stream, scan_args, pdl)

    kernels = plan_kernels(plan)
    (name,) = [nm for launch, nm in kernels.name_of.items() if launch is persistent]
    source, body = kernels.module_source(), kernels.sources[name]
    assert "griddepcontrol.wait" in body
    edits = {
        "no cooperative groups": [
            ("    cooperative_groups::grid_group grid = cooperative_groups::this_grid();\n", ""),
            ("(void)grid; ", "")],
        "no element masks": [("if (cf_ok) ", ""),
                             ("cf_ok ? (long long)r * 512 + j : 0", "(long long)r * 512 + j")],
    }
    edits["neither"] = [e for edit in edits.values() for e in edit]
    variants["scan: generated, without programmatic dependent launch"] = [
        gemm, plain(DriverKernel(cu, _compile(source), name, persistent.smem_bytes), pdl=False)]
    for label, pairs in edits.items():
        edited = body
        for old, new in pairs:
            assert old in edited, (label, old)
            edited = edited.replace(old, new)
        kernel = DriverKernel(cu, _compile(source.replace(body, edited)), name, persistent.smem_bytes)
        variants[f"scan: generated, {label}"] = [gemm, plain(kernel)]
    for unroll in (16, 32):
        text = PLAIN_SCAN.replace("@WAIT@", WAIT).replace("@UNROLL@", str(unroll))
        kernel = DriverKernel(cu, _compile(text), "plain_scan")
        variants[f"scan: plain, unroll {unroll}"] = [gemm, plain(kernel, blocks=B * H // 256)]

    graphs, errors = {}, {}
    for label, calls in variants.items():
        graphs[label] = ex.capture(calls)
        if label.startswith("parts") or label in checked:
            continue
        drv.memset_d32(y_at, 0x7FC00000, T * B * H)
        ex.replay(graphs[label])
        errors[label] = float(np.abs(output() - y_exec).max()) / scale
        print(f"{label}: difference from the executor {errors[label]:.1e}", flush=True)
        assert errors[label] < 1e-5, label
    times: dict[str, list[float]] = {label: [] for label in graphs}
    for graph in graphs.values():  # warm
        for _ in range(20):
            ex.replay(graph)
    for _ in range(ROUNDS):
        for label, graph in graphs.items():
            times[label].append(median_ms(drv, partial(ex.replay, graph), stream, RUNS))
    results = {label: {"median_ms": round(statistics.median(ts), 4), "min_ms": round(min(ts), 4),
                       "rounds_ms": [round(t, 4) for t in ts], "difference": errors.get(label)}
               for label, ts in times.items()}
    for label, r in results.items():
        print(f"{r['median_ms']:.4f} ms (min {r['min_ms']:.4f})  {label}", flush=True)
    if args.json:
        record = {"command": "python3 benchmarks/probes/indrnn_kernels_probe.py --json OUT",
                  "gpu": device_description(), "date": datetime.now(UTC).isoformat(timespec="seconds"),
                  "sizes": {"seq": T, "batch": B, "input": H, "hidden": H}, "reference_error": error,
                  "rounds": ROUNDS, "runs_per_round": RUNS, "variants": results}
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    for graph in graphs.values():
        ex.release(graph)
    ex.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
