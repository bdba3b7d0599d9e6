"""Where a CellRNN's tensors live in the buffers of a forward Plan and of its backward Plan.

The executors own their buffers (numpy arrays, or one device allocation on the GPU); torch sees each one
as a flat tensor over the same memory (a `view`). This module copies the module's tensors into those
views before a run and the results out of them after it, with torch's own ops, so that the one layout
serves the numpy executor and the CUDA executor alike:

- x [T, B, input] into the buffer `x`, each initial state [L, B, hidden] into `init.<state>`, and each
  parameter into the weight-like buffers built from it: a column block of a matrix of weights stacked
  along N, of a bias row, or the whole of a weight's own buffer (`Plan.weight_arrays` builds the same
  buffers in numpy);
- y out of the last layer's output sequence, the final states out of `final.<state>`;
- the seeds dy and dfinal added into the gradient buffers where `BackwardPlan.seeds` puts them, every
  other gradient buffer a run adds into zero (the `ones` and those overwritten whole are set once), and
  the gradients of x, of the initial states and of
  every parameter read back as `BackwardPlan.gradients` reads them: a key used in several buffers gets
  the sum of its parts, a weight no launch reads gets zeros.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..codegen.backward_plan import BackwardPlan
from ..codegen.plan import ParamPart, Plan, grad_of


class TensorLayout:
    """The module's tensors in and out of an executor's buffers, seen by torch as `views` (flat tensors
    of the executor's dtype and device, one per forward and gradient buffer)."""

    def __init__(self, plan: Plan, backward: BackwardPlan, views: dict[str, torch.Tensor]):
        self.plan, self.backward, self.views = plan, backward, views
        self.state_ids = plan.state_ids
        self.keys = tuple(plan.params)
        self.parts = list(plan.param_parts())
        for name in backward.buffers:  # those no run changes the start of (see `seed`), set once
            if not backward.restarted(name):
                self.views[name].fill_(backward.start_value(name))

    def _block(self, buffer: str, part: ParamPart) -> torch.Tensor:
        return self.views[buffer].view(-1, part.ld)[:, part.col:part.col + part.width]

    def _state_grad(self, state: str, layer: int, t: int) -> torch.Tensor:
        """The [B * hidden] gradient of a layer's state before step t (t = T: after the last step)."""
        name, at = self.backward.state_grad(state, layer, t)
        return self.views[name][at:at + self.plan.sizes.batch * self.plan.sizes.hidden]

    # -- forward -------------------------------------------------------------------------------------
    def load(self, x: torch.Tensor, states: Sequence[torch.Tensor], params: Sequence[torch.Tensor]) -> None:
        """x, the initial states (in the order of `state_ids`) and the parameters (in the order of `keys`)
        into the forward buffers."""
        self.views["x"].copy_(x.reshape(-1))
        for state, value in zip(self.state_ids, states, strict=True):
            self.views[f"init.{state}"].copy_(value.reshape(-1))
        by_key = dict(zip(self.keys, params, strict=True))
        for part in self.parts:
            self._block(part.buffer, part).copy_(by_key[part.key].reshape(-1, part.width))

    def outputs(self) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """y [T, B, hidden] and the final states [L, B, hidden] of the last run, as tensors of their own."""
        s = self.plan.sizes
        T, B, H, L = s.seq, s.batch, s.hidden, s.layers
        y = self.views[self.plan.layers[-1].output_seq][B * H:].view(T, B, H).clone()
        return y, [self.views[f"final.{state}"].view(L, B, H).clone() for state in self.state_ids]

    # -- backward ------------------------------------------------------------------------------------
    def seed(self, dy: torch.Tensor, dfinals: Sequence[torch.Tensor]) -> None:
        """The gradient buffers before a backward run: dy [T, B, hidden] and dfinal [L, B, hidden] per
        state added where the forward pass wrote y and the final states, zeros elsewhere; the buffers a
        run does not restart keep what they hold (`BackwardPlan.restarted`)."""
        s = self.plan.sizes
        for name in self.backward.buffers:
            if self.backward.restarted(name):
                self.views[name].fill_(self.backward.start_value(name))
        # A state that is the output lives in the output sequence: its final seed adds to dy's last step.
        name, at = self.backward.dy_place()
        self.views[name][at:at + dy.numel()].add_(dy.reshape(-1))
        for state, seed in zip(self.state_ids, dfinals, strict=True):
            for layer in range(s.layers):
                self._state_grad(state, layer, s.seq).add_(seed[layer].reshape(-1))

    def gradients(self) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """The gradients of x, of the initial states (in the order of `state_ids`) and of the parameters
        (in the order of `keys`) after a backward run, as tensors of their own."""
        s = self.plan.sizes
        B, H = s.batch, s.hidden
        dx = self.views[grad_of("x")].view(s.seq, B, s.input).clone()
        dinitial = [torch.stack([self._state_grad(state, layer, 0).view(B, H) for layer in range(s.layers)])
                    for state in self.state_ids]
        x = self.views["x"]
        dparams = {key: torch.zeros(shape, dtype=x.dtype, device=x.device)
                   for key, shape in self.plan.params.items()}
        for part in self.parts:
            dparams[part.key] += self._block(grad_of(part.buffer), part).reshape(dparams[part.key].shape)
        return dx, dinitial, [dparams[key] for key in self.keys]
