"""What every part of a persistent kernel's text reads: the launch, the kernel's pointer arguments and
which of them it writes, its GEMMs and their outputs on chip, its exchanges, how a thread walks its
elements; and the writer all parts write to."""

from __future__ import annotations

from collections.abc import Iterator

from ..c_text import CWriter
from ..dtypes import FLOAT32
from ..persistent import writes
from ..plan import Access, GemmLaunch, KernelLaunch, PersistentItem, PersistentLaunch
from ..tiling import FRAGMENT_REGISTERS


def persistent_buffers(launch: PersistentLaunch) -> list[str]:
    """The buffers the kernel reads or writes, in the order of its pointer arguments (after seq, batch)."""
    names: dict[str, None] = {}
    for item in launch.items:
        match item.launch:
            case GemmLaunch() as g:
                names.update(dict.fromkeys([g.a.buffer, g.w, g.c.buffer, *([g.bias] if g.bias else [])]))
            case KernelLaunch() as k:
                names.update(dict.fromkeys(acc.buffer for _, acc in (*k.inputs, *k.outputs)))
            case other:
                raise TypeError(f"unknown launch {other!r}")
    for state in launch.states:
        names.update(dict.fromkeys([state.initial.buffer, state.read.buffer, state.final.buffer]))
    return list(names)


def _accesses(launch: PersistentLaunch) -> Iterator[Access]:
    for item in launch.items:
        match item.launch:
            case GemmLaunch() as g:
                yield from (g.a, g.c)
            case KernelLaunch() as k:
                yield from (acc for _, acc in (*k.inputs, *k.outputs))
    for state in launch.states:
        yield from (state.initial, state.read, state.final)


class Kernel:
    """One persistent kernel being written: `var` names its pointer arguments (`b0`, `b1`, ...), `written`
    the buffers it writes; `w` the writer of its text; `k_unroll`: how many iterations of a GEMM's loop
    over K are unrolled at a time where it has more (0: every loop of up to FULL_UNROLL unrolled whole;
    see gemm_fma.k_loop_unroll); `fragments`: how many registers a thread may give the fragments of W
    that GEMMs on tensor cores keep in registers (see gemm_mma.fragments; 0: none)."""

    def __init__(self, launch: PersistentLaunch, name: str, k_unroll: int = 0,
                 fragments: int = FRAGMENT_REGISTERS):
        self.launch, self.name, self.k_unroll, self.fragments = launch, name, k_unroll, fragments
        self.buffers = persistent_buffers(launch)
        self.var = {b: f"b{i}" for i, b in enumerate(self.buffers)}
        # what each buffer's elements are stored in: as its accesses say; a GEMM's weights and bias, which
        # no access names, are float32, as the GEMMs read them (see staging.pointers)
        self.dtype = dict.fromkeys(self.buffers, FLOAT32)
        self.dtype.update((acc.buffer, acc.dtype) for acc in _accesses(launch))
        self.written = set().union(*(writes(item.launch) for item in launch.items),
                                   (state.final.buffer for state in launch.states))
        self.gemms = [(i, item) for i, item in enumerate(launch.items) if isinstance(item.launch, GemmLaunch)]
        # GEMM outputs in shared memory: buffer -> (the GEMM's index, its item)
        self.on_chip = {item.launch.c.buffer: (i, item) for i, item in self.gemms if item.output_on_chip}
        # what kernels that run a block per row write: other blocks read it, after a barrier, through L2
        self.written_by_rows = set().union(*(writes(item.launch) for item in launch.items if item.by_rows))
        # exchanged operands: buffer -> (its index, its Exchange)
        self.exchange = {ex.buffer: (n, ex) for n, ex in enumerate(launch.exchange)}
        # In a launch whose steps' inputs are loaded ahead, a thread's elements are not skipped by branches
        # but masked (see `elementwise.element_loop`); set by the skeleton.
        self.masked = False
        self.w = CWriter()

    def elements(self, item: PersistentItem) -> tuple[int, str, str]:
        """Of an elementwise launch: the most elements a thread takes, the element count, and how element e
        maps to its row r and column j."""
        k: KernelLaunch = item.launch
        threads = self.launch.threads
        if item.whole:  # the same [N] and scalar values every step, computed by every block
            return (-(-k.rows * k.width // threads), str(k.rows * k.width),
                    f"const int r = e / {k.width}, j = e - r * {k.width};")
        unit = self.launch.unit(k.width)
        return (-(-self.launch.group_rows * unit // threads), f"rows * {unit}",
                f"const int r = row0 + e / {unit}, j = cb * {unit} + e % {unit};")
