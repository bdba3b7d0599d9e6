"""Whether Qt's X11 platform plugin can load, checked before the QApplication exists.

Qt's xcb plugin needs X11 libraries that a fresh Linux install may lack; without them
QApplication aborts in C++ with "could not load the Qt platform plugin", and Python never sees an
exception. The libraries are looked up by name, as the dynamic linker would find them.
"""

from __future__ import annotations

import ctypes.util
import os
import sys
from collections.abc import Callable, Mapping

# The libraries Qt 6's xcb plugin loads, by linker name, and the Debian/Ubuntu package of each.
XCB_LIBRARIES = {
    "xcb-cursor": "libxcb-cursor0",
    "xcb-icccm": "libxcb-icccm4",
    "xcb-keysyms": "libxcb-keysyms1",
    "xcb-image": "libxcb-image0",
    "xcb-render-util": "libxcb-render-util0",
    "xcb-randr": "libxcb-randr0",
    "xcb-shape": "libxcb-shape0",
    "xcb-xkb": "libxcb-xkb1",
    "xkbcommon-x11": "libxkbcommon-x11-0",
}
QT_REQUIREMENTS_URL = "https://doc.qt.io/qt-6/linux-requirements.html"


def uses_xcb(environ: Mapping[str, str], platform: str = sys.platform) -> bool:
    """True where Qt will load its xcb plugin: Linux, asked for xcb or for nothing outside Wayland."""
    if not platform.startswith("linux"):
        return False
    chosen = environ.get("QT_QPA_PLATFORM", "").split(":")[0].strip()
    if chosen:
        return chosen == "xcb"
    return not environ.get("WAYLAND_DISPLAY")


def missing_xcb_packages(find: Callable[[str], str | None] = ctypes.util.find_library) -> list[str]:
    """The Debian/Ubuntu packages of the xcb libraries the linker cannot find."""
    return [package for name, package in XCB_LIBRARIES.items() if not find(name)]


def platform_hint(environ: Mapping[str, str] = os.environ, platform: str = sys.platform,
                  find: Callable[[str], str | None] = ctypes.util.find_library) -> str | None:
    """What to install before the editor can open its window, or None when nothing is missing."""
    if not uses_xcb(environ, platform):
        return None
    if not environ.get("DISPLAY"):
        return ("cellfuse: the editor cannot open a window: there is no display (DISPLAY is not set).\n"
                "  Run it in a desktop session, over ssh -X, or under a virtual display: xvfb-run cellfuse\n"
                "The command-line tools (cellfuse plan, export, bench, ...) need no display.")
    missing = missing_xcb_packages(find)
    if not missing:
        return None
    return ("cellfuse: the editor cannot open a window: Qt's X11 (xcb) platform plugin needs system "
            "libraries that are not installed.\n"
            f"  On Debian or Ubuntu:  sudo apt install {' '.join(missing)}\n"
            f"  Elsewhere, install the packages of the libraries in {QT_REQUIREMENTS_URL}\n"
            "The command-line tools (cellfuse plan, export, bench, ...) need none of them.")
