"""cellfuse.nn.LSTM / GRU against torch.nn.LSTM / GRU (cuDNN) with the same state dict, called as a training
script calls them: padded and packed sequences (lengths drawn uniformly), one and two directions; one JSON
record and a Markdown table.

    python3 benchmarks/dropin_vs_torch.py --out benchmarks/results/h200_DATE_dropin_vs_torch.json
    python3 benchmarks/dropin_vs_torch.py --cases 0,1 --out /tmp/dropin.json  # the first two of CASES

Each case is checked before it is timed: the outputs (a PackedSequence's data) and every gradient of a
training step against torch's, in float32 with TF32 off on both sides (largest absolute difference of
the outputs at most 1e-4, of each gradient at most 1e-3 of its largest). Times: CUDA events around the
forward call under torch.no_grad(), and around a training step (forward, loss = sum of squares of the
outputs' data, backward; the gradients set to None between steps, outside the clock; with --optimizer
sgd an SGD step at its end, which changes the weights as a training script's does, so that the drop-in
packs them again at its next forward), the modules given the same input (a PackedSequence made once,
before: torch's packing is not timed); medians of --repeats runs taken in turns, after --warmup runs of
each. A turn times two calls: the first right after the other library's call, the second after its own,
as a loop calls it; the second is the time reported, the first is kept in the record (`*_after_other`):
a call's host time is longer while the other library's code and data hold the CPU's caches.
The table's rungs are those the drop-in's last forward call and training step ran (`schedules_run`,
`auto` resolved).

--seq and --batch replace the cases' T and B (lengths drawn up to the new T): small models and short
sequences, where a training step is bound by its host time. With --graph, each module's training step
(forward, loss, backward; the gradients left where the capture put them) is also captured into a CUDA
graph, as torch's docs say, its replay checked against the eager step's gradients and timed in turns:
what a training loop that captures its step pays, without the host's share.

    python3 benchmarks/dropin_vs_torch.py --hidden 128 --input 128 --seq 20 --batch 32 --cases 0,1 \
        --graph --out /tmp/dropin_small.json

With --fresh-lengths N, each call of a case with lengths takes the next of N PackedSequences of the same x,
each of lengths drawn anew (made before, in turn), as a loop over a dataset gives each batch lengths of its
own, where by default every call is given the same one: a drop-in's memory then comes back at the same
addresses call after call, which its kept calls' captured runs want (nn.quick_call), and batches of other
lengths may not give it that. The check is of the first.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from functools import partial
from itertools import cycle
from pathlib import Path

import torch
from torch.nn.utils.rnn import pack_padded_sequence

from cellfuse.nn import GRU, LSTM

CASES = [  # kind, T, B, layers, bidirectional, lengths ("" = padded, all T long)
    ("lstm", 100, 64, 1, False, ""),
    ("lstm", 100, 64, 1, False, "uniform:10-100"),
    ("lstm", 100, 64, 1, True, ""),
    ("lstm", 100, 64, 2, True, ""),
    ("lstm", 100, 64, 2, True, "uniform:10-100"),
    ("gru", 100, 64, 1, False, "uniform:10-100"),
    ("lstm", 100, 8, 1, False, "uniform:10-100"),
    ("lstm", 1000, 8, 1, False, "uniform:100-1000"),
    ("lstm", 100, 64, 1, True, "uniform:10-100"),  # (last: the cases before keep their numbers)
]


def lengths_of(spec: str, T: int, B: int, generator: torch.Generator) -> torch.Tensor | None:
    if not spec:
        return None
    low, high = (int(v) for v in spec.split(":")[1].split("-"))
    return torch.randint(low, min(high, T) + 1, (B,), generator=generator)


def timed(fn, start, end) -> float:
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--input", type=int, default=512)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--schedule", default="auto")
    p.add_argument("--cases", type=lambda t: [int(i) for i in t.split(",")],
                   help="comma-separated indices into CASES (default: all)")
    p.add_argument("--optimizer", choices=["none", "sgd"], default="none",
                   help="end each training step with an optimizer's step (lr 1e-6)")
    p.add_argument("--seq", type=int, help="every case's T (its lengths drawn up to it)")
    p.add_argument("--batch", type=int, help="every case's B")
    p.add_argument("--graph", action="store_true",
                   help="also time each module's training step captured into a CUDA graph and replayed")
    p.add_argument("--fresh-lengths", type=int, default=1, metavar="N",
                   help="calls of a case with lengths take N PackedSequences in turn, each of its own "
                        "lengths (default: 1, the same one every call)")
    args = p.parse_args()
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device("cuda")
    record = {"script": "benchmarks/dropin_vs_torch.py", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "gpu": torch.cuda.get_device_name(device), "torch": torch.__version__,
              "python": platform.python_version(), "settings": vars(args) | {
                  "out": str(args.out)}, "rows": []}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    generator = torch.Generator().manual_seed(0)
    for kind, T, B, layers, bidirectional, spec in (CASES if args.cases is None else
                                                    [CASES[i] for i in args.cases]):
        T, B = args.seq or T, args.batch or B
        row = {"kind": kind, "seq": T, "batch": B, "layers": layers, "bidirectional": bidirectional,
               "lengths": spec or "padded"}
        print(row, flush=True)
        torch.manual_seed(0)
        ours_cls, torch_cls = (LSTM, torch.nn.LSTM) if kind == "lstm" else (GRU, torch.nn.GRU)
        ours = ours_cls(args.input, args.hidden, layers, bidirectional=bidirectional,
                        schedule=args.schedule).to(device)
        ref = torch_cls(args.input, args.hidden, layers, bidirectional=bidirectional).to(device)
        ref.load_state_dict(ours.state_dict())
        optimizers = {module: torch.optim.SGD(module.parameters(), lr=1e-6)
                      for module in (ours, ref) if args.optimizer == "sgd"}
        x = torch.randn(T, B, args.input, device=device)
        lengths = lengths_of(spec, T, B, generator)

        # packed before, outside the clock: the modules' calls are timed, not torch's packing
        inputs = x if lengths is None else pack_padded_sequence(x, lengths, enforce_sorted=False)
        if lengths is not None and args.fresh_lengths > 1:
            row["fresh_lengths"] = args.fresh_lengths
            given = cycle([inputs] + [pack_padded_sequence(x, lengths_of(spec, T, B, generator),
                                                           enforce_sorted=False)
                                      for _ in range(args.fresh_lengths - 1)])
        else:
            given = cycle([inputs])

        def data(out, packed=lengths is not None):
            return out[0].data if packed else out[0]

        # the check
        got, want = ours(inputs), ref(inputs)
        row["max_abs_diff"] = float((data(got) - data(want)).abs().max())
        grads = []
        for module, out in ((ours, got), (ref, want)):
            grads.append(torch.autograd.grad(data(out).square().sum(), list(module.parameters())))
        row["grad_rel_error"] = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
                                    for a, b in zip(*grads, strict=True))
        row["ok"] = row["max_abs_diff"] <= 1e-4 and row["grad_rel_error"] <= 1e-3
        # (their autograd graphs hold the parameters' AccumulateGrad nodes on this stream: alive, they
        # would break a capture on another)
        del got, want, out
        if not row["ok"]:
            print("  check failed:", row, flush=True)
            record["rows"].append(row)
            continue

        def forward(module, given=given):
            with torch.no_grad():
                module(next(given))

        def step(module, inputs=None, given=given, optimizers=optimizers):
            data(module(next(given) if inputs is None else inputs)).square().sum().backward()
            if module in optimizers:
                optimizers[module].step()

        for what, fn in (("forward", forward), ("train", step)):
            times = {"cellfuse": [], "torch": []}
            after_other = {"cellfuse": [], "torch": []}
            modules = {"cellfuse": ours, "torch": ref}
            for module in modules.values():
                for _ in range(args.warmup):
                    fn(module)
                    module.zero_grad(set_to_none=True)
            for _ in range(args.repeats):
                for name, module in modules.items():
                    for into in (after_other, times):  # right after the other's call, then after its own
                        torch.cuda.synchronize()
                        into[name].append(timed(lambda module=module, fn=fn: fn(module), start, end))
                        module.zero_grad(set_to_none=True)
            row[what] = {name: statistics.median(v) for name, v in times.items()}
            row[f"{what}_rung"] = ours.schedules_run[-1]  # (`auto` resolved: a training call's apart)
            row[f"{what}_after_other"] = {name: statistics.median(v) for name, v in after_other.items()}
        if args.graph:
            # (torch's first, so that a failed capture of the drop-in's cannot take it along)
            # (of the checked input: a capture replays the one it was given)
            row["train_graph"] = graph_steps({"torch": ref, "cellfuse": ours}, partial(step, inputs=inputs),
                                             grads[::-1], args, start, end)
        print("  ", {k: row[k] for k in ("forward", "train", "train_graph") if k in row}, flush=True)
        record["rows"].append(row)
        args.out.write_text(json.dumps(record, indent=1))
    graphs = args.graph
    lines = ["| cell | T | B | layers | directions | lengths | forward: cellfuse | cuDNN | speedup | "
             "training: cellfuse | cuDNN | speedup |"
             + (" captured step: cellfuse | cuDNN | speedup |" if graphs else "") + " rungs | check |",
             "|---" * (17 if graphs else 14) + "|"]
    for r in record["rows"]:
        if not r["ok"]:
            lines.append(f"| {r['kind']} | {r['seq']} | {r['batch']} | {r['layers']} | "
                         f"{2 if r['bidirectional'] else 1} | {r['lengths']} | | | | | | |"
                         + (" | | |" if graphs else "") + " | FAILED |")
            continue
        f, t = r["forward"], r["train"]
        lines.append(f"| {r['kind']} | {r['seq']} | {r['batch']} | {r['layers']} | "
                     f"{2 if r['bidirectional'] else 1} | {r['lengths']} | {f['cellfuse']:.3f} | "
                     f"{f['torch']:.3f} | {f['torch'] / f['cellfuse']:.2f}x | {t['cellfuse']:.3f} | "
                     f"{t['torch']:.3f} | {t['torch'] / t['cellfuse']:.2f}x | "
                     + (_graph_cells(r["train_graph"]) if graphs else "")
                     + f"{r['forward_rung']} / {r['train_rung']} | ok ({r['max_abs_diff']:.1e}) |")
    record["table"] = "\n".join(lines)
    args.out.write_text(json.dumps(record, indent=1))
    print(record["table"])


def graph_steps(modules: dict, step, eager_grads, args, start, end) -> dict:
    """Each module's training step captured into a CUDA graph (warm-up steps on a side stream, then the
    capture, the gradients None before it), one replay's gradients checked against the eager step's
    (`eager_grads`, in the order of `modules`), then the replays timed in turns: medians in ms, or the
    error that stopped a module's capture or check."""
    graphs, out = {}, {}
    for (name, module), want in zip(modules.items(), eager_grads, strict=True):
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(max(1, args.warmup)):
                    module.zero_grad(set_to_none=True)
                    step(module)
            torch.cuda.current_stream().wait_stream(side)
            module.zero_grad(set_to_none=True)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step(module)
            graph.replay()
            torch.cuda.synchronize()
            error = max(float((p.grad - w).abs().max() / w.abs().max().clamp_min(1e-30))
                        for p, w in zip(module.parameters(), want, strict=True))
        except Exception as e:  # (recorded: the other module's capture is still timed)
            out[name] = {"error": f"{type(e).__name__}: {e}"}
            torch.cuda.synchronize()
            continue
        if error > 1e-3:
            out[name] = {"error": f"a replay's gradients are {error:.1e} from the eager step's"}
            continue
        graphs[name] = graph
        out[name] = {"grad_rel_error": error, "times": []}
    for _ in range(args.repeats):
        for name, graph in graphs.items():
            torch.cuda.synchronize()
            out[name]["times"].append(timed(graph.replay, start, end))
    for name in graphs:
        out[name]["ms"] = statistics.median(out[name].pop("times"))
    return out


def _graph_cells(g: dict) -> str:
    ours, theirs = (g[name].get("ms") for name in ("cellfuse", "torch"))
    cells = [f"{v:.3f}" if v is not None else "failed" for v in (ours, theirs)]
    speedup = f"{theirs / ours:.2f}x" if ours and theirs else ""
    return f"{cells[0]} | {cells[1]} | {speedup} | "


if __name__ == "__main__":
    main()
