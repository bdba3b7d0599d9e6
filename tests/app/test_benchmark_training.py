"""The benchmark panel's training mode (forward + backward), run for real on the numpy backend at tiny
sizes: the switch, the baselines it offers, the results that say what they time, and a run history
that keeps forward and training runs apart."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

from cellfuse.app.bench_charts import draw_comparison
from cellfuse.app.bench_panel import TRAIN_TEXT
from cellfuse.app.bench_runs import BenchRun, comparison_rows
from cellfuse.codegen import SCHEDULES
from cellfuse.codegen.scheduler import LADDER
from cellfuse.gpu_runtime.bench import BASELINES, TOLERANCE, TRAIN_BASELINES, TRAIN_NOTES

TIMEOUT_MS = 120_000
TINY = {"seq": 4, "batch": 2, "input": 8, "hidden": 8, "layers": 1}
FORWARD_ONLY = [b for b in BASELINES if b not in TRAIN_BASELINES]


def run(qtbot, window) -> BenchRun:
    with qtbot.waitSignal(window.bench_finished, timeout=TIMEOUT_MS) as blocker:
        window.actions_.benchmark.trigger()
        assert not window.bench_panel.train_check.isEnabled()  # the mode stays as it is while it runs
    qtbot.waitUntil(lambda: window.worker is None, timeout=TIMEOUT_MS)
    assert blocker.args[0] is not None, window.bench_panel.status.text()
    return blocker.args[0]


def numpy_panel(window, train: bool, schedules: tuple[str, ...] | None = None):
    panel = window.bench_panel
    panel.set_sizes(**TINY)
    panel.backend_combo.setCurrentText("numpy")
    panel.repeats_spin.setValue(1)
    panel.train_check.setChecked(train)
    for name, check in panel.schedule_checks.items():
        check.setChecked(schedules is None or name in schedules)
    return panel


def header(panel) -> list[str]:
    return [panel.table.horizontalHeaderItem(j).text() for j in range(panel.table.columnCount())]


def test_the_training_switch_times_forward_plus_backward_with_checked_gradients(qtbot, window,
                                                                                chart_problems):
    panel = numpy_panel(window, train=True)
    assert window.bench_config().train
    run_ = run(qtbot, window)
    assert run_.train and run_.result.train and run_.result.backend == "numpy"
    assert "training" in panel.history.item(0).text()

    # The table says what its numbers are: times of forward + backward, errors of the gradients.
    columns = header(panel)
    assert columns[2] == "Median ms, fwd+bwd" and columns[5] == "Grad. rel. error"
    rows = {r[0]: r for r in panel.table_text()}
    for name in SCHEDULES:
        assert float(rows[name][5]) < TOLERANCE, (name, rows[name])  # the gradients, checked first
        assert float(rows[name][2]) > 0.0, (name, rows[name])  # then timed
    assert rows["numpy reference"][-1] == TRAIN_NOTES["numpy reference"]
    # Backward launches count too: every schedule that launches per step launches more than its forward
    # Plan alone; the persistent ones launch none, the backward's reverse loop a persistent kernel too.
    assert all(int(rows[name][7]) == 0 if LADDER[name].persistent else int(rows[name][7]) >= 2
               for name in SCHEDULES)

    fig = panel.figure
    assert "forward + backward" in fig._suptitle.get_text()
    ax_time = next(ax for ax in fig.axes if ax.axison)
    assert "forward + backward pass" in ax_time.get_xlabel()
    assert not chart_problems(fig)


@pytest.mark.slow
def test_a_training_sweep_says_forward_plus_backward(qtbot, window):
    panel = numpy_panel(window, train=True, schedules=("naive",))
    for check in panel.baseline_checks.values():
        check.setChecked(False)
    panel.sweep_combo.setCurrentText("seq")
    panel.sweep_values.setText("2, 4")
    run_ = run(qtbot, window)
    assert run_.train and all(r.train for r in run_.sweep.results)
    assert "forward + backward" in panel.figure._suptitle.get_text()
    assert "forward + backward pass" in panel.figure.axes[0].get_ylabel()
    assert header(panel)[:4] == ["seq", "Implementation", "Kind", "Median ms, fwd+bwd"]


def test_training_offers_only_the_baselines_that_have_a_backward_pass(window):
    panel = window.bench_panel
    panel.train_check.setChecked(False)
    assert all(c.isEnabled() for c in panel.baseline_checks.values())
    assert panel.baselines() == list(BASELINES)
    assert panel.baselines_button.text() == f"all {len(BASELINES)}"

    panel.train_check.setChecked(True)
    for name, check in panel.baseline_checks.items():
        forward_only = name in FORWARD_ONLY
        assert check.isEnabled() != forward_only, name
        assert ("Forward only" in check.toolTip()) == forward_only, name
    assert FORWARD_ONLY and panel.baselines() == list(TRAIN_BASELINES)
    assert panel.baselines_button.text() == f"all {len(TRAIN_BASELINES)}"
    assert not any(name in panel.baselines_button.toolTip() for name in FORWARD_ONLY)
    panel.baseline_checks["cudnn"].setChecked(False)
    assert panel.baselines_button.text() == f"{len(TRAIN_BASELINES) - 1} of {len(TRAIN_BASELINES)}"
    config = window.bench_config()
    assert config.train and set(config.baselines) == set(TRAIN_BASELINES) - {"cudnn"}

    # Back to the forward pass: the forward-only baselines are offered again, still ticked.
    panel.train_check.setChecked(False)
    assert all(c.isEnabled() for c in panel.baseline_checks.values())
    assert set(FORWARD_ONLY) <= set(panel.baselines()) and "cudnn" not in panel.baselines()
    assert not window.bench_config().train


@pytest.mark.slow
def test_the_choice_is_remembered_by_the_next_window(make_window):
    first = make_window()
    assert not first.bench_panel.train_check.isChecked()  # forward by default
    first.bench_panel.train_check.setChecked(True)
    second = make_window()
    assert second.bench_panel.train()
    assert "pytorch graph" not in second.bench_panel.baselines()
    second.bench_panel.train_check.setChecked(False)
    assert not make_window().bench_panel.train()


@pytest.mark.slow
def test_the_history_keeps_forward_and_training_runs_apart(qtbot, qapp, window, chart_problems):
    numpy_panel(window, train=False, schedules=("naive", "hoisted"))
    panel = window.bench_panel
    forward = run(qtbot, window)
    panel.train_check.setChecked(True)
    train_a = run(qtbot, window)
    train_b = run(qtbot, window)
    assert not forward.train and train_a.train and train_b.train
    assert "training" not in forward.label() and "training" in train_a.label()

    # A forward run beside a training run: refused, in the chart and in the table, saying why.
    panel.history.clearSelection()
    panel.history.item(0).setSelected(True)
    panel.history.item(1).setSelected(True)
    qapp.processEvents()
    (message,) = [t.get_text() for ax in panel.figure.axes for t in ax.texts]
    assert "#1 times forward and run #2 forward + backward" in message and "do not compare" in message
    assert header(panel) == ["Comparison"] and panel.table_text() == [[message]]
    assert not [ax for ax in panel.figure.axes if ax.axison]  # no bars
    with pytest.raises(ValueError, match="do not compare"):
        comparison_rows(forward, train_a)
    with pytest.raises(ValueError, match="do not compare"):
        draw_comparison(forward, train_a, Figure())

    # Two training runs compare, and say that their times are forward + backward.
    panel.history.clearSelection()
    panel.history.item(1).setSelected(True)
    panel.history.item(2).setSelected(True)
    qapp.processEvents()
    assert header(panel)[:3] == ["Implementation", "#2 ms, fwd+bwd", "#3 ms, fwd+bwd"]
    assert {r[0] for r in panel.table_text()} >= {"naive", "hoisted"}
    ax_time = next(ax for ax in panel.figure.axes if ax.axison)
    assert ax_time.get_xlabel().startswith("ms per forward + backward pass")
    assert "forward + backward" in panel.figure.legends[0].get_title().get_text()
    assert not chart_problems(panel.figure)


@pytest.mark.slow
@pytest.mark.parametrize("size", [(1366, 768), (1280, 720)])
def test_the_switch_and_a_training_table_fit_the_default_layout(qtbot, qapp, window, size):
    window.resize(*size)
    window.arrange_docks()
    window.bench_dock.raise_()
    for _ in range(3):
        qapp.processEvents()
    panel = numpy_panel(window, train=True, schedules=("naive", "fused"))
    check = panel.train_check
    assert check.text() == TRAIN_TEXT and check.isVisible()
    assert check.width() >= check.sizeHint().width(), (check.width(), check.sizeHint())  # its text whole
    assert panel.run_button.width() >= panel.run_button.sizeHint().width()
    assert panel.progress.width() >= 100  # the progress bar beside it keeps room to be read
    scroll = panel.settings_scroll
    assert scroll.widget().sizeHint().width() <= scroll.viewport().width()
    assert not scroll.horizontalScrollBar().isVisible() and not scroll.verticalScrollBar().isVisible()

    run(qtbot, window)
    qapp.processEvents()
    table = panel.table
    last = 3  # Implementation, Kind, Median ms (fwd+bwd), Min ms: whole, without scrolling
    assert table.columnViewportPosition(last) + table.columnWidth(last) <= table.viewport().width()
    item = table.horizontalHeaderItem(2)
    room = table.columnWidth(2)
    assert table.horizontalHeader().fontMetrics().horizontalAdvance(item.text()) < room, (item.text(), room)


@pytest.mark.gpu
def test_gpu_training_times_the_schedules_and_the_autograd_baselines(qtbot, window):
    from cellfuse.gpu_runtime.cuda_executor import GpuUnavailable, gpu_modules

    try:
        gpu_modules()
    except GpuUnavailable as e:
        pytest.skip(str(e))
    panel = window.bench_panel
    panel.set_sizes(seq=8, batch=4, input=64, hidden=64, layers=1)
    panel.backend_combo.setCurrentText("cuda")
    panel.repeats_spin.setValue(3)
    panel.train_check.setChecked(True)
    run_ = run(qtbot, window)
    result = run_.result
    assert result.train and result.backend == "cuda"
    names = {r.name for r in result.rows}
    assert not names & set(FORWARD_ONLY)
    for name in SCHEDULES:
        row = result.row(name)
        assert row.ok and row.rel_error < TOLERANCE and row.median_ms > 0, (name, row)
    eager = result.row("pytorch eager")
    assert eager is None or (eager.ok and eager.rel_error < TOLERANCE), eager
