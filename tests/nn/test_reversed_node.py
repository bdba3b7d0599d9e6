"""stacks._reversed and its autograd node stacks._Reversed, the reversal of rows of lengths of their own by
the reversal kernel, driven on the CPU with a stand-in for the C++ Rows (which reverses as the kernel does,
and turns down what it would): each row's first `lengths` steps reversed and the rest in place, x's
gradient the output's reversed the same way whatever happens to the caller's lengths before the backward
pass, an expanded gradient made contiguous for the kernel, and a tensor the kernel turns down reversed by
the gather. (On a GPU, tests/nn/test_packed_rows_gpu.py runs it over the kernel.)"""

from __future__ import annotations

import pytest
import torch

from cellfuse.nn import stacks


def _reference(t: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    out = t.detach().clone()
    for b, length in enumerate(lengths):
        out[:length, b] = t.detach()[:length, b].flip(0)
    return out


class FakeRows:
    """Rows.reversed by _reference: None for rows whose elements are not contiguous and for elements of
    8 bytes, as the C++ answers; each call's lengths and the strides it was given recorded."""

    def __init__(self):
        self.calls: list[tuple[list[int], tuple[int, ...]]] = []

    def reversed(self, t, lengths, stream):
        self.calls.append((lengths.tolist(), t.stride()))
        if t.stride(2) != 1 or t.element_size() == 8:
            return None
        return _reference(t, lengths.tolist()).contiguous()


@pytest.fixture
def rows(monkeypatch):
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 0, raising=False)
    return FakeRows()


@pytest.fixture
def gathered(monkeypatch):
    """The calls of stacks._gathered (the reversal's gather), each its tensor's dtype."""
    calls, by_index = [], stacks._gathered

    def spied(lengths, like):
        calls.append(like.dtype)
        return by_index(lengths, like)
    monkeypatch.setattr(stacks, "_gathered", spied)
    return calls


def test_rows_are_reversed_within_their_lengths_and_their_gradient_the_same_way(rows, gathered):
    lengths = torch.tensor([4, 1, 3])
    x = torch.randn(4, 3, 2, requires_grad=True)
    y = stacks._reversed(x, rows, lengths)
    assert torch.equal(y, _reference(x, [4, 1, 3])) and y.requires_grad
    lengths.fill_(4)  # (the caller's, changed in place before the backward pass)
    w = torch.arange(24.0).view(4, 3, 2)
    (y * w).sum().backward()
    assert torch.equal(x.grad, _reference(w, [4, 1, 3]))
    assert [given for given, _ in rows.calls] == [[4, 1, 3], [4, 1, 3]] and not gathered


def test_an_expanded_gradient_is_made_contiguous_for_the_kernel(rows, gathered):
    x = torch.randn(4, 3, 2, requires_grad=True)
    stacks._reversed(x, rows, torch.tensor([2, 4, 1])).sum().backward()  # (a gradient of stride 0)
    assert torch.equal(x.grad, torch.ones(4, 3, 2))
    assert [strides for _, strides in rows.calls] == [(6, 2, 1), (6, 2, 1)] and not gathered


def test_a_tensor_the_kernel_turns_down_is_reversed_by_the_gather(rows, gathered):
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    assert torch.equal(stacks._reversed(x, rows, torch.tensor([3, 5])), _reference(x, [3, 5]))
    assert gathered == [torch.float64]


def test_off_a_gpu_the_reversal_is_the_gather_and_without_lengths_a_flip():
    x = torch.randn(5, 2, 3)
    assert torch.equal(stacks._reversal(torch.tensor([3, 5]), x)(x), _reference(x, [3, 5]))
    assert torch.equal(stacks._reversal(None, x)(x), x.flip(0))
