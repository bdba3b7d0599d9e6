#!/usr/bin/env bash
# The training records and the new templates' comparisons, on the GPU machine, one after another:
#   bash benchmarks/run_training.sh OUTDIR
# Each case writes OUTDIR/<case>.json (the record, with the GPU, date and sizes) and OUTDIR/<case>.txt;
# everything is packed into OUTDIR.tar.gz at the end, one file to bring back.
set -uo pipefail
out=${1:?usage: run_training.sh OUTDIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
run() {
    local case=$1 limit=$2
    shift 2
    timeout "$limit" python3 -m cellfuse bench "$@" --json "$out/$case.json" > "$out/$case.txt" 2>&1
    echo "$case: exit $?"
}
S="--seq 100 --input 512 --hidden 512 --batch 64"
# Forward + backward, against cuDNN, PyTorch eager and torch.compile with autograd.
run lstm_train 300 lstm $S --train --schedules hoisted,graph --baselines "cudnn,pytorch eager,torch.compile"
run gru_train 300 gru $S --train --schedules hoisted,graph --baselines "cudnn,pytorch eager,torch.compile"
run peephole_lstm_train 300 peephole_lstm $S --train --schedules hoisted,graph --baselines "torch.compile"
# The new templates' forward pass against PyTorch in a CUDA graph and torch.compile.
for cell in sru residual_lstm slstm layernorm_lstm; do
    run "${cell}_B64" 300 $cell $S --schedules graph,persistent --baselines "pytorch graph,torch.compile"
done
timeout 600 python3 benchmarks/train_lm.py --device cuda --json "$out/train_lm.json" > "$out/train_lm.txt" 2>&1
echo "train_lm: exit $?"
tar czf "$out.tar.gz" -C "$(dirname "$out")" "$(basename "$out")"
