"""CellRNN's forward calls timed alone and in turns with torch.nn.LSTM (as benchmarks/cellrnn_vs_cudnn.py
times them), under each schedule asked for, then torch's profiler over a few calls in turns: the kernels
on the GPU and the API calls on the host, with their times.

    python3 benchmarks/probes/cellrnn_turns_probe.py [--batch 8] [--layers 4] [--precision bf16]
        [--schedules auto,persistent]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from cellfuse.nn import CellRNN

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def timed(fn, calls: int, before=None) -> tuple[float, float]:
    """Median device and host ms of `calls` calls, each from a synchronised device (after `before()`)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    device, host = [], []
    for _ in range(calls):
        if before is not None:
            before()
        torch.cuda.synchronize()
        start.record()
        t = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t) * 1e3)
        end.record()
        end.synchronize()
        device.append(start.elapsed_time(end))
    return statistics.median(device), statistics.median(host)


def probe(schedule: str, x: torch.Tensor, lstm: torch.nn.LSTM, args: argparse.Namespace) -> None:
    rnn = CellRNN("lstm", 512, 512, args.layers, schedule=schedule, seed=1).cuda()
    with torch.no_grad():
        t = time.perf_counter()
        rnn(x)
        torch.cuda.synchronize()
        print(f"{schedule}: rung {rnn.schedules_run[-1]}, first call {time.perf_counter() - t:.1f} s")
        alone = timed(lambda: rnn(x), args.calls)
        cudnn = timed(lambda: lstm(x), args.calls)
        after = timed(lambda: rnn(x), args.calls, before=lambda: lstm(x))
        print(f"  CellRNN alone: device {alone[0]:.3f} ms, host {alone[1]:.3f}; cuDNN {cudnn[0]:.3f} ms; "
              f"CellRNN after a cuDNN call: {after[0]:.3f} / {after[1]:.3f}")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                lstm(x)
                torch.cuda.synchronize()
                rnn(x)
            torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
    print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=12))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=100)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--precision", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--schedules", default="auto,persistent")
    p.add_argument("--calls", type=int, default=20)
    args = p.parse_args()
    dtype = DTYPES[args.precision]
    x = torch.randn(args.seq, args.batch, 512, device="cuda").to(dtype)
    lstm = torch.nn.LSTM(512, 512, args.layers).cuda().to(dtype).eval()
    for schedule in args.schedules.split(","):
        probe(schedule, x, lstm, args)


if __name__ == "__main__":
    main()
