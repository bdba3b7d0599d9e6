"""Colours and the application style: one place for the editor's look.

Nodes are coloured by what they are to the compiler: data the step reads (the input and
constants), learned weights, recurrent states, GEMMs (matmul) and elementwise ops. The output sink
has a colour of its own.
"""

from __future__ import annotations

from PySide6 import QtGui, QtWidgets

from ..graph_model import OPS

RGB = tuple[int, int, int]

KIND_COLORS: dict[str, RGB] = {
    "data": (64, 140, 214),
    "weight": (214, 140, 40),
    "state": (150, 96, 200),
    "gemm": (205, 72, 92),
    "elementwise": (58, 168, 140),
    "output": (225, 200, 90),
}

KIND_LABELS: dict[str, str] = {
    "data": "Data",
    "weight": "Weight",
    "state": "State",
    "gemm": "GEMM",
    "elementwise": "Elementwise",
    "output": "Cell",
}

ERROR_COLOR: RGB = (235, 80, 64)
WARNING_COLOR: RGB = (240, 190, 40)
SELECTED_COLOR: RGB = (80, 170, 255)  # blue: far from the amber of a warning
NODE_BODY: RGB = (44, 46, 52)
CANVAS_BACKGROUND: RGB = (30, 31, 35)
CANVAS_GRID: RGB = (40, 42, 47)

# Overlay colours of the plan view: GEMM groups, then fused kernels, cycled.
GEMM_GROUP_COLORS: list[RGB] = [(205, 72, 92), (232, 120, 60), (200, 90, 160), (170, 60, 60)]
FUSED_COLORS: list[RGB] = [(58, 168, 140), (64, 140, 214), (120, 180, 70), (90, 110, 220),
                           (40, 180, 200)]
HOISTED_COLOR: RGB = (255, 214, 90)


def op_kind(op: str) -> str:
    """The colour kind of an op of the op table ('output' for the output sink)."""
    if op in ("input", "const"):
        return "data"
    if op in ("weight", "state", "output"):
        return op
    spec = OPS.get(op)
    if spec is not None and spec.kind == "matmul":
        return "gemm"
    return "elementwise"


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
QLineEdit[invalid="true"] { border: 1px solid #eb5040; }
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
