"""The CUDA view sets anew only the lines of a new source that differ from those on show: the text shown is
the new one whatever changed, and the view stays where it was scrolled to."""

from __future__ import annotations

import random

from cellfuse.app.cuda_view import CudaView


def test_the_text_shown_is_the_new_one_whatever_changed(qtbot):
    view = CudaView()
    qtbot.addWidget(view)
    rnd = random.Random(7)
    words = ["", "}", "__global__ void k0() {", "  const float v_a = 1.0f;", "// é 😀"]
    shown = ""
    for _ in range(1500):
        lines = shown.split("\n")
        if rnd.random() < 0.2:  # a new text
            lines = [rnd.choice(words) for _ in range(rnd.randint(0, 6))]
        else:  # a few lines added, taken away or changed, at the start, in the middle or at the end
            for _ in range(rnd.randint(1, 3)):
                i = rnd.randint(0, len(lines))
                kind = rnd.random()
                if kind < 0.4:
                    lines.insert(i, rnd.choice(words))
                elif lines:
                    i = min(i, len(lines) - 1)
                    if kind < 0.7:
                        del lines[i]
                    else:
                        lines[i] = rnd.choice(words)
        shown = "\n".join(lines)
        view.show_source(shown, {}, {}, "title")
        assert view.editor.toPlainText() == view.text() == shown


def test_a_changed_source_keeps_the_view_where_it_was(qtbot):
    view = CudaView()
    qtbot.addWidget(view)
    view.resize(500, 300)
    view.show()
    lines = [f"  const float v_n{i} = 1.0f;" for i in range(600)]
    view.show_source("\n".join(lines), {}, {}, "title")
    bar = view.editor.verticalScrollBar()
    bar.setValue(250)
    lines[450] = "  const float v_n450 = 2.0f;"
    view.show_source("\n".join(lines), {}, {}, "title")
    view.mark_out_of_date("Fix the 1 error in Problems to see the plan.")
    assert view.text().endswith("\n".join(lines)) and view.text().startswith("// Fix")
    view.show_source("\n".join(lines), {}, {}, "title")
    assert view.text() == "\n".join(lines)
    assert bar.value() == 250
