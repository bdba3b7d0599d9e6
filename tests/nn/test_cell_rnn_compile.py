"""CellRNN inside torch.compile, torch.export and torch.jit.trace, on the CPU: its forward and backward
passes are the custom ops cellfuse::rnn and cellfuse::rnn_backward, so a model holding it compiles with
fullgraph=True (no graph break), exports to a program that computes and traces into one, each matching
eager on new inputs."""

from __future__ import annotations

import pytest
import torch

from cellfuse.graph_model import CellError
from cellfuse.nn import CellRNN


class LanguageModel(torch.nn.Module):
    def __init__(self, cell="lstm", layers=1):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)
        self.rnn = CellRNN(cell, 8, 16, layers, seed=5)
        self.head = torch.nn.Linear(16, 50)

    def forward(self, tokens):
        y, final = self.rnn(self.embed(tokens))
        return self.head(y) + final["h"][-1].sum()


def _compare(model, compiled, tokens) -> None:
    torch.testing.assert_close(compiled(tokens), model(tokens))
    compiled(tokens).square().mean().backward()
    got = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    model(tokens).square().mean().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(got[name], p.grad, msg=name)
    model.zero_grad()


@pytest.mark.parametrize("cell, layers", [("lstm", 1), ("gru", 2)])
def test_compiled_with_fullgraph_matches_eager_forward_and_backward(cell, layers):
    torch._dynamo.reset()
    model = LanguageModel(cell, layers)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    for seed in range(2):
        _compare(model, compiled, torch.randint(0, 50, (6, 3), generator=torch.Generator().manual_seed(seed)))


class Tagger(torch.nn.Module):
    """A CellRNN over rows of their own lengths, given as a tensor beside x."""

    def __init__(self, bidirectional):
        super().__init__()
        self.rnn = CellRNN("gru", 4, 8, 2, bidirectional=bidirectional, seed=7)

    def forward(self, x, lengths):
        y, final = self.rnn(x, lengths=lengths)
        return y, final["h"]


def _lengths(*values):
    return torch.tensor(values)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_compiled_with_fullgraph_runs_rows_of_their_own_lengths_as_eager(bidirectional):
    """The lengths are a tensor the compiled graph reads as it runs: other lengths in the next calls give
    eager's outputs, final states and gradients; lengths out of their bounds are refused by the graph."""
    torch._dynamo.reset()
    model = Tagger(bidirectional)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    x = torch.randn(6, 3, 4, generator=torch.Generator().manual_seed(1), requires_grad=True)
    for lengths in (_lengths(6, 2, 4), _lengths(1, 6, 5)):
        got = compiled(x, lengths)
        want = model(x, lengths)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b)
        (grad,) = torch.autograd.grad(got[0].square().sum() + got[1].sum(), x)
        (want_grad,) = torch.autograd.grad(want[0].square().sum() + want[1].sum(), x)
        torch.testing.assert_close(grad, want_grad)
        assert all(not grad[n:, row].any() for row, n in enumerate(lengths.tolist()))  # (past the lengths)
    for bad in (_lengths(7, 2, 4), _lengths(6, 0, 4)):
        with pytest.raises(RuntimeError, match="lengths must be from 1 to the sequence's length 6"):
            compiled(x, bad)


def test_an_exported_program_runs_rows_of_new_lengths():
    model = Tagger(bidirectional=True).eval()
    x = torch.randn(6, 3, 4)
    exported = torch.export.export(model, (x, _lengths(6, 2, 4)))
    for lengths in (_lengths(3, 6, 1), _lengths(6, 6, 6)):
        for a, b in zip(exported.module()(x, lengths), model(x, lengths), strict=True):
            torch.testing.assert_close(a, b)
    with pytest.raises(RuntimeError, match="lengths must be from 1"):
        exported.module()(x, _lengths(0, 2, 4))


def test_a_jit_trace_made_with_full_lengths_masks_the_padding_of_shorter_ones():
    """A trace whose example rows all ran the whole sequence still zeroes the padding of later calls'
    shorter rows (a trace records the mask whatever the lengths): NaN there does not reach the run."""
    model = Tagger(bidirectional=True).eval()
    with torch.no_grad():
        traced = torch.jit.trace(model, (torch.randn(6, 3, 4), _lengths(6, 6, 6)))
        x = torch.randn(6, 3, 4)
        x[4:, 1] = float("nan")
        for lengths in (_lengths(6, 4, 2), _lengths(3, 4, 1)):
            got, want = traced(x, lengths), model(x, lengths)
            assert not got[0].isnan().any()
            for a, b in zip(got, want, strict=True):
                torch.testing.assert_close(a, b)


def test_a_traced_calls_lengths_reach_xs_device(monkeypatch):
    """In a traced call the lengths' steps-left state and the reversal's index are the graph's copies on
    x's device (a GPU's in a run; the meta device stands for it here), not left on the CPU."""
    from cellfuse.nn import stacks

    monkeypatch.setattr(stacks, "traced", lambda: True)
    x = torch.empty(6, 3, 4, device="meta")
    steps = stacks.steps_left(_lengths(6, 2, 4), 2, x, 8)
    assert steps.device == x.device and steps.shape == (2, 3, 8)
    assert stacks.padding_zeroed(x, _lengths(6, 2, 4), steps).device == x.device
    assert stacks._reversal(_lengths(6, 2, 4), x)(x).device == x.device


class Classifier(torch.nn.Module):
    """A CellRNN over features that need no gradient: its backward pass leaves dx out."""

    def __init__(self):
        super().__init__()
        self.rnn = CellRNN("gru", 4, 16, seed=6)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.rnn(x)[0][-1])


def test_compiled_over_an_input_that_needs_no_gradient_matches_eager(monkeypatch):
    """The compiled backward op is told that x needs no gradient (its runner leaves dx out), and told that
    it does where x requires one."""
    from cellfuse.nn.runners import NumpyRunner

    asked, backward = [], NumpyRunner.backward

    def told(self, *args):
        asked.append(args[-1])
        return backward(self, *args)
    monkeypatch.setattr(NumpyRunner, "backward", told)
    torch._dynamo.reset()
    model = Classifier()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    for seed in range(2):
        _compare(model, compiled, torch.randn(6, 3, 4, generator=torch.Generator().manual_seed(seed)))
    assert asked == [False] * 4  # (compiled, then eager, for each seed)
    x = torch.randn(6, 3, 4, requires_grad=True)
    compiled(x).square().mean().backward()
    assert asked[-1] is True and x.grad is not None and x.grad.abs().max() > 0


@pytest.mark.slow
def test_compiled_by_inductor_matches_eager():
    torch._dynamo.reset()
    model = LanguageModel()
    _compare(model, torch.compile(model, fullgraph=True), torch.randint(0, 50, (6, 3)))


def test_exported_program_computes_on_new_inputs():
    model = LanguageModel().eval()
    exported = torch.export.export(model, (torch.randint(0, 50, (6, 3)),))
    assert any("cellfuse.rnn" in str(node.target) for node in exported.graph.nodes)
    for seed in range(3):
        tokens = torch.randint(0, 50, (6, 3), generator=torch.Generator().manual_seed(seed))
        torch.testing.assert_close(exported.module()(tokens), model(tokens))


def test_a_jit_trace_computes_on_new_inputs_of_other_sizes():
    model = LanguageModel("gru_cho", layers=2).eval()
    with torch.no_grad():
        traced = torch.jit.trace(model, (torch.randint(0, 50, (6, 3)),))
        assert "cellfuse::rnn" in str(traced.inlined_graph)
        for seed, (T, B) in enumerate([(6, 3), (9, 2), (4, 5)]):
            tokens = torch.randint(0, 50, (T, B), generator=torch.Generator().manual_seed(seed))
            torch.testing.assert_close(traced(tokens), model(tokens))


@pytest.mark.parametrize("grad", [False, True])
def test_an_exported_program_names_auto_as_the_call_ran_it(grad):
    """`auto` in a traced call that saves its steps is the ops' AUTO_TRAINING, so that the program's
    forward and backward ops find the plans chosen for training; in one that does not, `auto`."""
    from cellfuse.nn import ops

    with torch.set_grad_enabled(grad):
        exported = torch.export.export(LanguageModel(), (torch.randint(0, 50, (6, 3)),))
    (schedule,) = [node.args[6] for node in exported.graph.nodes if "cellfuse.rnn" in str(node.target)]
    assert schedule == (ops.AUTO_TRAINING if grad else ops.AUTO)


def test_onnx_export_is_refused_naming_the_op(tmp_path):
    model = LanguageModel()
    with pytest.raises(CellError, match="cellfuse::rnn"):
        torch.onnx.export(model, (torch.randint(0, 50, (6, 3)),), str(tmp_path / "m.onnx"), dynamo=False)


def test_torchscript_and_torch_func_transforms_are_refused_by_name():
    with pytest.raises(CellError, match="CellRNN cannot be compiled by torch.jit.script"):
        torch.jit.script(LanguageModel())
    model, tokens = LanguageModel(), torch.randint(0, 50, (6, 3))
    params = {name: p.detach() for name, p in model.named_parameters()}
    with pytest.raises(CellError, match="CellRNN cannot run under a transform of torch.func"):
        torch.func.grad(lambda p: torch.func.functional_call(model, p, (tokens,)).sum())(params)


def test_a_failure_inside_the_compiled_op_leaves_torchs_random_state_as_it_was():
    torch._dynamo.reset()
    model = LanguageModel()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    state = torch.get_rng_state()
    with pytest.raises(CellError, match="x has shape"):
        compiled.rnn(torch.zeros(6, 3, 5))  # the wrong input size
    assert torch.equal(torch.get_rng_state(), state)
    _compare(model, compiled, torch.randint(0, 50, (6, 3)))
