"""A module's kept inference call made in C++ (resources/host/quick_lane.cpp): a `Lane` checks that a call
is like the one it was made from, allocates the call's memory, and replays the captured run of the
runner's forward program, in a few microseconds where the same in Python takes tens
(docs/results/2026-11-29-cellrnn-lane.md). Any call it cannot make exactly as CudaRunner would, it
answers None, and quick_call's Python makes it. `Rows` pads and packs a PackedSequence's rows for the
calls a lane does not make (nn.packed_sequences), and zeroes the padding of rows of lengths of their own
and reverses them in time (nn.stacks), likewise.

The C++ is built at first use by nvcc against the headers of the torch the process runs, kept in the
kernel cache folder (a build per torch version and place), and loaded as an extension module. Where it
cannot be built or loaded (no C++ compiler, no Python headers), a warning says why once, and every kept
call runs in Python. CELLFUSE_QUICK_LANE=0 turns lanes off.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import sysconfig
from collections.abc import Sequence
from functools import lru_cache
from importlib import resources
from pathlib import Path

import torch

from ..codegen.kernel_abi import MAX_GRID
from ..gpu_runtime.driver import entry_point
from ..gpu_runtime.kernel_cache import shared_library
from ..gpu_runtime.stream_program import CHANGES
from ..graph_model import CellError

log = logging.getLogger(__name__)

ENABLED = os.environ.get("CELLFUSE_QUICK_LANE", "1") not in ("", "0")
NAME = "cf_quick_lane"  # the extension module's name (its PyInit_ function's)


def build_options() -> tuple[str, ...]:
    """nvcc's options for the lane's C++: torch's and Python's headers, torch's libraries (found again at
    run time where they are), the C++ ABI torch was built with, and torch's version (for the cache's
    key: a build is for the torch it was built against)."""
    root = Path(torch.__file__).parent
    include, lib = root / "include", root / "lib"
    return ("-std=c++20", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}",
            f"-DCF_TORCH_VERSION=\"{torch.__version__}\"",
            "-isystem", str(include), "-isystem", str(include / "torch" / "csrc" / "api" / "include"),
            "-isystem", sysconfig.get_path("include"),
            "-L", str(lib), "-Xlinker", f"-rpath,{lib}", "-lc10", "-ltorch_cpu", "-ltorch_python")


@lru_cache(maxsize=1)
def module():
    """The built extension module, or None where lanes are off or it cannot be built or loaded."""
    if not ENABLED:
        return None
    source = (resources.files("cellfuse.resources.host") / "quick_lane.cpp").read_text("utf-8")
    try:
        options = build_options()
        try:
            return _load(shared_library(source, "quick_lane", cxx_options=options))
        except ImportError as e:  # a kept file cut short or overwritten: built again
            log.warning("the kept call's C++ lane does not load (%s); building it again", e)
            return _load(shared_library(source, "quick_lane", fresh=True, cxx_options=options))
    except (CellError, ImportError, OSError) as e:
        log.warning("the kept call's C++ lane could not be built (%s); kept calls run in Python", e)
        return None


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(NAME, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not an extension module")
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


@lru_cache(maxsize=1)
def entry_points() -> tuple[int, int, int, int]:
    """The driver's cuGraphLaunch, cuStreamIsCapturing, cuCtxGetCurrent and cuLaunchKernel, from libcuda."""
    return tuple(entry_point(name)
                 for name in ("cuGraphLaunch", "cuStreamIsCapturing", "cuCtxGetCurrent", "cuLaunchKernel"))


def current_context() -> int:
    """The calling thread's current driver context (0 where none is)."""
    context = ctypes.c_void_p()
    get = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p))(entry_points()[2])
    if get(ctypes.byref(context)):
        raise CellError("the driver could not say which context is current")
    return context.value or 0


def make(x: torch.Tensor, params: Sequence[torch.Tensor], zeros: Sequence[torch.Tensor], batch_first: bool,
         sizes: tuple[int, int, int, int], block_elements: int, outputs_end: int, finals_at: Sequence[int],
         packed: int, stream: int, locks: tuple, program, driver: tuple[int, int, int, int] | None = None,
         context: int | None = None, rows: tuple[int, int, int] | None = None):
    """A lane for calls like one just made of x (as the module was given it, or as torch.autocast cast it:
    the kept call casts such calls' x before the lane sees it), these parameters (packed at `packed`, as
    they are now) and the kept zeros (in the type the plan stores the states in), on `stream`, in one
    piece of `block_elements` elements of the zeros' type (y's sequence from its start, each final state
    at `finals_at`, the scratch from `outputs_end`; y and the final states given back in x's type),
    `sizes` (T, B, H, layers); `locks`: the runner's and the program's, held around each run; `program`:
    whose replays it counts; `rows`: for the calls of a PackedSequence too (x padded from one, its
    steps-left state the last of `zeros`), cf_unpack_rows's function, the steps its arguments hold and
    its blocks (codegen.packed_rows). `driver` and `context` stand in for the driver's entry points and
    the current context (tests). Only where `module()` is not None."""
    return module().Lane(x, list(params), list(zeros), batch_first, sizes, block_elements, outputs_end,
                      list(finals_at), packed, stream, current_context() if context is None else context,
                      CHANGES, locks, program, driver or entry_points(), rows)


def rows(kernels, device: int, itemsize: int, driver: tuple[int, int] | None = None,
         context: int | None = None):
    """`kernels` (gpu_runtime.packed_rows.PackedRows, loaded into the current context of CUDA device
    `device`) for elements of `itemsize` bytes launched in C++ (`Rows`: padded(data, batch_sizes, steps,
    hidden, state_layers, stream), packed(y, batch_sizes, stream), zeroed(x, lengths, hidden,
    state_layers, stream) and reversed(x, lengths, stream), each None for what Python must move
    instead), or None where the C++ is not built. `driver` (cuCtxGetCurrent and cuLaunchKernel) and
    `context` stand in for the driver's and the current context (tests; -1 for `device`: CPU tensors)."""
    built = module()
    if built is None:
        return None
    unpack, pack, zero, reverse = kernels.functions
    return built.Rows(device, itemsize, unpack, pack, zero, reverse, kernels.capacity, MAX_GRID,
                      current_context() if context is None else context, driver or entry_points()[2:])
