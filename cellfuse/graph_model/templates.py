"""The built-in cells, shipped as cell files in cellfuse/resources/templates."""

from __future__ import annotations

from importlib import resources

from .cell import Cell
from .cellfile import cell_from_text
from .validate import CellError

_PACKAGE = "cellfuse.resources.templates"
_SUFFIX = ".cell.json"


def template_names() -> list[str]:
    return sorted(p.name[: -len(_SUFFIX)] for p in resources.files(_PACKAGE).iterdir()
                  if p.name.endswith(_SUFFIX))


def template_text(name: str) -> str:
    if name not in template_names():
        raise CellError(f"no template named '{name}' (templates: {', '.join(template_names())})")
    return (resources.files(_PACKAGE) / f"{name}{_SUFFIX}").read_text("utf-8")


def load_template(name: str) -> Cell:
    return cell_from_text(template_text(name), f"template '{name}'")
