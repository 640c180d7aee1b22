#!/usr/bin/env bash
# On the GPU machine (device tool), from the repo root, with `.whl` (bash
# ../shared/ftserve-gpu/fetch_wheels.sh) and `.ftserve` (filler.py and make_tiny_moe.py copied
# from ../shared/ftserve-gpu) carried:  bash bench/ftserve_e2e.sh "$OUT" [--phases default_boot]
# Installs the wheels, builds the tiny checkpoint, runs bench/ftserve_e2e.py into $1 (the other
# arguments go to it).
set -uo pipefail
out=${1:?output folder}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl > "$out/pip.log" 2>&1 || { tail -5 "$out/pip.log"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export TVM_FFI_CACHE_DIR=/tmp/cache/tvm TRITON_CACHE_DIR=/tmp/cache/triton \
  FREETOKEN_KERNEL_CACHE_DIR=/tmp/cache/ft
[ -d /tmp/tiny-moe ] || python3 .ftserve/make_tiny_moe.py --arch qwen3_5_moe --out /tmp/tiny-moe \
  > "$out/checkpoint.log" 2>&1 || { tail -20 "$out/checkpoint.log"; exit 1; }
python3 bench/ftserve_e2e.py --out "$out" --model /tmp/tiny-moe --filler .ftserve/filler.py \
  --leave-gib 10 "${@:2}"
