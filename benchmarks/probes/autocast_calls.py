"""What keeping a module's call under torch.autocast saves: CellRNN's LSTM (input = hidden = 512, T=100,
float32 parameters and x) called inside torch.autocast (with --cast module: the module and x in the
16-bit type instead, no autocast; with --packed: x a PackedSequence of lengths uniform in 10..100), an
inference call under torch.no_grad() and a training step (forward, `y.float().pow(2).mean()`, backward;
fp16's loss scaled as GradScaler's first scale), each made as a loop makes it ("kept": the call like the
one before made again by the kept call) and through the whole path ("whole": the kept call dropped
before each call, as every call under autocast ran before such calls were kept). CUDA events around each
(the device synchronised before it) and perf_counter until it returns, medians of runs taken in turns,
each turn starting one case further on; each timed run follows WARM runs of its own case, as in a loop
(a kept inference call is made by the C++ lane from the second call like it that replayed a run).

    python3 benchmarks/probes/autocast_calls.py [--batches 8,64] [--precision bf16] [--repeats 30]
        [--cast autocast|module] [--packed]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

from cellfuse.nn import CellRNN

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
WARM = 3  # runs of a case before each of its timed runs


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batches", default="8,64")
    p.add_argument("--precision", choices=list(DTYPES), default="bf16")
    p.add_argument("--schedule", default="auto")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--cast", choices=["autocast", "module"], default="autocast")
    p.add_argument("--packed", action="store_true")
    args = p.parse_args()
    how = (f"under torch.autocast({args.precision})" if args.cast == "autocast"
           else f"the module and x in {args.precision}")
    print(f"CellRNN lstm, I=H=512, T=100, {how}{', x packed' if args.packed else ''}, schedule "
          f"{args.schedule}; {torch.cuda.get_device_name()}; medians of {args.repeats} runs in turns, ms")
    print(f"{'B':>4s} {'call':10s} {'path':6s} {'device':>8s} {'host':>8s}")
    for batch in (int(b) for b in args.batches.split(",")):
        rnn = CellRNN("lstm", 512, 512, 1, schedule=args.schedule, seed=1).cuda()
        dtype = DTYPES[args.precision]
        x = torch.randn(100, batch, 512, device="cuda")
        if args.cast == "module":
            rnn, x = rnn.to(dtype), x.to(dtype)
        if args.packed:
            lengths = torch.randint(10, 101, (batch,), generator=torch.Generator().manual_seed(0))
            x = pack_padded_sequence(x, lengths, enforce_sorted=False)
        runs = timed(rnn, x, dtype, args.cast == "autocast", args.repeats)
        for (call, path), (device, host) in runs.items():
            print(f"{batch:4d} {call:10s} {path:6s} {statistics.median(device):8.3f} "
                  f"{statistics.median(host):8.3f}")
        print(f"     schedules run: {', '.join(rnn.schedules_run)}")


def timed(rnn: CellRNN, x, dtype: torch.dtype, autocast: bool, repeats: int) -> dict[tuple[str, str], tuple]:
    """{(call, path): (device ms, host ms) of each run} for x ([100, batch, 512] or a PackedSequence)."""
    scale = torch.amp.GradScaler("cuda").get_scale() if dtype == torch.float16 else 1.0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def infer() -> None:
        with torch.no_grad(), torch.autocast("cuda", dtype=dtype, enabled=autocast):
            rnn(x)

    def train() -> None:
        with torch.autocast("cuda", dtype=dtype, enabled=autocast):
            y, _ = rnn(x)
        y = y.data if isinstance(y, PackedSequence) else y
        (y.float().pow(2).mean() * scale).backward()
        for q in rnn.parameters():
            q.grad = None

    def whole(call):
        def run() -> None:
            rnn._quick = rnn._quick_packed = None
            call()
        return run

    cases = {("inference", "kept"): infer, ("inference", "whole"): whole(infer),
             ("training", "kept"): train, ("training", "whole"): whole(train)}
    times = {case: ([], []) for case in cases}
    for run in cases.values():
        for _ in range(5):
            run()
    order = list(cases.items())
    for r in range(repeats):
        # (each repeat starts one case further on: a case's place in a turn moved its training step's time
        # by 0.16 ms, where two cases ran the same code)
        for case, run in order[r % len(order):] + order[:r % len(order)]:
            for _ in range(WARM):  # (the calls before it its own)
                run()
            torch.cuda.synchronize()
            start.record()
            t0 = time.perf_counter()
            run()
            host = (time.perf_counter() - t0) * 1e3
            end.record()
            end.synchronize()
            times[case][0].append(start.elapsed_time(end))
            times[case][1].append(host)
    return times


if __name__ == "__main__":
    main()
