"""The LSTM's training-step gradients against a float64 torch.nn.LSTM on the GPU: cellfuse.nn.LSTM under a
rung, and torch.nn.LSTM in float32 (cuDNN, TF32 off) beside it, each as the largest difference of a
parameter's gradient relative to the largest of that gradient (or 1e-3 of the largest of all), the
largest over the parameters and each parameter's. With --float32-gemms, every cuBLAS GEMM of the plans in
float32 (no splits on tensor cores: gemm_routes.F16X3_MIN_MACS out of reach), so that the persistent kernels'
own products are all that differ.

    python3 benchmarks/probes/lstm_grad_accuracy.py --cases 1000:8:persistent,100:256:tensor [--float32-gemms]
"""

from __future__ import annotations

import argparse

import torch

from cellfuse.codegen import gemm_routes
from cellfuse.nn import LSTM


def grads(module, x):
    y, _ = module(x)
    params = list(module.parameters())
    return y, torch.autograd.grad(y.pow(2).mean(), params)


def rels(got, want) -> list[float]:
    largest = max(float(w.abs().max()) for w in want)
    return [float((g.double() - w).abs().max()) / max(float(w.abs().max()), 1e-3 * largest)
            for g, w in zip(got, want, strict=True)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default="1000:8:persistent,100:64:tensor,100:256:tensor")
    p.add_argument("--float32-gemms", action="store_true", help="cuBLAS's GEMMs in float32, not 3xTF32")
    args = p.parse_args()
    if args.float32_gemms:
        gemm_routes.F16X3_MIN_MACS = 2**62
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    for case in args.cases.split(","):
        T, B, schedule = case.split(":")
        torch.manual_seed(0)
        ours = LSTM(512, 512, schedule=schedule).cuda()
        ref32 = torch.nn.LSTM(512, 512).cuda()
        ref32.load_state_dict(ours.state_dict())
        ref64 = torch.nn.LSTM(512, 512).cuda().double()
        ref64.load_state_dict(ours.state_dict())
        x = torch.randn(int(T), int(B), 512, device="cuda")
        y64, g64 = grads(ref64, x.double())
        for name, module in (("cellfuse", ours), ("cudnn fp32", ref32)):
            y, g = grads(module, x)
            each = rels(g, g64)
            names = [n for n, _ in module.named_parameters()]
            each_text = ", ".join(f"{n} {e:.1e}" for n, e in zip(names, each, strict=True))
            print(f"T={T} B={B} {schedule:10s} {name:10s} y {float((y.double() - y64).abs().max()):.2e}  "
                  f"grads {max(each):.2e} ({each_text})", flush=True)


if __name__ == "__main__":
    main()
