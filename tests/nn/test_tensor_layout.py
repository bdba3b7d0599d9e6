"""TensorLayout's gradients out of gradient buffers that are views of one piece of memory (as a GPU run's
are): tensors of their own, none a view of that memory (which a custom op's outputs may not be, and
which would keep the memory alive), and each parameter's gradient where the buffers hold it."""

from __future__ import annotations

import pytest
import torch

from cellfuse.codegen.plan import grad_of
from cellfuse.nn import CellRNN, ops


@pytest.mark.parametrize("name, layers", [("lstm", 1), ("gru", 2)])
def test_gradients_are_copies_and_in_place(name, layers):
    x = torch.zeros(3, 2, 4)
    plans = ops.plans(CellRNN(name, 4, 5, layers)._cell_text, 3, 2, 4, 5, layers, "fused", x.device)
    layout, backward, sizes = plans.layout, plans.backward, plans.train.sizes
    sizes_of = {n: b.nbytes(sizes) // 4 for n, b in backward.buffers.items()}
    memory = torch.arange(sum(sizes_of.values()), dtype=torch.float32)
    views, at = {}, 0
    for n, count in sizes_of.items():
        views[n] = memory[at:at + count]
        at += count
    dx, dinitial, grouped = layout.gradients(views)
    for t in (dx, *dinitial, *grouped):
        assert t.untyped_storage().data_ptr() != memory.untyped_storage().data_ptr()
    dparams = layout.param_gradients(grouped, x)
    for part in layout.parts:  # each key's gradient where its part of the buffer holds it
        block = views[grad_of(part.buffer)].view(-1, part.ld)[:, part.col:part.col + part.width]
        key = layout.keys.index(part.key)
        if sum(p.key == part.key for p in layout.parts) == 1:
            torch.testing.assert_close(dparams[key].reshape(block.shape), block)
