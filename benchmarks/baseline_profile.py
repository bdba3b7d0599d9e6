"""Where a PyTorch baseline's time goes, on the GPU: one forward (or forward + backward, --train) of the
benchmark's baseline run under torch.profiler after its warm-up, with the kernels it launched counted and
summed by name, and torch.compile's own counters (graph breaks, CUDA graphs it skipped and why), so that
a baseline's number can be explained, not only quoted.

    python benchmarks/baseline_profile.py peephole_lstm --train --baseline torch.compile --json F

T=100, input=hidden=512, batch 64 unless --seq/--hidden/--batch say otherwise.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections import defaultdict
from datetime import UTC, datetime

import numpy as np
import torch

from cellfuse.gpu_runtime.torch_baselines import (
    COMPILE_MODES,
    CompiledCell,
    CudnnCell,
    TorchCell,
    Training,
    cudnn_kind,
)
from cellfuse.graph_model import init_params, load_template


def _model(name: str, cell, params, args):
    if name == "cudnn":
        return CudnnCell(cudnn_kind(cell), params, 1, args.hidden, args.hidden, train=args.train)
    if name in COMPILE_MODES:
        return CompiledCell(cell, params, 1, COMPILE_MODES[name], train=args.train)
    return TorchCell(cell, params, 1, train=args.train)


def profile(template: str, args) -> dict:
    torch.backends.cudnn.allow_tf32 = False  # as the benchmark runs it: float32, not TF32
    torch.backends.cuda.matmul.allow_tf32 = False
    cell = load_template(template)
    params = init_params(cell, 1, args.hidden, args.hidden, 0)
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((args.seq, args.batch, args.hidden)).astype(np.float32)).cuda()
    initial = [torch.zeros(1, args.batch, args.hidden, device="cuda") for _ in cell.updates]
    model = _model(args.baseline, cell, params, args)
    if args.train:
        dy = torch.from_numpy(rng.standard_normal(x.shape).astype(np.float32)).cuda()
        run = Training(model, list(cell.updates), x, initial, dy)
    else:
        def run():
            return model(x, initial)
    for _ in range(5):  # the first calls compile, record and capture
        run()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(20):
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA,
                                            torch.profiler.ProfilerActivity.CPU]) as prof:
        run()
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.name].append(e.device_time_total / 1e3)
    by_time = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))
    counters = {}
    try:
        from torch._dynamo.utils import counters as dynamo_counters

        counters = {group: dict(c) for group, c in dynamo_counters.items() if c}
    except ImportError:
        pass
    return {"median_ms": float(np.median(times)),
            "gpu_kernel_ms": sum(sum(v) for v in kernels.values()),
            "launches": sum(len(v) for v in kernels.values()),
            "kernels": [{"name": k[:160], "count": len(v), "total_ms": sum(v)}
                        for k, v in by_time[:args.top]],
            "counters": {g: {str(k): v for k, v in c.items()} for g, c in counters.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("templates", nargs="+")
    ap.add_argument("--baseline", default="torch.compile", help="torch.compile, torch.compile default, "
                    "cudnn or pytorch eager")
    ap.add_argument("--train", action="store_true", help="forward + backward with autograd")
    ap.add_argument("--seq", type=int, default=100)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--top", type=int, default=15, help="kernels listed, by total time")
    ap.add_argument("--json")
    args = ap.parse_args()
    record = {"gpu": torch.cuda.get_device_name(), "date": datetime.now(UTC).isoformat(timespec="seconds"),
              "torch": torch.__version__, "command": shlex.join(["python", *sys.argv]), "profiles": {}}
    for template in args.templates:
        p = profile(template, args)
        record["profiles"][template] = p
        print(f"{template} {args.baseline}{' train' if args.train else ''}: {p['median_ms']:.3f} ms, "
              f"{p['launches']} kernels, {p['gpu_kernel_ms']:.3f} ms of kernel time")
        for k in p["kernels"]:
            print(f"  {k['count']:5d} x  {k['total_ms']:8.3f} ms  {k['name'][:110]}")
        for group, c in p["counters"].items():
            print(f"  {group}: {c}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
