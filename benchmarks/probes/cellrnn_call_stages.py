"""Where the host time of one CellRNN forward call goes, stage by stage, in a call made right after the
device was synchronised (as `benchmarks/cellrnn_vs_cudnn.py` times single calls) and in calls queued back
to back: perf_counter stamps as the call enters the module's forward, the module's C++ lane
(nn/quick_lane.py) and its return, the runner (`CudaRunner._forward`) and the program's run
(`StreamProgram.run`: the launch list, or the replay of a captured run), and as that run and the call
return (each stage's median over the calls that reached it); how many of the calls the lane made (the
others reach the runner), and how many of the others replayed a captured run. Under torch.no_grad(), the
LSTM at input = hidden = 512, T=100 (--seq). With --between cudnn, a torch.nn.LSTM (cuDNN) call of the same
sizes comes before each timed call, as in the benchmark's turns.

    python3 benchmarks/probes/cellrnn_call_stages.py [--schedule auto] [--batches 1,64] [--seq 100] \
        [--calls 200] [--between none,cudnn]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from cellfuse.gpu_runtime.stream_program import StreamProgram
from cellfuse.nn import CellRNN
from cellfuse.nn.cuda_runner import CudaRunner

STAGES = ("module.forward", "lane", "lane returned", "runner._forward", "program.run", "on the stream",
          "returned")
_stamps: dict[str, int] = {}  # stage -> perf_counter_ns, for the call being timed
_replayed: list[bool] = []  # per program run: whether it replayed a captured run


def _stamped(fn, name: str, after: str | None = None):
    def wrapper(*args, **kwargs):
        _stamps[name] = time.perf_counter_ns()
        out = fn(*args, **kwargs)
        if after:
            _stamps[after] = time.perf_counter_ns()
        return out
    return wrapper


class _StampedLane:
    """A module's C++ lane, stamped as it is called and returns (see quick_lane.py)."""

    def __init__(self, lane):
        self.lane = lane

    def __call__(self, *args):
        _stamps["lane"] = time.perf_counter_ns()
        out = self.lane(*args)
        _stamps["lane returned"] = time.perf_counter_ns()
        return out

    def __getattr__(self, name):
        return getattr(self.lane, name)


def _instrument() -> None:
    CellRNN.forward = _stamped(CellRNN.forward, "module.forward")
    CudaRunner._forward = _stamped(CudaRunner._forward, "runner._forward")
    StreamProgram.run = _stamped(StreamProgram.run, "program.run", "on the stream")
    kept_run = StreamProgram._kept_run

    def counted(self, bases):
        graph = kept_run(self, bases)
        _replayed.append(graph is not None)
        return graph
    StreamProgram._kept_run = counted


def _stages(rnn: CellRNN, x: torch.Tensor, calls: int, synchronised: bool, between) -> dict[str, float]:
    """Median microseconds from the call's start to each stamp (over the calls that reached it), the share
    of calls the lane made, and the share of the others' runs replayed."""
    rows = []
    torch.cuda.synchronize()
    _replayed.clear()
    for _ in range(calls):
        if between is not None:
            with torch.no_grad():
                between(x)
        quick = rnn._quick
        if quick is not None and quick._lane is not None and not isinstance(quick._lane, _StampedLane):
            quick._lane = _StampedLane(quick._lane)
        if synchronised:
            torch.cuda.synchronize()
        _stamps.clear()
        t0 = time.perf_counter_ns()
        with torch.no_grad():
            rnn(x)
        _stamps["returned"] = time.perf_counter_ns()
        rows.append({name: (t - t0) / 1e3 for name, t in _stamps.items()})
    torch.cuda.synchronize()
    medians = {}
    for name in STAGES:
        stamped = [r[name] for r in rows if name in r]
        if stamped:
            medians[name] = statistics.median(stamped)
    lane = sum("runner._forward" not in r for r in rows) / len(rows)
    return {**medians, "lane made": lane, "replayed": sum(_replayed) / max(1, len(_replayed))}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--schedule", default="auto")
    p.add_argument("--batches", default="1,64")
    p.add_argument("--seq", type=int, default=100)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--between", default="none", help="comma-separated: none, cudnn")
    args = p.parse_args()
    _instrument()
    print(f"microseconds from the call's start (median of {args.calls} calls); LSTM T={args.seq}, I=H=512, "
          f"{torch.cuda.get_device_name()}")
    print(f"{'B':>4} {'between':<8} {'calls':<14}"
          + "".join(f"{s:>16}" for s in (*STAGES, "lane made", "replayed")))
    for batch in (int(b) for b in args.batches.split(",")):
        rnn = CellRNN("lstm", 512, 512, 1, schedule=args.schedule, seed=1).cuda()
        cudnn = torch.nn.LSTM(512, 512).cuda()
        x = torch.randn(args.seq, batch, 512, device="cuda")
        for _ in range(20):
            with torch.no_grad():
                rnn(x), cudnn(x)
        for between in args.between.split(","):
            for synchronised in (True, False):
                stages = _stages(rnn, x, args.calls, synchronised, cudnn if between == "cudnn" else None)
                what = "after a sync" if synchronised else "back to back"
                print(f"{batch:>4} {between:<8} {what:<14}"
                      + "".join(f"{stages.get(s, float('nan')):>16.1f}" for s in STAGES)
                      + "".join(f"{stages.get(s, float('nan')):>16.2f}" for s in ("lane made", "replayed")),
                      flush=True)

if __name__ == "__main__":
    main()
