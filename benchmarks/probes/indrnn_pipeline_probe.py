"""Whether IndRNN's forward at B=64 (T=100, input = hidden = 512) gets faster when its hoisted 3xTF32 GEMM
and its recurrence run in chunks of steps side by side, instead of one after the other: the question
before the scheduler pipelines a persistent layer that has no barrier with its input projection.

Every variant runs in one CUDA graph: W split once; per chunk of steps, x's rows split and the TF32
GEMM over 3K (cuBLASLt, the algorithm the executor measures fastest) on one of `sides` side streams,
and the recurrence h = relu(xW + u * h + b) of the chunk's steps on the main stream once that chunk's
GEMM is done (a simple kernel: a thread per element of h, its loads a few steps ahead). With one chunk
it is the executor's order. Each variant's h is checked against a float64 recurrence over the numpy
product first. The executor's own forward (its persistent kernel) is timed beside them.

    python3 benchmarks/probes/indrnn_pipeline_probe.py [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import UTC, datetime

import numpy as np

from cellfuse.codegen import make_plan
from cellfuse.codegen.gemm_routes import SIDE_BY_SIDE, STACKED, split_threads
from cellfuse.codegen.kernel_abi import BLOCK
from cellfuse.gpu_runtime.cuda_executor import (
    _CUBLAS_WORKSPACE,
    CudaExecutor,
    _compile,
    device_description,
    device_target,
)
from cellfuse.gpu_runtime.tf32_gemms import Shape, alignment
from cellfuse.graph_model import Sizes, init_params
from cellfuse.graph_model.templates import load_template

T, B, H = 100, 64, 512
SCAN = r"""
extern "C" __global__ void __launch_bounds__(256) scan(
    const float* __restrict__ pre, const float* __restrict__ u, const float* __restrict__ b,
    float* __restrict__ hs, int t0, int t1, int n, int width)
{
    // hs: slot t holds h before step t (slot 0 the initial state); steps [t0, t1)
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float uu = u[i % width], bb = b[i % width];
    float h = hs[(size_t)t0 * n + i];
    #pragma unroll 8
    for (int t = t0; t < t1; ++t) {
        const float v = pre[(size_t)t * n + i] + uu * h + bb;
        h = v > 0.0f ? v : 0.0f;
        hs[(size_t)(t + 1) * n + i] = h;
    }
}
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json")
    args = p.parse_args(argv)
    cell = load_template("indrnn")
    plan = make_plan(cell, Sizes(T, B, H, H), "persistent", device_target())
    params = {k: v.astype(np.float32) for k, v in init_params(cell, 1, H, H, 0).items()}
    ex = CudaExecutor(plan, params)
    drv = ex.drv
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T * B, H)).astype(np.float32)
    w = (rng.standard_normal((H, H)) / np.sqrt(H)).astype(np.float32)
    u = rng.uniform(0, 1, H).astype(np.float32)
    bias = rng.uniform(-0.1, 0.1, H).astype(np.float32)
    h0 = rng.standard_normal((B, H)).astype(np.float32)

    n = B * H
    sizes = {"x": x.size, "w": w.size, "u": H, "b": H, "pre": T * n, "hs": (T + 1) * n,
             "a_cat": 3 * x.size, "w_cat": 3 * w.size}
    addr = {}
    memory = []
    for name, count in sizes.items():
        memory.append(drv.mem_alloc(4 * count + 256))
        addr[name] = (int(memory[-1]) + 255) // 256 * 256
    for name, arr in (("x", x), ("w", w), ("u", u), ("b", bias)):
        drv.memcpy_htod(addr[name], arr)
    module = drv.module_from_buffer(_compile(SCAN))
    scan = module.get_function("scan").prepare("PPPPiiii")
    split = ex.split_tf32x3

    main_stream = ex.stream
    sides = [drv.Stream(flags=1) for _ in range(4)]
    workspaces = [drv.mem_alloc(_CUBLAS_WORKSPACE) for _ in sides]
    scalars = np.array([1.0, 0.0], np.float32)
    one, zero = scalars.ctypes.data, scalars.ctypes.data + 4
    events = [drv.Event(drv.event_flags.DISABLE_TIMING) for _ in range(64)]

    def grid(threads):
        return (-(-threads // BLOCK), 1)

    def calls(chunks: int, nsides: int, with_scan: bool = True, with_gemm: bool = True):
        """The graph's launches for one variant, in capture order."""
        out, ev = [], iter(events)
        steps = [(T * c // chunks, T * (c + 1) // chunks) for c in range(chunks)]
        # W's split, then the fork to the side streams
        if with_gemm:
            out.append(lambda: split.prepared_async_call(grid(int(split_threads(H, H, STACKED))),
                                                         (BLOCK, 1, 1),
                                                         main_stream, addr["w_cat"], addr["w"], H, H, H,
                                                         STACKED, 1))
        fork = next(ev)
        out.append(lambda e=fork: e.record(main_stream))
        for s in sides[:nsides]:
            out.append(lambda s=s, e=fork: s.wait_for_event(e))
        for c, (t0, t1) in enumerate(steps):
            rows = (t1 - t0) * B
            side, ws = sides[c % nsides], workspaces[c % nsides]
            a_cat = addr["a_cat"] + 4 * t0 * B * 3 * H
            pre = addr["pre"] + 4 * t0 * n
            if with_gemm:
                out.append(lambda side=side, a_cat=a_cat, t0=t0, rows=rows: split.prepared_async_call(
                    grid(int(split_threads(rows, H, SIDE_BY_SIDE))), (BLOCK, 1, 1), side, a_cat,
                    addr["x"] + 4 * t0 * B * H, rows, H, H, SIDE_BY_SIDE, 2))
                shape = Shape(False, H, rows, 3 * H, H, 3 * H, H, 0,
                              (alignment(addr["w_cat"]), alignment(a_cat), alignment(pre)))
                chosen = ex.tf32_gemms.chosen(shape, side, int(ws))
                out.append(lambda side=side, ws=ws, chosen=chosen, a_cat=a_cat, pre=pre: ex.tf32_gemms.call(
                    chosen, side, int(ws), one, addr["w_cat"], a_cat, zero, pre))
            done = next(ev)
            out.append(lambda side=side, e=done: e.record(side))
            out.append(lambda e=done: main_stream.wait_for_event(e))
            if with_scan:
                out.append(lambda t0=t0, t1=t1: scan.prepared_async_call(
                    grid(n), (BLOCK, 1, 1), main_stream, addr["pre"], addr["u"], addr["b"], addr["hs"],
                    t0, t1, n, H))
        for s in sides[:nsides]:  # every side stream joins the main one
            e = next(ev)
            out.append(lambda s=s, e=e: e.record(s))
            out.append(lambda e=e: main_stream.wait_for_event(e))
        return out

    def timed(replay, stream=main_stream, runs=50):
        start, end = drv.Event(), drv.Event()
        for _ in range(20):
            replay()
        times = []
        for _ in range(runs):
            start.record(stream)
            replay()
            end.record(stream)
            end.synchronize()
            times.append(end.time_since(start))
        return statistics.median(times)

    # the reference: float64 recurrence over the exact product
    pre_ref = x.astype(np.float64) @ w.astype(np.float64)
    h_ref = np.empty((T + 1, n))
    h_ref[0] = h0.reshape(-1)
    for t in range(T):
        h_ref[t + 1] = np.maximum(pre_ref[t * B:(t + 1) * B].reshape(-1) + np.tile(u, B) * h_ref[t]
                                  + np.tile(bias, B), 0.0)

    results = []
    variants = [(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (5, 2), (10, 2), (10, 4), (20, 4)]
    for chunks, nsides in variants:
        graph = ex.capture(calls(chunks, nsides))
        drv.memcpy_htod(addr["hs"], h0)
        ex.replay(graph)
        main_stream.synchronize()
        got = np.empty((T + 1, n), np.float32)
        drv.memcpy_dtoh(got, addr["hs"])
        err = float(np.abs(got - h_ref).max() / max(1.0, np.abs(h_ref).max()))
        assert err < 1e-4, f"{chunks} chunks on {nsides} side streams: error {err:.2e}"
        ms = timed(lambda g=graph: ex.replay(g))
        ex.release(graph)
        results.append({"chunks": chunks, "side_streams": nsides, "ms": round(ms, 4), "error": err})
        print(f"{chunks:3d} chunks, {nsides} side stream(s): {ms:.4f} ms (error {err:.1e})", flush=True)
    parts = {}
    for name, kw in (("splits and GEMM only", {"with_scan": False}), ("scan only", {"with_gemm": False})):
        graph = ex.capture(calls(1, 1, **kw))
        parts[name] = round(timed(lambda g=graph: ex.replay(g)), 4)
        ex.release(graph)
        print(f"{name}: {parts[name]:.4f} ms", flush=True)
    ex.load(x.reshape(T, B, H), {s: np.zeros((1, B, H), np.float32) for s in plan.state_ids})
    ex.capture_graph()
    executor = "the executor's forward (its persistent kernel)"
    parts[executor] = round(timed(ex.forward), 4)
    print(f"{executor}: {parts[executor]:.4f} ms", flush=True)
    # the recurrence alone: this probe's kernel, and the executor's persistent kernel
    launches = [c for c in ex.calls if getattr(c.func, "__name__", "") == "_launch_early"]
    graph = ex.capture(launches)
    alone = "the executor's persistent kernel alone"
    parts[alone] = round(timed(lambda g=graph: ex.replay(g)), 4)
    ex.release(graph)
    graph = ex.capture([lambda: scan.prepared_async_call(grid(n), (BLOCK, 1, 1), main_stream, addr["pre"],
                                                         addr["u"], addr["b"], addr["hs"], 0, T, n, H)])
    mine = "this probe's scan kernel alone"
    parts[mine] = round(timed(lambda g=graph: ex.replay(g)), 4)
    ex.release(graph)
    print(f"{alone}: {parts[alone]:.4f} ms; {mine}: {parts[mine]:.4f} ms", flush=True)
    if args.json:
        record = {"command": "python3 benchmarks/probes/indrnn_pipeline_probe.py --json OUT",
                  "gpu": device_description(), "date": datetime.now(UTC).isoformat(timespec="seconds"),
                  "sizes": {"seq": T, "batch": B, "input": H, "hidden": H}, "variants": results,
                  "parts": parts}
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    for m in memory + workspaces:
        m.free()
    ex.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
