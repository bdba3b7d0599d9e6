"""The passes over a row of a kernel that reduces rows (a layer norm's, a row sum's): which value each
pass computes, which row sums each pass gathers, and the shared memory their partial sums take. The
planner sizes a persistent kernel's shared memory with it; the emitter writes the passes from it."""

from __future__ import annotations

from dataclasses import dataclass

from .adjoint import value_kinds
from .kernel_abi import BLOCK, WARP, Param, kernel_params
from .plan import Const, GradInstr, Instr, KernelLaunch

# A pass over a row is unrolled where each thread holds at most this many of its columns, so that the
# values kept for a later pass stay in registers; a wider row keeps them in (cached) local memory.
MAX_UNROLLED_COLUMNS = 32


def instr_reads(instr: Instr | GradInstr) -> set[str]:
    """The values an instruction's C expression reads."""
    match instr:
        case Instr(args=args):
            return {a for a in args if not isinstance(a, Const)}
        case GradInstr(args=args, op=op, arg=k, dy=dy, y=y):
            rule = op.cuda_grad[k]
            used = {a for i, a in enumerate(args) if not isinstance(a, Const) and f"{{{i}}}" in rule}
            return used | {dy} | ({y} if "{y}" in rule else set())
        case other:
            raise TypeError(f"unknown instruction of a body: {other!r}")


def live(body: tuple[Instr | GradInstr, ...], stored: set[str],
          deviations: dict[str, Deviations] | None = None) -> tuple[Instr | GradInstr, ...]:
    """The instructions of a body that the stored values need, directly or through the body, in order:
    an adjoint recomputes its whole forward body, and a derivative rule may use neither the op's
    arguments nor its result. A row sum taken from deviation sums reads their x and m instead of its
    argument."""
    deviations = deviations or {}
    needed, kept = set(stored), []
    for instr in reversed(body):
        if instr.result in needed:
            kept.append(instr)
            dev = deviations.get(instr.result)
            needed |= {dev.x, dev.m} if dev else instr_reads(instr)
    return tuple(reversed(kept))


def loaded(params: list[Param], body: tuple[Instr | GradInstr, ...]) -> dict[str, int]:
    """The inputs that the stores of a kernel's body need, each value from its first param: the loads of
    `element_body` (an adjoint need not read every input of its kernel: d(a + b) reads neither)."""
    needed = {p.value for p in params if p.output}.union(
        *map(instr_reads, live(body, {p.value for p in params if p.output})))
    loads: dict[str, int] = {}
    for i, p in enumerate(params):
        if not p.output and p.value in needed:
            loads.setdefault(p.value, i)
    return loads


def sums_the_row(instr: Instr | GradInstr) -> bool:
    """A row reduction itself; the derivative of one only spreads its row's gradient over the row."""
    return isinstance(instr, Instr) and instr.op.is_reduction


@dataclass(frozen=True)
class Deviations:
    """A row sum (or mean) of (x - m)^2, m uniform over the row (a variance, say), taken from x's sum and
    its sum of squared deviations from its own mean, which x's pass gathers (`cf_lanes_deviations`):
    q + n (s / n - m)^2 (`cf_deviations`) needs no pass over the row after m's. A layer norm's
    variance then costs no round of row sums of its own (on an H100, the layer-normalised LSTM's step
    takes two rounds instead of four)."""

    x: str
    m: str


def squared_deviation(instr: Instr | GradInstr, made: dict[str, Instr | GradInstr],
                       uniform: set[str]) -> Deviations | None:
    """Of a row sum or mean of square(x - m) (or of (x - m) * (x - m), or of m - x), m uniform over the
    row and x not: its x and m."""
    if not (isinstance(instr, Instr) and instr.op.is_reduction):
        return None
    sq = made.get(instr.args[0]) if isinstance(instr.args[0], str) else None
    if not isinstance(sq, Instr) or not (sq.op.name == "square"
                                         or (sq.op.name == "mul" and sq.args[0] == sq.args[1])):
        return None
    sub = made.get(sq.args[0]) if isinstance(sq.args[0], str) else None
    if not (isinstance(sub, Instr) and sub.op.name == "sub"):
        return None
    x, m = sub.args
    if isinstance(x, str) and x in uniform:
        x, m = m, x
    if not (isinstance(x, str) and isinstance(m, str)) or x in uniform or m not in uniform:
        return None
    return Deviations(x, m)


@dataclass(frozen=True)
class RowSums:
    """How a reducing kernel's body is cut into passes over the row: the pass that computes each value
    (a row sum's result is there from the pass after the one that computes its argument, anything else
    from the pass of the latest value it reads), and the row sums taken from deviation sums instead
    (see `Deviations`: where every thread holds as many of the row's columns, which the pairwise update
    assumes, in a pass unrolled, and x comes a pass before m)."""

    body: tuple[Instr | GradInstr, ...]  # the instructions the stored values need
    uniform: set[str]  # the values uniform over the row: one per row, every thread computes it alike
    level: dict[str, int]
    deviations: dict[str, Deviations]  # by the result of the row sum each gives

    @property
    def passes(self) -> int:
        return max((self.level[i.result] for i in self.body), default=0) + 1

    def sums(self, step: int) -> tuple[list[Instr | GradInstr], list[Instr | GradInstr], list[str]]:
        """The row sums that pass `step` gathers: the plain ones, those of them that need a sum of their
        own, and the values x whose deviation sums it gathers (a plain sum of such an x comes with
        them)."""
        stats = list(dict.fromkeys(d.x for d in self.deviations.values() if self.level.get(d.x, 0) == step))
        plain = [i for i in self.body if sums_the_row(i) and i.result not in self.deviations
                 and self.level[i.result] == step + 1]
        return plain, [i for i in plain if i.args[0] not in stats], stats

    @property
    def floats(self) -> int:
        """The static shared memory of the kernel, in floats: its warps' partial row sums (two for
        deviation sums), for the pass that has the most."""
        most = 0
        for step in range(self.passes):
            _, own, stats = self.sums(step)
            most = max(most, len(own) + 2 * len(stats))
        return most * (BLOCK // WARP)


def row_sums(launch: KernelLaunch) -> RowSums:
    """The passes over the row of a kernel whose body reduces rows."""
    params = kernel_params(launch)
    kinds = value_kinds(launch.body, {p.value: p.access.kind for p in params if not p.output})
    uniform = {v for v, kind in kinds.items() if kind in ("col", "scalar")}
    even = launch.width % BLOCK == 0 and launch.width // BLOCK <= MAX_UNROLLED_COLUMNS
    level: dict[str, int] = {}
    deviations: dict[str, Deviations] = {}
    made: dict[str, Instr | GradInstr] = {}
    for instr in launch.body:
        made[instr.result] = instr
        dev = squared_deviation(instr, made, uniform) if even else None
        if dev and level.get(dev.x, 0) < level.get(dev.m, 0):
            deviations[instr.result], level[instr.result] = dev, level[dev.m]
            continue
        first = max((level.get(a, 0) for a in instr_reads(instr)), default=0)
        level[instr.result] = first + sums_the_row(instr)
    stored = {p.value for p in params if p.output}
    return RowSums(live(launch.body, stored, deviations), uniform, level, deviations)
