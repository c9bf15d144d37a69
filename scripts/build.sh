#!/usr/bin/env bash
# Configures and builds into a build directory (default: build).
#   scripts/build.sh [BUILD_DIR] [extra cmake arguments...]
# Environment: OMNI_BUILD_TARGETS (default: all), CMAKE_BUILD_TYPE (default: Release).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
shift || true

# ccache: one cache for every build directory of this checkout (paths relative to it), and
# the settings that let it cache precompiled-header builds.
export CCACHE_BASEDIR="$PWD"
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-5G}

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-Release}" "$@"
# shellcheck disable=SC2086
cmake --build "$BUILD_DIR" --parallel "$(nproc)" ${OMNI_BUILD_TARGETS:+--target $OMNI_BUILD_TARGETS}
