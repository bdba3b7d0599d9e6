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
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
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

        # packed once, outside the clock: the modules' calls are timed, not torch's packing
        inputs = x if lengths is None else pack_padded_sequence(x, lengths, enforce_sorted=False)

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
        if not row["ok"]:
            print("  check failed:", row, flush=True)
            record["rows"].append(row)
            continue

        def forward(module, inputs=inputs):
            with torch.no_grad():
                module(inputs)

        def step(module, inputs=inputs, optimizers=optimizers):
            data(module(inputs)).square().sum().backward()
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
            row[f"{what}_after_other"] = {name: statistics.median(v) for name, v in after_other.items()}
        print("  ", {k: row[k] for k in ("forward", "train")}, flush=True)
        record["rows"].append(row)
        args.out.write_text(json.dumps(record, indent=1))
    lines = ["| cell | T | B | layers | directions | lengths | forward: cellfuse | cuDNN | speedup | "
             "training: cellfuse | cuDNN | speedup | check |", "|---" * 13 + "|"]
    for r in record["rows"]:
        if not r["ok"]:
            lines.append(f"| {r['kind']} | {r['seq']} | {r['batch']} | {r['layers']} | "
                         f"{2 if r['bidirectional'] else 1} | {r['lengths']} | | | | | | | FAILED |")
            continue
        f, t = r["forward"], r["train"]
        lines.append(f"| {r['kind']} | {r['seq']} | {r['batch']} | {r['layers']} | "
                     f"{2 if r['bidirectional'] else 1} | {r['lengths']} | {f['cellfuse']:.3f} | "
                     f"{f['torch']:.3f} | {f['torch'] / f['cellfuse']:.2f}x | {t['cellfuse']:.3f} | "
                     f"{t['torch']:.3f} | {t['torch'] / t['cellfuse']:.2f}x | ok ({r['max_abs_diff']:.1e}) |")
    record["table"] = "\n".join(lines)
    args.out.write_text(json.dumps(record, indent=1))
    print(record["table"])


if __name__ == "__main__":
    main()
