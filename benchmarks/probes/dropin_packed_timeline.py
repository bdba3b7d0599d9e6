"""One forward call of the drop-in LSTM over a PackedSequence beside one over the padded tensor, as a
timeline: perf_counter stamps as the call enters each stage on the host (unpacking, the lengths' state,
the ops, the runner, the program's run, packing y back, the states' order) and, from torch.profiler's
trace of the same calls, when each piece of GPU work started and ended, in microseconds from the call's
start; with --train, the loss, backward() and the backward passes' stages too. Each call is made right
after the device was synchronised, as the drop-in benchmark times them.
LSTM, input = hidden = 512, T=100, lengths uniform in 10..100, under torch.no_grad(); with --train, a
training step instead (the call, then backward() of its output's sum of squares); --layers and
--bidirectional as torch.nn.LSTM's, --schedule as the drop-in's (default auto).

    python3 benchmarks/probes/dropin_packed_timeline.py [--batch 64] [--calls 50] [--train] [--trace OUT.json]
        [--profile] [--layers 1] [--bidirectional] [--schedule auto]

With --profile, cProfile over the calls of each (queued back to back, no synchronisation between them),
its functions by their own time and by their cumulative time, before the timelines.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import tempfile
import time

import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence
from torch.profiler import ProfilerActivity, profile, record_function

from cellfuse.gpu_runtime.stream_program import StreamProgram
from cellfuse.nn import LSTM, ops, packed_sequences, stacks
from cellfuse.nn.cuda_runner import CudaRunner
from cellfuse.nn.torch_rnn import _TorchRNN

_stamps: dict[str, int] = {}


def _stamped(owner, attr: str, name: str) -> None:
    fn = getattr(owner, attr)

    def wrapper(*args, **kwargs):
        _stamps.setdefault(name, time.perf_counter_ns())
        out = fn(*args, **kwargs)
        _stamps.setdefault(name + " done", time.perf_counter_ns())
        return out
    setattr(owner, attr, wrapper)


def _instrument() -> None:
    _stamped(packed_sequences.Unpacked, "__init__", "Unpacked")
    _stamped(packed_sequences.Unpacked, "pad", "pad")
    _stamped(packed_sequences._Rows, "padded", "the padding kernel")
    _stamped(stacks, "steps_left", "steps left")
    # (between the padding and the stack: 0.10 ms of a bidirectional packed call's host time)
    _stamped(stacks, "autocast_dtype", "autocast?")
    _stamped(_TorchRNN, "_check", "the input checked")
    _stamped(_TorchRNN, "_initial", "the initial states")
    _stamped(packed_sequences.Unpacked, "sorted", "the states sorted")
    _stamped(_TorchRNN, "_layer_params", "a layer's parameters")
    _stamped(stacks, "layer_by_layer", "layer by layer")
    # (the first of each in a call, as every stamp: where a bidirectional packed call's host goes)
    _stamped(stacks, "_reversal", "the lengths' reversal")
    if hasattr(stacks, "_reversed"):  # (the reversal by the kernel, in each direction's call)
        _stamped(stacks, "_reversed", "a reversal by the kernel")
    _stamped(stacks, "to_device", "a copy to the device")
    _stamped(ops, "side_by_side", "side by side?")
    _stamped(stacks, "_two_streams", "two streams")
    _stamped(stacks, "_direction", "a direction")
    _stamped(ops, "run", "ops.run")
    _stamped(CudaRunner, "_forward", "runner._forward")
    _stamped(StreamProgram, "run", "program.run")
    _stamped(packed_sequences.Unpacked, "pack", "pack")
    _stamped(packed_sequences.Unpacked, "unsorted", "unsorted")
    _stamped(packed_sequences._Packed, "backward", "y's packing: backward")
    if hasattr(packed_sequences, "Ends"):  # (the ops' node pads and packs a kept training call's rows)
        _stamped(packed_sequences.Ends, "padded", "the ops pad")
        _stamped(packed_sequences.Ends, "packed", "the ops pack y")
        _stamped(packed_sequences.Ends, "unsorted", "the ops reorder the final states")
        _stamped(packed_sequences.Ends, "gradient_padded", "the ops pad y's gradient")
    _stamped(ops._Eager, "backward", "the ops: backward")
    _stamped(CudaRunner, "_backward", "runner._backward")


def _call(rnn, given, train: bool) -> None:
    if not train:
        with torch.no_grad():
            rnn(given)
        return
    y = rnn(given)[0]
    _stamps.setdefault("the loss", time.perf_counter_ns())
    loss = (y.data if isinstance(y, PackedSequence) else y).square().sum()
    _stamps.setdefault("backward()", time.perf_counter_ns())
    loss.backward()
    rnn.zero_grad(set_to_none=True)


def _host_stages(rnn, given, calls: int, train: bool) -> dict[str, float]:
    rows = []
    for _ in range(calls):
        torch.cuda.synchronize()
        _stamps.clear()
        t0 = time.perf_counter_ns()
        _call(rnn, given, train)
        _stamps["returned"] = time.perf_counter_ns()
        torch.cuda.synchronize()
        _stamps["synchronised"] = time.perf_counter_ns()
        rows.append({name: (t - t0) / 1e3 for name, t in _stamps.items()})
    names = list(dict.fromkeys(n for r in rows for n in r))
    return {n: statistics.median(r[n] for r in rows if n in r) for n in names}


def _gpu_timeline(rnn, given, calls: int, trace_path: str, train: bool) -> tuple[list, dict]:
    """Per call: the GPU's pieces of work (name, start, end in us from the call's start), from the trace."""
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            torch.cuda.synchronize()
            with record_function(f"call {i}"):
                _call(rnn, given, train)
            torch.cuda.synchronize()
    prof.export_chrome_trace(trace_path)
    with open(trace_path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    starts = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("call "))
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    per_call = []
    for i, (t0, _) in enumerate(starts):
        t1 = starts[i + 1][0] if i + 1 < len(starts) else float("inf")
        work = sorted((e["ts"] - t0, e["ts"] + e["dur"] - t0, e["name"][:70])
                      for e in gpu if t0 <= e["ts"] < t1)
        per_call.append(work)
    summary = {
        "host: call returned": statistics.median(end - t0 for t0, end in starts),
        "GPU: first work starts": statistics.median(w[0][0] for w in per_call if w),
        "GPU: last work ends": statistics.median(w[-1][1] for w in per_call if w),
        "GPU: busy": statistics.median(sum(e - s for s, e, _ in w) for w in per_call if w),
        "GPU: pieces of work": statistics.median(len(w) for w in per_call),
    }
    return per_call, summary


def _profiled(name: str, rnn, given, calls: int, train: bool) -> None:
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    t0 = time.perf_counter()
    profiler.enable()
    for _ in range(calls):
        _call(rnn, given, train)
    profiler.disable()
    host = (time.perf_counter() - t0) / calls
    torch.cuda.synchronize()
    print(f"\n== {name}: cProfile, host {1e3 * host:.3f} ms a call (under the profiler)")
    stats = pstats.Stats(profiler)
    stats.strip_dirs().sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(30)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--train", action="store_true", help="time training steps, not inference calls")
    p.add_argument("--trace", default=None, help="where to write the packed calls' chrome trace")
    p.add_argument("--profile", action="store_true", help="cProfile the calls first (see the docstring)")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--bidirectional", action="store_true")
    p.add_argument("--schedule", default="auto")
    args = p.parse_args()
    B = args.batch
    torch.manual_seed(0)
    rnn = LSTM(512, 512, args.layers, bidirectional=args.bidirectional, schedule=args.schedule).cuda()
    x = torch.randn(100, B, 512, device="cuda")
    lengths = torch.randint(10, 101, (B,), generator=torch.Generator().manual_seed(0))
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    for _ in range(20):
        _call(rnn, packed, args.train), _call(rnn, x, args.train)
    what = "training steps" if args.train else "calls"
    print(f"{torch.cuda.get_device_name()}; LSTM T=100 B={B} I=H=512, {args.layers} layer(s), "
          f"{2 if args.bidirectional else 1} direction(s); microseconds from the call's start, "
          f"medians of {args.calls} {what} each after a synchronisation")
    if args.profile:
        for name, given in (("padded", x), ("packed", packed)):
            _profiled(name, rnn, given, args.calls, args.train)
    _instrument()
    for name, given in (("padded", x), ("packed", packed)):
        print(f"\n== {name}: host stamps")
        for stage, us in _host_stages(rnn, given, args.calls, args.train).items():
            print(f"  {stage:28s} {us:9.1f}")
        trace = args.trace if (args.trace and name == "packed") else tempfile.mktemp(suffix=".json")
        per_call, summary = _gpu_timeline(rnn, given, args.calls, trace, args.train)
        print(f"== {name}: GPU, from torch.profiler (its own overhead included)")
        for what, us in summary.items():
            print(f"  {what:28s} {us:9.1f}")
        print("  the last call's work:")
        for s, e, n in per_call[-1]:
            print(f"    {s:9.1f} {e:9.1f} {n}")


if __name__ == "__main__":
    main()
