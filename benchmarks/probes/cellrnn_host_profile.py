"""Where the host time of CellRNN's calls goes: cProfile over many forward calls under torch.no_grad()
and many training steps of the LSTM at input = hidden = 512, B=1, T=100.

    python3 benchmarks/probes/cellrnn_host_profile.py [--schedule persistent] [--calls 500]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

from cellfuse.nn import CellRNN


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--schedule", default="persistent")
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--batch", type=int, default=1)
    args = p.parse_args()
    rnn = CellRNN("lstm", 512, 512, 1, schedule=args.schedule, seed=1).cuda()
    x = torch.randn(100, args.batch, 512, device="cuda")
    xg = x.clone().requires_grad_()

    def forward() -> None:
        with torch.no_grad():
            rnn(x)

    def train() -> None:
        y, _ = rnn(xg)
        y.sum().backward()

    for name, fn in (("forward", forward), ("training step", train)):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(args.calls):
            fn()
        host = (time.perf_counter() - t) / args.calls * 1e3
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) / args.calls * 1e3
        print(f"{name}: host {host:.4f} ms per call, wall {wall:.4f} ms per call (queued back to back)")
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.calls):
            fn()
        profile.disable()
        torch.cuda.synchronize()
        pstats.Stats(profile).sort_stats("tottime").print_stats(22)


if __name__ == "__main__":
    main()
