"""The benchmark: every schedule of a cell and every available baseline, each checked against the
reference interpreter before it is timed. The command line and the editor both call `run_benchmark`."""

from __future__ import annotations

import csv
import io
import logging
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime

import numpy as np

from .. import __version__
from ..codegen import SCHEDULES, make_plan
from ..graph_model import Cell, CellError, Forward, Sizes, init_params, run_reference

log = logging.getLogger(__name__)

TOLERANCE = 1e-4  # relative error allowed in float32
BASELINES = ("numpy reference", "pytorch eager", "torch.compile", "cudnn")

Progress = Callable[[int, int, str], None]


class BenchCancelled(Exception):
    pass


@dataclass
class BenchConfig:
    sizes: Sizes
    backend: str = "auto"  # "numpy", "cuda", or "auto": cuda where it can run, else numpy
    schedules: list[str] = field(default_factory=lambda: list(SCHEDULES))
    baselines: list[str] = field(default_factory=lambda: list(BASELINES))
    repeats: int = 20
    warmup: int = 3
    seed: int = 0


@dataclass
class BenchRow:
    name: str
    kind: str  # "schedule" or "baseline"
    ok: bool
    median_ms: float | None = None
    min_ms: float | None = None
    max_ms: float | None = None
    rel_error: float | None = None
    compile_s: float | None = None
    launches_per_step: int | None = None
    note: str = ""


@dataclass
class BenchResult:
    cell: str
    cell_hash: str
    sizes: Sizes
    backend: str
    device: str
    date: str
    versions: dict[str, str]
    rows: list[BenchRow] = field(default_factory=list)
    cancelled: bool = False

    def row(self, name: str) -> BenchRow | None:
        return next((r for r in self.rows if r.name == name), None)

    def to_json(self) -> dict:
        return {"cell": self.cell, "cell_hash": self.cell_hash, "sizes": asdict(self.sizes),
                "backend": self.backend, "device": self.device, "date": self.date, "versions": self.versions,
                "cancelled": self.cancelled, "results": [asdict(r) for r in self.rows]}

    def to_csv(self) -> str:
        buf = io.StringIO()
        names = list(asdict(self.rows[0]) if self.rows else BenchRow("", "", False).__dict__)
        writer = csv.DictWriter(buf, fieldnames=["cell", "device", *names])
        writer.writeheader()
        for r in self.rows:
            writer.writerow({"cell": self.cell, "device": self.device, **asdict(r)})
        return buf.getvalue()


@dataclass
class SweepResult:
    param: str
    values: list[int]
    results: list[BenchResult]

    def to_json(self) -> dict:
        return {"param": self.param, "values": self.values, "results": [r.to_json() for r in self.results]}


def available_backends() -> list[str]:
    """"numpy" always; "cuda" where PyCUDA, nvmath-python and a GPU are present."""
    from .cuda_executor import GpuUnavailable, gpu_modules

    try:
        gpu_modules()
    except GpuUnavailable:
        return ["numpy"]
    return ["numpy", "cuda"]


def _rel_error(result: Forward, ref: Forward) -> float:
    """The largest absolute error over y and the final states, relative to the largest value."""
    pairs = [(result.y, ref.y)] + [(result.final[s], v) for s, v in ref.final.items() if s in result.final]
    worst = 0.0
    for got, want in pairs:
        if not np.all(np.isfinite(got)):
            return float("inf")
        scale = max(float(np.max(np.abs(want))), 1e-30)
        worst = max(worst, float(np.max(np.abs(got.astype(np.float64) - want))) / scale)
    return worst


def _stats(times_ms: list[float]) -> dict:
    return {"median_ms": statistics.median(times_ms), "min_ms": min(times_ms), "max_ms": max(times_ms)}


def _versions() -> dict[str, str]:
    out = {"cellfuse": __version__, "python": platform.python_version(), "numpy": np.__version__}
    for mod in ("torch", "pycuda", "nvmath"):
        try:
            out[mod] = __import__(mod).__version__
        except (ImportError, AttributeError):
            pass
    return out


def run_benchmark(cell: Cell, config: BenchConfig, progress: Progress | None = None,
                  cancelled: Callable[[], bool] | None = None) -> BenchResult:
    """Checks and times each schedule and baseline; a wrong result is reported, never timed."""
    sizes = config.sizes
    backend = config.backend
    if backend == "auto":
        backend = "cuda" if "cuda" in available_backends() else "numpy"
    device = "CPU (numpy backend, no GPU)"
    if backend == "cuda":
        from .cuda_executor import device_description

        device = device_description()
    rng = np.random.default_rng(config.seed)
    params = init_params(cell, sizes.layers, sizes.input, sizes.hidden, config.seed)
    x = rng.standard_normal((sizes.seq, sizes.batch, sizes.input)).astype(np.float32)
    initial = {s: np.zeros((sizes.layers, sizes.batch, sizes.hidden), np.float32) for s in cell.updates}
    result = BenchResult(cell.name, cell.structure_hash(), sizes, backend, device,
                         datetime.now(UTC).isoformat(timespec="seconds"), _versions())
    schedules = [s for s in config.schedules if s in SCHEDULES]
    baselines = [b for b in config.baselines if b in BASELINES]
    if backend == "numpy":
        baselines = [b for b in baselines if b == "numpy reference"]
    else:
        from .torch_baselines import cudnn_kind, torch_available

        if not torch_available():
            baselines = [b for b in baselines if b == "numpy reference"]
        elif cudnn_kind(cell) is None:
            baselines = [b for b in baselines if b != "cudnn"]
    total = 1 + len(schedules) + len(baselines)
    done = 0

    def step(message: str) -> None:
        nonlocal done
        if cancelled and cancelled():
            raise BenchCancelled
        if progress:
            progress(done, total, message)
        done += 1

    try:
        step("reference interpreter (numpy, float64)")
        t0 = time.perf_counter()
        ref = run_reference(cell, params, {"x": x, **initial})
        ref_ms = (time.perf_counter() - t0) * 1e3
        for name in schedules:
            step(f"schedule '{name}' on {backend}")
            result.rows.append(_bench_schedule(cell, name, backend, sizes, params, x, initial, ref, config))
        for name in baselines:
            step(f"baseline {name}")
            if name == "numpy reference":
                result.rows.append(BenchRow(name, "baseline", True, ref_ms, ref_ms, ref_ms, 0.0,
                                            note="float64 on the CPU, one run"))
            else:
                result.rows.append(_bench_torch(cell, name, sizes, params, x, initial, ref, config))
        if progress:
            progress(total, total, "done")
    except BenchCancelled:
        result.cancelled = True
    return result


def _bench_schedule(cell, name, backend, sizes, params, x, initial, ref, config) -> BenchRow:
    plan = make_plan(cell, sizes, name)
    row = BenchRow(name, "schedule", False, launches_per_step=plan.launches_per_step)
    try:
        if backend == "numpy":
            from .numpy_executor import NumpyExecutor

            t0 = time.perf_counter()
            ex = NumpyExecutor(plan, params)
            out = ex.run(x, initial)
            first = time.perf_counter() - t0
            row.rel_error = _rel_error(out, ref)
            if not row.rel_error < TOLERANCE:
                row.note = f"wrong result: relative error {row.rel_error:.2e}; not timed"
                return row
            times = []
            for _ in range(max(1, min(config.repeats, 3))):  # the numpy executor is slow: a few runs
                t0 = time.perf_counter()
                ex.run(x, initial)
                times.append((time.perf_counter() - t0) * 1e3)
            row.compile_s = 0.0
            row.note = f"first run {first * 1e3:.1f} ms"
        else:
            from .cuda_executor import CudaExecutor

            t0 = time.perf_counter()
            ex = CudaExecutor(plan, params)
            out = ex.run(x, initial)
            row.compile_s = time.perf_counter() - t0
            row.rel_error = _rel_error(out, ref)
            if not row.rel_error < TOLERANCE:
                row.note = f"wrong result: relative error {row.rel_error:.2e}; not timed"
                ex.close()
                return row
            times = _time_cuda(ex.drv, ex.stream, ex.forward, config)
            ex.close()
    except CellError as e:
        row.note = str(e)
        return row
    row.ok = True
    for k, v in _stats(times).items():
        setattr(row, k, v)
    return row


def _time_cuda(drv, stream, fn: Callable[[], None], config: BenchConfig) -> list[float]:
    for _ in range(config.warmup):
        fn()
    stream.synchronize()
    start, end = drv.Event(), drv.Event()
    times = []
    for _ in range(config.repeats):
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        times.append(start.time_till(end))
    return times


def _bench_torch(cell, name, sizes, params, x, initial, ref, config) -> BenchRow:
    import torch

    from .torch_baselines import CudnnCell, TorchCell, cudnn_kind

    # Float32 against float32: PyTorch would otherwise let cuDNN and cuBLAS round inputs to TF32.
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    row = BenchRow(name, "baseline", False)
    xt = torch.from_numpy(x).cuda()
    init = [torch.from_numpy(initial[s]).cuda() for s in cell.updates]
    t0 = time.perf_counter()
    if name == "cudnn":
        model = CudnnCell(cudnn_kind(cell), params, sizes.layers, sizes.input, sizes.hidden)
    else:
        model = TorchCell(cell, params, sizes.layers, compiled=name == "torch.compile")
    y = model(xt, init)
    torch.cuda.synchronize()
    row.compile_s = time.perf_counter() - t0
    row.rel_error = _rel_error(Forward(y.cpu().numpy(), {}), Forward(ref.y, {}))
    if not row.rel_error < TOLERANCE:
        row.note = f"wrong result: relative error {row.rel_error:.2e}; not timed"
        return row
    for _ in range(config.warmup):
        model(xt, init)
    torch.cuda.synchronize()
    times = []
    for _ in range(config.repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        model(xt, init)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    row.ok = True
    for k, v in _stats(times).items():
        setattr(row, k, v)
    return row


def run_sweep(cell: Cell, config: BenchConfig, param: str, values: list[int],
              progress: Progress | None = None, cancelled: Callable[[], bool] | None = None) -> SweepResult:
    """The benchmark at each value of one size (seq, batch, input, hidden or layers)."""
    if param not in ("seq", "batch", "input", "hidden", "layers"):
        raise CellError(f"cannot sweep '{param}': choose seq, batch, input, hidden or layers")
    sweep = SweepResult(param, list(values), [])
    for i, v in enumerate(values):
        def sub_progress(done: int, total: int, message: str, i: int = i, v: int = v) -> None:
            if progress:
                progress(i * total + done, len(values) * total, f"{param}={v}: {message}")

        res = run_benchmark(cell, replace(config, sizes=replace(config.sizes, **{param: v})), sub_progress,
                            cancelled)
        sweep.results.append(res)
        if res.cancelled:
            break
    return sweep
