"""A bidirectional LSTM layer's two directions side by side (each planned for half of the SMs, on two
streams) against one after the other (each planned for all of them), and one direction alone: CUDA events
around the forward call under torch.no_grad() and around a training step, medians of runs taken in
turns, in one process, with the host's time until each call returns, and the bidirectional forward
call captured in a CUDA graph and replayed (the GPU's time alone); input = hidden = 512, T=100. With
--timeline, then the GPU's kernels of one side-by-side training step from torch.profiler: each
kernel's start and end (us from the step's first) and its stream, to see what of the two directions
overlaps.

    python3 benchmarks/probes/directions_side_by_side.py [--batch 64] [--layers 1] [--repeats 20]
        [--timeline]
"""

from __future__ import annotations

import argparse
import statistics
import time

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
    # (a module of its own for each way: a module keeps its layers' calls of one way, the last it ran)
    in_turn = LSTM(512, 512, args.layers, bidirectional=True).cuda()
    in_turn.load_state_dict(both.state_dict())
    x = torch.randn(100, args.batch, 512, device="cuda")
    beside = stacks._beside

    def in_order(x):
        return False

    cases = {"one direction": (one, beside), "two, side by side": (both, beside),
             "two, one after the other": (in_turn, in_order)}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def forward(module):
        with torch.no_grad():
            module(x)

    def step(module):
        module(x)[0].square().sum().backward()

    replay = captured(lambda: forward(both))
    for what, fn in (("forward", forward), ("training step", step)):
        times = {name: ([], []) for name in cases}
        if what == "forward":
            times["two, side by side, replayed"] = ([], [])
        for r in range(args.repeats + 3):
            for name in times:
                module, how = cases.get(name, (both, beside))
                stacks._beside = how
                try:
                    torch.cuda.synchronize()
                    start.record()
                    t0 = time.perf_counter()
                    replay() if name.endswith("replayed") else fn(module)
                    host = (time.perf_counter() - t0) * 1e3
                    end.record()
                    end.synchronize()
                finally:
                    stacks._beside = beside
                module.zero_grad(set_to_none=True)
                if r >= 3:
                    times[name][0].append(start.elapsed_time(end))
                    times[name][1].append(host)
        base = statistics.median(times["one direction"][0])
        for name, (t, host) in times.items():
            ms = statistics.median(t)
            print(f"{what:14s} {name:28s} {ms:8.3f} ms  {ms / base:5.2f}x one direction  "
                  f"host {statistics.median(host):6.3f} ms", flush=True)
    if args.timeline:
        timeline(lambda: step(both))


def captured(call):
    """The replay of call() captured in a CUDA graph (after a few calls on a side stream, as torch's
    recipe warms up a capture): the GPU's time of the call without the host's."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph.replay


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
