"""The table of an ab_rungs.sh run: per case and rung, the other version's median and this one's (the
median over the rounds of each round's median of 20 runs, ms), their ratio, and whether both were checked.

    python benchmarks/ab_table.py OUTDIR [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def collect(folder: Path) -> dict[str, dict[str, dict[str, list[float]]]]:
    """case -> rung -> version -> each round's median (ms); a rung that failed its check counts as NaN."""
    times: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for path in sorted(folder.glob("*.json")):
        case, _round, version = path.name[:-len(".json")].rsplit(".", 2)
        record = json.loads(path.read_text())
        for result in record.get("results", []):
            if result.get("kind") == "schedule" and result.get("applicable", True):
                median = result["median_ms"] if result["ok"] else float("nan")
                times[case][result["name"]][version].append(median)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = []
    for case, rungs in collect(args.folder).items():
        for rung, versions in rungs.items():
            other, this = (statistics.median(versions[v]) if versions[v] else float("nan")
                           for v in ("other", "this"))
            rows.append({"case": case, "rung": rung, "other_ms": other, "this_ms": this,
                         "ratio": this / other, "rounds": min(len(versions["other"]), len(versions["this"]))})
    print("| case | rung | other (ms) | this (ms) | this / other |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['rung']} | {r['other_ms']:.4f} | {r['this_ms']:.4f} | {r['ratio']:.3f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
