#!/usr/bin/env bash
# The main job: set up, build, and run offload-bench on the tiny embedded diffusion pipeline
# under each strategy (simulated device on the CPU; pass --device cuda on a GPU machine).
# Each line printed is one JSON object; outputs_equal_to_resident must be true everywhere.
#   scripts/run_main.sh [extra offload-bench options...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
OMNI_BUILD_TARGETS=offload-bench scripts/build.sh build

bench=build/bench/offload-bench
status=0
for args in "--strategy none" "--strategy model" "--strategy model --strict-vae" \
            "--strategy layerwise" "--strategy layerwise --num-gpu-layers 2" \
            "--strategy layerwise --granularity phase" "--strategy layerwise --offload-ratio 0.5"; do
  # shellcheck disable=SC2086
  line=$($bench $args "$@")
  echo "$line"
  case "$line" in *'"outputs_equal_to_resident": true'*) ;; *) status=1 ;; esac
done
exit $status
