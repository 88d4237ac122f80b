#!/bin/bash
# One device window's GPU work, detached, most wanted first. STEPS (default "cb d first_run
# profile") picks and orders the steps:
#   tables     bench_tables: the thermodynamics' loop shapes, 128 and 256 cosmologies
#   hosttables one cosmology's tables on the host CPU: as is, on one core (taskset), and with
#              XLA:CPU's Eigen threads off
#   hostprof   profile_host: one warm P(k) function by function (cProfile), the tables stage in
#              pieces and the Jacobian's inputs program, once per XLA:CPU pool size in POOLS
#              (default "default all": the code's own, one thread on a GPU machine, and JAX's, a
#              thread per CPU), a process each ($JOB/hostprof_<size>.txt)
#   pools      bench_gpu parts c and d (one P(k), the Jacobian) once per XLA:CPU pool size in
#              POOLS (default "default all 4"), a process each
#   dirwarps   bench_gpu part d once per sensitivity-kernel direction warps per block in
#              DIR_WARPS (default "default 1"; BOLTZMANN_DIRECTION_WARPS), a process each
#   ncu        Nsight Compute (if the machine has it) on one warm launch of the plain warp
#              kernel and of the sensitivity kernel: $JOB/ncu_plain.txt, ncu_sens.txt
#   cb         bench_gpu parts c and b: one P(k), 256 cosmologies end to end
#   kstride    bench_gpu part b at precision.k_solve_stride 1 and 4 (every mode solved, every
#              4th above 1 h/Mpc), 256 cosmologies, side by side in one process
#   order      one P(k) and 256 cosmologies with the modes launched highest k first (the code's)
#              against lowest k first, and with the massless neutrinos as a fluid from k τ = 30
#              (a second launch of the smaller model), side by side (bench_jacobian_kinds)
#   d          bench_gpu part d: the Jacobian ratio at sensitivity error weights (GRAD_SEC, default 1,0.1,0),
#              the batched value-and-Jacobian of GRAD_BATCH cosmologies
#   first_run  the main job on CUDA in a first and a second process (one cache folder), once
#              per XLA:CPU pool in FR_POOLS (default "default"; e.g. "default all")
#   first_run_grad  the same with --gradients (the first Jacobian call and a later process's)
#   cl         bench_cl: configs/planck_cl.yaml's lensed C_l on CUDA, first and warm, with the
#              per-stage times, one multipole per line-of-sight iteration and then the
#              batched default side by side
#   cl_grad    bench_cl --gradients: the lensed C_l's value and Jacobian (ClFunction) warm, at
#              each entry of CL_SEC: a sensitivity error weight, optionally /directions per
#              line-of-sight pass, '+' between blocks timed in one process (e.g.
#              1,default/2+9; default: ClFunction's own of both)
#   sens_launch  the C_l Jacobian (bench_cl --gradients) and the P(k) Jacobian (bench_gpu part
#              d) once per sensitivity launch in SENS_LAUNCHES (default "host ffi";
#              BOLTZMANN_CUDA_SENS_LAUNCH: a host callback or the XLA FFI custom call), a
#              process each, one cache folder
#   compare    compare_sens_launch: the P(k) Jacobian with the host launch and the custom call in
#              one process, bit for bit, first and warm seconds
#   cl_jvp     profile_cl_jvp: the C_l Jacobian's spectra stage (line of sight, the rest) part
#              by part, its value against its jvp along the solve's directions
#   sources    profile_sources: the C_l sources' stage part by part on CUDA, one solve of both
#              groups against a solve per group
#   forms      profile_los_forms: the line of sight's loops written several ways, side by side
#   cl_parts   the line of sight's parts, and the lensing step with each method (recurrence,
#              tables) side by side
#   profile    a third process on that cache folder under cProfile (where its seconds go), and
#              a fourth under -X importtime
# Python writes its bytecode under $JOB/pycache (the image sets PYTHONDONTWRITEBYTECODE, which
# would make every process compile every module it imports, unlike an installed package).
#   tests      the -m gpu tests named in GPU_TESTS (default: every GPU test file, five groups;
#              verbose, so a step cut short still names what
#              passed; TESTS_LIMIT seconds, default 420; groups separated by ';' run side by
#              side, each to $JOB/tests<i>.txt)
# Each step's output goes to $JOB/<step>.txt and its exit status to $JOB/log. Start it from the
# repo root on the GPU machine, after '. /opt/dev-site/env.sh':  setsid bash scripts/gpu_session.sh &
cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH=.:$PYTHONPATH PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export BENCH_MACHINE="${BENCH_MACHINE:-NVIDIA H200}"
JOB=${JOB:-/tmp/job}; mkdir -p "$JOB"
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX="$JOB/pycache"
CACHE=${CACHE:-/tmp/fr_cache}
exec >>"$JOB/log" 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.used,utilization.gpu --format=csv
git log --oneline -1 2>/dev/null || true
step() {
    local name=$1 limit=$2; shift 2
    echo "=== $name start $(date -u +%T)"
    timeout "$limit" "$@" > "$JOB/$name.txt" 2>&1
    echo "=== $name rc=$? end $(date -u +%T)"
    tail -n 3 "$JOB/$name.txt"
}
# XLA:CPU's pool for the steps that compare sizes: "default" leaves BOLTZMANN_HOST_THREADS unset
# (the code's choice), anything else ("all", a count) sets it
use_pool() {
    if [ "$1" = default ]; then unset BOLTZMANN_HOST_THREADS; else export BOLTZMANN_HOST_THREADS=$1; fi
}
for s in ${STEPS:-cb d first_run profile}; do
    case $s in
    tables)
        step tables 420 python scripts/bench_tables.py --cosmologies 128 \
            --shapes rolled,n1u1,n0u1i,n1u1i --out "$JOB/tables128"
        step tables256 240 python scripts/bench_tables.py --cosmologies 256 --chunk 256 \
            --shapes n1u1i --out "$JOB/tables256" ;;
    hosttables)
        step hosttables 60 python scripts/bench_tables.py --cosmologies 1 --device cpu \
            --shapes rolled,n1u1i --repeats 7
        step hosttables_1core 60 taskset -c 0 python scripts/bench_tables.py --cosmologies 1 \
            --device cpu --shapes rolled,n1u1i --repeats 7
        XLA_FLAGS="--xla_cpu_multi_thread_eigen=false" step hosttables_noeigen 60 \
            python scripts/bench_tables.py --cosmologies 1 --device cpu --shapes rolled,n1u1i \
            --repeats 7 ;;
    hostprof)
        for T in ${POOLS:-default all}; do
            use_pool "$T"
            step "hostprof_$T" 200 python scripts/profile_host.py --backend cuda --jacobian \
                --repeat 10
        done
        unset BOLTZMANN_HOST_THREADS ;;
    pools)
        # XLA:CPU's pool size on the host (BOLTZMANN_HOST_THREADS; "default": the code's, one
        # thread on a GPU machine; "all": JAX's, a thread per CPU) against one P(k) and the
        # Jacobian, whose inputs run on the host: a process per size in POOLS, side by side
        for T in ${POOLS:-default all 4}; do
            use_pool "$T"
            step "pool_$T" 300 python scripts/bench_gpu.py --parts cd --backends cuda --budget 280 \
                --row-limit 250 --grad-batch "${GRAD_BATCH:-16}" --out "$JOB/pool_$T"
        done
        unset BOLTZMANN_HOST_THREADS ;;
    dirwarps)
        # the sensitivity kernel's direction warps per block at most (BOLTZMANN_DIRECTION_WARPS;
        # "default": the kernel's own) against the Jacobian and the batched value-and-Jacobian,
        # a process each, side by side
        for DW in ${DIR_WARPS:-default 1}; do
            if [ "$DW" = default ]; then unset BOLTZMANN_DIRECTION_WARPS; else export BOLTZMANN_DIRECTION_WARPS=$DW; fi
            step "dirwarps_$DW" 420 python scripts/bench_gpu.py --parts d --backends cuda \
                --budget 400 --row-limit 380 --grad-sec "${GRAD_SEC:-config}" \
                --grad-batch "${GRAD_BATCH:-64}" --out "$JOB/dirwarps_$DW"
        done
        unset BOLTZMANN_DIRECTION_WARPS ;;
    ncu)
        # Nsight Compute on one warm launch of the plain warp kernel (bench_gpu part c) and of the
        # sensitivity kernel (part d): stall reasons, occupancy, memory traffic
        NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
        if [ -z "$NCU" ]; then
            echo "=== ncu: not found on this machine"
        else
            step ncu_plain 300 "$NCU" --clock-control none --set full -k regex:kernel --launch-skip 4 --launch-count 1 \
                -o "$JOB/ncu_plain" python scripts/bench_gpu.py --parts c --backends cuda \
                --budget 250 --row-limit 200 --no-work
            "$NCU" --import "$JOB/ncu_plain.ncu-rep" --page details > "$JOB/ncu_plain.txt" 2>&1
            step ncu_sens 300 "$NCU" --clock-control none --set full -k regex:sens_kernel --launch-skip 1 \
                --launch-count 1 -o "$JOB/ncu_sens" python scripts/bench_gpu.py --parts d \
                --backends cuda --budget 250 --row-limit 200 --grad-batch 4 --no-work
            "$NCU" --import "$JOB/ncu_sens.ncu-rep" --page details > "$JOB/ncu_sens.txt" 2>&1
        fi ;;
    order)
        step order 420 python scripts/bench_jacobian_kinds.py --backend cuda \
            --variants direct,ascending,ur_fluid_k_tau=30 --cosmologies 1 256 --repeats 3 \
            --out "$JOB/order" ;;
    cb)
        step bench_cb 420 python scripts/bench_gpu.py --parts cb --cosmologies 256 --backends cuda \
            --budget 400 --row-limit 300 --out "$JOB/cb" ;;
    kstride)
        step bench_kstride 420 python scripts/bench_gpu.py --parts b --cosmologies 256 \
            --backends cuda --k-solve-stride 1 4 --budget 400 --row-limit 300 \
            --out "$JOB/kstride" ;;
    d)
        step bench_d 600 python scripts/bench_gpu.py --parts d --backends cuda --budget 560 \
            --row-limit 500 --grad-sec "${GRAD_SEC:-1,0.1,0}" --grad-batch "${GRAD_BATCH:-64}" \
            --out "$JOB/d" ;;
    first_run|first_run_grad)
        # issue 14's H200 targets: the main job (first_run) or `--gradients` (first_run_grad)
        # on CUDA, empty cache, twice; once per XLA:CPU pool in FR_POOLS (default "default";
        # "all": JAX's pool), each on its own cache
        for T in ${FR_POOLS:-default}; do
            use_pool "$T"
            if [ "$s" = first_run ]; then
                rm -rf "$CACHE.$T"
                step "first_run_$T" 300 python scripts/bench_first_run.py --backend cuda \
                    --cache-dir "$CACHE.$T" --out "$JOB/fr_$T"
            else
                rm -rf "$CACHE.grad.$T"
                step "first_run_grad_$T" 540 python scripts/bench_first_run.py --backend cuda \
                    --gradients --cache-dir "$CACHE.grad.$T" --out "$JOB/fr_grad_$T"
            fi
        done
        unset BOLTZMANN_HOST_THREADS ;;
    cl)
        step bench_cl 300 python scripts/bench_cl.py --config configs/planck_cl.yaml \
            --backend cuda --runs 3 --los-batch 1,auto --out "$JOB/cl" ;;
    sens_launch)
        # SENS_PARTS (default "cl d"): which Jacobians, in that order for every launch
        for L in ${SENS_LAUNCHES:-host ffi}; do
            for part in ${SENS_PARTS:-cl d}; do
                if [ "$part" = cl ]; then
                    step "cl_grad_sens_$L" 560 env BOLTZMANN_CUDA_SENS_LAUNCH="$L" python \
                        scripts/bench_cl.py --config configs/planck_cl.yaml --backend cuda \
                        --gradients --runs 3 --out "$JOB/cl_grad_sens_$L"
                else
                    step "d_sens_$L" 400 env BOLTZMANN_CUDA_SENS_LAUNCH="$L" python \
                        scripts/bench_gpu.py --parts d --backends cuda --budget 380 \
                        --row-limit 360 --grad-sec config --grad-batch "${GRAD_BATCH:-64}" \
                        --out "$JOB/d_sens_$L"
                fi
            done
        done ;;
    compare)
        step compare 400 python scripts/compare_sens_launch.py --config lcdm --repeats 3 ;;
    cl_jvp)
        # the C_l Jacobian's spectra stage part by part, value against jvp
        step cl_jvp 400 python scripts/profile_cl_jvp.py --repeat 3 ;;
    cl_grad)
        # the C_l Jacobian's ratio to a value call: ClFunction's value and Jacobian, warm, side
        # by side, once per entry of CL_SEC (comma-separated; default: ClFunction's own)
        IFS=',' read -ra ws <<< "${CL_SEC:-default}"
        for e in "${ws[@]}"; do
            w=${e%/*}; tag=$(echo "$e" | tr /+ __); arg=()
            if [ "$w" != default ]; then arg=(--sec-weight "$w"); fi
            if [ "$e" != "$w" ]; then arg+=(--direction-block "$(echo "${e#*/}" | tr + ,)"); fi
            step "bench_cl_grad_$tag" 560 python scripts/bench_cl.py --config configs/planck_cl.yaml \
                --backend cuda --gradients --runs 3 "${arg[@]}" --out "$JOB/cl_grad_$tag"
        done ;;
    sources)
        step sources 240 python scripts/profile_sources.py --backend cuda --repeat 3 ;;
    forms)
        step forms 240 python scripts/profile_los_forms.py --backend cuda --repeat 3 ;;
    cl_parts)
        step cl_los 300 python scripts/profile_line_of_sight.py --backend cuda --repeat 3
        step cl_lensing 200 python scripts/profile_lensing.py --methods recurrence,tables ;;
    profile)
        step profile 120 python -m cProfile -o "$JOB/third.prof" scripts/transfer.py \
            --config lcdm --backend cuda --cache-dir "$CACHE.default" --out /tmp/prof_out --no-plot
        python -c "import pstats, sys; pstats.Stats(sys.argv[1]).sort_stats('cumulative').print_stats(60)" \
            "$JOB/third.prof" > "$JOB/profile_top.txt" 2>&1
        python -X importtime scripts/transfer.py --config lcdm --backend cuda --cache-dir "$CACHE.default" \
            --out /tmp/prof_out --no-plot 2> "$JOB/importtime.txt" > /dev/null ;;
    tests)
        # groups separated by ';' run as parallel pytest processes (the host has 16 cores; the
        # tests mostly compile and run their JAX references there)
        # default: every GPU test file in five groups (four groups took up to 360 s each on an
        # H100 host, the slowest two being test_cuda_backend + test_cuda_ffi and the warp,
        # helper and cache files)
        IFS=';' read -ra groups <<< "${GPU_TESTS:-tests/test_cuda_backend.py;tests/test_cuda_ffi.py tests/test_cuda_kernel_cache.py;tests/test_cuda_sensitivity.py tests/test_cuda_ffi_sens.py;tests/test_cmb_gpu.py;tests/test_cuda_warp.py tests/test_kernel_helper.py tests/test_cuda_sens_cache.py}"
        i=0
        for g in "${groups[@]}"; do
            step tests$i "${TESTS_LIMIT:-420}" python -m pytest -o addopts="" -m gpu -v \
                -p no:cacheprovider --durations=30 $g &
            i=$((i + 1))
        done
        wait ;;
    esac
done
echo "=== ALL DONE $(date -u +%T)"
