"""The LSTM's (or GRU's) forward pass in each precision on a GPU: CellFuse's rungs through the CUDA executor
(each checked against the float64 reference within its precision's bound before it is timed) beside
torch.nn.LSTM/GRU (cuDNN) in float32, float16 and bfloat16, from the same weights, every number in one
process; input = hidden = 512.

    python3 benchmarks/probes/precision_probe.py [--cell lstm] [--cases 100x1,100x8,100x64,100x256,1000x8]
        [--schedules graph,tensor] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np
import torch

from cellfuse.codegen import make_plan
from cellfuse.codegen.precision import forward_tolerance
from cellfuse.gpu_runtime.cuda_executor import CudaExecutor, device_target
from cellfuse.gpu_runtime.event_timing import median_ms
from cellfuse.gpu_runtime.torch_baselines import CudnnCell
from cellfuse.graph_model import CellError, Sizes, init_params, load_template, run_reference

SIZE = 512
TORCH = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def error(y: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(y - ref).max() / np.abs(ref).max())


def cudnn_ms(kind: str, params, x: np.ndarray, precision: str, ref: np.ndarray, repeats: int):
    rnn = CudnnCell(kind, params, 1, SIZE, SIZE, dtype=TORCH[precision]).module  # made in the dtype
    xt = torch.from_numpy(x).cuda().to(TORCH[precision])
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        y, _ = rnn(xt)
        err = error(y.float().cpu().numpy(), ref)
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            rnn(xt)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    return statistics.median(times), err


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cell", default="lstm")
    p.add_argument("--cases", default="100x1,100x8,100x64,100x256,1000x8")
    p.add_argument("--schedules", default="graph,tensor")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    cell = load_template(args.cell)
    rows = []
    for case in args.cases.split(","):
        T, B = (int(n) for n in case.split("x"))
        params = init_params(cell, 1, SIZE, SIZE, 0)
        x = np.random.default_rng(0).standard_normal((T, B, SIZE)).astype(np.float32)
        ref = run_reference(cell, params, {"x": x}).y
        for precision in ("fp32", "bf16", "fp16"):
            for schedule in args.schedules.split(","):
                row = {"case": case, "precision": precision, "impl": schedule}
                try:
                    plan = make_plan(cell, Sizes(T, B, SIZE, SIZE, 1), schedule, device_target(),
                                     precision=precision)
                except CellError as e:
                    row["note"] = str(e)
                    rows.append(row)
                    print(row, flush=True)
                    continue
                ex = CudaExecutor(plan, params)
                out = ex.run(x, {s: np.zeros((1, B, SIZE), np.float32) for s in cell.updates})
                row["rel_err"] = error(out.y, ref)
                row["ok"] = row["rel_err"] < forward_tolerance(precision)
                if row["ok"]:
                    row["ms"] = median_ms(ex.drv, ex.forward, ex.stream, args.repeats)
                ex.close()
                rows.append(row)
                print(row, flush=True)
            ms, err = cudnn_ms(args.cell, params, x, precision, ref, args.repeats)
            row = {"case": case, "precision": precision, "impl": "cudnn", "ms": ms, "rel_err": err}
            rows.append(row)
            print(row, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "cell": args.cell, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
