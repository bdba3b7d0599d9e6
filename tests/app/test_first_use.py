"""What a new user meets first: the plan kept while a node is being drawn, the charts, the small
touches of the canvas and panels, Help → About, and the hint when Qt cannot open a window."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from matplotlib.figure import Figure

from cellfuse.app import about, platform_check, theme
from cellfuse.gpu_runtime.bench import BenchConfig, run_benchmark
from cellfuse.gpu_runtime.plots import needs_log_scale, plot_result
from cellfuse.graph_model import Sizes, load_template

TIMEOUT_MS = 60_000


def test_an_invalid_cell_keeps_the_last_plan_and_cuda_marked_out_of_date(window):
    summary_before = window.plan_panel.stat_values["launches_per_step"].text()
    source = window.cuda_view.text()
    assert "__global__" in source and not window.plan_panel.out_of_date
    window.adapter.disconnect("h_new", "a")
    window.refresh_plan()
    panel, view = window.plan_panel, window.cuda_view
    assert panel.out_of_date and "Out of date" in panel.message.text()
    assert panel.stat_values["launches_per_step"].text() == summary_before
    assert panel.tree.topLevelItemCount() > 0
    assert view.out_of_date and "Out of date" in view.stale.text()
    assert source in view.text()
    view.scroll_to_node("ai_b")  # still finds its line below the note
    marks = view.editor.extraSelections()
    assert "v_ai_b =" in view.text().splitlines()[marks[-1].cursor.blockNumber()]
    window.actions_.undo.trigger()
    window.refresh_plan()
    assert not panel.out_of_date and panel.message.isHidden()
    assert not view.out_of_date and view.text() == source


@pytest.mark.slow
def test_selecting_a_node_marks_its_own_line_in_the_cuda(window):
    view = window.cuda_view
    window.show_node("ai_b")
    own = view.node_line("ai_b")
    assert own and own != view._kernel_line[view.kernel_of("ai_b")]
    marks = view.editor.extraSelections()
    marked = marks[-1].cursor.blockNumber() + 1
    assert marked == own
    assert view.text().splitlines()[own - 1].strip().startswith("const float v_ai_b =")
    assert f"line {own}" in view.location.text()


def result(times: dict[str, float], backend: str = "numpy"):
    rows = [SimpleNamespace(name=n, kind="schedule" if n != "numpy reference" else "baseline", ok=True,
                            median_ms=t) for n, t in times.items()]
    return SimpleNamespace(rows=rows, backend=backend, cancelled=False, cell="c", device="CPU", train=False,
                           precision="fp32", sizes=SimpleNamespace(seq=1, batch=1, input=1, hidden=1,
                                                                   layers=1),
                           row=lambda name: next((r for r in rows if r.name == name), None))


def test_time_axis_is_linear_from_zero_unless_the_range_is_large():
    fig = Figure(figsize=(9, 4))
    plot_result(result({"naive": 1970.0, "fused": 700.0, "graph": 350.0}), fig)
    ax = fig.axes[0]
    assert ax.get_xscale() == "linear" and ax.get_xlim()[0] == 0.0
    assert "log" not in ax.get_xlabel()
    assert [t.get_text().strip() for t in ax.texts] == ["1970", "700", "350"]
    assert needs_log_scale([1000.0, 1.0])
    plot_result(result({"naive": 1000.0, "graph": 1.0}), fig)
    assert fig.axes[0].get_xscale() == "log" and "log scale" in fig.axes[0].get_xlabel()


def test_ticked_baselines_that_could_not_run_are_said():
    config = BenchConfig(Sizes(seq=2, batch=1, input=3, hidden=4), "numpy", schedules=["graph"],
                         baselines=["numpy reference", "pytorch eager", "cudnn"], repeats=1)
    res = run_benchmark(load_template("lstm"), config)
    assert [r.name for r in res.rows] == ["graph", "numpy reference"]
    assert set(res.left_out) == {"pytorch eager", "cudnn"}
    assert all("not available" in why and "no GPU/PyTorch" in why for why in res.left_out.values())
    assert res.to_json()["left_out"] == res.left_out


def test_numpy_run_lists_unavailable_baselines_and_charts_dark_saves_light(qtbot, window, tmp_path):
    panel = window.bench_panel
    panel.backend_combo.setCurrentText("numpy")
    panel.repeats_spin.setValue(1)
    with qtbot.waitSignal(window.bench_finished, timeout=TIMEOUT_MS):
        window.run_benchmark()
    qtbot.waitUntil(lambda: window.worker is None, timeout=TIMEOUT_MS)
    rows = {r[0]: r for r in panel.table_text()}
    assert "not available" in rows["pytorch eager"][-1] and rows["pytorch eager"][2] == ""
    assert panel.figure.get_facecolor()[0] < 0.3  # dark, as the window
    path = tmp_path / "chart.png"
    panel.results.save_chart(str(path))
    from matplotlib.image import imread

    corner = imread(str(path))[2, 2]
    assert corner[:3].min() > 0.95  # a saved chart is light
    assert panel.figure.get_facecolor()[0] < 0.3


@pytest.mark.slow
def test_paste_lands_clear_of_the_originals(window):
    a = window.adapter
    window.show_node("hi")  # opens the input gate's group, where hi is
    window.copy_selection()
    (new,) = window.paste()
    assert a.open_group == "input gate" and new in window.cell.groups[0].nodes  # it joins the open group
    old_rect = a.node("hi").view.sceneBoundingRect()
    new_rect = a.node(new).view.sceneBoundingRect()
    assert a.node(new).view.isVisible() and a.selected_ids() == [new]
    assert not old_rect.intersects(new_rect)
    assert new_rect.top() >= old_rect.bottom() + 20


@pytest.mark.slow
def test_the_palette_filter_is_reset_after_adding_a_node(user, window):
    user.add("sigmoid")
    assert window.palette.search.text() == ""
    assert "matmul" in window.palette.ops() and "tanh" in window.palette.ops()


def test_selection_and_warning_borders_differ():
    sel, warn = theme.SELECTED_COLOR, theme.WARNING_COLOR
    assert sum(abs(x - y) for x, y in zip(sel, warn, strict=True)) > 200


def test_spin_boxes_have_drawn_arrows():
    for part in ("QSpinBox::up-arrow", "QSpinBox::down-arrow", "QSpinBox::up-button"):
        assert part in theme.STYLESHEET


@pytest.mark.slow
def test_about_says_version_gpu_and_where_files_live(window):
    from cellfuse import __version__
    from cellfuse.app import autosave

    text = about.about_text()
    assert __version__ in text and "GPU" in text
    assert str(autosave.autosave_dir()) in text and "Settings" in text
    assert window.actions_.about in window.menuBar().actions()[-1].menu().actions()


def test_missing_xcb_libraries_give_an_install_hint():
    have = {"xcb-cursor", "xcb-image", "xcb-render-util", "xcb-randr", "xcb-shape", "xcb-xkb",
            "xkbcommon-x11"}

    def find(name):
        return f"lib{name}.so" if name in have else None

    x11 = {"DISPLAY": ":0"}
    hint = platform_check.platform_hint(x11, "linux", find)
    assert hint and "sudo apt install libxcb-icccm4 libxcb-keysyms1" in hint
    assert platform_check.platform_hint({"QT_QPA_PLATFORM": "offscreen"}, "linux", find) is None
    assert platform_check.platform_hint({"WAYLAND_DISPLAY": "wayland-0"}, "linux", find) is None
    assert platform_check.platform_hint({**x11, "QT_QPA_PLATFORM": "xcb"}, "linux", find) is not None
    assert platform_check.platform_hint({}, "darwin", find) is None
    assert platform_check.platform_hint(x11, "linux", lambda n: "lib.so") is None


def test_no_display_is_said_before_qt_aborts():
    hint = platform_check.platform_hint({}, "linux", lambda n: "lib.so")
    assert hint and "there is no display (DISPLAY is not set)" in hint and "xvfb-run cellfuse" in hint
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "QT_QPA_PLATFORM", "WAYLAND_DISPLAY")}
    done = subprocess.run([sys.executable, "-m", "cellfuse", "gui"], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 1 and "there is no display" in done.stderr, (done.returncode, done.stderr)


def test_a_template_name_opens_the_template(make_window):
    window = make_window("gru")
    assert window.cell.name == "GRU" and window.document.path is None


@pytest.mark.parametrize("signum, status, word", [(signal.SIGTERM, 143, "terminated"),
                                                  (signal.SIGINT, 130, "interrupted")])
def test_sigterm_and_ctrl_c_end_the_editor_with_the_command_lines_status(tmp_path, signum, status, word):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "XDG_CONFIG_HOME": str(tmp_path),
           "XDG_DATA_HOME": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    editor = subprocess.Popen([sys.executable, "-c", "import sys, time; from PySide6 import QtCore; "
                               "QtCore.QTimer.singleShot(0, lambda: print('ready', flush=True)); "
                               "from cellfuse.cli import main; sys.exit(main(['gui', 'lstm']))"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert editor.stdout.readline().strip() == "ready"
        time.sleep(1.0)  # the window starts
        editor.send_signal(signum)
        _, err = editor.communicate(timeout=60)
    finally:
        editor.kill()
    assert editor.returncode == status, err
    assert f"cellfuse: {word}" in err and "unexpected error" not in err


@pytest.mark.slow
def test_new_nodes_fill_free_spots_in_view_without_overlapping(window):
    a = window.adapter
    viewer = a.graph.viewer()
    before = {n.name() for n in a._nodes()}
    ops = ["sigmoid", "tanh", "add", "mul", "sigmoid", "const", "exp", "neg", "sub", "div", "relu", "state"]
    for op in ops:
        window.add_node(op)
    new = [n for n in a._nodes() if n.name() not in before]
    assert len(new) == len(ops) + 1  # the state brought its update node
    visible = viewer.mapToScene(viewer.viewport().rect()).boundingRect()
    rects = [n.view.sceneBoundingRect() for n in a._nodes() if n.view.isVisible()]  # not in closed groups
    for n in new:
        rect = n.view.sceneBoundingRect()
        assert visible.contains(rect), f"{n.name()} is out of sight"
        assert sum(rect.intersects(r) for r in rects) == 1, f"{n.name()} overlaps another node"


def test_ending_on_a_signal_keeps_unsaved_work_in_the_autosave(window):
    from cellfuse.app import autosave

    window.add_node("tanh")
    assert window.is_modified() and autosave.find_autosave(None) is None
    window.end_by_signal()
    found = autosave.find_autosave(None)
    assert found is not None and "tanh" in found.file.read_text()


def test_a_sweep_charts_labels_do_not_run_together(chart_problems):
    from cellfuse.gpu_runtime.bench import SweepResult
    from cellfuse.gpu_runtime.plots import plot_sweep

    res = run_benchmark(load_template("elman"), BenchConfig(Sizes(seq=4, batch=2, input=4, hidden=4), "numpy",
                                                            schedules=["naive"], baselines=[], repeats=1))
    values = [8000, 10000, 12000, 14000, 16000]
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = Figure(figsize=(8.0, 3.6))
    FigureCanvasAgg(fig)
    plot_sweep(SweepResult("seq", values, [res] * len(values)), fig)
    assert not chart_problems(fig)
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    boxes = [t.get_window_extent(renderer) for t in ax.get_xticklabels() if t.get_text()]
    assert len(boxes) == len(values)
    assert not [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a.overlaps(b)]
    assert ax.get_xscale() == "linear"  # 8000 to 16000: not a range that needs a log scale
