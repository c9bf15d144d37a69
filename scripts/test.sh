#!/usr/bin/env bash
# The test command (.ci/run runs exactly this): set up, build everything with warnings as
# errors and the CUDA engine compiled and linked (it cannot run here), run every test suite,
# the format/lint checks, then the suites again under ASan+UBSan and under ThreadSanitizer.
#   scripts/test.sh
# Environment (for development; CI sets none of them):
#   OMNI_WITH_CUDA=AUTO      build without the CUDA engine where no CUDA toolkit is installed
#   OMNI_SKIP_LINT=1         without scripts/lint.sh
#   OMNI_SKIP_ASAN=1         without the ASan+UBSan build (scripts/asan.sh)
#   OMNI_SKIP_TSAN=1         without the ThreadSanitizer build (scripts/tsan.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
scripts/setup.sh
# OMNI_WITH_CUDA=ON: configure fails, and so does CI, when the CUDA engine cannot be linked.
scripts/build.sh build -DOMNI_BUILD_TESTS=ON -DOMNI_WERROR=ON -DOMNI_WITH_CUDA="${OMNI_WITH_CUDA:-ON}"
# One intra-op thread per test: ctest already runs one test per core, and LibTorch's default
# of a thread per core on top of that oversubscribes the machine (slower, noisier timings).
(cd build && OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} ctest --output-on-failure --parallel "$(nproc)")

[ "${OMNI_SKIP_LINT:-0}" = 1 ] || scripts/lint.sh build
[ "${OMNI_SKIP_ASAN:-0}" = 1 ] || scripts/asan.sh
[ "${OMNI_SKIP_TSAN:-0}" = 1 ] || scripts/tsan.sh
echo "scripts/test.sh: all passed in $(( $(date +%s) - start )) s"
