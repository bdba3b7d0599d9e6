#!/usr/bin/env bash
# The training records and the new templates' comparisons, on the GPU machine:
#   bash benchmarks/run_training.sh OUTDIR [CASE...]
# CASE is a template (its forward pass), a template with _train (forward + backward) or train_lm (the
# language model); by default lstm_train gru_train train_lm peephole_lstm_train sru residual_lstm slstm
# layernorm_lstm. Together they take longer than one ten-minute call (mostly compiling
# torch.compile's baselines, so a call names a few). Each case writes OUTDIR/<case>.json (the record, with
# the GPU, date and sizes) and OUTDIR/<case>.txt; everything is packed into OUTDIR.tar.gz at the end, one
# file to bring back. The environment may narrow a call:
#   SCHEDULES=graph                 the schedules of every case
#   TRAIN_BASELINES=...  BASELINES=...  the baselines of the training cases and of the forward cases
#   CASE_LIMIT=300                  seconds each benchmark case may take, at most
#   WARM=1                          first runs every case at once, to fill torch.compile's cache (its
#                                   compiles take minutes each, on one core each), then one by one as
#                                   always, so that no two cases are timed at the same time
set -uo pipefail
out=${1:?usage: run_training.sh OUTDIR [CASE...]}
shift
cases=${*:-lstm_train gru_train train_lm peephole_lstm_train sru residual_lstm slstm layernorm_lstm}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
S="--seq 100 --input 512 --hidden 512 --batch 64"
# Forward + backward against cuDNN, PyTorch eager and torch.compile with autograd; the new templates'
# forward pass against PyTorch in a CUDA graph and torch.compile. Limits keep one slow compile from
# taking the whole call.
schedules=${SCHEDULES:-hoisted,graph,persistent,tensor}
run() {  # run DIR CASE
    local dir=$1 case=$2 limit command
    case $case in
        train_lm)
            limit=200 command=(python3 benchmarks/train_lm.py --device cuda) ;;
        *_train)
            limit=${CASE_LIMIT:-300} command=(python3 -m cellfuse bench "${case%_train}" $S --train --schedules "$schedules"
                               --baselines "${TRAIN_BASELINES:-cudnn,pytorch eager,torch.compile}") ;;
        *)
            limit=${CASE_LIMIT:-300} command=(python3 -m cellfuse bench "$case" $S --schedules "$schedules"
                               --baselines "${BASELINES:-pytorch graph,torch.compile}") ;;
    esac
    # -k: a compile in progress can outlive the polite signal
    timeout -k 10 "$limit" "${command[@]}" --json "$dir/$case.json" > "$dir/$case.txt" 2>&1
    echo "$case: exit $?"
}
if [[ ${WARM:-0} == 1 ]]; then
    mkdir -p "$out/warm"
    for case in $cases; do run "$out/warm" "$case" & done
    wait
fi
for case in $cases; do run "$out" "$case"; done
tar czf "$out.tar.gz" -C "$(dirname "$out")" "$(basename "$out")"
