#!/bin/bash
# One device window's GPU work, detached, most wanted first: the tables' loop shapes
# (bench_tables; TABLES=0 skips them), bench_gpu parts c and b (one P(k), 256 cosmologies end to
# end), part d (the Jacobian ratio, the batched value-and-Jacobian of GRAD_BATCH cosmologies), the
# -m gpu tests not run in the last windows, time to first result. Each step's output goes to
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
if [ -n "${TABLES:-1}" ] && [ "${TABLES:-1}" != 0 ]; then
step tables 420 python scripts/bench_tables.py --cosmologies 128 --shapes rolled,n1u1,n0u1i,n1u1i,n1u4i \
    --out "$JOB/tables128"
step tables256 240 python scripts/bench_tables.py --cosmologies 256 --chunk 256 --shapes n1u1i,n1u4i \
    --out "$JOB/tables256"
fi
step bench_cb 420 python scripts/bench_gpu.py --parts cb --cosmologies 256 --backends cuda --budget 400 \
    --row-limit 300 --out "$JOB/cb"
step bench_d 600 python scripts/bench_gpu.py --parts d --backends cuda --budget 560 --row-limit 500 \
    --grad-batch "${GRAD_BATCH:-64}" --out "$JOB/d"
step tests 420 python -m pytest -o addopts="" -m gpu -q -p no:cacheprovider \
    tests/test_cuda_sensitivity.py tests/test_cuda_backend.py tests/test_cmb_gpu.py
step first_run 300 python scripts/bench_first_run.py --backend cuda --out "$JOB/fr"
echo "=== ALL DONE $(date -u +%T)"
