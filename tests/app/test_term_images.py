"""Equation terms rendered once and kept: the same term comes back without being rendered again, and its
tint in any colour covers what its mask covers, pixel for pixel, on a screen of any pixel ratio."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6 import QtGui

from cellfuse.app.term_images import is_rendered, term_image


def alpha(image: QtGui.QImage) -> np.ndarray:
    image = image.convertToFormat(QtGui.QImage.Format.Format_Alpha8)
    rows = np.frombuffer(image.constBits(), np.uint8, image.sizeInBytes())
    return rows.reshape(image.height(), image.bytesPerLine())[:, :image.width()].copy()  # the image goes


@pytest.mark.parametrize("ratio", [1.0, 1.5, 2.0])
def test_a_tint_covers_what_the_mask_covers(qapp, ratio):
    term = term_image(r"\sigma(x \, W_f", "sigmoid(x @ W_f", 13.0, 100.0, ratio)
    assert is_rendered(r"\sigma(x \, W_f", "sigmoid(x @ W_f", 13.0, 100.0, ratio)
    assert term_image(r"\sigma(x \, W_f", "sigmoid(x @ W_f", 13.0, 100.0, ratio) is term
    assert term.mask.devicePixelRatio() == ratio and term.width * ratio <= term.mask.width() + 1
    tint = term.tinted("#6fcf97")
    assert term.tinted("#6fcf97") is tint and tint.size() == term.mask.size()
    assert alpha(term.mask).max() == 255 and np.array_equal(alpha(tint), alpha(term.mask))


def test_latex_mathtext_cannot_read_is_drawn_as_its_text(qapp):
    term = term_image(r"\notacommand{x}", "x$y", 13.0, 100.0, 1.0)
    assert term.shown == r"x\$y" and term.width > 0
