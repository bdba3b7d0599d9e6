"""The desktop editor: a node canvas that edits a cell, with live validation, the plan and the
generated CUDA of the cell, and a benchmark panel. Only the `gui` command imports this package."""
