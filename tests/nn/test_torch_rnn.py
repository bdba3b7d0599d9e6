"""cellfuse.nn.LSTM and GRU against torch.nn.LSTM and GRU from the same state dict, on the CPU in float64:
outputs, final states and every gradient, for batch_first x bidirectional x layers, with torch's dropout
between layers, without biases, unbatched; and what they refuse."""

from __future__ import annotations

import weakref

import pytest
import torch
import torch.nn.utils.parametrizations
import torch.nn.utils.prune
from weight_drop import WeightDropout

from cellfuse.graph_model import CellError
from cellfuse.nn import GRU, LSTM, CellRNN

PAIRS = {"lstm": (LSTM, torch.nn.LSTM), "gru": (GRU, torch.nn.GRU)}
INPUT, H = 5, 4


def _pair(kind, **options):
    ours_cls, torch_cls = PAIRS[kind]
    ours = ours_cls(INPUT, H, **options).double()
    ref = torch_cls(INPUT, H, **options).double()
    ref.load_state_dict(ours.state_dict())
    return ours, ref


def _finals(kind, states):
    return list(states) if kind == "lstm" else [states]


def _loss(kind, y, states):
    return y.square().sum() + sum((i + 2) * s.sum() for i, s in enumerate(_finals(kind, states)))


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("layers", [1, 3])
def test_outputs_states_and_gradients_are_torchs(kind, batch_first, bidirectional, layers):
    ours, ref = _pair(kind, num_layers=layers, batch_first=batch_first, bidirectional=bidirectional)
    shape = (3, 6, INPUT) if batch_first else (6, 3, INPUT)
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(layers * (2 if bidirectional else 1), 3, H, dtype=torch.float64, requires_grad=True)
    hx = (h0, torch.randn_like(h0)) if kind == "lstm" else h0
    (y, states), (want_y, want_states) = ours(x, hx), ref(x, hx)
    torch.testing.assert_close(y, want_y, rtol=1e-10, atol=1e-12)
    for got, want in zip(_finals(kind, states), _finals(kind, want_states), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    inputs = [x, h0]
    got = torch.autograd.grad(_loss(kind, y, states), [*inputs, *ours.parameters()])
    want = torch.autograd.grad(_loss(kind, want_y, want_states), [*inputs, *ref.parameters()])
    names = ["x", "h0", *(name for name, _ in ours.named_parameters())]
    for name, a, b in zip(names, got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=name)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("bidirectional, batch_first", [(False, False), (True, False), (True, True)])
def test_dropout_between_layers_is_torchs_with_the_same_seed(kind, bidirectional, batch_first):
    ours, ref = _pair(kind, num_layers=3, dropout=0.5, bidirectional=bidirectional, batch_first=batch_first)
    x = torch.randn(6, 3, INPUT, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(7)
    y = ours(x)[0]
    torch.manual_seed(7)
    want = ref(x)[0]
    torch.testing.assert_close(y, want, rtol=1e-10, atol=1e-12)
    got, expected = (torch.autograd.grad(out.square().sum(), [x, *module.parameters()])
                     for out, module in ((y, ours), (want, ref)))
    for a, b in zip(got, expected, strict=True):  # through the same dropped units
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    x = x.detach()
    torch.manual_seed(8)
    assert (ours(x)[0] - y).abs().max() > 1e-3  # another draw, other units dropped
    ours.eval(), ref.eval()
    torch.testing.assert_close(ours(x)[0], ref(x)[0], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_without_biases_and_unbatched(kind):
    ours, ref = _pair(kind, bias=False, num_layers=2)
    assert not any("bias" in name for name, _ in ours.named_parameters())
    x = torch.randn(6, INPUT, dtype=torch.float64)  # [T, input]: no batch
    (y, states), (want_y, want_states) = ours(x), ref(x)
    assert y.shape == (6, H)
    torch.testing.assert_close(y, want_y, rtol=1e-10, atol=1e-12)
    for got, want in zip(_finals(kind, states), _finals(kind, want_states), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_state_dict_loads_both_ways_and_float32_runs(kind):
    ours_cls, torch_cls = PAIRS[kind]
    ref = torch_cls(INPUT, H, num_layers=2, bidirectional=True)
    ours = ours_cls(INPUT, H, num_layers=2, bidirectional=True)
    assert list(ours.state_dict()) == list(ref.state_dict())
    ours.load_state_dict(ref.state_dict())
    back = torch_cls(INPUT, H, num_layers=2, bidirectional=True)
    back.load_state_dict(ours.state_dict())
    x = torch.randn(5, 2, INPUT)
    torch.testing.assert_close(ours(x)[0], back(x)[0], rtol=1e-5, atol=1e-6)


def test_what_it_refuses():
    with pytest.raises(CellError, match="proj_size"):
        LSTM(INPUT, H, proj_size=2)
    lstm = LSTM(INPUT, H)
    with pytest.raises(CellError, match=r"input has shape \[4, 2, 3\]"):
        lstm(torch.randn(4, 2, 3))
    with pytest.raises(CellError, match=r"hx's h has shape"):
        lstm(torch.randn(4, 2, INPUT), (torch.zeros(2, 2, H), torch.zeros(2, 2, H)))
    with pytest.raises(CellError, match=r"hx's h is torch.float64 on cpu, and input is torch.float32"):
        lstm(torch.randn(4, 2, INPUT), (torch.zeros(1, 2, H).double(), torch.zeros(1, 2, H).double()))
    with pytest.raises(CellError, match="dropout"):
        GRU(INPUT, H, dropout=2)
    with pytest.raises(CellError, match=r"unknown schedule 'auto, training' \(schedules: auto, naive, "):
        GRU(INPUT, H, schedule="auto, training")
    with pytest.raises(CellError, match="float64 on cpu, and input is torch.float32"):
        LSTM(INPUT, H).double()(torch.randn(4, 2, INPUT))
    with pytest.raises(CellError, match=r"input has shape \[0, 2, 5\]: no steps"):
        lstm(torch.randn(0, 2, INPUT))
    with pytest.raises(CellError, match=r"input has shape \[2, 0, 5\]: no steps"):
        LSTM(INPUT, H, batch_first=True)(torch.randn(2, 0, INPUT))


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_torchs_checks_and_hidden_reordering_work_as_on_torchs(kind):
    """Every public name of torch's module is the drop-in's too, and the checks and the reordering of the
    hidden state that code subclassing torch's module calls behave as torch's."""
    ours_cls, torch_cls = PAIRS[kind]
    ours, theirs = (cls(INPUT, H, num_layers=2, batch_first=True, bidirectional=True)
                    for cls in (ours_cls, torch_cls))
    assert {n for n in dir(theirs) if not n.startswith("_")} <= set(dir(ours))
    x, perm = torch.randn(3, 7, INPUT), torch.tensor([2, 0, 1])
    h, c = torch.randn(4, 3, H), torch.randn(4, 3, H)
    hx, wrong = ((h, c), (h, torch.zeros(4, 2, H))) if kind == "lstm" else (h, torch.zeros(4, 2, H))
    messages = []
    for module in (ours, theirs):
        module.check_forward_args(x, hx, None)
        with pytest.raises(RuntimeError) as info:
            module.check_forward_args(x, wrong, None)
        messages.append(str(info.value))
        got = module.permute_hidden(hx, perm)
        for a, b in zip(got if kind == "lstm" else (got,), hx if kind == "lstm" else (hx,), strict=True):
            torch.testing.assert_close(a, b[:, perm], rtol=0, atol=0)
    assert messages[0] == messages[1]
    assert ours.get_expected_hidden_size(x, None) == theirs.get_expected_hidden_size(x, None) == (4, 3, H)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_weight_drop_wrapper_works_as_on_torchs(kind):
    """A wrapper that replaces a weight by a tensor of its own at every call (fastai's WeightDropout)
    gives the drop-in's calls that tensor's values, and its raw Parameter torch's gradients."""
    ours_cls, torch_cls = PAIRS[kind]
    theirs = torch_cls(INPUT, H, num_layers=2).double()
    ours = ours_cls(INPUT, H, num_layers=2).double()
    ours.load_state_dict(theirs.state_dict())
    wrapped = [WeightDropout(module, 0.5) for module in (ours, theirs)]
    x = torch.randn(6, 3, INPUT, dtype=torch.float64)
    for training in (True, False):
        for step in range(2):
            outs = []
            for wrapper in wrapped:
                wrapper.train(training)
                torch.manual_seed(step)  # (the same dropout for both)
                y = wrapper(x)[0]
                y.square().sum().backward()
                outs.append((y.detach(), [p.grad.clone() for p in wrapper.parameters()]))
                wrapper.zero_grad()
            (y_ours, g_ours), (y_theirs, g_theirs) = outs
            torch.testing.assert_close(y_ours, y_theirs, rtol=1e-12, atol=1e-12)
            assert len(g_ours) == len(g_theirs) == 8  # (the raw weight and the 7 left in the module)
            for a, b in zip(g_ours, g_theirs, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


WEIGHT_UTILITIES = {  # torch's utilities that put a computed tensor in a Parameter's place
    "weight_norm": lambda m: torch.nn.utils.parametrizations.weight_norm(m, "weight_hh_l0"),
    "orthogonal": lambda m: torch.nn.utils.parametrizations.orthogonal(m, "weight_hh_l1"),
    "pruned": lambda m: torch.nn.utils.prune.l1_unstructured(m, "weight_ih_l1", 0.3),
}


@pytest.mark.parametrize("utility", sorted(WEIGHT_UTILITIES))
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_torchs_weight_utilities_work_as_on_torchs(kind, utility):
    ours, theirs = (cls(INPUT, H, num_layers=2).double() for cls in PAIRS[kind])
    ours.load_state_dict(theirs.state_dict())
    for module in (ours, theirs):
        torch.manual_seed(0)  # (the orthogonal parametrization draws its base)
        WEIGHT_UTILITIES[utility](module)
    x = torch.randn(6, 3, INPUT, dtype=torch.float64)
    (y_ours, _), (y_theirs, _) = ours(x), theirs(x)
    torch.testing.assert_close(y_ours, y_theirs, rtol=1e-12, atol=1e-12)
    params = [[p for p in module.parameters() if p.requires_grad] for module in (ours, theirs)]
    for a, b in zip(torch.autograd.grad(y_ours.square().sum(), params[0]),
                    torch.autograd.grad(y_theirs.square().sum(), params[1]), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


REFUSED = {  # what torch's module refuses too: the module's options, x, and h_0 (c_0 the same) or None
    "x's width": ({}, lambda: torch.randn(4, 2, 3), None),
    "x of four dimensions": ({}, lambda: torch.randn(1, 4, 2, INPUT), None),
    "no steps": ({}, lambda: torch.randn(0, 2, INPUT), None),
    "x's dtype": ({}, lambda: torch.randn(4, 2, INPUT, dtype=torch.float64), None),
    "hx's shape": ({}, lambda: torch.randn(4, 2, INPUT), lambda: torch.zeros(2, 2, H)),
    "hx's dtype": ({}, lambda: torch.randn(4, 2, INPUT), lambda: torch.zeros(1, 2, H, dtype=torch.float64)),
    "dropout": ({"dropout": 2.0}, lambda: torch.randn(4, 2, INPUT), None),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_torch_refuses_too_is_refused_as_torchs_exceptions_are(case):
    """Code written for torch's module catches the drop-in's refusal of what torch refuses (a
    RuntimeError or a ValueError there): TorchRefusal is both, and a CellError."""
    from cellfuse.nn.torch_rnn import TorchRefusal

    options, x, h0 = REFUSED[case]
    raised = []
    for cls in (LSTM, torch.nn.LSTM):
        with pytest.raises(Exception) as info:
            cls(INPUT, H, **options)(x(), None if h0 is None else (h0(), h0()))
        raised.append(info.value)
    ours, theirs = raised
    assert isinstance(ours, TorchRefusal) and isinstance(ours, type(theirs))


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_batch_of_no_rows_gives_torchs_empty_outputs(kind, bidirectional, batch_first):
    ours_cls, torch_cls = PAIRS[kind]
    ours = ours_cls(INPUT, H, num_layers=2, bidirectional=bidirectional, batch_first=batch_first)
    theirs = torch_cls(INPUT, H, num_layers=2, bidirectional=bidirectional, batch_first=batch_first)
    shape = (0, 4, INPUT) if batch_first else (4, 0, INPUT)
    x_ours, x_theirs = torch.randn(shape, requires_grad=True), torch.randn(shape, requires_grad=True)
    hx = torch.zeros(2 * (1 + bidirectional), 0, H, requires_grad=True)
    given = (hx, hx) if kind == "lstm" else hx
    y_shape = (*shape[:2], H * (1 + bidirectional))
    for module, x in ((ours, x_ours), (theirs, x_theirs)):  # (the same checks of both)
        for states in (None, given):
            y, finals = module(x, states)
            finals = finals if isinstance(finals, tuple) else (finals,)
            assert y.shape == y_shape and y.requires_grad
            assert all(f.shape == hx.shape and f.requires_grad for f in finals)
            (y.sum() + sum(f.sum() for f in finals)).backward()
        assert x.grad.shape == x.shape
        assert all(p.grad is not None and not p.grad.any() for p in module.parameters())
    with torch.no_grad():
        assert not ours(x_ours)[0].requires_grad


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_dropout_on_one_layer_warns_as_torchs(kind):
    ours_cls, torch_cls = PAIRS[kind]
    with pytest.warns(UserWarning) as ours:
        ours_cls(INPUT, H, dropout=0.25)
    with pytest.warns(UserWarning) as theirs:
        torch_cls(INPUT, H, dropout=0.25)
    assert [str(w.message) for w in ours] == [str(w.message) for w in theirs]
    assert ours[0].filename == __file__  # (the caller's line, as torch's)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("bias", [True, False])
def test_the_weights_are_listed_as_torchs_and_setting_them_by_name_works_alike(kind, bias):
    """Code written for torch's modules that reads their lists of weights (`all_weights`, `_all_weights`,
    `_flat_weights_names`, `_flat_weights`, `mode`), here to set the forget gate's (LSTM) or update gate's
    (GRU) biases to 1, does the same to either."""
    ours, ref = _pair(kind, num_layers=2, bidirectional=True, bias=bias)
    assert ours.mode == ref.mode
    assert ours._all_weights == ref._all_weights
    assert ours._flat_weights_names == ref._flat_weights_names
    assert all(a is b for a, b in zip(ours._flat_weights,
                                      [getattr(ours, n) for n in ours._flat_weights_names], strict=True))
    assert ([[p.shape for p in ps] for ps in ours.all_weights]
            == [[p.shape for p in ps] for ps in ref.all_weights])
    assert all(p is getattr(ours, n) for ps, ns in zip(ours.all_weights, ours._all_weights, strict=True)
               for p, n in zip(ps, ns, strict=True))
    for module in (ours, ref):
        with torch.no_grad():
            for names in module._all_weights:
                for name in filter(lambda n: "bias" in n, names):
                    getattr(module, name)[H:2 * H].fill_(1.0)
            for p in module.all_weights[0]:
                p.mul_(0.5)
    x = torch.randn(6, 3, INPUT, dtype=torch.float64)
    (y, _), (want, _) = ours(x), ref(x)
    torch.testing.assert_close(y, want)


def test_compiled_with_fullgraph_matches_eager():
    torch._dynamo.reset()
    lstm = LSTM(INPUT, H, num_layers=2, bidirectional=True, batch_first=True)
    compiled = torch.compile(lstm, fullgraph=True, backend="aot_eager")
    x = torch.randn(3, 6, INPUT)
    (y, (h, c)), (want_y, (want_h, want_c)) = compiled(x), lstm(x)
    for got, want in ((y, want_y), (h, want_h), (c, want_c)):
        torch.testing.assert_close(got, want)
    grad = torch.autograd.grad(y.sum(), lstm.weight_hh_l1_reverse)[0]
    torch.testing.assert_close(grad, torch.autograd.grad(want_y.sum(), lstm.weight_hh_l1_reverse)[0])


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("layers, bidirectional, batch_first", [(1, False, False), (2, True, True)])
def test_a_jit_trace_runs_other_sizes_and_saves(kind, layers, bidirectional, batch_first, tmp_path):
    """torch.jit.trace records the op cellfuse::rnn, whose plans are made for the sizes of each call: the
    trace, and the trace saved and loaded, give torch's outputs for other lengths and batches. A trace
    runs inference only (traced in grad mode, as here, it keeps no steps: its backward pass is refused by
    name)."""
    ours, ref = _pair(kind, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first)
    x = torch.randn(3, 2, INPUT, dtype=torch.float64)
    with pytest.warns(torch.jit.TracerWarning):  # (the input checks' comparisons of sizes, as torch's)
        traced = torch.jit.trace(ours, (x,))
    assert "cellfuse::rnn" in str(traced.graph)
    torch.jit.save(traced, str(tmp_path / "lstm.pt"))
    loaded = torch.jit.load(str(tmp_path / "lstm.pt"))
    other = torch.randn(7, 5, INPUT, dtype=torch.float64)
    want = ref(other)
    for module in (traced, loaded):
        got = module(other)
        torch.testing.assert_close(got[0], want[0], rtol=1e-10, atol=1e-12)
        for g, w in zip(_finals(kind, got[1]), _finals(kind, want[1]), strict=True):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    with pytest.raises(CellError, match="torch.jit.trace"):
        traced(other)[0].sum().backward()


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_torch_export_and_functional_call_compute_as_torchs(kind):
    """torch.export.export gives a program holding the op cellfuse::rnn that computes torch's outputs on
    new inputs; torch.func.functional_call with other parameters computes as torch's module with them."""
    ours, ref = _pair(kind, num_layers=2, bidirectional=True)
    x = torch.randn(6, 3, INPUT, dtype=torch.float64)
    exported = torch.export.export(ours, (x,))
    assert any("cellfuse.rnn" in str(node.target) for node in exported.graph.nodes)
    other = torch.randn_like(x)
    torch.testing.assert_close(exported.module()(other)[0], ref(other)[0], rtol=1e-10, atol=1e-12)
    params = {name: p * 1.1 for name, p in ours.named_parameters()}
    got = torch.func.functional_call(ours, params, (other,))[0]
    torch.testing.assert_close(got, torch.func.functional_call(ref, params, (other,))[0], rtol=1e-10,
                               atol=1e-12)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("way", ["to_empty", "assign"])
def test_a_module_made_on_the_meta_device_loads_a_state_dict(kind, way):
    """Made on the meta device (no memory), then given memory and loaded (to_empty and load_state_dict,
    or load_state_dict(assign=True)), it computes as torch's module of the same state dict."""
    ours, ref = _pair(kind, num_layers=2)
    with torch.device("meta"):
        empty = PAIRS[kind][0](INPUT, H, num_layers=2, dtype=torch.float64)
    if way == "to_empty":
        empty = empty.to_empty(device="cpu")
        empty.load_state_dict(ours.state_dict())
    else:
        empty.load_state_dict(ours.state_dict(), assign=True)
    x = torch.randn(6, 3, INPUT, dtype=torch.float64)
    torch.testing.assert_close(empty(x)[0], ref(x)[0], rtol=1e-10, atol=1e-12)


def test_onnx_export_torchscript_and_torch_func_transforms_are_refused_by_name(tmp_path):
    with pytest.raises(CellError, match="cellfuse.nn.LSTM cannot be exported to ONNX.*cellfuse::rnn"):
        torch.onnx.export(LSTM(INPUT, H), (torch.randn(3, 2, INPUT),), str(tmp_path / "m.onnx"), dynamo=False)
    with pytest.raises(CellError, match="cellfuse.nn.GRU cannot be compiled by torch.jit.script"):
        torch.jit.script(torch.nn.Sequential(GRU(INPUT, H)))
    lstm, x = LSTM(INPUT, H), torch.randn(3, 2, INPUT)
    params = {name: p.detach() for name, p in lstm.named_parameters()}
    with pytest.raises(CellError, match="cellfuse.nn.LSTM cannot run under a transform of torch.func"):
        torch.func.grad(lambda p: torch.func.functional_call(lstm, p, (x,))[0].sum())(params)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("packed", [False, True])
def test_calls_under_inference_mode_leave_training_calls_as_torchs(kind, packed):
    """An evaluation under torch.inference_mode() between training steps (as a training script makes):
    what the module keeps from it (its runner's buffers, its initial zeros) is made of normal tensors, so
    the training calls after it run, with torch's gradients (an inference tensor kept from such a call
    could be neither written in place nor saved for a backward pass outside that mode)."""
    ours, ref = _pair(kind, num_layers=2, bidirectional=True)
    x = torch.randn(6, 3, INPUT, dtype=torch.float64)
    if packed:
        x = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor([6, 2, 4]), enforce_sorted=False)

    def data(out):
        return out[0].data if packed else out[0]

    for module in (ours, ref):
        with torch.inference_mode():
            module(x)
    for _ in range(2):
        grads = [torch.autograd.grad(data(m(x)).square().sum(), list(m.parameters())) for m in (ours, ref)]
        for got, want in zip(*grads, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11)
        with torch.inference_mode():
            torch.testing.assert_close(data(ours(x)), data(ref(x)), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_the_views_a_call_reuses_follow_the_parameters(kind):
    """The weights' views are made once and reused: they follow in-place updates (an optimizer's steps,
    load_state_dict), and grad mode and requires_grad as they change."""
    ours, ref = _pair(kind, num_layers=2)
    x = torch.randn(6, 3, INPUT, dtype=torch.float64)
    with torch.no_grad():
        ours(x), ref(x)  # views made without grad mode first
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ours, ref)]
    for _ in range(2):
        for module, optimizer in zip((ours, ref), optimizers, strict=True):
            optimizer.zero_grad()
            module(x)[0].square().sum().backward()
            optimizer.step()
    torch.testing.assert_close(ours(x)[0], ref(x)[0], rtol=1e-10, atol=1e-12)
    ours.weight_hh_l1.requires_grad_(False)
    ours.zero_grad(set_to_none=True)
    ours(x)[0].sum().backward()
    assert ours.weight_hh_l1.grad is None and ours.weight_hh_l0.grad is not None
    fresh = _pair(kind, num_layers=2)[1]
    ours.load_state_dict(fresh.state_dict())
    torch.testing.assert_close(ours(x)[0], fresh(x)[0], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_views_made_again_are_made_after_the_ones_before_are_let_go(kind):
    """When a layer's views are made again (here for grad mode turned off; on a GPU also for another
    current stream), the module holds none of the layer's views before as it makes the new ones: a view
    made in grad mode holds its parameter's AccumulateGrad node, which keeps the stream it was made on,
    and views made while one before lived took that node (on a GPU a training step captured into a CUDA
    graph after eager steps failed: its backward pass accumulated on the default stream)."""
    lstm = _pair(kind, num_layers=2)[0]
    x = torch.randn(6, 3, INPUT, dtype=torch.float64)
    lstm(x)[0].sum().backward()  # views made in grad mode
    before = {layer: [weakref.ref(v) for v in lstm._layer_params(layer, False)] for layer in range(2)}
    alive = []
    make = lstm._views

    def views(sources):
        layer = next(layer for layer in range(2) if sources[0] is getattr(lstm, f"weight_ih_l{layer}"))
        alive.append(sum(ref() is not None for ref in before[layer]))
        return make(sources)

    lstm._views = views
    with torch.no_grad():
        lstm(x)
    assert alive == [0, 0]


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("layers", [1, 2])
def test_autograd_sees_the_parameters_not_their_views(kind, layers):
    """A training call's node in autograd's graph leads straight to the parameters' AccumulateGrad nodes,
    none through a view's backward (each gate's transpose and slice), and only to those that need a
    gradient; the gradients stay torch's (a frozen weight_hh_l0 gets none)."""
    ours, ref = _pair(kind, num_layers=layers)
    for module in (ours, ref):
        module.weight_hh_l0.requires_grad_(False)
    x = torch.randn(6, 3, INPUT, dtype=torch.float64)
    y = ours(x)[0]
    reached = [fn for fn, _ in y.grad_fn.next_functions if fn is not None]
    assert all(type(fn).__name__ == "AccumulateGrad" for fn in reached), reached
    trained = [p for p in ours.parameters() if p.requires_grad]
    assert sorted(id(fn.variable) for fn in reached) == sorted(id(p) for p in trained)
    y.square().sum().backward()
    ref(x)[0].square().sum().backward()
    for (name, a), b in zip(ours.named_parameters(), ref.parameters(), strict=True):
        if b.grad is None:
            assert a.grad is None, name
        else:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-9, atol=1e-11, msg=name)


def test_the_initial_zeros_are_made_once_and_not_pickled():
    """Without hx every call starts from the same kept zeros (nothing to allocate or fill per call); a
    pickled module leaves them behind."""
    import pickle

    lstm = LSTM(INPUT, H)
    x = torch.randn(4, 2, INPUT)
    assert all(a is b for a, b in zip(lstm._initial(None, 2, x), lstm._initial(None, 2, x), strict=True))
    torch.testing.assert_close(lstm(x)[0], lstm(x, (torch.zeros(1, 2, H), torch.zeros(1, 2, H)))[0])
    assert not pickle.loads(pickle.dumps(lstm))._zeros._kept


def test_the_schedules_run_say_what_auto_resolved_to_as_cellrnns():
    """A drop-in reports the rungs of its recent passes as CellRNN does: one per size and grad mode, of
    the first layer's call where its layers run one call each; a pickled module has seen none."""
    import pickle

    lstm = LSTM(INPUT, H, schedule="auto")
    assert lstm.schedules_run == []
    with torch.no_grad():
        lstm(torch.randn(4, 2, INPUT))
    lstm(torch.randn(3, 2, INPUT))[0].sum().backward()  # a training call: the training plans' rung
    assert lstm.schedules_run == ["graph", "graph"]  # (graph is auto without a GPU)
    assert pickle.loads(pickle.dumps(lstm)).schedules_run == []
    packed = torch.nn.utils.rnn.pack_padded_sequence(torch.randn(5, 3, INPUT), [5, 2, 4],
                                                     enforce_sorted=False)
    both = GRU(INPUT, H, 2, bidirectional=True, schedule="fused")
    both(packed)
    assert both.schedules_run == ["fused"]
    cellrnn = CellRNN("gru", INPUT, H, 2, bidirectional=True, schedule="fused")
    cellrnn(packed)
    assert list(cellrnn._recent._seen) == list(both._recent._seen)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_dropped_module_is_freed_at_once_not_by_the_cycle_collector(kind, no_cycle_collector):
    """A module called (training and inference) and then dropped goes with its last reference, and its
    memory with it (a GPU's, for `del model; torch.cuda.empty_cache()`): nothing it keeps points back at
    it."""
    import weakref

    ours, _ = _pair(kind, num_layers=2, bidirectional=True)
    x = torch.randn(5, 3, INPUT, dtype=torch.float64, requires_grad=True)
    ours(x)[0].sum().backward()
    with torch.no_grad():
        ours(x)
    gone = weakref.ref(ours)
    del ours
    assert gone() is None
