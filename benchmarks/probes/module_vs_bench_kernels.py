"""The same rung through `cellfuse bench` and through CellRNN's inference calls, each under torch's
profiler: the kernels each put on the GPU, with their counts and mean times, to tell where a module's
pass spends the time its benchmark does not; with --timeline, each one's last pass as a timeline (when
each kernel started and ended, from the end of the persistent kernel before it), which shows what runs
at once.

    python3 benchmarks/probes/module_vs_bench_kernels.py [--batch 64] [--layers 4] [--precision bf16]
        [--schedule wavefront] [--workspace-mib 32] [--timeline]
"""

from __future__ import annotations

import argparse

import torch

from cellfuse.gpu_runtime.bench import BenchConfig, run_benchmark
from cellfuse.graph_model import Sizes, load_template
from cellfuse.nn import CellRNN, ops

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def kernels(prof, title: str, calls: int) -> None:
    """Per kernel: launches, mean and total device microseconds per call of the pass."""
    rows = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA
            and e.self_device_time_total > 0]
    rows.sort(key=lambda e: -e.self_device_time_total)
    total = sum(e.self_device_time_total for e in rows) / calls
    print(f"\n{title}: {total:.1f} us of kernels per pass")
    for e in rows[:15]:
        print(f"  {e.count / calls:8.1f} x {e.self_device_time_total / max(e.count, 1):8.2f} us "
              f"= {e.self_device_time_total / calls:9.1f} us  {e.key[:90]}")


def timeline(prof, title: str) -> None:
    """The GPU work from the end of the next-to-last persistent kernel to the end of the last: each
    kernel's (or copy's, or memset's) start and end in microseconds from there, and its duration."""
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
    ends = [e.time_range.end for e in events if "persistent" in e.name]
    if len(ends) < 2:
        print(f"\n{title}: fewer than two persistent kernels in the profile")
        return
    origin, last = ends[-2], ends[-1]
    print(f"\n{title}: us from the end of the persistent kernel before it (start, end, duration)")
    for e in events:
        if origin <= e.time_range.start < last:
            start, end = e.time_range.start - origin, e.time_range.end - origin
            print(f"  {start:9.1f} {end:9.1f} {end - start:8.1f}  {e.name[:80]}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=100)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--precision", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--schedule", default="wavefront")
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--workspace-mib", type=int, default=0,
                   help="then again with this much cuBLAS workspace per handle (the benchmark's is 32)")
    p.add_argument("--timeline", action="store_true", help="each one's last pass as a timeline")
    args = p.parse_args()
    sizes = Sizes(args.seq, args.batch, 512, 512, args.layers)
    config = BenchConfig(sizes, backend="cuda", schedules=[args.schedule], baselines=[], repeats=args.calls,
                         warmup=1, seed=0, precision=args.precision)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        result = run_benchmark(load_template("lstm"), config)
        torch.cuda.synchronize()
    row = result.row(args.schedule)
    print(f"bench {args.schedule}: {row.median_ms:.3f} ms (ok {row.ok}); the profile holds its checks too")
    kernels(prof, "bench (checks, warm-up and timed runs)", args.calls + 3)
    if args.timeline:
        timeline(prof, "bench's last pass")

    rnn = CellRNN("lstm", 512, 512, args.layers, schedule=args.schedule, seed=1).cuda()
    x = torch.randn(args.seq, args.batch, 512, device="cuda").to(DTYPES[args.precision])
    ms, prof = module_calls(rnn, x, args.calls)
    print(f"\nCellRNN {args.schedule}: {ms:.3f} ms a call, back to back")
    kernels(prof, "CellRNN", args.calls)
    if args.timeline:
        timeline(prof, "CellRNN's last call")
    if args.workspace_mib:
        with torch.no_grad():
            given_workspace(rnn, x, args.workspace_mib)
        ms, prof = module_calls(rnn, x, args.calls)
        print(f"\nCellRNN {args.schedule}, each cuBLAS handle given {args.workspace_mib} MiB of workspace as "
              f"the benchmark's executor gives it: {ms:.3f} ms a call, back to back")
        kernels(prof, "CellRNN with the workspace", args.calls)


def module_calls(rnn: CellRNN, x: torch.Tensor, calls: int):
    """The module's inference calls after three untimed ones: ms a call, back to back, then torch's
    profiler over as many."""
    with torch.no_grad():
        for _ in range(3):
            rnn(x)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            rnn(x)
        end.record()
        end.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                rnn(x)
            torch.cuda.synchronize()
    return start.elapsed_time(end) / calls, prof


def given_workspace(rnn: CellRNN, x: torch.Tensor, mib: int) -> None:
    """Every cuBLAS handle of the module's inference program given a workspace of its own, and its
    captured runs captured again (the handles keep it while their streams do not change: a probe's
    setting, not the library's)."""
    from nvmath.bindings import cublas

    runner = ops.runner(rnn._cell_text, x, rnn.hidden_size, rnn.num_layers, rnn.schedule)
    program = runner._programs["forward"]
    keep = []
    for handle in program.res.handles:
        memory = torch.empty(mib * 2**20, dtype=torch.uint8, device=x.device)
        cublas.set_workspace(handle, memory.data_ptr(), memory.numel())
        keep.append(memory)
    given_workspace.kept = keep  # (alive for as long as the handles use them)
    replay = runner._replays.get("forward")
    if replay is not None:
        replay.close()


if __name__ == "__main__":
    main()
