"""The host time of CellRNN's forward call, layer by layer: the program's launches alone (one call into
the launch list), the runner (allocations, addresses, launches), the eager path to it, the custom op, and
the module around them; then the pieces of those layers alone; under
torch.no_grad(), the LSTM at input = hidden = 512, T=100. A layer whose host time equals the wall time
of back-to-back calls waits for the GPU somewhere.

    python3 benchmarks/probes/cellrnn_host_layers.py [--schedule persistent] [--batch 1]
"""

from __future__ import annotations

import argparse
import time

import torch

from cellfuse.nn import CellRNN, ops, stacks


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
        stream = torch._C._cuda_getCurrentRawStream(0)
        y, finals, out, scratch = runner._inference_memory(x, 2)
        bases = [scratch, runner.packed.data_ptr(), x.data_ptr(), out, 0, *(z.data_ptr() for z in zeros),
                 *(f.data_ptr() for f in finals)]
        cell = rnn._cell_text
        layers = {
            "program.run": lambda: program.run(bases, stream),
            "runner.forward": lambda: runner.forward(x, zeros, params, False, True),
            "ops.run": lambda: ops.run(x, zeros, params, cell, 512, 1, args.schedule, False),
            "torch.ops.cellfuse.rnn": lambda: torch.ops.cellfuse.rnn(x, zeros, params, cell, 512, 1,
                                                                     args.schedule, False, 0, ""),
            "module": lambda: rnn(x),
        }
        for name, fn in layers.items():
            host, wall = per_call_us(fn, args.calls)
            print(f"{name:24s} host {host:8.1f} us  wall {wall:8.1f} us per call", flush=True)
        print("launches of the program:", len(program.calls), program.names)
        # the pieces of the layers above, each alone
        T, B = x.shape[0], x.shape[1]
        pieces = {
            "module.forward": lambda: rnn.forward(x),
            "stacks.run": lambda: stacks.run(x, zeros, params, cell, 512, 1, args.schedule),
            "module._check": lambda: rnn._check(x, None),
            "torch.onnx.is_in_onnx_export": torch.onnx.is_in_onnx_export,
            "torch.jit.is_tracing": torch.jit.is_tracing,
            "module._params": rnn._params,
            "ops.runner (lookup)": lambda: ops.runner(cell, x, 512, 1, args.schedule),
            "runner._weights": lambda: runner._weights(params, stream),
            "runner._inference_memory": lambda: runner._inference_memory(x, 2),
            "torch.empty": lambda: torch.empty(1024, device="cuda"),
            "empty [T+3, B, H] + split": lambda: torch.empty((T + 3, B, 512), device="cuda").split(
                [1, T, 1, 1]),
            "as_strided": lambda: x.as_strided((T, B, 512), (B * 512, 512, 1), 0),
            "x[1:]": lambda: x[1:],
            "is_current_stream_capturing": torch.cuda.is_current_stream_capturing,
            "_cuda_getCurrentRawStream": lambda: torch._C._cuda_getCurrentRawStream(0),
            "torch.is_grad_enabled": torch.is_grad_enabled,
            "x.data_ptr()": x.data_ptr,
        }
        for name, fn in pieces.items():
            host, _ = per_call_us(fn, args.calls * 10)
            print(f"  {name:30s} {host:8.2f} us", flush=True)

if __name__ == "__main__":
    main()
