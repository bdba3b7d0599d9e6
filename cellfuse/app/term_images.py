"""Equation terms as images: each term's LaTeX rendered once by matplotlib's mathtext and kept, in each
colour it is drawn in.

Parsing mathtext is the slow part of drawing equations (a few milliseconds a term; matplotlib keeps only
50 parses, and a cell of a thousand nodes has five hundred different terms), and a term's LaTeX is the
same from one edit to the next: so each is parsed and rasterised once, as a mask of coverage, and each
colour is a tint of that mask.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from matplotlib.font_manager import FontProperties
from matplotlib.mathtext import MathTextParser
from PySide6 import QtGui

_parser = MathTextParser("agg")


@dataclass
class TermImage:
    """A term as mathtext draws it: what mathtext was given (`shown`), its coverage in device pixels, and
    its size in logical pixels (the image's left edge is where the term starts, its baseline `ascent`
    below the top)."""

    shown: str
    mask: QtGui.QImage  # Format_Alpha8
    width: float
    ascent: float
    descent: float
    _tints: dict[str, QtGui.QImage] = field(default_factory=dict)

    def tinted(self, color: str) -> QtGui.QImage:
        """The term in `color` (a colour name such as '#d6d9e0'), made once per colour."""
        image = self._tints.get(color)
        if image is None:
            image = QtGui.QImage(self.mask.size(), QtGui.QImage.Format.Format_ARGB32_Premultiplied)
            image.setDevicePixelRatio(self.mask.devicePixelRatio())  # so that the mask is drawn 1:1
            image.fill(QtGui.QColor(color))
            painter = QtGui.QPainter(image)
            painter.setCompositionMode(QtGui.QPainter.CompositionMode.CompositionMode_DestinationIn)
            painter.drawImage(0, 0, self.mask)
            painter.end()
            self._tints[color] = image
        return image


MAX_KEPT = 8192  # terms kept: ten cells of a thousand nodes
_kept: dict[tuple[str, str, float, float, float], TermImage] = {}


def is_rendered(tex: str, text: str, font_size: float, dpi: float, ratio: float) -> bool:
    """Whether `term_image` has the term already (it then answers at once)."""
    return (tex, text, font_size, dpi, ratio) in _kept


def term_image(tex: str, text: str, font_size: float, dpi: float, ratio: float) -> TermImage:
    """The term of LaTeX `tex` at `font_size` points on a screen of `dpi` logical dots per inch and device
    pixel ratio `ratio`; its plain `text` where mathtext cannot parse the LaTeX (an id that a broken cell
    file gave odd characters)."""
    key = (tex, text, font_size, dpi, ratio)
    image = _kept.get(key)
    if image is None:
        image = _render(tex, text, font_size, dpi, ratio)
        if len(_kept) >= MAX_KEPT:
            del _kept[next(iter(_kept))]  # the oldest
        _kept[key] = image
    return image


def _render(tex: str, text: str, font_size: float, dpi: float, ratio: float) -> TermImage:
    prop = FontProperties(size=font_size)
    shown = f"${tex}$"
    try:
        raster = _parser.parse(shown, dpi * ratio, prop)
    except ValueError:
        shown = text.replace("$", r"\$")  # outside $...$ mathtext sets plain text
        raster = _parser.parse(shown, dpi * ratio, prop)
    pixels = np.ascontiguousarray(raster.image, dtype=np.uint8)
    height, width = pixels.shape
    mask = QtGui.QImage(pixels.data, width, height, width, QtGui.QImage.Format.Format_Alpha8).copy()
    mask.setDevicePixelRatio(ratio)
    return TermImage(shown, mask, raster.width / ratio, (raster.height - raster.depth) / ratio,
                     raster.depth / ratio)
