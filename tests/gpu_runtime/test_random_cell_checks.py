"""Random cells with every op, row reductions and tied widths, forward and backward under every schedule
against the reference (random_cell_checks): a few here on numpy and on the GPU; hundreds by hand on the
GPU machine with `python tests/random_cell_checks.py --count 300 --workers 16`."""

from __future__ import annotations

import pytest
import random_cell_checks as rc

from cellfuse.gpu_runtime import execute


@pytest.mark.slow  # six cells, every schedule, forward and backward, in worker processes
def test_a_few_cells_match_under_every_schedule_on_numpy():
    checked = list(rc.check_many(range(rc.FIRST_SEED, rc.FIRST_SEED + 6), "numpy", workers=2))
    assert sorted(c.seed for c in checked) == list(range(rc.FIRST_SEED, rc.FIRST_SEED + 6))
    assert {c.layers for c in checked} == {1, 2, 3}
    for c in checked:
        assert c.failures == [], (c.seed, c.failures)


def test_a_wrong_schedule_and_a_crash_are_reported_by_schedule_and_pass(monkeypatch):
    right = execute.run_schedule

    def wrong(cell, params, inputs, layers, schedule, backend, *args):
        out = right(cell, params, inputs, layers, schedule, backend, *args)
        if schedule == "fused":
            out.y[0] += 1.0
        if schedule == "graph":
            raise RuntimeError("the launch failed")
        return out

    monkeypatch.setattr(execute, "run_schedule", wrong)
    c = rc.check(rc.FIRST_SEED + 1, "numpy")
    assert [line.split(":")[0] for line in c.failures] == ["fused forward", "graph forward"]
    assert c.failures[0].startswith("fused forward: relative error ")
    assert c.failures[1].startswith("graph forward: RuntimeError: the launch failed (")


@pytest.mark.gpu
def test_gpu_random_cells_match_under_every_schedule(gpu):
    checked = list(rc.check_many(range(rc.FIRST_SEED, rc.FIRST_SEED + 16), "cuda", workers=4))
    failed = {c.seed: c.failures for c in checked if c.failures}
    assert len(checked) == 16 and not failed, failed
