#!/usr/bin/env bash
# The main job: set up, build, and run offload-bench on the tiny embedded diffusion pipeline
# under each strategy (simulated device on the CPU; pass --device cuda on a GPU machine), then
# thinker-bench on the tiny Qwen3-Omni checkpoint. Each line printed is one JSON object;
# outputs_equal_to_resident / tokens_equal_to_none must be true everywhere.
#   scripts/run_main.sh [extra offload-bench options...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
OMNI_BUILD_TARGETS="offload-bench thinker-bench" scripts/build.sh build

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

# The Qwen3-Omni thinker (tiny Hugging Face checkpoint of the test fixtures: text + audio +
# image prompt) with no offload, component offload of visual + audio_tower (alternating,
# sequential) and layerwise decoder layers; the tokens must equal the no-offload run.
thinker=build/bench/thinker-bench
while IFS= read -r line; do
  echo "$line"
  case "$line" in *'"tokens_equal_to_none": false'*) status=1 ;; esac
done < <($thinker --model tests/fixtures/qwen3_omni_tiny --tokens 32 || echo '{"error": true, "tokens_equal_to_none": false}')
exit $status
