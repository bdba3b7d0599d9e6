"""The desktop editor: a node canvas that edits a cell, with live validation, the plan and the
generated CUDA of the cell, and a benchmark panel. Only the `gui` command imports this package."""

from .none_refcount import keep_none_alive

keep_none_alive()  # before any Qt call of the editor; see none_refcount
