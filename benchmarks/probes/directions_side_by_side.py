"""A bidirectional LSTM layer's two directions side by side (each planned for half of the SMs, on two
streams) against one after the other (each planned for all of them), and one direction alone: CUDA events
around the forward call under torch.no_grad() and around a training step, medians of runs taken in
turns, in one process; input = hidden = 512, T=100. With --timeline, then the GPU's kernels of one
side-by-side training step from torch.profiler: each kernel's start and end (us from the step's first)
and its stream, to see what of the two directions overlaps.

    python3 benchmarks/probes/directions_side_by_side.py [--batch 64] [--layers 1] [--repeats 20]
        [--timeline]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from cellfuse.nn import LSTM, stacks


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--timeline", action="store_true")
    args = p.parse_args()
    torch.manual_seed(0)
    one = LSTM(512, 512, args.layers).cuda()
    both = LSTM(512, 512, args.layers, bidirectional=True).cuda()
    x = torch.randn(100, args.batch, 512, device="cuda")
    beside = stacks._beside

    def in_order(x):
        return False

    cases = {"one direction": (one, beside), "two, side by side": (both, beside),
             "two, one after the other": (both, in_order)}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def forward(module):
        with torch.no_grad():
            module(x)

    def step(module):
        module(x)[0].square().sum().backward()

    for what, fn in (("forward", forward), ("training step", step)):
        times = {name: [] for name in cases}
        for r in range(args.repeats + 3):
            for name, (module, how) in cases.items():
                stacks._beside = how
                try:
                    torch.cuda.synchronize()
                    start.record()
                    fn(module)
                    end.record()
                    end.synchronize()
                finally:
                    stacks._beside = beside
                module.zero_grad(set_to_none=True)
                if r >= 3:
                    times[name].append(start.elapsed_time(end))
        base = statistics.median(times["one direction"])
        for name, t in times.items():
            ms = statistics.median(t)
            print(f"{what:14s} {name:26s} {ms:8.3f} ms  {ms / base:5.2f}x one direction", flush=True)
    if args.timeline:
        timeline(lambda: step(both))


def timeline(step) -> None:
    """The GPU's kernels and copies of one step, in the order they started."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
    if not events:
        return
    t0 = events[0].time_range.start
    print("one side-by-side training step on the GPU (us from its first kernel):")
    for e in events:
        stream = getattr(e, "device_resource_id", "?")
        print(f"  {e.time_range.start - t0:9.1f} {e.time_range.end - t0:9.1f}  stream {stream!s:>4}  "
              f"{e.name[:70]}")


if __name__ == "__main__":
    main()
