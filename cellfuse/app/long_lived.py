"""Python's full garbage collections, kept short while a large cell is open.

The canvas of a cell of a thousand nodes is a few hundred thousand Python objects, and a full collection
walks every object alive: 0.1-0.2 s, every few edits (whenever enough new objects have come). So once a
cell is loaded, the objects alive after the next full collection are frozen (gc.freeze): later
collections leave them out and walk only what was made since. The next load hands them back first, so
that the collection after it frees what the last cell left.
"""

from __future__ import annotations

import gc

_armed = False  # freeze at the end of the next full collection


def freeze_after_next_full_collection() -> None:
    """After loading a cell: hands back what was frozen for the last one, and freezes what is alive once
    the next full collection has freed the garbage."""
    global _armed
    gc.unfreeze()
    if _freeze_once not in gc.callbacks:
        gc.callbacks.append(_freeze_once)
    _armed = True


def _freeze_once(phase: str, info: dict) -> None:
    global _armed
    if _armed and phase == "stop" and info["generation"] == 2:
        _armed = False
        gc.freeze()
