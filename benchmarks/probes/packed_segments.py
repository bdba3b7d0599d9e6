"""A PackedSequence's call split where its rows run out: is it faster run as segments, each over the rows
still running? The tensor rung's row groups keep SMs of their own, so a packed batch takes its longest
rows' time (packed_lengths_shapes.py); a plan for fewer rows spreads them over every SM. Here each
segment is the drop-in's own packed call (its data a slice of the batch's, no copy), the states handed
on from one segment to the next, the final states gathered from the segment where each row ends: the
same outputs and gradients as one call, checked, then both timed (forward under torch.no_grad() and a
training step), from a synchronised device, medians of --calls.

    python3 benchmarks/probes/packed_segments.py [--batch 64] [--rows 32,16] [--schedule auto]
    python3 benchmarks/probes/packed_segments.py --device cpu --hidden 16 --calls 1   (the check alone)

--rows: where a segment ends, as the rows left running (a segment starts at the first step at which
at most that many rows run, with exactly the rows running then).
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

from cellfuse.nn import LSTM


def segments(sizes: list[int], rows: list[int]) -> list[tuple[int, int]]:
    """(first step, end step) of each segment: a new one from the first step at which at most each of
    `rows` (in decreasing order) rows run."""
    starts = [0]
    for r in rows:
        t = next((t for t, n in enumerate(sizes) if n <= r), None)
        if t is not None and t > starts[-1]:
            starts.append(t)
    return list(zip(starts, [*starts[1:], len(sizes)], strict=True))


def by_segments(rnn: LSTM, packed: PackedSequence, parts: list[tuple[int, int]]):
    """What rnn(packed) gives (a sorted PackedSequence, no hx), by one call per segment."""
    sizes = packed.batch_sizes.tolist()
    offsets = [0]
    for n in sizes:
        offsets.append(offsets[-1] + n)
    ys, finals, hx = [], [], None
    for t0, t1 in parts:
        b = sizes[t0]
        piece = PackedSequence(packed.data[offsets[t0]:offsets[t1]], packed.batch_sizes[t0:t1])
        if hx is not None:
            hx = tuple(s[:, :b] for s in hx)
        y, hx = rnn(piece, hx)
        ys.append(y.data)
        finals.append(hx)
    # each row's final state from the last segment it ran in: rows below the next segment's rows
    h, c = (torch.cat([f[i][:, (sizes[parts[k + 1][0]] if k + 1 < len(parts) else 0):sizes[parts[k][0]]]
                       for k, f in reversed(list(enumerate(finals)))], dim=1) for i in range(2))
    return torch.cat(ys), (h, c)


def median_ms(fn, calls: int, device: str) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(calls):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return sorted(times)[len(times) // 2]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=100)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--rows", default="32,16")
    p.add_argument("--schedule", default="auto")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    torch.manual_seed(0)
    T, B, H, dev = args.seq, args.batch, args.hidden, args.device
    rnn = LSTM(H, H, schedule=args.schedule).to(dev)
    lengths = torch.randint(10 * T // 100, T + 1, (B,), generator=torch.Generator().manual_seed(1))
    x = torch.randn(T, B, H, device=dev)
    packed = pack_padded_sequence(x, lengths.sort(descending=True).values)  # (sorted: no reordering)
    rows = sorted((int(r) for r in args.rows.split(",")), reverse=True)
    parts = segments(packed.batch_sizes.tolist(), rows)
    shapes = [(t1 - t0, packed.batch_sizes[t0].item()) for t0, t1 in parts]
    print(f"LSTM T={T} B={B} input=hidden={H} lengths uniform in {10 * T // 100}..{T}, schedule "
          f"{args.schedule}: segments (steps, rows) {shapes}")

    data = packed.data.clone().requires_grad_()
    xg = PackedSequence(data, packed.batch_sizes)
    whole_y, (whole_h, whole_c) = rnn(xg)
    seg_y, (seg_h, seg_c) = by_segments(rnn, xg, parts)
    params = list(rnn.parameters())

    def loss(y, h, c):
        return y.square().sum() + h.sum() + c.square().sum()

    want = torch.autograd.grad(loss(whole_y.data, whole_h, whole_c), [data, *params])
    got = torch.autograd.grad(loss(seg_y, seg_h, seg_c), [data, *params])
    pairs = [(seg_y, whole_y.data), (seg_h, whole_h), (seg_c, whole_c), *zip(got, want, strict=True)]
    worst = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)) for a, b in
                ((a.detach(), b.detach()) for a, b in pairs))
    print(f"  check: outputs, final states and every gradient, largest difference relative to the "
          f"largest value {worst:.1e}", flush=True)

    def forward_whole() -> None:
        with torch.no_grad():
            rnn(packed)

    def forward_segments() -> None:
        with torch.no_grad():
            by_segments(rnn, packed, parts)

    def train_whole() -> None:
        y, (h, c) = rnn(xg)
        loss(y.data, h, c).backward()

    def train_segments() -> None:
        y, (h, c) = by_segments(rnn, xg, parts)
        loss(y, h, c).backward()

    for name, fn in (("forward, one call", forward_whole), ("forward, by segments", forward_segments),
                     ("training step, one call", train_whole),
                     ("training step, by segments", train_segments)):
        print(f"  {name:28s} {median_ms(fn, args.calls, dev):.3f} ms", flush=True)


if __name__ == "__main__":
    main()
