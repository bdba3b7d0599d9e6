"""Where a CellRNN training step's time goes on the GPU: torch.profiler's table of CUDA kernels and CPU
ops over a few steps of the LSTM at input = hidden = 512, T=100.

    python3 benchmarks/probes/cellrnn_train_profile.py [--batch 1] [--schedule persistent]
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from cellfuse.nn import CellRNN


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--schedule", default="persistent")
    p.add_argument("--batch", type=int, default=1)
    args = p.parse_args()
    rnn = CellRNN("lstm", 512, 512, 1, schedule=args.schedule, seed=1).cuda()
    x = torch.randn(100, args.batch, 512, device="cuda", requires_grad=True)

    def step() -> None:
        y, _ = rnn(x)
        y.pow(2).mean().backward()

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=18, max_name_column_width=60))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=60))


if __name__ == "__main__":
    main()
