"""Checks and times every template at one problem size on the GPU machine; writes one JSON record.

    python benchmarks/bench_templates.py --batch 64 --out results/standard.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cellfuse.gpu_runtime.bench import BASELINES, BenchConfig, run_benchmark
from cellfuse.graph_model import Sizes, load_template, template_names


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seq", type=int, default=100)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--input", type=int, default=512)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--no-compile", action="store_true", help="leave out the torch.compile baselines")
    p.add_argument("--templates", default=",".join(template_names()))
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    sizes = Sizes(args.seq, args.batch, args.input, args.hidden, args.layers)
    baselines = [b for b in BASELINES if not (args.no_compile and b.startswith("torch.compile"))]
    records = []
    for name in args.templates.split(","):
        cell = load_template(name)
        result = run_benchmark(cell, BenchConfig(sizes, "cuda", baselines=baselines, repeats=args.repeats),
                               lambda d, t, m, name=name: print(f"{name} [{d}/{t}] {m}", flush=True))
        for r in result.rows:
            ms = f"{r.median_ms:9.3f} ms" if r.ok else "   FAILED  "
            print(f"  {name:14s} {r.name:16s} {ms}  err {r.rel_error}  {r.note}", flush=True)
        records.append({"template": name, **result.to_json()})
        args.out.write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
