"""Hostile arguments and signals against the command line, in real processes: one clear message, the
right exit code, no traceback, and no file lost, replaced or left behind."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiers import slow_beyond, slow_where

from cellfuse.graph_model.templates import template_text

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def cellfuse(*argv: object, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "cellfuse", *map(str, argv)], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def write_cell(path: Path) -> Path:
    path.write_text(template_text("elman"))
    return path


@pytest.mark.slow  # a subprocess a case
def test_export_onto_its_own_cell_file_is_refused(tmp_path):
    cell = write_cell(tmp_path / "e.cell.json")
    before = cell.read_bytes()
    proc = cellfuse("export", cell.name, "-o", cell.name, cwd=tmp_path)
    assert proc.returncode == 1 and "the cell file this command reads" in proc.stderr
    assert cell.read_bytes() == before
    # also through another spelling of the same path
    proc = cellfuse("export", cell.name, "-o", f"./{cell.name}", cwd=tmp_path)
    assert proc.returncode == 1 and cell.read_bytes() == before


@pytest.mark.slow  # a subprocess a case
def test_run_onto_its_parameters_or_inputs_is_refused(tmp_path):
    cell = write_cell(tmp_path / "e.cell.json")
    assert cellfuse("init-params", cell.name, "--input", 3, "--hidden", 4, "-o", "p.npz",
                    cwd=tmp_path).returncode == 0
    assert cellfuse("init-inputs", cell.name, "--seq", 2, "--batch", 2, "--input", 3, "-o", "x.npz",
                    cwd=tmp_path).returncode == 0
    for target, what in (("p.npz", "parameters"), ("x.npz", "inputs"), (cell.name, "cell")):
        before = (tmp_path / target).read_bytes()
        proc = cellfuse("run", cell.name, "--params", "p.npz", "--inputs", "x.npz", "-o", target,
                        cwd=tmp_path)
        assert proc.returncode == 1 and f"the {what} file this command reads" in proc.stderr
        assert (tmp_path / target).read_bytes() == before
    proc = cellfuse("init-params", cell.name, "-o", cell.name, cwd=tmp_path)
    assert proc.returncode == 1 and "the cell file" in proc.stderr


@pytest.mark.slow  # a subprocess a case
def test_an_output_that_is_not_a_regular_file_is_left_as_it_is(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for argv in (("export", "elman", "-o", fifo), ("templates", "gru", "-o", fifo),
                 ("init-params", "elman", "-o", fifo)):
        proc = cellfuse(*argv, cwd=tmp_path, timeout=20)
        assert proc.returncode == 1 and "not a regular file" in proc.stderr, proc.stderr
        assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


@pytest.mark.slow  # a subprocess a case
def test_an_output_that_is_a_directory_names_the_directory(tmp_path):
    (tmp_path / "out").mkdir()
    proc = cellfuse("export", "elman", "-o", "out", cwd=tmp_path)
    assert proc.returncode == 1
    assert "out: is a directory" in proc.stderr and ".tmp" not in proc.stderr
    assert list((tmp_path / "out").iterdir()) == []
    proc = cellfuse("bench", "elman", "--json", "out", cwd=tmp_path)
    assert proc.returncode == 1 and "--json out: is a directory" in proc.stderr


def test_bench_json_and_plot_cannot_be_one_file(tmp_path):
    proc = cellfuse("bench", "elman", "--json", "r.out", "--plot", "r.out", cwd=tmp_path)
    assert proc.returncode == 1 and "same file" in proc.stderr


@pytest.mark.parametrize("sweep", slow_beyond(["batch=-1", "hidden=-3", "seq=-2", "batch=0", "layers=1,0"],
                                              1))
def test_a_sweep_over_sizes_below_one_is_refused(tmp_path, sweep):
    proc = cellfuse("bench", "elman", "--backend", "numpy", "--sweep", sweep, cwd=tmp_path)
    assert proc.returncode == 1 and "at least 1" in proc.stderr


def _before_cellfuse_ran(err: str) -> bool:
    """A KeyboardInterrupt traceback in which no line of CellFuse's own code had started: Python's
    startup and runpy only, at most the package's __init__ (which only sets the version)."""
    frames = re.findall(r'File "([^"]+)", line \d+', err)
    ours = [f for f in frames if f"{os.sep}cellfuse{os.sep}" in f]
    return err.rstrip().endswith("KeyboardInterrupt") and all(f.endswith("__init__.py") for f in ours)


@pytest.mark.parametrize("delay", slow_where([0.0, 0.02, 0.05, 0.1, 0.2, 0.4],
                                             lambda delay: delay not in (0.05, 0.4)))
def test_ctrl_c_at_any_moment_ends_cleanly(tmp_path, delay):
    """While Python imports, while the parser is built, while the command runs."""
    proc = subprocess.Popen([sys.executable, "-m", "cellfuse", "plan", "lstm"], cwd=tmp_path, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    if "Fatal Python error: init_import_site" in err or _before_cellfuse_ran(err):
        # The signal came while Python itself was starting (importing `site`, or running the package
        # before the first line of cellfuse/__main__.py): Python stops with its own message, which no
        # program can change.
        assert proc.returncode != 0
        return
    assert "Traceback" not in err, err
    # finished before the signal, interrupted with our message, or stopped by the signal before
    # Python's own handler was installed
    assert proc.returncode in (0, 130, -signal.SIGINT), (proc.returncode, err)
    if proc.returncode == 130:
        assert err.strip().endswith("cellfuse: interrupted")


def test_sigterm_while_saving_leaves_no_temporary_file(tmp_path):
    # The save is slowed down (fsync waits) so that the signal arrives while the temporary file exists.
    slow = ("import os, sys, time; real = os.fsync; "
            "os.fsync = lambda fd: (time.sleep(5), real(fd)); "
            "from cellfuse.__main__ import main; sys.exit(main())")
    argv = ["init-params", "elman", "--input", "3", "--hidden", "4", "-o", "p.npz"]
    proc = subprocess.Popen([sys.executable, "-c", slow, *argv], cwd=tmp_path, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not any(p.name.endswith(".tmp") for p in tmp_path.iterdir()):
        assert time.monotonic() < deadline and proc.poll() is None, "the save never started"
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM and "cellfuse: terminated" in err, err
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_a_fifo_given_as_the_cell_does_not_block(tmp_path):
    fifo = tmp_path / "cell.json"
    os.mkfifo(fifo)
    proc = cellfuse("validate", fifo.name, cwd=tmp_path, timeout=30)
    assert proc.returncode == 1 and "not a regular file" in proc.stderr


def test_the_output_of_a_run_that_failed_is_not_written(tmp_path):
    cell = write_cell(tmp_path / "e.cell.json")
    data = json.loads(cell.read_text())
    data["output"] = "nothing"
    cell.write_text(json.dumps(data))
    proc = cellfuse("export", cell.name, "-o", "e.cu", cwd=tmp_path)
    assert proc.returncode == 1 and not (tmp_path / "e.cu").exists()


def test_a_cell_cannot_send_escape_sequences_to_the_terminal(tmp_path):
    data = json.loads(template_text("elman"))
    data["name"] = "evil\x1b]0;owned\x07\x1b[2J\r\u202enoisrev"
    data["nodes"].append({"id": "bad\x1b[31mid", "op": "const", "value": 1.0})
    (tmp_path / "e.cell.json").write_text(json.dumps(data))
    for argv in (("validate", "e.cell.json"), ("plan", "e.cell.json")):
        proc = cellfuse(*argv, cwd=tmp_path)
        text = proc.stdout + proc.stderr
        assert "\x1b" not in text and "\r" not in text and "\x07" not in text and "\u202e" not in text
        assert "\\x1b" in text  # shown, as an escape


@pytest.mark.parametrize("argv", slow_where([
    ("plan", "lstm", "--layers", "1000000000"),
    ("export", "lstm", "--layers", "1000000000", "-o", "x.cu"),
    ("init-params", "lstm", "--layers", "1000000000", "-o", "p.npz"),
    ("plan", "lstm", "--hidden", "100000000000"),
    ("init-params", "lstm", "--hidden", str(10**400), "-o", "p.npz"),
    ("init-inputs", "lstm", "--seq", "100000000", "--batch", "100000000", "-o", "x.npz"),
    ("bench", "lstm", "--backend", "numpy", "--sweep", "layers=1,100000000"),
], lambda argv: argv[:3] not in (("plan", "lstm", "--layers"), ("init-inputs", "lstm", "--seq"))))
def test_absurd_sizes_are_refused_at_once(tmp_path, argv):
    start = time.monotonic()
    proc = cellfuse(*argv, cwd=tmp_path, timeout=60)
    assert proc.returncode == 1 and "limit" in proc.stderr, proc.stderr
    assert time.monotonic() - start < 30
    assert list(tmp_path.iterdir()) == []
