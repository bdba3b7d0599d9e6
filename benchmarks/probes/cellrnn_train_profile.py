"""Where a CellRNN training step's time goes on the GPU: torch.profiler's table of CUDA kernels and CPU
ops over a few steps of the LSTM at input = hidden = 512, T=100; then, step by step (each step waited
for, as a benchmark that times single steps does), when the GPU sits idle and what the host is doing
then: the time from the step's start to its first kernel, and every gap between kernels of more than
GAP_US with the host's ops running as it ends.

    python3 benchmarks/probes/cellrnn_train_profile.py [--batch 1] [--schedule persistent] [--precision fp16]
        [--autocast]

With --precision bf16 or fp16, x in that dtype and the parameters float32, as the benchmark's 16-bit
training step runs them (benchmarks/cellrnn_vs_cudnn.py), its fp16 loss scaled the same way (by
torch.amp.GradScaler's initial scale); with --autocast too, x float32 and the forward call inside
torch.autocast to that dtype, as a mixed-precision training script makes it.
"""

from __future__ import annotations

import argparse

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from cellfuse.codegen.precision import PRECISIONS
from cellfuse.nn import CellRNN
from cellfuse.nn.runners import TORCH_DTYPES

GAP_US = 3.0  # idle time on the GPU worth naming
STEPS = 5


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--schedule", default="persistent")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--precision", choices=list(PRECISIONS), default="fp32")
    p.add_argument("--autocast", action="store_true", help="x float32, the call under torch.autocast")
    args = p.parse_args()
    rnn = CellRNN("lstm", 512, 512, 1, schedule=args.schedule, seed=1).cuda()
    dtype = TORCH_DTYPES[PRECISIONS[args.precision].name]
    autocast = args.autocast and dtype != torch.float32
    x = torch.randn(100, args.batch, 512, device="cuda", dtype=torch.float32 if autocast else dtype,
                    requires_grad=True)
    scale = torch.amp.GradScaler("cuda").get_scale() if dtype == torch.float16 else 1.0

    def step() -> None:
        with torch.autocast("cuda", dtype=dtype, enabled=autocast):
            y, _ = rnn(x)
        (y.float().pow(2).mean() * scale).backward()

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            with record_function("step"):
                step()
            torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=18, max_name_column_width=60))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=60))
    print(gaps(prof.events()))


def gaps(events) -> str:
    """The GPU's idle stretches of each step (see the module's docstring), as text."""
    # (the step's label shows on the GPU too, as a range over its kernels: not a kernel)
    device = sorted((e for e in events if e.device_type == DeviceType.CUDA and e.name != "step"
                     and "Buffer Request" not in e.name), key=lambda e: e.time_range.start)
    host = [e for e in events if e.device_type == DeviceType.CPU]
    steps = sorted((e for e in host if e.name == "step"), key=lambda e: e.time_range.start)
    lines = [f"GPU idle stretches over {GAP_US:g} us, step by step (us from the step's start):"]
    for i, s in enumerate(steps):
        start = s.time_range.start
        end = steps[i + 1].time_range.start if i + 1 < len(steps) else float("inf")
        mine = [e for e in device if start <= e.time_range.start < end]
        if not mine:
            lines.append(f"step {i}: no kernels")
            continue
        busy, idle, last = 0.0, mine[0].time_range.start - start, mine[0].time_range.start
        lines.append(f"step {i}: first kernel at {idle:.1f} ({mine[0].name[:50]}), host then in "
                     f"{doing(host, mine[0].time_range.start)}")
        for e in mine:
            gap = e.time_range.start - last
            if gap > GAP_US:
                idle += gap
                lines.append(f"  idle {gap:7.1f} at {last - start:8.1f}, until {e.name[:50]}; host in "
                             f"{doing(host, e.time_range.start)}")
            busy += max(0.0, e.time_range.end - max(last, e.time_range.start))
            last = max(last, e.time_range.end)
        lines.append(f"  step {last - start:.1f}: GPU busy {busy:.1f}, idle {idle:.1f}")
    return "\n".join(lines)


def doing(host, at: float) -> str:
    """The innermost host ops running at `at` (the step's own name left out), outermost first."""
    running = sorted((e for e in host if e.time_range.start <= at <= e.time_range.end and e.name != "step"),
                     key=lambda e: e.time_range.start)
    names = [e.name.removeprefix("autograd::engine::evaluate_function: ")[:40] for e in running]
    return " > ".join(names[-4:]) or "nothing (between ops)"


if __name__ == "__main__":
    main()
