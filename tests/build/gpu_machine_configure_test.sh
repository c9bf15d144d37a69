#!/usr/bin/env bash
# The GPU machine's build recipe (README, "GPU machine") configures: no
# GoogleTest or CLI11 package there, so both come from copies (OMNI_GTEST_SOURCE_DIR,
# OMNI_CLI11_INCLUDE_DIR), and no server parts. Here the packages exist, so they are hidden
# from find_package. Configure only: a GPU session's device time should not go to a CMake
# error (GoogleTest 1.11+ sources defining GTest::gtest themselves once broke this).
#   gpu_machine_configure_test.sh SOURCE_DIR CMAKE
# Exit 77 (skipped) without GoogleTest's sources or CLI11's headers to copy.
set -euo pipefail
src=$1
cmake=$2
gtest=/usr/src/googletest
cli11=/usr/include/CLI
if [[ ! -f $gtest/CMakeLists.txt || ! -f $cli11/CLI.hpp ]]; then
  echo "SKIP: needs GoogleTest's sources ($gtest) and CLI11's headers ($cli11)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r "$gtest" "$tmp/gtest-src"
mkdir -p "$tmp/cli11" && cp -r "$cli11" "$tmp/cli11/"
"$cmake" -S "$src" -B "$tmp/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DOMNI_BUILD_SERVER=OFF -DOMNI_GTEST_SOURCE_DIR="$tmp/gtest-src" \
  -DOMNI_CLI11_INCLUDE_DIR="$tmp/cli11" \
  -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON -DCMAKE_DISABLE_FIND_PACKAGE_CLI11=ON >"$tmp/configure.log" 2>&1 ||
  { cat "$tmp/configure.log"; echo "FAIL: the GPU machine's recipe does not configure"; exit 1; }
expect() {
  grep -q -- "$1" "$2" || { cat "$tmp/configure.log"; echo "FAIL: no '$1' in $2"; exit 1; }
}
expect "Server parts (gRPC + YAML): OFF" "$tmp/configure.log"
expect "CLI11: found" "$tmp/configure.log"
# GoogleTest is built from the copy, and the engine's suites and the benchmarks are there.
expect "googletest" "$tmp/build/build.ninja"
expect "cpu_offload_expert_cache_test" "$tmp/build/build.ninja"
expect "thinker-bench" "$tmp/build/build.ninja"
echo "the GPU machine's recipe configures (GoogleTest from source, CLI11 from a copy, no server)"
