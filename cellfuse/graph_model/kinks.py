"""Where a run passes within float32's rounding of a kink, and the gradients along its other branch.

An op whose derivative jumps (relu and abs at 0, max and min where their args are equal) carries `kink`
in the op table. Where the float64 reference passes within rounding of one, a float32 run may land on
its other side and take the other branch's derivative, and with it gradients that differ from the
reference's everywhere the kink's unit reaches, by far more than rounding: both are exact, for inputs a
rounding apart. A check of gradients then compares with the reference along the other branch too:
`near_kinks` finds the places in a reference's tape, `other_branch` gives the tape with chosen ones moved
to their other side (by twice their distance, a rounding), whose backward pass gives those gradients.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from .backward import Tape
from .ops import OPS

# A kink is near where its distance is within this fraction of the largest magnitude of its args in
# the step (about eight float32 roundings of it).
KINK_ROUNDING = 2.0**-20


@dataclass(frozen=True)
class Kink:
    """One element of one node's value, at one step of one layer, this distance from its kink."""

    node: str
    op: str
    layer: int
    step: int
    index: tuple[int, ...]  # (row, column) of the node's value
    distance: float

    def text(self) -> str:
        where = ", ".join(f"{n} {i}" for n, i in zip(("row", "column"), self.index, strict=False))
        return (f"{self.op} '{self.node}' at layer {self.layer}, step {self.step}, {where} "
                f"({abs(self.distance):.1e} from its kink)")


def near_kinks(tape: Tape, most: int) -> list[Kink]:
    """The `most` kinks of the run nearest to theirs (relative to their args' magnitude), of those
    within KINK_ROUNDING; nearest first."""
    nodes = tape.cell.by_id()
    found: list[tuple[float, Kink]] = []
    for layer, steps in enumerate(tape.values):
        for t, values in enumerate(steps):
            for nid in tape.order:
                op = OPS[nodes[nid].op]
                if op.kink is None:
                    continue
                args = [np.asarray(values[a]) for a in nodes[nid].args]
                distance = np.broadcast_to(op.kink(*args), np.shape(values[nid]))
                scale = max(float(np.max(np.abs(a), initial=0.0)) for a in args)
                if scale == 0.0 or distance.size == 0:
                    continue
                relative = np.abs(distance) / scale
                for flat in np.argsort(relative, axis=None)[:most]:
                    index = np.unravel_index(flat, relative.shape)
                    if relative[index] <= KINK_ROUNDING:
                        at = tuple(int(i) for i in index)
                        found.append((float(relative[index]),
                                      Kink(nid, op.name, layer, t, at, float(distance[index]))))
    return [kink for _, kink in sorted(found, key=lambda f: f[0])[:most]]


def other_branch(tape: Tape, kinks: list[Kink]) -> Tape:
    """The tape with each of the kinks on its other side: the first arg that has the node's full shape
    moved by twice the distance (an arg broadcast over rows would move every row's kink)."""
    nodes = tape.cell.by_id()
    values = [list(steps) for steps in tape.values]
    for kink in kinks:
        step = values[kink.layer][kink.step] = dict(values[kink.layer][kink.step])
        shape = np.shape(step[kink.node])
        for i, arg in enumerate(nodes[kink.node].args):
            if np.shape(step[arg]) == shape:
                moved = np.array(step[arg], dtype=np.float64)
                moved[kink.index] += (-2.0 if i == 0 else 2.0) * kink.distance
                step[arg] = moved
                break
    return dataclasses.replace(tape, values=values)
