"""Colours and the application style: one place for the editor's look.

Nodes are coloured by what they are to the compiler: data the step reads (the input and
constants), learned weights, recurrent states, GEMMs (matmul) and elementwise ops. The output sink
has a colour of its own.
"""

from __future__ import annotations

import colorsys
import math
from functools import cache

from PySide6 import QtGui, QtWidgets

from ..graph_model import OPS

RGB = tuple[int, int, int]

KIND_COLORS: dict[str, RGB] = {
    "data": (64, 140, 214),
    "weight": (214, 140, 40),
    "state": (150, 96, 200),
    "gemm": (205, 72, 92),
    "elementwise": (58, 168, 140),
    "reduction": (58, 168, 140),  # the elementwise colour: a row reduction runs in the same fused kernels
    "output": (225, 200, 90),
}

KIND_LABELS: dict[str, str] = {
    "data": "Data",
    "weight": "Weight",
    "state": "State",
    "gemm": "GEMM",
    "elementwise": "Elementwise",
    "reduction": "Reduction",
    "output": "Cell",
}

ERROR_COLOR: RGB = (235, 80, 64)
WARNING_COLOR: RGB = (240, 190, 40)
# A note (a condition the cell runs under, not a problem): a calm blue, the hue of the selection, which
# launch colours keep away from already; a note shows as a badge only, never as a ring or border.
INFO_COLOR: RGB = (110, 175, 240)
# The text of a message by its severity, on the dark panels (lighter than the marks' colours).
SEVERITY_TEXT = {"error": "#f07060", "warning": "#f0c040", "info": "#{:02x}{:02x}{:02x}".format(*INFO_COLOR)}
SELECTED_COLOR: RGB = (80, 170, 255)  # blue: far from the amber of a warning
NODE_BODY: RGB = (44, 46, 52)
CANVAS_BACKGROUND: RGB = (30, 31, 35)
CANVAS_GRID: RGB = (40, 42, 47)

HOISTED_COLOR: RGB = (255, 214, 90)
# A group node: a quiet slate, far from the saturated colours of the kinds and of the plan's outlines.
GROUP_COLOR: RGB = (96, 108, 132)

# The plan view outlines each launch in a colour of its own. An outline must never read as a node's
# own colour or as a mark on a node, so launch colours keep away from these, in hue and in distance.
RESERVED_COLORS: list[RGB] = [*KIND_COLORS.values(), ERROR_COLOR, WARNING_COLOR, SELECTED_COLOR,
                              HOISTED_COLOR]
RESERVED_HUE_MARGIN = 15.0  # degrees either side of a reserved colour's hue
# Saturated enough not to read as grey; each must also stand out from the canvas as a thin line.
LAUNCH_LIGHTNESS = (0.6, 0.7, 0.8)
LAUNCH_SATURATION = (0.65, 0.9)
MIN_CONTRAST = 3.0  # against the canvas: WCAG's least for lines and shapes
LAUNCH_HUE_STEP = 3  # degrees between candidate hues
# How much a difference in lightness counts against one in hue and chroma when launch colours are
# spread apart: two outlines of one hue and two shades read as one colour more than the numbers say.
LIGHTNESS_WEIGHT = 0.5


def op_kind(op: str) -> str:
    """The colour kind of an op of the op table ('output' for the output sink)."""
    if op in ("input", "const"):
        return "data"
    if op in ("weight", "state", "output"):
        return op
    spec = OPS.get(op)
    if spec is not None and spec.kind == "matmul":
        return "gemm"
    if spec is not None and spec.kind == "reduction":
        return "reduction"
    return "elementwise"


def hue_of(rgb: RGB) -> float:
    """The hue in degrees, 0 to 360."""
    return colorsys.rgb_to_hls(*(c / 255.0 for c in rgb))[0] * 360.0


def hue_distance(a: float, b: float) -> float:
    d = abs(a - b) % 360.0
    return min(d, 360.0 - d)


def _linear(rgb: RGB) -> tuple[float, float, float]:
    """The sRGB channels as linear light, 0 to 1."""
    r, g, b = (v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4 for v in (c / 255.0 for c in rgb))
    return r, g, b


def lab_of(rgb: RGB) -> tuple[float, float, float]:
    """CIE L*a*b* of an sRGB colour (D65): distances in it follow what the eye sees."""
    r, g, b = _linear(rgb)
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883

    def f(t: float) -> float:
        return t ** (1.0 / 3.0) if t > 0.008856 else 7.787 * t + 16.0 / 116.0

    return 116.0 * f(y) - 16.0, 500.0 * (f(x) - f(y)), 200.0 * (f(y) - f(z))


def contrast(a: RGB, b: RGB) -> float:
    """WCAG's contrast ratio of two colours, 1 to 21."""
    def luminance(rgb: RGB) -> float:
        r, g, b = _linear(rgb)
        return 0.2126 * r + 0.7152 * g + 0.0722 * b

    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def _spread_point(rgb: RGB) -> tuple[float, float, float]:
    lightness, a, b = lab_of(rgb)
    return lightness * LIGHTNESS_WEIGHT, a, b


def _launch_candidates() -> list[RGB]:
    """Every colour a launch may take: away from the reserved hues, saturated, clear of the canvas."""
    reserved = [hue_of(c) for c in RESERVED_COLORS]
    out = []
    for hue in range(0, 360, LAUNCH_HUE_STEP):
        if any(hue_distance(hue, r) < RESERVED_HUE_MARGIN for r in reserved):
            continue
        for lightness in LAUNCH_LIGHTNESS:
            for saturation in LAUNCH_SATURATION:
                r, g, b = colorsys.hls_to_rgb(hue / 360.0, lightness, saturation)
                rgb = (round(r * 255), round(g * 255), round(b * 255))
                if contrast(rgb, CANVAS_BACKGROUND) >= MIN_CONTRAST:
                    out.append(rgb)
    return out


@cache
def _launch_sequence(n: int) -> tuple[RGB, ...]:
    """Farthest-point order: each colour is the candidate farthest from the reserved colours and from
    every colour before it. A prefix of the sequence is as spread as its length allows."""
    candidates = _launch_candidates()
    points = [_spread_point(c) for c in candidates]
    reserved = [_spread_point(c) for c in RESERVED_COLORS]
    nearest = [min(math.dist(p, r) for r in reserved) for p in points]
    out: list[RGB] = []
    for _ in range(min(n, len(candidates))):
        best = max(range(len(candidates)), key=lambda i: nearest[i])
        out.append(candidates[best])
        nearest = [min(d, math.dist(points[i], points[best])) for i, d in enumerate(nearest)]
    return tuple(out)


def launch_colors(n: int) -> list[RGB]:
    """n outline colours, one per launch of a plan, all different; launch i has the same colour
    whatever n is, so a launch keeps its colour when the plan grows."""
    sequence = _launch_sequence(n)
    # More launches than candidate colours (hundreds) would need repeats; no plan comes near.
    return [sequence[i % len(sequence)] for i in range(n)]


def qcolor(rgb: RGB, alpha: int = 255) -> QtGui.QColor:
    return QtGui.QColor(rgb[0], rgb[1], rgb[2], alpha)


def swatch_icon(rgb: RGB, size: int = 12) -> QtGui.QIcon:
    """A small rounded square of a colour, for lists and legends."""
    pix = QtGui.QPixmap(size, size)
    pix.fill(QtGui.QColor(0, 0, 0, 0))
    painter = QtGui.QPainter(pix)
    painter.setRenderHint(QtGui.QPainter.RenderHint.Antialiasing)
    painter.setBrush(qcolor(rgb))
    painter.setPen(qcolor(rgb).darker(150))
    painter.drawRoundedRect(1, 1, size - 2, size - 2, 3, 3)
    painter.end()
    return QtGui.QIcon(pix)


STYLESHEET = """
QMainWindow::separator { background: #1b1c20; width: 3px; height: 3px; }
QDockWidget { color: #d8dae0; titlebar-close-icon: none; }
QDockWidget::title { background: #2a2c32; padding: 5px 8px; border-bottom: 1px solid #1b1c20; }
QToolTip { color: #e8e8ea; background: #2a2c32; border: 1px solid #4a4d56; padding: 4px; }
QLineEdit, QPlainTextEdit, QComboBox, QSpinBox, QListWidget, QTreeWidget, QTableWidget {
    background: #24262b; border: 1px solid #3a3d45; border-radius: 3px; padding: 2px 4px;
    selection-background-color: #3d6fb0;
}
QLineEdit:focus, QComboBox:focus, QSpinBox:focus { border: 1px solid #5a8fd8; }
QSpinBox { padding-right: 18px; }
QSpinBox::up-button, QSpinBox::down-button { subcontrol-origin: border; width: 16px;
    background: #34373e; border-left: 1px solid #3a3d45; }
QSpinBox::up-button { subcontrol-position: top right; border-top-right-radius: 3px; }
QSpinBox::down-button { subcontrol-position: bottom right; border-bottom-right-radius: 3px; }
QSpinBox::up-button:hover, QSpinBox::down-button:hover { background: #454952; }
QSpinBox::up-arrow { width: 0; height: 0; border-left: 4px solid transparent;
    border-right: 4px solid transparent; border-bottom: 5px solid #c8ccd4; }
QSpinBox::down-arrow { width: 0; height: 0; border-left: 4px solid transparent;
    border-right: 4px solid transparent; border-top: 5px solid #c8ccd4; }
QSpinBox::up-arrow:disabled, QSpinBox::down-arrow:disabled { border-bottom-color: #5a5d66;
    border-top-color: #5a5d66; }
QLineEdit[invalid="true"], QSpinBox[invalid="true"], QComboBox[invalid="true"] {
    border: 1px solid #eb5040; }
QToolButton[invalid="true"], QCheckBox[invalid="true"] { color: #f07060; }
QHeaderView::section { background: #2a2c32; border: none; border-right: 1px solid #1b1c20;
    padding: 3px 6px; }
QPushButton { background: #34373e; border: 1px solid #464a53; border-radius: 3px; padding: 4px 12px; }
QPushButton:hover { background: #3d414a; }
QPushButton:pressed { background: #2c2f35; }
QPushButton:disabled { color: #70737a; }
QPushButton#primary { background: #2f6bc0; border: 1px solid #3d7fd8; color: white; font-weight: bold; }
QPushButton#primary:hover { background: #3777d0; }
QPushButton#primary:disabled { background: #2d3a4f; color: #8090a8; }
QProgressBar { background: #24262b; border: 1px solid #3a3d45; border-radius: 3px; text-align: center; }
QProgressBar::chunk { background: #2f6bc0; border-radius: 2px; }
QGroupBox { border: 1px solid #3a3d45; border-radius: 4px; margin-top: 10px; padding-top: 6px; }
QGroupBox::title { subcontrol-origin: margin; left: 8px; padding: 0 4px; color: #a8acb6; }
QLabel[role="heading"] { font-weight: bold; color: #e8e8ea; }
QLabel[role="hint"] { color: #8d919a; }
QLabel[role="error"] { color: #f07060; }
QTabBar::tab { background: #2a2c32; padding: 5px 12px; border: 1px solid #1b1c20; }
QTabBar::tab:selected { background: #34373e; }
QStatusBar { background: #2a2c32; }
QMenu::separator { height: 1px; background: #3a3d45; margin: 4px 8px; }
"""


def apply_theme(app: QtWidgets.QApplication) -> None:
    """A dark Fusion palette and the editor's stylesheet."""
    app.setStyle("Fusion")
    pal = QtGui.QPalette()
    role = QtGui.QPalette.ColorRole
    base = {
        role.Window: (40, 42, 47), role.WindowText: (216, 218, 224), role.Base: (36, 38, 43),
        role.AlternateBase: (44, 46, 52), role.ToolTipBase: (42, 44, 50),
        role.ToolTipText: (232, 232, 234), role.Text: (220, 222, 228), role.Button: (52, 55, 62),
        role.ButtonText: (220, 222, 228), role.BrightText: (255, 90, 80), role.Link: (90, 150, 230),
        role.Highlight: (61, 111, 176), role.HighlightedText: (255, 255, 255),
        role.PlaceholderText: (120, 124, 132),
    }
    for r, rgb in base.items():
        pal.setColor(r, qcolor(rgb))
    disabled = QtGui.QPalette.ColorGroup.Disabled
    for r in (role.Text, role.ButtonText, role.WindowText):
        pal.setColor(disabled, r, qcolor((112, 115, 122)))
    app.setPalette(pal)
    app.setStyleSheet(STYLESHEET)
