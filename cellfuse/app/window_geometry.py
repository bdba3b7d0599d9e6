"""Where the window opens the first time, how small its panels may get, and how tall the bottom dock
area is for the panel raised in it.

The first window takes the size it was designed for where the screen has room, and the screen's
available area (without task bars and docks) where it has not, so that no edge is off-screen.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6 import QtCore, QtWidgets

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


# The bottom dock area's height, as a share of the window's, by the panel raised in it: the problems list
# (mostly empty) is short, and the canvas keeps the room; the equations and the CUDA source are read a
# screenful at a time and get more lines; the benchmark's settings get the height they ask for.
BOTTOM_SHORT_SHARE = 0.17
BOTTOM_TALL_SHARE = 0.42
HAND_SET_SLACK = 4  # pixels: a height this far from the one set last was set by hand


class BottomDocks(QtCore.QObject):
    """Sizes the bottom dock area of `window` for the dock raised in it: `tall` docks get the tall share,
    `short` ones the short share, and each of `sized` the height its function gives (the benchmark's
    settings), the short share at least. A height the user drags by hand is kept from then on, until the
    panels are laid out anew (`fit`)."""

    def __init__(self, window: QtWidgets.QMainWindow, tall: list[QtWidgets.QDockWidget],
                 short: list[QtWidgets.QDockWidget],
                 sized: dict[QtWidgets.QDockWidget, Callable[[], int]]) -> None:
        super().__init__(window)
        self._window, self._tall, self._sized = window, tall, sized
        self._docks = [*tall, *short, *sized]
        # The heights the area was given (asked for, and taken once laid out); None: the user's own since.
        self._set: set[int] | None = None
        self._last: QtWidgets.QDockWidget | None = None  # the dock it was given them for
        for dock in self._docks:
            dock.visibilityChanged.connect(lambda shown, d=dock: shown and self._raised(d))

    def wanted(self, dock: QtWidgets.QDockWidget) -> int:
        height = self._window.height()
        if dock in self._tall:
            return int(height * BOTTOM_TALL_SHARE)
        short = int(height * BOTTOM_SHORT_SHARE)
        if dock in self._sized:
            title = dock.style().pixelMetric(QtWidgets.QStyle.PixelMetric.PM_TitleBarHeight)
            # the area holds the tabs of the docks tabbed together as well as the dock
            return max(short, self._sized[dock]() + title + self._tabs_height(dock))
        return short

    def _tabs_height(self, dock: QtWidgets.QDockWidget) -> int:
        direct = QtCore.Qt.FindChildOption.FindDirectChildrenOnly
        bars = self._window.findChildren(QtWidgets.QTabBar, options=direct)
        return max((bar.height() for bar in bars if bar.isVisible()
                    and dock.windowTitle() in [bar.tabText(i) for i in range(bar.count())]), default=0)

    def raised(self) -> QtWidgets.QDockWidget | None:
        """The dock shown in the area now (of tabbed docks only one is drawn)."""
        return next((d for d in self._docks if d.isVisible() and not d.visibleRegion().isEmpty()), None)

    def fit(self, dock: QtWidgets.QDockWidget | None = None) -> None:
        """Sizes the area for `dock`, or for the dock raised in it."""
        dock = dock or self.raised()
        if dock is None:
            return
        height = self.wanted(dock)
        self._window.resizeDocks([dock], [height], QtCore.Qt.Orientation.Vertical)
        self._set = {height, *(self._set or ())}
        self._last = dock
        # the height the area takes, once laid out (panels' minimum and maximum sizes bound it)
        QtCore.QTimer.singleShot(0, lambda: self._took(dock))

    def _took(self, dock: QtWidgets.QDockWidget) -> None:
        if self._set is not None and dock is self._last:  # (behind a newer tab, it keeps the area's size)
            self._set = {dock.height()}

    def _raised(self, dock: QtWidgets.QDockWidget) -> None:
        # once the tab has switched: the dock raised has the area's height then
        QtCore.QTimer.singleShot(0, lambda: self._follow(dock))

    def _follow(self, dock: QtWidgets.QDockWidget) -> None:
        # The area's height: that of the dock last sized, which keeps its geometry behind the new tab (a
        # dock never shown before has none yet).
        shown = self._last or dock
        if self._set is None or all(abs(shown.height() - h) > HAND_SET_SLACK for h in self._set):
            self._set = None  # dragged by hand: kept
            return
        self.fit(dock)
