"""How much the order of timed runs moves the numbers: every implementation of one cell timed all in a row
(each one's runs back to back), then in interleaved rounds as `cellfuse bench` does, then in a row again.

    python benchmarks/probes/timing_order.py lstm --batch 64
"""

from __future__ import annotations

import argparse
import gc
import statistics

import numpy as np

from cellfuse.gpu_runtime import bench
from cellfuse.gpu_runtime.torch_baselines import cudnn_kind
from cellfuse.graph_model import Sizes, init_params, load_template, run_reference


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("template")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    cell = load_template(args.template)
    sizes = Sizes(100, args.batch, 512, 512, 1)
    config = bench.BenchConfig(sizes, "cuda", repeats=args.repeats)
    rng = np.random.default_rng(0)
    params = init_params(cell, 1, 512, 512, 0)
    x = rng.standard_normal((sizes.seq, sizes.batch, sizes.input)).astype(np.float32)
    initial = {s: np.zeros((1, sizes.batch, sizes.hidden), np.float32) for s in cell.updates}
    problem = bench._Problem(cell, sizes, params, x, initial, config, args.repeats)
    problem.ref = run_reference(cell, params, {"x": x, **initial})
    ready = [bench._prepare_schedule(problem, s, "cuda")[1] for s in bench.SCHEDULES]
    ready += [bench._prepare_torch(problem, b)[1] for b in ("pytorch graph", "cudnn")
              if b != "cudnn" or cudnn_kind(cell)]
    ready = [t for t in ready if t is not None]
    gc.collect()
    gc.disable()
    columns = {}
    for label in ("in a row", "interleaved", "in a row again"):
        if label == "interleaved":
            times = {t.row.name: [] for t in ready}
            for _ in range(bench.ROUNDS):
                for t in ready:
                    times[t.row.name] += [t.once() for _ in range(args.repeats // bench.ROUNDS)]
        else:
            times = {t.row.name: [t.once() for _ in range(args.repeats)] for t in ready}
        columns[label] = {name: statistics.median(v) for name, v in times.items()}
    print(f"{cell.name}, T=100 B={args.batch} I=H=512, median ms of {args.repeats} runs")
    print(f"{'':16s}" + "".join(f"{c:>16s}" for c in columns))
    for t in ready:
        print(f"{t.row.name:16s}" + "".join(f"{columns[c][t.row.name]:16.3f}" for c in columns))
    for t in ready:
        t.close()


if __name__ == "__main__":
    main()
