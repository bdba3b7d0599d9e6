"""What a researcher could otherwise use, in PyTorch, on the same cell, weights and inputs:
the cell interpreted op by op ("PyTorch eager"), the same captured into a CUDA graph, the whole forward
pass (every step of every layer) under torch.compile, with CUDA graphs (mode "reduce-overhead", its
best) and in its default mode, and cuDNN (torch.nn.LSTM / torch.nn.GRU) when the cell is one cuDNN
implements."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..graph_model import Cell, OpSpec, load_template, param_key, require_valid
from ..graph_model.reference import step as reference_step


def torch_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def make_step(cell: Cell) -> Callable:
    """step(x_t, states: tuple, weights: dict) -> (output, new states tuple), one torch op per node: the
    reference interpreter's step, with each op's PyTorch meaning from the op table."""
    import torch

    info = require_valid(cell)
    state_ids = list(cell.updates)

    def meaning(spec: OpSpec) -> Callable:
        return getattr(torch, spec.torch)

    def step(x_t, states, weights):
        values = reference_step(cell, info.order, weights, x_t, dict(zip(state_ids, states, strict=True)),
                                meaning, float)
        return values[cell.output], tuple(values[cell.updates[s]] for s in state_ids)

    return step


# torch.compile's modes that the benchmark runs, by baseline name
COMPILE_MODES = {"torch.compile": "reduce-overhead", "torch.compile default": "default"}


class TorchCell:
    """The cell in PyTorch on the GPU, run over the whole sequence and all layers; with `compile_mode`,
    that whole forward pass compiled by torch.compile in that mode."""

    def __init__(self, cell: Cell, params: dict[str, np.ndarray], layers: int,
                 compile_mode: str | None = None):
        import torch

        self.torch = torch
        self.cell, self.layers = cell, layers
        dev = torch.device("cuda")
        self.weights = [{w.id: torch.from_numpy(params[param_key(layer, w.id)]).to(dev)
                         for w in cell.of_op("weight")} for layer in range(layers)]
        self.step = make_step(cell)
        self.forward = torch.compile(self._forward, mode=compile_mode, dynamic=False) if compile_mode \
            else self._forward

    def _forward(self, x, initial: list):
        seq = x
        for layer in range(self.layers):
            states = tuple(s[layer] for s in initial)
            ys = []
            for t in range(seq.shape[0]):
                out, states = self.step(seq[t], states, self.weights[layer])
                ys.append(out)
            seq = self.torch.stack(ys)
        return seq

    def __call__(self, x, initial: list):
        """x: [T, B, input] tensor; initial: per state [L, B, H] tensors. Returns y [T, B, H]."""
        with self.torch.no_grad():
            return self.forward(x, initial)


class GraphedCell:
    """A model's whole forward pass on fixed tensors, captured once into a CUDA graph and replayed: what
    eager PyTorch gives once its launch overhead is gone."""

    def __init__(self, model: TorchCell, x, initial: list, warmup: int = 3):
        import torch

        self.x, self.initial = x, initial
        side = torch.cuda.Stream()  # torch.cuda.graph wants warm-up runs on a side stream
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                model(x, initial)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.y = model(x, initial)

    def __call__(self, x, initial: list):
        """Replays the graph; x and initial must be the tensors it was captured on."""
        if x is not self.x or initial is not self.initial:
            raise ValueError("a captured forward pass replays on the tensors it was captured on")
        self.graph.replay()
        return self.y


def cudnn_kind(cell: Cell) -> str | None:
    """"lstm" or "gru" when the cell computes what torch.nn.LSTM / torch.nn.GRU compute."""
    for kind in ("lstm", "gru"):
        if cell.structure_hash() == load_template(kind).structure_hash():
            return kind
    return None


class CudnnCell:
    """torch.nn.LSTM or torch.nn.GRU (cuDNN) loaded with the cell's weights."""

    _GATES = {"lstm": [("W_i", "U_i", "b_i"), ("W_f", "U_f", "b_f"), ("W_g", "U_g", "b_g"),
                       ("W_o", "U_o", "b_o")],
              "gru": [("W_ir", "W_hr", "b_ir", "b_hr"), ("W_iz", "W_hz", "b_iz", "b_hz"),
                      ("W_in", "W_hn", "b_in", "b_hn")]}

    def __init__(self, kind: str, params: dict[str, np.ndarray], layers: int, input_size: int, hidden: int):
        import torch

        self.torch, self.kind = torch, kind
        cls = torch.nn.LSTM if kind == "lstm" else torch.nn.GRU
        self.module = cls(input_size, hidden, num_layers=layers).cuda().eval()
        with torch.no_grad():
            for layer in range(layers):
                def p(name: str, layer: int = layer) -> np.ndarray:
                    return params[param_key(layer, name)]

                gates = self._GATES[kind]
                w_ih = np.concatenate([p(g[0]).T for g in gates])
                w_hh = np.concatenate([p(g[1]).T for g in gates])
                if kind == "lstm":  # one bias per gate here; cuDNN adds b_ih + b_hh
                    b_ih = np.concatenate([p(g[2]) for g in gates])
                    b_hh = np.zeros_like(b_ih)
                else:
                    b_ih = np.concatenate([p(g[2]) for g in gates])
                    b_hh = np.concatenate([p(g[3]) for g in gates])
                for name, value in (("weight_ih", w_ih), ("weight_hh", w_hh), ("bias_ih", b_ih),
                                    ("bias_hh", b_hh)):
                    getattr(self.module, f"{name}_l{layer}").copy_(torch.from_numpy(value))

    def __call__(self, x, initial: list):
        with self.torch.no_grad():
            if self.kind == "lstm":  # the cell's states are (h, c), as torch.nn.LSTM's
                y, _ = self.module(x, (initial[0], initial[1]))
            else:
                y, _ = self.module(x, initial[0])
        return y
