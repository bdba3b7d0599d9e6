#!/usr/bin/env bash
# CellFuse's own rungs at the persistent table's cases for two versions of the package, in turns on one
# GPU, so that a change shows its cost or gain on the same machine:
#   bash benchmarks/ab_rungs.sh OTHER_DIR OUTDIR
# OTHER_DIR holds the other version's `cellfuse` package, e.g. from `git archive REV cellfuse | tar -x -C
# OTHER_DIR`. Each case runs `cellfuse bench` with the rungs only (no baselines), first with the other
# version, then with this one: OUTDIR/<case>.other.json and OUTDIR/<case>.this.json. Every rung is checked
# against the reference before it is timed, as always. CASES="lstm_B64 gru_B64" runs only those; ROUNDS
# (default 1) repeats the whole alternation. Then: python benchmarks/ab_table.py OUTDIR
set -uo pipefail
other=$(cd "${1:?usage: ab_rungs.sh OTHER_DIR OUTDIR}" && pwd)
out=${2:?usage: ab_rungs.sh OTHER_DIR OUTDIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
here=$PYTHONPATH
run() {
    local case=$1
    shift
    if [[ -n ${CASES:-} && " $CASES " != *" $case "* ]]; then
        return
    fi
    for version in other this; do
        local path=$here
        [[ $version == other ]] && path="$other:$here"
        PYTHONPATH=$path timeout 300 python3 -m cellfuse bench "$@" --baselines "" \
            --json "$out/$case.$round.$version.json" > "$out/$case.$round.$version.txt" 2>&1
        echo "$case round $round $version: exit $?"
    done
}
S="--seq 100 --input 512 --hidden 512"
R="--schedules graph,persistent,tensor"
W="--schedules graph,persistent,wavefront,tensor"
for round in $(seq 1 "${ROUNDS:-1}"); do
    run lstm_B1 lstm $S --batch 1 $R
    run lstm_B8 lstm $S --batch 8 $R
    run lstm_B64 lstm $S --batch 64 $R
    run lstm_B256 lstm $S --batch 256 $R
    run lstm_T1000_B8 lstm --seq 1000 --input 512 --hidden 512 --batch 8 $R
    run lstm_B64_L4 lstm $S --batch 64 --layers 4 $W
    run lstm_B8_L4 lstm $S --batch 8 --layers 4 $W
    run lstm_H1024_B8 lstm --seq 100 --input 1024 --hidden 1024 --batch 8 $R
    run lstm_H1024_B64 lstm --seq 100 --input 1024 --hidden 1024 --batch 64 $R
    run gru_B1 gru $S --batch 1 $R
    run gru_B64 gru $S --batch 64 $R
    run mgu_B64 mgu $S --batch 64 $R
    run gru_cho_B64 gru_cho $S --batch 64 $R
    run gru_cho_B64_L3 gru_cho $S --batch 64 --layers 3 $W
    run indrnn_B64 indrnn $S --batch 64 $R
    run peephole_lstm_B64 peephole_lstm $S --batch 64 $R
done
