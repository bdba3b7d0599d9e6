"""A call's weights that are views of a module's parameters (torch.nn.LSTM's `weight_ih_l0`, whose rows are
the cell's `W_i`, `W_f`, ...): the ops give autograd the parameters themselves, and each parameter's
gradient made from its views' in one op, where autograd would otherwise run the backward of every view (a
transpose and a slice: a fill and a copy each on a GPU) and add them up, two dozen small kernels and
their host time at the end of every training step of a drop-in LSTM. On a GPU the backward pass's
gathering kernel writes the parameters' gradients itself where `WeightViews.places` says where each view
reads (cuda_runner.CudaRunner.places_gradients): the join of the views' gradients (four torch ops for a
drop-in LSTM's layer) is then not made either.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import torch

Gradients = Callable[[Sequence[torch.Tensor], Sequence[bool]], list[torch.Tensor | None]]


@dataclass(frozen=True)
class Place:
    """Where a view's elements are in its source: element i of the view (an index per dimension) is element
    `offset` + sum(i * `strides`) of source `source` (flat)."""

    source: int
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]


@dataclass(frozen=True)
class Places:
    """Each view's Place (in the views' order) and the sources' shapes: what a backward pass needs to write
    the sources' gradients itself, each element of a view's gradient where the view reads its source."""

    views: tuple[Place, ...]
    sources: tuple[tuple[int, ...], ...]

    def __hash__(self) -> int:  # (a runner's key at every backward call: its fields' hash, worked out once)
        return self._hash

    @cached_property
    def _hash(self) -> int:
        return hash((self.views, self.sources))


class WeightViews(list):
    """The weights of a call (a list, in the cell's order of keys: what the kernels read) that are views
    of `sources`; `gradients(grads, needed)` gives the sources' gradients from the weights' (None for a
    source whose `needed` is False)."""

    def __init__(self, views: Sequence[torch.Tensor], sources: Sequence[torch.Tensor], gradients: Gradients):
        super().__init__(views)
        self.sources = tuple(sources)
        self.gradients = gradients
        self._places: Places | None | bool = False  # (not yet worked out)

    def places(self) -> Places | None:
        """Where the views are in their sources, worked out at the first asking; None unless the sources
        are contiguous float32 tensors (their gradients' type, as the kernels give them) that the views
        tile, each view a block of consecutive elements of its source read in any order of its
        dimensions (a slice of rows, transposed or not: as a drop-in's are), no two overlapping: then a
        source's gradient is its views' placed."""
        if self._places is False:
            self._places = _places(list(self), self.sources)
        return self._places


def _places(views: Sequence[torch.Tensor], sources: Sequence[torch.Tensor]) -> Places | None:
    if not all(s.dtype == torch.float32 and s.is_contiguous() for s in sources):
        return None
    places, spans = [], [[] for _ in sources]
    for view in views:
        at = view.storage_offset()
        found = [j for j, s in enumerate(sources)
                 if view.untyped_storage().data_ptr() == s.untyped_storage().data_ptr()
                 and s.storage_offset() <= at < s.storage_offset() + s.numel()]
        if len(found) != 1 or not _dense(view):
            return None
        j = found[0]
        place = Place(j, at - sources[j].storage_offset(), tuple(view.shape), tuple(view.stride()))
        spans[j].append((place.offset, place.offset + view.numel()))
        places.append(place)
    # (worked out from the spans, not element by element: a tally of every element took 0.1 s a layer
    # at hidden 512, and torch.func.functional_call makes the views anew at every call)
    for source, taken in zip(sources, spans, strict=True):
        end = 0
        for a, b in sorted(taken):
            if a != end:  # a gap, or an overlap
                return None
            end = b
        if end != source.numel():
            return None
    return Places(tuple(places), tuple(tuple(s.shape) for s in sources))


def _dense(view: torch.Tensor) -> bool:
    """Whether the view's elements are consecutive ones of its memory, in some order of its dimensions."""
    expected = 1
    for stride, size in sorted((st, n) for n, st in zip(view.shape, view.stride(), strict=True) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


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
