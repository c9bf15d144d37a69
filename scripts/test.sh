#!/usr/bin/env bash
# The test command: set up, build everything (the CUDA engine is compiled even where it
# cannot run), run every test suite, then the engine's suites under ThreadSanitizer.
#   scripts/test.sh            everything
#   OMNI_SKIP_TSAN=1 scripts/test.sh   without the ThreadSanitizer pass
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh build -DOMNI_BUILD_TESTS=ON
# One intra-op thread per test: ctest already runs one test per core, and LibTorch's default
# of a thread per core on top of that oversubscribes the machine (slower, noisier timings).
(cd build && OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} ctest --output-on-failure --parallel "$(nproc)")

if [ "${OMNI_SKIP_TSAN:-0}" != "1" ]; then
  scripts/tsan.sh
fi
