"""The cell that runs each batch row to its own length: the float64 reference over the rewritten cell
gives each row what the cell gives it alone over its own steps (outputs zero after them, final states of
its last step), for templates whose states do different things (the LSTM's two, the GRU's one, sLSTM's
stabilised four, the layer-normalised LSTM's row reductions)."""

from __future__ import annotations

import numpy as np
import pytest

from cellfuse.graph_model import CellError, Node, load_template
from cellfuse.graph_model.lengths import STEPS_LEFT, masked
from cellfuse.graph_model.params import init_params
from cellfuse.graph_model.reference import run_reference


@pytest.mark.parametrize("name", ["lstm", "gru", "slstm", "layernorm_lstm"])
def test_each_row_stops_at_its_own_length(name):
    cell = load_template(name)
    T, B, INPUT, H, L = 6, 3, 4, 5, 2
    params = init_params(cell, L, INPUT, H, seed=1)
    x = np.random.default_rng(0).standard_normal((T, B, INPUT)).astype(np.float32)
    lengths = np.array([6, 2, 4])
    left = np.broadcast_to(lengths[None, :, None].astype(np.float32), (L, B, H)).copy()
    out = run_reference(masked(cell), params, {"x": x, STEPS_LEFT: left}, L)
    for b, n in enumerate(lengths):
        alone = run_reference(cell, params, {"x": x[:n, b:b + 1]}, L)
        np.testing.assert_allclose(out.y[:n, b], alone.y[:, 0], atol=1e-6)
        assert np.all(out.y[n:, b] == 0)
        for state in cell.updates:
            np.testing.assert_allclose(out.final[state][:, b], alone.final[state][:, 0], atol=1e-6)


def test_a_cell_using_the_reserved_ids_is_refused_naming_the_node():
    cell = load_template("lstm")
    cell.nodes.append(Node("cf_len_mine", "const", value=1.0))
    with pytest.raises(CellError, match="node 'cf_len_mine' has an id that starts with 'cf_len_'"):
        masked(cell)
