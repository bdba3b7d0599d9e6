"""Where a module's views are in their sources: what a backward pass needs to write the sources'
gradients itself, and only where every element of a source is read by one view."""

from __future__ import annotations

import torch

from cellfuse.nn.weight_views import WeightViews


def views_of(w: torch.Tensor, b: torch.Tensor, rows: list[tuple[int, int]]) -> WeightViews:
    return WeightViews([w[a:z].t() for a, z in rows] + [b], [w, b], gradients=None)


def test_the_gates_rows_transposed_are_placed_in_their_sources():
    w, b = torch.randn(8, 3), torch.randn(5)
    places = views_of(w, b, [(0, 4), (4, 8)]).places()
    assert places.sources == ((8, 3), (5,))
    first, second, bias = places.views
    assert (first.source, first.offset, first.shape, first.strides) == (0, 0, (3, 4), (1, 3))
    assert (second.source, second.offset) == (0, 12)
    assert (bias.source, bias.offset, bias.shape, bias.strides) == (1, 0, (5,), (1,))


def test_views_that_leave_out_or_read_twice_some_elements_are_not_placed():
    w, b = torch.randn(8, 3), torch.randn(5)
    assert views_of(w, b, [(0, 4)]).places() is None  # rows 4..7 read by none
    assert views_of(w, b, [(0, 4), (2, 8)]).places() is None  # rows 2, 3 read twice


def test_views_of_other_tensors_or_of_other_types_are_not_placed():
    w, b = torch.randn(8, 3), torch.randn(5)
    assert WeightViews([w[0:4].t(), w[4:8].t(), b.clone()], [w, b], gradients=None).places() is None
    w16 = w.to(torch.bfloat16)
    assert WeightViews([w16[0:4].t(), w16[4:8].t(), b], [w16, b], gradients=None).places() is None


def test_views_of_elements_apart_in_their_source_are_not_placed():
    w, b = torch.randn(8, 3), torch.randn(5)
    every_other = WeightViews([w[0::2].t(), w[1::2].t(), b], [w, b], gradients=None)
    assert every_other.places() is None  # (they do tile w, but neither is a block of it)
