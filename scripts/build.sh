#!/usr/bin/env bash
# Configures and builds into a build directory (default: build).
#   scripts/build.sh [BUILD_DIR] [extra cmake arguments...]
# Environment: OMNI_BUILD_TARGETS (default: all), CMAKE_BUILD_TYPE (default: Release).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
shift || true

# shellcheck source=scripts/ccache_env.sh
. scripts/ccache_env.sh

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-Release}" "$@"
# shellcheck disable=SC2086
cmake --build "$BUILD_DIR" --parallel "$(nproc)" ${OMNI_BUILD_TARGETS:+--target $OMNI_BUILD_TARGETS}
