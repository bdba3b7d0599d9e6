"""A PackedSequence padded and packed back by the packed rows' kernels on a GPU (nn.packed_sequences),
launched by the C++ and by Python, against torch's ops (the path the CPU takes): x, the steps-left state,
y packed back and the gradients through both, for float32 and bfloat16, short and long sequences; and
the drop-in's kept call of a PackedSequence: batches of other lengths, hx, a training step and a CUDA
graph capture, against cuDNN."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from cellfuse.graph_model import CellError
from cellfuse.nn import LSTM, packed_sequences, row_kernels, stacks
from cellfuse.nn.packed_sequences import Unpacked
from cellfuse.nn.quick_lane import module as lane_module

pytestmark = pytest.mark.gpu


def _packed(cuda, T, B, width, dtype=torch.float32, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[int(torch.randint(0, B, (1,), generator=g))] = T
    x = torch.randn(T, B, width, generator=g).to(cuda, dtype).requires_grad_(requires_grad)
    return pack_padded_sequence(x, lengths, enforce_sorted=False), x, lengths


def _unpacked(packed, hidden, layers):
    out = Unpacked(packed)
    out.pad(hidden, layers)
    return out


def _by_python(packed, hidden, layers):
    """An Unpacked whose kernels Python launches (where the C++ is not built, or leaves a call to it)."""
    out = Unpacked(packed)
    out._rows._fast = None
    out.pad(hidden, layers)
    return out


def _by_torch(packed, hidden, layers):
    """An Unpacked made by torch's ops, as on the CPU."""
    saved = packed_sequences.rows_kernels
    packed_sequences.rows_kernels = lambda data, count: None
    try:
        return _unpacked(packed, hidden, layers)
    finally:
        packed_sequences.rows_kernels = saved


@pytest.mark.parametrize("T, B, width, dtype", [(9, 6, 24, torch.float32), (100, 64, 512, torch.float32),
                                                (1000, 8, 40, torch.float32), (37, 5, 16, torch.bfloat16),
                                                (9, 6, 7, torch.float32), (11, 3, 13, torch.bfloat16)])
def test_the_kernels_pad_and_pack_as_torchs_ops(cuda, T, B, width, dtype):
    """Rows of 16-byte words and rows of single elements (widths of 7 and 13: 28 and 26 bytes)."""
    packed, _, lengths = _packed(cuda, T, B, width, dtype)
    want = _by_torch(packed, 48, 3)
    assert want._rows is None
    y = torch.randn(want.x.shape[0], B, 48, device=cuda).to(dtype)
    expected = want.pack(y)
    for ours in (_unpacked(packed, 48, 3), _by_python(packed, 48, 3)):  # (launched by the C++, by Python)
        assert ours._rows is not None
        assert ours.x.shape[0] % packed_sequences.STEPS_MULTIPLE == 0
        assert torch.equal(ours.x, want.x)
        assert ours.steps.dtype == want.steps.dtype == torch.float32 and torch.equal(ours.steps, want.steps)
        assert torch.equal(ours.steps[0, :, 0].cpu().long(), lengths.sort(descending=True).values)
        got = ours.pack(y)
        assert torch.equal(got.data, expected.data)
        assert torch.equal(got.batch_sizes, expected.batch_sizes)
    assert _unpacked(packed, 48, 3)._rows._fast is not None, "the C++ that launches the kernels is not built"


def _rows_of_own_lengths(cuda, T, B, width, dtype, batch_first):
    """x [T, B, width] on the GPU (a batch-first tensor's transposed view where `batch_first`), each row's
    length from 1 to T (the first T), and the generator that drew them, seeded by T."""
    g = torch.Generator().manual_seed(T)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    given = torch.randn(B, T, width, generator=g) if batch_first else torch.randn(T, B, width, generator=g)
    x = given.to(cuda, dtype)
    return (x.transpose(0, 1) if batch_first else x), lengths, g


@pytest.mark.parametrize("T, B, width, hidden, layers, dtype, batch_first", [
    (9, 6, 24, 8, 1, torch.float32, False), (100, 64, 512, 512, 2, torch.float32, True),
    (1000, 8, 40, 33, 1, torch.float32, False), (37, 5, 16, 16, 1, torch.bfloat16, True),
    (11, 3, 13, 7, 3, torch.float16, False)])
def test_the_zeroing_kernel_zeroes_the_padding_and_makes_the_steps_left_state_as_torchs_ops(
        cuda, T, B, width, hidden, layers, dtype, batch_first):
    """stacks.lengths_applied by cf_zero_rows (the padding NaN: none of it may be carried) against torch's
    ops, bit for bit; a batch-first x read where it is (its strides)."""
    x, lengths, _ = _rows_of_own_lengths(cuda, T, B, width, dtype, batch_first)
    ended = torch.arange(T).view(T, 1) >= lengths.view(1, B)
    x[ended.to(cuda)] = float("nan")
    with torch.no_grad():
        zeroed, steps, checked = stacks.lengths_applied(x, lengths, layers, hidden)
    assert checked is lengths and zeroed.is_contiguous() and steps.dtype == torch.float32
    want = stacks.padding_zeroed(x, lengths, stacks.steps_left(lengths, layers, x, hidden))
    assert torch.equal(zeroed, want) and not zeroed.isnan().any()
    assert torch.equal(steps, stacks.steps_left(lengths, layers, x, hidden))
    # lengths that are not 1 to T: the kernel's C++ turns them down, and torch's ops' check says why
    stream = torch.cuda.current_stream(cuda).cuda_stream
    rows = row_kernels.rows_kernels(x, B)[1]
    assert rows.zeroed(x, torch.zeros(B, dtype=torch.long), hidden, layers, stream) is None
    with pytest.raises(CellError, match="lengths must be from 1"):
        stacks.lengths_applied(x, torch.zeros(B, dtype=torch.long), layers, hidden)
    # every row T long: x itself, as torch's ops give it
    full = torch.full((B,), T)
    with torch.no_grad():
        same, steps, _ = stacks.lengths_applied(x, full, layers, hidden)
    assert same is x and torch.equal(steps, stacks.steps_left(full, layers, x, hidden))


@pytest.mark.parametrize("T, B, width, dtype, batch_first", [
    (9, 5, 32, torch.float32, False), (100, 64, 1024, torch.float32, True),
    (11, 3, 13, torch.bfloat16, False), (7, 4, 6, torch.float16, True)])
def test_the_reversal_kernel_reverses_each_row_within_its_length_as_the_gather(cuda, T, B, width, dtype,
                                                                               batch_first, monkeypatch):
    """stacks._reversal by cf_reverse_rows against its gather, bit for bit (a batch-first x read where it
    is); twice is the identity; the gradients through its autograd node the gather's, a sum's too (an
    expanded gradient, made contiguous for the kernel, not gathered); rows all T long, a flip; and a
    tensor the kernel turns down, by the gather."""
    x, lengths, g = _rows_of_own_lengths(cuda, T, B, width, dtype, batch_first)
    reverse, gather = stacks._reversal(lengths, x), stacks._gathered(lengths, x)
    assert reverse.func is stacks._reversed
    got = reverse(x)
    assert got.is_contiguous() and torch.equal(got, gather(x)) and torch.equal(reverse(got), x)
    full = torch.full((B,), T)
    assert torch.equal(stacks._reversal(full, x)(x), x.flip(0))
    x.requires_grad_(True)
    w = torch.randn(T, B, width, generator=g).to(cuda, dtype)
    gathered, by_index = [], stacks._gathered

    def spied(*args):
        gathered.append(args[1].dtype)
        return by_index(*args)
    monkeypatch.setattr(stacks, "_gathered", spied)
    for loss in (lambda y: (y * w).float().sum(), lambda y: y.sum()):
        (grad,) = torch.autograd.grad(loss(reverse(x)), x)
        (want,) = torch.autograd.grad(loss(gather(x)), x)
        assert torch.equal(grad, want)
    assert not gathered
    stream = torch.cuda.current_stream(cuda).cuda_stream
    rows = reverse.keywords["rows"]
    assert rows.reversed(x.detach(), torch.zeros(B, dtype=torch.long), stream) is None
    wide = x.detach().double()  # (elements of 8 bytes: the kernel turns them down)
    assert torch.equal(stacks._reversed(wide, rows, lengths), gather(wide)) and gathered == [torch.float64]


@pytest.mark.parametrize("lengths", [[6, 2, 4], [6, 6, 6]])
def test_an_x_that_needs_a_gradient_gets_none_in_its_padding_by_the_kernel_as_by_torchs_ops(cuda, lengths,
                                                                                           monkeypatch):
    """Through the kernel's autograd node: the zeroed x and its gradient (a contiguous one zeroed by the
    kernel; one of stride 0, which it turns down, by torch's ops) as torch's ops give them; rows all T
    long, x itself, with no node."""
    full = lengths == [6] * 3
    lengths = torch.tensor(lengths)
    w = torch.randn(6, 3, 4, device=cuda)
    by_torch, torchs = [], stacks._by_torch

    def spied(*args):
        by_torch.append(args[0].shape)
        return torchs(*args)
    for loss, backward_by_torch in ((lambda z: (z * w).sum(), False), (lambda z: z.sum(), not full)):
        grads = []
        for kernel in (True, False):
            x = torch.randn(6, 3, 4, generator=torch.Generator().manual_seed(0)).to(cuda).requires_grad_()
            if kernel:
                monkeypatch.setattr(stacks, "_by_torch", spied)
                zeroed, steps, _ = stacks.lengths_applied(x, lengths, 2, 5)
                assert zeroed is x if full else type(zeroed.grad_fn).__name__ == "_ZeroedBackward"
                loss(zeroed).backward()
                monkeypatch.setattr(stacks, "_by_torch", torchs)
                assert len(by_torch) == backward_by_torch
                by_torch.clear()
            else:
                zeroed, steps, _ = stacks._by_torch(x, lengths, 2, 5)
                loss(zeroed).backward()
            assert not steps.requires_grad
            grads.append((zeroed.detach(), steps, x.grad))
        for got, want in zip(*grads, strict=True):
            assert torch.equal(got, want)
    with pytest.raises(CellError, match="lengths must be from 1"):
        stacks.lengths_applied(torch.randn(6, 3, 4, device=cuda, requires_grad=True), torch.tensor([7, 1, 1]),
                               1, 5)


def test_rows_of_no_elements_are_padded_by_torchs_ops(cuda):
    """Data of width 0 (torch's packing refuses it and the modules an input size of 0: only a
    PackedSequence made by hand gives it) is left to torch's ops, whose padding and steps-left state it
    gets."""
    packed, _, lengths = _packed(cuda, 9, 4, 1)
    packed = packed._replace(data=packed.data[:, :0])
    ours = _unpacked(packed, 48, 1)
    assert ours._rows is None
    assert ours.x.shape == (12, 4, 0)
    assert torch.equal(ours.steps[0, :, 0].cpu().long(), lengths.sort(descending=True).values)


def test_gradients_flow_through_the_kernels_as_through_torchs_ops(cuda):
    packed, x, _ = _packed(cuda, 23, 7, 12, requires_grad=True)
    weight = torch.randn(12, 12, device=cuda)
    grads = []
    for make in (_unpacked, _by_torch):
        unpacked = make(packed, 12, 1)
        out = unpacked.pack(torch.tanh(unpacked.x @ weight))
        grads.append(torch.autograd.grad(out.data.square().sum(), x, retain_graph=True)[0])
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)
    padded, _ = pad_packed_sequence(packed)  # (rows past their lengths get no gradient)
    assert grads[0][padded.shape[0]:].abs().sum() == 0


def _cudnn(ours, cuda):
    ref = torch.nn.LSTM(ours.input_size, ours.hidden_size, ours.num_layers).to(cuda)
    ref.load_state_dict(ours.state_dict())
    return ref


def test_the_kept_call_of_a_packed_sequence_runs_batches_of_other_lengths(cuda):
    """Batches of the same padded steps and batch, their lengths each their own: every call after the
    first is the kept one, and each matches cuDNN, with and without hx."""
    torch.manual_seed(0)
    ours = LSTM(32, 48, num_layers=2).to(cuda)
    ref = _cudnn(ours, cuda)
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        for seed in range(4):
            packed, _, _ = _packed(cuda, 20, 6, 32, seed=seed)
            hx = None if seed % 2 else tuple(torch.randn(2, 6, 48, device=cuda) for _ in range(2))
            kept = ours._quick_packed
            (y, (h, c)), (want_y, (want_h, want_c)) = ours(packed, hx), ref(packed, hx)
            if seed:
                assert ours._quick_packed is kept is not None  # (made by the call before, used)
            torch.testing.assert_close(y.data, want_y.data, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(h, want_h, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(c, want_c, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("given", [False, True])
def test_a_kept_training_call_of_a_packed_sequence_gives_cudnns_gradients(cuda, given):
    """The kept training calls of PackedSequences (their rows out of the batch's order) pad and pack in
    the ops' node (packed_sequences.Ends): y, the final states and the gradients of x, the parameters and
    any initial states given are cuDNN's."""
    torch.manual_seed(1)
    ours = LSTM(32, 48).to(cuda)
    ref = _cudnn(ours, cuda)
    for seed in range(3):
        packed, x, _ = _packed(cuda, 16, 5, 32, seed=seed, requires_grad=True)
        hx = (tuple(torch.randn(1, 5, 48, device=cuda, requires_grad=True) for _ in range(2)) if given
              else None)
        kept = ours._quick_packed
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            (y, (h, c)), (want_y, (want_h, want_c)) = ours(packed, hx), ref(packed, hx)
            wrt = [x, *ours.parameters(), *(hx or ())]
            got = torch.autograd.grad(y.data.square().sum() + h.sum() + c.square().sum(), wrt,
                                      retain_graph=True)
            wrt = [x, *ref.parameters(), *(hx or ())]
            want = torch.autograd.grad(want_y.data.square().sum() + want_h.sum() + want_c.square().sum(), wrt)
        if seed:  # (the kept call: one node of autograd's graph pads, runs, packs and reorders)
            assert ours._quick_packed is kept is not None
            assert type(y.data.grad_fn).__name__ == type(h.grad_fn).__name__ == "_EagerBackward"
        for a, b in ((y.data, want_y.data), (h, want_h), (c, want_c), *zip(got, want, strict=True)):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


def test_a_16_bit_modules_packed_calls_are_kept_with_the_whole_paths_results(cuda):
    """A module in bfloat16 keeps its PackedSequence calls as a float32 one does (its steps-left state
    float32 beside the 16-bit states): the inference call and the training step like the one before are
    made by the kept call, the training step in one node of autograd's graph, with the whole path's
    results."""
    torch.manual_seed(4)
    ours = LSTM(32, 48).to(cuda, torch.bfloat16)

    def infer(packed):
        with torch.no_grad():
            y, (h, c) = ours(packed)
        return [y.data, h, c]

    def train(packed, x):
        y, (h, c) = ours(packed)
        loss = y.data.float().square().sum() + h.float().sum() + c.float().square().sum()
        # (the graph kept: x's packing, made once, is part of each step's)
        return [y.data, h, c, *torch.autograd.grad(loss, [x, *ours.parameters()], retain_graph=True)], \
            y.data.grad_fn

    for seed in range(3):  # (batches of their own lengths, the same padded steps)
        packed, x, _ = _packed(cuda, 16, 5, 32, torch.bfloat16, seed=seed, requires_grad=True)
        ours._quick_packed = None
        want = infer(packed)  # (the whole path)
        assert ours._quick_packed is not None
        kept = ours._quick_packed
        got = infer(packed)
        assert ours._quick_packed is kept
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        ours._quick_packed = None
        want, _ = train(packed, x)
        kept = ours._quick_packed
        assert kept is not None
        got, grad_fn = train(packed, x)
        assert ours._quick_packed is kept and type(grad_fn).__name__ == "_EagerBackward"
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("kind", ["drop-in", "CellRNN"])
def test_packed_calls_under_autocast_are_kept_with_the_whole_paths_results(cuda, kind):
    """Under torch.autocast a float32 module keeps its PackedSequence calls (the padding cast to bf16 as
    the whole path casts it, the steps-left state left float32): the inference call and the training
    step like the one before are made by the kept call, with the whole path's results; a call without
    autocast after them is not (it is not like them) and runs in float32."""
    from cellfuse.nn import CellRNN

    torch.manual_seed(5)
    ours = (LSTM(32, 48) if kind == "drop-in" else CellRNN("lstm", 32, 48)).to(cuda)

    def call(packed):
        y, finals = ours(packed)
        return [y.data, *(finals if kind == "drop-in" else finals.values())]

    def infer(packed):
        with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
            return call(packed)

    def train(packed, x):
        with torch.autocast("cuda", torch.bfloat16):
            got = call(packed)
        loss = sum(t.float().square().sum() for t in got)
        # (the graph kept: x's packing, made once, is part of each step's)
        return [*got, *torch.autograd.grad(loss, [x, *ours.parameters()], retain_graph=True)]

    for seed in range(3):  # (batches of their own lengths, the same padded steps)
        packed, x, _ = _packed(cuda, 16, 5, 32, seed=seed, requires_grad=True)
        ours._quick_packed = None
        want = infer(packed)  # (the whole path)
        kept = ours._quick_packed
        assert kept is not None and want[0].dtype == torch.bfloat16
        got = infer(packed)
        assert ours._quick_packed is kept
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        with torch.no_grad():
            assert call(packed)[0].dtype == torch.float32  # (autocast off: not the kept call's)
        ours._quick_packed = None
        want = train(packed, x)
        kept = ours._quick_packed
        assert kept is not None
        got = train(packed, x)
        assert ours._quick_packed is kept
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)


def test_a_packed_forward_is_captured_and_replayed(cuda):
    """A CUDA graph capture of the module's call of a PackedSequence (the kernels loaded by a call before
    it): replayed over new contents of the same lengths, it gives cuDNN's result for them."""
    torch.manual_seed(2)
    ours = LSTM(32, 48).to(cuda)
    ref = _cudnn(ours, cuda)
    packed, _, lengths = _packed(cuda, 12, 4, 32)
    data = packed.data.clone()
    static = packed._replace(data=data)
    with torch.no_grad():
        ours(static), ours(static)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            y, (h, c) = ours(static)
        torch.cuda.current_stream().wait_stream(stream)
        data.copy_(torch.randn_like(data))
        graph.replay()
        torch.cuda.synchronize()
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            want_y, (want_h, _) = ref(static)
    torch.testing.assert_close(y.data, want_y.data, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(h, want_h, rtol=1e-4, atol=1e-5)


def test_the_lane_pads_a_packed_sequence_and_replays_its_run(cuda, settled_memory):
    """A kept PackedSequence call with no hx, made by the C++ lane (its data padded there by the kernel,
    the run replayed): the lane makes it where a call of the module taught it the run over the same
    memory, and its result is cuDNN's, for lengths of its own. (Small tensors' memory wanders among the
    caching allocator's blocks as batches of other lengths come and go: not every call finds a run.)"""
    if lane_module() is None:
        pytest.fail("the C++ lane could not be built (see the warning logged)")
    torch.manual_seed(3)
    ours = LSTM(32, 48, num_layers=2, schedule="persistent").to(cuda)  # (a run in one piece: see quick_call)
    ref = _cudnn(ours, cuda)
    layout = (ours.schedule, ours.batch_first, ours.training, ours.dropout)  # (the module's)
    made, padded_here = [], []  # (`settled_memory`: among a worker's other tests, every call was once
    # left to Python)
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        for seed in range(8):
            packed, _, _ = _packed(cuda, 20, 6, 32, seed=seed)
            for _ in range(2):  # (the module's calls: the second, over the first's memory where the caching
                ours(packed)  # allocator gives it back, replays the run and teaches the lane it)
            unpacked = Unpacked(packed)
            done = ours._quick_packed.packed(unpacked, packed, layout, ours._fused_params(), None, 48, 2)
            assert done is not None  # (by the lane, or padded here where the lane left it)
            if unpacked.x is not None:
                padded_here.append(seed)
                continue
            made.append(seed)
            y, finals = done
            want_y, (want_h, want_c) = ref(packed)
            torch.testing.assert_close(y.data, want_y.data, rtol=1e-4, atol=1e-5)
            h, c = finals
            torch.testing.assert_close(h, want_h, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(c, want_c, rtol=1e-4, atol=1e-5)
    assert made, padded_here


def test_a_cellrnns_kept_call_of_a_packed_sequence_matches_its_call_with_lengths(cuda):
    """CellRNN keeps a PackedSequence's call as the drop-ins do: the calls after the first are the kept
    one (by the lane or not), each as the same rows given padded with their lengths."""
    from cellfuse.nn import CellRNN

    rnn = CellRNN("gru", 32, 48, 1, schedule="persistent", seed=3).to(cuda)
    with torch.no_grad():
        for seed in range(4):
            packed, x, lengths = _packed(cuda, 20, 6, 32, seed=seed)
            kept = rnn._quick_packed
            y, finals = rnn(packed)
            if seed:
                assert rnn._quick_packed is kept is not None
            want_y, want = rnn(x, lengths=lengths)
            torch.testing.assert_close(pad_packed_sequence(y)[0], want_y, rtol=0, atol=1e-6)
            for state, value in finals.items():
                torch.testing.assert_close(value, want[state], rtol=0, atol=1e-6)


@pytest.mark.parametrize("batch_first", [False, True])
def test_a_cellrnns_training_calls_with_lengths_give_a_packed_sequences_gradients(cuda, batch_first):
    """Training calls of rows of their own lengths, x needing a gradient and NaN in its padding (the
    first by the whole path, the next by the kept call, each through the zeroing kernel's autograd
    node): y, x's gradient (none in the padding) and the parameters' are those of the same rows given as
    a PackedSequence (padded by the packed rows' kernels, in its own order of rows)."""
    from cellfuse.nn import CellRNN

    rnn = CellRNN("lstm", 32, 48, 1, schedule="persistent", batch_first=batch_first, seed=3).to(cuda)
    for seed in range(3):
        packed, x, lengths = _packed(cuda, 20, 6, 32, seed=seed)
        ended = (torch.arange(20).view(20, 1) >= lengths.view(1, 6)).to(cuda)
        x = x.clone()
        x[ended] = float("nan")
        given = (x.transpose(0, 1) if batch_first else x).detach().requires_grad_()
        kept = rnn._quick_lengths
        y, _ = rnn(given, lengths=lengths)
        if seed:  # (made by the kept call: the whole path would have kept a new one)
            assert rnn._quick_lengths is kept is not None
        y.square().sum().backward()
        grads = [p.grad.clone() for p in rnn.parameters()]
        rnn.zero_grad()
        data = packed.data.detach().requires_grad_()
        y_packed, _ = rnn(packed._replace(data=data))
        y_packed.data.square().sum().backward()
        dx = given.grad.transpose(0, 1) if batch_first else given.grad
        assert not dx.isnan().any() and not dx[ended].any()
        torch.testing.assert_close(y.transpose(0, 1) if batch_first else y, pad_packed_sequence(y_packed)[0],
                                   rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(pack_padded_sequence(dx, lengths, enforce_sorted=False).data, data.grad,
                                   rtol=1e-5, atol=1e-6)
        for got, p in zip(grads, rnn.parameters(), strict=True):
            torch.testing.assert_close(got, p.grad, rtol=1e-4, atol=1e-5)
        rnn.zero_grad()


@pytest.mark.parametrize("batch_first, mode", [(False, "float32"), (True, "float32"), (False, "states given"),
                                               (False, "autocast"), (True, "bf16 x")])
def test_a_cellrnns_kept_call_of_rows_of_their_own_lengths_gives_the_whole_paths_results(cuda, batch_first,
                                                                                          mode):
    """CellRNN keeps a call with lengths apart from its plain one: the calls after the first, of other
    lengths and NaN in their padding, are the kept one (by the lane or not), in inference and in
    training, with the whole path's outputs, final states and gradients: float32, every initial state
    given, under torch.autocast to bf16, and a bf16 x."""
    from cellfuse.nn import CellRNN

    rnn = CellRNN("lstm", 32, 48, 2, schedule="persistent", seed=3, batch_first=batch_first).to(cuda)
    sixteen = mode in ("autocast", "bf16 x")
    tolerance = {"rtol": 0, "atol": 1e-2 if sixteen else 1e-6}

    def whole(x, lengths, states):
        kept = rnn._quick_lengths
        rnn._quick_lengths = None
        try:
            return rnn(x, states, lengths)
        finally:
            rnn._quick_lengths = kept
    params = list(rnn.parameters())
    for train in (False, True):
        autocast = mode == "autocast"
        with torch.set_grad_enabled(train), torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            for seed in range(4):
                g = torch.Generator().manual_seed(seed)
                lengths = torch.randint(1, 21, (6,), generator=g)
                x = torch.randn(20, 6, 32, generator=g)
                x[-1, lengths < 20] = float("nan")
                x = (x.transpose(0, 1) if batch_first else x).to(cuda)
                if mode == "bf16 x":
                    x = x.to(torch.bfloat16)
                states = ({s: torch.randn(2, 6, 48, generator=g).to(cuda) for s in rnn.state_ids}
                          if mode == "states given" else None)
                kept = rnn._quick_lengths
                y, finals = rnn(x, states, lengths)
                if seed:
                    assert rnn._quick_lengths is kept is not None
                want_y, want = whole(x, lengths, states)
                assert y.dtype == want_y.dtype and torch.isfinite(y).all()
                torch.testing.assert_close(y, want_y, **tolerance)
                for state, value in finals.items():
                    torch.testing.assert_close(value, want[state], **tolerance)
                if train:
                    grads = torch.autograd.grad(y.float().square().sum(), params)
                    for a, b in zip(grads, torch.autograd.grad(want_y.float().square().sum(), params),
                                    strict=True):
                        torch.testing.assert_close(a, b, rtol=1e-3 if sixteen else 1e-5, atol=1e-6)


def test_a_packed_sequence_under_autocast_is_packed_back_by_the_kernels_for_its_outputs_dtype(cuda):
    """Under torch.autocast the data is float32 and y bfloat16: y is packed back by the kernels for
    2-byte elements, forward and in training, as cuDNN gives it."""
    torch.manual_seed(4)
    ours = LSTM(32, 48).to(cuda)
    ref = _cudnn(ours, cuda)
    packed, x, _ = _packed(cuda, 20, 6, 32, requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        with torch.no_grad():
            y, want = ours(packed)[0], ref(packed)[0]
        assert y.data.dtype == torch.bfloat16 and y.data.shape == want.data.shape
        torch.testing.assert_close(y.data.float(), want.data.float(), rtol=0, atol=3e-2)
        trained = ours(packed)[0]
    (grad,) = torch.autograd.grad(trained.data.float().square().sum(), x)
    assert grad.shape == x.shape and torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_a_training_calls_padding_is_freed_without_the_cycle_collector(cuda):
    """Nothing of a training call's padding outlives its backward pass waiting for Python's cycle
    collector: with it off, the GPU memory held after a step is the same from step to step."""
    import gc

    torch.manual_seed(5)
    ours = LSTM(32, 48).to(cuda)
    given, _, _ = _packed(cuda, 20, 6, 32)
    packed = given._replace(data=given.data.requires_grad_())  # (a leaf: each step a graph of its own)
    held = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(4):
            y, _ = ours(packed)
            y.data.square().sum().backward()
            del y
            torch.cuda.synchronize()
            held.append(torch.cuda.memory_allocated())
    finally:
        gc.enable()
    assert held[1] == held[2] == held[3], held


def test_the_tensor_rung_runs_rows_of_their_own_lengths_as_cudnn(cuda):
    """64 rows of lengths from 60 down to 3 (four tiles of sixteen rows on tensor cores, ending at steps
    of their own) under the tensor rung: two layers' outputs, final states and every gradient of a
    training step as cuDNN's, and an inference call's as the training call's."""
    torch.manual_seed(2)
    ours = LSTM(64, 128, num_layers=2, schedule="tensor").to(cuda)
    ref = _cudnn(ours, cuda)
    lengths = torch.linspace(60, 3, 64).round().long()
    x = torch.randn(60, 64, 64, device=cuda, requires_grad=True)
    packed = pack_padded_sequence(x, lengths)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        (y, (h, c)), (want_y, (want_h, want_c)) = ours(packed), ref(packed)
        got = torch.autograd.grad(y.data.square().sum() + h.sum() + c.sum(), [x, *ours.parameters()],
                                  retain_graph=True)  # (the packing's graph is both modules')
        want = torch.autograd.grad(want_y.data.square().sum() + want_h.sum() + want_c.sum(),
                                   [x, *ref.parameters()])
        with torch.no_grad():
            inferred, (inferred_h, inferred_c) = ours(packed)
    for a, b in ((y.data, want_y.data), (h, want_h), (c, want_c)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)
    for a, b in ((inferred.data, y.data), (inferred_h, h), (inferred_c, c)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
