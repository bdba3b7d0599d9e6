"""`--schedule auto`: the rung measured fastest, measured once per GPU, cell and sizes, and remembered."""

from __future__ import annotations

import json
import logging

import pytest

from cellfuse.gpu_runtime import auto_schedule, cuda_executor
from cellfuse.gpu_runtime.auto_schedule import choose_schedule
from cellfuse.graph_model import CellError, Sizes, load_template

SIZES = Sizes(seq=10, batch=4, input=8, hidden=8)


@pytest.fixture
def gpu_here(monkeypatch, tmp_path):
    """A pretend GPU, and a cache in a temporary folder; returns the cache file and the calls to measure."""
    cache = tmp_path / "cache" / "schedules.json"
    monkeypatch.setattr(auto_schedule, "cache_path", lambda: cache)
    monkeypatch.setattr(cuda_executor, "device_description", lambda: "Pretend GPU (driver CUDA 13.0)")
    calls = []

    def measure(cell, sizes, precision="fp32"):
        calls.append(sizes)
        return {"graph": 1.0, "persistent": 0.5 if sizes.batch < 64 else 2.0}

    return cache, calls, measure


def test_without_a_gpu_auto_is_graph():
    choice = choose_schedule(load_template("lstm"), SIZES, "numpy")
    assert choice.schedule == "graph" and "no GPU" in choice.why


def test_measured_once_then_remembered(gpu_here):
    cache, calls, measure = gpu_here
    cell = load_template("lstm")
    first = choose_schedule(cell, SIZES, "cuda", measure)
    assert first.schedule == "persistent" and "persistent 0.500 ms" in first.why and len(calls) == 1
    again = choose_schedule(cell, SIZES, "cuda", measure)
    assert again.schedule == "persistent" and "before" in again.why and len(calls) == 1
    big = choose_schedule(cell, Sizes(10, 64, 8, 8), "cuda", measure)
    assert big.schedule == "graph" and len(calls) == 2
    other = choose_schedule(load_template("gru"), SIZES, "cuda", measure)  # another cell: measured again
    assert other.schedule == "persistent" and len(calls) == 3
    assert len(json.loads(cache.read_text())) == 3


def test_each_way_of_running_the_rungs_is_chosen_and_remembered_apart(gpu_here):
    """A module's call times the rungs otherwise than the benchmark does: its choice is measured with its
    own measure and does not take the benchmark's place."""
    cache, calls, measure = gpu_here
    cell = load_template("lstm")
    assert choose_schedule(cell, SIZES, "cuda", measure).schedule == "persistent"
    called = choose_schedule(cell, SIZES, "cuda", lambda cell, sizes, **_: {"graph": 0.2, "persistent": 0.3},
                             runs_as="called")
    assert called.schedule == "graph" and "measured fastest" in called.why
    assert choose_schedule(cell, SIZES, "cuda", measure).schedule == "persistent" and len(calls) == 1
    keys = sorted(json.loads(cache.read_text()))
    assert len(keys) == 2 and keys[1].endswith(" | called") and keys[0] == keys[1].removesuffix(" | called")


def test_a_choice_remembered_by_another_measurement_meanwhile_is_kept(gpu_here):
    """While one choice is measured (seconds), another process or thread may remember one of its own:
    both are in the file after."""
    cache, calls, measure = gpu_here
    cell = load_template("lstm")

    def measure_while_another_remembers(cell, sizes, precision="fp32"):
        choose_schedule(cell, sizes, "cuda", measure, runs_as="another way")
        return measure(cell, sizes, precision)
    choose_schedule(cell, SIZES, "cuda", measure_while_another_remembers)
    keys = json.loads(cache.read_text())
    assert len(keys) == 2 and len(calls) == 2 and any(key.endswith(" | another way") for key in keys)


def test_a_choice_remembered_for_other_rungs_is_measured_again(gpu_here, monkeypatch):
    """A new version of the rungs (the wavefront's meaning changed, say) makes every remembered choice
    stale: measured again, and remembered beside the old one."""
    cache, calls, measure = gpu_here
    cell = load_template("lstm")
    choose_schedule(cell, SIZES, "cuda", measure)
    monkeypatch.setattr(auto_schedule, "RUNGS_VERSION", auto_schedule.RUNGS_VERSION + 1)
    assert choose_schedule(cell, SIZES, "cuda", measure).schedule == "persistent" and len(calls) == 2
    assert len(json.loads(cache.read_text())) == 2


def test_a_damaged_cache_is_measured_again_and_rewritten(gpu_here):
    cache, calls, measure = gpu_here
    cache.parent.mkdir(parents=True)
    cache.write_text("{not json")
    assert choose_schedule(load_template("lstm"), SIZES, "cuda", measure).schedule == "persistent"
    assert len(calls) == 1 and len(json.loads(cache.read_text())) == 1


@pytest.mark.parametrize("damaged", [b"{not json", b"[1, 2]", b"\xff\xfe not UTF-8", b""],
                         ids=["not JSON", "not an object", "not UTF-8", "empty"])
def test_a_damaged_cache_is_logged_a_missing_one_is_not(gpu_here, caplog, damaged):
    cache, _, measure = gpu_here
    cell = load_template("lstm")
    with caplog.at_level(logging.WARNING, logger=auto_schedule.__name__):
        choose_schedule(cell, SIZES, "cuda", measure)
        assert caplog.records == []
        cache.write_bytes(damaged)
        choose_schedule(cell, SIZES, "cuda", measure)
    assert [str(cache) in r.getMessage() for r in caplog.records] == [True]
    assert len(json.loads(cache.read_text())) == 1


def test_the_cache_goes_where_the_environment_says(monkeypatch, tmp_path):
    monkeypatch.setenv("CELLFUSE_CACHE_DIR", str(tmp_path))
    assert auto_schedule.cache_path() == tmp_path / "schedules.json"


def test_an_unwritable_cache_still_gives_the_choice(gpu_here, monkeypatch, tmp_path):
    _, calls, measure = gpu_here
    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setattr(auto_schedule, "cache_path", lambda: blocker / "schedules.json")
    assert choose_schedule(load_template("lstm"), SIZES, "cuda", measure).schedule == "persistent"


def test_no_candidate_that_ran_is_an_error(gpu_here):
    with pytest.raises(CellError, match="none of graph, persistent, tensor ran correctly"):
        choose_schedule(load_template("lstm"), SIZES, "cuda", lambda cell, sizes, **_: {})


@pytest.mark.gpu
def test_auto_measures_the_rungs_on_the_gpu_and_runs_the_fastest(gpu, monkeypatch, tmp_path):
    import numpy as np

    from cellfuse.gpu_runtime.execute import run_schedule
    from cellfuse.graph_model import init_params, run_reference

    cache = tmp_path / "schedules.json"
    monkeypatch.setattr(auto_schedule, "cache_path", lambda: cache)
    cell = load_template("lstm")
    params = init_params(cell, 1, 64, 64, 0)
    x = np.random.default_rng(0).standard_normal((20, 2, 64)).astype(np.float32)
    said = []
    out = run_schedule(cell, params, {"x": x}, 1, "auto", "cuda", chosen=said.append)
    (why,) = said
    entry = next(iter(json.loads(cache.read_text()).values()))
    one_layer = {"graph", "persistent", "tensor"}  # no wavefront for one layer
    assert entry["schedule"] in one_layer and set(entry["ms"]) == one_layer
    assert f"auto: '{entry['schedule']}'" in why
    ref = run_reference(cell, params, {"x": x})
    assert float(np.abs(out.y - ref.y).max() / np.abs(ref.y).max()) < 1e-4


@pytest.mark.parametrize("beside_ms, want", [
    ({"graph": 1.5, "persistent": 1.4, "tensor": 0.9}, ("tensor", True)),  # side by side pays
    ({"graph": 1.5, "persistent": 3.1, "tensor": 1.2}, ("persistent", False)),  # half of the SMs does not
])
def test_a_bidirectional_layer_measures_both_ways_and_remembers_which(gpu_here, beside_ms, want):
    """Both directions side by side (measured) against one after the other (twice one direction's time):
    the fastest of all, and whether side by side, remembered apart from the one-direction choice."""
    cache, _, _ = gpu_here
    calls = []

    def measure(cell, sizes, bidirectional=False, precision="fp32"):
        calls.append(bidirectional)
        return beside_ms if bidirectional else {"graph": 1.0, "persistent": 0.5, "tensor": 0.6}

    cell = load_template("lstm")
    choice = choose_schedule(cell, SIZES, "cuda", measure, bidirectional=True)
    assert (choice.schedule, choice.beside) == want and calls == [False, True]
    assert ("side by side" if want[1] else "one after the other") in choice.why
    again = choose_schedule(cell, SIZES, "cuda", measure, bidirectional=True)
    assert (again.schedule, again.beside) == want and "before" in again.why and len(calls) == 2
    alone = choose_schedule(cell, SIZES, "cuda", measure)
    assert (alone.schedule, alone.beside) == ("persistent", False) and len(calls) == 3
    assert len(json.loads(cache.read_text())) == 2


def test_a_16_bit_choice_is_measured_in_its_precision_and_remembered_apart(gpu_here):
    """auto in bf16 measures the rungs in bf16 (the bench leaves out those that do not run it) and keeps
    its choice apart from float32's."""
    cache, _, _ = gpu_here
    asked = []

    def measure(cell, sizes, bidirectional=False, precision="fp32"):
        asked.append(precision)
        return {"graph": 1.0, "tensor": 0.5} if precision == "bf16" else {"graph": 1.0, "persistent": 0.4}

    cell = load_template("lstm")
    assert choose_schedule(cell, SIZES, "cuda", measure, precision="bf16").schedule == "tensor"
    assert choose_schedule(cell, SIZES, "cuda", measure).schedule == "persistent"
    assert choose_schedule(cell, SIZES, "cuda", measure, precision="bf16").schedule == "tensor"
    assert asked == ["bf16", "fp32"]  # the third remembered
    assert sum(" | bf16" in key for key in json.loads(cache.read_text())) == 1
