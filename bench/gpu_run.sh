#!/usr/bin/env bash
# GPU benchmark steps for one device call (each call may run for 10 minutes at most).
# Usage on the device machine, from the repo root:
#   bash bench/gpu_run.sh "$OUT" STEP[:SECONDS] ...
# Steps:
#   pytest_gpu      the engine's CUDA tests (-m gpu)
#   gpu_alloc       bench/gpu_alloc.py: torch + expandable segments vs raw VMM
#   step_under_decode  bench/step_under_decode.py: a 3 GiB KV -> experts conversion at 99 %
#                   fill while decoding, incremental vs freetoken (16 GiB emulated card);
#                   writes transition.json
#   rung_pairs      bench/rung_pairs.py --mode engine: sampled rung pairs of the four
#                   geometries (GEOMETRIES="a b" picks), real OOMs and torch peaks
#                   (16 GiB emulated card); writes transitions.json
#   policy_agentic  bench/policy_bench.py on the agentic trace, every arm (ladder-agentic.json
#                   + PNG)
#   policy_mixed    the same on the mixed trace
#   policy_smoke    4 agentic requests, 3 arms: the CUDA path works, and how fast it decodes
#   policy_seeds    bench/policy_bench.py --seeds "$SEEDS" over "$TRACES" (default: seed 0 of
#                   agentic, mixed, handoff) with "$SEED_ARMS" and "$REQUESTS" requests a trace,
#                   into ladder-seeds.json; RESUME=DIR goes on from DIR/ladder-seeds.json, so one
#                   call per (trace, seed) builds the many-seed file; KV_STEP=32k sets the
#                   moe-ladder arms' ladder step (default the daemon's); PASSES=2 runs the
#                   arms twice in a row (A B A B), so a ratio's spread within the call shows;
#                   the speed probe (bench/probe.py) runs before every arm and after the last
#                   unless PROBE=0; PIN_CPU=N runs the bench on host CPU N only (taskset), to
#                   test whether the host's two decode speeds (docs/results.md) follow the
#                   process moving between CPUs
# Each step is bounded by its SECONDS (defaults below) and a failing step does not stop the
# next; its exit status and duration land in $OUT/env.txt. At most 8 files come back from a
# device call: each step writes one JSON and one log (policy steps a PNG too). The files keep
# the names of the recorded runs in bench/results, which RESUME reads.
set -u
OUT=${1:?usage: gpu_run.sh OUT STEP[:SECONDS] ...}
shift
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=.:/tmp/site
{
  date -u +%FT%TZ
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda)"
  nproc; free -g | head -2
  # What might set this call's speed (docs/results.md: calls ran up to 1.3x apart): the host's
  # CPU, its load, and the GPU's clocks and power state now.
  grep -m1 'model name' /proc/cpuinfo; uptime
  lscpu | grep -E '^(Thread|Core|Socket|NUMA node)' || true
  nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu,pstate \
    --format=csv
} >> "$OUT/env.txt" 2>&1  # appended: one call may run this script more than once

# Arms in the order the targets need them, so a step cut short keeps the comparisons that count;
# ARMS=a,b,... overrides it (one device call holds about five arms of a full trace).
# RESUME=DIR goes on from DIR/ladder-TRACE.json (an earlier call's file, carried in the tree):
# its arms are kept and only the missing ones run.
ARMS=${ARMS:-static-full,grow-only,headroom,oracle,throughput,pinned-0,static-short}
RESUME=${RESUME:-}
# policy_seeds: issue 18's comparison, every arm of a (trace, seed) in one call; at full size
# a trace's arms outlast a 10-minute call, so the default request count is cut to fit.
SEEDS=${SEEDS:-0}
TRACES=${TRACES:-agentic,mixed,handoff}
REQUESTS=${REQUESTS:-10}
SEED_ARMS=${SEED_ARMS:-static-full,freetoken-static-full,grow-only,pinned-0,headroom,freetoken-grow-only,freetoken-pinned-0,oracle}
GEOMETRIES=${GEOMETRIES:-rtx5080-report-16gb qwen38-flash-next-rtx5090-32gb \
  qwen38-flash-next-rtx6000ada-48gb gemma-4-26b-a4b-like-rtx4080super-16gb}
EXPANDABLE=expandable_segments:True

step() {  # step NAME SECONDS: run one named step, bounded
  local name=$1 limit=$2 t0 rc
  t0=$(date +%s)
  case $name in
    pytest_gpu)
      timeout -k 10 "$limit" python3 -m pytest -q -m gpu tests/engine -p no:cacheprovider -rA \
        > "$OUT/pytest-gpu.log" 2>&1 ;;
    gpu_alloc)
      timeout -k 10 "$limit" python3 bench/gpu_alloc.py --out "$OUT/gpu_alloc.json" \
        > "$OUT/gpu_alloc.log" 2>&1 ;;
    step_under_decode)
      PYTORCH_CUDA_ALLOC_CONF=$EXPANDABLE timeout -k 10 "$limit" \
        python3 bench/step_under_decode.py --device cuda --alloc-conf expandable \
        --out "$OUT/transition.json" \
        > "$OUT/transition.log" 2>&1 ;;
    rung_pairs)
      # shellcheck disable=SC2046  # one --geometry flag per word
      PYTORCH_CUDA_ALLOC_CONF=$EXPANDABLE timeout -k 10 "$limit" python3 bench/rung_pairs.py \
        --mode engine --device cuda $(printf -- '--geometry %s ' $GEOMETRIES) \
        --out "$OUT/transitions.json" \
        > "$OUT/transitions.log" 2>&1 ;;
    policy_agentic|policy_mixed)
      local trace=${name#policy_} resume=()
      [ -n "$RESUME" ] && [ -f "$RESUME/ladder-$trace.json" ] && \
        resume=(--resume "$RESUME/ladder-$trace.json")
      PYTORCH_CUDA_ALLOC_CONF=$EXPANDABLE timeout -k 10 "$limit" python3 bench/policy_bench.py \
        --device cuda --trace "$trace" --output-scale 8 --arms "$ARMS" "${resume[@]}" \
        --out "$OUT/ladder-$trace.json" --plot "$OUT/ladder-$trace.png" \
        > "$OUT/ladder-$trace.log" 2>&1 ;;
    policy_seeds)
      local resume=()
      [ -n "$RESUME" ] && [ -f "$RESUME/ladder-seeds.json" ] && \
        resume=(--resume "$RESUME/ladder-seeds.json")
      # shellcheck disable=SC2086  # PIN_CPU=N: taskset -c N, three words
      PYTORCH_CUDA_ALLOC_CONF=$EXPANDABLE timeout -k 10 "$limit" \
        ${PIN_CPU:+taskset -c "$PIN_CPU"} python3 bench/policy_bench.py \
        --device cuda --trace "$TRACES" --seeds "$SEEDS" --requests "$REQUESTS" \
        --output-scale 8 --arms "$SEED_ARMS" ${KV_STEP:+--kv-step "$KV_STEP"} \
        --passes "${PASSES:-1}" $([ "${PROBE:-1}" = 0 ] && echo --no-probe) "${resume[@]}" \
        --out "$OUT/ladder-seeds.json" > "$OUT/ladder-seeds.log" 2>&1 ;;
    policy_smoke)
      PYTORCH_CUDA_ALLOC_CONF=$EXPANDABLE timeout -k 10 "$limit" python3 bench/policy_bench.py \
        --device cuda --trace agentic --requests 4 --output-scale 8 \
        --arms static-full,headroom,oracle --out "$OUT/ladder-smoke.json" \
        > "$OUT/ladder-smoke.log" 2>&1 ;;
    *)
      echo "gpu_run.sh: unknown step $name" >&2; return 2 ;;
  esac
  rc=$?
  echo "step $name rc=$rc seconds=$(( $(date +%s) - t0 ))" >> "$OUT/env.txt"
}

declare -A DEFAULT_S=([pytest_gpu]=90 [gpu_alloc]=200 [step_under_decode]=220 [rung_pairs]=300
                      [policy_agentic]=560 [policy_mixed]=560 [policy_smoke]=120
                      [policy_seeds]=560)
for spec in "$@"; do
  name=${spec%%:*}
  seconds=${spec#*:}
  [ "$seconds" = "$spec" ] && seconds=${DEFAULT_S[$name]:-300}
  step "$name" "$seconds"
done
cat "$OUT/env.txt"
