"""The kernels of each GEMM of a training step, and what each takes: benchmarks/step_profile.py's run (every
instruction of the forward and backward programs timed alone), and for each GEMM instruction its calls
run ten times more under torch's profiler, which names each kernel they launch (the splits of three fp16
products, their maxima, cuBLAS's GEMM and split-K reduction, the pass that undoes the scales, or the
warpgroup GEMM and its image) with its mean time per run.

    python3 benchmarks/probes/gemm_kernels_profile.py lstm:64 gru:64 --schedule tensor --ablations whole

The arguments are step_profile.py's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import step_profile  # noqa: E402  (benchmarks/, put on the path above)

RUNS = 10
_timed = step_profile._time


def _time_and_list(ex, instr, reps: int, splits: list[int] | None = None) -> float:
    ms = _timed(ex, instr, reps, splits)
    what = step_profile._describe(instr, 0)
    if what.startswith("GEMM"):
        calls = ex._calls(instr, 0, None, splits)
        stream = ex.streams[getattr(instr, "stream", 0)]
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(RUNS):
                for call in calls:
                    call()
            stream.synchronize()
        kernels: dict[str, list[float]] = {}
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                kernels.setdefault(event.name[:70], []).append(event.device_time)
        print(f"  {what}: {ms * 1000:.1f} us alone; its kernels (us a run, launches a run):", flush=True)
        for name, times in kernels.items():
            print(f"      {sum(times) / RUNS:8.1f}  x{len(times) // RUNS}  {name}", flush=True)
    return ms


if __name__ == "__main__":
    step_profile._time = _time_and_list
    sys.argv[0] = "step_profile.py"
    step_profile.main()
