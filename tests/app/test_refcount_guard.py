"""The guard against PySide6 6.12 taking references from None, True and False (see refcount_guard)."""

from __future__ import annotations

import sys

from PySide6 import QtCore

from cellfuse.app import refcount_guard


class _Emitter(QtCore.QObject):
    changed = QtCore.Signal(object)
    flag = QtCore.Signal(bool)


def test_many_void_calls_and_emits_do_not_use_up_the_singletons():
    point, emitter = QtCore.QPoint(), _Emitter()
    emitter.changed.connect(lambda value: None)
    emitter.flag.connect(lambda value: None)
    # Without the guard, on an affected PySide6, this many calls abort the interpreter.
    for _ in range(50_000):
        point.setX(1)
        emitter.changed.emit(None)
        emitter.flag.emit(True)
        emitter.flag.emit(False)
    assert sys.getrefcount(None) > 0 and sys.getrefcount(True) > 0 and sys.getrefcount(False) > 0


def test_guard_is_in_place_wherever_it_is_needed():
    if sys.version_info >= (3, 12):
        assert not refcount_guard.guard_singletons()  # immortal singletons: nothing to do
        return
    if refcount_guard.guard_singletons():
        assert sys.getrefcount(None) > refcount_guard.RESERVE // 2
        assert sys.getrefcount(True) > refcount_guard.RESERVE // 2
    else:
        assert not refcount_guard.pyside_drops_references()
