"""Where the host time of CellRNN's calls goes: cProfile over many forward calls under torch.no_grad()
(and, in float32, many training steps) of the LSTM at input = hidden = 512 (or --hidden), then torch's
profiler over a few forward calls (the CUDA API calls and kernels they make, with their times).
`--module dropin`: the same of cellfuse.nn.LSTM; `--bidirectional`: of two directions; `--lengths
uniform:10-100`: rows of such lengths, a PackedSequence of them for the drop-in, `rnn(x, lengths=...)`
(lengths on the CPU) for CellRNN; `--lines`: the profile's lines shown, by own time and by cumulative time.

    python3 benchmarks/probes/cellrnn_host_profile.py [--schedule persistent] [--calls 500] [--batch 1]
        [--seq 100] [--hidden 512] [--layers 1] [--precision fp32|bf16|fp16] [--module cellrnn|dropin]
        [--bidirectional] [--lengths uniform:LO-HI] [--lines 16]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

from cellfuse.nn import LSTM, CellRNN

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--schedule", default="persistent")
    p.add_argument("--calls", type=int, default=500)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=100)
    p.add_argument("--hidden", type=int, default=512, help="the input and hidden sizes")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--precision", choices=sorted(DTYPES), default="fp32")
    p.add_argument("--module", choices=["cellrnn", "dropin"], default="cellrnn")
    p.add_argument("--lengths", default="",
                   help="uniform:LO-HI: rows of such lengths (the drop-in: a PackedSequence of them)")
    p.add_argument("--lines", type=int, default=16)
    p.add_argument("--bidirectional", action="store_true")
    args = p.parse_args()
    if args.module == "dropin":
        rnn = LSTM(args.hidden, args.hidden, args.layers, bidirectional=args.bidirectional,
                   schedule=args.schedule).cuda()
    else:
        rnn = CellRNN("lstm", args.hidden, args.hidden, args.layers, schedule=args.schedule, seed=1,
                      bidirectional=args.bidirectional).cuda()
    x = torch.randn(args.seq, args.batch, args.hidden, device="cuda").to(DTYPES[args.precision])
    xg = x.clone().requires_grad_()
    if args.lengths:
        low, high = map(int, args.lengths.removeprefix("uniform:").split("-"))
        lengths = torch.randint(low, high + 1, (args.batch,), generator=torch.Generator().manual_seed(1))
        if args.module == "dropin":
            x = pack_padded_sequence(x, lengths, enforce_sorted=False)
            # (its data a leaf of its own: packed from xg, every step's backward would go through the one
            # packing, whose graph the first frees)
            xg = x._replace(data=x.data.clone().requires_grad_())
    given = {"lengths": lengths} if args.lengths and args.module == "cellrnn" else {}
    print(f"LSTM T={args.seq} B={args.batch} H={args.hidden} layers={args.layers} {args.precision} "
          f"{args.schedule} {args.module} {args.lengths or 'padded'}"
          f"{' bidirectional' if args.bidirectional else ''}")

    def forward() -> None:
        with torch.no_grad():
            rnn(x, **given)

    def train() -> None:
        y, _ = rnn(xg, **given)
        (y.data if isinstance(y, PackedSequence) else y).float().sum().backward()

    passes = [("forward", forward)] + ([("training step", train)] if args.precision == "fp32" else [])
    for name, fn in passes:
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
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.lines)
        pstats.Stats(profile).sort_stats("cumulative").print_stats(args.lines)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
