"""How long the editor takes to answer on cells of real size: opening a cell, and each kind of edit
(move, wire, add, delete, group), on the layer-normalised LSTM (145 nodes) and on generated stacks of
LSTM blocks (about 1,000 nodes). Three times for each, from the change: when the editor first has
nothing to do (`answer`: the canvas shows the edit, the user can go on), when the plan, the CUDA and the
equations of the edit are on show (`ready`: made in a worker and between events meanwhile), and the
longest the editor kept its events waiting in between (`stall`, the answer included: what a click or a
key would have waited at worst). Medians of a few runs; JSON out.

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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from lstm_stacks import lstm_stack  # noqa: E402  (the editor's tests open the same cells)


class Watch:
    """What the editor's thread does after a change, seen from its event loop: a heartbeat timer ticks
    every millisecond while the loop is free, so that a gap between two ticks is a time a user's click or
    key would have waited."""

    def __init__(self) -> None:
        self.ticks: list[float] = []
        self.heartbeat = QtCore.QTimer()
        self.heartbeat.setTimerType(QtCore.Qt.TimerType.PreciseTimer)
        self.heartbeat.setInterval(1)
        self.heartbeat.timeout.connect(lambda: self.ticks.append(time.perf_counter()))

    def timed(self, app: QtWidgets.QApplication, window, action) -> dict[str, float]:
        """Runs `action`; returns, in ms from its start, when the editor first handled an event again
        (`answer`), when the plan, the CUDA and the equations it changed were on show (`ready`), and the
        longest the editor kept its events waiting in between (`stall`: the answer or a later one, such
        as showing the plan that came back)."""
        def run_until(done) -> None:
            while not done():
                app.processEvents(QtCore.QEventLoop.ProcessEventsFlag.AllEvents
                                  | QtCore.QEventLoop.ProcessEventsFlag.WaitForMoreEvents)

        self.ticks = []
        self.heartbeat.start()
        start = time.perf_counter()
        action()
        run_until(lambda: bool(self.ticks))
        answer = self.ticks[0]
        run_until(lambda: not window.updating())
        beats = len(self.ticks)
        run_until(lambda: len(self.ticks) > beats + 1)  # what the last results asked for drawn, and so on
        self.heartbeat.stop()
        end = self.ticks[-1]
        gaps = [b - a for a, b in zip([start, *self.ticks], self.ticks, strict=False)]
        return {"answer": (answer - start) * 1e3, "ready": (end - start) * 1e3, "stall": max(gaps) * 1e3}


def measure(app, window_cls, cell: Cell, repeats: int, panel: str) -> dict:
    watch = Watch()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "cell.cell.json"
        save_cell(cell, path)
        window = window_cls()
        window.resize(1366, 768)
        window.show()
        getattr(window, f"{panel}_dock").raise_()
        def timed(action):
            return watch.timed(app, window, action)

        opened = timed(lambda: window.start(path))
        a = window.adapter
        ids = [n.id for n in window.cell.nodes]
        times: dict[str, list[dict[str, float]]] = {k: [] for k in ("move", "add", "delete", "wire", "group")}
        for r in range(repeats):
            node = a.node(ids[len(ids) // 2])
            x, y = node.pos()
            times["move"].append(timed(lambda node=node, x=x, y=y: node.set_pos(x + 30.0, y)))
            made: list[str] = []
            times["add"].append(timed(lambda made=made: made.append(window.add_node("tanh"))))
            times["wire"].append(timed(lambda made=made: a.connect(ids[0], made[0], 0)))
            times["delete"].append(timed(lambda made=made: a.delete(made)))
            members = [i for i in ids if a.canvas_nodes(i)][:3]
            if len(members) == 3:
                a.select(members)
                times["group"].append(timed(lambda r=r: window.group_selection(f"bench {r}")))
                a.graph.undo_stack().undo()  # the next round groups the same nodes again
                timed(lambda: None)
        window.save()  # so that closing asks nothing
        window.close()
        window.deleteLater()
        settle_deleted(app)
    medians = {k: {m: statistics.median(t[m] for t in v) for m in ("answer", "ready", "stall")}
               for k, v in times.items() if v}
    return {"nodes": len(cell.nodes), "open_ms": opened, "edits_ms": medians, "edits_all_ms": times}


def settle_deleted(app) -> None:
    QtCore.QCoreApplication.sendPostedEvents(None, QtCore.QEvent.Type.DeferredDelete)
    app.processEvents()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--blocks", default="33", help="comma-separated: LSTM blocks of the generated stacks")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--panel", default="equations", choices=["equations", "cuda", "problems", "bench"],
                   help="the bottom panel on show (the equations, drawn again on each edit, by default)")
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
              "qpa": os.environ.get("QT_QPA_PLATFORM", "default"), "panel": args.panel, "cases": []}
    for cell in cells:
        result = measure(app, MainWindow, cell, args.repeats, args.panel)
        result["cell"] = cell.name
        record["cases"].append(result)
        print(f"{cell.name}: {result['nodes']} nodes (ms: answer / ready / longest stall)", flush=True)
        for name, t in [("open", result["open_ms"]), *result["edits_ms"].items()]:
            print(f"  {name:7} {t['answer']:7.0f} {t['ready']:7.0f} {t['stall']:7.0f}", flush=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
