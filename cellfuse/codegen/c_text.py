"""Text of a cell as C: comments that stay comments, identifiers, float literals. Everything of a cell
that reaches generated code (its name, description and node ids, its constants) passes through here: a
cell file is shared, and the code is compiled and run by whoever exports it."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

MAX_STEM = 64  # characters of a cell's name kept in the generated names


def comment_text(text: str) -> str:
    """Any text (a cell's name or description, a node id) as the inside of a `//` or `/* */` comment that
    stays one: on one line, with no control, format or line-separator character (bidirectional overrides
    could make the code read differently from what compiles), no `/*` or `*/`, and no backslash or `??/`
    at its end, which would join the next line to a `//` comment."""
    kept = "".join(ch if _printable(ch) else " " for ch in text)
    one_line = " ".join(kept.split())
    apart = re.sub(r"(?<=/)(?=\*)|(?<=\*)(?=/)", " ", one_line)
    return apart[:_end_without_continuation(apart)]


def _printable(ch: str) -> bool:
    category = unicodedata.category(ch)
    return category[0] in "LMNPS" or category == "Zs"


def _end_without_continuation(text: str) -> int:
    """Where the text ends once blanks, backslashes and `??/` are taken off its end (scanned once from the
    end: a regular expression anchored at the end would take quadratic time on a long run of them)."""
    end = len(text)
    while end:
        if text[end - 1] == "\\" or text[end - 1].isspace():
            end -= 1
        elif text.endswith("??/", 0, end):
            end -= 3
        else:
            break
    return end


def c_name(text: str) -> str:
    """Text as identifier characters (ASCII letters, digits and "_"); a valid node id stays as it is."""
    return re.sub(r"[^A-Za-z0-9_]", "_", text)


def c_stem(name: str) -> str:
    """A cell's name as the stem of the generated C names (`cellfuse_<stem>_forward`, `cf_<stem>_k0`) and
    of the file name in the build command: lower-case ASCII letters, digits and single underscores, never
    empty, starting with a letter, and short enough for a file name."""
    stem = re.sub(r"_+", "_", c_name(name).lower()).strip("_")
    if not stem:
        return "cell"
    # (cut after `c_` is put in front, so that a stem is its own stem: at most MAX_STEM characters)
    return ("c_" + stem if stem[0].isdigit() else stem)[:MAX_STEM].rstrip("_")


def float_literal(value: float) -> str:
    """A constant as C: the float32 it rounds to (as the numpy executor computes with it) in the fewest
    digits that give that float32 back, parenthesised when negative, so that `(-{0})` of a negative one
    never reads `--1.0f`. Raises ValueError for a value beyond float32's range, which would be infinity."""
    with np.errstate(over="ignore"):
        single = np.float32(value)
    if not np.isfinite(single):
        raise ValueError(f"{value!r} is beyond float32's range (largest {np.finfo(np.float32).max})")
    text = str(single)
    if "e" not in text and "." not in text:
        text += ".0"
    return f"({text}f)" if text.startswith("-") else text + "f"


_AT_LINE_START = ("#if", "#else", "#elif", "#endif", "#define", "#include")


class CWriter:
    """Lines of C, each indented by the blocks it is in (four spaces a level): `w(line, ...)` writes
    lines at the current level, `with w.block(head):` writes `head`, the lines inside one level deeper,
    then the closing brace. Preprocessor conditionals and definitions stay at the start of their line."""

    def __init__(self, level: int = 0):
        self.lines: list[str] = []
        self.level = level

    def __call__(self, *lines: str) -> None:
        pad = "    " * self.level
        self.lines += [pad + line if line and not line.startswith(_AT_LINE_START) else line for line in lines]

    @contextmanager
    def block(self, head: str, end: str = "}") -> Iterator[None]:
        self(head)
        with self.indented():
            yield
        self(end)

    @contextmanager
    def indented(self, levels: int = 1) -> Iterator[None]:
        self.level += levels
        try:
            yield
        finally:
            self.level -= levels

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"
