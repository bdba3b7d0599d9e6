"""A 2-layer LSTM language model trained on random tokens twice side by side, from the same initial
weights: once with CellFuse's CellRNN (the `lstm` template) and once with torch.nn.LSTM (cuDNN on a GPU).
Embedding, RNN, linear head, cross-entropy, AdamW, on a few fixed batches of random tokens taken in turn
(which the models learn by heart, so that the loss falls and the two curves have something to agree
on; fresh random tokens every step would leave both at log(vocab)). Prints both loss curves, their
relative difference after the last step, and the time per step of each; exit status 1 when that
difference is not below the goal.

    python benchmarks/train_lm.py --device cuda --json results/train_lm.json
    python benchmarks/train_lm.py --device cpu --seq 8 --batch 4 --embed 16 --hidden 16 --vocab 50 --steps 10
    python benchmarks/train_lm.py --device cuda --precision bf16 --json results/train_lm_bf16.json

With `--precision bf16` (or fp16) it trains in mixed precision as PyTorch users do: three runs from the
same initial weights, CellRNN in float32, then CellRNN and torch.nn.LSTM each under torch.autocast to
that type (fp16 with a GradScaler). The goal then is that the 16-bit CellRNN reaches the float32 run's
loss: its final loss at most MARGIN_16 above it, lower counting as reached (exit status 1 where not). Two
runs in 16 bits and in float32 do not keep to one curve: rounding changes each step a little, and on this
task the changes grow (torch.nn.LSTM's own 16-bit run, printed beside it for scale, ends several times
the margin away from the float32 run at the default sizes), so the goal asks that mixed precision costs no
training progress, not that the losses agree.

The two models step in turn (step i of one, then step i of the other), so that a slow drift of the
machine weighs on both alike. The LSTM weights are mapped as the benchmark's cuDNN baseline maps them
(torch_baselines.CudnnCell); the cell has one bias per gate where torch.nn.LSTM has two that it adds, so
torch's second bias stays at zero and out of the optimizer: two biases would each take an AdamW step of
their own, twice the step the cell's one bias takes.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

from cellfuse import __version__
from cellfuse.gpu_runtime.torch_baselines import CudnnCell
from cellfuse.nn import CellRNN

GOAL = 1e-3  # the largest relative difference of the two final losses that counts as the same curve
NAMES = ("CellRNN", "torch.nn.LSTM")
# A 16-bit run's final loss against the float32 run's, relative: what mixed precision may cost
MARGIN_16 = 2e-2
AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def names(precision: str) -> tuple[str, ...]:
    """The runs, in the order they step: CellRNN's (in float32), then the ones it is measured against."""
    if precision == "fp32":
        return NAMES
    return ("CellRNN", f"CellRNN {precision}", f"torch.nn.LSTM {precision}")


class LanguageModel(torch.nn.Module):
    """tokens [T, B] -> logits [T, B, vocab]; `rnn(x)` returns (y [T, B, hidden], final states)."""

    def __init__(self, embed: torch.nn.Embedding, rnn: torch.nn.Module, head: torch.nn.Linear):
        super().__init__()
        self.embed, self.rnn, self.head = embed, rnn, head

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        y, _ = self.rnn(self.embed(tokens))
        return self.head(y)


def make_models(args: argparse.Namespace, device: torch.device) -> list[LanguageModel]:
    """The CellRNN model and the torch.nn.LSTM model, with the same initial weights."""
    torch.manual_seed(args.seed)
    embed = torch.nn.Embedding(args.vocab, args.embed)
    head = torch.nn.Linear(args.hidden, args.vocab)
    rnn = CellRNN("lstm", args.embed, args.hidden, args.layers, schedule=args.schedule, seed=args.seed)
    params = {key: rnn.param(key).detach().numpy() for key in rnn.keys}
    lstm = CudnnCell("lstm", params, args.layers, args.embed, args.hidden, device="cpu", train=True).module
    for layer in range(args.layers):
        getattr(lstm, f"bias_hh_l{layer}").requires_grad_(False)  # stays zero: see the module's doc
    models = []
    for recurrent in (rnn, lstm):
        copies = [torch.nn.Embedding(args.vocab, args.embed), torch.nn.Linear(args.hidden, args.vocab)]
        for copy, original in zip(copies, (embed, head), strict=True):
            copy.load_state_dict(original.state_dict())
        models.append(LanguageModel(copies[0], recurrent, copies[1]).to(device))
    return models


class CastPerCall(torch.nn.Module):
    """torch.nn.LSTM on the CPU as torch.autocast runs it in 16 bits, its float32 parameters and x cast
    to `dtype` at each call, by torch's own 16-bit LSTM: under autocast on the CPU torch hands the LSTM to
    oneDNN's 16-bit RNN, which a CPU without AVX-512 BF16 does not have ("could not create a primitive
    descriptor for the LSTM forward propagation primitive"). The gradients flow back through the casts
    to the float32 parameters, as autocast's do."""

    def __init__(self, lstm: torch.nn.LSTM, dtype: torch.dtype):
        super().__init__()
        self.lstm, self.dtype = lstm, dtype

    def forward(self, x: torch.Tensor):
        params = {name: p.to(self.dtype) for name, p in self.lstm.named_parameters()}
        with torch.autocast("cpu", enabled=False):
            return torch.func.functional_call(self.lstm, params, (x.to(self.dtype),))


def runs(args: argparse.Namespace, device: torch.device) -> list[tuple[LanguageModel, torch.dtype | None]]:
    """Each run's model and the type it runs under torch.autocast in (None: float32), as `names` orders
    them, all from the same initial weights (on the CPU torch.nn.LSTM's 16-bit run casts per call:
    `CastPerCall`)."""
    cellfuse, reference = make_models(args, device)
    dtype = AUTOCAST[args.precision]
    if dtype is None:
        return [(cellfuse, None), (reference, None)]
    cellfuse16, reference16 = make_models(args, device)
    if device.type == "cpu":
        reference16.rnn = CastPerCall(reference16.rnn, dtype)
    return [(cellfuse, None), (cellfuse16, dtype), (reference16, dtype)]


class Trainer:
    def __init__(self, model: LanguageModel, lr: float, device: torch.device, autocast: torch.dtype | None):
        self.model, self.device, self.autocast = model, device, autocast
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
        # fp16's gradients may underflow: scaled up before the backward pass, as PyTorch's recipe has it
        self.scaler = torch.amp.GradScaler(device.type) if autocast == torch.float16 else None
        self.losses: list[float] = []
        self.ms: list[float] = []

    def step(self, tokens: torch.Tensor) -> None:
        """One training step on tokens [T + 1, B]: predict each token from those before it."""
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        sync()
        t0 = time.perf_counter()
        with torch.autocast(self.device.type, dtype=self.autocast, enabled=self.autocast is not None):
            logits = self.model(tokens[:-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     tokens[1:].reshape(-1))
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is None:
            loss.backward()
            self.optimizer.step()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        sync()
        self.ms.append((time.perf_counter() - t0) * 1e3)
        self.losses.append(loss.item())  # after the clock stops: reading it waits for the GPU

    def ms_per_step(self) -> float:
        """The median step after the first (which makes the plans, compiles and warms up)."""
        return statistics.median(self.ms[1:] or self.ms)


def device_description(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    return f"CPU ({platform.processor() or platform.machine()}; CellRNN on the numpy executor)"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batches", type=int, default=4, help="the fixed random batches, taken in turn")
    p.add_argument("--seq", type=int, default=100)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--embed", type=int, default=512, help="embedding size, the LSTM's input size")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--schedule", default="auto", help="CellRNN's schedule")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--every", type=int, default=10, help="print the losses every this many steps")
    p.add_argument("--precision", choices=sorted(AUTOCAST), default="fp32",
                   help="bf16 or fp16: train under torch.autocast to that type beside float32")
    p.add_argument("--json", type=Path, help="write the record here")
    args = p.parse_args(argv)
    for name in ("steps", "batches", "seq", "batch", "vocab", "embed", "hidden", "layers", "every"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.precision == "fp16" and args.device == "cpu":
        p.error("--precision fp16 needs --device cuda: torch.nn.LSTM runs no float16 on the CPU")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("train_lm: --device cuda, and torch sees no CUDA device", file=sys.stderr)
        return 2
    # Float32 against float32: torch would otherwise let cuDNN and cuBLAS round inputs to TF32.
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    trainers = [Trainer(model, args.lr, device, dtype) for model, dtype in runs(args, device)]
    labels = names(args.precision)
    generator = torch.Generator().manual_seed(args.seed + 1)
    shape = (args.batches, args.seq + 1, args.batch)
    corpus = torch.randint(args.vocab, shape, generator=generator).to(device)
    # fp32: CellRNN against torch.nn.LSTM; 16 bits: CellRNN's 16-bit run against its float32 run
    ours, theirs = (trainers[0], trainers[1]) if args.precision == "fp32" else (trainers[1], trainers[0])
    goal = GOAL if args.precision == "fp32" else MARGIN_16
    print(f"{'step':>5s} " + " ".join(f"{name:>20s}" for name in labels) + f" {'rel diff':>9s}")
    for i in range(args.steps):
        tokens = corpus[i % args.batches]
        for trainer in trainers:
            trainer.step(tokens)
        a, b = ours.losses[-1], theirs.losses[-1]
        if (i + 1) % args.every == 0 or i in (0, args.steps - 1):
            print(f"{i + 1:5d} " + " ".join(f"{t.losses[-1]:20.6f}" for t in trainers)
                  + f" {abs(a - b) / abs(b):9.2e}", flush=True)
    a, b = ours.losses[-1], theirs.losses[-1]
    change = (a - b) / abs(b)
    rel = abs(change)
    # float32: the curves agree; 16 bits: the float32 run's loss reached (at most the margin above it)
    met = rel < GOAL if args.precision == "fp32" else change < MARGIN_16
    ms = {name: t.ms_per_step() for name, t in zip(labels, trainers, strict=True)}
    for name, t in zip(labels, trainers, strict=True):
        print(f"{name:20s} loss {t.losses[0]:.4f} at the first step, {t.losses[-1]:.4f} at the last")
    between = (f"{labels[0]} and {labels[1]}" if args.precision == "fp32"
               else f"{labels[1]} and {labels[0]} (float32)")
    goal_text = (f"below {goal:g}" if args.precision == "fp32"
                 else f"{labels[1]}'s loss at most {goal:g} above float32's, or below it")
    ours_label = labels[0] if args.precision == "fp32" else labels[1]
    print(f"relative difference of the losses of {between} after {args.steps} steps: {rel:.2e}, "
          f"{ours_label}'s {'lower' if a < b else 'higher'} "
          f"(goal: {goal_text}: {'met' if met else 'NOT met'})")
    scale = None
    if args.precision != "fp32":
        scale = abs(trainers[2].losses[-1] - b) / abs(b)
        print(f"for scale, {labels[2]} against {labels[0]} (float32): {scale:.2e}")
    for name, value in ms.items():
        print(f"{name:20s} {value:9.3f} ms per step (median after the first step)")
    ran = trainers[0].model.rnn.schedules_run
    print(f"CellRNN ran the {', '.join(ran)} schedule (asked for {args.schedule})")
    if args.json:
        command = ["python", "benchmarks/train_lm.py", *(sys.argv[1:] if argv is None else argv)]
        record = {
            "device": device_description(device),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "command": shlex.join(command),
            "versions": {"cellfuse": __version__, "torch": torch.__version__,
                         "python": platform.python_version()},
            "sizes": {k: getattr(args, k) for k in ("seq", "batch", "vocab", "embed", "hidden", "layers")},
            "steps": args.steps, "batches": args.batches, "lr": args.lr, "schedule": args.schedule,
            "schedules_run": ran, "seed": args.seed, "precision": args.precision,
            "losses": {name: t.losses for name, t in zip(labels, trainers, strict=True)},
            "final_rel_diff": rel, "final_rel_change": change, "goal": goal, "goal_met": met,
            "ms_per_step": ms,
            "step_ms": {name: t.ms for name, t in zip(labels, trainers, strict=True)},
            **({} if scale is None else {"reference_rel_diff": scale}),
        }
        args.json.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
