#!/usr/bin/env bash
# The GPU tests and the long random-cell check, on the GPU machine, in groups that each fit a call:
#   bash benchmarks/run_gpu_checks.sh OUTDIR [GROUP...]
# GROUP is one of
#   forward    the CUDA executor: every template under every schedule, the persistent and tensor rungs
#              at full sizes, random cells, the algorithms of its fp16 GEMMs, the warpgroup GEMM and
#              either route of a GEMM on tensor cores; the exported .cu built and run (its backward
#              checked by finite differences)
#   backward   the backward Plans on the GPU (every template and schedule, random cells, full sizes,
#              the CUDA-graph capture, in bf16 and fp16)
#   rest       the benchmark (one and two directions, rows of their own lengths), auto, cuDNN's persistent
#              algorithms, the sru and flashrnn packages
#   nn         cellfuse.nn on the GPU: CellRNN against the reference, in CUDA graphs, torch.compile and
#              torch.export, out of memory, a faulting kernel, two devices where there are two
#   random     tests/random_cell_checks.py: 200 random cells forward and backward under every schedule
#   probes     benchmarks/probes/barrier_probe.cu, tf32x3_gemm_probe.cu, tf32x3_wgmma_probe.cu,
#              cluster_lstm_probe.cu, cluster_registers_probe.cu, step_gemm_wgmma_probe.cu,
#              chunked_staging_probe.cu, cluster_staging_probe.cu, compact_exchange_probe.cu and
#              f16x3_wgmma_probe.cu, built and run; tf32x3_cublas_probe.py (its record
#              OUTDIR/tf32x3_cublas.json)
# (default: forward, backward, rest, nn and random, longer than one ten-minute call). Each group writes OUTDIR/<group>.log; everything
# is packed into OUTDIR.tar.gz at the end, one file to bring back. LIMIT (seconds, default 540) bounds
# each group.
# The tests are bound by nvcc's compiles, one at a time: where pytest-xdist imports (its wheel and
# execnet's, carried in .gpu/ beside the others), each pytest group runs in WORKERS processes, each with
# its own CUDA context (default: three quarters of the cores; on a 16-core machine, 12: the backward group
# took 139 s with 12, and 180 to more than 210 with 8).
set -uo pipefail
out=${1:?usage: run_gpu_checks.sh OUTDIR [GROUP...]}
shift
groups=${*:-forward backward rest nn random}
limit=${LIMIT:-540}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
pytest=(python3 -m pytest -q -m gpu -rs)
if python3 -c "import xdist" 2>/dev/null; then
    pytest+=(-n "${WORKERS:-$(( $(nproc) * 3 / 4 ))}")
fi
for group in $groups; do
    case $group in
        forward)
            command=("${pytest[@]}" tests/gpu_runtime/test_cuda_executor.py tests/gpu_runtime/test_f16x3_gemms.py
                     tests/gpu_runtime/test_wgmma_gemm.py) ;;
        backward)
            command=("${pytest[@]}" tests/gpu_runtime/test_cuda_backward.py
                     tests/gpu_runtime/test_cuda_backward_graph.py tests/gpu_runtime/test_cuda_backward_16_bit.py) ;;
        rest)
            command=("${pytest[@]}" tests/gpu_runtime/test_bench.py
                     tests/gpu_runtime/test_bench_train.py tests/gpu_runtime/test_bench_train_lm.py
                     tests/gpu_runtime/test_auto_schedule.py tests/gpu_runtime/test_cudnn_persistent.py
                     tests/gpu_runtime/test_sru_package.py tests/gpu_runtime/test_random_cell_checks.py
                     tests/gpu_runtime/test_directions.py tests/gpu_runtime/test_flashrnn_package.py) ;;
        nn)
            command=("${pytest[@]}" tests/nn) ;;
        random)
            command=(python3 tests/random_cell_checks.py --count 200 --workers 16 --backend cuda) ;;
        probes)
            command=(bash -c "nvcc -O3 -arch=sm_90 benchmarks/probes/barrier_probe.cu -o /tmp/barrier_probe &&
                              /tmp/barrier_probe &&
                              nvcc -O3 -arch=sm_90 benchmarks/probes/tf32x3_gemm_probe.cu -lcublas -o /tmp/tf32x3 &&
                              /tmp/tf32x3 &&
                              nvcc -O3 -gencode arch=compute_90a,code=sm_90a benchmarks/probes/tf32x3_wgmma_probe.cu \
                                  -lcublas -o /tmp/tf32x3_wgmma &&
                              /tmp/tf32x3_wgmma &&
                              nvcc -O3 -arch=sm_90 benchmarks/probes/cluster_lstm_probe.cu -o /tmp/cluster_lstm &&
                              /tmp/cluster_lstm &&
                              nvcc -O3 -gencode arch=compute_90a,code=sm_90a \
                                  benchmarks/probes/step_gemm_wgmma_probe.cu -o /tmp/step_gemm &&
                              /tmp/step_gemm &&
                              nvcc -O3 -arch=sm_90 benchmarks/probes/chunked_staging_probe.cu -o /tmp/chunked &&
                              /tmp/chunked &&
                              nvcc -O3 -arch=sm_90 benchmarks/probes/cluster_registers_probe.cu -o /tmp/cluster_registers &&
                              /tmp/cluster_registers 8 100 8 2 && /tmp/cluster_registers 64 100 16 4 1 8 &&
                              nvcc -O3 -arch=sm_90 benchmarks/probes/cluster_staging_probe.cu -o /tmp/cluster_staging &&
                              /tmp/cluster_staging &&
                              nvcc -O3 -arch=sm_90 benchmarks/probes/compact_exchange_probe.cu -o /tmp/compact_exchange &&
                              /tmp/compact_exchange &&
                              nvcc -O3 -gencode arch=compute_90a,code=sm_90a benchmarks/probes/f16x3_wgmma_probe.cu \
                                  -lcublas -o /tmp/f16x3_wgmma &&
                              /tmp/f16x3_wgmma &&
                              python3 benchmarks/probes/tf32x3_cublas_probe.py $out/tf32x3_cublas.json") ;;
        *)
            echo "unknown group '$group' (groups: forward backward rest nn random probes)" >&2
            exit 2 ;;
    esac
    # -k: a compile in progress can outlive the polite signal
    timeout -k 10 "$limit" "${command[@]}" > "$out/$group.log" 2>&1
    echo "$group: exit $?" | tee -a "$out/summary.txt"
    tail -3 "$out/$group.log"
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$out/summary.txt"
date -u +%FT%TZ >> "$out/summary.txt"
tar czf "$out.tar.gz" -C "$(dirname "$out")" "$(basename "$out")"
