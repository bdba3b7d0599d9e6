"""The host time of each piece of the drop-in LSTM's PackedSequence path, each timed alone in a loop of
back-to-back calls (no synchronisation inside the loop; the GPU work they queue is short), beside whole
calls and training steps over the padded and the packed batch, back to back as a training loop makes
them: what a step's host work costs piece by piece, where the timeline (dropin_packed_timeline.py) shows
the GPU waiting for it. LSTM, input = hidden = 512, T=100, lengths uniform in 10..100.

    python3 benchmarks/probes/packed_host_pieces.py [--batch 64] [--loops 200]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.nn.utils.rnn import pack_padded_sequence

from cellfuse.nn import LSTM, ops
from cellfuse.nn.packed_sequences import Unpacked


def _timed(name: str, fn, loops: int) -> None:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(loops):
        fn()
    host = (time.perf_counter() - t0) / loops
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / loops
    print(f"  {name:52s} host {1e6 * host:9.1f} us   to the GPU's end {1e6 * wall:9.1f} us")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--loops", type=int, default=200)
    args = p.parse_args()
    B, n = args.batch, args.loops
    torch.manual_seed(0)
    rnn = LSTM(512, 512).cuda()
    x = torch.randn(100, B, 512, device="cuda")
    lengths = torch.randint(10, 101, (B,), generator=torch.Generator().manual_seed(0))
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    grad_packed = pack_padded_sequence(x.clone().requires_grad_(), lengths, enforce_sorted=False)
    print(f"{torch.cuda.get_device_name()}; LSTM T=100 B={B} I=H=512; host microseconds a piece, "
          f"mean of {n} back to back")

    def step(given):
        y = rnn(given)[0]
        (y.data if hasattr(y, "batch_sizes") else y).square().sum().backward()
        rnn.zero_grad(set_to_none=True)

    def infer(given):
        with torch.no_grad():
            rnn(given)

    print("== whole calls")
    for name, given in (("padded", x), ("packed", packed)):
        _timed(f"{name}: inference call", lambda g=given: infer(g), n)
        _timed(f"{name}: training step", lambda g=given: step(g), n)

    print("== the packed path's pieces")
    u = Unpacked(packed)
    u.pad(512, 1)
    rows = u._rows
    y = torch.randn(104, B, 512, device="cuda")
    h = [torch.randn(1, B, 512, device="cuda") for _ in range(2)]
    _timed("Unpacked(packed)", lambda: Unpacked(packed), n)
    _timed("Unpacked(packed).pad (no grad)", lambda: Unpacked(packed).pad(512, 1), n)
    _timed("Unpacked(packed with grad).pad (through _Padded)", lambda: Unpacked(grad_packed).pad(512, 1), n)
    _timed("_Rows.padded", lambda: rows.padded(packed.data, 104, 512, 1), n)
    _timed("_Rows.packed", lambda: rows.packed(y), n)
    _timed("Unpacked.pack (no grad)", lambda: u.pack(y), n)
    _timed("Unpacked.unsorted (2 states)", lambda: u.unsorted(h), n)
    _timed("Unpacked.sorted (2 states)", lambda: u.sorted(h), n)
    print("== inside _Rows.padded")
    data = packed.data
    kernels, sizes = rows.kernels, rows.sizes
    xo = data.new_empty((104, B, 512))
    left = torch.empty((1, B, 512), device="cuda")
    stream = torch._C._cuda_getCurrentRawStream(0)
    _timed("data.contiguous()", lambda: data.contiguous(), n)
    _timed("data.new_empty x", lambda: data.new_empty((104, B, 512)), n)
    _timed("torch.empty steps-left", lambda: torch.empty((1, B, 512), dtype=torch.float32, device="cuda"), n)
    _timed("ops.made_current", lambda: ops.made_current(data), n)
    _timed("current raw stream", lambda: torch._C._cuda_getCurrentRawStream(0), n)
    _timed("torch.cuda.current_device()", torch.cuda.current_device, n)
    rows_args = kernels.rows_args(sizes)
    _timed("PackedRows.rows_args (once a batch)", lambda: kernels.rows_args(sizes), n)
    head = (data.data_ptr(), xo.data_ptr(), 0, 104 * B * 512, 0, 512, 0)
    _timed("PackedRows._launch (args + launch)",
           lambda: kernels._launch(kernels._unpack, rows_args, head, 104 * B, stream, "x"), n)
    _timed("PackedRows.unpack", lambda: kernels.unpack(data.data_ptr(), xo.data_ptr(), left.data_ptr(),
                                                       rows_args, 104, 512, 512, 1, stream), n)
    idx = packed.unsorted_indices
    _timed("index_select [1, B, 512]", lambda: h[0].index_select(1, idx), n)
    _timed("x.square().sum() (the loss)", lambda: x.square().sum(), n)


if __name__ == "__main__":
    main()
