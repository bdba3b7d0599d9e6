"""Many random cells, each checked against the float64 reference under every schedule: the forward pass
(output sequence and final states) and the backward pass (the gradients of x, the initial states and
every parameter). The cells use every op of the table, row reductions ([batch, 1] values) and input-wide
rows meeting hidden-wide ones (so they run at input == hidden). Each cell is checked in a worker process
of its own pool (spawned, so that each has its own CUDA context): on a GPU machine, the nvcc compiles of
many plans run side by side on its cores. The GPU tests run a few; a long run, by hand:

    python tests/random_cell_checks.py --count 300 --workers 16 --backend cuda > random_cells.log
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

import numpy as np
from gradient_runs import Run, make_run
from random_cells import random_cell

from cellfuse.codegen import SCHEDULES
from cellfuse.gpu_runtime.bench import _grad_error, largest_gradient
from cellfuse.graph_model import Gradients, Sizes, run_reference

FIRST_SEED = 7000  # apart from the seeds of the other random-cell tests
# input == hidden: a cell that ties the two widths runs only there; 40 columns over many blocks
SIZES = Sizes(seq=6, batch=5, input=40, hidden=40)
FORWARD_TOLERANCE = 1e-4  # float32 against float64, relative to the largest magnitude (at least 1)
# Gradients, each relative to its own largest magnitude (or precision.gradient_floor times the largest
# gradient, where that is more): on numpy in float64, where the plan's arithmetic
# is the reference's up to rounding; on the GPU in float32, within 1e-4 or, where float32 itself loses
# more (through three layers of random ops it can: 3e-3 for 2 cells of 1000), within 10 times the error
# of the numpy executor's float32 gradients on the graph rung, an independent float32 evaluation.
FLOAT64_GRADIENT_TOLERANCE = 1e-8
GRADIENT_TOLERANCE = 1e-4
# The seeds of the backward pass are of order 1: where every gradient is below this, the cell's saturated
# nonlinearities (tanh at 1.0f exactly, in float32) have made them vanish, and float32 gives 0 or noise,
# so that only a crash, NaN or a missing gradient counts on the GPU; numpy checks them in float64.
VANISHED = 1e-6


@dataclass
class Checked:
    seed: int
    nodes: int
    layers: int
    failures: list[str]  # one line per schedule and pass that did not match, with its error
    seconds: float


def _run(seed: int) -> Run:
    """The seed's cell, layers (1 to 3), parameters, inputs, initial states and seeds."""
    # drawn at 8 and 8; its own sizes say the hidden size where no weight or initial state does
    cell = replace(random_cell(seed, reductions=True, ties=True), sizes={"input": SIZES.input,
                                                                          "hidden": SIZES.hidden})
    layers = 1 + seed % 3
    return make_run(cell, layers, seed=seed, initial=seed % 4 != 0, dfinal=seed % 2 == 0,
                    sizes=replace(SIZES, layers=layers), scale=1.0)


def _forward(run: Run, schedule: str, backend: str) -> None:
    """Asserts that the schedule's float32 forward pass matches the float64 reference's."""
    from cellfuse.gpu_runtime.execute import run_schedule

    s = run.sizes
    inputs = {k: v.astype(np.float32) for k, v in {"x": run.x, **(run.initial or {})}.items()}
    params = {k: v.astype(np.float32) for k, v in run.params.items()}
    got = run_schedule(run.cell, params, inputs, s.layers, schedule, backend)
    ref = run_reference(run.cell, run.params, {"x": run.x, **(run.initial or {})}, s.layers)
    pairs = [(got.y, ref.y)] + [(got.final[st], ref.final[st]) for st in ref.final]
    scale = max(1.0, max(float(np.abs(r).max()) for _, r in pairs))
    err = max(float(np.abs(g - r).max()) for g, r in pairs) / scale
    assert err < FORWARD_TOLERANCE, f"relative error {err:.2e}"


def _gradients(run: Run, schedule: str, backend: str, reverse_blocks: bool) -> Gradients:
    """The gradients (after a forward pass) on `backend`; on numpy, a persistent kernel's blocks run one
    by one, in decreasing order with `reverse_blocks`, so that a missing barrier shows there."""
    if backend == "numpy":
        return run.numpy(schedule, np.float64, reverse_blocks=reverse_blocks)
    return run.cuda(schedule)


def check(seed: int, backend: str = "cuda", gradients: bool = True) -> Checked:
    """Checks the seed's random cell under every schedule on `backend` ("numpy" or "cuda")."""
    t0 = time.perf_counter()
    run = _run(seed)
    failures = []
    want = run.reference() if gradients else None
    if not gradients:
        tolerance = 0.0
    elif backend == "numpy":
        tolerance = FLOAT64_GRADIENT_TOLERANCE
    elif largest_gradient(want) < VANISHED:
        tolerance = float("inf")
    else:
        tolerance = max(GRADIENT_TOLERANCE, 10 * _grad_error(run.numpy("graph", np.float32), want))
    for schedule in SCHEDULES:
        for name in ("forward", "backward") if gradients else ("forward",):
            try:
                if name == "forward":
                    _forward(run, schedule, backend)
                else:
                    err = _grad_error(_gradients(run, schedule, backend, seed % 2 == 1), want)
                    assert err < tolerance, f"gradient error {err:.2e} (tolerance {tolerance:.1e})"
            except AssertionError as e:
                failures.append(f"{schedule} {name}: {e}")
            except Exception as e:  # a crash is a failure of this cell, reported with the others
                at = traceback.extract_tb(e.__traceback__)[-1]
                failures.append(f"{schedule} {name}: {type(e).__name__}: {e} ({at.filename}:{at.lineno})")
    return Checked(seed, len(run.cell.nodes), run.sizes.layers, failures, time.perf_counter() - t0)


def _check_star(args: tuple[int, str, bool]) -> Checked:
    return check(*args)


def check_many(seeds: Iterable[int], backend: str = "cuda", gradients: bool = True,
               workers: int = 4) -> Iterator[Checked]:
    """check() of every seed in a pool of spawned worker processes, in the order they finish."""
    jobs = [(seed, backend, gradients) for seed in seeds]
    with multiprocessing.get_context("spawn").Pool(workers, maxtasksperchild=8) as pool:
        yield from pool.imap_unordered(_check_star, jobs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--first", type=int, default=FIRST_SEED, help="the first seed")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--backend", choices=["numpy", "cuda"], default="cuda")
    p.add_argument("--forward-only", action="store_true")
    args = p.parse_args(argv)
    t0, failed, total = time.perf_counter(), 0, 0
    print(f"{args.count} random cells from seed {args.first}, every schedule ({', '.join(SCHEDULES)}) on "
          f"{args.backend}, at {SIZES.seq} steps, batch {SIZES.batch}, input = hidden = {SIZES.hidden}, "
          f"1 to 3 layers; forward{'' if args.forward_only else ' and backward'}", flush=True)
    for c in check_many(range(args.first, args.first + args.count), args.backend, not args.forward_only,
                        args.workers):
        total += 1
        failed += bool(c.failures)
        status = "ok" if not c.failures else "FAILED"
        layers = f"{c.layers} layer" + "s" * (c.layers > 1)
        print(f"seed {c.seed}: {c.nodes} nodes, {layers}, {c.seconds:.1f} s: {status}", flush=True)
        for line in c.failures:
            print(f"    {line}", flush=True)
    seconds = time.perf_counter() - t0
    print(f"{total - failed} of {total} cells matched under every schedule ({seconds:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
