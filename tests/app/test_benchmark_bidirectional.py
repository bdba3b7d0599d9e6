"""The benchmark panel's Bidirectional box: both directions of one layer side by side, each with weights of
its own (the command line's --bidirectional), refused with more than one layer as the bench refuses it."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import pytest
from bench_setup import one_quick_numpy_rung
from PySide6 import QtCore

from cellfuse.app.bench_runs import BenchRun, comparison_rows
from cellfuse.gpu_runtime.bench import BenchResult, BenchRow, run_benchmark
from cellfuse.graph_model import CellError, Sizes

TIMEOUT_MS = 60_000
SMALL = {"seq": 6, "batch": 3, "input": 8, "hidden": 8, "layers": 1}


def refused(window, words: str) -> None:
    """Run (F5) starts nothing and the status says why, the box marked and its tooltip saying it too."""
    panel = window.bench_panel
    window.actions_.benchmark.trigger()
    assert window.worker is None and panel.run_button.isEnabled()
    assert words in panel.status.text(), panel.status.text()
    assert panel.bidirectional_check.property("invalid")
    assert panel.bidirectional_check.toolTip() == panel.status.text()


def test_the_box_gives_the_benchmark_both_directions(qtbot, window):
    panel = window.bench_panel
    panel.set_sizes(**SMALL)
    check = panel.bidirectional_check
    assert check.text() == "Bidirectional" and not check.isChecked()  # one direction, as before
    assert not window.bench_config().bidirectional
    assert check.isVisibleTo(panel)
    tip = check.toolTip()
    assert "Both directions of one layer side by side" in tip and "each with weights of its own" in tip
    assert "one layer only" in tip
    # Under the Lengths drop-down, in its column.
    lengths = panel.lengths_button.geometry()
    assert check.y() >= lengths.bottom() and check.x() <= lengths.x() < check.geometry().right()

    # Reached with Tab and ticked with the space bar.
    assert check.focusPolicy() & QtCore.Qt.FocusPolicy.TabFocus
    qtbot.keyClick(check, QtCore.Qt.Key.Key_Space)
    assert check.isChecked() and panel.bidirectional()
    config = window.bench_config()
    assert config.bidirectional and config.sizes == Sizes(**SMALL) and config.lengths is None
    assert panel.bidirectional_problem() is None and not check.property("invalid")

    check.click()
    assert not window.bench_config().bidirectional


def test_more_than_one_layer_is_refused_with_a_message_before_any_run(window):
    panel = window.bench_panel
    panel.set_sizes(**{**SMALL, "layers": 2})
    assert panel.bidirectional_problem() is None  # one direction: any number of layers
    panel.bidirectional_check.click()
    assert "Bidirectional runs one layer, not 2" in panel.status.text()  # said as it is ticked, not on Run
    refused(window, "make Layers L 1, or untick Bidirectional")
    # The bench refuses it too: the panel only says so before the worker starts.
    with pytest.raises(CellError, match="runs one layer, not 2"):
        run_benchmark(window.cell, replace(window.bench_config(), backend="numpy", repeats=1))

    panel.set_sizes(layers=1)
    assert not panel.bidirectional_check.property("invalid")
    assert panel.bidirectional_check.toolTip().startswith("Both directions of one layer")
    assert panel.status.text() == "Both directions of the layer, side by side."  # said again once it can run

    # In a sweep of layers, each value must be 1: the spin box's layers are not run.
    panel.sweep_combo.setCurrentText("layers")
    panel.sweep_values.setText("1, 4")
    refused(window, "not the sweep's L=4")
    panel.sweep_values.setText("1")
    assert panel.bidirectional_problem() is None
    panel.set_sizes(layers=3)
    assert panel.bidirectional_problem() is None  # swept: L=1 only
    panel.sweep_combo.setCurrentText("seq")
    assert "not 3" in panel.bidirectional_problem()

    # Unticked, it runs one direction of the three layers.
    panel.bidirectional_check.click()
    assert panel.bidirectional_problem() is None and not panel.bidirectional_check.property("invalid")
    assert panel.status.text() == "One direction of the layer."


def test_a_numpy_run_of_both_directions_says_so(qtbot, window):
    panel = window.bench_panel
    one_quick_numpy_rung(panel, SMALL)
    panel.bidirectional_check.click()
    with qtbot.waitSignal(window.bench_finished, timeout=TIMEOUT_MS) as blocker:
        window.actions_.benchmark.trigger()
        assert window.worker is not None and window.worker.config.bidirectional
    qtbot.waitUntil(lambda: window.worker is None, timeout=TIMEOUT_MS)
    run = blocker.args[0]
    assert run.result.bidirectional and run.bidirectional
    assert run.result.row("naive").ok  # checked against the reference's two directions

    item = panel.history.item(0)
    assert " · T6 B3 in8 h8 L1 · both directions · " in item.text()
    assert "Both directions of the layer side by side, each with weights of its own." in item.toolTip()
    assert "both directions of the layer side by side" in panel.status.text()


def fake_run(number: int, bidirectional: bool) -> BenchRun:
    rows = [BenchRow("naive", "schedule", True, 10.0, 9.9, 10.1)]
    result = BenchResult("LSTM", "", Sizes(6, 3, 8, 8, 1), "numpy", "CPU", "", {}, rows,
                         bidirectional=bidirectional)
    return BenchRun(number, result, started=dt.datetime(2024, 5, 1, 12, 0, 0))


def test_runs_that_differ_only_in_directions_are_told_apart(window):
    one, both = fake_run(1, False), fake_run(1, True)
    assert "both directions" not in one.label() and one.directions_text() == ""
    assert both.label() == "#1 LSTM · numpy · T6 B3 in8 h8 L1 · both directions · 12:00:00"
    assert one.label() == "#1 LSTM · numpy · T6 B3 in8 h8 L1 · 12:00:00"

    panel = window.bench_panel
    panel.add_run(fake_run(1, False))
    panel.add_run(fake_run(2, True))
    assert "both directions" not in panel.history.item(0).text()
    assert "both directions" in panel.history.item(1).text()
    # Like two sizes, they compare: the second's times are of twice the work, as its label says.
    panel.history.item(0).setSelected(True)
    assert [cells for cells, _ in comparison_rows(*panel.runs)[1]] == [["naive", "10", "10", "1.00×"]]
    assert panel.table.horizontalHeaderItem(2).text() == "#2 ms"


def test_the_presets_run_one_direction(window):
    panel = window.bench_panel
    for name in ("Quick CPU", "Default"):
        panel.bidirectional_check.click()
        assert window.bench_config().bidirectional
        (preset,) = [a for a in panel.preset_button.menu().actions() if a.text().startswith(name)]
        assert "one direction" in preset.text()
        preset.trigger()
        assert not panel.bidirectional_check.isChecked() and not window.bench_config().bidirectional
        assert name in panel.status.text()
