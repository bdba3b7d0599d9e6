"""The host time of a bidirectional stack's reversal of rows of their own lengths (stacks._reversal): its
index made on the CPU from the lengths and copied to the GPU from pinned memory, or made on the GPU from
the rows' steps-left state, already there; each after a synchronisation, the two in turns. LSTM sizes:
T=100, B=64, hidden 512, lengths uniform in 10..100.

    python3 benchmarks/probes/reversal_host.py [--calls 300]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from cellfuse.nn import stacks


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=300)
    args = p.parse_args()
    device = torch.device("cuda")
    T, B, H = 100, 64, 512
    x = torch.randn(T, B, 512, device=device)
    lengths = torch.randint(10, 101, (B,), generator=torch.Generator().manual_seed(0))
    steps = stacks.steps_left(lengths, 1, x, H)
    ways = {"index made on the CPU, copied": lambda: stacks._reversal(lengths, x),
            "index made on the GPU from the steps-left state": lambda: stacks._reversal(lengths, x, steps)}
    assert torch.equal(*(way()(x) for way in ways.values()))
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.calls + 30):
        for name, way in ways.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            way()
            times[name].append(time.perf_counter() - t0)
    print(f"{torch.cuda.get_device_name(device)}; T={T} B={B}; host time of a reversal's making, "
          f"median of {args.calls} calls each (after 30), in turns")
    for name, took in times.items():
        print(f"  {name:50s} {1e6 * statistics.median(took[30:]):7.1f} us")


if __name__ == "__main__":
    main()
