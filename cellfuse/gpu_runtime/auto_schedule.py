"""`--schedule auto`: the rung measured fastest on this GPU for a cell and its sizes, measured once and
remembered.

The candidates are the rungs bound by the GPU rather than by launches from Python (`graph`,
`persistent`, `tensor`, and for several layers `wavefront`): which wins depends on the sizes
(`persistent` at small batches, `graph` where the per-step GEMM is large, `wavefront` for some stacks)
and on the GPU. Each is
checked against the reference and timed by the benchmark; the fastest that gave the right answer is
kept in a JSON file in the user's cache folder, keyed by the version of the rungs, the GPU, the cell's
structure and the sizes.
Without a GPU there is nothing to measure, and `auto` is `graph`.

In a 16-bit precision (bf16, fp16) the candidates are measured in it, those that do not run it left
out (the persistent ones where the weights do not fit on chip), and the choice is remembered apart from
float32's: on an H200 the LSTM's fastest 16-bit rung was `persistent` at B=1, `tensor` at B=8 and 64,
`graph` at B=256 (benchmarks/results/h200_2026-11-28_precision_{3544c2b,7c5152e}.json).

The benchmark replays a CUDA graph of each rung, so a rung of launches every step (`graph`, `wavefront`)
costs no host time there. cellfuse.nn's modules put a rung's launches on torch's stream from the host at
every call, where those rungs are bound by the host's launches: they measure the rungs again as they call
them (`runs_as`), and remember that choice apart.

For a bidirectional layer the choice is also whether its two directions run side by side (each rung's
kernels planned for half of the SMs, on two streams) or one after the other (each on all of them): the
rungs are measured both ways (`bench --bidirectional`, and twice one direction's time), and the fastest
of all is kept.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..graph_model import Cell, CellError, Sizes, atomic_write
from .kernel_cache import cache_dir

log = logging.getLogger(__name__)

AUTO = "auto"
CANDIDATES = ("graph", "wavefront", "persistent", "tensor")
WITHOUT_GPU = "graph"
REPEATS = 10  # timed runs of each candidate: the choice, not a published number
# What the candidates are: a choice remembered for rungs that have since changed (version 1's wavefront
# was one cooperative kernel; version 2's runs each layer on streams of its own; version 3's persistent
# forward passes its operands through exchanges, without grid barriers; version 4's large GEMMs run on
# tensor cores, 3xTF32; version 5's persistent steps use exchanges only where they move few bytes per
# barrier, forward and backward; version 6's persistent steps run a kernel with row reductions a block per
# row; version 7's persistent rungs reduce rows that depend on no state before the loop; version 8's
# blocks per row load every operand at once, and pass the state they write to the next step's GEMM
# through an exchange; version 9's tensor rung multiplies with mma.sync and passes operands through
# exchanges; version 10's sigmoid divides without IEEE division's slow path, and its persistent kernels
# load their weights in rows, their biases once; version 11's row sums take fewer shuffles and a
# variance no pass of its own, and its polls of row groups a cheaper address; version 12's persistent
# steps with no GEMM split the rows into groups; version 13's persistent GEMMs of one row multiply in
# registers, and its 3xTF32 GEMMs take cuBLASLt's algorithm measured fastest; version 14's persistent kernels
# copy their layer's states in and out themselves; version 15's 3xTF32 GEMMs may run on wgmma, splitting
# as they load; version 16's forward keeps W's image for wgmma between runs, and its persistent kernels of
# independent blocks start early and mask their elements; version 17's tensor rung multiplies each float32
# product of its step GEMMs as three fp16 ones; version 18's stages K in the widest chunks that fit;
# version 19's persistent kernels that spill registers unroll their loops over K 8 at a time; version 20's
# GEMMs outside the loop multiply each float32 product as three fp16 ones; version 21's forward passes
# keep W's fp16 copies between runs; version 22's 16-bit GEMMs on the CUDA cores take their exchanged
# operand rounded by its writer; version 23's 16-bit GEMMs on tensor cores keep fragments of W in
# registers, version 24's in up to 96 of them; version 25's 16-bit plans add their input biases in the
# step's kernel, and their persistent reverse loops read the gates' gradient in 16 bits; version 26's 16-bit
# GEMMs outside the loop multiply a 16-bit copy of a float32 operand; version 27's float32 GEMMs outside
# the loop on tensor cores leave their biases to the step's kernel) is measured again.
RUNGS_VERSION = 27


@dataclass(frozen=True)
class Choice:
    schedule: str
    why: str  # one sentence for the user
    beside: bool = False  # a bidirectional layer's two directions side by side, else one after the other


def cache_path() -> Path:
    """schedules.json in cellfuse's cache folder (CELLFUSE_CACHE_DIR where it is set), beside the kernels."""
    return cache_dir() / "schedules.json"


def _key(device: str, cell: Cell, sizes: Sizes, bidirectional: bool, precision: str, runs_as: str) -> str:
    s = sizes
    return (f"rungs {RUNGS_VERSION} | {device} | {cell.structure_hash()} | T={s.seq} B={s.batch} I={s.input} "
            f"H={s.hidden} L={s.layers}" + (" | both directions" if bidirectional else "")
            + (f" | {precision}" if precision != "fp32" else "") + (f" | {runs_as}" if runs_as else ""))


def _read(path: Path, quiet: bool = False) -> dict[str, dict]:
    """The cache, or an empty one where the file is missing or not what this module writes; the log names
    a file that is there but unusable, since every choice it held is measured again (and it is rewritten),
    unless `quiet` (named already)."""
    warn = log.debug if quiet else log.warning
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except OSError as e:
        warn("cannot read the remembered schedules in %s (%s); measuring again", path, e.strerror or e)
        return {}
    except ValueError:  # not JSON, or not UTF-8
        data = None
    if not isinstance(data, dict):
        warn("%s is not a JSON object of remembered schedules; measuring again", path)
        return {}
    return data


def candidates(sizes: Sizes) -> list[str]:
    """The rungs to measure: a wavefront of one layer is the graph plan itself."""
    return [s for s in CANDIDATES if s != "wavefront" or sizes.layers > 1]


def bench_times(cell: Cell, sizes: Sizes, bidirectional: bool = False, precision: str = "fp32",
                train: bool = False) -> dict[str, float]:
    """Median ms of each candidate that matched the reference on the GPU (of both directions of the layer
    side by side, where `bidirectional`), in `precision` (where it runs there); where `train`, of its
    forward and backward passes, its gradients checked too."""
    from .bench import BenchConfig, run_benchmark

    result = run_benchmark(cell, BenchConfig(sizes, backend="cuda", schedules=candidates(sizes), baselines=[],
                                             repeats=REPEATS, bidirectional=bidirectional,
                                             precision=precision, train=train))
    return {r.name: r.median_ms for r in result.rows if r.ok and r.median_ms is not None}


Measure = Callable[..., dict[str, float]]  # bench_times's signature
IN_ORDER, BESIDE = "one after the other", "side by side"  # how a bidirectional layer's directions ran


def _both_ways(cell: Cell, sizes: Sizes, measure: Measure, precision: str) -> dict[tuple[str, bool], float]:
    """A bidirectional layer's times by (rung, side by side): side by side measured, one after the other
    twice one direction's."""
    alone = measure(cell, sizes, precision=precision)
    beside = measure(cell, sizes, bidirectional=True, precision=precision)
    return {**{(rung, False): 2 * ms for rung, ms in alone.items()},
            **{(rung, True): ms for rung, ms in beside.items()}}


def _way(bidirectional: bool, beside: bool) -> str:
    """How a choice's directions run, for its sentence: nothing for one direction."""
    return f", the directions {BESIDE if beside else IN_ORDER}" if bidirectional else ""


def choose_schedule(cell: Cell, sizes: Sizes, backend: str, measure: Measure = bench_times,
                    bidirectional: bool = False, precision: str = "fp32", runs_as: str = "") -> Choice:
    """The schedule `auto` stands for on `backend` ("cuda", "numpy" or "auto") in `precision`; where
    `bidirectional`, for a layer of both directions, and whether they run side by side (`Choice.beside`).
    `runs_as` names how the rungs run where the choice is used, where `measure` times them otherwise than
    the benchmark does: each way's choices are remembered apart."""
    if backend == "auto":
        from .bench import available_backends

        backend = "cuda" if "cuda" in available_backends() else "numpy"
    if backend != "cuda":
        return Choice(WITHOUT_GPU, f"auto: '{WITHOUT_GPU}', since there is no GPU to measure the rungs on")
    from .cuda_executor import device_description

    path, key = cache_path(), _key(device_description(), cell, sizes, bidirectional, precision, runs_as)
    entry = _read(path).get(key)
    if isinstance(entry, dict) and entry.get("schedule") in CANDIDATES:
        best, beside = entry["schedule"], bool(entry.get("beside"))
        return Choice(best, f"auto: '{best}'{_way(bidirectional, beside)}, measured fastest for these sizes "
                            f"on this GPU before (remembered in {path})", beside)
    ways = (_both_ways(cell, sizes, measure, precision) if bidirectional
            else {(rung, False): ms for rung, ms in measure(cell, sizes, precision=precision).items()})
    if not ways:
        raise CellError(f"auto: none of {', '.join(candidates(sizes))} ran correctly on this GPU for these "
                        "sizes")
    best, beside = min(ways, key=ways.get)
    # the record's names: the rung, and for both directions how they ran
    times = {rung + (f" {BESIDE if side else IN_ORDER}" if bidirectional else ""): ms
             for (rung, side), ms in ways.items()}
    # (read again: another process, or a thread measuring other sizes, may have remembered choices since)
    cache = _read(path, quiet=True)
    cache[key] = {"schedule": best, "ms": times, **({"beside": beside} if bidirectional else {})}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, (json.dumps(cache, indent=1, sort_keys=True) + "\n").encode())
    except OSError as e:  # the choice stands; it is only measured again next time
        log.warning("could not remember the schedule in %s: %s", path, e)
    measured = ", ".join(f"{name} {ms:.3f} ms" for name, ms in sorted(times.items(), key=lambda t: t[1]))
    return Choice(best, f"auto: '{best}'{_way(bidirectional, beside)}, measured fastest for these sizes on "
                        f"this GPU ({measured})", beside)
