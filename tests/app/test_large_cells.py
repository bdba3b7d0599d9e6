"""The editor on cells of real size: an edit answers at once, while the plan, the CUDA and the equations
it changes are made in the background (the last ones on show meanwhile, marked after a while), and a plan
asked for by an older edit never replaces a newer one. The bounds are generous (the goals are 50 ms for a
cell of 150 nodes and 200 ms for one of a thousand, measured by benchmarks/editor_latency.py): these
tests catch an edit that waits for the plan or the equations again, not a slower machine."""

from __future__ import annotations

import threading
import time

import pytest
from lstm_stacks import lstm_stack

from cellfuse.app import plan_worker
from cellfuse.app.plan_worker import PlanWorker
from cellfuse.graph_model import Sizes, load_template, save_cell

SIZES = Sizes(seq=4, batch=2, input=8, hidden=8, layers=1)


def settled(qtbot, window, timeout_s: float = 60.0) -> None:
    """Waits until the plan, the CUDA and the equations of the last edit are on show."""
    qtbot.waitUntil(lambda: not window.updating(), timeout=int(timeout_s * 1000))


def answered_in(qapp, action) -> float:
    """Seconds until the editor has done what `action` asks of it at once (events included)."""
    start = time.perf_counter()
    action()
    qapp.processEvents()
    return time.perf_counter() - start


def edits(window) -> list[tuple[str, object]]:
    """A move, an add, a wire, a delete and a group, as the editor's benchmark makes them."""
    a = window.adapter
    ids = [n.id for n in window.cell.nodes]
    made: list[str] = []

    def move() -> None:
        node = a.node(ids[len(ids) // 2])
        x, y = node.pos()
        node.set_pos(x + 30.0, y)

    def group() -> None:
        a.select([i for i in ids if a.canvas_nodes(i)][:3])
        window.group_selection("picked")

    return [("move", move), ("add", lambda: made.append(window.add_node("tanh"))),
            ("wire", lambda: a.connect(ids[0], made[0], 0)), ("delete", lambda: a.delete(made)),
            ("group", group)]


def check_edits(qapp, qtbot, window, bound_s: float) -> None:
    window.equations_dock.raise_()  # drawn again on each edit, as the user sees them
    settled(qtbot, window)
    for name, action in edits(window):
        took = answered_in(qapp, action)
        assert took < bound_s, f"{name} took {took:.2f} s"
        settled(qtbot, window)
        assert window.equations_panel.up_to_date() and window.cuda_view.text()
    assert "picked" in [g.name() for g in window.adapter.group_nodes()]
    assert window.info.ok and not window.plan_panel.out_of_date  # the plan of the cell as it is now


def test_edits_of_the_layer_normalised_lstm_answer_at_once(qapp, qtbot, make_window):
    window = make_window("layernorm_lstm")
    assert len(window.cell.nodes) >= 140
    check_edits(qapp, qtbot, window, bound_s=2.0)


@pytest.mark.slow
def test_a_cell_of_a_thousand_nodes_opens_and_answers_at_once(qapp, qtbot, make_window, tmp_path):
    path = tmp_path / "stack.cell.json"
    save_cell(lstm_stack(26), path)
    start = time.perf_counter()
    window = make_window(path)
    assert time.perf_counter() - start < 20.0
    assert len(window.cell.nodes) >= 1000
    check_edits(qapp, qtbot, window, bound_s=10.0)


def test_a_newer_request_replaces_an_older_one_and_only_the_newest_plan_comes_back(qtbot):
    worker = PlanWorker()
    came: list = []
    worker.ready.connect(came.append)
    lstm, gru = load_template("lstm"), load_template("gru")
    worker.request(lstm, SIZES, "hoisted")
    worker.request(lstm, SIZES, "naive")  # waits, then is replaced
    worker.request(gru, SIZES, "fused")
    qtbot.waitUntil(lambda: not worker.busy, timeout=30_000)
    qtbot.wait(50)  # anything else on its way would have come by now
    assert [(o.summary["cell"], o.summary["schedule"]) for o in came] == [(gru.name, "fused")]
    worker.request(lstm, SIZES, "hoisted")
    worker.drop()  # an edit made the cell invalid meanwhile: what comes back is out of date
    qtbot.waitUntil(lambda: not worker.busy, timeout=30_000)
    qtbot.wait(50)
    assert len(came) == 1
    worker.stop()


def test_the_last_plan_stays_on_show_marked_while_a_slow_one_is_made(qapp, qtbot, window, monkeypatch):
    made = plan_worker.plan_outcome
    release = threading.Event()

    def slow(cell, sizes, schedule):
        release.wait(10.0)
        return made(cell, sizes, schedule)

    monkeypatch.setattr(plan_worker, "plan_outcome", slow)
    launches = window.plan_panel.stat_values["launches_per_step"].text()
    source = window.cuda_view.text()
    window.adapter.rename("f", "forget")
    qtbot.waitUntil(window.plan_busy_label.isVisible, timeout=5000)  # after 0.3 s
    assert window.plan_panel.updating.isVisible()
    assert window.plan_panel.stat_values["launches_per_step"].text() == launches
    assert window.cuda_view.text() == source and not window.cuda_view.out_of_date
    release.set()
    settled(qtbot, window)
    assert not window.plan_busy_label.isVisible() and not window.plan_panel.updating.isVisible()
    assert "v_forget" in window.cuda_view.text()
