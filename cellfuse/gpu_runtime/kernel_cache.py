"""Compiled CUDA kernels, kept on disk so that a run with kernels compiled before starts without nvcc's
seconds per module.

`compiled(source, arch)` runs nvcc once per source, architecture, options and nvcc version: its result
(the cubin, and which kernels ptxas says spill registers) is kept in memory for the process and in a file
of the cache folder, `kernels/<sha256>.cubin`, that later processes read. `fitted(kernels, arch)` compiles
a plan's kernels so, and a persistent kernel that spills again written to keep fewer values in registers
(see `fitted`). The cache folder is the user's (platformdirs' `user_cache_dir("cellfuse")`), or the one
the environment variable CELLFUSE_CACHE_DIR names; `--schedule auto` keeps its choices there too.

A cache file is a header (MAGIC, the sha256 of its payload, the payload's length) and the payload: the
length of the spill report, the report (JSON), the cubin. A file that does not
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
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType

import platformdirs

from ..codegen.kernel_set import KernelSet
from ..codegen.tiling import FRAGMENT_REGISTERS
from ..graph_model import CellError, atomic_write

log = logging.getLogger(__name__)

ENV_VAR = "CELLFUSE_CACHE_DIR"
# Part of every file's name: a change to how cubins are compiled or stored leaves the old files unread.
FORMAT_VERSION = 2
MAGIC = b"CFCUBIN2"
_HEADER = struct.Struct(f"<{len(MAGIC)}s32sQ")  # magic, sha256 of the payload, its length in bytes
_REPORT_LENGTH = struct.Struct("<I")
# How many iterations of a loop over K a persistent kernel that spills unrolls at a time instead (see
# `fitted`).
SPILLING_K_UNROLL = 8


@dataclass(frozen=True)
class Compiled:
    cubin: bytes
    spills: Mapping[str, int]  # each kernel (or device function) that spills -> its bytes of spill stores

    def __post_init__(self):  # (kept in memory for every caller: read-only)
        object.__setattr__(self, "spills", MappingProxyType(dict(self.spills)))


def cache_dir() -> Path:
    """The folder of cellfuse's caches: CELLFUSE_CACHE_DIR where it is set, else the user's cache folder."""
    return Path(os.environ.get(ENV_VAR) or platformdirs.user_cache_dir("cellfuse"))


def kernels_dir() -> Path:
    return cache_dir() / "kernels"


def compiled(source: str, arch: str, options: tuple[str, ...] = ("-O3",)) -> Compiled:
    """CUDA C++ `source` (which declares its kernels `extern "C"` itself) compiled for `arch`, such as
    "sm_90" or "sm_90a": from this process's memory, else from the cache folder, else compiled by nvcc
    and kept in both. A CellError where nvcc cannot be run or reports errors."""
    return _compiled(source, arch, options)  # (the options always given: one key in memory per module)


@lru_cache(maxsize=64)
def _compiled(source: str, arch: str, options: tuple[str, ...]) -> Compiled:
    path = kernels_dir() / f"{_key(source, arch, options)}.cubin"
    cached = _read(path)
    if cached is not None:
        return cached
    fresh = _compile(source, arch, options)
    _write(path, fresh)
    return fresh


def cubin(source: str, arch: str, options: tuple[str, ...] = ("-O3",)) -> bytes:
    """The cubin of `compiled`."""
    return compiled(source, arch, options).cubin


@dataclass(frozen=True)
class Rewrite:
    """How a persistent kernel that spills registers is written again (see KernelSet.rewritten)."""

    k_unroll: int
    fragments: int  # registers a thread may give W's fragments (codegen.persistent_cuda.gemm_mma.fragments)

    def text(self, kept_fragments: bool) -> str:
        """What the rewrite did to a kernel (`kept_fragments`: one that kept fragments of W in registers)."""
        done = [f"its loops over K unrolled {self.k_unroll} at a time"] if self.k_unroll else []
        if kept_fragments and not self.fragments:
            done.append("W's fragments left in shared memory")
        elif kept_fragments and self.fragments < FRAGMENT_REGISTERS:
            done.append(f"W's fragments in at most {self.fragments} registers a thread")
        return " and ".join(done)


# What a persistent kernel that spills is written as instead, in turn, while it still spills: with fewer
# registers for the fragments of W that its GEMMs on tensor cores keep in registers (32 fewer each time,
# down to none: a budget that spills at one batch may fit at another, B=64 against B=256), then with its
# loops over K unrolled SPILLING_K_UNROLL iterations at a time as well. A rewrite that leaves every
# spilling kernel as it was is not compiled.
REWRITES = (*(Rewrite(0, r) for r in range(FRAGMENT_REGISTERS - 32, -1, -32)), Rewrite(SPILLING_K_UNROLL, 0))


def fitted(kernels: KernelSet, arch: str) -> tuple[KernelSet, bytes]:
    """A plan's kernels and their cubin, as `_fit` makes them."""
    chosen, cubin_, _ = _fit(kernels, arch)
    return chosen, cubin_


def _fit(kernels: KernelSet, arch: str) -> tuple[KernelSet, bytes, dict[str, tuple[int, str]]]:
    """A plan's kernels and their cubin: as written, but a persistent kernel that spills registers (the
    fragments of W its GEMMs keep in registers, or its loops over K unrolled whole, keeping more values
    live than a thread has registers for) written again as REWRITES say, in turn, each kept where it
    spills fewer bytes than the kernel as kept so far; a rewrite that changes no spilling kernel is not
    compiled. Where nothing spills, unrolling less was measured slower (see
    codegen.persistent_cuda.gemm_fma.k_loop_unroll), and the fragments faster (gemm_mma.fragments), so
    both are only the answer to a spill. Also, per kernel written again, the bytes it spilled as written
    and how it was written again (`Rewrite.text`)."""
    first = compiled(kernels.module_source(), arch)
    spills = {name: first.spills.get(name, 0) for name in kernels.persistent_launches()}
    spilling = [name for name, spilled in spills.items() if spilled]
    if not spilling:
        return kernels, first.cubin, {}
    kept, last, done = dict(kernels.sources), None, {}
    plain = kernels.rewritten(spilling, fragments=0).sources  # (which kernels keep fragments)
    for rewrite in REWRITES:
        left = [name for name in spilling if spills[name]]
        rewritten = kernels.rewritten(left, rewrite.k_unroll, rewrite.fragments).sources
        tried = [name for name in left if rewritten[name] != kept[name]]
        if not tried:
            continue
        # on top of the kernels as kept so far, so that the last candidate may be the module chosen
        candidate = replace(kernels, sources={**kept, **{name: rewritten[name] for name in tried}},
                            name_of=dict(kernels.name_of), by_body=dict(kernels.by_body))
        how = {name: rewrite.text(plain[name] != kernels.sources[name]) for name in tried}
        try:
            result = compiled(candidate.module_source(), arch)
        except CellError as e:  # (the kernels as kept compiled: run them)
            log.warning("%s spill registers; written again (%s), they do not compile: %s", ", ".join(tried),
                        "; ".join(how.values()), e)
            continue
        last = candidate.module_source(), result
        for name in tried:
            log.info("%s spills %d bytes; written again (%s), %d", name, spills[name], how[name],
                     result.spills.get(name, 0))
            if result.spills.get(name, 0) < spills[name]:
                spills[name], kept[name] = result.spills.get(name, 0), rewritten[name]
                done[name] = first.spills[name], how[name]
    if not done:
        return kernels, first.cubin, {}
    chosen = replace(kernels, sources=kept, name_of=dict(kernels.name_of), by_body=dict(kernels.by_body))
    source = chosen.module_source()
    return chosen, last[1].cubin if last and last[0] == source else cubin(source, arch), done


# The architecture an exported .cu is built for (the command `cellfuse export` prints says -arch=sm_90).
EXPORT_ARCH = "sm_90"


class ExportFit:
    """`fitted` for the kernels of an exported .cu (codegen.Fit): compiled for EXPORT_ARCH, so that it
    holds the kernels CellFuse's own runs compile. `rewritten`: each kernel written again -> the bytes it
    spilled as planned and how it was written (`Rewrite.text`); `failed`: why nvcc could not check them
    (the kernels are then written as planned), or None."""

    def __init__(self, arch: str = EXPORT_ARCH):
        self.arch = arch
        self.rewritten: dict[str, tuple[int, str]] = {}
        self.failed: str | None = None

    def __call__(self, kernels: KernelSet) -> KernelSet:
        if not kernels.persistent_launches():  # (nothing to rewrite: no compile)
            return kernels
        try:
            chosen, _, done = _fit(kernels, self.arch)
        except CellError as e:
            self.failed = str(e)
            return kernels
        self.rewritten.update(done)
        return chosen


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


def _compile(source: str, arch: str, options: tuple[str, ...]) -> Compiled:
    with tempfile.TemporaryDirectory(prefix="cellfuse-nvcc-") as tmp:
        cu, out = Path(tmp) / "kernel.cu", Path(tmp) / "kernel.cubin"
        cu.write_text(source, encoding="utf-8")
        proc = _run_nvcc(["-cubin", f"-arch={arch}", *options, "-Xptxas", "-v", "-o", str(out), str(cu)])
        if proc.returncode != 0:
            raise CellError("nvcc could not compile the generated kernels:\n"
                            + compile_error_lines(proc.stderr or proc.stdout, source))
        return Compiled(out.read_bytes(), spills(proc.stderr + proc.stdout))


# ptxas -v's report of a function: its name, then its stack frame and spill stores
_PROPERTIES = re.compile(r"Function properties for (\w+)\s*\n\s*\d+ bytes stack frame, "
                         r"(\d+) bytes spill stores")


def spills(report: str) -> dict[str, int]:
    """Each function of ptxas -v's report that spills registers -> its bytes of spill stores."""
    return {m[1]: int(m[2]) for m in _PROPERTIES.finditer(report) if int(m[2])}


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


def _read(path: Path) -> Compiled | None:
    """What is kept in `path`; None where there is none yet, or where the file does not check out (which
    the log says, and which is removed so that the fresh compile takes its place)."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):  # not compiled yet, or no folder to hold it
        return None
    except OSError as e:
        return _discard(path, f"cannot be read ({e.strerror or e})")
    kept, fault = unpack(data)
    return kept if fault is None else _discard(path, fault)


def unpack(data: bytes) -> tuple[Compiled | None, str | None]:
    """(what is kept, None) of a cache file's bytes, or (None, what is wrong with them)."""
    if len(data) < _HEADER.size:
        return None, f"is {len(data)} bytes long, shorter than its header"
    magic, digest, length = _HEADER.unpack_from(data)
    payload = data[_HEADER.size:]
    if magic != MAGIC:
        return None, "does not start as a cached kernel does"
    if length != len(payload):
        return None, f"holds {len(payload)} bytes of a kept kernel of {length}"
    if hashlib.sha256(payload).digest() != digest:
        return None, "holds a kept kernel whose sha256 is not the one in its header"
    try:
        (n,) = _REPORT_LENGTH.unpack_from(payload)
        report = json.loads(payload[_REPORT_LENGTH.size:_REPORT_LENGTH.size + n])
        if not isinstance(report, dict) or _REPORT_LENGTH.size + n > len(payload):
            raise ValueError(report)
    except (struct.error, ValueError):
        return None, "holds no spill report that can be read"
    return Compiled(payload[_REPORT_LENGTH.size + n:], report), None


def pack(kept: Compiled) -> bytes:
    report = json.dumps(dict(kept.spills), sort_keys=True).encode()
    payload = _REPORT_LENGTH.pack(len(report)) + report + kept.cubin
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


def _write(path: Path, payload: Compiled) -> None:
    """Keeps a cubin for later processes; where the folder cannot be written, the log says so and the
    cubin is used all the same."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, pack(payload))
    except OSError as e:  # atomic_write's CellFileError is an OSError too
        log.warning("could not keep the compiled kernel in %s: %s", path, e)
