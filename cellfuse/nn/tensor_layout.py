"""Where a CellRNN's tensors go in the buffers of a forward Plan and of its backward Plan, and how its
gradients come back out of them.

A run sees each buffer as a flat tensor (a `view`): on the CPU, torch's view of the numpy executor's
array; on a GPU, a piece of memory from torch's allocator for that run. This module moves the module's
tensors into those views and the results out of them with torch's own ops, so that the one layout serves
both:

- each parameter into the weight-like buffers built from it: a column block of a matrix of weights
  stacked along N, of a bias row, or the whole of a weight's own buffer (`Plan.weight_arrays` builds the
  same buffers in numpy);
- the seeds dy and dfinal added into the gradient buffers where `BackwardPlan.seeds` puts them, and the
  gradients of x, of the initial states and of every parameter read back as `BackwardPlan.gradients`
  reads them: a key used in several buffers gets the sum of its parts, a weight no launch reads gets
  zeros.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import torch

from ..codegen.backward_plan import BackwardPlan
from ..codegen.plan import ParamPart, Plan, grad_of

Views = Mapping[str, torch.Tensor]

WEIGHT_ROLES = ("weight", "stacked", "bias")


class TensorLayout:
    """The module's parameters into a plan's weight buffers, the seeds into its backward plan's gradient
    buffers, the gradients out of them."""

    def __init__(self, plan: Plan, backward: BackwardPlan):
        self.plan, self.backward = plan, backward
        self.state_ids = plan.state_ids
        self.keys = tuple(plan.params)
        self.parts = list(plan.param_parts())
        s = plan.sizes
        # the places of the seeds and of the states' gradients, worked out once (addresses are expressions)
        self.dy_place = backward.dy_place()
        self.state_places = {(state, layer, t): backward.state_grad(state, layer, t)
                             for state in self.state_ids for layer in range(s.layers) for t in (0, s.seq)}

    def _block(self, views: Views, buffer: str, part: ParamPart) -> torch.Tensor:
        return views[buffer].view(-1, part.ld)[:, part.col:part.col + part.width]

    def _state_grad(self, views: Views, state: str, layer: int, t: int) -> torch.Tensor:
        """The [B * hidden] gradient of a layer's state before step t (t = T: after the last step)."""
        name, at = self.state_places[state, layer, t]
        return views[name][at:at + self.plan.sizes.batch * self.plan.sizes.hidden]

    def pack(self, views: Views, params: Sequence[torch.Tensor],
             buffers: Collection[str] | None = None) -> None:
        """The parameters (in the order of `keys`) into the weight buffers (those of `buffers`, where
        given)."""
        by_key = dict(zip(self.keys, params, strict=True))
        for part in self.parts:
            if buffers is not None and part.buffer not in buffers:
                continue
            self._block(views, part.buffer, part).copy_(by_key[part.key].reshape(-1, part.width))

    def seed(self, views: Views, dy: torch.Tensor, dfinals: Sequence[torch.Tensor | None]) -> None:
        """dy [T, B, hidden] and dfinal [L, B, hidden] per state added where the forward pass wrote y and
        the final states, into gradient buffers that hold their start values."""
        s = self.plan.sizes
        # A state that is the output lives in the output sequence: its final seed adds to dy's last step.
        name, at = self.dy_place
        views[name][at:at + dy.numel()].add_(dy.reshape(-1))
        for state, seed in zip(self.state_ids, dfinals, strict=True):
            if seed is None:  # no gradient reaches this final state
                continue
            for layer in range(s.layers):
                self._state_grad(views, state, layer, s.seq).add_(seed[layer].reshape(-1))

    def gradients(self, views: Views) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """The gradients of x, of the initial states (in the order of `state_ids`) and of the parameters
        (in the order of `keys`) after a backward run, each a tensor of its own (a view would keep all the
        gradient buffers alive for as long as a .grad holds it), made by one copy."""
        s = self.plan.sizes
        B, H = s.batch, s.hidden
        dx = views[grad_of("x")].view(s.seq, B, s.input).clone()
        dinitial = [torch.stack([self._state_grad(views, state, layer, 0).view(B, H)
                                 for layer in range(s.layers)]) for state in self.state_ids]
        dparams: dict[str, torch.Tensor] = {}
        for part in self.parts:
            block = self._block(views, grad_of(part.buffer), part)
            if part.key in dparams:
                dparams[part.key] += block.reshape(dparams[part.key].shape)
            else:
                own = dparams[part.key] = block.new_empty(self.plan.params[part.key])
                own.view(block.shape).copy_(block)
        for key, shape in self.plan.params.items():
            if key not in dparams:
                dparams[key] = dx.new_zeros(shape)
        return dx, dinitial, [dparams[key] for key in self.keys]
