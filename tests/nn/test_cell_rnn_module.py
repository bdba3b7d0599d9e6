"""CellRNN as a module: what it is built from, its parameters (initialised, loaded and saved as .npz files
as `cellfuse init-params` writes them), the plans it keeps, and a clear error for every input it cannot
run, naming what was expected and what was given."""

from __future__ import annotations

import copy
import pickle
import warnings

import numpy as np
import pytest
import torch
import torch.nn.utils.prune

from cellfuse.graph_model import CellError, init_params, load_npz, load_template, save_cell, save_npz
from cellfuse.nn import CellRNN


def small(name: str = "lstm", layers: int = 2, **kw) -> CellRNN:
    return CellRNN(name, 4, 3, layers, seed=0, **kw)


# -- what it is built from --------------------------------------------------------------------------
def test_a_cell_a_cell_file_or_a_template_name(tmp_path):
    cell = load_template("gru")
    path = tmp_path / "mine.cell.json"
    save_cell(cell, path)
    for given in (cell, path, str(path), "gru"):
        rnn = CellRNN(given, 4, 3)
        assert rnn.state_ids == ("h",) and rnn.keys[0].startswith("l0.")


def test_the_sizes_default_to_the_cell_files():
    cell = load_template("elman")
    cell.sizes = {"input": 6, "hidden": 5}
    rnn = CellRNN(cell)
    assert (rnn.input_size, rnn.hidden_size, rnn.num_layers) == (6, 5, 1)
    assert rnn.param("l0.W").shape == (6, 5)


def test_a_size_neither_given_nor_in_the_cell_is_named():
    cell = load_template("elman")
    cell.sizes = {"input": 6}
    with pytest.raises(CellError, match="hidden_size is not given, and cell 'Elman RNN' has no 'hidden'"):
        CellRNN(cell)


@pytest.mark.parametrize("given, message", [
    ("no_such_cell", r"no_such_cell: no such cell file, and no template of that name \(templates: .*lstm"),
    (42, None),
])
def test_an_unknown_cell(given, message):
    with pytest.raises(TypeError if message is None else CellError, match=message):
        CellRNN(given, 4, 3)


@pytest.mark.parametrize("kw, message", [
    ({"schedule": "fastest"}, r"unknown schedule 'fastest' \(schedules: auto, naive, "),
    ({"num_layers": 0}, "num_layers must be at least 1, got 0"),
    ({"hidden_size": 2.5}, "hidden_size must be a whole number, got 2.5"),
])
def test_bad_arguments(kw, message):
    args = {"input_size": 4, "hidden_size": 3, **kw}
    with pytest.raises(CellError, match=message):
        CellRNN("lstm", **args)


def test_a_cell_that_ties_the_widths_needs_them_equal():
    with pytest.raises(CellError, match="cannot run at input size 4 and hidden size 3: node '.*'"):
        CellRNN("sru", 4, 3)


def test_an_invalid_cell_is_refused_with_its_problems():
    cell = load_template("elman")
    cell.output = "nowhere"
    with pytest.raises(CellError, match="nowhere"):
        CellRNN(cell, 4, 3)


# -- parameters ------------------------------------------------------------------------------------
def test_the_parameters_are_those_of_init_params():
    rnn = small(layers=2)
    want = init_params(load_template("lstm"), 2, 4, 3, seed=0)
    assert rnn.keys == tuple(want)
    for key, value in want.items():
        assert rnn.param(key).dtype == torch.float32
        np.testing.assert_array_equal(rnn.param(key).detach().numpy(), value)
    names = dict(rnn.named_parameters())
    assert set(names) == {key.replace(".", "_") for key in want}
    assert names["l1_U_f"] is rnn.param("l1.U_f")


def test_without_a_seed_torch_manual_seed_makes_the_parameters_repeatable():
    torch.manual_seed(3)
    a = CellRNN("gru", 4, 3)
    torch.manual_seed(3)
    b = CellRNN("gru", 4, 3)
    c = CellRNN("gru", 4, 3)
    assert all(torch.equal(a.param(k), b.param(k)) for k in a.keys)
    assert not torch.equal(a.param("l0.W_iz"), c.param("l0.W_iz"))


def test_save_and_load_round_trip(tmp_path):
    rnn = small()
    with torch.no_grad():
        rnn.param("l1.b_o").add_(1.5)
    path = tmp_path / "p.npz"
    rnn.save_params(path)
    saved = load_npz(path, "parameters")
    assert set(saved) == set(rnn.keys)
    assert all(saved[k].dtype == np.float32 for k in rnn.keys)
    other = CellRNN("lstm", 4, 3, 2, seed=9)
    other.load_params(path)
    for key in rnn.keys:
        assert torch.equal(other.param(key), rnn.param(key)), key
    other.load_params({k: torch.zeros_like(rnn.param(k)) for k in rnn.keys})  # tensors too
    assert not other.param("l0.W_i").any()


def test_an_init_params_file_loads(tmp_path):
    path = tmp_path / "p.npz"
    save_npz(path, init_params(load_template("lstm"), 2, 4, 3, seed=5))
    rnn = small()
    rnn.load_params(load_npz(path, "parameters"))
    np.testing.assert_array_equal(rnn.param("l1.U_g").detach().numpy(),
                                  init_params(load_template("lstm"), 2, 4, 3, seed=5)["l1.U_g"])


@pytest.mark.parametrize("change, message", [
    (lambda p: p.pop("l1.U_i"), r"parameter 'l1.U_i' is missing \(expected shape \[3, 3\]\)"),
    (lambda p: p.update({"l0.W_i": np.zeros((3, 3), np.float32)}),
     r"parameter 'l0.W_i' has shape \[3, 3\], expected \[4, 3\]"),
    (lambda p: p.update({"l0.W_q": np.zeros((4, 3), np.float32)}),
     "parameter 'l0.W_q' is not a parameter of cell 'LSTM'"),
    (lambda p: p.update({"l2.W_i": np.zeros((3, 3), np.float32)}),
     "the parameters are for 3 layers, and this CellRNN has 2"),
    (lambda p: p.update({"l0.b_i": np.full(3, np.nan, np.float32)}), "parameter 'l0.b_i' holds NaN"),
])
def test_load_params_errors(change, message):
    rnn = small()
    before = {k: rnn.param(k).detach().clone() for k in rnn.keys}
    params = {k: v.detach().numpy().copy() for k, v in before.items()}
    change(params)
    with pytest.raises(CellError, match=message):
        rnn.load_params(params)
    assert all(torch.equal(rnn.param(k), v) for k, v in before.items()), "nothing is loaded from a bad set"


def test_a_parameters_file_with_a_key_of_no_parameter_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "p.npz"
    rnn = small()
    save_npz(path, {**{k: rnn.param(k).detach().numpy() for k in rnn.keys}, "l0.W_q": np.zeros(1)})
    with pytest.raises(CellError) as e:
        rnn.load_params(path)
    assert str(e.value).startswith(f"parameters {path}: holds 25 arrays, and 'l0.W_q' is not a parameter of "
                                   "cell 'LSTM'")


def test_an_unknown_key():
    with pytest.raises(CellError, match=r"'l0.W' is not a parameter of this CellRNN \(2 layer\(s\) of cell "
                                        r"'LSTM'\): its keys are l0.W_i, "):
        small().param("l0.W")


# -- the plans it keeps ----------------------------------------------------------------------------
def test_plans_are_made_once_per_cell_sizes_dtype_and_device():
    from cellfuse.nn import ops

    rnn = small()

    def runner(T, dtype):
        return ops.runner(rnn._cell_text, torch.zeros(T, 2, 4, dtype=dtype), 3, 2, "auto")
    first = runner(5, torch.float32)
    assert runner(5, torch.float32) is first
    assert runner(5, torch.float64) is not first
    assert runner(6, torch.float32) is not first
    assert first.schedule == "graph"  # auto on the CPU


def test_a_copy_and_a_pickle_compute_what_the_module_does():
    rnn = small()
    x = torch.randn(5, 2, 4)
    y, _ = rnn(x)
    for other in (copy.deepcopy(rnn), pickle.loads(pickle.dumps(rnn))):
        torch.testing.assert_close(other(x)[0], y, rtol=0, atol=0)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_a_weight_put_in_a_parameters_place_is_read_as_it_is(bidirectional):
    """torch's pruning (and its parametrizations, weight-drop wrappers) take a Parameter out of a module
    and set the name to a tensor computed before every call: the module reads that tensor, and its
    gradient reaches the Parameter behind it (here, the pruned weight's: the mask times the weight's)."""
    pruned = CellRNN("lstm", 5, 4, 2, bidirectional=bidirectional, seed=3).double()
    plain = CellRNN("lstm", 5, 4, 2, bidirectional=bidirectional, seed=3).double()
    owner = pruned.reverse if bidirectional else pruned  # (a reverse direction's weight, where there is one)
    torch.nn.utils.prune.l1_unstructured(owner, "l1_U_f", 0.4)
    with torch.no_grad():
        (plain.reverse if bidirectional else plain).l1_U_f.copy_(owner.l1_U_f)
    x = torch.randn(6, 3, 5, dtype=torch.float64)
    (y, _), (want, _) = pruned(x), plain(x)
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)
    got = torch.autograd.grad(y.square().sum(), owner.l1_U_f_orig)[0]
    weight = (plain.reverse if bidirectional else plain).l1_U_f
    torch.testing.assert_close(got, owner.l1_U_f_mask * torch.autograd.grad(want.square().sum(), weight)[0])
    assert not owner.l1_U_f_mask.all()


def test_many_forward_passes_wait_for_their_backward_passes_each_with_its_own_steps():
    rnn = small().double()
    xs = [torch.randn(5, 2, 4, dtype=torch.float64, requires_grad=True) for _ in range(6)]
    separate = [torch.autograd.grad(rnn(x)[0].square().sum(), x)[0] for x in xs]
    outs = [rnn(x)[0] for x in xs]  # six forward passes, then their backward passes in another order
    for i in (3, 0, 5, 1, 4, 2):
        torch.testing.assert_close(torch.autograd.grad(outs[i].square().sum(), xs[i])[0], separate[i])


def test_without_gradients_no_steps_are_saved():
    rnn = small()
    x = torch.randn(5, 2, 4)
    params = [rnn.param(k) for k in rnn.keys]
    zeros = [torch.zeros(2, 2, 3)] * 2
    with torch.no_grad():
        y, *_, reserve = torch.ops.cellfuse.rnn(x, zeros, params, rnn._cell_text, 3, 2, "auto", False, 0, "")
    assert reserve.numel() == 0
    y2, *_, reserve = torch.ops.cellfuse.rnn(x, zeros, params, rnn._cell_text, 3, 2, "auto", True, 0, "")
    assert reserve.numel() > 0
    torch.testing.assert_close(y, y2, rtol=0, atol=0)
    with torch.no_grad():
        y, _ = rnn(x)
    assert y.grad_fn is None


def test_a_call_under_inference_mode_leaves_training_calls_working():
    """What the module keeps from a call under torch.inference_mode() (its runner's buffers, its initial
    zeros) is made of normal tensors: the training calls after it give the gradients of a module that
    never ran under it."""
    rnn, fresh = small(), small()
    x = torch.randn(5, 2, 4)
    with torch.inference_mode():
        rnn(x)
    got = torch.autograd.grad(rnn(x)[0].square().sum(), list(rnn.parameters()))
    want = torch.autograd.grad(fresh(x)[0].square().sum(), list(fresh.parameters()))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


def test_a_non_contiguous_input_gives_what_its_copy_does():
    rnn = small()
    x = torch.randn(2, 5, 4).transpose(0, 1)
    torch.testing.assert_close(rnn(x)[0], rnn(x.contiguous())[0], rtol=0, atol=0)


# -- inputs it cannot run --------------------------------------------------------------------------
def test_forward_returns_y_and_every_final_state():
    rnn = small()
    y, final = rnn(torch.randn(5, 2, 4))
    assert y.shape == (5, 2, 3) and set(final) == {"h", "c"}
    assert all(v.shape == (2, 2, 3) for v in final.values())
    torch.testing.assert_close(final["h"][-1], y[-1], rtol=0, atol=0)  # LSTM: h is the output


def test_initial_states_given_for_some_states_only():
    rnn = small()
    x = torch.randn(4, 2, 4)
    c = torch.randn(2, 2, 3)
    y, _ = rnn(x, {"c": c})
    y0, _ = rnn(x, {"c": c, "h": torch.zeros(2, 2, 3)})
    torch.testing.assert_close(y, y0, rtol=0, atol=0)
    assert not torch.equal(y, rnn(x)[0])


@pytest.mark.parametrize("x, message", [
    (torch.randn(5, 4), r"x has shape \[5, 4\], expected \[T, B, 4\] \(sequence, batch, input_size\)"),
    (torch.randn(5, 2, 3), r"x has shape \[5, 2, 3\], expected \[T, B, 4\]"),
    (torch.randn(0, 2, 4), r"x has shape \[0, 2, 4\], expected \[T, B, 4\] .*T and B at least 1"),
    (torch.randn(5, 2, 4, dtype=torch.complex64),
     "x has dtype torch.complex64; on cpu CellRNN runs torch.float32, torch.float64, torch.bfloat16, "
     "torch.float16"),
    (torch.ones(5, 2, 4, dtype=torch.int64), "x has dtype torch.int64; on cpu CellRNN runs"),
    (torch.randn(5, 2, 4, dtype=torch.float64),
     "parameter 'l0.W_i' is torch.float32 on cpu, and x is torch.float64 on cpu: move the module"),
    (torch.randn(5, 2, 4, device="meta"), "x is on meta; CellRNN runs on the CPU or a CUDA device"),
])
def test_bad_inputs(x, message):
    with pytest.raises(CellError, match=message):
        small()(x)


def test_x_must_be_a_tensor():
    with pytest.raises(TypeError, match=r"x must be a tensor \[T, B, 4\], got a ndarray"):
        small()(np.zeros((5, 2, 4), np.float32))


def test_parameters_on_another_device():
    rnn = small().to("meta")
    with pytest.raises(CellError, match="parameter 'l0.W_i' is torch.float32 on meta, and x is torch.float32 "
                                        "on cpu"):
        rnn(torch.randn(5, 2, 4))


@pytest.mark.parametrize("states, error, message", [
    ({"q": torch.zeros(2, 2, 3)}, CellError, r"states: 'q' is not a state of cell 'LSTM' \(states: h, c\)"),
    ({"h": torch.zeros(1, 2, 3)}, CellError,
     r"state 'h' has shape \[1, 2, 3\], expected \[2, 2, 3\] \(num_layers, batch, hidden_size\)"),
    ({"c": torch.zeros(2, 2, 3, dtype=torch.float64)}, CellError,
     "state 'c' is torch.float64 on cpu, and x is torch.float32 on cpu"),
    ({"c": torch.zeros(2, 2, 3, device="meta")}, CellError,
     "state 'c' is torch.float32 on meta, and x is torch.float32 on cpu"),
    ({"c": np.zeros((2, 2, 3))}, TypeError, r"state 'c' must be a tensor \[2, 2, 3\], got a ndarray"),
    ([torch.zeros(2, 2, 3)], TypeError, "states must map state ids to tensors, got a list"),
])
def test_bad_states(states, error, message):
    with pytest.raises(error, match=message):
        small()(torch.randn(5, 2, 4), states)


def test_sizes_beyond_the_limits_are_refused_before_anything_is_made():
    rnn = CellRNN("elman", 1, 1)
    x = torch.zeros(1, 1, 1).expand(2**24, 2**11, 1)  # no memory behind it
    with pytest.raises(CellError, match="make 68719476736 activations .* above the limit"):
        rnn(x)


def test_the_schedules_run_say_what_auto_resolved_to():
    rnn = CellRNN("lstm", 4, 5, schedule="auto")
    assert rnn.schedules_run == []
    rnn(torch.zeros(3, 2, 4))
    rnn(torch.zeros(2, 2, 4))
    assert rnn.schedules_run == ["graph", "graph"]  # one runner per size; graph is auto without a GPU
    fused = CellRNN("lstm", 4, 5, schedule="fused")
    fused(torch.zeros(3, 2, 4))
    assert fused.schedules_run == ["fused"]


@pytest.mark.parametrize("bidirectional", [False, True])
def test_auto_chooses_a_training_calls_rung_apart_from_an_inference_calls(monkeypatch, bidirectional):
    """Under `auto` a call that saves its steps is planned with the rung chosen for training (asked for
    with train=True), its backward pass with the same plans, and an inference call with the rung chosen
    for inference; the gradients are those of the training rung named outright."""
    from cellfuse.gpu_runtime.auto_schedule import Choice
    from cellfuse.nn import ops

    asked = []

    def choose(cell, sizes, device, bidirectional=False, precision="fp32", train=False):
        asked.append(train)
        return Choice("hoisted" if train else "fused", "as if measured")
    monkeypatch.setattr(ops, "choose", choose)
    rnn = CellRNN("gru", 4, 7, num_layers=2, bidirectional=bidirectional, seed=3).double()
    named = CellRNN("gru", 4, 7, num_layers=2, bidirectional=bidirectional, seed=3,
                    schedule="hoisted").double()
    x = torch.randn(5, 3, 4, dtype=torch.float64)  # (sizes of its own: no other test made their plans)
    with torch.no_grad():
        rnn(x)
    assert rnn.schedules_run == ["fused"] and set(asked) == {False}
    y, finals = rnn(x)
    (y.square().sum() + finals["h"].sum()).backward()
    assert rnn.schedules_run == ["fused", "hoisted"] and set(asked) == {False, True}
    assert any(key[2] == ops.AUTO_TRAINING for key in ops._plans)
    want_y, want_finals = named(x)
    (want_y.square().sum() + want_finals["h"].sum()).backward()
    torch.testing.assert_close(y, want_y, rtol=0, atol=0)
    for key in rnn.keys:
        torch.testing.assert_close(rnn.param(key).grad, named.param(key).grad, rtol=0, atol=0)


def test_a_frozen_first_layer_reports_its_inference_rung_and_one_runner_serves_both_names(monkeypatch):
    """Layers run one at a time with the first frozen: its call is an inference call (the rung for
    inference), the second's a training call, and `schedules_run` reports the first's without asking
    `auto` for anything more; where both names stand for one rung, one runner makes both calls."""
    from cellfuse.gpu_runtime.auto_schedule import Choice
    from cellfuse.nn import ops

    asked = []

    def choose(cell, sizes, device, bidirectional=False, precision="fp32", train=False):
        asked.append((sizes.input, train))
        return Choice("fused" if sizes.input == 6 or not train else "hoisted", "as if measured")
    monkeypatch.setattr(ops, "choose", choose)
    rnn = CellRNN("gru", 6, 9, num_layers=2, dropout=0.5, seed=5).double()  # (dropout: a call per layer)
    for key in rnn.keys:
        if key.startswith("l0."):
            rnn.param(key).requires_grad_(False)
    x = torch.randn(4, 3, 6, dtype=torch.float64)  # (sizes of their own: no other test made their plans)
    y, _ = rnn(x)
    y.sum().backward()
    assert sorted(asked) == [(6, False), (9, True)]
    assert rnn.schedules_run == ["fused"] and len(asked) == 2
    assert rnn.param("l1.W_ir").grad is not None and rnn.param("l0.W_ir").grad is None
    # the second layer: trained on `hoisted`; then the first in training too, on `fused` by both names
    rnn.param("l0.W_ir").requires_grad_(True)
    rnn(x)[0].sum().backward()
    with torch.no_grad():
        rnn(x)
    runners = {key[6]: runner for key, runner in ops._runners.items() if key[:4] == (rnn._cell_text, 4, 3, 6)}
    assert runners.keys() == {ops.AUTO, ops.AUTO_TRAINING, "fused"}
    assert runners[ops.AUTO] is runners[ops.AUTO_TRAINING] is runners["fused"]


def test_the_runners_kept_past_the_limit_are_the_least_recently_used_under_any_of_their_keys():
    """A runner kept under two keys (`auto`'s and its rung's) counts once, and is as recently used as
    its last key: past MAX_RUNNERS the least recently used runner goes, under every key."""
    from collections import OrderedDict
    from types import SimpleNamespace

    from cellfuse.nn import ops

    cache: OrderedDict = OrderedDict()
    both = SimpleNamespace(captured=False)
    ops._remember(cache, ("rung",), lambda: both)
    ops._remember(cache, ("auto",), lambda: both)
    for size in range(ops.MAX_RUNNERS - 1):
        ops._remember(cache, (size,), lambda: SimpleNamespace(captured=False))
    assert len(cache) == ops.MAX_RUNNERS + 1  # (MAX_RUNNERS runners)
    ops._found(cache, ("auto",))  # (used now: its rung's key is the oldest, but it is not)
    ops._remember(cache, ("new",), lambda: SimpleNamespace(captured=False))
    assert cache[("rung",)] is cache[("auto",)] is both and (0,) not in cache
    for size in range(ops.MAX_RUNNERS):
        ops._remember(cache, ("more", size), lambda: SimpleNamespace(captured=False))
    assert ("rung",) not in cache and ("auto",) not in cache
    assert len({id(v) for v in cache.values()}) == ops.MAX_RUNNERS


@pytest.mark.parametrize("dtype, grad", [(torch.float32, False), (torch.bfloat16, False),
                                         (torch.bfloat16, True)])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_the_schedules_run_are_those_of_the_plans_that_ran(dtype, grad, bidirectional):
    """Asked after a pass, the rungs are those of the plans it ran (its precision, float32 for a 16-bit
    pass a backward pass may follow; one layer's where the layers ran one at a time): asking makes no
    plans of its own (under auto it would measure them)."""
    from cellfuse.nn import ops

    rnn = CellRNN("lstm", 4, 5, num_layers=2, bidirectional=bidirectional, schedule="fused")
    with torch.set_grad_enabled(grad), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the warning that the 16-bit pass runs in float32)
        rnn(torch.zeros(4 if grad else 3, 2, 4, dtype=dtype))  # (sizes of its own: no other case made them)
    made = set(ops._plans)
    assert rnn.schedules_run == ["fused"] and set(ops._plans) == made


def test_batch_first_and_dropout_between_layers_as_torchs_lstm():
    from cellfuse.gpu_runtime.torch_baselines import cudnn_gates

    rnn = CellRNN("lstm", 4, 3, 3, seed=2, batch_first=True, dropout=0.5).double()
    params = {key: rnn.param(key).detach().numpy() for key in rnn.keys}
    ref = torch.nn.LSTM(4, 3, 3, batch_first=True, dropout=0.5).double()
    with torch.no_grad():
        for layer in range(3):
            gates = cudnn_gates("lstm", params, layer)
            for i, name in enumerate(("weight_ih", "weight_hh", "bias_ih", "bias_hh")):
                value = np.concatenate([g[i] for g in gates])
                getattr(ref, f"{name}_l{layer}").copy_(torch.from_numpy(value))
    x = torch.randn(2, 5, 4, dtype=torch.float64)  # [B, T, input]
    for mode in ("train", "eval"):
        getattr(rnn, mode)(), getattr(ref, mode)()
        torch.manual_seed(3)
        y, final = rnn(x)
        torch.manual_seed(3)
        want_y, (want_h, want_c) = ref(x)
        torch.testing.assert_close(y, want_y, rtol=1e-10, atol=1e-12, msg=mode)
        torch.testing.assert_close(final["c"], want_c, rtol=1e-10, atol=1e-12, msg=mode)
    with pytest.raises(CellError, match="dropout"):
        CellRNN("lstm", 4, 3, dropout=-1)


def test_a_modules_zeros_are_made_once_and_known_as_its_own():
    import gc

    from cellfuse.nn.zeros import Zeros, _made, made_here

    zeros = Zeros()
    a = zeros((2, 3, 4), torch.float32, torch.device("cpu"))
    assert a is zeros((2, 3, 4), torch.float32, torch.device("cpu")) and made_here(a)
    assert not made_here(a.clone()) and not made_here(torch.zeros(2, 3, 4))
    key = id(a)
    del zeros, a
    gc.collect()
    assert key not in _made


def test_a_dropped_module_is_freed_at_once_not_by_the_cycle_collector(no_cycle_collector):
    """A CellRNN (two directions: a child module holds the reverse's parameters) called and then dropped
    goes with its last reference, and its memory with it: nothing it keeps points back at it."""
    import weakref

    rnn = CellRNN("lstm", 4, 3, 2, bidirectional=True, seed=1)
    x = torch.randn(5, 2, 4, requires_grad=True)
    rnn(x)[0].sum().backward()
    gone = weakref.ref(rnn)
    del rnn
    assert gone() is None


def test_a_module_saved_when_its_parameters_map_held_its_modules_loads_and_runs_the_same():
    """A CellRNN pickled (torch.save of the whole module) when its map of parameter keys held the module
    that holds each (itself, or `reverse`) loads with the map of now, each direction reading its own
    weights."""
    import pickle

    rnn = CellRNN("lstm", 4, 3, 2, bidirectional=True, seed=1)
    x = torch.randn(5, 2, 4)
    want = rnn(x)[0]
    owner = {False: rnn, True: rnn.reverse}
    rnn._where = {key: (owner[reverse], name) for key, (reverse, name) in rnn._where.items()}
    rnn._layer_params = [[[(owner[r], name) for r, name in direction] for direction in layer]
                         for layer in rnn._layer_params]
    loaded = pickle.loads(pickle.dumps(rnn))
    assert all(isinstance(reverse, bool) for reverse, _ in loaded._where.values())
    torch.testing.assert_close(loaded(x)[0], want, rtol=0, atol=0)


def test_a_module_saved_when_it_kept_its_recent_calls_in_two_fields_loads_and_reports_its_rungs():
    """A CellRNN pickled when it kept its recent calls as `_seen` and `_last_seen` loads without them, and
    reports the rungs of the calls it makes from then on."""
    from collections import OrderedDict

    rnn = CellRNN("lstm", 4, 3, schedule="fused", seed=1)
    state = rnn.__getstate__()
    del state["_recent"]
    state["_seen"], state["_last_seen"] = OrderedDict(), None
    loaded = CellRNN.__new__(CellRNN)
    loaded.__setstate__(state)
    assert not hasattr(loaded, "_seen") and loaded.schedules_run == []
    loaded(torch.randn(5, 2, 4))
    assert loaded.schedules_run == ["fused"]


def test_calls_from_several_threads_get_their_own_results():
    """Threads that call one module at once (one runner: the numpy executor's buffers) get the results of
    the same calls made one at a time, forward and backward."""
    import threading

    rnn = CellRNN("lstm", 8, 12, 2, seed=1)
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(6, 3, 8, generator=gen) for _ in range(3)]

    def run(x):
        x = x.clone().requires_grad_()
        y, _ = rnn(x)
        (dx,) = torch.autograd.grad(y.pow(2).sum(), [x])
        return y.detach(), dx

    want = [run(x) for x in xs]
    wrong: list[int] = []

    def work(i: int) -> None:
        for _ in range(30):
            y, dx = run(xs[i])
            if not (torch.equal(y, want[i][0]) and torch.equal(dx, want[i][1])):
                wrong.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, f"{len(wrong)} calls of {30 * len(xs)} got another call's result"


def test_what_a_thread_is_making_is_made_once_and_keeps_no_one_else_waiting():
    """A runner (or plans) that one thread is making (compiling, measuring: seconds) is made once: a
    second thread that wants it waits for it, and a third that wants something else goes on."""
    import threading
    from collections import OrderedDict

    from cellfuse.nn import ops

    cache: OrderedDict = OrderedDict()
    started, finish = threading.Event(), threading.Event()
    made, got = [], []

    def slow():
        made.append("slow")
        started.set()
        assert finish.wait(10)
        return "slow"

    def want() -> None:
        got.append(ops._remember(cache, ("slow",), slow))

    first, second = threading.Thread(target=want), threading.Thread(target=want)
    first.start()
    assert started.wait(10)
    second.start()
    assert ops._remember(cache, ("quick",), lambda: "quick") == "quick"  # while the other is made
    finish.set()
    first.join(10)
    second.join(10)
    assert made == ["slow"] and got == ["slow", "slow"] and list(cache) == [("quick",), ("slow",)]


def test_the_process_keeps_the_runners_a_cuda_graph_captured():
    """Past MAX_RUNNERS the least recently used runner goes, but not one whose packed weights a user's CUDA
    graph captured: the graph's replays read them and run the runner's kernels without asking for it, so
    calls of other sizes (validation batches, say) must not free them under it."""
    from collections import OrderedDict
    from types import SimpleNamespace

    from cellfuse.nn import ops

    cache: OrderedDict = OrderedDict()
    captured = SimpleNamespace(captured=True)
    ops._remember(cache, ("captured",), lambda: captured)
    for size in range(ops.MAX_RUNNERS + 3):
        ops._remember(cache, (size,), lambda: SimpleNamespace(captured=False))
    assert len(cache) == ops.MAX_RUNNERS and cache[("captured",)] is captured
    assert list(cache)[1:] == [(size,) for size in range(4, ops.MAX_RUNNERS + 3)]
