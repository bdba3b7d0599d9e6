"""The benchmark panel's sequence lengths: every batch row all T steps, or each row to a length of its own
drawn uniformly from LOW to HIGH (the command line's --lengths uniform:LOW-HIGH)."""

from __future__ import annotations

import numpy as np
import pytest
from bench_setup import one_quick_numpy_rung
from PySide6 import QtWidgets

from cellfuse.app.bench_runs import BenchRun, comparison_rows
from cellfuse.gpu_runtime.bench import BenchResult, BenchRow, draw_lengths
from cellfuse.graph_model import Sizes

TIMEOUT_MS = 60_000
SMALL = {"seq": 6, "batch": 3, "input": 8, "hidden": 8, "layers": 1}


def uniform(panel, low: int, high: int) -> None:
    """What a user does: picks uniform in the Lengths drop-down, then sets LOW and HIGH."""
    panel.lengths_uniform.click()
    panel.lengths_low.setValue(low)
    panel.lengths_high.setValue(high)


def refused(window, words: str) -> None:
    """Run (F5) starts nothing and the status says why, the range's boxes marked."""
    panel = window.bench_panel
    window.actions_.benchmark.trigger()
    assert window.worker is None and panel.run_button.isEnabled()
    assert words in panel.status.text(), panel.status.text()
    assert panel.lengths_low.property("invalid") and panel.lengths_high.property("invalid")
    assert words in panel.lengths_high.toolTip() and words in panel.lengths_button.toolTip()
    assert panel.lengths_error.text() == panel.status.text()  # said in the drop-down too


def test_the_lengths_control_gives_the_benchmark_its_lengths(window):
    panel = window.bench_panel
    panel.set_sizes(**SMALL)
    assert panel.lengths_all.isChecked() and panel.lengths_button.text() == "all T"  # the default
    assert window.bench_config().lengths is None
    assert not panel.lengths_low.isEnabled() and not panel.lengths_high.isEnabled()
    (form,) = [a.defaultWidget() for a in panel.lengths_button.menu().actions()]
    assert "Sequence lengths" in [w.text() for w in form.findChildren(QtWidgets.QLabel)]

    # Picking uniform offers a range that fits T = 6 (HIGH starts at the default T, 50).
    panel.lengths_uniform.click()
    assert panel.lengths_low.isEnabled() and panel.lengths_high.isEnabled()
    assert window.bench_config().lengths == "uniform:1-6"
    panel.lengths_low.setValue(2)
    panel.lengths_high.setValue(5)
    config = window.bench_config()
    assert config.lengths == "uniform:2-5" and config.sizes.seq == 6
    assert panel.lengths_button.text() == "2–5"
    assert "each row runs 2 to 5 of T=6" in panel.lengths_button.toolTip()
    drawn = draw_lengths(config.lengths, config.sizes.seq, 200, np.random.default_rng(0))
    assert drawn.min() == 2 and drawn.max() == 5  # the command line's spec, read the same
    assert not panel.lengths_high.property("invalid")

    panel.lengths_all.click()
    assert window.bench_config().lengths is None
    assert not panel.lengths_high.isEnabled() and panel.lengths_button.text() == "all T"


def test_an_invalid_range_is_refused_with_a_message_before_any_run(window):
    panel = window.bench_panel
    panel.set_sizes(**SMALL)
    uniform(panel, 5, 3)
    assert "LOW is more than HIGH" in panel.status.text()  # said as it is typed, not only on Run
    refused(window, "LOW is more than HIGH")

    panel.lengths_low.setValue(2)
    panel.lengths_high.setValue(9)
    refused(window, "longer than the sequence, T=6")

    # A sequence made shorter than HIGH refuses the range too.
    panel.lengths_high.setValue(6)
    assert not panel.lengths_high.property("invalid")
    assert "each row runs 2 to 6 of T=6 steps" in panel.status.text()  # said again once it can run
    panel.set_sizes(seq=4)
    refused(window, "longer than the sequence, T=4")

    # In a sweep of T, HIGH must fit its shortest sequence.
    panel.set_sizes(seq=6)
    panel.sweep_combo.setCurrentText("seq")
    panel.sweep_values.setText("4, 8")
    refused(window, "the shortest sequence of the sweep, T=4")
    panel.lengths_high.setValue(4)
    assert panel.lengths_problem() is None and not panel.lengths_high.property("invalid")


def test_a_numpy_run_with_lengths_says_each_row_ran_to_its_own(qtbot, window):
    panel = window.bench_panel
    one_quick_numpy_rung(panel, SMALL)
    uniform(panel, 2, 6)
    with qtbot.waitSignal(window.bench_finished, timeout=TIMEOUT_MS) as blocker:
        window.actions_.benchmark.trigger()
        assert window.worker is not None and window.worker.config.lengths == "uniform:2-6"
    qtbot.waitUntil(lambda: window.worker is None, timeout=TIMEOUT_MS)
    run = blocker.args[0]
    lengths = run.result.lengths
    assert len(lengths) == 3 and all(2 <= n <= 6 for n in lengths)
    assert run.result.row("naive").ok  # checked against the reference that stops each row there too
    span, mean = f"{min(lengths)}–{max(lengths)}", f"mean {sum(lengths) / 3:.1f}"

    item = panel.history.item(0)
    assert f"lengths {span}" in item.text()
    assert f"Each batch row ran to its own length: {span} steps, {mean}, of T=6." in item.toolTip()
    note = panel.results.lengths_note
    assert note.isVisibleTo(panel.results)
    assert note.text() == f"Each batch row ran to its own length: {span} steps, {mean}, of T=6."
    assert f"{span} steps, {mean}" in panel.status.text()
    assert panel.table_text()[0][0] == "naive"


def fake_run(number: int, lengths: list[int] | None) -> BenchRun:
    rows = [BenchRow("naive", "schedule", True, 10.0, 9.9, 10.1)]
    return BenchRun(number, BenchResult("LSTM", "", Sizes(6, 3, 8, 8, 1), "numpy", "CPU", "", {}, rows,
                                        lengths=lengths))


def test_runs_with_and_without_lengths_are_not_compared(window):
    panel = window.bench_panel
    for run in (fake_run(1, None), fake_run(2, [2, 5, 6]), fake_run(3, [3, 3, 4])):
        panel.add_run(run)
    note = panel.results.lengths_note
    panel.history.clearSelection()
    panel.history.item(0).setSelected(True)
    assert not note.isVisibleTo(panel.results)  # all T steps: nothing to say
    panel.history.item(1).setSelected(True)  # a Ctrl+click: the run without lengths beside one with
    message = window.statusBar().currentMessage()
    assert ("Run #1 runs every batch row all T steps and run #2 each batch row to its own length "
            "(2–6 steps): their times do not compare") in message
    assert panel.table_text() == [[message]]
    assert not [ax for ax in panel.figure.axes if ax.axison]  # no bars
    with pytest.raises(ValueError, match="do not compare"):
        comparison_rows(panel.runs[0], panel.runs[1])

    # Two runs with lengths compare, each run's lengths said over the table.
    panel.history.clearSelection()
    panel.history.item(1).setSelected(True)
    panel.history.item(2).setSelected(True)
    assert panel.table.horizontalHeaderItem(1).text() == "#2 ms"
    assert note.text() == ("Run #2: each batch row ran to its own length: 2–6 steps, mean 4.3, of T=6. "
                           "Run #3: each batch row ran to its own length: 3–4 steps, mean 3.3, of T=6.")


def test_the_quick_cpu_preset_runs_every_row_all_t_steps(window):
    panel = window.bench_panel
    uniform(panel, 10, 40)
    (quick,) = [a for a in panel.preset_button.menu().actions() if a.text().startswith("Quick CPU")]
    assert "all T steps" in quick.text()
    quick.trigger()
    assert panel.lengths_all.isChecked() and panel.lengths() is None
    assert window.bench_config().lengths is None and panel.lengths_problem() is None
    assert not panel.lengths_high.property("invalid")
    assert "Quick CPU" in panel.status.text()
