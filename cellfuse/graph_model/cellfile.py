"""Reading and writing cell files (`*.cell.json`), and atomic file writes.

Loading checks the file's structure (JSON syntax, format version, the type of every field) and
raises CellError naming the line, node or key at fault. Whether the graph makes sense is
`validate.analyze`'s job: the editor must be able to hold a cell that still has problems.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from .cell import DEFAULT_SIZES, FORMAT, Cell, Node
from .validate import CellError, is_finite_number

_NODE_KEYS = {"id", "op", "args", "shape", "value"}
_TOP_KEYS = {"format", "name", "description", "sizes", "nodes", "updates", "output", "layout"}


def atomic_write(path: str | os.PathLike[str], data: bytes) -> None:
    """Writes a file so that it is either the old one or the whole new one, never a torn mix.

    The data goes to a temporary file beside the target, which then replaces it. A new file gets the
    permissions a plain open() would give it; an existing file keeps its own.
    """
    path = Path(path)
    try:
        mode: int | None = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mode = None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, flags, 0o666)  # the umask applies, as for any new file
            break
        except FileExistsError:
            continue
        except OSError as e:
            # Name the file asked for, not the temporary one.
            raise OSError(e.errno, e.strerror, str(path)) from None
    else:
        raise OSError(f"{path}: cannot create a temporary file beside it")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _where(i: int, raw: Any) -> str:
    if isinstance(raw, dict) and isinstance(raw.get("id"), str):
        return f"node '{raw['id']}'"
    return f"node #{i + 1}"


def _node_from_json(i: int, raw: Any) -> Node:
    if not isinstance(raw, dict):
        raise CellError(f"node #{i + 1} must be an object with 'id' and 'op', got {raw!r:.60}")
    where = _where(i, raw)
    for key in ("id", "op"):
        if not isinstance(raw.get(key), str):
            raise CellError(f"{where}: '{key}' must be a string, got {raw.get(key)!r:.60}")
    unknown = [k for k in raw if k not in _NODE_KEYS and not k.startswith("x-")]
    if unknown:
        raise CellError(f"{where}: unknown key(s) {unknown} (editor data must start with 'x-')")
    args = raw.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise CellError(f"{where}: 'args' must be a list of node ids, got {args!r:.60}")
    shape = raw.get("shape")
    if shape is not None and (not isinstance(shape, list)
                              or not all(isinstance(d, str) for d in shape)):
        raise CellError(f"{where}: 'shape' must be a list like [\"input\", \"hidden\"], got {shape!r:.60}")
    value = raw.get("value")
    if value is not None and not is_finite_number(value):
        raise CellError(f"{where}: 'value' must be a finite number, got {value!r:.60}")
    return Node(
        id=raw["id"], op=raw["op"], args=list(args), shape=list(shape) if shape is not None else None,
        value=float(value) if value is not None else None,
        extra={k: v for k, v in raw.items() if k.startswith("x-")},
    )


def cell_from_json(data: Any) -> Cell:
    """A Cell from the parsed JSON of a cell file; raises CellError on a structural fault."""
    if not isinstance(data, dict):
        raise CellError("a cell file must hold one JSON object")
    fmt = data.get("format")
    if fmt != FORMAT:
        raise CellError(f"unknown format {fmt!r}: this version of CellFuse reads '{FORMAT}'")
    unknown = [k for k in data if k not in _TOP_KEYS and not k.startswith("x-")]
    if unknown:
        raise CellError(f"unknown top-level key(s) {unknown} (editor data must start with 'x-')")
    name = data.get("name", "cell")
    if not isinstance(name, str):
        raise CellError(f"'name' must be a string, got {name!r:.60}")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise CellError(f"'description' must be a string, got {description!r:.60}")
    sizes = data.get("sizes", {})
    if not isinstance(sizes, dict) or any(
        k not in ("input", "hidden") or isinstance(v, bool) or not isinstance(v, int) or v < 1
        for k, v in sizes.items()
    ):
        raise CellError(f"'sizes' must map 'input' and 'hidden' to positive integers, got {sizes!r:.80}")
    nodes_raw = data.get("nodes")
    if not isinstance(nodes_raw, list):
        raise CellError("'nodes' must be a list of nodes")
    nodes = [_node_from_json(i, raw) for i, raw in enumerate(nodes_raw)]
    updates = data.get("updates", {})
    if not isinstance(updates, dict) or not all(isinstance(v, str) for v in updates.values()):
        raise CellError(f"'updates' must map state ids to node ids, got {updates!r:.80}")
    output = data.get("output")
    if output is not None and not isinstance(output, str):
        raise CellError(f"'output' must be a node id, got {output!r:.60}")
    layout = data.get("layout", {})
    if not isinstance(layout, dict) or not all(
        isinstance(p, list) and len(p) == 2 and all(is_finite_number(c) for c in p)
        for p in layout.values()
    ):
        raise CellError("'layout' must map node ids to [x, y] positions")
    return Cell(
        name=name, nodes=nodes, updates=dict(updates), output=output, description=description,
        sizes={**DEFAULT_SIZES, **sizes},
        layout={k: [float(p[0]), float(p[1])] for k, p in layout.items()},
        extra={k: v for k, v in data.items() if k.startswith("x-")},
    )


def cell_from_text(text: str, source: str = "<text>") -> Cell:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise CellError(f"{source}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise CellError(f"{source}: invalid JSON: nested too deeply") from None
    except ValueError as e:  # an integer too long to convert, for one
        raise CellError(f"{source}: invalid JSON: {e}") from None
    try:
        return cell_from_json(data)
    except CellError as e:
        raise CellError(f"{source}: {e}") from None


def load_cell(path: str | os.PathLike[str]) -> Cell:
    """Reads a cell file. Nothing in the file is ever executed."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise CellError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise CellError(f"{path}: is a directory, not a cell file") from None
    except OSError as e:
        raise CellError(f"{path}: cannot read: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CellError(f"{path}: not UTF-8 text (byte {e.start})") from None
    return cell_from_text(text, str(path))


def cell_to_text(cell: Cell) -> str:
    """The file's text: one node, and one layout position, per line, so that diffs stay readable."""
    lines = ["{"]
    items = list(cell.to_json().items())
    for i, (key, value) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        if key == "nodes" or (key == "layout" and value):
            inner = ([json.dumps(v) for v in value] if key == "nodes"
                     else [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in value.items()])
            opener, closer = ("[", "]") if key == "nodes" else ("{", "}")
            lines.append(f"  {json.dumps(key)}: {opener}")
            lines.extend(f"    {line}{',' if j < len(inner) - 1 else ''}" for j, line in enumerate(inner))
            lines.append(f"  {closer}{comma}")
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def save_cell(cell: Cell, path: str | os.PathLike[str]) -> None:
    atomic_write(path, cell_to_text(cell).encode("utf-8"))
