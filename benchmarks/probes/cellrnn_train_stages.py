"""Where the host time of one CellRNN training step goes, as `benchmarks/cellrnn_vs_cudnn.py` times it (`y =
rnn(x)[0]; y.float().pow(2).mean().backward()`, the gradients set to None before each step): a perf_counter
stamp as the step enters the module's forward, the runner's forward, the forward program's run and its
return (the work on the stream), the module's return, the runner's backward, the backward program's run and
its return, the parameters' gradients made from its buffers, autograd's Function's return, the first and the
last parameter's gradient stored (AccumulateGrad), and the step's end; and the GPU's time for the step (CUDA
events around it). Each step right after a synchronisation, or queued back to back. LSTM, input = hidden =
512, T=100. With --sgd, each step ends with an optimizer's step (torch.optim.SGD, in place), as a training
script's does: the next forward then packs the changed weights again. With --input-grad, x requires a
gradient (a layer over another's output): the backward pass then computes dx, which it leaves out otherwise.
With --precision bf16 or fp16, x in that dtype and the parameters float32, the fp16 loss scaled by
torch.amp.GradScaler's initial scale, as `benchmarks/cellrnn_vs_cudnn.py --precision` times the step.

    python3 benchmarks/probes/cellrnn_train_stages.py [--schedule auto] [--batches 1,8,64] [--steps 100] \
        [--sgd] [--input-grad] [--precision fp16]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from cellfuse.codegen.precision import PRECISIONS
from cellfuse.gpu_runtime.stream_program import StreamProgram
from cellfuse.nn import CellRNN, ops, stacks
from cellfuse.nn.cuda_runner import CudaRunner
from cellfuse.nn.runners import TORCH_DTYPES
from cellfuse.nn.tensor_layout import TensorLayout

STAGES = ("module.forward", "stacks.run", "_Eager.forward", "runner.forward", "runner._forward",
          "forward run", "forward queued", "module returned", "loss", "_Eager.backward", "runner.backward",
          "runner._backward", "backward run", "backward queued", "gradients made", "param grads made",
          "_Eager.backward returned", "first grad stored", "last grad stored", "backward returned",
          "step returned")
FP16_LOSS_SCALE = 2.0**16  # torch.amp.GradScaler's initial scale
_stamps: dict[str, int] = {}


def _stamped(fn, name: str):
    def wrapper(*args, **kwargs):
        _stamps[name] = time.perf_counter_ns()
        return fn(*args, **kwargs)
    return wrapper


def _stamped_after(fn, name: str):
    def wrapper(*args, **kwargs):
        out = fn(*args, **kwargs)
        _stamps[name] = time.perf_counter_ns()
        return out
    return wrapper


def _grad_stored(_param) -> None:
    """A parameter's gradient stored in .grad by autograd's AccumulateGrad."""
    now = time.perf_counter_ns()
    _stamps.setdefault("first grad stored", now)
    _stamps["last grad stored"] = now


def _run_stamped(run):
    def wrapper(*args, **kwargs):
        which = "backward" if "runner._backward" in _stamps else "forward"
        _stamps[f"{which} run"] = time.perf_counter_ns()
        out = run(*args, **kwargs)
        _stamps[f"{which} queued"] = time.perf_counter_ns()
        return out
    return wrapper


def _instrument() -> None:
    CellRNN.forward = _stamped(CellRNN.forward, "module.forward")
    stacks.run = _stamped(stacks.run, "stacks.run")
    forward, backward = ops._Eager.forward, ops._Eager.backward
    ops._Eager.forward = staticmethod(_stamped(forward, "_Eager.forward"))
    ops._Eager.backward = staticmethod(_stamped_after(_stamped(backward, "_Eager.backward"),
                                                      "_Eager.backward returned"))
    TensorLayout.gradients = _stamped_after(TensorLayout.gradients, "gradients made")
    TensorLayout.param_gradients = _stamped_after(TensorLayout.param_gradients, "param grads made")
    CudaRunner.forward = _stamped(CudaRunner.forward, "runner.forward")
    CudaRunner._forward = _stamped(CudaRunner._forward, "runner._forward")
    CudaRunner.backward = _stamped(CudaRunner.backward, "runner.backward")
    CudaRunner._backward = _stamped(CudaRunner._backward, "runner._backward")
    StreamProgram.run = _run_stamped(StreamProgram.run)


def _stages(rnn: CellRNN, x: torch.Tensor, steps: int, synchronised: bool, optimizer, scale: float
            ) -> dict[str, float]:
    rows, gpu = [], []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    for _ in range(steps):
        rnn.zero_grad(set_to_none=True)
        x.grad = None
        if synchronised:
            torch.cuda.synchronize()
        _stamps.clear()
        start.record()
        t0 = time.perf_counter_ns()
        y = rnn(x)[0]
        _stamps["module returned"] = time.perf_counter_ns()
        loss = y.float().pow(2).mean() * scale
        _stamps["loss"] = time.perf_counter_ns()
        loss.backward()
        _stamps["backward returned"] = time.perf_counter_ns()
        if optimizer is not None:
            optimizer.step()
        _stamps["step returned"] = time.perf_counter_ns()
        end.record()
        rows.append({name: (t - t0) / 1e3 for name, t in _stamps.items()})
        if synchronised:
            end.synchronize()
            gpu.append(start.elapsed_time(end))
    torch.cuda.synchronize()
    medians = {name: statistics.median(r[name] for r in rows if name in r)
               for name in STAGES if any(name in r for r in rows)}
    if gpu:
        medians["GPU ms"] = statistics.median(gpu)
    return medians


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--schedule", default="auto")
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--sgd", action="store_true", help="an optimizer's step at the end of each step")
    p.add_argument("--input-grad", action="store_true", help="x requires a gradient")
    p.add_argument("--precision", choices=list(PRECISIONS), default="fp32", help="x's dtype")
    args = p.parse_args()
    dtype = TORCH_DTYPES[PRECISIONS[args.precision].name]
    scale = FP16_LOSS_SCALE if args.precision == "fp16" else 1.0
    _instrument()
    print(f"microseconds from the step's start (median of {args.steps} steps); LSTM T=100, I=H=512, "
          f"x {dtype}, {torch.cuda.get_device_name()}")
    print(f"{'B':>4} {'steps':<14}" + "".join(f"{s:>17}" for s in (*STAGES, "GPU ms")))
    for batch in (int(b) for b in args.batches.split(",")):
        rnn = CellRNN("lstm", 512, 512, 1, schedule=args.schedule, seed=1).cuda()
        x = torch.randn(100, batch, 512, device="cuda").to(dtype).requires_grad_(args.input_grad)
        optimizer = torch.optim.SGD(rnn.parameters(), lr=1e-6) if args.sgd else None
        for param in rnn.parameters():
            param.register_post_accumulate_grad_hook(_grad_stored)
        for _ in range(20):
            (rnn(x)[0].float().pow(2).mean() * scale).backward()
            if optimizer is not None:
                optimizer.step()
        for synchronised in (True, False):
            stages = _stages(rnn, x, args.steps, synchronised, optimizer, scale)
            what = "after a sync" if synchronised else "back to back"
            print(f"{batch:>4} {what:<14}" + "".join(f"{stages.get(s, float('nan')):>17.1f}" for s in STAGES)
                  + f"{stages.get('GPU ms', float('nan')):>17.3f}", flush=True)


if __name__ == "__main__":
    main()
