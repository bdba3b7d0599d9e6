"""Compiled CUDA kernels, kept on disk so that a run with kernels compiled before starts without nvcc's
seconds per module.

`cubin(source, arch)` runs nvcc once per source, architecture, options and nvcc version: its result is
kept in memory for the process and in a file of the cache folder, `kernels/<sha256>.cubin`, that later
processes read. The cache folder is the user's (platformdirs' `user_cache_dir("cellfuse")`), or the one
the environment variable CELLFUSE_CACHE_DIR names; `--schedule auto` keeps its choices there too.

A cache file is a header (MAGIC, the sha256 of the cubin, its length) and the cubin. A file that does not
check out (cut short, overwritten, not a file) is logged, compiled again and replaced; a folder that
cannot be written is logged and the cubin is still returned. Files are written beside their place and
renamed into it, so that processes compiling the same kernel at once leave one whole file.

No PyCUDA, torch or Qt: nvcc runs as a subprocess, so that kernels compile (and are cached) on a machine
without a GPU too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import struct
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import platformdirs

from ..graph_model import CellError, atomic_write

log = logging.getLogger(__name__)

ENV_VAR = "CELLFUSE_CACHE_DIR"
# Part of every file's name: a change to how cubins are compiled or stored leaves the old files unread.
FORMAT_VERSION = 1
MAGIC = b"CFCUBIN1"
_HEADER = struct.Struct(f"<{len(MAGIC)}s32sQ")  # magic, sha256 of the cubin, the cubin's length in bytes


def cache_dir() -> Path:
    """The folder of cellfuse's caches: CELLFUSE_CACHE_DIR where it is set, else the user's cache folder."""
    return Path(os.environ.get(ENV_VAR) or platformdirs.user_cache_dir("cellfuse"))


def kernels_dir() -> Path:
    return cache_dir() / "kernels"


@lru_cache(maxsize=64)
def cubin(source: str, arch: str, options: tuple[str, ...] = ("-O3",)) -> bytes:
    """The cubin of CUDA C++ `source` (which declares its kernels `extern "C"` itself) for `arch`, such as
    "sm_90" or "sm_90a": from this process's memory, else from the cache folder, else compiled by nvcc
    and kept in both. A CellError where nvcc cannot be run or reports errors."""
    path = kernels_dir() / f"{_key(source, arch, options)}.cubin"
    cached = _read(path)
    if cached is not None:
        return cached
    compiled = _compile(source, arch, options)
    _write(path, compiled)
    return compiled


def shared_library(source: str, name: str, fresh: bool = False, cxx_options: tuple[str, ...] | None = None
                   ) -> Path:
    """The file of a shared library built by nvcc from C `source` (host code, such as the launch list's),
    or from C++ `source` with `cxx_options` (the includes, definitions and libraries it needs), kept in
    the cache folder's `host/` as `<name>-<sha256>.so`; built where it is not there yet, or again where
    `fresh` (the caller found the kept one damaged). A CellError where nvcc reports errors; built in a
    temporary folder where the cache cannot be written."""
    options = ((*_LIBRARY_OPTIONS, "-x", "c") if cxx_options is None
               else (*_LIBRARY_OPTIONS, "-x", "c++", *cxx_options))
    file = f"{name}.c" if cxx_options is None else f"{name}.cpp"
    key = _key(source, "host", options)
    path = cache_dir() / "host" / f"{name}-{key}.so"
    if path.is_file() and not fresh:
        return path
    with tempfile.TemporaryDirectory(prefix="cellfuse-host-") as tmp:
        c, out = Path(tmp) / file, Path(tmp) / f"{name}.so"
        c.write_text(source, encoding="utf-8")
        proc = _run_nvcc([*options, "-o", str(out), str(c)])
        if proc.returncode != 0:
            raise CellError(f"nvcc could not build {file}:\n"
                            + compile_error_lines(proc.stderr or proc.stdout, source))
        built = out.read_bytes()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, built)
    except OSError as e:
        log.warning("could not keep the built library in %s: %s", path, e)
        with tempfile.NamedTemporaryFile(prefix=f"cellfuse-{name}-", suffix=".so", delete=False) as f:
            f.write(built)  # for this process (the system's temporary folder clears it)
        return Path(f.name)
    return path


# a host shared library that links nothing of CUDA's (the launch list is given the entry points it calls),
# then its language
_LIBRARY_OPTIONS = ("-shared", "-O2", "-Xcompiler", "-fPIC", "-cudart", "none")


def _key(source: str, arch: str, options: tuple[str, ...]) -> str:
    """The sha256 of all that the cubin depends on: another nvcc may compile the same source otherwise."""
    what = [FORMAT_VERSION, nvcc_version(), arch, list(options), source]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()


@lru_cache(maxsize=1)
def nvcc_version() -> str:
    """What `nvcc --version` prints, read once per process."""
    return _run_nvcc(["--version"]).stdout.strip()


def _compile(source: str, arch: str, options: tuple[str, ...]) -> bytes:
    with tempfile.TemporaryDirectory(prefix="cellfuse-nvcc-") as tmp:
        cu, out = Path(tmp) / "kernel.cu", Path(tmp) / "kernel.cubin"
        cu.write_text(source, encoding="utf-8")
        proc = _run_nvcc(["-cubin", f"-arch={arch}", *options, "-o", str(out), str(cu)])
        if proc.returncode != 0:
            raise CellError("nvcc could not compile the generated kernels:\n"
                            + compile_error_lines(proc.stderr or proc.stdout, source))
        return out.read_bytes()


def _run_nvcc(args: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["nvcc", *args], capture_output=True, text=True, errors="replace")
    except OSError as e:
        raise CellError(f"nvcc could not be run ({e}); is the CUDA toolkit on the PATH?") from None


def compile_error_lines(stderr: str, source: str) -> str:
    """nvcc's errors, each followed by the generated line it points at; nvcc's whole output if it names
    no line."""
    lines = source.split("\n")
    found = []
    for m in re.finditer(r"\((\d+)\): (?:catastrophic )?error: (.*)", stderr):
        number = int(m.group(1))
        text = lines[number - 1].strip() if 0 < number <= len(lines) else "(beyond the end of the source)"
        found.append(f"line {number}: {m.group(2).strip()}\n    {text}")
    return "\n".join(found) if found else stderr.strip()


def _read(path: Path) -> bytes | None:
    """The cubin kept in `path`; None where there is none yet, or where the file does not check out (which
    the log says, and which is removed so that the fresh compile takes its place)."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):  # not compiled yet, or no folder to hold it
        return None
    except OSError as e:
        return _discard(path, f"cannot be read ({e.strerror or e})")
    payload, fault = unpack(data)
    return payload if fault is None else _discard(path, fault)


def unpack(data: bytes) -> tuple[bytes | None, str | None]:
    """(the cubin, None) of a cache file's bytes, or (None, what is wrong with them)."""
    if len(data) < _HEADER.size:
        return None, f"is {len(data)} bytes long, shorter than its header"
    magic, digest, length = _HEADER.unpack_from(data)
    payload = data[_HEADER.size:]
    if magic != MAGIC:
        return None, "does not start as a cached kernel does"
    if length != len(payload):
        return None, f"holds {len(payload)} bytes of a cubin of {length}"
    if hashlib.sha256(payload).digest() != digest:
        return None, "holds a cubin whose sha256 is not the one in its header"
    return payload, None


def pack(payload: bytes) -> bytes:
    return _HEADER.pack(MAGIC, hashlib.sha256(payload).digest(), len(payload)) + payload


def _discard(path: Path, fault: str) -> None:
    """Logs a bad cache file and removes it (an empty folder in its place too): atomic_write would keep a
    bad file's permissions and cannot replace a folder."""
    log.warning("the cached kernel %s %s; compiling it again", path, fault)
    try:
        if path.is_dir():
            os.rmdir(path)
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass  # then the write that follows says why it cannot replace it


def _write(path: Path, payload: bytes) -> None:
    """Keeps a cubin for later processes; where the folder cannot be written, the log says so and the
    cubin is used all the same."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, pack(payload))
    except OSError as e:  # atomic_write's CellFileError is an OSError too
        log.warning("could not keep the compiled kernel in %s: %s", path, e)
