"""Whether a bidirectional layer's inference call would gain from running as one CUDA graph: the drop-in
LSTM's call made eagerly (its kept calls, one replay per layer and direction, launched by the host one
after the other) beside the same call captured whole into a torch.cuda.graph and replayed (both
directions' work branches of one graph, so that their input GEMMs are ready together and neither waits
for the host). On an H200 at b3829a6 the eager call's second direction started its input GEMM 90 us
after the first direction's, beside the first direction's persistent kernel on half of the SMs, and its
persistent kernel 120 us after the first's (docs/results/2026-12-02-j-the-reversal-by-a-kernel.md).

Cases (T=100, B=64, input = hidden = 512, float32, schedule as --schedule): one direction padded (the
reference), two directions padded, two directions over one PackedSequence (lengths uniform in 10..100),
two layers of two directions padded. Each replay is checked against the eager call's outputs to the bit;
then eager calls and replays in turns, each after a synchronisation, CUDA events, medians of --repeats.

    python3 benchmarks/probes/bidirectional_graph_probe.py [--repeats 30] [--schedule tensor]
"""

from __future__ import annotations

import argparse
import statistics
from functools import partial

import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--schedule", default="tensor")
    args = p.parse_args()
    device = torch.device("cuda")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    T, B, width = 100, 64, 512
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, B, width, generator=g).to(device)
    lengths = torch.randint(10, T + 1, (B,), generator=g)
    lengths[0] = T
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    print(f"{torch.cuda.get_device_name(device)}; LSTM T={T} B={B} I=H={width}, schedule {args.schedule}, "
          f"inference; eager calls and graph replays in turns, medians of {args.repeats}, ms")
    print("| layers | directions | input | eager | one graph | eager / graph | same to the bit |")
    print("|---|---|---|---|---|---|---|")
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
        e, r = statistics.median(eager), statistics.median(replays)
        kind = "packed 10..100" if is_packed else "padded"
        print(f"| {layers} | {directions} | {kind} | {e:.3f} | {r:.3f} | {e / r:.2f}x | {same} |", flush=True)
        del graph, lstm


if __name__ == "__main__":
    main()
