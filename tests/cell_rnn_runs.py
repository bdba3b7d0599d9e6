"""A gradient run (gradient_runs.Run) through CellRNN and through the cell written in eager PyTorch: the
outputs and the gradients of sum(dy * y) + sum(dfinal * final), as graph_model.Gradients in float64, so
that they compare with the reference's by gradient_runs.assert_gradients."""

from __future__ import annotations

import numpy as np
import torch
from gradient_runs import Run

from cellfuse.gpu_runtime.torch_baselines import make_step
from cellfuse.graph_model import Gradients, param_key
from cellfuse.nn import CellRNN


def module_for(run: Run, schedule: str = "auto", dtype: torch.dtype = torch.float64,
               device: str = "cpu") -> CellRNN:
    """A CellRNN of the run's cell, sizes and parameters."""
    s = run.sizes
    rnn = CellRNN(run.cell, s.input, s.hidden, s.layers, schedule=schedule).to(device=device, dtype=dtype)
    rnn.load_params(run.params)  # after the move, so that float64 parameters keep every digit
    return rnn


def _tensors(run: Run, dtype: torch.dtype, device: str
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor] | None]:
    def leaf(a: np.ndarray) -> torch.Tensor:
        return torch.tensor(a, dtype=dtype, device=device, requires_grad=True)

    return leaf(run.x), None if run.initial is None else {s: leaf(v) for s, v in run.initial.items()}


def _gradients(run: Run, y, final, x, states, params: dict[str, torch.Tensor]
               ) -> tuple[np.ndarray, dict[str, np.ndarray], Gradients]:
    """y, the final states, and the gradients of the run's seeds' loss, as float64 arrays."""
    dtype, device = y.dtype, y.device
    loss = (y * torch.tensor(run.dy, dtype=dtype, device=device)).sum()
    for s, seed in (run.dfinal or {}).items():
        loss = loss + (final[s] * torch.tensor(seed, dtype=dtype, device=device)).sum()
    states = states or {}
    grads = torch.autograd.grad(loss, [x, *states.values(), *params.values()])

    def arr(t: torch.Tensor) -> np.ndarray:
        return t.detach().cpu().double().numpy()

    dx, rest = grads[0], grads[1:]
    dinitial = {s: arr(g) for s, g in zip(states, rest[:len(states)], strict=True)}
    dparams = {key: arr(g) for key, g in zip(params, rest[len(states):], strict=True)}
    return arr(y), {s: arr(v) for s, v in final.items()}, Gradients(arr(dx), dinitial, dparams)


def module_run(rnn: CellRNN, run: Run) -> tuple[np.ndarray, dict[str, np.ndarray], Gradients]:
    """y, the final states and the gradients through the module (of x, of the initial states given, and
    of every parameter)."""
    p = next(rnn.parameters())
    x, states = _tensors(run, p.dtype, str(p.device))
    y, final = rnn(x, states)
    return _gradients(run, y, final, x, states, {key: rnn.param(key) for key in rnn.keys})


def eager_run(run: Run) -> tuple[np.ndarray, dict[str, np.ndarray], Gradients]:
    """The same through the cell written in eager PyTorch, one op per node (the benchmark's baseline),
    in float64 on the CPU, differentiated by torch.autograd."""
    cell, s = run.cell, run.sizes
    params = {key: torch.tensor(v, dtype=torch.float64, requires_grad=True) for key, v in run.params.items()}
    x, initial = _tensors(run, torch.float64, "cpu")
    start = initial or {st: torch.zeros(s.layers, s.batch, s.hidden, dtype=torch.float64)
                        for st in cell.updates}
    step = make_step(cell)
    seq, final = x, {st: [] for st in cell.updates}
    for layer in range(s.layers):
        weights = {w.id: params[param_key(layer, w.id)] for w in cell.of_op("weight")}
        states = tuple(start[st][layer] for st in cell.updates)
        ys = []
        for t in range(s.seq):
            out, states = step(seq[t], states, weights)
            ys.append(out)
        seq = torch.stack(ys)
        for st, v in zip(cell.updates, states, strict=True):
            final[st].append(v)
    finals = {st: torch.stack(v) for st, v in final.items()}
    return _gradients(run, seq, finals, x, initial, params)


def given_states(run: Run, grads: Gradients) -> Gradients:
    """The gradients of the initial states the run gives only (a module asked for none has none)."""
    return Gradients(grads.dx, grads.dinitial if run.initial is not None else {}, grads.dparams)
