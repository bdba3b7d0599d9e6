"""A bidirectional CellRNN: against torch.nn.LSTM and GRU with the same weights (outputs, final states in
torch's order, gradients), its reverse direction's keys in .npz files (l0.reverse.W), `init-params
--bidirectional`, and a drawn cell's gradients by finite differences."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cellfuse.cli import main
from cellfuse.gpu_runtime.torch_baselines import cudnn_gates
from cellfuse.graph_model import CellError, load_npz, load_template
from cellfuse.graph_model.params import param_key_check
from cellfuse.nn import CellRNN


def _torch_twin(rnn: CellRNN, kind: str) -> torch.nn.Module:
    """torch.nn.LSTM / GRU holding the CellRNN's weights, both directions."""
    cls = torch.nn.LSTM if kind == "lstm" else torch.nn.GRU
    twin = cls(rnn.input_size, rnn.hidden_size, rnn.num_layers, bidirectional=True).double()
    with torch.no_grad():
        for layer in range(rnn.num_layers):
            for suffix, part in (("", f"l{layer}."), ("_reverse", f"l{layer}.reverse.")):
                params = {f"l{layer}." + key[len(part):]: rnn.param(key).detach().numpy()
                          for key in rnn.keys if key.startswith(part)}
                gates = cudnn_gates(kind, params, layer)
                for i, name in enumerate(("weight_ih", "weight_hh", "bias_ih", "bias_hh")):
                    value = np.concatenate([gate[i] for gate in gates])
                    getattr(twin, f"{name}_l{layer}{suffix}").copy_(torch.from_numpy(value))
    return twin


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("layers", [1, 2])
def test_both_directions_are_torchs(kind, layers):
    rnn = CellRNN(kind, 4, 3, layers, seed=2, bidirectional=True).double()
    twin = _torch_twin(rnn, kind)
    x = torch.randn(5, 2, 4, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(2 * layers, 2, 3, dtype=torch.float64)
    y, final = rnn(x, {"h": h0})
    want_y, want = twin(x, (h0, torch.zeros_like(h0)) if kind == "lstm" else h0)
    want_h = want[0] if kind == "lstm" else want
    assert y.shape == (5, 2, 6) and final["h"].shape == (2 * layers, 2, 3)
    torch.testing.assert_close(y, want_y, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(final["h"], want_h, rtol=1e-10, atol=1e-12)
    first = rnn.param("l0.reverse." + rnn.keys[0][len("l0."):])
    got = torch.autograd.grad((y ** 2).sum() + final["h"].sum(), [x, first])
    want_grads = torch.autograd.grad((want_y ** 2).sum() + want_h.sum(), [x, twin.weight_ih_l0_reverse])
    torch.testing.assert_close(got[0], want_grads[0], rtol=1e-9, atol=1e-11)
    # the CellRNN's first weight is gate 0's input matrix: rows 0..H of torch's, transposed
    torch.testing.assert_close(got[1], want_grads[1][:3].T, rtol=1e-9, atol=1e-11)


def test_a_drawn_cells_gradients_by_finite_differences():
    rnn = CellRNN("gru_cho", 3, 2, 2, seed=4, bidirectional=True).double()
    x = torch.randn(4, 2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: rnn(x)[0], (x,), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_reverse_keys_in_npz_files_and_init_params(tmp_path, capsys):
    path = tmp_path / "p.npz"
    assert main(["init-params", "lstm", "--layers", "2", "--input", "4", "--hidden", "3", "--bidirectional",
                 "-o", str(path)]) == 0
    assert "both directions" in capsys.readouterr().out
    check = param_key_check(load_template("lstm"), bidirectional=True)
    params = load_npz(path, "parameters", check)
    assert "l1.reverse.W_i" in params and params["l1.W_i"].shape == (6, 3)  # layer 1 reads both directions
    rnn = CellRNN("lstm", 4, 3, 2, bidirectional=True)
    rnn.load_params(path)
    torch.testing.assert_close(rnn.param("l1.reverse.U_o"), torch.from_numpy(params["l1.reverse.U_o"]))
    rnn.save_params(tmp_path / "back.npz")
    back = load_npz(tmp_path / "back.npz", "parameters", check)
    assert sorted(back) == sorted(params)
    with pytest.raises(CellError, match=r"'l0.reverse.W_i' is not a parameter"):
        CellRNN("lstm", 4, 3, 2).load_params(params)  # one direction: no reverse keys
    assert param_key_check(load_template("lstm"))("l0.reverse.W_i") is not None


def test_a_bidirectional_stack_of_a_cell_that_needs_input_equal_to_hidden_is_refused():
    with pytest.raises(CellError, match="bidirectional stack of cell 'Residual LSTM'.* node 'y' adds 'x'"):
        CellRNN("residual_lstm", 8, 8, 2, bidirectional=True)
