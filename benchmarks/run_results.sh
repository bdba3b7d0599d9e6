#!/usr/bin/env bash
# The records of every template against the baselines and of the LSTM against batch size
# (docs/results/2026-11-23-templates-and-baselines.md), on the GPU machine, one after another (never two
# at once, so that no run disturbs another's timing):
#   bash benchmarks/run_results.sh OUTDIR
# OUTDIR gets one JSON record per run and a log; the records are then copied to benchmarks/results/.
set -uo pipefail
out=${1:?usage: run_results.sh OUTDIR}
mkdir -p "$out"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($2)}')
day=$(date -u +%F)
stem="$out/${gpu}_${day}"
export PYTHONUNBUFFERED=1
{
    python3 benchmarks/bench_templates.py --batch 64 --out "${stem}_T100_B64_I512_H512.json"
    python3 -m cellfuse bench lstm --seq 100 --input 512 --hidden 512 --sweep batch=1,8,64,256 \
        --json "${stem}_sweep_lstm_batch.json" --plot "${stem}_sweep_lstm_batch.png"
    python3 benchmarks/bench_templates.py --batch 1 --out "${stem}_T100_B1_I512_H512.json"
    python3 benchmarks/bench_templates.py --batch 256 --out "${stem}_T100_B256_I512_H512.json"
    echo "all runs done"
} 2>&1 | tee "$out/run.log"
