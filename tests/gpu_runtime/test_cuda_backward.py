"""The backward Plan on the GPU: the gradients of every template and of seeded random cells (with row
reductions and without), on every schedule of the graph family, against the float64 reference."""

from __future__ import annotations

import pytest
from gradient_runs import GRAPH_FAMILY, assert_gradients, make_run
from random_cells import random_cell

from cellfuse.graph_model import Sizes, load_template, template_names

pytestmark = pytest.mark.gpu

SIZES = Sizes(seq=7, batch=5, input=24, hidden=40)


@pytest.mark.parametrize("schedule", [*GRAPH_FAMILY, "persistent", "wavefront"])
@pytest.mark.parametrize("name", template_names())
def test_gradients_of_every_template_on_the_gpu(gpu, name, schedule):
    cell = load_template(name)
    run = make_run(cell, 2, seed=1, initial=name != "slstm", sizes=SIZES, scale=1.0)
    assert_gradients(run.cuda(schedule), run.reference(), 1e-4, f"{name} {schedule}")


@pytest.mark.parametrize("schedule", GRAPH_FAMILY)
@pytest.mark.parametrize("reductions", [False, True])
def test_gradients_of_seeded_random_cells_on_the_gpu(gpu, schedule, reductions):
    """With reductions, the adjoint kernels of layer norms and columns run a block per row."""
    for seed in range(20):
        cell = random_cell(seed, reductions=reductions)
        run = make_run(cell, 1 + seed % 2, seed=seed, initial=seed % 3 != 0, sizes=SIZES, scale=1.0)
        assert_gradients(run.cuda(schedule), run.reference(), 1e-4, f"random cell {seed}")


@pytest.mark.parametrize("schedule", ["graph", "persistent", "tensor"])
@pytest.mark.parametrize("name, batch, layers", [("lstm", 64, 1), ("lstm", 1, 2), ("gru_cho", 64, 1),
                                                 ("gru", 8, 2), ("mgu", 80, 1), ("indrnn", 64, 1),
                                                 ("sru", 19, 2)])
def test_gradients_at_full_sizes_on_the_gpu(gpu, name, batch, layers, schedule):
    """At hidden 512 the persistent backward's blocks own 4 to 16 units, split the batch into row groups
    and stage the 2048 columns of dG in row tiles (on tensor cores, in chunks of 1024 columns); its dA
    GEMM reads W^T rows from shared memory. A step with no GEMM (IndRNN, the SRU) splits the rows too,
    at B=19 into groups of 10 and 9."""
    cell = load_template(name)
    run = make_run(cell, layers, seed=2, sizes=Sizes(seq=6, batch=batch, input=512, hidden=512), scale=1.0)
    assert_gradients(run.cuda(schedule), run.reference(), 1e-4, f"{name} {schedule} B={batch}")


@pytest.mark.parametrize("schedule", ["graph", "persistent"])
@pytest.mark.parametrize("name", ["lstm", "peephole_lstm"])
def test_gradients_with_gemms_on_tensor_cores(gpu, name, schedule):
    """At seq 6 and batch 200 the weights' gradients (K = 1200 rows) and x's (1200 rows) are GEMMs of
    more than 2^30 multiply-adds: on tensor cores (three fp16 products), within the same 1e-4."""
    cell = load_template(name)
    run = make_run(cell, 1, seed=5, sizes=Sizes(seq=6, batch=200, input=512, hidden=512), scale=1.0)
    assert_gradients(run.cuda(schedule), run.reference(), 1e-4, f"{name} {schedule} on tensor cores")
