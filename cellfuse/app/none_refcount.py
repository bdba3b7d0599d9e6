"""A guard against a reference-count bug of PySide6 6.12 on CPython 3.11.

PySide6 6.12 returns None from every Qt method that returns nothing (and from those that return a
null object) without adding a reference to it, as if None were immortal, which it only is from
CPython 3.12. On 3.11 each such call takes one reference from None; after a few thousand calls
(a few seconds of painting) None's count reaches zero and the interpreter aborts with
"none_dealloc: deallocating None".

`keep_none_alive()` measures whether the running PySide6 has the bug and, if so, gives None so many
references that no session can use them up (as CPython 3.12 does by making None immortal).
"""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger(__name__)

RESERVE = 1 << 40
_PROBES = 64
_applied = False


def pyside_drops_none_references() -> bool:
    """Whether a void Qt call costs None a reference in this process."""
    from PySide6 import QtCore

    point = QtCore.QPoint()
    before = sys.getrefcount(None)
    for _ in range(_PROBES):
        point.setX(1)
    return sys.getrefcount(None) - before <= -_PROBES // 2


def keep_none_alive() -> bool:
    """Applies the guard where it is needed (once); returns whether it is in place."""
    global _applied
    if _applied:
        return True
    if sys.version_info >= (3, 12) or sys.implementation.name != "cpython" \
            or hasattr(sys, "gettotalrefcount"):  # immortal None, or a layout we do not know
        return False
    if not pyside_drops_none_references():
        return False
    # ob_refcnt is the first field of every object in a release build of CPython 3.11.
    refcount = ctypes.c_ssize_t.from_address(id(None))
    refcount.value += RESERVE
    _applied = True
    log.debug("PySide6 drops references to None; gave None %d more", RESERVE)
    return True
