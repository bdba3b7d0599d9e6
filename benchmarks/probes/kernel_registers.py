"""Registers, spills and stack frames of the persistent kernels, as ptxas reports them (nvcc -Xptxas -v,
sm_90), for the LSTM and the GRU under the persistent and tensor rungs over batches, hidden sizes, all of
an H100's 132 SMs or half of them (one of two directions side by side), float32 and bf16, forward
(inference), a training step's forward (its steps saved) and backward: no GPU needed, a kernel that
spills is marked SPILL, and one with a stack frame but no spill LOCAL (arrays indexed where nvcc did not
unroll the loop over them, kept in local memory: a step of the scaled sums' LSTM kernel at B=256 ran
that way, docs/results/2026-11-30-g-scaled-sums-tried-autocast-packed-kept.md).

    python3 benchmarks/probes/kernel_registers.py > kernel_registers.txt
    python3 benchmarks/probes/kernel_registers.py --cells lstm --batches 64 --hidden 512 --sms 66
"""

from __future__ import annotations

import argparse
import itertools
import re
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

from cellfuse.codegen.backward_plan import backward_plan
from cellfuse.codegen.kernel_set import backward_kernels, plan_kernels
from cellfuse.codegen.scheduler import H100, make_plan
from cellfuse.graph_model import CellError, Sizes, load_template

# ptxas -v's report of a kernel: its name, then its stack and spills, then its registers
_REPORT = re.compile(r"entry function '(cf_\w+_persistent\w*)'.*?\n.*?\n\s*(\d+) bytes stack frame, "
                     r"(\d+) bytes spill stores.*?\n.*?Used (\d+) registers", re.S)


def registers(source: str, folder: Path) -> list[tuple[str, int, int, int]]:
    """(kernel, registers, bytes of spill stores, bytes of stack frame) of each persistent kernel of a
    module's source."""
    cu = folder / "kernels.cu"
    cu.write_text(source)
    run = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-O3", "-Xptxas", "-v", "-o",
                          str(folder / "kernels.cubin"), str(cu)], capture_output=True, text=True)
    if run.returncode:
        raise RuntimeError(run.stderr)
    return [(m[1], int(m[4]), int(m[3]), int(m[2])) for m in _REPORT.finditer(run.stderr)]


def ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", default="lstm,gru")
    ap.add_argument("--schedules", default="persistent,tensor")
    ap.add_argument("--batches", type=ints, default=[1, 8, 64, 256])
    ap.add_argument("--hidden", type=ints, default=[512, 1024])
    ap.add_argument("--sms", type=ints, default=[132, 66])
    ap.add_argument("--seq", type=int, default=100)
    ap.add_argument("--precisions", default="fp32,bf16")
    args = ap.parse_args()
    print("cell schedule B H SMs precision pass kernel registers spill-bytes stack-bytes")
    cases = itertools.product(args.cells.split(","), args.schedules.split(","), args.batches, args.hidden,
                              args.sms, args.precisions.split(","), ("fwd", "train-fwd", "bwd"))
    with tempfile.TemporaryDirectory() as tmp:
        for cell, schedule, batch, hidden, sms, precision, part in cases:
            if precision != "fp32" and schedule != "tensor":
                continue  # (a 16-bit plan runs its recurrent GEMMs on tensor cores)
            what = (cell, schedule, batch, hidden, sms, precision, part)
            try:
                plan = make_plan(load_template(cell), Sizes(args.seq, batch, hidden, hidden), schedule,
                                 replace(H100, sm_count=sms), save_steps=part != "fwd", precision=precision)
            except CellError as e:
                print(*what, "no plan:", e)
                continue
            kernels = backward_kernels(backward_plan(plan)) if part == "bwd" else plan_kernels(plan)
            for name, regs, spill, stack in registers(kernels.module_source(), Path(tmp)):
                mark = "SPILL" if spill else "LOCAL" if stack else ""
                print(*what, name, regs, spill, stack, mark, flush=True)


if __name__ == "__main__":
    main()
