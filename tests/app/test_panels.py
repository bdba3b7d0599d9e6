"""The panels around the canvas: problems, properties, plan, CUDA."""

from __future__ import annotations

import pytest
from PySide6 import QtCore

from cellfuse.app import theme
from cellfuse.codegen import make_plan
from cellfuse.codegen.plan_text import summary


def test_problems_are_live_and_clicking_one_selects_and_centres_its_node(qtbot, window):
    a = window.adapter
    a.disconnect("ai_b", "b")  # ai_b now has one arg
    errors = [p for p in window.info.problems if p.severity == "error"]
    assert [p.node for p in errors] == ["ai_b"]
    tree = window.problems.tree
    assert tree.topLevelItemCount() == len(window.info.problems)
    assert "1 error" in window.problems.summary.text()
    assert "error" in window.validity_label.text()
    assert a.node("ai_b").item.mark == "error"
    assert "port b of 'ai_b' is not connected" in a.node("ai_b").item.toolTip()

    a.select([])
    window.adapter.graph.viewer().centerOn(-5000.0, -5000.0)
    item = tree.topLevelItem(0)
    assert item.text(0) == "ai_b"
    rect = tree.visualItemRect(item)
    qtbot.mouseClick(tree.viewport(), QtCore.Qt.MouseButton.LeftButton, pos=rect.center())
    assert a.selected_ids() == ["ai_b"]
    viewer = a.graph.viewer()
    visible = viewer.mapToScene(viewer.viewport().rect()).boundingRect()
    assert visible.contains(a.node("ai_b").view.sceneBoundingRect().center())
    assert window.properties.id_edit.text() == "ai_b"
    assert "port b of &#x27;ai_b&#x27; is not connected" in window.properties.problems_label.text()

    window.actions_.undo.trigger()
    assert window.problems.problem_count() == 0
    assert a.node("ai_b").item.mark is None


@pytest.mark.slow
def test_warnings_are_amber(window, user):
    node = user.add("tanh")
    window.adapter.connect("h_new", node, "a")
    assert [p.severity for p in window.info.problems] == ["warning"]
    assert window.adapter.node(node).item.mark == "warning"
    assert "warning" in window.validity_label.text()


@pytest.mark.slow
@pytest.mark.parametrize(("template", "node"), [("sru", "highway"), ("residual_lstm", "y")])
def test_a_note_is_listed_as_information_and_the_cell_stays_valid(window, template, node):
    window.new_from_template(template, ask=False)
    assert not window.info.problems and [p.node for p in window.info.notes] == [node]
    panel = window.problems
    assert panel.tree.topLevelItemCount() == 1 and panel.problem_count() == 0
    item = panel.tree.topLevelItem(0)
    assert item.text(0) == node and "input size must equal the hidden size" in item.text(1)
    assert panel.severities() == ["info"] and item.toolTip(0) == "Information"
    icon = item.icon(0).pixmap(14, 14).toImage().pixelColor(3, 7)
    assert (icon.red(), icon.green(), icon.blue()) == theme.INFO_COLOR
    summary = panel.summary.text()
    assert "the cell is valid" in summary and "1 note" in summary and "warning" not in summary
    assert "valid" in window.validity_label.text() and "warning" not in window.validity_label.text()
    window.validate()
    assert window.statusBar().currentMessage() == "The cell is valid."
    marked = window.adapter.node(node).item
    assert marked.mark == "info" and "input size must equal" in marked.toolTip()
    window.show_node(node)
    assert "note: " in window.properties.problems_label.text()
    assert "input size must equal" in window.properties.problems_label.text()


@pytest.mark.slow
def test_state_problems_show_on_both_of_its_nodes(window):
    a = window.adapter
    a.update_node("c").input_ports()[0].clear_connections()
    assert [p.message for p in window.info.problems if p.node == "c"]
    assert a.node("c").item.mark == "error" and a.update_node("c").item.mark == "error"


@pytest.mark.slow
def test_missing_output_marks_the_output_node(window):
    sink = window.adapter.output_node()
    sink.input_ports()[0].clear_connections()
    assert any(p.node is None and "output" in p.message for p in window.info.problems)
    assert sink.item.mark == "error"
    assert window.problems.tree.topLevelItem(0).text(0) == "(cell)"


def test_properties_follow_the_selection(window):
    p = window.properties
    window.adapter.select([])
    assert p.stack.currentWidget() is p.cell_page and p.cell_name.text() == "LSTM"
    window.show_node("W_i")
    assert p.stack.currentWidget() is p.node_page
    assert p.shape_label.text() == "[input, hidden]"
    assert not p.dims_combo.isHidden() and p.value_edit.isHidden()
    window.show_node("ai")
    assert p.dims_combo.isHidden() and "xi" in p.inputs_label.text()
    window.adapter.close_group()  # ai and af are in two groups: their nodes stand for them
    window.adapter.select(["ai", "af"])
    assert window.adapter.selected_ids() == ["ai", "af"]
    assert p.stack.currentWidget() is p.multi_label


@pytest.mark.slow
def test_cell_properties_are_undoable(window):
    p = window.properties
    window.adapter.select([])
    p.cell_name.setText("My LSTM")
    p.cell_hidden.setText("64")
    p.cell_hidden.editingFinished.emit()
    assert window.cell.name == "My LSTM" and window.cell.sizes["hidden"] == 64
    assert window.bench_panel.sizes().hidden == 64
    window.actions_.undo.trigger()
    assert window.cell.name == "LSTM" and window.cell.sizes["hidden"] == 512


@pytest.mark.slow
def test_value_editor_takes_negative_and_scientific_numbers(window, user):
    k = user.add("const")
    for text, value in [("-3", -3.0), ("-1.5e-3", -0.0015), ("2E2", 200.0)]:
        user.set_value(k, text)
        assert window.cell.node(k).value == value
    window.properties.value_edit.setText("abc")
    assert not window.properties.value_edit.hasAcceptableInput()


@pytest.mark.slow
def test_plan_view_outlines_groups_and_marks_hoisted_gemms(window):
    window.plan_panel.set_schedule("hoisted")
    said = summary(make_plan(window.cell, window.sizes(), "hoisted"))
    regions = window.overlay.regions
    assert {r.name for r in regions} == ({g["name"] for g in said["gemm_groups"]}
                                         | {k["name"] for k in said["fused_kernels"]})
    hoisted = {m for g in said["gemm_groups"] if g["hoisted"] for m in g["matmuls"]}
    assert hoisted == {"xi", "xf", "xo", "xg"}
    # A gate's group holds hoisted and per-step matmuls: its node takes no tag, its matmuls do.
    assert all(g.item.plan_tag == "" for g in window.adapter.group_nodes())
    for node_id in ("xf", "xi"):
        window.show_node(node_id)  # opens its gate's group
        assert window.adapter.node(node_id).item.plan_tag == "hoisted"
    assert window.adapter.node("hi").view.isVisible() and window.adapter.node("hi").item.plan_tag == ""
    scene_items = window.overlay._items
    assert scene_items and all(i.scene() is window.canvas.scene() for i in scene_items)
    stats = window.plan_panel.stat_values
    assert stats["launches_per_step"].text() == str(said["launches_per_step"])
    assert window.plan_panel.tree.topLevelItemCount() == len(regions)

    window.plan_panel.set_schedule("naive")
    assert window.adapter.node("xi").item.plan_tag == ""
    assert int(stats["launches_per_step"].text()) > 2

    window.plan_panel.overlay_check.setChecked(False)
    assert not window.overlay._items and not window.actions_.plan_overlay.isChecked()
    window.actions_.plan_overlay.trigger()
    assert window.overlay._items and window.plan_panel.overlay_check.isChecked()


@pytest.mark.slow
def test_plan_list_click_selects_the_group(qtbot, window):
    tree = window.plan_panel.tree
    item = tree.topLevelItem(0)
    pos = tree.visualItemRect(item).center()
    qtbot.mouseClick(tree.viewport(), QtCore.Qt.MouseButton.LeftButton, pos=pos)
    assert set(window.adapter.selected_ids()) == set(item.data(0, QtCore.Qt.ItemDataRole.UserRole))
    # The x GEMM has a matmul in each gate's group: the gates' nodes stand for them, on the whole cell.
    assert set(item.data(0, QtCore.Qt.ItemDataRole.UserRole)) == {"xi", "xf", "xo", "xg"}
    assert window.adapter.open_group is None
    assert {n.name() for n in window.adapter.graph.selected_nodes()} == {
        "input gate", "forget gate", "output gate", "candidate"}
    window.delete_selection()  # what is selected goes, not the rest of the gates
    assert not {"xi", "xf", "xo", "xg"} & {n.id for n in window.cell.nodes}
    assert {"hi", "hf", "ho", "hg"} <= {n.id for n in window.cell.nodes}
    assert [g.name for g in window.cell.groups] == ["input gate", "forget gate", "output gate", "candidate"]


def test_plan_follows_the_sizes_and_says_why_when_there_is_none(qtbot, window):
    window.bench_panel.set_sizes(hidden=16)
    qtbot.waitUntil(lambda: "hidden=16" in window.plan_panel.sizes_label.text(), timeout=3000)
    window.adapter.disconnect("h_new", "a")
    window.refresh_plan()
    assert "Fix the 1 error" in window.plan_panel.message.text()
    assert window.overlay.regions and window.overlay.out_of_date  # the last plan's, marked
    assert window.cuda_view.text().startswith("// Fix")
    assert not window.cuda_view.export_button.isEnabled()


@pytest.mark.slow
def test_plan_view_says_what_a_persistent_kernel_holds(window):
    """Under `persistent` and `tensor` a layer's steps are one cooperative kernel: the plan view says how
    many blocks it has, its barriers (or waits on exchanges) per step, its shared memory and whether its
    GEMMs run on tensor cores (whose K, where it is staged in chunks, keeps a grid barrier); under
    `wavefront` that the layers run side by side; under `graph` nothing is said."""
    panel = window.plan_panel
    window.bench_panel.set_sizes(hidden=64)
    panel.set_schedule("tensor")
    window.refresh_plan()
    text = panel.kernel_label.text()
    assert panel.kernel_label.isVisibleTo(window)
    assert "1 wait(s) per step for the values of other blocks in an exchange buffer (no grid barrier)" in text
    assert "on tensor cores (3xFP16, rows and columns scaled)" in text
    assert panel.stat_values["launches_per_step"].text() == "0"
    batch = window.bench_panel.size_spins["batch"].value()
    # a K of 1024 on tensor cores: staged whole beside a small batch, in two chunks beside 16 rows of 64
    window.bench_panel.set_sizes(hidden=1024, batch=64)
    window.refresh_plan()
    assert "1 grid barrier(s) per step" in panel.kernel_label.text()
    window.bench_panel.set_sizes(hidden=64, batch=batch)
    panel.set_schedule("persistent")
    window.refresh_plan()
    text = panel.kernel_label.text()
    assert "blocks of 256 threads" in text and "tensor" not in text
    assert "1 wait(s) per step for the values of other blocks in an exchange buffer (no grid barrier)" in text
    window.bench_panel.set_sizes(layers=2, seq=24)  # more steps than a chunk: the layers side by side
    panel.set_schedule("wavefront")
    window.refresh_plan()
    text = panel.kernel_label.text()
    assert "stream of its own" in text and "beside the layer below" in text
    panel.set_schedule("graph")
    window.refresh_plan()
    assert not panel.kernel_label.isVisibleTo(window)


def test_plan_view_counts_a_step_s_exchange_waits_and_its_grid_barriers_apart():
    """The layer-normalised LSTM's persistent step waits for h in an exchange, then at a grid barrier
    before its block per row reads the GEMM's output."""
    from cellfuse.app.plan_panel import loop_text
    from cellfuse.graph_model import Sizes, load_template

    plan = make_plan(load_template("layernorm_lstm"), Sizes(100, 64, 512, 512), "persistent")
    assert ("1 wait(s) per step for the values of other blocks in an exchange buffer (1 grid barrier(s))"
            in loop_text(summary(plan)))


def test_plan_view_says_when_a_persistent_kernel_s_blocks_never_wait_for_each_other():
    """IndRNN's blocks never wait for each other: its kernel is no cooperative launch; the LSTM's is."""
    from cellfuse.app.plan_panel import loop_text
    from cellfuse.graph_model import Sizes, load_template

    def text(name):
        return loop_text(summary(make_plan(load_template(name), Sizes(100, 64, 512, 512), "persistent")))

    assert text("indrnn").startswith("One kernel, its blocks independent, per layer runs every step")
    assert text("lstm").startswith("One cooperative kernel per layer runs every step")


@pytest.mark.slow
def test_plan_view_says_which_gemms_run_on_tensor_cores(window):
    """At T=100, B=64 and 512 units the LSTM's hoisted input GEMM (6400 x 2048 x 512) runs on tensor cores:
    its row in the plan list and its outline's label say so; at B=8 (800 rows) neither does."""
    panel = window.plan_panel
    panel.set_schedule("persistent")
    window.bench_panel.set_sizes(seq=100, batch=64, input=512, hidden=512, layers=1)
    window.refresh_plan()
    rows = [panel.tree.topLevelItem(i).text(0) for i in range(panel.tree.topLevelItemCount())]
    assert [r for r in rows if "tensor cores" in r] == [r for r in rows if "GEMM, hoisted" in r] != []
    labels = [r.label for r in window.overlay.regions if r.tensor_cores]
    assert labels and all("on tensor cores (3xFP16)" in label for label in labels)
    window.bench_panel.set_sizes(batch=8)
    window.refresh_plan()
    rows = [panel.tree.topLevelItem(i).text(0) for i in range(panel.tree.topLevelItemCount())]
    assert not any("tensor cores" in r for r in rows)
    assert not any(r.tensor_cores for r in window.overlay.regions)


def test_cuda_view_scrolls_to_the_kernel_of_the_selected_node(window):
    view = window.cuda_view
    assert "__global__" in view.text()
    window.show_node("ai_b")
    kernel = view.kernel_of("ai_b")
    # The cursor on the node's own line, inside its kernel.
    assert kernel and view.current_line() == view.node_line("ai_b") > view._kernel_line[kernel]
    line = view.text().splitlines()[view.current_line() - 1]
    assert line.strip().startswith("const float v_ai_b =")
    assert view.editor.textCursor().block().text() == line
    window.show_node("hi")  # computed by a GEMM: no line of its own, the cursor on the GEMM's first
    assert view.kernel_of("hi") != kernel
    assert view.node_line("hi") is None
    assert view.current_line() == view._kernel_line[view.kernel_of("hi")]
    window.show_node("x")
    assert "no kernel" in view.location.text()


@pytest.mark.slow
def test_cuda_source_is_highlighted_and_read_only(window):
    view = window.cuda_view
    assert view.editor.isReadOnly()
    block = view.editor.document().findBlockByLineNumber(view._kernel_line[view.kernel_of("ai")] - 1)
    formats = block.layout().formats()
    assert formats, "the kernel's line has no highlighting"


def test_each_schedule_explains_itself_and_a_search_that_finds_nothing_says_so(window):
    from cellfuse.codegen import SCHEDULES

    combo = window.plan_panel.schedule_combo
    for i in range(combo.count()):
        tip = combo.itemData(i, QtCore.Qt.ItemDataRole.ToolTipRole)
        assert tip and combo.itemText(i) in tip, combo.itemText(i)
    assert [combo.itemText(i) for i in range(combo.count())] == list(SCHEDULES)
    palette = window.palette
    palette.search.setText("zzz")
    assert palette.ops() == [] and palette.no_match.isVisibleTo(palette) and "zzz" in palette.no_match.text()
    palette.search.setText("tanh")
    assert "tanh" in palette.ops() and not palette.no_match.isVisibleTo(palette)
    assert "layers=" in window.plan_panel.sizes_label.toolTip()  # the sizes line whole, where it is cut
