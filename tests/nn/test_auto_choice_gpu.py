"""`auto` for the modules on a GPU: the rungs the benchmark checked, timed again as a module calls them,
and that choice remembered apart from the benchmark's."""

from __future__ import annotations

import json
import math

import pytest
import torch

from cellfuse.gpu_runtime import auto_schedule
from cellfuse.graph_model import Sizes, load_template
from cellfuse.nn import auto_choice

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("precision, train", [("fp32", False), ("bf16", False), ("fp32", True),
                                              ("bf16", True)])
def test_every_checked_rung_is_timed_as_called(cuda, monkeypatch, tmp_path, bidirectional, precision, train):
    """Each rung the benchmark checked (in training: its gradients too) timed as a module calls it (in
    training: its forward call that saves the steps, then its backward call), and the choice remembered
    apart for each way."""
    monkeypatch.setattr(auto_schedule, "cache_path", lambda: tmp_path / "schedules.json")
    # (a bidirectional layer is measured one layer at a time)
    cell = load_template("lstm")
    sizes = Sizes(seq=12, batch=4, input=16, hidden=32, layers=1 if bidirectional else 2)
    checked = auto_schedule.bench_times(cell, sizes, bidirectional, precision, train)
    called = auto_choice.called_times(cuda, cell, sizes, bidirectional, precision, train)
    assert set(called) == set(checked) and "persistent" in called
    assert all(math.isfinite(ms) and ms > 0 for ms in called.values())
    choice = auto_choice.choose(cell, sizes, cuda, bidirectional, precision, train)
    (key,) = json.loads((tmp_path / "schedules.json").read_text())
    runs_as = auto_choice.RUNS_AS + (auto_choice.TRAINING if train else "")
    assert key.endswith(f" | {runs_as}") and choice.schedule in called


def test_a_training_call_under_auto_runs_the_rung_chosen_for_training(cuda, monkeypatch, tmp_path):
    """A module's training call and its inference call are planned by the choices remembered for each,
    and the training call's gradients are the named rung's."""
    monkeypatch.setattr(auto_schedule, "cache_path", lambda: tmp_path / "schedules.json")
    from cellfuse.nn import CellRNN

    rnn = CellRNN("lstm", 16, 24, 1, schedule="auto", seed=4).to(cuda)
    x = torch.randn(13, 5, 16, device=cuda)  # (sizes no other test runs: auto is measured here)
    y, _ = rnn(x)
    y.square().sum().backward()
    with torch.no_grad():
        rnn(x)
    entries = json.loads((tmp_path / "schedules.json").read_text())
    (training,) = (e for key, e in entries.items() if key.endswith(auto_choice.TRAINING))
    (inference,) = (e for key, e in entries.items() if key.endswith(auto_choice.RUNS_AS))
    assert rnn.schedules_run == [training["schedule"], inference["schedule"]]
    named = CellRNN("lstm", 16, 24, 1, schedule=training["schedule"], seed=4).to(cuda)
    want, _ = named(x)
    want.square().sum().backward()
    for key in rnn.keys:
        torch.testing.assert_close(rnn.param(key).grad, named.param(key).grad)


def test_a_module_under_auto_runs_the_rung_chosen_as_called(cuda, monkeypatch, tmp_path):
    monkeypatch.setattr(auto_schedule, "cache_path", lambda: tmp_path / "schedules.json")
    from cellfuse.nn import CellRNN

    rnn = CellRNN("lstm", 16, 24, 2, schedule="auto").to(cuda)
    with torch.no_grad():  # (sizes no other test runs: auto is measured here)
        rnn(torch.randn(11, 3, 16, device=cuda, dtype=torch.bfloat16))
    (entry,) = json.loads((tmp_path / "schedules.json").read_text()).values()
    assert rnn.schedules_run == [entry["schedule"]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_before_any_eager_call_auto_measures_on_real_tensors(cuda, monkeypatch, tmp_path, dtype):
    """torch.compile asks for the plans from the op's fake implementation: `auto` times the rungs there,
    on real tensors, and the compiled module matches eager."""
    monkeypatch.setattr(auto_schedule, "cache_path", lambda: tmp_path / "schedules.json")
    from cellfuse.nn import CellRNN

    torch._dynamo.reset()
    rnn = CellRNN("gru", 16, 20, 1, schedule="auto", seed=2).to(cuda)
    x = torch.randn(9, 5, 16, device=cuda, dtype=dtype)  # (sizes no other test runs: auto is measured)
    with torch.no_grad():
        got, _ = torch.compile(rnn, fullgraph=True)(x)
        want, _ = rnn(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    (entry,) = json.loads((tmp_path / "schedules.json").read_text()).values()
    assert rnn.schedules_run == [entry["schedule"]]
