"""How long the editor takes to answer on cells of real size: opening a cell, and each kind of edit
(move, wire, add, delete, group), each timed from the change to the moment the window has nothing left
to do (every timer the edit started has fired, every redraw has run), on the layer-normalised LSTM (145
nodes) and on generated stacks of LSTM blocks (about 1,000 nodes). Medians of a few runs; JSON out.

    QT_QPA_PLATFORM=offscreen python benchmarks/editor_latency.py --out benchmarks/results/editor_latency.json
    xvfb-run python benchmarks/editor_latency.py --out ...     # a real X server, where Xvfb is installed
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from PySide6 import QtCore, QtWidgets

from cellfuse.graph_model import Cell, load_template, save_cell
from cellfuse.graph_model.builder import CellBuilder, function

sigmoid, tanh = function("sigmoid"), function("tanh")


def lstm_stack(blocks: int) -> Cell:
    """`blocks` LSTM blocks in series inside one step (each its own h and c, the next block's input its
    h): about 30 nodes a block."""
    b = CellBuilder(f"LSTM stack of {blocks}")
    x = b.input("x")
    source, width = x, "input"
    last = None
    for k in range(blocks):
        with b.group(f"block {k}"):
            h, c = b.state(f"h{k}"), b.state(f"c{k}")
            gates = {}
            for g in "ifog":
                w = b.weight(f"W{g}{k}", width, "hidden")
                u = b.weight(f"U{g}{k}", "hidden", "hidden")
                bias = b.weight(f"b{g}{k}", "hidden")
                act = tanh if g == "g" else sigmoid
                gates[g] = act(source @ w + h @ u + bias)
            c_new = (gates["f"] * c + gates["i"] * gates["g"]).named(f"c_new{k}")
            h_new = (gates["o"] * tanh(c_new)).named(f"h_new{k}")
        b.update(h, h_new)
        b.update(c, c_new)
        source, width, last = h_new, "hidden", h_new
    b.output(last)
    return b.build()


def settle(app: QtWidgets.QApplication, window) -> None:
    """Runs the event loop until the window has nothing left to do: the plan's timer fired, every posted
    event and redraw handled."""
    while True:
        app.processEvents(QtCore.QEventLoop.ProcessEventsFlag.AllEvents)
        if not window._plan_timer.isActive():
            app.processEvents()
            return
        time.sleep(0.001)


def timed(app, window, action) -> float:
    start = time.perf_counter()
    action()
    settle(app, window)
    return (time.perf_counter() - start) * 1e3


def measure(app, window_cls, cell: Cell, repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "cell.cell.json"
        save_cell(cell, path)
        window = window_cls()
        window.resize(1366, 768)
        window.show()
        opened = timed(app, window, lambda: window.start(path))
        a = window.adapter
        ids = [n.id for n in window.cell.nodes]
        times: dict[str, list[float]] = {k: [] for k in ("move", "add", "delete", "wire", "group")}
        for r in range(repeats):
            node = a.node(ids[len(ids) // 2])
            x, y = node.pos()
            times["move"].append(timed(app, window, lambda node=node, x=x, y=y: node.set_pos(x + 30.0, y)))
            made: list[str] = []
            times["add"].append(timed(app, window, lambda made=made: made.append(window.add_node("tanh"))))
            times["wire"].append(timed(app, window, lambda made=made: a.connect(ids[0], made[0], 0)))
            times["delete"].append(timed(app, window, lambda made=made: a.delete(made)))
            members = [i for i in ids if a.canvas_nodes(i)][:3]
            if len(members) == 3:
                a.select(members)
                times["group"].append(timed(app, window, lambda r=r: window.group_selection(f"bench {r}")))
                a.graph.undo_stack().undo()  # the next round groups the same nodes again
                settle(app, window)
        window.save()  # so that closing asks nothing
        window.close()
        window.deleteLater()
        settle_deleted(app)
    return {"nodes": len(cell.nodes), "open_ms": opened,
            "edits_ms": {k: statistics.median(v) for k, v in times.items() if v},
            "edits_all_ms": times}


def settle_deleted(app) -> None:
    QtCore.QCoreApplication.sendPostedEvents(None, QtCore.QEvent.Type.DeferredDelete)
    app.processEvents()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--blocks", default="33", help="comma-separated: LSTM blocks of the generated stacks")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    # settings and autosaves of a folder of its own: a user's autosave would make the editor ask (and wait)
    home = tempfile.mkdtemp(prefix="cellfuse-editor-bench-")
    os.environ["XDG_CONFIG_HOME"], os.environ["XDG_DATA_HOME"] = home, home
    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication(sys.argv[:1])
    from cellfuse.app.main import configure_application
    from cellfuse.app.main_window import MainWindow

    configure_application(app)
    cells = [load_template("layernorm_lstm"), *(lstm_stack(int(n)) for n in args.blocks.split(","))]
    record = {"script": "benchmarks/editor_latency.py", "command": " ".join(["python", *sys.argv]),
              "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "machine": f"{platform.machine()}, {os.cpu_count()} cores",
              "qpa": os.environ.get("QT_QPA_PLATFORM", "default"), "cases": []}
    for cell in cells:
        result = measure(app, MainWindow, cell, args.repeats)
        result["cell"] = cell.name
        record["cases"].append(result)
        edits = ", ".join(f"{k} {v:.0f}" for k, v in result["edits_ms"].items())
        print(f"{cell.name}: {result['nodes']} nodes, open {result['open_ms']:.0f} ms; edits (median ms): "
              f"{edits}", flush=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
