"""Renders screenshots of the editor, offscreen, into docs/screenshots/.

    python scripts/screenshots.py [--out docs/screenshots] [--width 1920 --height 1080] [--suffix -1366x768]

The window runs with its settings and autosaves in a temporary folder, so the screenshots never
depend on (or change) the user's own.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from pathlib import Path

log = logging.getLogger("screenshots")

BENCH_SIZES = {"seq": 64, "batch": 16, "input": 128, "hidden": 128, "layers": 1}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_out = Path(__file__).resolve().parent.parent / "docs" / "screenshots"
    parser.add_argument("--out", type=Path, default=default_out)
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--height", type=int, default=1080)
    parser.add_argument("--overview-width", type=int, default=2560,
                        help="the whole-cell overview is wider, so that its node titles stay readable")
    parser.add_argument("--overview-height", type=int, default=1440)
    parser.add_argument("--suffix", default="", help="added to each file's name, e.g. -1366x768")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    home = tempfile.mkdtemp(prefix="cellfuse-screenshots-")
    os.environ["XDG_CONFIG_HOME"] = str(Path(home) / "config")
    os.environ["XDG_DATA_HOME"] = str(Path(home) / "data")

    from PySide6 import QtCore, QtWidgets

    import cellfuse.app  # noqa: F401  (its guard must come before any Qt call)
    from cellfuse.app.main import configure_application
    from cellfuse.app.main_window import MainWindow

    app = QtWidgets.QApplication(sys.argv[:1])
    configure_application(app)
    args.out.mkdir(parents=True, exist_ok=True)

    def settle(ms: int = 150) -> None:
        loop = QtCore.QEventLoop()
        QtCore.QTimer.singleShot(ms, loop.quit)
        loop.exec()

    def shoot(widget: QtWidgets.QWidget, name: str) -> None:
        settle()
        path = args.out / name.replace(".png", f"{args.suffix}.png")
        widget.grab().save(str(path))
        log.info("wrote %s", path)

    def frame_all_then_select(node_id: str) -> None:
        w.adapter.select([])
        w.adapter.fit(margin=30.0)
        w.adapter.select([node_id])

    w = MainWindow()
    w.resize(args.overview_width, args.overview_height)
    w.show()
    w.start(None)  # the LSTM template
    w.bench_panel.set_sizes(**BENCH_SIZES)
    w.plan_panel.set_schedule("hoisted")
    w.refresh_plan()
    w.arrange_docks()
    w.resizeDocks([w.problems_dock], [int(args.overview_height * 0.2)], QtCore.Qt.Orientation.Vertical)
    settle()

    # 1. The LSTM with its plan drawn on the canvas; a node selected; its properties.
    w.problems_dock.raise_()
    frame_all_then_select("ai_b")
    shoot(w, "editor-lstm-plan.png")

    # 1b. The LSTM fitted in a 1440x900 window: each gate is a group, one node with its name large. Its
    # size is in its name, so it is made once, not for each --suffix.
    if not args.suffix:
        w.resize(1440, 900)
        w.arrange_docks()
        settle()
        w.adapter.select([])
        w.adapter.fit(margin=30.0)
        shoot(w, "grouped-lstm-1440x900.png")

    w.resize(args.width, args.height)
    w.arrange_docks()
    settle()

    # 2. A close-up of the canvas at 1:1, centred on the cell (the mean of its nodes' centres: the
    # bounding box's centre of a cell with a tall column of weights can be empty canvas): node styles,
    # ports, the hoisted GEMMs and the fused kernels around them.
    viewer = w.canvas
    centres = [n.view.sceneBoundingRect().center() for n in w.adapter.graph.all_nodes() if n.view.isVisible()]
    viewer.reset_zoom(sum(centres, QtCore.QPointF()) / len(centres))
    shoot(viewer, "canvas-closeup.png")

    # 3. The CUDA view, scrolled to the kernel that computes the selected node.
    w.cuda_dock.raise_()
    w.resizeDocks([w.cuda_dock], [int(args.height * 0.42)], QtCore.Qt.Orientation.Vertical)
    settle()
    w.show_node("ai_b")
    shoot(w, "cuda-view.png")

    # 4. The equations panel: the LSTM as its paper writes it. A click on the forget gate's sigmoid has
    # selected the nodes that compute the gate, on the canvas and in the equations.
    w.equations_dock.raise_()
    w.resizeDocks([w.equations_dock], [int(args.height * 0.34)], QtCore.Qt.Orientation.Vertical)
    settle()
    forget = next(eq for eq in w.equations_panel.equations if eq.name == "f")
    w.equations_panel.nodes_activated.emit(list(forget.rhs[0].nodes))
    w.adapter.fit(margin=40.0)  # frames the selection
    shoot(w, "equations.png")

    # 4b. The plan of three layers under `wavefront`: the plan view says how the layers run side by side.
    w.bench_panel.set_sizes(layers=3)
    w.plan_panel.set_schedule("wavefront")
    w.refresh_plan()
    w.plan_dock.raise_()
    frame_all_then_select("ai_b")
    shoot(w, "plan-wavefront.png")
    w.bench_panel.set_sizes(**BENCH_SIZES)
    w.plan_panel.set_schedule("hoisted")
    w.refresh_plan()

    def benchmark() -> bool:
        """Runs the benchmark and waits for it; False (and the reason logged) when it did not finish."""
        finished = []
        loop = QtCore.QEventLoop()

        def done(run) -> None:
            finished.append(run)
            loop.quit()

        w.bench_finished.connect(done)
        w.run_benchmark()
        QtCore.QTimer.singleShot(300_000, loop.quit)
        if not finished:
            loop.exec()
        w.bench_finished.disconnect(done)
        if not finished or finished[0] is None:
            log.error("the benchmark did not finish: %s", w.bench_panel.status.text())
            return False
        return True

    # 5. A benchmark run on the numpy backend (or the GPU where there is one), in the default layout:
    # the results open in their tab beside the canvas.
    w.arrange_docks()
    w.bench_panel.repeats_spin.setValue(3)
    if not benchmark():
        return 1
    settle(400)
    shoot(w, "benchmark.png")

    # 6. The same cell at twice the hidden size, compared with the first run: both runs' bars on one
    # scale, and the ratio of the second to the first.
    w.bench_panel.set_sizes(hidden=2 * BENCH_SIZES["hidden"])
    if not benchmark():
        return 1
    w.bench_panel.history.item(0).setSelected(True)  # beside the new run, selected already
    settle(400)
    shoot(w, "benchmark-compare.png")
    w.bench_panel.set_sizes(**BENCH_SIZES)
    w.refresh_plan()  # the plan of these sizes, before the next shot breaks the cell

    # 7. Live validation: a broken connection, its node marked, the problem listed.
    w.show_canvas()
    frame_all_then_select("ai_b")
    w.adapter.disconnect("h_new", "b")
    w.problems_dock.raise_()
    w.resizeDocks([w.problems_dock], [int(args.height * 0.24)], QtCore.Qt.Orientation.Vertical)
    w.show_node("h_new")
    viewer.reset_zoom(w.adapter.node("h_new").view.sceneBoundingRect().center() - QtCore.QPointF(200.0, 0.0))
    w.adapter.select([])
    shoot(w, "problems.png")

    # 8. A note, not a problem: the residual LSTM adds its input to its output, so it runs only where the
    # input size equals the hidden size. The note is listed as information, its node has an "i" badge,
    # and the cell is still valid.
    w.document.saved = w.cell.to_json()  # the broken cell goes without asking
    w.new_from_template("residual_lstm", ask=False)
    w.problems_dock.raise_()
    w.resizeDocks([w.problems_dock], [int(args.height * 0.24)], QtCore.Qt.Orientation.Vertical)
    frame_all_then_select("y")
    shoot(w, "problems-note.png")

    w.document.saved = w.cell.to_json()  # close without asking
    w.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
