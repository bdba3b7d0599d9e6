"""The `cellfuse` command line. Every failure a user can cause ends in one clear message and a
non-zero exit, never in a traceback."""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import signal
import stat
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from . import __version__
from .graph_model import (
    Cell,
    CellError,
    Sizes,
    analyze,
    check_sizes,
    equations_latex,
    equations_text,
    init_params,
    input_key_check,
    load_cell,
    load_npz,
    load_template,
    param_key_check,
    require_valid,
    run_reference,
    save_npz,
    template_names,
)
from .graph_model.cellfile import write_target
from .graph_model.lengths import STEPS_LEFT, masked
from .graph_model.templates import template_text

log = logging.getLogger("cellfuse")


def resolve_cell(spec: str) -> Cell:
    """A cell file's path, or the name of a built-in template when no such file exists."""
    path = Path(spec)
    if not path.exists():
        if spec in template_names():
            return load_template(spec)
        raise CellError(f"{spec}: no such file, and no template of that name "
                        f"(templates: {', '.join(template_names())})")
    return load_cell(path)


class Writes(NamedTuple):
    """What a command writes to a file: in words, and the suffixes a file of that kind is named with."""

    what: str
    suffixes: tuple[str, ...]


CELL_FILE = Writes("a cell file", (".cell.json", ".json"))
ARRAYS = Writes("NumPy arrays", (".npz",))
CUDA_SOURCE = Writes("CUDA source", (".cu", ".cuh"))
JSON_RECORD = Writes("a JSON record", (".json",))
CHART = Writes("a chart", (".png", ".svg", ".pdf"))

# Suffixes that say what a file holds. An output named with one of them that the command does not write
# is refused (without --force): `export -o params.npz` would otherwise put CUDA source where the
# parameters were. Longest first, as a cell file's suffix ends in another's. Any other name (`-o out`,
# `-o lstm.txt`) says nothing about its content and is written.
_KNOWN_SUFFIXES = tuple(sorted({
    ".cell.json", ".json", ".npz", ".npy", ".cu", ".cuh", ".c", ".cc", ".cpp", ".h", ".hpp", ".py", ".ipynb",
    ".csv", ".png", ".svg", ".pdf", ".jpg", ".jpeg", ".o", ".so", ".ptx", ".cubin", ".pt", ".pth",
    ".safetensors",
}, key=len, reverse=True))


def _known_suffix(path: Path) -> str | None:
    name = path.name.lower()
    return next((s for s in _KNOWN_SUFFIXES if name.endswith(s)), None)


def output_path(path: Path, writes: Writes, option: str = "-o", force: bool = False,
                **reads: str | Path | None) -> Path:
    """`path` as a file this command may write: not a directory, a device or a FIFO (writing would
    replace the node with a regular file), none of the files the command reads (`reads` names them:
    cell="lstm.cell.json"), and, unless `force`, not named as another kind of file than `writes` (the
    name given is the one that counts). A symbolic link is written through (see write_target): the other
    checks are of the file it points to."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise CellError(f"{option} {path}: {e.strerror}") from None
    if st is None:
        try:
            write_target(path)  # a link into a folder that does not exist, refused before any work
        except CellError as e:
            raise CellError(f"{option} {e}") from None
    elif stat.S_ISDIR(st.st_mode):
        raise CellError(f"{option} {path}: is a directory; name the file to write")
    elif not stat.S_ISREG(st.st_mode):
        raise CellError(f"{option} {path}: exists and is not a regular file (a device, FIFO or socket); "
                        "it is left as it is")
    else:
        for what, other in reads.items():
            if other is not None and Path(other).exists() and os.path.samefile(path, other):
                raise CellError(f"{option} {path}: that is the {what} file this command reads; writing it "
                                "would destroy it")
    suffix = _known_suffix(path)
    if not force and suffix is not None and suffix not in writes.suffixes:
        raise CellError(f"{option} {path}: names a {suffix} file, and this command writes {writes.what} "
                        f"({' or '.join(writes.suffixes)}); pass --force to write it anyway")
    return path


def _cell_file(spec: str) -> str | None:
    """The file a CELL argument names, or None for a template."""
    return spec if Path(spec).exists() else None


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a seed is 0 or more, got {value}")
    return value


@contextlib.contextmanager
def _allocating(what: str) -> Iterator[None]:
    """Turns numpy's refusal of an array too large for memory into a CellError."""
    try:
        yield
    except (MemoryError, ValueError) as e:
        raise CellError(f"cannot make {what}: {e or 'not enough memory'}") from None


# -- commands -----------------------------------------------------------------------------------

def cmd_gui(args: argparse.Namespace) -> int:
    from .app.main import run_app

    return run_app(args.cell)


def cmd_templates(args: argparse.Namespace) -> int:
    if args.name is None:
        for name in template_names():
            cell = load_template(name)
            print(f"{name:16s} {cell.name}: {cell.description}")
        return 0
    text = template_text(args.name)
    if args.output:
        from .graph_model import atomic_write

        atomic_write(output_path(args.output, CELL_FILE, force=args.force), text.encode())
        print(f"wrote {args.output}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    cell = resolve_cell(args.cell)
    info = analyze(cell)
    for p in info.problems:  # diagnostics go to stderr, as a compiler's do
        print(f"{args.cell}: {p}", file=sys.stderr)
    if info.errors:
        print(f"{args.cell}: {len(info.errors)} error(s)", file=sys.stderr)
        return 1
    print(f"{args.cell}: cell '{cell.name}' is valid ({len(cell.nodes)} nodes, "
          f"{len(info.problems)} warning(s))")
    for note in info.notes:  # what its sizes must meet: facts about a valid cell, not diagnostics
        print(f"{args.cell}: {note}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    cell = resolve_cell(args.cell)
    sys.stdout.write(equations_latex(cell) if args.latex else equations_text(cell))
    errors = analyze(cell).errors
    if errors:  # the equations of a cell being drawn still say what it computes so far
        print(f"{args.cell}: the cell has {len(errors)} error(s); 'cellfuse validate {args.cell}' lists them",
              file=sys.stderr)
        return 1
    return 0


def _sizes(cell: Cell, args: argparse.Namespace) -> tuple[int, int]:
    return args.input or cell.sizes["input"], args.hidden or cell.sizes["hidden"]


def cmd_init_params(args: argparse.Namespace) -> int:
    cell = resolve_cell(args.cell)
    require_valid(cell)
    output = output_path(args.output, ARRAYS, force=args.force, cell=_cell_file(args.cell))
    input_size, hidden = _sizes(cell, args)
    with _allocating(f"parameters of input {input_size}, hidden {hidden}"):
        params = init_params(cell, args.layers, input_size, hidden, args.seed, args.bidirectional)
    save_npz(output, params)
    directions = ", both directions" if args.bidirectional else ""
    print(f"wrote {args.output}: {len(params)} arrays for {args.layers} layer(s){directions}, "
          f"input {input_size}, hidden {hidden}")
    return 0


def cmd_init_inputs(args: argparse.Namespace) -> int:
    import numpy as np

    cell = resolve_cell(args.cell)
    require_valid(cell)
    output = output_path(args.output, ARRAYS, force=args.force, cell=_cell_file(args.cell))
    input_size = args.input or cell.sizes["input"]
    check_sizes(Sizes(seq=args.seq, batch=args.batch, input=input_size, hidden=cell.sizes["hidden"]), cell)
    rng = np.random.default_rng(args.seed)
    with _allocating(f"inputs of shape {[args.seq, args.batch, input_size]}"):
        x = rng.standard_normal((args.seq, args.batch, input_size)).astype(np.float32)
    save_npz(output, {"x": x})
    print(f"wrote {args.output}: x of shape {list(x.shape)}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    cell = resolve_cell(args.cell)
    require_valid(cell)
    output = output_path(args.output, ARRAYS, force=args.force, cell=_cell_file(args.cell),
                         parameters=args.params, inputs=args.inputs)
    params = load_npz(args.params, "parameters", param_key_check(cell))
    inputs = load_npz(args.inputs, "inputs", input_key_check(cell))
    if args.backend == "numpy" and args.schedule is None:
        if args.precision != "fp32":
            raise CellError(f"--precision {args.precision} runs a schedule: name one with --schedule (the "
                            "reference interpreter computes in float64)")
        result = run_reference(cell, params, inputs, args.layers)
    else:
        try:
            from .gpu_runtime.execute import run_schedule
        except ImportError as e:
            raise CellError(f"the '{args.backend}' backend is not available: {e}") from None

        result = run_schedule(cell, params, inputs, args.layers, args.schedule or "hoisted",
                              args.backend, chosen=lambda why: print(why, file=sys.stderr),
                              precision=args.precision, float32_states=_float32_states(args))
    save_npz(output, result.arrays())
    print(f"wrote {args.output}: y of shape {list(result.y.shape)}, "
          f"final states {', '.join(result.final)}")
    return 0


def _plan_sizes(cell: Cell, args: argparse.Namespace) -> Sizes:
    input_size, hidden = _sizes(cell, args)
    sizes = Sizes(seq=args.seq, batch=args.batch, input=input_size, hidden=hidden, layers=args.layers)
    check_sizes(sizes, cell)
    return sizes


def _schedule(cell: Cell, sizes: Sizes, schedule: str, precision: str = "fp32") -> str:
    """The schedule itself, or the one `auto` stands for on this machine in `precision` (said on standard
    error)."""
    if schedule != "auto":
        return schedule
    from .gpu_runtime.auto_schedule import choose_schedule

    choice = choose_schedule(cell, sizes, "auto", precision=precision)
    print(choice.why, file=sys.stderr)
    return choice.schedule


def cmd_plan(args: argparse.Namespace) -> int:
    import json

    from .codegen import make_plan
    from .codegen.plan_text import describe, summary

    cell = resolve_cell(args.cell)
    sizes = _plan_sizes(cell, args)
    plan = make_plan(cell, sizes, _schedule(cell, sizes, args.schedule, args.precision),
                     precision=args.precision, float32_states=_float32_states(args))
    if args.json:
        print(json.dumps(summary(plan), indent=2))
        return 0
    print(describe(plan))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .codegen import generate_cuda
    from .codegen.c_text import c_stem
    from .gpu_runtime.kernel_cache import ExportFit
    from .graph_model import atomic_write

    cell = resolve_cell(args.cell)
    output = output_path(args.output, CUDA_SOURCE, force=args.force, cell=_cell_file(args.cell))
    float32_states = _float32_states(args)
    if args.lengths:
        require_valid(cell)
        cell = masked(cell)
        if float32_states is not None:  # a row's steps left, whole numbers past 256, stay float32
            float32_states = [*float32_states, STEPS_LEFT]
    sizes = _plan_sizes(cell, args)
    fit = ExportFit()
    src = generate_cuda(cell, sizes, _schedule(cell, sizes, args.schedule, args.precision),
                        backward=args.backward, bidirectional=args.bidirectional, precision=args.precision,
                        float32_states=float32_states, fit=fit)
    atomic_write(output, src.text.encode())
    print(f"wrote {args.output} ({len(src.text.splitlines())} lines); build it with: "
          f"nvcc -O3 -arch={fit.arch} -DCELLFUSE_DEMO_MAIN {args.output} -lcublas")
    for name, (spilled, how) in fit.rewritten.items():
        print(f"  {name} spilled {spilled} bytes of registers as planned: written with {how}, as CellFuse "
              "runs it")
    if fit.failed:
        print(f"  kernels not checked for spilled registers are written as planned: {fit.failed}",
              file=sys.stderr)
    if args.bidirectional:
        print(f"  both directions of the layer: cellfuse_{c_stem(cell.name)}_bidirectional_forward takes the "
              "forward direction's parameters, then the reverse one's, and gives y [seq, batch, 2 * hidden]")
    if args.lengths:
        print(f"  each batch row runs to its own length: give the forward launcher init_states whose last, "
              f"{STEPS_LEFT}, holds each row's length in every element of its row (the demo main starts "
              "every state at zero: every row stops at once)")
    return 0


def _print_bench(result) -> None:
    s = result.sizes
    print(f"\n{result.cell}: T={s.seq} B={s.batch} input={s.input} hidden={s.hidden} layers={s.layers} "
          f"on {result.device}" + (", training: forward + backward" if result.train else "")
          + (f", in {result.precision}" if result.precision != "fp32" else ""))
    if result.lengths:
        print(f"  each batch row to its own length, {min(result.lengths)} to {max(result.lengths)} steps "
              f"(mean {sum(result.lengths) / len(result.lengths):.1f})")
    if result.bidirectional:
        print("  both directions of the layer, side by side on a GPU (each on half of its SMs)")
    naive = result.row("naive")
    print(f"  {'implementation':18s} {'median ms':>10s} {'min':>8s} {'max':>8s} {'vs naive':>9s} "
          f"{'rel err':>9s} {'launch/step':>11s} {'compile s':>9s}  note")
    for r in result.rows:
        if not r.ok:
            print(f"  {r.name:18s} {'FAILED' if r.applicable else 'n/a':>10s}  {r.note}")
            continue
        speed = (f"{naive.median_ms / r.median_ms:8.1f}x" if naive and naive.ok else f"{'':9s}")
        lps = "" if r.launches_per_step is None else str(r.launches_per_step)
        compile_s = "" if r.compile_s is None else f"{r.compile_s:.2f}"
        print(f"  {r.name:18s} {r.median_ms:10.3f} {r.min_ms:8.3f} {r.max_ms:8.3f} {speed} "
              f"{r.rel_error:9.1e} {lps:>11s} {compile_s:>9s}  {r.note}")
    left_out: dict[str, list[str]] = {}  # what was asked for that does not run, by the reason
    for name, why in result.left_out.items():
        left_out.setdefault(why.removeprefix("not available: "), []).append(name)
    for why, names in left_out.items():
        print(f"  not run: {', '.join(names)} ({why})")
    best = result.best_schedule()
    if best is not None:
        print(f"  best schedule at these sizes: {best.name} ({best.median_ms:.3f} ms)")
        if best.roofline:
            r = best.roofline
            print(f"  its roofline on this GPU: arithmetic {r['arithmetic_ms']:.3f} ms, bytes "
                  f"{r['memory_ms']:.3f} ms, synchronisation {r['sync_ms']:.3f} ms: at least "
                  f"{r['bound_ms']:.3f} ms, {best.median_ms / r['bound_ms']:.1f}x that measured")
    if result.cancelled:
        print("  (cancelled)")


def _choices(option: str, text: str, known, none: str = "") -> list[str]:
    """The comma-separated names of `text`, each one of `known`; `none`: how to ask for none of them, said
    where a name is unknown."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise CellError(f"{option}: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(known)}"
                        + (f" ({none})" if none else ""))
    return names


def cmd_bench(args: argparse.Namespace) -> int:
    import json

    from .codegen import SCHEDULES
    from .gpu_runtime.bench import BASELINES, TRAIN_BASELINES, BenchConfig, run_benchmark, run_sweep

    cell = resolve_cell(args.cell)
    require_valid(cell)
    for option, path, writes in (("--json", args.json, JSON_RECORD), ("--plot", args.plot, CHART)):
        if path is not None:
            output_path(path, writes, option, force=args.force, cell=_cell_file(args.cell))
    if args.json is not None and args.plot is not None and args.json.resolve() == args.plot.resolve():
        raise CellError(f"--json and --plot name the same file, {args.json}")
    config = BenchConfig(_plan_sizes(cell, args), backend=args.backend, repeats=args.repeats,
                         seed=args.seed, train=args.train, lengths=args.lengths,
                         bidirectional=args.bidirectional, precision=args.precision)
    if args.schedules:
        config.schedules = _choices("--schedules", args.schedules, SCHEDULES)
    if args.baselines is not None:
        config.baselines = _choices("--baselines" + " with --train" * args.train, args.baselines,
                                    TRAIN_BASELINES if args.train else BASELINES,
                                    none='--baselines "" for none')

    def progress(done: int, total: int, message: str) -> None:
        print(f"[{done}/{total}] {message}", file=sys.stderr, flush=True)

    if args.sweep:
        param, _, values = args.sweep.partition("=")
        try:
            numbers = [int(v) for v in values.split(",") if v]
        except ValueError:
            raise CellError(f"--sweep {args.sweep}: expected NAME=N,N,... like batch=1,8,64,256") from None
        if not numbers:
            raise CellError(f"--sweep {args.sweep}: expected NAME=N,N,... like batch=1,8,64,256")
        if param not in ("seq", "batch", "input", "hidden", "layers"):
            raise CellError(f"--sweep {args.sweep}: cannot sweep '{param}': choose seq, batch, input, hidden "
                            "or layers")
        for n in numbers:  # every size of the sweep, before any of them runs
            check_sizes(replace(config.sizes, **{param: n}), cell)
        sweep = run_sweep(cell, config, param, numbers, progress)
        for res in sweep.results:
            _print_bench(res)
        record, results = sweep.to_json(), sweep.results
    else:
        result = run_benchmark(cell, config, progress)
        _print_bench(result)
        record, results = result.to_json(), [result]
    from .graph_model import atomic_write

    if args.json:
        atomic_write(args.json, (json.dumps(record, indent=2) + "\n").encode())
        print(f"wrote {args.json}")
    if args.plot:
        from matplotlib.figure import Figure

        from .gpu_runtime.plots import plot_result, plot_sweep

        fig = Figure(figsize=(10, 4.5))
        if args.sweep:
            plot_sweep(sweep, fig)
        else:
            plot_result(results[0], fig)
        buf = io.BytesIO()
        fig.savefig(buf, format=_chart_format(args.plot), dpi=120)
        atomic_write(args.plot, buf.getvalue())
        print(f"wrote {args.plot}")
    bad = [r.name for res in results for r in res.rows if not r.ok and r.applicable]
    return 1 if bad else 0


def _chart_format(path: Path) -> str:
    """The chart's format: the one its name says (PNG, SVG or PDF), and PNG for any other name."""
    suffix = path.suffix.lower()
    return suffix[1:] if suffix in CHART.suffixes else "png"


def _force_option(s: argparse.ArgumentParser) -> None:
    s.add_argument("--force", action="store_true",
                   help="write the output even where its name says it is another kind of file")


_STORED_IN = ("what x, the weights, the outputs and the states are stored in (bf16, fp16: multiplied on "
              "tensor cores into float32; the states that accumulate kept float32)")


def _precision_option(s: argparse.ArgumentParser, help_text: str = _STORED_IN, states: bool = False) -> None:
    """--precision, and with `states` --float32-states (the states a 16-bit plan keeps in float32)."""
    from .codegen.precision import PRECISIONS

    s.add_argument("--precision", choices=list(PRECISIONS), default="fp32", help=help_text)
    if states:
        s.add_argument("--float32-states", metavar="S,...",
                       help="with a 16-bit precision, the states kept in float32 between steps, "
                            "comma-separated ('' for none; default: those the step adds something to, as the "
                            "LSTM's c)")


def _float32_states(args: argparse.Namespace) -> list[str] | None:
    """--float32-states as make_plan takes it (None: the plan's own choice)."""
    if args.float32_states is None:
        return None
    if args.precision == "fp32":
        raise CellError("--float32-states chooses what a 16-bit plan keeps in float32: give --precision bf16 "
                        "or fp16 with it")
    return [s.strip() for s in args.float32_states.split(",") if s.strip()]


def _size_options(s: argparse.ArgumentParser) -> None:
    s.add_argument("--input", type=_positive, help="input size (default: the cell's)")
    s.add_argument("--hidden", type=_positive, help="hidden size (default: the cell's)")
    s.add_argument("--layers", type=_positive, default=1)
    s.add_argument("--seq", type=_positive, default=100)
    s.add_argument("--batch", type=_positive, default=64)


def build_parser() -> argparse.ArgumentParser:
    from .codegen import SCHEDULES
    from .gpu_runtime.bench import BASELINES, TRAIN_BASELINES

    p = argparse.ArgumentParser(
        prog="cellfuse",
        description="Design recurrent cells and run them fast on NVIDIA GPUs. CELL is a .cell.json "
                    "file or the name of a built-in template (see 'cellfuse templates').",
    )
    p.add_argument("--version", action="version", version=f"cellfuse {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log what is being done")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    s = sub.add_parser("gui", help="open the editor (with CELL, or a new LSTM)")
    s.add_argument("cell", nargs="?")
    s.set_defaults(func=cmd_gui)

    s = sub.add_parser("templates", help="list the built-in cells, or print/write one")
    s.add_argument("name", nargs="?")
    s.add_argument("-o", "--output", type=Path, help="write the template to this file")
    _force_option(s)
    s.set_defaults(func=cmd_templates)

    s = sub.add_parser("validate", help="print every problem of a cell; exit 1 on any error")
    s.add_argument("cell")
    s.set_defaults(func=cmd_validate)

    s = sub.add_parser("show", help="print the cell's equations, as text or --latex")
    s.add_argument("cell")
    s.add_argument("--latex", action="store_true", help="an align* block (amsmath) for a paper")
    s.set_defaults(func=cmd_show)

    s = sub.add_parser("init-params", help="write random parameters for a cell")
    s.add_argument("cell")
    s.add_argument("--layers", type=_positive, default=1)
    s.add_argument("--seed", type=_seed, default=0)
    s.add_argument("--input", type=_positive, help="input size (default: the cell's)")
    s.add_argument("--hidden", type=_positive, help="hidden size (default: the cell's)")
    s.add_argument("--bidirectional", action="store_true",
                   help="the reverse direction's weights too (l0.reverse.W, ...): a bidirectional CellRNN's")
    s.add_argument("-o", "--output", type=Path, required=True)
    _force_option(s)
    s.set_defaults(func=cmd_init_params)

    s = sub.add_parser("init-inputs", help="write a random input sequence x [T, B, input]")
    s.add_argument("cell")
    s.add_argument("--seq", type=_positive, default=100)
    s.add_argument("--batch", type=_positive, default=64)
    s.add_argument("--input", type=_positive, help="input size (default: the cell's)")
    s.add_argument("--seed", type=_seed, default=0)
    s.add_argument("-o", "--output", type=Path, required=True)
    _force_option(s)
    s.set_defaults(func=cmd_init_inputs)

    s = sub.add_parser("run", help="one forward pass over the whole sequence")
    s.add_argument("cell")
    s.add_argument("--params", type=Path, required=True)
    s.add_argument("--inputs", type=Path, required=True)
    s.add_argument("-o", "--output", type=Path, required=True)
    _force_option(s)
    s.add_argument("--layers", type=_positive, help="default: as many as the parameters cover")
    s.add_argument("--backend", choices=["numpy", "cuda"], default="numpy")
    s.add_argument("--schedule", help="a schedule of the ladder, or auto: the one measured fastest on "
                                      "this GPU for these sizes (default: the reference interpreter on "
                                      "numpy, 'hoisted' on cuda)")
    _precision_option(s, states=True)
    s.set_defaults(func=cmd_run)

    s = sub.add_parser("plan", help="the schedule the compiler found, as a table or --json")
    s.add_argument("cell")
    s.add_argument("--schedule", choices=[*SCHEDULES, "auto"], default="hoisted")
    s.add_argument("--json", action="store_true", help="print the plan's summary as JSON")
    _size_options(s)
    _precision_option(s, states=True)
    s.set_defaults(func=cmd_plan)

    s = sub.add_parser("export", help="write the generated CUDA source, self-contained")
    s.add_argument("cell")
    s.add_argument("-o", "--output", type=Path, required=True)
    _force_option(s)
    s.add_argument("--schedule", choices=[*SCHEDULES, "auto"], default="hoisted")
    s.add_argument("--backward", action="store_true",
                   help="also write the backward pass's launcher (the forward pass then saves every step)")
    s.add_argument("--lengths", action="store_true",
                   help="each batch row runs to its own length: the cell gets a last state that starts at "
                        "each row's length")
    s.add_argument("--bidirectional", action="store_true",
                   help="also write a launcher of both directions of the layer, side by side (one layer; "
                        "the reverse direction over each row reversed in time)")
    _size_options(s)
    _precision_option(s, "what the plan stores x, the weights, the outputs and the states in (the launcher's "
                         "arrays are float32 in each: it converts them); 16 bits: the forward pass, one "
                         "direction, so far", states=True)
    s.set_defaults(func=cmd_export, seq=100, batch=64)

    s = sub.add_parser("bench", help="check and time every schedule and the available baselines")
    s.add_argument("cell")
    _size_options(s)
    s.add_argument("--backend", choices=["auto", "numpy", "cuda"], default="auto",
                   help="auto: cuda where a GPU can be used, else numpy")
    s.add_argument("--schedules", help=f"comma-separated, of {','.join(SCHEDULES)} (default: all)")
    s.add_argument("--baselines", help=f"comma-separated, of {','.join(BASELINES)} (default: all that "
                                       "apply; empty for none)")
    s.add_argument("--repeats", type=_positive, default=20, help="timed runs per implementation")
    s.add_argument("--seed", type=_seed, default=0,
                   help="of the weights, the inputs and, with --train, the output's gradient")
    s.add_argument("--train", action="store_true",
                   help="time forward + backward, each checked first by its gradients against the "
                        f"reference's; the baselines ({','.join(TRAIN_BASELINES)}) with autograd")
    s.add_argument("--sweep", help="time over several sizes, e.g. batch=1,8,64,256")
    s.add_argument("--lengths", help="each batch row to a length of its own, drawn uniformly from LOW to "
                                     "HIGH: uniform:LOW-HIGH, e.g. uniform:10-100")
    s.add_argument("--bidirectional", action="store_true",
                   help="both directions of one layer side by side, each with weights of its own (the "
                        "reverse one over each row reversed in time); y is both outputs side by side")
    _precision_option(s, "what every schedule and baseline runs in, checked against the reference within "
                         "the precision's bound (bf16, fp16: the rungs that run in it, cuDNN in that type, "
                         "the other PyTorch baselines under autocast)")
    s.add_argument("--json", type=Path, help="write the result record here")
    s.add_argument("--plot", type=Path, help="write a chart here: SVG or PDF where named so, else PNG")
    _force_option(s)
    s.set_defaults(func=cmd_bench)
    return p


# Characters a shared cell file could use to take over the terminal that prints its name or ids (escape
# sequences, carriage returns) or to make printed text read differently from what it is (bidirectional
# overrides): printed as escapes instead.
_UNSAFE = {c: f"\\x{c:02x}" for c in [*range(0x20), *range(0x7F, 0xA0)] if chr(c) not in "\n\t"}
_UNSAFE.update({c: f"\\u{c:04x}" for c in [*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x2028, 0x2029]})


class _SafeText:
    """A text stream that writes every unsafe character of `_UNSAFE` as its escape."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        return self.stream.write(text.translate(_UNSAFE))

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


class Terminated(BaseException):
    """SIGTERM, raised where the program is, so that what is being written is cleaned up as on Ctrl+C."""


def _terminate(signum, frame) -> None:
    raise Terminated


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="cellfuse: %(message)s")
    if args.command is None:  # plain `cellfuse` opens the editor
        args.func, args.cell = cmd_gui, None
    previous = signal.signal(signal.SIGTERM, _terminate)
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _SafeText(sys.stdout), _SafeText(sys.stderr)
    try:
        return args.func(args)
    except CellError as e:
        print(f"cellfuse: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader of our output went away (| head): not an error of ours
        sys.stderr.close()
        return 0
    except OSError as e:  # a file that cannot be written (or read), a full disk
        where = f"{e.filename}: " if e.filename else ""
        print(f"cellfuse: error: {where}{e.strerror or e}", file=sys.stderr)
        return 1
    except MemoryError:
        print("cellfuse: error: out of memory", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("cellfuse: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("cellfuse: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)
        sys.stdout, sys.stderr = streams


if __name__ == "__main__":
    sys.exit(main())
