"""Where the drop-in LSTM's forward over a PackedSequence spends its time beside the padded one: each
stage of the call timed alone (the device synchronised around it), then torch.profiler's tables of a
few packed calls; LSTM, input = hidden = 512, T=100, lengths uniform in 10..100.

    python3 benchmarks/probes/dropin_packed_profile.py [--batch 64]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from torch.profiler import ProfilerActivity, profile

from cellfuse.nn import LSTM, ops, packed_sequences, stacks


def wall_us(fn, calls: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2] * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args()
    B = args.batch
    torch.manual_seed(0)
    rnn = LSTM(512, 512).cuda()
    x = torch.randn(100, B, 512, device="cuda")
    lengths = torch.randint(10, 101, (B,), generator=torch.Generator().manual_seed(0))
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    unpacked = packed_sequences.Unpacked(packed)
    unpacked.pad(512, 1)
    padded, checked = unpacked.x, unpacked.lengths
    initial = rnn._initial(None, B, padded)
    params = list(rnn._layer_params(0, False))
    masked = ops.masked_text(rnn._cell_text)
    states = [*initial, stacks.steps_left(checked, 1, padded, 512)]
    y, _ = stacks.run(padded, initial, params, rnn._cell_text, 512, 1, rnn.schedule, checked)
    with torch.no_grad():
        stages = {
            "the caller's pack_padded_sequence": lambda: pack_padded_sequence(x, lengths,
                                                                              enforce_sorted=False),
            "module(packed)": lambda: rnn(packed),
            "module(x) padded": lambda: rnn(x),
            "torch's pad_packed_sequence": lambda: pad_packed_sequence(packed),
            "Unpacked and its padding": lambda: packed_sequences.Unpacked(packed).pad(512, 1),
            "check_lengths": lambda: stacks.check_lengths(checked, padded.shape[0], B),
            "steps_left": lambda: stacks.steps_left(checked, 1, padded, 512),
            "stacks.run with lengths": lambda: stacks.run(padded, initial, params, rnn._cell_text, 512, 1,
                                                          rnn.schedule, checked),
            "ops.run of the masked cell": lambda: ops.run(padded, states, params, masked, 512, 1,
                                                          rnn.schedule, False),
            "stacks.run padded": lambda: stacks.run(x, initial, params, rnn._cell_text, 512, 1, rnn.schedule),
            "Unpacked.pack": lambda: unpacked.pack(y),
        }
        for name, fn in stages.items():
            print(f"{name:40s} {wall_us(fn):9.1f} us", flush=True)
        runner = ops.runner(masked, padded, 512, 1, rnn.schedule)
        print("the masked cell's runner:", type(runner).__name__, runner.plans.schedule)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                rnn(packed)
            torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=15, max_name_column_width=60))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60))


if __name__ == "__main__":
    main()
