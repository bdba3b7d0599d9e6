"""A small sequence classifier trained with torch.nn.LSTM and with cellfuse.nn.LSTM in its place (one line
changed), from the same state dict on the same batches: the loss curves side by side, and the time of
a training step. A third run, torch.nn.LSTM with cuDNN turned off (torch's own kernels), is the control:
how far two right float32 runs drift apart over the same steps. The model is what such scripts hold: an
LSTM of 2 layers, both directions, batch_first=True, fed PackedSequences of sequences of their own
lengths, its last layer's final states into a linear layer, cross-entropy, Adam.

    python3 benchmarks/dropin_classifier.py --out benchmarks/results/h200_DATE_dropin_classifier.json

The task: sequences of random vectors, each of a length drawn uniformly from --min-length to --seq, whose
class is which quarter the mean of its first feature over its own steps falls in (learnable, and only
from the steps within the length). Float32 with TF32 off on both sides on a GPU; --device cpu --dtype
float64 runs it on the CPU (tests/nn/test_dropin_classifier.py). Times: CUDA events around a whole step
(forward, loss, backward, optimizer step), the median of the steps after the first --warmup, each
model's steps run in turn with the other's.
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

import cellfuse.nn

CLASSES = 4
CONTROL = "torch.nn.LSTM without cuDNN"


class Classifier(torch.nn.Module):
    def __init__(self, lstm: type, features: int, hidden: int, layers: int):
        super().__init__()
        self.rnn = lstm(features, hidden, num_layers=layers, batch_first=True, bidirectional=True)
        self.head = torch.nn.Linear(2 * hidden, CLASSES)

    def forward(self, packed):
        _, (h_n, _) = self.rnn(packed)
        return self.head(torch.cat([h_n[-2], h_n[-1]], dim=1))  # the last layer's two directions


def batches(steps: int, batch: int, seq: int, min_length: int, features: int, seed: int, device, dtype):
    """`steps` batches of (PackedSequence, labels), drawn once, the same for both models."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        lengths = torch.randint(min_length, seq + 1, (batch,), generator=g)
        x = torch.randn(batch, seq, features, generator=g, dtype=torch.float64)
        steps_in = torch.arange(seq).view(1, seq) < lengths.view(batch, 1)
        mean = (x[:, :, 0] * steps_in).sum(1) / lengths
        labels = torch.bucketize(mean, torch.tensor([-0.15, 0.0, 0.15], dtype=torch.float64))
        packed = pack_padded_sequence(x.to(device, dtype), lengths, batch_first=True, enforce_sorted=False)
        out.append((packed, labels.to(device)))
    return out


def train(model: torch.nn.Module, data, lr: float, warmup: int) -> tuple[list[float], list[float]]:
    """The loss at each step and the ms of each step after the warm-up (CUDA events on a GPU)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    cuda = next(model.parameters()).is_cuda
    losses, times = [], []
    for i, (packed, labels) in enumerate(data):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
        t = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(packed), labels)
        loss.backward()
        optimizer.step()
        if cuda:
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            ms = (time.perf_counter() - t) * 1e3
        losses.append(loss.item())
        if i >= warmup:
            times.append(ms)
    return losses, times


def compare(args: argparse.Namespace) -> dict:
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if device.type == "cuda":
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    data = batches(args.steps, args.batch, args.seq, args.min_length, args.features, args.seed, device, dtype)
    torch.manual_seed(args.seed)
    reference = Classifier(torch.nn.LSTM, args.features, args.hidden, args.layers).to(device, dtype)
    control = Classifier(torch.nn.LSTM, args.features, args.hidden, args.layers).to(device, dtype)
    ours = Classifier(cellfuse.nn.LSTM, args.features, args.hidden, args.layers).to(device, dtype)
    control.load_state_dict(reference.state_dict())
    ours.load_state_dict(reference.state_dict())
    curves = {"torch.nn.LSTM": train(reference, data, args.lr, args.warmup)}
    # torch's own LSTM without cuDNN: how far two right float32 runs drift apart over the same steps
    with torch.backends.cudnn.flags(enabled=False):
        curves[CONTROL] = train(control, data, args.lr, args.warmup)
    curves["cellfuse.nn.LSTM"] = train(ours, data, args.lr, args.warmup)
    want = curves["torch.nn.LSTM"][0]

    def largest_difference(name: str) -> float:
        return max(abs(a - b) for a, b in zip(curves[name][0], want, strict=True))

    return {
        "losses": {name: c[0] for name, c in curves.items()},
        "max_abs_loss_diff": largest_difference("cellfuse.nn.LSTM"),
        "max_abs_loss_diff_of_the_control": largest_difference(CONTROL),
        "final_losses": {name: c[0][-1] for name, c in curves.items()},
        "step_ms": {name: statistics.median(c[1]) for name, c in curves.items() if c[1]},
        "ms_of_each_step": {name: c[1] for name, c in curves.items()},
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=100)
    p.add_argument("--min-length", type=int, default=10)
    p.add_argument("--features", type=int, default=128)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    result = compare(args)
    record = {"script": "benchmarks/dropin_classifier.py", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "gpu": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else None,
              "torch": torch.__version__, "python": platform.python_version(),
              "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}} | result
    steps = result["step_ms"]
    print(f"losses over {args.steps} steps, largest difference from torch.nn.LSTM's: cellfuse.nn.LSTM "
          f"{result['max_abs_loss_diff']:.2e}, {CONTROL} {result['max_abs_loss_diff_of_the_control']:.2e}; "
          "final " + ", ".join(f"{k} {v:.4f}" for k, v in result["final_losses"].items()))
    if steps:
        print("step: " + ", ".join(f"{k} {v:.3f} ms" for k, v in steps.items()))
    if args.out:
        args.out.write_text(json.dumps(record, indent=1))
    return record


if __name__ == "__main__":
    main()
