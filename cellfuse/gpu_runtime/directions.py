"""The directions a benchmark runs a layer in: forward alone, or forward and reverse side by side, each
direction a run of the same plan with weights of its own (`bench --bidirectional`).

The reverse direction runs the cell over x reversed in time, each batch row within its own length where
the rows have lengths (the steps past a row's length stay in place); its outputs are reversed back, so
that y holds both directions' outputs side by side, [T, B, 2 * hidden], as a bidirectional
torch.nn.LSTM's; its final states follow the forward direction's ([2, B, hidden]: forward, reverse). Its
parameters are the `l0.reverse.*` keys of graph_model.params. Gradients go the same ways back: dx is the
forward direction's dx plus the reverse one's reversed, each direction's seed its half of dy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph_model import CellError, Forward, Gradients
from ..graph_model.params import REVERSE


@dataclass(frozen=True)
class Directions:
    count: int  # 1 or 2
    hidden: int
    lengths: np.ndarray | None = None  # each batch row's, where the rows have lengths of their own

    def __post_init__(self):
        if self.count not in (1, 2):
            raise CellError(f"a layer runs in 1 or 2 directions, not {self.count}")

    def reversed(self, a: np.ndarray) -> np.ndarray:
        """a [T, B, ...] reversed in time, each row within its own length."""
        if self.lengths is None:
            return a[::-1].copy()
        T, B = a.shape[0], a.shape[1]
        steps = np.arange(T)[:, None]
        ends = np.asarray(self.lengths)[None, :]
        index = np.where(steps < ends, ends - 1 - steps, steps)
        return a[index, np.arange(B)[None, :]]

    def params(self, params: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        """Each direction's parameters, under the keys of one direction (l0.W, ...)."""
        forward = {k: v for k, v in params.items() if f".{REVERSE}." not in k}
        if self.count == 1:
            return [forward]
        reverse = {k.replace(f".{REVERSE}.", "."): v for k, v in params.items() if f".{REVERSE}." in k}
        return [forward, reverse]

    def inputs(self, x: np.ndarray, initial: dict[str, np.ndarray]
               ) -> list[tuple[np.ndarray, dict[str, np.ndarray]]]:
        """Each direction's x and initial states (the states given [directions, B, hidden])."""
        if self.count == 1:
            return [(x, initial)]
        return [(x, {s: v[0:1] for s, v in initial.items()}),
                (self.reversed(x), {s: v[1:2] for s, v in initial.items()})]

    def seeds(self, dy: np.ndarray) -> list[np.ndarray]:
        """Each direction's seed of its y's gradient, from dy [T, B, directions * hidden]."""
        if self.count == 1:
            return [dy]
        H = self.hidden
        return [np.ascontiguousarray(dy[..., :H]), self.reversed(dy[..., H:])]

    def forward(self, results: list[Forward]) -> Forward:
        """The directions' results as one layer's."""
        if self.count == 1:
            return results[0]
        f, r = results
        return Forward(np.concatenate([f.y, self.reversed(r.y)], axis=-1),
                       {s: np.concatenate([v, r.final[s]]) for s, v in f.final.items()})

    def gradients(self, grads: list[Gradients]) -> Gradients:
        """The directions' gradients as one layer's: dx summed, the reverse direction's keys its own."""
        if self.count == 1:
            return grads[0]
        f, r = grads
        return Gradients(f.dx + self.reversed(r.dx),
                         {s: np.concatenate([v, r.dinitial[s]]) for s, v in f.dinitial.items()},
                         {**f.dparams, **{_reverse_key(k): v for k, v in r.dparams.items()}})


def _reverse_key(key: str) -> str:
    layer, rest = key.split(".", 1)
    return f"{layer}.{REVERSE}.{rest}"
