"""The host time of each piece of the padding a drop-in's packed training call makes when Python launches
the kernel (`packed_sequences._Rows.padded` where the C++ does not: the padded x and the steps-left state
allocated, the kernel's arguments, its launch), beside the whole `_Rows.padded` (by the C++ where it is
built), timed alone, 60 times each: after a synchronisation, after one with the GPU kept busy, and back to
back; to hold beside the same stage inside a training step (`dropin_packed_timeline.py --train`).
The LSTM's shapes: T=100, B=64, width 512, lengths uniform in 10..100.

    python3 benchmarks/probes/packed_padding_pieces.py
"""

from __future__ import annotations

import statistics
import time

import torch
from torch.nn.utils.rnn import pack_padded_sequence

from cellfuse.nn import ops
from cellfuse.nn import packed_sequences as ps

PIECES = ["contiguous", "new_empty", "empty(left)", "made_current", "rows._args", "unpack (args + launch)",
          "whole _Rows.padded"]


def pieces(packed, rows, steps: int) -> list[float]:
    """Each piece's time, us, then the whole padding's."""
    t = [time.perf_counter()]
    data = packed.data.contiguous()
    t.append(time.perf_counter())
    x = data.new_empty((steps, 64, 512))
    t.append(time.perf_counter())
    left = torch.empty((1, 64, 512), dtype=torch.float32, device="cuda")
    t.append(time.perf_counter())
    with ops.made_current(data):
        t.append(time.perf_counter())
        args = rows._args
        t.append(time.perf_counter())
        rows.kernels.unpack(data.data_ptr(), x.data_ptr(), left.data_ptr(), args, steps, 512, 512, 1,
                            rows._stream(data))
        t.append(time.perf_counter())
    times = [1e6 * (b - a) for a, b in zip(t, t[1:], strict=False)]
    start = time.perf_counter()
    rows.padded(data, steps, 512, 1)
    return [*times, 1e6 * (time.perf_counter() - start)]


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(100, 64, 512, device="cuda")
    packed = pack_padded_sequence(x, torch.randint(10, 101, (64,)), enforce_sorted=False)
    unpacked = ps.Unpacked(packed)
    big = torch.randn(4096, 4096, device="cuda")
    for mode in ("after a synchronisation", "after a synchronisation, GPU busy", "back to back"):
        rows = []
        for _ in range(60):
            if mode != "back to back":
                torch.cuda.synchronize()
            if "busy" in mode:
                big @ big  # the GPU busy for a while, as the forward kernels keep it
            rows.append(pieces(packed, unpacked._rows, unpacked._steps))
        print(f"== {mode}: medians of 60, us")
        for k, name in enumerate(PIECES):
            print(f"  {name:26s} {statistics.median(r[k] for r in rows):8.1f}")


if __name__ == "__main__":
    main()
