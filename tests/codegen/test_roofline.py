"""The roofline of a plan: the arithmetic, the bytes and the per-step synchronisation it needs, at a GPU's
peaks; and how the benchmark's record carries it."""

from __future__ import annotations

import csv
import io

import pytest
from script_loader import ROOT, load_script

from cellfuse.codegen import make_plan
from cellfuse.codegen.roofline import GRID_BARRIER_S, H100_SXM, Peaks, roofline
from cellfuse.gpu_runtime.bench import BenchResult, BenchRow
from cellfuse.graph_model import Sizes, load_template

# an H100 SXM's attributes: 132 SMs at 1.98 GHz, HBM3 at 2.619 GHz on a 5120-bit bus
H100 = Peaks.of_device("NVIDIA H100 80GB HBM3", (9, 0), 132, 1_980_000, 2_619_000, 5120)
LSTM_B64 = Sizes(seq=100, batch=64, input=512, hidden=512, layers=1)


def test_the_peaks_come_from_the_gpus_attributes():
    assert H100.fp32_flops == pytest.approx(66.9e12, rel=1e-3)  # NVIDIA's float32 figure for the H100 SXM
    assert H100.memory_bytes == pytest.approx(3.35e12, rel=1e-3)  # and its HBM3 bandwidth
    assert H100.sixteen_bit_flops == pytest.approx(132 * 4096 * 1.98e9)  # dense fp16
    assert H100_SXM.fp32_flops == pytest.approx(H100.fp32_flops, rel=1e-3)  # the published figure
    assert Peaks.of_device("unknown", (7, 5), 40, 1_500_000, 7_000_000, 256) is None
    assert Peaks.of_device("no clock", (9, 0), 132, 0, 2_619_000, 5120) is None


def test_the_lstms_arithmetic_is_its_26_8_gflop():
    """T=100, B=64, I=H=512: 2 * 64 * 1024 * 2048 * 100 = 26.8 GFLOP of GEMMs, half of them hoisted. The
    hoisted GEMM of every rung on tensor cores and the tensor rung's step GEMM at a third of fp16's peak
    (three fp16 products each), the persistent rung's step GEMM at float32's."""
    tensor = roofline(make_plan(load_template("lstm"), LSTM_B64, "tensor"), H100)
    gemm = 2 * 64 * 1024 * 2048 * 100
    half = gemm / 2
    want = 1e3 * gemm / (H100.sixteen_bit_flops / 3)
    assert tensor.arithmetic_ms == pytest.approx(want, rel=0.02)
    persistent = roofline(make_plan(load_template("lstm"), LSTM_B64, "persistent"), H100)
    want = 1e3 * (half / (H100.sixteen_bit_flops / 3) + half / H100.fp32_flops)
    assert persistent.arithmetic_ms == pytest.approx(want, rel=0.02)
    bf16 = roofline(make_plan(load_template("lstm"), LSTM_B64, "graph", precision="bf16"), H100)
    # (and its elementwise work, at float32's peak: 3% of it)
    assert bf16.arithmetic_ms == pytest.approx(1e3 * gemm / H100.sixteen_bit_flops, rel=0.05)
    fp32 = roofline(make_plan(load_template("lstm"), LSTM_B64, "graph"), H100)
    assert bf16.memory_ms < 0.75 * fp32.memory_ms  # x, the weights and the outputs in half the bytes


def test_synchronisation_is_a_barrier_a_step_or_a_launch():
    sizes = Sizes(seq=50, batch=8, input=32, hidden=32, layers=2)
    persistent = make_plan(load_template("gru"), sizes, "persistent")
    graph = make_plan(load_template("gru"), sizes, "graph")
    assert roofline(persistent, H100).sync_ms >= 1e3 * 50 * 2 * GRID_BARRIER_S
    r = roofline(graph, H100)
    assert r.sync_ms == pytest.approx(1e3 * 50 * 2 * graph.launches_per_step * GRID_BARRIER_S)
    assert r.bound_ms == max(r.arithmetic_ms, r.memory_ms) + r.sync_ms
    both = roofline(graph, H100, directions=2)
    assert both.arithmetic_ms == pytest.approx(2 * r.arithmetic_ms) and both.sync_ms == r.sync_ms


def test_the_csv_gives_the_roofline_columns_of_their_own():
    plan_roof = roofline(make_plan(load_template("lstm"), LSTM_B64, "tensor"), H100).to_json()
    rows = [BenchRow("tensor", "schedule", True, 0.7, 0.69, 0.71, roofline=plan_roof),
            BenchRow("cudnn", "baseline", True, 2.3, 2.2, 2.4)]
    result = BenchResult("lstm", "hash", LSTM_B64, "cuda", "GPU", "date", {}, rows)
    table = list(csv.DictReader(io.StringIO(result.to_csv())))
    assert float(table[0]["roofline_bound_ms"]) == pytest.approx(plan_roof["bound_ms"])
    assert table[1]["roofline_bound_ms"] == ""
    assert result.to_json()["results"][0]["roofline"]["arithmetic_ms"] == plan_roof["arithmetic_ms"]


def test_the_readme_table_comes_from_a_record():
    """benchmarks/roofline_table.py on the record of the persistent table (H100): every case's fastest rung
    beside its roofline at the H100's published peaks."""
    import json

    script = load_script("benchmarks/roofline_table.py")
    record = json.loads((ROOT / "benchmarks/results/h100_2026-11-27_persistent_5136e32.json").read_text())
    table = script.rows(record)
    assert len(table) == len(record["cases"])
    lstm = next(row for row in table if row.startswith("| LSTM T=100 B=64 H=512 |"))
    cells = [c.strip() for c in lstm.strip("|").split("|")]
    assert cells[1] == "tensor" and float(cells[2]) == pytest.approx(0.693, abs=1e-3)
    # 26.8 GFLOP at 330 TFLOP/s (three fp16 products), and 100 barriers
    assert float(cells[6]) == pytest.approx(0.184, abs=0.01)
