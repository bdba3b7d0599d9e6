"""A guard against a reference-count bug of PySide6 6.12 on CPython 3.11.

PySide6 6.12 hands out None (from every Qt method that returns nothing) and True or False (from
`Signal.emit`) without adding a reference to them, as if they were immortal, which they only are
from CPython 3.12. On 3.11 each such call takes one reference away; after a few thousand calls
(seconds of painting, or of edits) the count reaches zero and the interpreter aborts with
"none_dealloc: deallocating None" or "bool_dealloc: deallocating True or False".

`guard_singletons()` measures whether the running PySide6 has the bug and, if so, gives None, True
and False so many references that no run of the editor can use them up (CPython 3.12 makes them
immortal to the same effect).
"""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger(__name__)

RESERVE = 1 << 40
_PROBES = 64
_applied = False


def pyside_drops_references() -> bool:
    """Whether a void Qt call costs None a reference, or an emit costs True one, in this process."""
    from PySide6 import QtCore

    class _Probe(QtCore.QObject):
        ping = QtCore.Signal()

    point, probe = QtCore.QPoint(), _Probe()
    none, true = sys.getrefcount(None), sys.getrefcount(True)
    for _ in range(_PROBES):
        point.setX(1)
        probe.ping.emit()
    lost = min(sys.getrefcount(None) - none, sys.getrefcount(True) - true)
    return lost <= -_PROBES // 2


def guard_singletons() -> bool:
    """Applies the guard where it is needed (once); returns whether it is in place."""
    global _applied
    if _applied:
        return True
    if sys.version_info >= (3, 12) or sys.implementation.name != "cpython" \
            or hasattr(sys, "gettotalrefcount"):  # immortal singletons, or a layout we do not know
        return False
    if not pyside_drops_references():
        return False
    # ob_refcnt is the first field of every object in a release build of CPython 3.11.
    for singleton in (None, True, False):
        ctypes.c_ssize_t.from_address(id(singleton)).value += RESERVE
    _applied = True
    log.debug("PySide6 drops references to None, True and False; gave each %d more", RESERVE)
    return True
