"""Where the window opens the first time, and how small its panels may get.

The first window takes the size it was designed for where the screen has room, and the screen's
available area (without task bars and docks) where it has not, so that no edge is off-screen.
"""

from __future__ import annotations

from PySide6 import QtCore

PREFERRED_SIZE = (1500, 920)
# Room left around the window for its frame and title bar, which Qt does not count in its geometry.
FRAME_ALLOWANCE = (16, 48)

# Panel minimum sizes: below these a panel's content is cut rather than laid out.
PALETTE_MIN_WIDTH = 170
SIDE_PANEL_MIN_WIDTH = 260
BOTTOM_PANEL_MIN_HEIGHT = 120
CANVAS_MIN_SIZE = (320, 200)


def initial_geometry(available: QtCore.QRect) -> QtCore.QRect:
    """The window's first geometry on a screen whose available area is `available`: the preferred
    size, or as much of the area as the frame leaves, centred in it."""
    width = min(PREFERRED_SIZE[0], available.width() - FRAME_ALLOWANCE[0])
    height = min(PREFERRED_SIZE[1], available.height() - FRAME_ALLOWANCE[1])
    rect = QtCore.QRect(0, 0, max(1, width), max(1, height))
    # The title bar sits above the geometry's top edge: centre the frame, not the client area.
    rect.moveCenter(available.center() + QtCore.QPoint(0, FRAME_ALLOWANCE[1] // 4))
    return rect
