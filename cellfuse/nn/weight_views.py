"""A call's weights that are views of a module's parameters (torch.nn.LSTM's `weight_ih_l0`, whose rows are
the cell's `W_i`, `W_f`, ...): the ops give autograd the parameters themselves, and each parameter's
gradient made from its views' in one op, where autograd would otherwise run the backward of every view (a
transpose and a slice: a fill and a copy each on a GPU) and add them up, two dozen small kernels and
their host time at the end of every training step of a drop-in LSTM.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

Gradients = Callable[[Sequence[torch.Tensor], Sequence[bool]], list[torch.Tensor | None]]


class WeightViews(list):
    """The weights of a call (a list, in the cell's order of keys: what the kernels read) that are views
    of `sources`; `gradients(grads, needed)` gives the sources' gradients from the weights' (None for a
    source whose `needed` is False)."""

    def __init__(self, views: Sequence[torch.Tensor], sources: Sequence[torch.Tensor], gradients: Gradients):
        super().__init__(views)
        self.sources = tuple(sources)
        self.gradients = gradients


def joined(parts: Sequence[WeightViews]) -> WeightViews:
    """Several calls' weights as one call's (the layers of a fused stack, one after another)."""
    if len(parts) == 1:
        return parts[0]
    sizes = [(len(part), len(part.sources)) for part in parts]

    def gradients(grads, needed):
        out, at, source_at = [], 0, 0
        for part, (n, m) in zip(parts, sizes, strict=True):
            out += part.gradients(grads[at:at + n], needed[source_at:source_at + m])
            at, source_at = at + n, source_at + m
        return out

    return WeightViews([v for part in parts for v in part], [s for part in parts for s in part.sources],
                       gradients)
