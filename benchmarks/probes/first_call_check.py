"""A module's first forward calls against cuDNN, call by call: each of five x at an address of its own (every
call of the module's program launches: none is seen twice), the first x three times more (captured, then
replayed), then a second module of the same weights called once (its packing new, the runner's program
not). Prints each call's largest difference from torch.nn.LSTM (cuDNN, float32, TF32 off), so that a
call that computes wrong shows which of those paths it took.

    python3 benchmarks/probes/first_call_check.py --layers 2 --batch 256 --schedule wavefront
    CUDA_LAUNCH_BLOCKING=1 python3 benchmarks/probes/first_call_check.py --layers 2 --batch 256
"""

from __future__ import annotations

import argparse
import os

import torch

from cellfuse.gpu_runtime.torch_baselines import CudnnCell
from cellfuse.nn import CellRNN

HIDDEN = 512
SEQ = 100


def pair(layers: int, schedule: str, device: torch.device) -> tuple[CellRNN, torch.nn.Module]:
    rnn = CellRNN("lstm", HIDDEN, HIDDEN, layers, schedule=schedule, seed=0).to(device)
    params = {k: rnn.param(k).detach().cpu().numpy() for k in rnn.keys}
    return rnn, CudnnCell("lstm", params, layers, HIDDEN, HIDDEN, device=str(device),
                          dtype=torch.float32).module


def diff(y: torch.Tensor, want: torch.Tensor) -> str:
    return f"{float((y.double() - want.double()).abs().max()):.2e}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--schedule", default="wavefront")
    ap.add_argument("--sync", action="store_true", help="synchronise the device before each call")
    args = ap.parse_args()
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device("cuda")
    generator = torch.Generator().manual_seed(1)
    xs = [torch.randn(SEQ, args.batch, HIDDEN, generator=generator).to(device) for _ in range(5)]
    first, cudnn = pair(args.layers, args.schedule, device)
    out = []
    with torch.no_grad():
        wants = [cudnn(x)[0] for x in xs]

        def call(rnn: CellRNN, x: torch.Tensor) -> torch.Tensor:
            if args.sync:
                torch.cuda.synchronize()
            return rnn(x)[0]

        out += [f"A new-x call {i}: {diff(call(first, x), want)}"
                for i, (x, want) in enumerate(zip(xs, wants, strict=True))]
        out += [f"A same-x call {i}: {diff(call(first, xs[0]), wants[0])}" for i in range(3)]
        second, _ = pair(args.layers, args.schedule, device)
        out.append(f"B first call: {diff(call(second, xs[1]), wants[1])}")
    print(f"layers={args.layers} B={args.batch} {'sync' if args.sync else 'nosync'} {args.schedule} "
          f"blocking={os.environ.get('CUDA_LAUNCH_BLOCKING', '0')}: " + "; ".join(out), flush=True)


if __name__ == "__main__":
    main()
