#!/bin/bash
# One device window's GPU work, detached, most wanted first: bench_gpu parts c and d (one P(k),
# the Jacobian ratio, the batched value-and-Jacobian of GRAD_BATCH cosmologies), time to first
# result with --gradients, the -m gpu tests of the warp kernels, time to first result without,
# the C_l Jacobian. Each step's output goes to
# $JOB/<step>.txt and its exit status to $JOB/log. Start it from the repo root on the GPU
# machine, after '. /opt/dev-site/env.sh':  setsid bash scripts/gpu_session.sh &
cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH=.:$PYTHONPATH PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export BENCH_MACHINE="${BENCH_MACHINE:-NVIDIA H200}"
JOB=${JOB:-/tmp/job}; mkdir -p "$JOB"
exec >>"$JOB/log" 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.used,utilization.gpu --format=csv
step() {
    local name=$1 limit=$2; shift 2
    echo "=== $name start $(date -u +%T)"
    timeout "$limit" "$@" > "$JOB/$name.txt" 2>&1
    echo "=== $name rc=$? end $(date -u +%T)"
    tail -n 3 "$JOB/$name.txt"
}
step bench_cd 600 python scripts/bench_gpu.py --parts "${PARTS:-cd}" --backends cuda --budget 560 --row-limit 500 \
    --grad-batch "${GRAD_BATCH:-64}" --out "$JOB"
step first_run_grad 480 python scripts/bench_first_run.py --backend cuda --gradients --out "$JOB/frg"
step tests 300 python -m pytest -o addopts="" -m gpu -q -x -p no:cacheprovider \
    tests/test_cuda_warp.py tests/test_cuda_sensitivity.py
step first_run 300 python scripts/bench_first_run.py --backend cuda --out "$JOB/fr"
step cl_grad 400 python scripts/bench_cl.py --backend cuda --gradients --out "$JOB/cl"
echo "=== ALL DONE $(date -u +%T)"
