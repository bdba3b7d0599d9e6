"""Sequences of their own lengths through the modules, on the CPU (float64): the drop-ins given a
PackedSequence against torch.nn.LSTM / GRU given the same (outputs, final states, every gradient), for
layers x directions x sorted or not; CellRNN's `lengths` against each row run alone; and the errors."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from cellfuse.graph_model import CellError
from cellfuse.nn import GRU, LSTM, CellRNN, packed_sequences
from cellfuse.nn.zeros import Zeros

T, B, INPUT, H = 7, 4, 5, 6


@pytest.mark.parametrize("cls, torch_cls", [(LSTM, torch.nn.LSTM), (GRU, torch.nn.GRU)])
@pytest.mark.parametrize("layers, bidirectional, enforce_sorted, batch_first",
                         list(itertools.product((1, 3), (False, True), (False, True), (False, True))))
def test_packed_sequences_match_torch(cls, torch_cls, layers, bidirectional, enforce_sorted, batch_first):
    """A PackedSequence in, one out, whatever the modules' batch_first (which a packed input ignores) and
    however the sequence was packed (batch first or not)."""
    torch.manual_seed(layers + 2 * bidirectional)
    options = {"num_layers": layers, "bidirectional": bidirectional, "batch_first": batch_first}
    ours, ref = cls(INPUT, H, **options).double(), torch_cls(INPUT, H, **options).double()
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(*((B, T) if batch_first else (T, B)), INPUT, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([7, 5, 3, 1] if enforce_sorted else [3, 7, 1, 5])
    packed = pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=enforce_sorted)
    # initial states in the batch's order, which differs from the packed rows' where not sorted
    hx = [torch.randn(layers * (1 + bidirectional), B, H, dtype=torch.float64, requires_grad=True)
          for _ in range(2 if cls is LSTM else 1)]
    given = tuple(hx) if cls is LSTM else hx[0]
    (y, states), (want_y, want_states) = ours(packed, given), ref(packed, given)
    states, want_states = ((s if isinstance(s, tuple) else (s,)) for s in (states, want_states))
    assert torch.equal(y.batch_sizes, want_y.batch_sizes)
    torch.testing.assert_close(y.data, want_y.data, rtol=0, atol=1e-10)
    for got, want in zip(states, want_states, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    loss, want_loss = (out.data.square().sum() + sum(s.sum() for s in ss)
                       for out, ss in ((y, states), (want_y, want_states)))
    got = torch.autograd.grad(loss, [x, *hx, *ours.parameters()], retain_graph=True)
    want = torch.autograd.grad(want_loss, [x, *hx, *ref.parameters()])
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-9)


@pytest.mark.parametrize("name", ["lstm", "slstm"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_cell_rnn_lengths_give_each_row_what_it_gives_alone(name, bidirectional):
    rnn = CellRNN(name, 4, 8, 2, seed=3, bidirectional=bidirectional, batch_first=True).double()
    x = torch.randn(3, 6, 4, dtype=torch.float64)
    lengths = [2, 6, 4]
    y, states = rnn(x, lengths=lengths)
    for b, n in enumerate(lengths):
        alone, alone_states = rnn(x[b:b + 1, :n])
        torch.testing.assert_close(y[b, :n], alone[0], rtol=0, atol=1e-12)
        assert (y[b, n:] == 0).all()
        for state, value in alone_states.items():
            torch.testing.assert_close(states[state][:, b], value[:, 0], rtol=0, atol=1e-12)
    packed_y, packed_states = rnn(pack_padded_sequence(x, torch.tensor(lengths), batch_first=True,
                                                       enforce_sorted=False))
    padded, got_lengths = pad_packed_sequence(packed_y, batch_first=True)
    torch.testing.assert_close(padded, y)
    assert got_lengths.tolist() == lengths


@pytest.mark.parametrize("bidirectional", [False, True])
def test_cell_rnn_lengths_read_nothing_of_the_padding(bidirectional):
    """NaN and infinities past the rows' lengths (the padding of torch.empty, say) change nothing: the
    outputs, final states and gradients of the zero-padded batch, the padding's gradient zero."""
    rnn = CellRNN("lstm", 4, 8, 2, seed=5, bidirectional=bidirectional, batch_first=True).double()
    lengths = [2, 6, 4]
    x = torch.randn(3, 6, 4, dtype=torch.float64)
    padded = x.clone()
    for b, n in enumerate(lengths):
        x[b, n:] = 0.0
        padded[b, n:] = float("nan") if b % 2 else float("inf")
    outs = []
    for given in (x, padded):
        given = given.clone().requires_grad_()
        y, states = rnn(given, lengths=lengths)
        loss = y.square().sum() + sum(v.sum() for v in states.values())
        outs.append((y, states, torch.autograd.grad(loss, [given, *rnn.parameters()])))
    (y, states, grads), (got_y, got_states, got_grads) = outs
    torch.testing.assert_close(got_y, y, rtol=0, atol=0)
    for state, value in states.items():
        torch.testing.assert_close(got_states[state], value, rtol=0, atol=0)
    for a, b in zip(got_grads, grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert all((got_grads[0][b, n:] == 0).all() for b, n in enumerate(lengths))


@pytest.mark.parametrize("lengths, message", [
    ([0, 3, 2], "lengths must be from 1 to the sequence's length 5, got 0 to 3"),
    ([1, 6, 2], "lengths must be from 1 to the sequence's length 5, got 1 to 6"),
    ([1, 2], r"lengths has shape \[2\], expected \[3\]"),
    (torch.tensor([1.0, 2.0, 3.0]), "lengths must be integers"),
])
def test_bad_lengths_are_refused(lengths, message):
    rnn = CellRNN("gru", 4, 8, seed=1)
    with pytest.raises(CellError, match=message):
        rnn(torch.randn(5, 3, 4), lengths=lengths)


def test_lengths_given_twice_are_refused():
    rnn = CellRNN("gru", 4, 8, seed=1)
    packed = pack_padded_sequence(torch.randn(5, 2, 4), torch.tensor([5, 3]))
    with pytest.raises(CellError, match="lengths are given twice"):
        rnn(packed, lengths=[5, 3])


def test_dropout_with_packed_sequences_keeps_the_rows_apart():
    """Dropout between layers draws over the padded tensor (so not torch's draw over the packed one):
    while training, rows still stop at their lengths; in eval mode the outputs are torch's."""
    torch.manual_seed(0)
    ours = LSTM(INPUT, H, num_layers=3, dropout=0.5).double()
    ref = torch.nn.LSTM(INPUT, H, num_layers=3, dropout=0.5).double()
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(T, B, INPUT, dtype=torch.float64)
    packed = pack_padded_sequence(x, torch.tensor([3, 7, 1, 5]), enforce_sorted=False)
    padded, _ = pad_packed_sequence(ours(packed)[0])
    assert (padded[3:, 0] == 0).all() and (padded[1:, 2] == 0).all() and padded[:, 1].abs().min() > 0
    ours.eval(), ref.eval()
    torch.testing.assert_close(ours(packed)[0].data, ref(packed)[0].data, rtol=0, atol=1e-10)


def test_packed_batches_of_nearby_lengths_share_their_runs():
    """A PackedSequence's steps run in multiples of STEPS_MULTIPLE: batches whose longest rows are 5 and 7
    steps long run 8 steps, through one runner, and give what torch gives."""
    from cellfuse.nn import ops, packed_sequences

    assert packed_sequences.STEPS_MULTIPLE == 4
    torch.manual_seed(5)
    ours = LSTM(INPUT, H).double()
    ref = torch.nn.LSTM(INPUT, H).double()
    ref.load_state_dict(ours.state_dict())
    ops._runners.clear()
    for lengths in ([5, 2, 3, 1], [7, 6, 2, 4]):
        packed = pack_padded_sequence(torch.randn(7, B, INPUT, dtype=torch.float64), torch.tensor(lengths),
                                      enforce_sorted=False)
        (y, (h, c)), (want_y, (want_h, want_c)) = ours(packed), ref(packed)
        torch.testing.assert_close(y.data, want_y.data, rtol=0, atol=1e-10)
        torch.testing.assert_close(h, want_h, rtol=0, atol=1e-10)
        torch.testing.assert_close(c, want_c, rtol=0, atol=1e-10)
    # (one runner, kept under `auto`'s name for training calls and its rung's)
    assert {key[1] for key in ops._runners} == {8} and len({id(r) for r in ops._runners.values()}) == 1


def test_a_modules_kept_zeros_are_not_copied_into_the_packed_order():
    x = torch.randn(7, 4, 3)
    packed = pack_padded_sequence(x, torch.tensor([3, 7, 1, 5]), enforce_sorted=False)
    kept = Zeros()((1, 4, 2), torch.float32, torch.device("cpu"))
    given = torch.randn(1, 4, 2)
    same, moved = packed_sequences.Unpacked(packed).sorted([kept, given])
    assert same is kept
    torch.testing.assert_close(moved, given.index_select(1, packed.sorted_indices))


def test_a_packed_sequence_whose_batch_sizes_do_not_add_up_is_refused_by_name():
    from torch.nn.utils.rnn import PackedSequence

    lstm = LSTM(INPUT, H)
    for sizes in ([3, 2, 2], [2, 3], [2, 0]):  # more rows than the data's, growing, an empty step
        bad = PackedSequence(torch.randn(5, INPUT), torch.tensor(sizes))
        with pytest.raises(CellError, match="batch sizes"):
            lstm(bad)


@pytest.mark.parametrize("lengths", [[1], [5], [3, 3, 3], [7, 1, 4, 7, 2], [1, 1, 2], list(range(1, 41))])
def test_a_packed_sequences_rows_lengths_are_read_from_its_batch_sizes(lengths):
    """Unpacked.lengths gives each row's length in the packed order (longest first), as torch's
    pad_packed_sequence reads them, whatever their ties."""
    x = torch.randn(max(lengths), len(lengths), 2)
    packed = pack_padded_sequence(x, torch.tensor(lengths), enforce_sorted=False)
    _, theirs = pad_packed_sequence(packed)
    got = packed_sequences.Unpacked(packed).lengths
    assert got.dtype == torch.int64
    assert torch.equal(got, theirs[packed.sorted_indices])
