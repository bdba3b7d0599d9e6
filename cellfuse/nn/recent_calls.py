"""What decided the rungs of a module's recent forward passes (x's sizes, device and dtype, lengths, the
layers one call each or all in one, a training call's saved steps), so that the module can say which
rungs they ran, `auto` resolved (`schedules_run`: CellRNN's and the drop-ins'). Benchmarks report it
beside their times."""

from __future__ import annotations

from collections import OrderedDict

import torch

from . import ops
from .runners import FORWARD, direction_of, precision_of

MAX_SEEN = 4  # the sizes, dtypes, devices and grad modes whose rungs `rungs` reports


class RecentCalls:
    """A module's recent forward passes, the latest last, one per kind (see the module's docstring)."""

    def __init__(self):
        self._last: tuple | None = None
        self._seen: OrderedDict[tuple, None] = OrderedDict()

    def saw(self, x: torch.Tensor, lengths: bool, by_layer: bool, save: bool) -> None:
        """A forward pass whose (first) call of the ops ran over x (time first), with `lengths` or not,
        its layers one call each (`by_layer`) or all in one, saving its steps (`save`) or not."""
        seen = (x.shape, x.device, x.dtype, lengths, by_layer, save)
        if seen != self._last:  # (a new dict, not changed in place: threads may read it)
            self._last = seen
            recent = [s for s in self._seen if s != seen][-(MAX_SEEN - 1):] + [seen]
            self._seen = OrderedDict.fromkeys(recent)

    def rungs(self, cell_text: str, float32: str, hidden: int, layers: int, schedule: str,
              bidirectional: bool) -> list[str]:
        """The rung of each recent pass's (first) call of the ops, as stacks makes it, for a module of
        this cell (as the ops name it), float32 states, sizes, schedule and directions."""
        return [_rung(cell_text, float32, hidden, layers, schedule, bidirectional, *seen)
                for seen in self._seen]


def _rung(cell_text: str, float32: str, hidden: int, layers: int, schedule: str, bidirectional: bool,
          shape: torch.Size, device: torch.device, dtype: torch.dtype, lengths: bool, by_layer: bool,
          save: bool) -> str:
    cell = ops.masked_text(cell_text) if lengths else cell_text
    direction = FORWARD
    if by_layer and bidirectional and device.type == "cuda":
        x = torch.empty((), dtype=dtype, device=device).expand(shape)  # its sizes, no memory
        direction = direction_of(False, ops.side_by_side(cell, x, hidden, schedule, save))
    float32 = ops.masked_float32(float32) if lengths else float32
    return ops.plans(cell, *shape, hidden, 1 if by_layer else layers, ops.schedule_of(schedule, save), device,
                     direction, precision_of(dtype), float32).schedule
