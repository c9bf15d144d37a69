#!/usr/bin/env bash
# The engine's test suites built with -fsanitize=thread and run. LibTorch itself is not
# instrumented, so intra-op parallelism (OpenMP threads TSan cannot see) is turned off:
# the threads under test are ours (the simulated copy stream and its callers).
set -euo pipefail
cd "$(dirname "$0")/.."
OMNI_BUILD_TARGETS=cpu_offload_tests \
  CMAKE_BUILD_TYPE=RelWithDebInfo scripts/build.sh build-tsan \
  -DOMNI_SANITIZE=thread -DOMNI_BUILD_BENCH=OFF -DOMNI_BUILD_SERVER=OFF -DOMNI_CUDA_COMPILE_CHECK=OFF
export OMP_NUM_THREADS=1
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
(cd build-tsan && ctest --output-on-failure --parallel "$(nproc)" -L cpu_offload)
