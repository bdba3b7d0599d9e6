"""CellRNN's forward call of rows of their own lengths against the same call without them (T=100, B=64,
input = hidden = 512, `auto`): the time from a synchronised device (CUDA events around the call) and the
host's time until the call returns, medians of --calls, for lengths on the CPU, on the GPU, and after a
training call; with --profile, torch's profiler over five calls each (kernels by total time, and the last
call's kernels as a timeline, us from the last kernel's start). Says whether the module kept the call with
lengths and whether a C++ lane makes it. With --train, training steps too (x needing a gradient, the
loss y.square().mean(), backward), in three turns: padded, with lengths (the padding zeroed by the
zeroing kernel's autograd node) and with lengths zeroed by torch's ops (the kernels withheld).

    python3 benchmarks/probes/lengths_call_times.py [--calls 20] [--profile] [--train]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from cellfuse.nn import CellRNN, stacks


def times(fn, calls: int) -> tuple[float, float]:
    """Median (CUDA-event ms, host ms) of fn() over `calls` calls after three untimed ones, each from a
    synchronised device."""
    for _ in range(3):
        fn()
    out = []
    for _ in range(calls):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        host = time.perf_counter()
        start.record()
        fn()
        end.record()
        host = time.perf_counter() - host
        end.synchronize()
        out.append((start.elapsed_time(end), host * 1e3))
    out.sort()
    return out[len(out) // 2]


def profiled(fn) -> None:
    """torch's profiler over five calls of fn: kernels by total time, the last call's as a timeline."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60))
    kernels = sorted((e for e in prof.events() if e.device_type.name == "CUDA"),
                     key=lambda e: e.time_range.start)
    last = kernels[-1].time_range.start
    for e in kernels[-12:]:
        print(f"{e.time_range.start - last:9.1f} {e.time_range.elapsed_us():8.1f} {e.name[:70]}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--train", action="store_true")
    args = p.parse_args()
    torch.manual_seed(0)
    rnn = CellRNN("lstm", 512, 512, 1, seed=1).cuda()
    x = torch.randn(100, 64, 512, device="cuda")
    lengths = torch.randint(10, 101, (64,))

    def call(given):
        with torch.no_grad():
            if given is None:
                rnn(x)
            else:
                rnn(x, lengths=given)

    def kept() -> str:
        quick = rnn._quick_lengths
        return f"kept {quick is not None}, lane {quick is not None and quick._lane is not None}"
    for name, given in (("no lengths", None), ("lengths on the CPU", lengths),
                        ("lengths on the GPU", lengths.cuda()), ("lengths on the CPU again", lengths)):
        event, host = times(lambda g=given: call(g), args.calls)
        print(f"{name}: {event:.3f} ms, host {host:.3f} ms ({kept()})", flush=True)
        if args.profile and name != "lengths on the GPU":
            profiled(lambda g=given: call(g))
    xg = x.clone().requires_grad_(True)
    rnn(xg, lengths=lengths)[0].sum().backward()
    event, host = times(lambda: call(lengths), args.calls)
    print(f"lengths on the CPU, after a training call: {event:.3f} ms, host {host:.3f} ms ({kept()})")
    if args.train:
        trained(rnn, xg, lengths, args.calls)


def trained(rnn, xg, lengths, calls: int) -> None:
    """Training steps' times in turns: padded, lengths by the zeroing kernel, lengths by torch's ops."""
    kernels = stacks.rows_kernels

    def step(given, by_torch: bool = False) -> None:
        stacks.rows_kernels = (lambda t, count: None) if by_torch else kernels
        try:
            y, _ = rnn(xg) if given is None else rnn(xg, lengths=given)
            y.square().mean().backward()
        finally:
            stacks.rows_kernels = kernels
    for turn in range(3):
        for name, fn in (("padded", lambda: step(None)), ("lengths, the kernel", lambda: step(lengths)),
                         ("lengths, torch's ops", lambda: step(lengths, True))):
            event, host = times(fn, calls)
            print(f"training step, turn {turn + 1}, {name}: {event:.3f} ms, host {host:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
