#!/usr/bin/env bash
# The forward pass in bf16 and fp16 on the GPU machine, for the records:
#   bash benchmarks/run_precision.sh OUTDIR [probe] [templates]
# probe      benchmarks/probes/precision_probe.py: the LSTM's graph and tensor rungs in fp32, bf16 and fp16
#            beside torch.nn.LSTM (cuDNN) in each, T=100 B=1/8/64/256 and T=1000 B=8; then the GRU at B=8/64
# templates  cellfuse bench --precision bf16 of custom templates (B=64; TEMPLATES="..." names them) against
#            torch.compile under torch.autocast, LIMIT seconds each (default 150: torch.compile's compile
#            of the layer-normalised LSTM takes longer)
# peers      cellfuse bench --precision bf16, then fp16, of the LSTM's persistent, tensor and graph rungs
#            beside cuDNN in fp16 (torch.nn.LSTM, and its persistent algorithm through its C API) and
#            FlashRNN's fused bf16 kernel: T=100 B=1/8/64/256, T=1000 B=8 and 4 layers at B=64, each case a
#            call of its own (FlashRNN builds its kernels for each batch size at its first call, for
#            seconds); FLASHRNN_WHEELS=DIR installs flashrnn and its dependencies from the wheels in DIR
#            first (without them its row says it is not available); CASES="SEQxBATCHxLAYERS ..." and
#            PRECISIONS="bf16 fp16" narrow it
# (default: probe and templates). Each run has a time limit of its own; everything is packed into
# OUTDIR.tar.gz.
set -uo pipefail
out=${1:?usage: run_precision.sh OUTDIR [probe] [templates] [peers]}
shift
groups=${*:-probe templates}
mkdir -p "$out"
for group in $groups; do
    case $group in
        probe)
            timeout 170 python3 benchmarks/probes/precision_probe.py --cell lstm --json "$out/lstm.json" \
                > "$out/lstm.txt" 2>&1
            echo "probe lstm: exit $?"
            timeout 100 python3 benchmarks/probes/precision_probe.py --cell gru --cases 100x8,100x64 \
                --json "$out/gru.json" > "$out/gru.txt" 2>&1
            echo "probe gru: exit $?" ;;
        templates)
            for cell in ${TEMPLATES:-slstm peephole_lstm gru_cho}; do
                timeout "${LIMIT:-150}" python3 -m cellfuse bench "$cell" --backend cuda --precision bf16 --seq 100 \
                    --batch 64 --input 512 --hidden 512 --schedules graph,tensor --baselines "torch.compile" \
                    --repeats 10 --json "$out/${cell}_bf16.json" > "$out/${cell}_bf16.txt" 2>&1
                echo "$cell: exit $?"
                grep -E "^  (graph|tensor|torch)" "$out/${cell}_bf16.txt"
            done ;;
        peers)
            if [ -n "${FLASHRNN_WHEELS:-}" ]; then
                python3 -m pip install -q --no-index --no-deps --target "$out/site" "$FLASHRNN_WHEELS"/*.whl
                export PYTHONPATH="$out/site${PYTHONPATH:+:$PYTHONPATH}" PATH="$out/site/bin:$PATH"
            fi
            for precision in ${PRECISIONS:-bf16 fp16}; do
                for case in ${CASES:-100x1x1 100x8x1 100x64x1 100x256x1 1000x8x1 100x64x4}; do
                    IFS=x read -r seq batch layers <<< "$case"
                    name="lstm_${precision}_T${seq}_B${batch}_L${layers}"
                    timeout "${LIMIT:-120}" python3 -m cellfuse bench lstm --backend cuda --precision "$precision" \
                        --seq "$seq" --batch "$batch" --layers "$layers" --input 512 --hidden 512 \
                        --schedules persistent,tensor,graph,wavefront \
                        --baselines "cudnn,cudnn persistent static,flashrnn" --json "$out/$name.json" \
                        > "$out/$name.txt" 2>&1
                    echo "$name: exit $?"
                done
            done ;;
        *)
            echo "unknown group '$group' (groups: probe templates peers)" >&2
            exit 2 ;;
    esac
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/gpu.txt"
tar czf "$out.tar.gz" -C "$(dirname "$out")" "$(basename "$out")"
