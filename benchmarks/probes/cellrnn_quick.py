"""A quick look at CellRNN on a GPU as a user calls it: device time (CUDA events) and host time of one
forward call under torch.no_grad(), and of a training step, for the LSTM at input = hidden = 512.

    python3 benchmarks/probes/cellrnn_quick.py [--schedule persistent] [--cases 100x1,100x8,100x64,1000x8]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from cellfuse.nn import CellRNN


def events_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def host_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--schedule", default="auto")
    p.add_argument("--cases", default="100x1,100x8,100x64,1000x8")
    p.add_argument("--repeats", type=int, default=50)
    args = p.parse_args()
    for case in args.cases.split(","):
        T, B = (int(v) for v in case.split("x"))
        rnn = CellRNN("lstm", 512, 512, 1, schedule=args.schedule, seed=1).cuda()
        x = torch.randn(T, B, 512, device="cuda")
        with torch.no_grad():
            fwd = lambda rnn=rnn, x=x: rnn(x)  # noqa: E731
            fwd()
            device, host = events_ms(fwd, args.repeats), host_ms(fwd, args.repeats)
        xg = x.clone().requires_grad_()

        def train(rnn=rnn, xg=xg):
            y, _ = rnn(xg)
            y.pow(2).mean().backward()
        train()
        trained = events_ms(train, args.repeats // 2)
        print(f"T={T} B={B} rung={rnn.schedules_run[-1]}: forward {device:.3f} ms (host {host:.3f} ms), "
              f"training step {trained:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
