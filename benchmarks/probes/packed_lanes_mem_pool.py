"""Whether a bidirectional stack's kept calls of PackedSequences of lengths drawn anew are made by their
lanes when the call's tensors of fixed size come from a memory pool of the module's own.

Over batches of other lengths, a lane (nn.quick_call) seldom makes a bidirectional stack's calls: it replays
a run captured over fixed addresses, and torch's caching allocator puts the call's tensors of fixed size
(the padded x, the steps-left state, each direction's reversed x and outputs, the layers' concatenated y)
around the packed data of another size, at other addresses call after call
(docs/results/2026-12-02-i-packed-calls-of-other-lengths.md). Here the padding and the stack run inside
torch.cuda.use_mem_pool over a pool of the module's own, where only those tensors are allocated, in the
same order every call; the packed y (of the batch's size) is made outside it. For each way, N calls each
given the next of --batches PackedSequences (lengths uniform in 10..T, the longest T, so that every batch
pads to T steps; by default one per call, each call's lengths never seen before): how many of the last
half reached a runner's whole path (none where the lanes make them), the forward time (CUDA events after
a synchronisation, median), the pool's memory, and the outputs against the plain calls' to the bit.

    python3 benchmarks/probes/packed_lanes_mem_pool.py [--batch 64] [--layers 2] [--calls 80] [--batches N]

(Over 16 PackedSequences given in turn, the plain calls' lanes already made every call of the last half
on an H200: the caching allocator's addresses repeat with the batches; there the pool changed nothing.)
"""

from __future__ import annotations

import argparse
import contextlib
import statistics

import torch
from torch.nn.utils.rnn import pack_padded_sequence

from cellfuse.nn import LSTM, packed_sequences, stacks
from cellfuse.nn.cuda_runner import CudaRunner


def _entries() -> list[int]:
    """Counts the calls that reach a runner's forward (a lane's calls do not)."""
    entered = [0]
    whole = CudaRunner.forward

    def forward(runner, *args, **kwargs):
        entered[0] += 1
        return whole(runner, *args, **kwargs)
    CudaRunner.forward = forward
    return entered


def _pooled(pool) -> None:
    """The padding and the stack allocate from `pool` (None: as they do)."""
    for owner, attr in ((packed_sequences.Unpacked, "pad"), (stacks, "layer_by_layer")):
        fn = getattr(owner, f"_plain_{attr}", None) or getattr(owner, attr)
        setattr(owner, f"_plain_{attr}", fn)

        def wrapper(*args, _fn=fn, **kwargs):
            with torch.cuda.use_mem_pool(pool) if pool is not None else contextlib.nullcontext():
                return _fn(*args, **kwargs)
        setattr(owner, attr, wrapper)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq", type=int, default=100)
    p.add_argument("--calls", type=int, default=80)
    p.add_argument("--batches", type=int, help="PackedSequences given in turn (default: one per call)")
    args = p.parse_args()
    device = torch.device("cuda")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    T, B = args.seq, args.batch
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, B, 512, device=device)
    batches = []
    for _ in range(args.batches or args.calls):
        lengths = torch.randint(10, T + 1, (B,), generator=g)
        lengths[0] = T
        batches.append(pack_padded_sequence(x, lengths, enforce_sorted=False))
    entered = _entries()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    results = {}
    print(f"{torch.cuda.get_device_name(device)}; LSTM T={T} B={B} I=H=512, {args.layers} layer(s), two "
          f"directions, {args.calls} inference calls over {len(batches)} PackedSequences in turn")
    for way in ("plain", "own pool"):
        torch.manual_seed(0)
        lstm = LSTM(512, 512, args.layers, bidirectional=True, schedule="tensor").to(device)
        pool = torch.cuda.MemPool() if way == "own pool" else None
        _pooled(pool)
        times, reached = [], 0
        with torch.no_grad():
            for i in range(args.calls):
                before = entered[0]
                torch.cuda.synchronize()
                start.record()
                out, (h, c) = lstm(batches[i % len(batches)])
                end.record()
                end.synchronize()
                if i >= args.calls // 2:
                    times.append(start.elapsed_time(end))
                    reached += entered[0] > before
            outs = [lstm(b) for b in batches[:4]]
        results[way] = [(o.data.clone(), hh.clone(), cc.clone()) for o, (hh, cc) in outs]
        used = pool.snapshot() if pool is not None else []  # (segments of the pool, each a dict)
        pool_bytes = sum(s["total_size"] for s in used)
        print(f"  {way:9s} last {len(times)} calls: {reached} reached a runner's whole path; forward median "
              f"{statistics.median(times):.3f} ms (min {min(times):.3f})"
              + (f"; the pool holds {pool_bytes / 2**20:.1f} MiB in {len(used)} segment(s)" if pool else ""))
        _pooled(None)
    same = all(torch.equal(a, b) for one, other in zip(results["plain"], results["own pool"], strict=True)
               for a, b in zip(one, other, strict=True))
    print(f"  outputs of the two ways the same to the bit: {same}")


if __name__ == "__main__":
    main()
