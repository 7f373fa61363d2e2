#!/usr/bin/env bash
# Measure one GPU for clustersim (issue 23 item 9; docs/calibration.md, "Measured GPUs"):
# kernel sweeps, layer sweeps (split backward, overlap, host; sizes; burst against sustained
# clocks), `calibrate --backend nccl`,
# and single-GPU bf16 training runs of GPT-3 1.3B, 2.7B and 6.7B compared with their
# predictions. Everything lands in $RESULTS (default
# ./gpu-results) and, when $OUT is set, as $OUT/results.tgz after each step, so a run cut
# off at its time limit still returns what it measured.
#
#   bash benchmarks/measure_gpu.sh   # torch with CUDA, clustersim installed; run it outside the
#                                    # checkout when clustersim is installed from a wheel
#   STEPS="sizes clocks" bash benchmarks/measure_gpu.sh   # only these steps, in this script's order
#
# Each step has its own time limit; a failed step is logged and the next one runs. Together
# the limits exceed one device call's 10 minutes (a lent machine's whole session is 15): pick
# STEPS (kernels layers sizes clocks calibrate validate; each step's time on an H100 is in
# topologies/measurements/own/README.md) to fit the time you have.
set -u
STEPS=" ${STEPS:-kernels layers sizes clocks calibrate validate} "
for s in $STEPS; do
    case " kernels layers sizes clocks calibrate validate " in
        *" $s "*) ;;
        *) echo "error: STEPS: unknown step '$s' (kernels layers sizes clocks calibrate validate)" >&2
           exit 2 ;;
    esac
done
export PYTHONUNBUFFERED=1
RESULTS=${RESULTS:-$PWD/gpu-results}
mkdir -p "$RESULTS/validate"
export CLUSTERSIM_DATA_DIR=$RESULTS/data  # calibrations land here, not in the user's folder
PY=${PYTHON:-python3}

save() {  # pack what exists so far where the device tool returns it
    if [ -n "${OUT:-}" ]; then tar czf "$OUT/results.tgz" -C "$(dirname "$RESULTS")" \
        "$(basename "$RESULTS")"; fi
}

step() {  # step NAME SECONDS COMMAND...: run with a limit, log it, keep going on failure
    local name=$1 limit=$2; shift 2
    case "$STEPS" in *" ${name%%-*} "*) ;; *) return 0 ;; esac  # validate-gpt-* is "validate"
    echo "== $name ($(date -u +%T))"
    local start=$SECONDS
    timeout "$limit" "$@" >"$RESULTS/$name.log" 2>&1
    local rc=$?
    echo "   rc=$rc in $((SECONDS - start)) s; last lines:"
    tail -n 4 "$RESULTS/$name.log" | sed 's/^/   /'
    save
}

nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,power.limit,driver_version \
    --format=csv >"$RESULTS/nvidia-smi.csv" 2>&1
cat "$RESULTS/nvidia-smi.csv"
step kernels 180 "$PY" -m clustersim.validation.kernels --out "$RESULTS/kernels"
step layers 300 "$PY" -m clustersim.validation.layer_kernels --out "$RESULTS/layers" --rounds 3
step sizes 300 "$PY" -m clustersim.validation.layer_sizes --out "$RESULTS/sizes" --rounds 2
step clocks 150 "$PY" -m clustersim.validation.clocks --out "$RESULTS/clocks" --rounds 2
step calibrate 240 "$PY" -m clustersim calibrate --backend nccl --nproc 1 \
    --out "$RESULTS/calibrated.json"

PROFILE=()
[ -f "$RESULTS/calibrated.json" ] && PROFILE=(--profile "$RESULTS/calibrated.json")
GPT=$(cd "$(dirname "$0")/.." && pwd)/examples/validate-gpt-1.3b-gpu.yaml
declare -A SHAPES=(
    [gpt-1.3b]=""
    [gpt-2.7b]="--set model.layers=32 --set model.hidden=2560 --set model.heads=32
                --set training.global_batch=16 --set training.micro_batch=2"
    [gpt-6.7b]="--set model.layers=32 --set model.hidden=4096 --set model.heads=32
                --set training.global_batch=8 --set training.micro_batch=1")
for name in gpt-1.3b gpt-2.7b gpt-6.7b; do
    # shellcheck disable=SC2086  # the overrides split into words on purpose
    step "validate-$name" 240 "$PY" -m clustersim validate "$GPT" ${SHAPES[$name]} \
        --backend nccl --nproc 1 --steps 5 "${PROFILE[@]}" --json \
        --out "$RESULTS/validate/$name"
done
echo "== done ($(date -u +%T))"
