"""A training call of the ops that pads a PackedSequence's data and packs y back inside its own autograd
node (packed_sequences.Ends, as the kept calls of PackedSequences make them on a GPU), on the CPU in
float64: with the kernels' padding and packing stood in for by torch's ops, y, the final states and every
gradient are those of the call through the module's whole path."""

from __future__ import annotations

import torch
from torch.nn.utils.rnn import pack_padded_sequence

from cellfuse.nn import LSTM, ops
from cellfuse.nn.packed_sequences import Ends, Unpacked
from cellfuse.nn.stacks import steps_left


class _TorchRows:
    """What packed_sequences._Rows does with the kernels, by torch's ops (Unpacked's, as on the CPU)."""

    def __init__(self, unpacked: Unpacked):
        self.unpacked = unpacked

    def padded(self, data, steps, hidden=1, state_layers=0):
        x = self.unpacked._positions_padded(data)
        assert x.shape[0] == steps
        return x, steps_left(self.unpacked.lengths, state_layers, x, hidden) if state_layers else None

    def packed(self, y):
        u = self.unpacked
        return y[:u._steps].reshape(-1, *y.shape[2:]).index_select(0, u._at)


def test_a_packed_call_in_one_node_is_the_whole_paths():
    torch.manual_seed(3)
    T, B, W, H = 9, 5, 6, 7
    lstm = LSTM(W, H).double()
    lengths = torch.tensor([4, 9, 2, 9, 6])  # (out of order: the states are reordered both ways)
    x = torch.randn(T, B, W, dtype=torch.float64)
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    data = packed.data.detach().requires_grad_()
    packed = packed._replace(data=data)
    hx = [torch.randn(1, B, H, dtype=torch.float64, requires_grad=True) for _ in range(2)]

    def loss(y_data, h, c):
        return (y_data.square().sum() + (h * torch.arange(B).view(1, B, 1)).sum() + c.square().sum())

    y, (h, c) = lstm(packed, hx)
    wrt = [data, *hx, *lstm.parameters()]
    want = [y.data, h, c, *torch.autograd.grad(loss(y.data, h, c), wrt)]

    unpacked = Unpacked(packed)
    ends = Ends(_TorchRows(unpacked), unpacked._steps, H, 1, packed.sorted_indices, packed.unsorted_indices)
    out = ops.run(data, hx, lstm._fused_params(), ops.masked_text(lstm._cell_text), H, 1, "fused", True,
                  float32=ops.masked_float32(ops.DEFAULT_FLOAT32), ends=ends)
    assert len(out) == 4  # y's data, h, c and the reserve: no steps-left state
    got = [*out[:3], *torch.autograd.grad(loss(*out[:3]), wrt)]
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
