"""Files: new, open, save, reopen, export; unsaved changes, autosave and bad files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cellfuse.app import autosave, recent_files
from cellfuse.graph_model import CellError, load_cell, load_template, template_names
from cellfuse.graph_model.templates import template_text


def test_starts_with_an_lstm_ready_to_run(window):
    assert window.cell.name == "LSTM" and len(window.cell.nodes) == 40
    assert window.problems.problem_count() == 0
    assert window.windowTitle().startswith("LSTM (new)")
    assert not window.is_modified()
    assert window.plan_panel.stat_values["launches_per_step"].text() == "2"


@pytest.mark.parametrize("name", template_names())
def test_each_template_opens_with_no_problems(window, name, same):
    assert window.new_from_template(name)
    assert window.problems.problem_count() == 0, window.info.problems
    assert same(window.cell, load_template(name))
    assert not window.is_modified()
    window.refresh_plan()
    assert window.plan_panel.message.isHidden()
    assert window.overlay.regions


def test_save_and_reopen_gives_the_same_cell(make_window, answers, tmp_path, same):
    w = make_window()
    w.adapter.set_weight_shape("b_i", ["hidden"])
    w.adapter.auto_layout()
    answers.save_path = tmp_path / "mine"  # no suffix: .cell.json is added
    w.actions_.save.trigger()  # a new cell: Save asks where
    path = tmp_path / "mine.cell.json"
    assert path.is_file() and w.document.path == path
    assert not w.is_modified() and w.windowTitle().startswith("mine.cell.json")
    saved = w.cell.copy()
    assert same(load_cell(path), saved)

    other = make_window(path)
    assert same(other.cell, saved)
    assert other.cell.layout == saved.layout  # positions too
    assert other.cell.extra == saved.extra
    assert not other.is_modified()
    assert recent_files.recent_files()[0] == path.resolve()


@pytest.mark.slow
def test_save_is_atomic_and_keeps_the_format(window, tmp_path):
    path = tmp_path / "lstm.cell.json"
    assert window.save_as(path)
    data = json.loads(path.read_text())
    assert data["format"] == "cellfuse.cell/1"
    assert set(data["layout"]) == {n.id for n in window.cell.nodes}
    assert "x-editor" in data  # positions of update nodes and of the output node
    assert not list(tmp_path.glob(".*.tmp"))


def test_saving_a_cell_opened_through_a_symlink_keeps_the_link(window, user, tmp_path, same):
    (tmp_path / "cells").mkdir()
    target = tmp_path / "cells" / "lstm.cell.json"
    target.write_text(template_text("lstm"))
    link = tmp_path / "current.cell.json"
    link.symlink_to(Path("cells") / "lstm.cell.json")
    assert window.open_file(link)
    user.rename("U_f", "U_forget")
    assert window.is_modified() and window.save()
    assert link.is_symlink() and os.readlink(link) == str(Path("cells") / "lstm.cell.json")
    assert same(load_cell(target), window.cell) and load_cell(target).has("U_forget")
    assert sorted(p.name for p in (tmp_path / "cells").iterdir()) == ["lstm.cell.json"]


@pytest.mark.slow
def test_properties_survive_save_and_reload(make_window, user, window, tmp_path, same):
    user.rename("U_f", "U_forget")
    assert window.cell.node("hf").args == ["h", "U_forget"]
    k = user.add("const")
    user.set_value(k, "-2.5e-1")
    assert window.cell.node(k).value == -0.25
    window.adapter.connect(k, "ai_b", "b")
    window.show_node("b_o")
    window.properties.dims_combo.setCurrentIndex(1)  # 1-D -> 2-D
    window.properties.k_combo.setCurrentText("input")
    assert window.cell.node("b_o").shape == ["input", "hidden"]
    path = tmp_path / "edited.cell.json"
    assert window.save_as(path)

    again = make_window(path)
    cell = again.cell
    assert cell.has("U_forget") and not cell.has("U_f")
    assert cell.node(k).value == -0.25 and cell.node("ai_b").args == ["ai", k]
    assert cell.node("b_o").shape == ["input", "hidden"]
    assert same(cell, window.cell)
    again.show_node(k)
    assert float(again.properties.value_edit.text()) == -0.25


@pytest.mark.slow
def test_export_cuda_writes_the_chosen_schedule(window, answers, tmp_path):
    window.plan_panel.set_schedule("fused")
    answers.save_path = tmp_path / "lstm_fused.cu"
    window.actions_.export_cuda.trigger()
    text = answers.save_path.read_text()
    assert "__global__" in text and "ai_b" in text
    assert text == window.cuda_view.text()


def test_export_cuda_writes_the_kernels_as_fitted_and_says_which_it_rewrote(window, tmp_path, monkeypatch):
    """Export CUDA writes the kernels as gpu_runtime.kernel_cache.ExportFit makes them (here a fake that
    rewrites the persistent kernel, as one that spills registers is) and says so in the status bar; where
    nvcc cannot check them, the kernels as planned, and it says that."""
    from cellfuse.app import main_window

    class Rewrites(main_window.ExportFit):
        def __call__(self, kernels):
            name = next(iter(kernels.persistent_launches()))
            self.rewritten[name] = 216, "its loops over K unrolled 8 at a time"
            kernels.sources[name] = "// rewritten\n" + kernels.sources[name]
            return kernels

    monkeypatch.setattr(main_window, "ExportFit", Rewrites)
    window.plan_panel.set_schedule("persistent")
    assert window.export_cuda(tmp_path / "l.cu")
    assert "// rewritten" in (tmp_path / "l.cu").read_text()
    assert "cf_lstm_persistent spilled registers as planned" in window.statusBar().currentMessage()

    class Fails(main_window.ExportFit):
        def __call__(self, kernels):
            self.failed = "nvcc could not be run (no such file); is the CUDA toolkit on the PATH?"
            return kernels

    monkeypatch.setattr(main_window, "ExportFit", Fails)
    assert window.export_cuda(tmp_path / "m.cu")
    assert "// rewritten" not in (tmp_path / "m.cu").read_text()
    assert "not checked for spilled registers: nvcc could not be run" in window.statusBar().currentMessage()


@pytest.mark.slow
def test_closing_with_unsaved_changes_asks(make_window, answers, user):
    w = make_window()
    user.window = w
    user.add("relu")
    assert w.isWindowModified() and "[*]" in w.windowTitle()
    answers.save_changes = "cancel"
    assert not w.close()
    assert w.isVisible()
    assert answers.asked[-1] == ("save_changes", "LSTM (new)")
    answers.save_changes = "discard"
    assert w.close()


@pytest.mark.slow
def test_opening_another_file_with_unsaved_changes_asks(window, answers, tmp_path):
    path = tmp_path / "gru.cell.json"
    from cellfuse.graph_model import save_cell

    save_cell(load_template("gru"), path)
    window.adapter.add_node("relu")
    answers.save_changes = "cancel"
    answers.open_path = path
    window.actions_.open.trigger()
    assert window.cell.name == "LSTM"
    answers.save_changes = "discard"
    window.actions_.open.trigger()
    assert window.cell.name == "GRU" and window.document.path == path


@pytest.mark.slow
def test_no_question_when_nothing_changed(window, answers):
    window.adapter.add_node("relu")
    window.actions_.undo.trigger()  # back to the saved state
    assert not window.is_modified()
    assert window.close()
    assert not [a for a in answers.asked if a[0] == "save_changes"]


def test_a_bad_file_is_reported_not_raised(make_window, answers, tmp_path):
    bad = tmp_path / "bad.cell.json"
    bad.write_text('{"format": "cellfuse.cell/1", "nodes": [\n')
    w = make_window(bad)
    assert answers.errors and "bad.cell.json" in answers.errors[0][1] and "line" in answers.errors[0][1]
    assert w.cell.name == "LSTM"  # the editor goes on with a new cell
    missing = tmp_path / "missing.cell.json"
    assert not w.open_file(missing)
    assert "no such file" in answers.errors[-1][1]


def test_autosave_is_offered_back_after_a_crash(make_window, answers, tmp_path, isolated):
    path = tmp_path / "lstm.cell.json"
    w = make_window()
    assert w.save_as(path)
    w.adapter.rename("h_new", "h_next")
    written = w.write_autosave()
    assert written is not None and written.is_relative_to(isolated)
    assert autosave.find_autosave(path) is not None
    # "Crash": the window goes without closing; the next start finds the autosave.
    w.document.saved = w.cell.to_json()  # so that the fixture's close does not remove it
    answers.restore_autosave = True
    again = make_window(path)
    assert ("restore_autosave", "lstm.cell.json") in answers.asked
    assert again.cell.output == "h_next" and again.is_modified()
    assert again.document.path == path
    assert again.save()
    assert autosave.find_autosave(path) is None


def test_autosaves_go_to_one_cellfuse_folder_and_one_left_in_the_doubled_one_is_still_found(qapp, isolated):
    folder = autosave.autosave_dir()
    assert folder.is_relative_to(isolated) and folder.parts[-2:] == ("CellFuse", "autosave")
    assert "CellFuse/CellFuse" not in folder.as_posix()  # Qt's folder named the organisation and the app
    assert autosave.write_autosave("{}", None).parent == folder
    autosave.remove_autosave(None)
    earlier = autosave._earlier_dir() / autosave.autosave_path(None).name  # written by an earlier version
    earlier.parent.mkdir(parents=True)
    earlier.write_text("{}")
    found = autosave.find_autosave(None)
    assert found is not None and found.file == earlier
    autosave.remove_autosave(None)
    assert not earlier.exists() and autosave.find_autosave(None) is None


@pytest.mark.slow
def test_declined_autosave_is_removed(make_window, answers, tmp_path):
    w = make_window()
    w.adapter.add_node("relu")
    assert w.write_autosave() is not None  # an untitled one
    w.document.saved = w.cell.to_json()
    answers.restore_autosave = False
    again = make_window()
    assert again.cell.name == "LSTM" and not again.cell.has("relu")
    assert autosave.find_autosave(None) is None


@pytest.mark.slow
def test_clean_document_writes_no_autosave(window):
    assert window.write_autosave() is None


@pytest.mark.slow
def test_new_from_template_menu_lists_every_template(window):
    menu = next(a.menu() for a in window.menuBar().actions() if a.text() == "&File")
    sub = next(a.menu() for a in menu.actions() if a.menu() and "Template" in a.text())
    assert len(sub.actions()) == len(template_names())
    sub.actions()[0].trigger()
    assert window.cell.name == load_template(template_names()[0]).name


def test_run_app_reports_a_bad_file_and_returns(qapp, answers, tmp_path, monkeypatch):
    from PySide6 import QtWidgets

    from cellfuse.app import main as app_main

    bad = tmp_path / "bad.cell.json"
    bad.write_text("not json")
    windows = []

    def exec_once(self=None) -> int:  # the event loop, run just long enough to see the window
        qapp.processEvents()
        for w in qapp.topLevelWidgets():
            if w.objectName() == "CellFuseMainWindow" and w.isVisible():
                windows.append(w)
                w.close()
        return 0

    monkeypatch.setattr(QtWidgets.QApplication, "exec", exec_once)
    monkeypatch.setattr("sys.excepthook", __import__("sys").excepthook)
    assert app_main.run_app(str(bad)) == 0
    assert answers.errors and "bad.cell.json" in answers.errors[0][1]
    assert len(windows) == 1 and windows[0].cell.name == "LSTM"
    windows[0].deleteLater()


@pytest.mark.slow
def test_a_file_with_an_op_the_editor_does_not_know_is_reported(window, answers, tmp_path, same):
    from cellfuse.graph_model import Cell, Node, save_cell

    path = tmp_path / "odd.cell.json"
    save_cell(Cell(name="odd", nodes=[Node("x", "input"), Node("n", "layernorm", ["x"])]), path)
    before = window.cell.copy()
    assert not window.open_file(path)
    assert "odd.cell.json" in answers.errors[-1][1] and "unknown op 'layernorm'" in answers.errors[-1][1]
    assert same(window.cell, before)
    with pytest.raises(CellError, match="node 'n'"):
        window.adapter.load(load_cell(path))


@pytest.mark.slow
def test_open_recent_lists_and_opens_files(window, tmp_path):
    from cellfuse.graph_model import save_cell

    paths = []
    for name in ("gru", "elman"):
        path = tmp_path / f"{name}.cell.json"
        save_cell(load_template(name), path)
        assert window.open_file(path)
        paths.append(path)
    file_menu = next(a.menu() for a in window.menuBar().actions() if a.text() == "&File")
    recent = next(a.menu() for a in file_menu.actions() if a.menu() and "Recent" in a.text())
    recent.aboutToShow.emit()
    entries = [a for a in recent.actions() if a.toolTip().endswith(".cell.json")]
    assert [a.toolTip() for a in entries] == [str(p.resolve()) for p in reversed(paths)]
    entries[1].trigger()
    assert window.cell.name == "GRU" and window.document.path == paths[0]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lstm", "gru"])
def test_a_file_from_the_command_line_opens_with_nothing_overlapping(window, tmp_path, name):
    from cellfuse.graph_model import save_cell

    path = tmp_path / f"{name}.cell.json"
    save_cell(load_template(name), path)  # its layout, but no positions for updates and output
    assert window.open_file(path)
    assert window.cell.layout == load_template(name).layout
    rects = [n.view.sceneBoundingRect() for n in window.adapter.graph.all_nodes() if n.view.isVisible()]
    assert not [(r, q) for i, r in enumerate(rects) for q in rects[i + 1:] if r.intersects(q)]


@pytest.mark.slow
def test_the_usual_shortcuts(window):
    a = window.actions_
    keys = {name: [k.toString() for k in getattr(a, name).shortcuts()] for name in vars(a)}
    expected = {"new": "Ctrl+N", "open": "Ctrl+O", "save": "Ctrl+S", "save_as": "Ctrl+Shift+S",
                "undo": "Ctrl+Z", "redo": "Ctrl+Shift+Z", "cut": "Ctrl+X", "copy": "Ctrl+C",
                "paste": "Ctrl+V", "select_all": "Ctrl+A", "delete": "Del", "fit": "F",
                "benchmark": "F5", "node_search": "Tab", "quit": "Ctrl+Q"}
    for name, key in expected.items():
        assert key in keys[name], (name, keys[name])
    assert "Ctrl+Y" in keys["redo"]
