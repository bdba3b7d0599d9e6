"""stacks._Zeroed, the autograd node of the padding's zeroing kernel for an x that needs a gradient, driven
on the CPU with a stand-in for the C++ Rows (which zeroes as the kernel does, and turns down what it
would): x's gradient has no padding, whatever happens to the caller's lengths before the backward pass,
and the steps-left state's gradient is not made. (On a GPU, tests/nn/test_packed_rows_gpu.py runs it over
the kernel.)"""

from __future__ import annotations

import pytest
import torch

from cellfuse.graph_model import CellError
from cellfuse.nn import stacks


class FakeRows:
    """Rows.zeroed by torch's ops: x itself where every row is T long; None for a gradient whose rows are
    not contiguous and for lengths not one a row, as the C++ answers; each call recorded."""

    def __init__(self):
        self.calls: list[tuple[list[int], int]] = []

    def zeroed(self, x, lengths, hidden, layers, stream):
        self.calls.append((lengths.tolist(), layers))
        if x.stride(2) != 1 or lengths.shape != (x.shape[1],):
            return None
        steps = stacks.steps_left(lengths, layers, x, hidden) if layers else None
        if int(lengths.min()) == x.shape[0]:
            return x, steps
        ended = (torch.arange(x.shape[0]).view(-1, 1) >= lengths.view(1, -1)).unsqueeze(2)
        return torch.where(ended, 0.0, x).contiguous(), steps


@pytest.fixture
def rows(monkeypatch):
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 0, raising=False)
    return FakeRows()


def test_the_gradients_padding_is_zeroed_by_the_lengths_of_the_forward_pass(rows):
    lengths = torch.tensor([4, 1, 3])
    x = torch.randn(4, 3, 2, requires_grad=True)
    zeroed, steps = stacks._Zeroed.apply(x, lengths, rows, 2, 5, 0)
    assert not steps.requires_grad and steps.shape == (2, 3, 5)
    lengths.fill_(4)  # (the caller's, changed in place before the backward pass)
    zeroed.mul(torch.arange(24.0).view(4, 3, 2)).sum().backward()
    want = (torch.arange(4).view(4, 1) < torch.tensor([4, 1, 3]).view(1, 3)).unsqueeze(2) * torch.arange(
        24.0).view(4, 3, 2)
    assert torch.equal(x.grad, want)
    assert rows.calls == [([4, 1, 3], 2), ([4, 1, 3], 0)]  # (the backward's with no steps-left state)


def test_a_gradient_the_kernel_turns_down_is_zeroed_by_torchs_ops(rows):
    x = torch.randn(4, 3, 2, requires_grad=True)
    zeroed, _ = stacks._Zeroed.apply(x, torch.tensor([2, 4, 1]), rows, 1, 2, 0)
    zeroed.sum().backward()  # (a gradient of stride 0)
    assert len(rows.calls) == 2
    assert torch.equal(x.grad[:, :, 0], torch.tensor([[1.0, 1, 1], [1, 1, 0], [0, 1, 0], [0, 1, 0]]))


def test_lengths_the_kernel_turns_down_are_checked_by_torchs_ops(rows, monkeypatch):
    monkeypatch.setattr(rows, "zeroed", lambda *args: None)
    with pytest.raises(CellError, match="lengths must be from 1 to the sequence's length 4"):
        stacks._Zeroed.apply(torch.randn(4, 3, 2, requires_grad=True), torch.tensor([5, 1, 1]), rows, 1, 2, 0)


def test_lengths_of_another_shape_for_an_x_that_needs_a_gradient_are_refused_by_name(rows, monkeypatch):
    """lengths_applied reads no reduction of lengths it cannot use (none at all: torch would raise its own
    error), and the kernel's refusal leaves them to check_lengths."""
    monkeypatch.setattr(stacks, "rows_kernels", lambda x, count: (None, rows))
    x = torch.randn(4, 3, 2, requires_grad=True)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    for given in (torch.tensor([], dtype=torch.long), torch.tensor([4, 1])):
        with pytest.raises(CellError, match="expected \\[3\\] \\(one per batch row\\)"):
            stacks.lengths_applied(x, given, 1, 2)
