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

The parameters' gradients come out in two steps, as few torch ops as can be (each costs microseconds of
host time): `gradients` copies them out of the gradient buffers as `grouped` tensors (a stacked buffer
split evenly among its keys in one copy, [keys, rows, width]; every other key's own tensor), which the
backward pass returns (a custom op's outputs may not be views of each other); `param_gradients` makes
each key's gradient of those (views of a group). On a GPU one kernel does what `gradients` does but dx
(`gathers`, codegen.gradient_gather): with torch's ops it cost a training step more host time than the
backward pass's own launches.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from functools import cached_property

import torch

from ..codegen.backward_plan import BackwardPlan
from ..codegen.gradient_gather import Gather, Source
from ..codegen.plan import ParamPart, Plan, grad_of
from .weight_views import Place, Places

Views = Mapping[str, torch.Tensor]


class TensorLayout:
    """The module's parameters into a plan's weight buffers, the seeds into its backward plan's gradient
    buffers, the gradients out of them."""

    def __init__(self, plan: Plan, backward: BackwardPlan | None):
        """`backward`: None for a plan that runs forward only (then only `pack` works)."""
        self.plan, self.backward = plan, backward
        self.state_ids = plan.state_ids
        self.keys = tuple(plan.params)
        self.parts = list(plan.param_parts())
        self.weight_buffers = list(dict.fromkeys(part.buffer for part in self.parts))
        s = plan.sizes
        # the places of the seeds and of the states' gradients, worked out once (addresses are expressions)
        if backward is not None:
            self.dy_place = backward.dy_place()
            self.state_places = {(state, layer, t): backward.state_grad(state, layer, t)
                                 for state in self.state_ids for layer in range(s.layers) for t in (0, s.seq)}
        by_buffer: dict[str, list[ParamPart]] = {}
        for part in self.parts:
            by_buffer.setdefault(part.buffer, []).append(part)
        keys = [part.key for part in self.parts]
        # buffers split evenly among keys found in no other place: their parts, in order, of one width,
        # cover the rows; the other parts, and the keys they give (in order of first part)
        self.groups = {name: parts for name, parts in by_buffer.items()
                       if all(p.width == parts[0].width and p.col == i * p.width and keys.count(p.key) == 1
                              for i, p in enumerate(parts)) and len(parts) * parts[0].width == parts[0].ld}
        self.pieces = [part for part in self.parts if part.buffer not in self.groups]
        self.piece_keys = list(dict.fromkeys(part.key for part in self.pieces))

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
        name, at = self.dy_place
        views[name][at:at + dy.numel()].add_(dy.reshape(-1))
        self.seed_finals(views, dfinals)

    def seed_finals(self, views: Views, dfinals: Sequence[torch.Tensor | None]) -> None:
        """`seed`'s dfinals alone, where dy is in already (after it: a state that is the output lives in
        the output sequence, and its final seed adds to dy's last step)."""
        s = self.plan.sizes
        for state, seed in zip(self.state_ids, dfinals, strict=True):
            if seed is None:  # no gradient reaches this final state
                continue
            for layer in range(s.layers):
                self._state_grad(views, state, layer, s.seq).add_(seed[layer].reshape(-1))

    def grouped_shapes(self) -> list[tuple[int, ...]]:
        """The shapes of the grouped gradients (see `gradients`)."""
        return ([(len(parts), parts[0].rows, parts[0].width) for parts in self.groups.values()]
                + [tuple(self.plan.params[key]) for key in self.piece_keys])

    def gradients(self, views: Views, input_grad: bool = True
                  ) -> tuple[torch.Tensor | None, list[torch.Tensor], list[torch.Tensor]]:
        """The gradients of x (None unless `input_grad`) and of the initial states (in the order of
        `state_ids`) after a backward run, and the parameters' grouped (see the module's docstring), each
        a tensor of its own (a view would keep all the gradient buffers alive for as long as a .grad holds
        it)."""
        s = self.plan.sizes
        B, H = s.batch, s.hidden
        dx = self.input_gradient(views) if input_grad else None
        dinitial = [torch.stack([self._state_grad(views, state, layer, 0).view(B, H)
                                 for layer in range(s.layers)]) for state in self.state_ids]
        # a copy always (contiguous() would return a view where the transpose moves a dimension of 1)
        grouped = [views[grad_of(name)].view(parts[0].rows, len(parts), parts[0].width).transpose(0, 1)
                   .clone(memory_format=torch.contiguous_format) for name, parts in self.groups.items()]
        pieces: dict[str, torch.Tensor] = {}
        for part in self.pieces:
            block = self._block(views, grad_of(part.buffer), part)
            if part.key in pieces:
                pieces[part.key] += block.reshape(pieces[part.key].shape)
            else:
                own = pieces[part.key] = block.new_empty(self.plan.params[part.key])
                own.view(block.shape).copy_(block)
        return dx, dinitial, grouped + [pieces[key] for key in self.piece_keys]

    def input_gradient(self, views: Views) -> torch.Tensor:
        """dx [T, B, input] after a backward run, a tensor of its own (see `gradients`)."""
        s = self.plan.sizes
        return views[grad_of("x")].view(s.seq, s.batch, s.input).clone()

    @cached_property
    def own_places(self) -> Places:
        """Places for parameters that are tensors of their own, each key's contiguous: `gathers` into them
        writes each key's gradient in a tensor of its own, as `param_gradients` gives them, without the
        grouped ones and their views between."""
        shapes = [tuple(self.plan.params[key]) for key in self.keys]
        return Places(tuple(Place(i, 0, shape, tuple(math.prod(shape[d + 1:]) for d in range(len(shape))))
                            for i, shape in enumerate(shapes)), tuple(shapes))

    def gathers(self, offsets: Mapping[str, int], input_grad: bool = False, into: Places | None = None
                ) -> list[Gather] | None:
        """What `gradients` does, for codegen.gradient_gather's kernel, the gradient buffers at the bytes
        `offsets` (by name) of one piece of memory: output i the i-th grouped gradient (contiguous, of
        `grouped_shapes`), then each state's [layers, B, hidden] (in the order of `state_ids`), then,
        with `input_grad`, dx [T, B, input]. With `into` (the parameters being views of other tensors, in
        the order of `keys`), the first outputs are those tensors' gradients instead, each key's placed
        where its view reads (None where a key's cannot be: one that no launch reads, or a view of
        another shape than the key's)."""
        def source(part: ParamPart) -> Source:
            return Source(offsets[grad_of(part.buffer)] + 4 * part.col, part.ld)

        if into is None:
            out = [Gather(i, j * part.rows * part.width, part.rows, part.width, (source(part),))
                   for i, parts in enumerate(self.groups.values()) for j, part in enumerate(parts)]
            for i, key in enumerate(self.piece_keys, start=len(self.groups)):
                parts = [part for part in self.pieces if part.key == key]  # summed: several launches read it
                out.append(Gather(i, 0, parts[0].rows, parts[0].width, tuple(source(part) for part in parts)))
            first = len(self.groups) + len(self.piece_keys)
        else:
            out = []
            for key, place in zip(self.keys, into.views, strict=True):
                parts = [part for part in self.parts if part.key == key]
                strides = _strides(place, self.plan.params[key], parts)
                if strides is None:
                    return None
                out.append(Gather(place.source, place.offset, parts[0].rows, parts[0].width,
                                  tuple(source(part) for part in parts), strides))
            first = len(into.sources)
        s = self.plan.sizes
        n = s.batch * s.hidden
        for i, state in enumerate(self.state_ids, start=first):
            for layer in range(s.layers):
                name, at = self.state_places[state, layer, 0]
                out.append(Gather(i, layer * n, 1, n, (Source(offsets[name] + 4 * at, n),)))
        if input_grad:
            out.append(Gather(first + len(self.state_ids), 0, s.seq * s.batch, s.input,
                              (Source(offsets[grad_of("x")], s.input),)))
        return out

    def param_gradients(self, grouped: Sequence[torch.Tensor], like: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's gradient (in the order of `keys`) from the grouped ones: views of a group,
        a key's own tensor, zeros (of `like`'s dtype and device) where no launch reads the key."""
        out: dict[str, torch.Tensor] = {}
        for parts, group in zip(self.groups.values(), grouped, strict=False):
            for part, grad in zip(parts, group.unbind(0), strict=True):
                shape = self.plan.params[part.key]
                out[part.key] = grad if grad.shape == shape else grad.view(shape)
        out.update(zip(self.piece_keys, grouped[len(self.groups):], strict=True))
        return [out[key] if key in out else like.new_zeros(self.plan.params[key]) for key in self.keys]


def _strides(place: Place, shape: Sequence[int], parts: Sequence[ParamPart]) -> tuple[int, int] | None:
    """The (row, column) strides, in its source, of a key's view read as its parts' rows x width (the
    key's tensor reshaped so, as `pack` reads it); None where there are no parts, or the view is not of
    the key's shape or is not one of [rows, width] or [width] (a row)."""
    if not parts or place.shape != tuple(shape):
        return None
    rows, width = parts[0].rows, parts[0].width
    if place.shape == (rows, width):
        return place.strides[0], place.strides[1]
    if place.shape == (width,) and rows == 1:
        return width * place.strides[0], place.strides[0]
    return None
