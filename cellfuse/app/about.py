"""Help → About: the version, whether a GPU was found, and where the editor keeps its files."""

from __future__ import annotations

from html import escape

from PySide6 import QtWidgets

from .. import __version__
from . import autosave, recent_files


def about_text() -> str:
    from ..gpu_runtime.bench import available_backends

    gpu = ("found: the benchmark runs the generated CUDA" if "cuda" in available_backends()
           else "not found (or PyCUDA / nvmath-python missing): the benchmark runs the numpy backend "
                "on the CPU")
    places = [
        ("Settings", recent_files.settings().fileName()),
        ("Autosaves", str(autosave.autosave_dir())),
        ("Compiled kernels", "PyCUDA's compiler cache, in the folder PyCUDA chooses"),
    ]
    rows = "".join(f"<tr><td><b>{escape(k)}</b></td><td>{escape(v)}</td></tr>" for k, v in places)
    return (f"<h3>CellFuse {escape(__version__)}</h3>"
            "<p>Draw one time step of a recurrent cell; CellFuse schedules it, generates CUDA, checks it "
            "against a reference and times it.</p>"
            f"<p><b>NVIDIA GPU:</b> {escape(gpu)}</p>"
            f"<table cellspacing=4>{rows}</table>")


def show_about(parent: QtWidgets.QWidget) -> None:
    QtWidgets.QMessageBox.about(parent, "About CellFuse", about_text())
