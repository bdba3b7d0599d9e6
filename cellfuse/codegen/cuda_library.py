"""The fixed CUDA of the generated modules, kept in `.cuh` files of the package (cellfuse/resources/cuda):
the device math of the op table, the splits of three fp16 products, what a persistent kernel's blocks
share, the warpgroup GEMM, the exported program's demo. A module is assembled as one self-contained
source, each file's `#include "x.cuh"` of another of them replaced by that file's text the first time
(as an include guard would) and by nothing after; parameters the Python side decides come first, as
#defines."""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from importlib import resources

_PACKAGE = "cellfuse.resources.cuda"
_INCLUDE = re.compile(r'^#include "([\w.]+\.cuh)"\n', re.M)


@cache
def _text(name: str) -> str:
    return (resources.files(_PACKAGE) / name).read_text("utf-8")


def library_files() -> list[str]:
    """The names of the library's files."""
    return sorted(p.name for p in resources.files(_PACKAGE).iterdir() if p.name.endswith(".cuh"))


def cuda_library(*names: str, defines: Mapping[str, int | str] | None = None) -> str:
    """The files' text, in order, each of them and of what they include once; after `defines`."""
    seen: set[str] = set()

    def expand(name: str) -> str:
        if name in seen:
            return ""
        seen.add(name)
        return _INCLUDE.sub(lambda m: expand(m.group(1)), _text(name))

    head = "".join(f"#define {name} {value}\n" for name, value in (defines or {}).items())
    return head + "".join(expand(name) for name in names)
