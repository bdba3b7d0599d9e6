"""Running a stack of layers through the ops: in one fused call, or a layer and a direction at a time
(two directions: the reverse one on the sequence reversed in time; dropout between layers while
training, torch's, from torch's generator, as torch.nn.LSTM's). CellRNN and the drop-ins for
torch.nn.LSTM and GRU share it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from . import ops


def run(x: torch.Tensor, states: Sequence[torch.Tensor], params: Sequence[torch.Tensor], cell: str,
        hidden: int, layers: int, schedule: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """y and the final states of `layers` layers of the cell in one call of the ops."""
    # the steps are saved only where a backward pass may follow
    save = torch.is_grad_enabled() and any(t.requires_grad for t in (x, *states, *params))
    out = ops.run(x, list(states), list(params), cell, hidden, layers, schedule, save)
    return out[0], list(out[1:1 + len(states)])


def layer_by_layer(x: torch.Tensor, initial: Sequence[torch.Tensor],
                   params_of: Callable[[int, bool], list[torch.Tensor]], layers: int, bidirectional: bool,
                   dropout: float, training: bool, cell: str, hidden: int, schedule: str
                   ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """y and the final states of the stack, each layer and direction a call of its own (`params_of(layer,
    reverse)` gives a one-layer call's parameters); both directions' outputs side by side, the final
    states in torch's order (layer by layer, forward before reverse), `initial` in the same order."""
    directions = (False, True) if bidirectional else (False,)
    finals: list[list[torch.Tensor]] = [[] for _ in initial]
    for layer in range(layers):
        outputs = []
        for d, reverse in enumerate(directions):
            index = layer * len(directions) + d
            y, last = run(x.flip(0) if reverse else x, [s[index:index + 1] for s in initial],
                          params_of(layer, reverse), cell, hidden, 1, schedule)
            outputs.append(y.flip(0) if reverse else y)
            for i, value in enumerate(last):
                finals[i].append(value)
        x = torch.cat(outputs, dim=2) if len(outputs) > 1 else outputs[0]
        if dropout and training and layer < layers - 1:
            x = torch.nn.functional.dropout(x, dropout, training=True)
    return x, [torch.cat(f) for f in finals]
