"""The open document: where it is saved and what it held when last saved, so the editor knows when
there are unsaved changes (an undo back to the saved state counts as no change)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..graph_model import Cell

CELL_SUFFIX = ".cell.json"


@dataclass
class Document:
    path: Path | None = None
    saved: dict[str, Any] | None = None  # the cell as last opened or saved; None: never saved

    def is_modified(self, cell: Cell) -> bool:
        return self.saved is None or cell.to_json() != self.saved

    def display_name(self, cell: Cell) -> str:
        return self.path.name if self.path is not None else f"{cell.name} (new)"

    def suggested_name(self, cell: Cell) -> str:
        if self.path is not None:
            return str(self.path)
        stem = "".join(c if c.isalnum() or c in "-_" else "_" for c in cell.name.lower()) or "cell"
        return f"{stem}{CELL_SUFFIX}"


def with_cell_suffix(path: Path) -> Path:
    """`path`, with .cell.json added when the user gave no suffix."""
    return path if path.suffix else path.with_name(path.name + CELL_SUFFIX)
