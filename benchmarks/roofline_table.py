"""The roofline of each case of a benchmark record beside its measured time: for the fastest rung of each
case (of `graph`, `persistent`, `tensor`, `wavefront`), the time its plan's arithmetic, bytes and per-step
synchronisation alone would take (cellfuse.codegen.roofline) at the published peaks of the GPU the
record ran on, and how far the measured time is above their bound. The README's roofline table.

    python benchmarks/roofline_table.py benchmarks/results/h100_2026-11-27_persistent_5136e32.json

A record of `run_persistent.sh` (cases by name) or of `cellfuse bench --json` (one case). Records made
since the roofline exists carry it per schedule, from the GPU's own attributes; this script recomputes
it for older ones.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cellfuse.codegen import make_plan
from cellfuse.codegen.roofline import PUBLISHED, Peaks, roofline
from cellfuse.graph_model import Sizes, load_template, template_names

RUNGS = ("graph", "persistent", "tensor", "wavefront")


def peaks_of(device: str) -> Peaks:
    for name, peaks in PUBLISHED.items():
        if name in device:
            return peaks
    raise SystemExit(f"no published peaks for {device!r}: add them to PUBLISHED")


def template_of(cell_hash: str):
    for name in template_names():
        cell = load_template(name)
        if cell.structure_hash() == cell_hash:
            return cell
    raise SystemExit(f"no template has the structure {cell_hash}")


def rows(record: dict) -> list[str]:
    cases = record["cases"] if "cases" in record else {record["cell"]: record}
    out = []
    for case in cases.values():
        timed = {r["name"]: r["median_ms"] for r in case["results"]
                 if r["name"] in RUNGS and r["ok"] and r["median_ms"] is not None}
        if not timed:
            continue
        rung = min(timed, key=timed.get)
        s = sizes = Sizes(**case["sizes"])
        what = f"{case['cell']} T={s.seq} B={s.batch} H={s.hidden}" + (f" L={s.layers}" * (s.layers > 1))
        r = roofline(make_plan(template_of(case["cell_hash"]), sizes, rung), peaks_of(case["device"]))
        out.append(f"| {what} | {rung} | {timed[rung]:.3f} | {r.arithmetic_ms:.3f} | {r.memory_ms:.3f} | "
                   f"{r.sync_ms:.3f} | {r.bound_ms:.3f} | {timed[rung] / r.bound_ms:.1f}x |")
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("record", type=Path)
    args = p.parse_args()
    record = json.loads(args.record.read_text())
    print("| case | rung | measured | arithmetic | bytes | synchronisation | bound | measured / bound |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows(record)))


if __name__ == "__main__":
    main()
