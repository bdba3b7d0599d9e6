"""TensorLayout's gradients out of gradient buffers that are views of one piece of memory (as a GPU run's
are): tensors of their own, none a view of that memory (which a custom op's outputs may not be, and
which would keep the memory alive), and each parameter's gradient where the buffers hold it; the gathers
that a GPU's kernel is given (codegen.gradient_gather) say the same, and that kernel compiles."""

from __future__ import annotations

import pytest
import torch
from compile_cuda import nvcc_cubin

from cellfuse.codegen.gradient_gather import gather_kernel_source
from cellfuse.codegen.plan import grad_of
from cellfuse.nn import CellRNN, ops

CASES = [("lstm", 1), ("gru", 2), ("lstm", 2)]


@pytest.mark.parametrize("name, layers", CASES)
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


@pytest.mark.parametrize("name, layers", CASES)
@pytest.mark.parametrize("schedule", ["fused", "persistent"])
@pytest.mark.parametrize("input_grad", [False, True])
def test_the_gathers_give_what_the_torch_ops_give(name, layers, schedule, input_grad):
    """Each gather's elements (the kernel's outputs: the grouped gradients, then each state's, then dx
    where asked for) are the sums of its sources' in the memory, which must be what `gradients` makes
    of it with torch's ops."""
    x = torch.zeros(3, 2, 4)
    plans = ops.plans(CellRNN(name, 4, 5, layers)._cell_text, 3, 2, 4, 5, layers, schedule, x.device)
    layout = plans.layout
    memory, offsets, views = gradient_memory(plans)
    dx, dinitial, grouped = layout.gradients(views, input_grad=input_grad)
    wanted = (*grouped, *dinitial, *([dx] if input_grad else []))
    outputs = emulated(layout.gathers(offsets, input_grad), memory, [t.shape for t in wanted])
    for got, want in zip(outputs, wanted, strict=True):
        torch.testing.assert_close(got, want)


def gradient_memory(plans):
    """Random gradient buffers laid end to end in one piece of memory, as a GPU run's: the memory, each
    buffer's byte offset in it and its view, by name."""
    backward, sizes = plans.backward, plans.train.sizes
    offsets, views, at = {}, {}, 0
    memory = torch.randn(sum(b.nbytes(sizes) // 4 for b in backward.buffers.values()))
    for n, b in backward.buffers.items():
        offsets[n], views[n] = 4 * at, memory[at:at + b.nbytes(sizes) // 4]
        at += b.nbytes(sizes) // 4
    return memory, offsets, views


def emulated(gathers, memory, shapes):
    """The gathering kernel's outputs, of `shapes`, worked out with torch's ops (each element gathered
    once)."""
    outputs = [torch.full(shape, float("nan")) for shape in shapes]
    for g in gathers:
        place = outputs[g.out].as_strided((g.rows, g.width), g.strides or (g.width, 1), g.start)
        assert place.isnan().all(), "an element gathered twice"
        place.zero_()
        for source in g.sources:
            place += memory.as_strided((g.rows, g.width), (source.ld, 1), source.at // 4)
    return outputs


@pytest.mark.parametrize("name, layers", [("lstm", 2), ("gru", 1)])
def test_the_gathering_kernel_of_a_layout_compiles(name, layers, tmp_path):
    x = torch.zeros(3, 2, 4)
    plans = ops.plans(CellRNN(name, 4, 5, layers)._cell_text, 3, 2, 4, 5, layers, "persistent", x.device)
    gathers = plans.layout.gathers({n: 1024 * i for i, n in enumerate(plans.backward.buffers)})
    nvcc_cubin(gather_kernel_source(gathers), tmp_path)


@pytest.mark.parametrize("kind, layers, reverse", [("LSTM", 1, False), ("LSTM", 2, False), ("GRU", 1, True),
                                                   ("GRU", 3, False)])
@pytest.mark.parametrize("input_grad", [False, True])
def test_gathers_into_a_drop_ins_parameters_give_what_its_views_gradients_give(kind, layers, reverse,
                                                                              input_grad):
    """Written straight into torch's parameters' gradients (the gates' rows of weight_ih_l0, transposed,
    ...), the gradients are what the grouped ones make through the module's join of its views'."""
    from cellfuse.nn import GRU, LSTM

    module = {"LSTM": LSTM, "GRU": GRU}[kind](4, 5, layers, bidirectional=reverse)
    views = module._layer_params(0, True) if reverse else module._fused_params()
    calls = 1 if reverse else layers
    x = torch.zeros(3, 2, 4)
    plans = ops.plans(module._cell_text, 3, 2, 4, 5, calls, "persistent", x.device)
    layout = plans.layout
    memory, offsets, memory_views = gradient_memory(plans)
    dx, dinitial, grouped = layout.gradients(memory_views, input_grad=input_grad)
    want = views.gradients(layout.param_gradients(grouped, x), [True] * len(views.sources))
    into = views.places()
    assert into is not None and into.sources == tuple(tuple(s.shape) for s in views.sources)
    shapes = [*into.sources, *(t.shape for t in dinitial), *([dx.shape] if input_grad else [])]
    got = emulated(layout.gathers(offsets, input_grad, into), memory, shapes)
    for a, b in zip(got, [*want, *dinitial, *([dx] if input_grad else [])], strict=True):
        torch.testing.assert_close(a, b)


def test_the_gathering_kernel_into_a_drop_ins_parameters_compiles(tmp_path):
    from cellfuse.nn import LSTM

    module = LSTM(4, 5, 2)
    plans = ops.plans(module._cell_text, 3, 2, 4, 5, 2, "persistent", torch.device("cpu"))
    gathers = plans.layout.gathers({n: 1024 * i for i, n in enumerate(plans.backward.buffers)}, True,
                                   module._fused_params().places())
    assert any(g.strides is not None and g.strides[0] == 1 for g in gathers)  # (transposed: W's rows)
    nvcc_cubin(gather_kernel_source(gathers), tmp_path)


@pytest.mark.parametrize("name, layers", [("lstm", 1), ("gru", 2), ("indrnn", 1), ("layernorm_lstm", 1)])
def test_gathers_into_each_parameters_own_tensor_give_what_param_gradients_give(name, layers):
    """CellRNN's parameters are tensors of their own: each key's gradient written into its own tensor is
    the view of the grouped ones that param_gradients gives."""
    x = torch.zeros(3, 2, 4)
    plans = ops.plans(CellRNN(name, 4, 4, layers)._cell_text, 3, 2, 4, 4, layers, "persistent", x.device)
    layout = plans.layout
    memory, offsets, views = gradient_memory(plans)
    dx, dinitial, grouped = layout.gradients(views)
    want = layout.param_gradients(grouped, x)
    into = layout.own_places
    got = emulated(layout.gathers(offsets, True, into), memory,
                   [*into.sources, *(t.shape for t in dinitial), dx.shape])
    for a, b in zip(got, [*want, *dinitial, dx], strict=True):
        torch.testing.assert_close(a, b)
