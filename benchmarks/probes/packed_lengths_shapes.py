"""Whether a packed batch's time follows its longest rows or all of its rows: the drop-in LSTM (input =
hidden = 512, T=100) called on a padded batch and on PackedSequences whose lengths have several shapes,
its forward call (under torch.no_grad()) and its training step (forward, sum, backward) timed from a
synchronised device to the end of the call's work, medians of --calls.

The tensor rung splits a batch's rows into row groups that never wait for each other (B=64: four groups
of 16 rows, 32 blocks each), and a PackedSequence runs in its data's order of rows, longest first. If a
call's time is its first row group's, lengths of "16 of 100, 48 of 1" take the padded batch's time.

    python3 benchmarks/probes/packed_lengths_shapes.py [--schedule tensor] [--calls 20]
"""

from __future__ import annotations

import argparse

import torch
from torch.nn.utils.rnn import pack_padded_sequence

from cellfuse.nn import LSTM

T, H = 100, 512
SHAPES = {  # name: (B, lengths or None for a padded batch)
    "padded, B=64": (64, None),
    "uniform 10..100, B=64": (64, "uniform"),
    "16 of 100, 48 of 1": (64, [100] * 16 + [1] * 48),
    "1 of 100, 63 of 1": (64, [100] + [1] * 63),
    "32 of 100, 32 of 1": (64, [100] * 32 + [1] * 32),
    "all 55, B=64": (64, [55] * 64),
    "padded, B=16": (16, None),
    "padded, B=32": (32, None),
}


def median_ms(fn, calls: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--schedule", default="tensor")
    p.add_argument("--calls", type=int, default=20)
    args = p.parse_args()
    torch.manual_seed(0)
    rnn = LSTM(H, H, schedule=args.schedule).cuda()
    print(f"LSTM T={T} input=hidden={H} schedule={args.schedule}: forward (no_grad) and training step, "
          "ms, medians")
    for name, (B, lengths) in SHAPES.items():
        x = torch.randn(T, B, H, device="cuda")
        if lengths is not None:
            if lengths == "uniform":
                lengths = torch.randint(10, T + 1, (B,), generator=torch.Generator().manual_seed(1)).tolist()
            x = pack_padded_sequence(x, torch.tensor(lengths), enforce_sorted=False)
            xg = x._replace(data=x.data.clone().requires_grad_())
        else:
            xg = x.clone().requires_grad_()

        def forward(x=x) -> None:
            with torch.no_grad():
                rnn(x)

        def train(xg=xg, packed=lengths is not None) -> None:
            y = rnn(xg)[0]
            (y.data if packed else y).sum().backward()

        print(f"  {name:24s} forward {median_ms(forward, args.calls):.3f}  training step "
              f"{median_ms(train, args.calls):.3f}", flush=True)


if __name__ == "__main__":
    main()
