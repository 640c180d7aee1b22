#!/usr/bin/env bash
# One device call: the engine's CUDA tests, then both allocation benchmarks.
# Usage on the device machine, from the repo root:  bash bench/gpu_run.sh "$OUT"
# Each step is bounded so the whole run ends well inside one 10-minute call; a failing step
# does not stop the next. Everything lands in $OUT (8 files at most come back).
set -u
OUT=${1:-${OUT:-/tmp/out}}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
start=$(date +%s)
left() { echo $(( 570 - ($(date +%s) - start) )); }
if ls .whl_gpu/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl_gpu/*.whl
fi
export PYTHONPATH=.:/tmp/site
{
  date -u +%FT%TZ
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import sys, torch, cuda.bindings, pytest; print(sys.version.split()[0], torch.__version__, torch.version.cuda, 'cuda-bindings', cuda.bindings.__version__, 'pytest', pytest.__version__)"
  nproc; free -g | head -2
} > "$OUT/env.txt" 2>&1

run() {  # run NAME SECONDS CMD...: bounded, its exit status recorded in env.txt
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@"
  local rc=$?
  echo "step $name rc=$rc seconds=$(( $(date +%s) - t0 ))" >> "$OUT/env.txt"
}

run pytest_gpu 90 python3 -m pytest -q -m gpu tests/engine -p no:cacheprovider -rA \
  > "$OUT/pytest.log" 2>&1
run gpu_alloc 200 python3 bench/gpu_alloc.py --out "$OUT/gpu_alloc.json" > "$OUT/gpu_alloc.log" 2>&1
run transition $(( $(left) > 220 ? 220 : $(left) )) \
  env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 bench/transition_bench.py --device cuda --alloc-conf expandable \
  --out "$OUT/transition.json" > "$OUT/transition.log" 2>&1
run pytest_engine $(( $(left) > 120 ? 120 : $(left) )) python3 -m pytest -q tests/engine \
  -p no:cacheprovider -rs >> "$OUT/pytest.log" 2>&1
if [ "$(left)" -gt 100 ]; then
  env -u PYTORCH_CUDA_ALLOC_CONF bash -c "timeout $(( $(left) - 10 )) python3 bench/transition_bench.py \
    --device cuda --alloc-conf default --skip-freetoken --out '$OUT/transition_default.json' \
    > '$OUT/transition_default.log' 2>&1; echo step transition_default rc=\$? >> '$OUT/env.txt'"
fi
echo "total seconds=$(( $(date +%s) - start ))" >> "$OUT/env.txt"
cat "$OUT/env.txt"
