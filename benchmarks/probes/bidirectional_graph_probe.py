"""Whether a bidirectional layer's inference call would gain from running as one CUDA graph: the drop-in
LSTM's call made eagerly (its kept calls, one replay per layer and direction, launched by the host one
after the other) beside the same call captured whole into a torch.cuda.graph and replayed (both
directions' work branches of one graph, neither waiting for the host; which branch's kernels the GPU
takes first is its own choice: docs/results/2026-12-02-k-packing-by-tiles-and-a-whole-call-graph-tried.md).
On an H200 at b3829a6 the eager call's second direction started its input GEMM 90 us after the first
direction's, beside the first direction's persistent kernel on half of the SMs, and its persistent
kernel 120 us after the first's (docs/results/2026-12-02-j-the-reversal-by-a-kernel.md).

Cases (T=100, B=64, input = hidden = 512 unless --steps, --batch and --width say, float32, schedule as
--schedule): one direction padded (the reference), two directions padded, two directions over one
PackedSequence (lengths uniform in 10..T), two layers of two directions padded. Each replay is checked
against the eager call's outputs to the bit; then eager calls and replays in turns, each after a
synchronisation, CUDA events, medians of --repeats.
With --timeline, each case's last eager call and last replay as torch.profiler traced them: each piece
of GPU work's start and end, in microseconds from the first one's start.

    python3 benchmarks/probes/bidirectional_graph_probe.py [--repeats 30] [--schedule tensor] [--timeline]
        [--steps 100] [--batch 64] [--width 512]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from functools import partial

import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence
from torch.profiler import ProfilerActivity, profile

from cellfuse.nn import LSTM

CASES = [  # layers, directions, packed
    (1, 1, False), (1, 2, False), (1, 2, True), (2, 2, False)]


def _outputs(out) -> list[torch.Tensor]:
    y, (h, c) = out
    return [y.data if isinstance(y, PackedSequence) else y, h, c]


def _timed(fn, start, end) -> float:
    torch.cuda.synchronize()
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def _timeline(fn) -> list[tuple[float, float, str]]:
    """The GPU's pieces of work of one call of fn after a synchronisation: (start, end, name), us from
    the first's start."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        with open(f.name) as trace:
            events = json.load(trace)["traceEvents"]
    work = sorted((e["ts"], e["ts"] + e["dur"], e["name"][:60]) for e in events
                  if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    t0 = work[0][0] if work else 0.0
    return [(s - t0, e - t0, name) for s, e, name in work]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--schedule", default="tensor")
    p.add_argument("--timeline", action="store_true", help="print each case's GPU work, eager and replayed")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=512, help="input and hidden size")
    args = p.parse_args()
    device = torch.device("cuda")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    T, B, width = args.steps, args.batch, args.width
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, B, width, generator=g).to(device)
    lengths = torch.randint(min(10, T), T + 1, (B,), generator=g)
    lengths[0] = T
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    print(f"{torch.cuda.get_device_name(device)}; LSTM T={T} B={B} I=H={width}, schedule {args.schedule}, "
          f"inference; eager calls and graph replays in turns, medians of {args.repeats}, ms")
    print("| layers | directions | input | eager | one graph | eager / graph | same to the bit |")
    print("|---|---|---|---|---|---|---|")
    timelines = []
    for layers, directions, is_packed in CASES:
        torch.manual_seed(0)
        lstm = LSTM(width, width, layers, bidirectional=directions == 2, schedule=args.schedule).to(device)
        given = packed if is_packed else x
        with torch.no_grad():
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # (warm-up on a side stream, then the capture: torch's docs)
                for _ in range(5):
                    want = _outputs(lstm(given))
            torch.cuda.current_stream().wait_stream(side)
            for _ in range(5):
                want = _outputs(lstm(given))
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = _outputs(lstm(given))
            graph.replay()
            torch.cuda.synchronize()
            same = all(torch.equal(a, b) for a, b in zip(captured, want, strict=True))
            eager, replays = [], []
            for _ in range(args.repeats):
                eager.append(_timed(partial(lstm, given), start, end))
                replays.append(_timed(graph.replay, start, end))
            if args.timeline:
                timelines.append((layers, directions, is_packed, _timeline(partial(lstm, given)),
                                  _timeline(graph.replay)))
        e, r = statistics.median(eager), statistics.median(replays)
        kind = f"packed {min(10, T)}..{T}" if is_packed else "padded"
        print(f"| {layers} | {directions} | {kind} | {e:.3f} | {r:.3f} | {e / r:.2f}x | {same} |", flush=True)
        del graph, lstm
    for layers, directions, is_packed, eager_work, graph_work in timelines:
        kind = "packed" if is_packed else "padded"
        for way, work in (("eager", eager_work), ("one graph", graph_work)):
            print(f"\n== {layers} layer(s), {directions} direction(s), {kind}, {way}: the GPU's work (us)")
            for s, e, name in work:
                print(f"  {s:9.1f} {e:9.1f}  {name}")


if __name__ == "__main__":
    main()
