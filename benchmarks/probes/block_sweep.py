"""How the number of blocks of a persistent forward pass weighs on its time: the same cell and sizes
planned for fewer SMs than the GPU has (so fewer, larger blocks, each with more of U, and a grid barrier
among fewer), each checked against the plan for all SMs, then timed (CUDA events, the forward pass from
its CUDA graph, median of --reps).

    python benchmarks/probes/block_sweep.py lstm:1 lstm:8 lstm:64 gru:1 --sms 16,32,64,132 --json F

A CASE is TEMPLATE:BATCH (T=100, input=hidden=512 unless --seq/--hidden say otherwise).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from dataclasses import replace
from datetime import UTC, datetime

import numpy as np

from cellfuse.codegen.plan import GemmLaunch
from cellfuse.codegen.scheduler import make_plan
from cellfuse.gpu_runtime.cuda_executor import CudaExecutor, device_description, device_target
from cellfuse.graph_model import CellError, Sizes, init_params, load_template


def _timed(ex: CudaExecutor, reps: int) -> float:
    drv = ex.drv
    start, end = drv.Event(), drv.Event()
    times = []
    for _ in range(reps + 3):
        start.record(ex.stream)
        ex.forward()
        end.record(ex.stream)
        end.synchronize()
        times.append(end.time_since(start))
    return statistics.median(times[3:])


def sweep(name: str, batch: int, seq: int, hidden: int, sms: list[int], reps: int) -> dict:
    cell = load_template(name)
    sizes = Sizes(seq, batch, hidden, hidden)
    params = init_params(cell, 1, hidden, hidden, 0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((seq, batch, hidden)).astype(np.float32)
    initial = {s: np.zeros((1, batch, hidden), np.float32) for s in cell.updates}
    full = device_target()
    out: dict = {"cell": name, "batch": batch, "seq": seq, "hidden": hidden, "runs": []}
    reference = None
    for n in sorted(set(sms), reverse=True):
        target = replace(full, sm_count=min(n, full.sm_count))
        run: dict = {"sm_count": target.sm_count}
        try:
            plan = make_plan(cell, sizes, "persistent", target)
        except CellError as e:
            run["error"] = str(e)
            out["runs"].append(run)
            continue
        p = plan.layers[0].persistent
        run.update(blocks=p.blocks, row_groups=p.row_groups, row_tile=p.row_tile, smem_bytes=p.smem_bytes,
                   weights_on_chip=all(i.on_chip for i in p.items if isinstance(i.launch, GemmLaunch)))
        ex = CudaExecutor(plan, params)
        try:
            y = ex.run(x, initial).y
            if reference is None:
                reference = y
            run["max_abs_diff_vs_all_sms"] = float(np.max(np.abs(y - reference)))
            run["ms"] = _timed(ex, reps)
        finally:
            ex.close()
        print(name, batch, run, flush=True)
        out["runs"].append(run)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="+", help="TEMPLATE:BATCH")
    ap.add_argument("--sms", default="16,32,64,132", help="SM counts to plan for, comma-separated")
    ap.add_argument("--seq", type=int, default=100)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    sms = [int(n) for n in args.sms.split(",")]
    records = []
    for case in args.cases:
        name, batch = case.split(":")
        records.append(sweep(name, int(batch), args.seq, args.hidden, sms, args.reps))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": device_description(), "date": datetime.now(UTC).isoformat(timespec="seconds"),
                       "command": shlex.join(["python", *sys.argv]), "records": records}, f, indent=1)


if __name__ == "__main__":
    main()
