"""cuDNN's persistent RNN algorithms in float32, called through cuDNN's C API, on the LSTM of the usual
benchmark (T=100, input = hidden = 512, one layer) at B = 1, 8 and 64: each checked against torch.nn.LSTM
(PyTorch's choice of cuDNN algorithm, TF32 off) with the same weights, then timed with CUDA events after a
warm-up, the median of the repeats. Needs only PyTorch with CUDA and cuDNN 9.

    python benchmarks/probes/cudnn_persistent_probe.py [--kind lstm --seq 100 --hidden 512 --batches 1,8,64]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
import torch

from cellfuse.gpu_runtime.cudnn_persistent import (
    ALGORITHM_NAMES,
    ALGORITHMS,
    CudnnPersistentRNN,
    CudnnRefused,
    load_cudnn,
)
from cellfuse.gpu_runtime.torch_baselines import CudnnCell
from cellfuse.graph_model import init_params, load_template

TOLERANCE = 1e-4  # the benchmark's: largest error relative to the largest value


def time_ms(run, warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kind", choices=["lstm", "gru"], default="lstm")
    p.add_argument("--seq", type=int, default=100)
    p.add_argument("--input", type=int, default=512)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=50)
    args = p.parse_args()
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    cudnn = load_cudnn()
    print(f"{torch.cuda.get_device_name()}, PyTorch {torch.__version__}, cuDNN {cudnn.version}")
    print(f"{args.kind.upper()} T={args.seq} input={args.input} hidden={args.hidden} layers={args.layers}; "
          f"median of {args.repeats} after {args.warmup} warm-up runs")
    cell = load_template(args.kind)
    params = init_params(cell, args.layers, args.input, args.hidden, seed=0)
    reference = CudnnCell(args.kind, params, args.layers, args.input, args.hidden)
    states = 2 if args.kind == "lstm" else 1
    for batch in (int(b) for b in args.batches.split(",")):
        gen = torch.Generator(device="cuda").manual_seed(batch)
        x = torch.randn(args.seq, batch, args.input, device="cuda", generator=gen)
        initial = [0.5 * torch.randn(args.layers, batch, args.hidden, device="cuda", generator=gen)
                   for _ in range(states)]
        want = reference(x, initial).clone()
        scale = float(want.abs().max())
        ms = statistics.median(time_ms(lambda x=x, initial=initial: reference(x, initial), args.warmup,
                                       args.repeats))
        print(f"B={batch:<4d} {'torch.nn.' + args.kind.upper() + ' (PyTorch picks)':40s} {ms:9.3f} ms")
        for name, algo in ALGORITHMS.items():
            label = ALGORITHM_NAMES[algo]
            try:
                model = CudnnPersistentRNN(args.kind, params, args.layers, args.input, args.hidden, batch,
                                           args.seq, algo)
                got = model(x, initial).clone()
                torch.cuda.synchronize()
            except CudnnRefused as e:
                print(f"B={batch:<4d} {label:40s} not applicable: {e}")
                continue
            error = float((got - want).abs().max()) / scale
            if not np.isfinite(error) or error >= TOLERANCE:
                print(f"B={batch:<4d} {label:40s} WRONG: relative error {error:.2e} against torch.nn")
                model.close()
                continue
            times = time_ms(lambda model=model, x=x, initial=initial: model(x, initial), args.warmup,
                            args.repeats)
            print(f"B={batch:<4d} {label:40s} {statistics.median(times):9.3f} ms  (min {min(times):.3f}, "
                  f"max {max(times):.3f}; error {error:.1e}; baseline '{name}')")
            model.close()


if __name__ == "__main__":
    main()
