"""CellRNN over rows of their own lengths under torch.compile: does inductor's mode "reduce-overhead"
capture the call into a CUDA graph, and what does a call cost eager, compiled and compiled with
"reduce-overhead"? The lengths are an input of the compiled graph (on the CPU, or on the GPU), and the
graph checks their bounds as it runs; a CPU input or a copy between devices in a graph makes inductor
skip its CUDA graphs, which it counts (torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]) and
logs. Each variant is checked against the eager call first (outputs and final states; in training x's
gradient), then timed from a synchronised device (CUDA events, medians of --calls), forward under
torch.no_grad() and a training step (forward, y.square().mean(), backward).

    python3 benchmarks/probes/compiled_lengths.py [--batch 64] [--seq 100] [--calls 20]
    python3 benchmarks/probes/compiled_lengths.py --device cpu --hidden 16 --batch 4 --seq 12 --calls 1
"""

from __future__ import annotations

import argparse
import logging
import time

import torch
from torch._dynamo.utils import counters

from cellfuse.nn import CellRNN


def median_ms(fn, calls: int, device: str) -> float:
    """Median time of fn() over `calls` calls after three untimed ones, each from a synchronised device."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(calls):
        if device == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    return sorted(times)[len(times) // 2]


def forward(fn, x: torch.Tensor, lengths: torch.Tensor) -> None:
    with torch.no_grad():
        fn(x, lengths)


def step(fn, x: torch.Tensor, lengths: torch.Tensor) -> None:
    torch.autograd.grad(fn(x, lengths)[0].square().mean(), x)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=100)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--schedule", default="auto")
    args = p.parse_args()
    device, T, B, H = args.device, args.seq, args.batch, args.hidden
    torch.manual_seed(0)
    rnn = CellRNN("lstm", H, H, 1, schedule=args.schedule, seed=1).to(device)
    x = torch.randn(T, B, H, device=device)
    lengths_cpu = torch.randint(max(1, T // 10), T + 1, (B,))
    skips = logging.getLogger("torch._inductor")  # (where inductor says why it skips its CUDA graphs)
    skips.setLevel(logging.INFO)
    logging.basicConfig(level=logging.WARNING, format="  log: %(name)s: %(message)s")
    torch._logging.set_logs(perf_hints=True)

    def call(x, lengths):
        y, final = rnn(x, lengths=lengths)
        return y, final["h"], final["c"]

    print(f"CellRNN lstm T={T} B={B} input=hidden={H} schedule={args.schedule} on {device}, lengths "
          f"{int(lengths_cpu.min())} to {int(lengths_cpu.max())}")
    print("| lengths on | variant | cudagraph skips | forward ms | training step ms | check |")
    print("|---|---|---|---|---|---|")
    def padded(x, lengths):  # (every row the full length, no lengths given: the time to come near)
        y, final = rnn(x)
        return y, final["h"], final["c"]
    xg = x.clone().requires_grad_(True)
    fwd = median_ms(lambda: forward(padded, x, None), args.calls, device)
    train = median_ms(lambda: step(padded, xg, None), args.calls, device)
    print(f"| none | eager, padded | 0 | {fwd:.3f} | {train:.3f} | |")
    for lengths_on in (["cpu", "cuda"] if device == "cuda" else ["cpu"]):
        lengths = lengths_cpu.to(lengths_on)
        variants = {"eager": call}
        for mode in (None, "reduce-overhead"):
            torch._dynamo.reset()
            variants[f"compile {mode or 'default'}"] = torch.compile(call, fullgraph=True, mode=mode)
        want = [t.detach() for t in call(x, lengths)]
        (want_grad,) = torch.autograd.grad(call(xg, lengths)[0].square().mean(), xg)
        for name, fn in variants.items():
            before = counters["inductor"]["cudagraph_skips"]
            with torch.no_grad():
                got = [t.clone() for t in fn(x, lengths)]
            (grad,) = torch.autograd.grad(fn(xg, lengths)[0].square().mean(), xg)
            diff = max(float((a - b).abs().max()) for a, b in zip(got, want, strict=True))
            gdiff = float((grad - want_grad).abs().max())

            fwd = median_ms(lambda f=fn, a=lengths: forward(f, x, a), args.calls, device)
            train = median_ms(lambda f=fn, a=lengths, g=xg: step(f, g, a), args.calls, device)
            skipped = counters["inductor"]["cudagraph_skips"] - before
            print(f"| {lengths_on} | {name} | {skipped} | {fwd:.3f} | {train:.3f} | "
                  f"outputs {diff:.1e}, dx {gdiff:.1e} |")


if __name__ == "__main__":
    main()
