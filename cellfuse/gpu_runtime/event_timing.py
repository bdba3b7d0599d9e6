"""Timing work on a stream with CUDA events: what the runtime measures to choose between ways of doing a
GEMM (cuBLASLt's algorithms, the two routes of a GEMM on tensor cores), and the profile scripts too."""

from __future__ import annotations

import statistics
from collections.abc import Callable


def median_ms(drv, run: Callable[[], object], stream, runs: int, idle: bool = False) -> float:
    """The median time, in ms, of `run` (which puts its work on `stream`) over `runs` runs, each timed by
    two events on the stream; where `idle`, the whole GPU waited for before each run (the work's time
    alone, launch included)."""
    start, end = drv.Event(), drv.Event()
    times = []
    for _ in range(runs):
        if idle:
            drv.Context.synchronize()
        start.record(stream)
        run()
        end.record(stream)
        end.synchronize()
        times.append(end.time_since(start))
    return statistics.median(times)
