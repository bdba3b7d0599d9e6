"""The host time of CellRNN's forward call, layer by layer: the program's launches alone, the runner
(allocations, addresses, launches), the custom op around it, and the module around that; under
torch.no_grad(), the LSTM at input = hidden = 512, T=100. A layer whose host time equals the wall time
of back-to-back calls waits for the GPU somewhere.

    python3 benchmarks/probes/cellrnn_host_layers.py [--schedule persistent] [--batch 1]
"""

from __future__ import annotations

import argparse
import time

import torch

from cellfuse.nn import CellRNN, ops


def per_call_us(fn, calls: int) -> tuple[float, float]:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - t
    torch.cuda.synchronize()
    wall = time.perf_counter() - t
    return host / calls * 1e6, wall / calls * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--schedule", default="persistent")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--calls", type=int, default=300)
    args = p.parse_args()
    rnn = CellRNN("lstm", 512, 512, 1, schedule=args.schedule, seed=1).cuda()
    x = torch.randn(100, args.batch, 512, device="cuda")
    params = rnn._params()
    zeros = [torch.zeros(1, args.batch, 512, device="cuda")] * 2
    with torch.no_grad():
        rnn(x)
        runner = ops.runner(rnn._cell_text, x, 512, 1, args.schedule)
        program = runner._programs["forward"]
        out = runner.forward(x, zeros, params, False)
        stream = torch._C._cuda_getCurrentRawStream(0)
        reserve = torch.empty(runner.infer_memory.reserve_bytes, dtype=torch.uint8, device="cuda")
        y_full = out[0].data_ptr() - 2048 * args.batch
        bases = [reserve.data_ptr(), runner.packed.data_ptr(), x.data_ptr(), y_full, 0,
                 *(z.data_ptr() for z in zeros), *(f.data_ptr() for f in out[1])]
        at = [bases[k] + o for k, o in runner._binders["forward"]]
        layers = {
            "program.run": lambda: program.run(at, stream),
            "runner.forward": lambda: runner.forward(x, zeros, params, False),
            "torch.ops.cellfuse.rnn": lambda: torch.ops.cellfuse.rnn(x, zeros, params, rnn._cell_text, 512, 1,
                                                                     args.schedule, False),
            "module": lambda: rnn(x),
        }
        for name, fn in layers.items():
            host, wall = per_call_us(fn, args.calls)
            print(f"{name:24s} host {host:8.1f} us  wall {wall:8.1f} us per call", flush=True)
        print("launches of the program:", len(program.calls), program.names)


if __name__ == "__main__":
    main()
