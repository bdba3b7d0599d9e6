#!/usr/bin/env bash
# The persistent rung's benchmark records, on the GPU machine, one run after another:
#   bash benchmarks/run_persistent.sh OUTDIR
# Each case writes OUTDIR/<case>.json (the record, with the GPU, date and sizes) and OUTDIR/<case>.txt.
# CASES="lstm_B64 gru_B64" runs only those cases.
set -uo pipefail
out=${1:?usage: run_persistent.sh OUTDIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
run() {
    local case=$1
    shift
    if [[ -n ${CASES:-} && " $CASES " != *" $case "* ]]; then
        return
    fi
    timeout 300 python3 -m cellfuse bench "$@" --json "$out/$case.json" > "$out/$case.txt" 2>&1
    echo "$case: exit $?"
}
S="--seq 100 --input 512 --hidden 512"
R="--schedules graph,persistent,tensor"
W="--schedules graph,persistent,wavefront,tensor"
C="cudnn,cudnn persistent static,cudnn persistent dynamic,cudnn persistent small h"
run lstm_B1 lstm $S --batch 1 $R --baselines "$C"
run lstm_B8 lstm $S --batch 8 $R --baselines "$C"
run lstm_B64 lstm $S --batch 64 $R --baselines "$C"
run lstm_B256 lstm $S --batch 256 $R --baselines cudnn
run lstm_T1000_B8 lstm --seq 1000 --input 512 --hidden 512 --batch 8 $R --baselines "$C"
run lstm_B64_L4 lstm $S --batch 64 --layers 4 $W --baselines "$C"
run lstm_B8_L4 lstm $S --batch 8 --layers 4 $W --baselines "$C"
run lstm_H1024_B8 lstm --seq 100 --input 1024 --hidden 1024 --batch 8 $R --baselines cudnn
run lstm_H1024_B64 lstm --seq 100 --input 1024 --hidden 1024 --batch 64 $R --baselines cudnn
run gru_B1 gru $S --batch 1 $R --baselines "$C"
run gru_B64 gru $S --batch 64 $R --baselines "$C"
run mgu_B64 mgu $S --batch 64 $R --baselines ""
run gru_cho_B64 gru_cho $S --batch 64 $R --baselines ""
run gru_cho_B64_L3 gru_cho $S --batch 64 --layers 3 $W --baselines ""
run indrnn_B64 indrnn $S --batch 64 $R --baselines ""
run peephole_lstm_B64 peephole_lstm $S --batch 64 $R --baselines "torch.compile"
