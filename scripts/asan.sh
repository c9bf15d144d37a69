#!/usr/bin/env bash
# The whole ctest suite built with AddressSanitizer and UndefinedBehaviorSanitizer and run: a
# use-after-free, an overflow, a leak or undefined behaviour in our code fails its test.
# The CUDA engine is left out (no device here; its host-side rules run on the simulated device).
set -euo pipefail
cd "$(dirname "$0")/.."
# -O1 -g1: line tables are all a report needs, and full debug info of LibTorch's templates
# would double the build.
CMAKE_BUILD_TYPE=RelWithDebInfo scripts/build.sh build-asan -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DOMNI_SANITIZE=address,undefined -DOMNI_WITH_CUDA=OFF -DOMNI_CUDA_COMPILE_CHECK=OFF
jobs=$(nproc)  # before OMP_NUM_THREADS, which nproc obeys
export OMP_NUM_THREADS=1
export ASAN_OPTIONS="detect_leaks=1 abort_on_error=1 strict_init_order=1"
export UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1"
# Left out: the real-shape bench test (it writes a 5 GB checkpoint and holds 7.8 GB of RSS even
# without ASan; its code paths run in the model_runner suites), the configure-only build test,
# and the serve load test, whose bound is on the server's RSS: ASan's quarantine holds freed
# memory on purpose, so that bound does not hold under ASan.
(cd build-asan && ctest --output-on-failure --parallel "$jobs" -LE '^(bench|build)$' \
  -E '^worker_serve_load$')
