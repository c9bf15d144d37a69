#!/usr/bin/env bash
# The one-command GPU check: on the GPU machine (H100/H200, 16 cores, torch 2.11.0+cu130, nvcc
# 13, CMake, ninja, no network), from the repository root with scripts/gpu_bundle.sh's .gpu-deps
# carried along, it builds in Release with the CUDA engine (only what the check needs), runs
# every test case parameterised on cuda, then short thinker-bench, speech-bench and
# offload-bench runs on --device cuda, in at most 8 minutes including the build.
#   scripts/gpu_check.sh OUT_DIR
# OUT_DIR gets environment.txt, <step>.log for each step, the benches' JSON lines
# (<bench>.jsonl), tests.junit.xml and summary.json (step, status, seconds). Exit status 0 only
# when every step passed; a failed step does not stop the later ones.
# Environment:
#   OMNI_GPU_CHECK_DEVICE      cuda (default), or cpu: the simulated device stands in, without
#                              -DOMNI_WITH_CUDA=ON (AUTO); everything else is the same
#   OMNI_GPU_CHECK_BUILD_DIR   build directory (default: build-gpucheck)
#   OMNI_GPU_CHECK_TIME_SCALE  integer factor on every step's time limit and on the total
#                              budget (default 1; a 2-core stand-in needs about 30)
#   OMNI_GPU_CHECK_BUDGET_S    the steps' budget (default 465 s times the scale: with the 10 s a
#                              killed step may take to exit, the run ends within 8 minutes)
# The step functions are called by name (run_step), which shellcheck cannot follow:
# shellcheck disable=SC2317
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
root=$PWD

if [[ $# -ne 1 ]]; then
  echo "usage: scripts/gpu_check.sh OUT_DIR" >&2
  exit 2
fi
mkdir -p "$1" || exit 2
out=$(cd "$1" && pwd) || exit 2
device=${OMNI_GPU_CHECK_DEVICE:-cuda}
if [[ $device != cuda && $device != cpu ]]; then
  echo "gpu_check: OMNI_GPU_CHECK_DEVICE='$device': use cuda or cpu" >&2
  exit 2
fi
build=${OMNI_GPU_CHECK_BUILD_DIR:-build-gpucheck}
[[ $build == /* ]] || build=$root/$build
scale=${OMNI_GPU_CHECK_TIME_SCALE:-1}
[[ $scale =~ ^[1-9][0-9]*$ ]] || { echo "gpu_check: OMNI_GPU_CHECK_TIME_SCALE must be a positive integer" >&2; exit 2; }
budget=${OMNI_GPU_CHECK_BUDGET_S:-$((465 * scale))}
cores=$(nproc)
# Benches' synthetic checkpoints (3.8 GB for the real-shape one) go to a scratch folder, not
# OUT_DIR: a device call copies OUT_DIR back.
work=$(mktemp -d "${TMPDIR:-/tmp}/omni_gpu_check.XXXXXX") || exit 2
trap 'rm -rf "$work"' EXIT
# shellcheck source=scripts/ccache_env.sh
. "$root/scripts/ccache_env.sh"

# The test sources with device-parameterised cases (testing::all_devices()) or CUDA-only cases
# (at::hasCUDA()); the build step maps them to their test targets through build.ninja.
test_source_pattern='all_devices\(\)|hasCUDA\(\)'
# The cases to run: the parameter suffix of device-parameterised cases (".../cuda",
# ".../cuda_layerwise"; ctest's names go on with "  # GetParam() = cuda"), and the CUDA-only
# cases (SamplerTest.CudaLogitsSampleLikeCpu, ...).
test_regex="/${device}([_ ]|\$)|Cuda"
benches=(thinker-bench speech-bench offload-bench)

start=$SECONDS
deadline=$((start + budget))
steps=() statuses=() seconds=() notes=()
failed=0

# Runs "$@" within what is left of the current step's time ($step_deadline); 124 when it ran out.
# The trace goes to stderr: the benches' stdout is their JSON.
within() {
  local left=$((step_deadline - SECONDS))
  if ((left <= 0)); then
    echo "gpu_check: no time left for: $*" >&2
    return 124
  fi
  echo "+ $* (limit ${left}s)" >&2
  timeout -k 10 "$left" "$@"
}

# Records `status` (ok, failed, timeout, skipped) for a step and rewrites summary.json, so that
# a run cut short still leaves the steps done so far.
record() {
  steps+=("$1") statuses+=("$2") seconds+=("$3") notes+=("$4")
  [[ $2 == ok ]] || failed=1
  write_summary
}

# A JSON string of $1: quotes and backslashes escaped, control characters made spaces.
json_string() {
  local s=${1//\\/\\\\}
  s=${s//\"/\\\"}
  printf '"%s"' "${s//[$'\001'-$'\037']/ }"
}

write_summary() {
  local i
  {
    printf '{"device": %s, "ok": %s, "seconds": %d, "budget_seconds": %d, "cores": %d,\n' \
      "$(json_string "$device")" "$([[ $failed == 0 ]] && echo true || echo false)" \
      $((SECONDS - start)) "$budget" "$cores"
    printf ' "build_dir": %s, "test_regex": %s, "steps": [' "$(json_string "$build")" \
      "$(json_string "$test_regex")"
    for i in "${!steps[@]}"; do
      ((i > 0)) && printf ','
      printf '\n  {"step": %s, "status": %s, "seconds": %d, "note": %s}' \
        "$(json_string "${steps[i]}")" "$(json_string "${statuses[i]}")" "${seconds[i]}" \
        "$(json_string "${notes[i]}")"
    done
    printf '\n]}\n'
  } >"$out/summary.json"
}

# run_step NAME CAP_SECONDS: runs step_NAME with its output in OUT_DIR/NAME.log, within
# min(CAP * scale, what is left of the budget); a step may set `note` for the summary.
run_step() {
  local name=$1 cap=$(($2 * scale)) rc t0 status
  local left=$((deadline - SECONDS))
  ((cap < left)) || cap=$left
  if ((cap < 5)); then
    echo "== $name: skipped (the ${budget}s budget is spent)"
    record "$name" skipped 0 "no time left in the ${budget}s budget"
    return
  fi
  note=""
  step_deadline=$((SECONDS + cap))
  t0=$SECONDS
  echo "== $name (limit ${cap}s, log $out/$name.log)"
  "step_${name//-/_}" >"$out/$name.log" 2>&1
  rc=$?
  status=ok
  if ((rc == 124 || rc == 137)) || ((SECONDS > step_deadline)); then
    status=timeout
  elif ((rc != 0)); then
    status=failed
  fi
  if [[ $status != ok ]]; then
    [[ -n $note ]] || note="exit status $rc"
    echo "-- $name: $status ($note); the log's end:"
    tail -n 25 "$out/$name.log" | sed 's/^/   | /'
  fi
  echo "-- $name: $status in $((SECONDS - t0))s${note:+: $note}"
  record "$name" "$status" $((SECONDS - t0)) "$note"
}

# check_jsonl FILE COUNT KEY...: the bench printed COUNT JSON lines (nothing else on stdout),
# each on the device asked for, none with KEY false (the run's outputs differ from no offload),
# and every run but "none" copied weights to the device.
check_jsonl() {
  local file=$1 count=$2
  shift 2
  if ! command -v python3 >/dev/null; then
    note="no python3 to read $file"
    return 1
  fi
  local result
  result=$(python3 - "$file" "$count" "$device" "$@" <<'PY'
import json, sys
path, count, device, keys = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
rows, bad = [], []
with open(path) as f:
    for n, line in enumerate(f, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError as e:
            bad.append(f"line {n} is not JSON ({e}): {line.strip()[:100]}")
if len(rows) != count:
    bad.append(f"{len(rows)} JSON lines, expected {count}")
labels = []
for r in rows:
    label = "/".join(str(r[k]) for k in ("pipeline", "strategy", "expert_cache_budget")
                     if r.get(k))
    labels.append(label)
    if not str(r.get("device", "")).startswith(device):
        bad.append(f"{label}: device {r.get('device')!r}, not {device}")
    bad += [f"{label}: {k} is false" for k in keys if r.get(k) is False]
    # An offload strategy that moved nothing measured nothing (a window holding every block).
    if r.get("strategy") != "none" and r.get("bytes_h2d") == 0:
        bad.append(f"{label}: no bytes copied to the device")
print("; ".join(bad) if bad else f"{len(rows)} runs ({', '.join(labels)}), outputs equal")
sys.exit(1 if bad else 0)
PY
)
  local rc=$?
  echo "check: $result"
  note=$result
  return "$rc"
}

step_environment() {
  local nvcc torch_line fail=0
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "check device: $device, build dir: $build, budget: ${budget}s, cores: $cores"
    echo "host: $(uname -srm)"
    grep -m1 '^model name' /proc/cpuinfo
    grep -E '^(MemTotal|MemAvailable)' /proc/meminfo
    echo "== git"
    git rev-parse HEAD 2>&1 || echo "(no git repository here)"
    git status --short 2>/dev/null | head -n 30
    echo "== bundle: $([[ -n ${OMNI_GPU_CMAKE_ARGS:-} ]] && echo ".gpu-deps ($OMNI_GPU_CMAKE_ARGS)" || echo "none: system packages")"
    echo "== nvidia-smi"
    within nvidia-smi 2>&1 || { echo "(nvidia-smi failed)"; [[ $device == cpu ]] || fail=1; }
    within nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max \
      --format=csv 2>&1 || true
    echo "== nvcc ($nvcc)"
    within "$nvcc" --version 2>&1 || echo "(no nvcc)"
    echo "== torch ($(command -v python3))"
    torch_line=$(within python3 -c 'import torch; print("torch", torch.__version__, "cuda",
      torch.version.cuda, "cuda available", torch.cuda.is_available())' 2>/dev/null)
    echo "${torch_line:-(importing torch failed)}"
    # On the GPU machine the wheel must see the device, or every CUDA case would skip.
    [[ $torch_line == *"available True"* || ($device == cpu && -n $torch_line) ]] || fail=1
    echo "== tools"
    cmake --version | head -n 1
    echo "ninja $(ninja --version)"
    c++ --version | head -n 1
    echo "ccache: $(command -v ccache || echo none)"
  } >"$out/environment.txt"
  cat "$out/environment.txt"
  ((fail == 0)) || note="no GPU or no torch: see environment.txt"
  return "$fail"
}

step_configure() {
  local args=(-S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DOMNI_BUILD_SERVER=OFF)
  local -a bundle_args
  # The stand-in takes AUTO: the CUDA engine is then compiled where a toolkit and the CUDA
  # wheel are found (as here), and its cases skip for want of a device.
  [[ $device == cuda ]] && args+=(-DOMNI_WITH_CUDA=ON)
  if [[ -n ${OMNI_GPU_CMAKE_ARGS:-} ]]; then
    # The bundle's GoogleTest and CLI11, even where packages exist (as on the Debian machine),
    # so the stand-in builds what the GPU machine builds.
    read -r -a bundle_args <<<"$OMNI_GPU_CMAKE_ARGS"
    args+=("${bundle_args[@]}" -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON
      -DCMAKE_DISABLE_FIND_PACKAGE_CLI11=ON)
  fi
  within cmake "${args[@]}" || return
  note=$(grep -h -o "CUDA transfer engine: [a-z]*" "$out/configure.log" | tail -n 1)
}

# The test targets holding the matched sources: build.ninja compiles each source as
# "build <dir>/CMakeFiles/<target>.dir/<file>.o: ... <absolute source path>".
gpu_test_targets() {
  local src
  grep -rlE --include='*.cc' "$test_source_pattern" "$root/tests" | sort | while read -r src; do
    sed -n "s|^build [^ ]*CMakeFiles/\([^/ ]*\)\.dir/[^ ]*\.o: [^ ]* ${src}\( .*\)\?\$|\1|p" \
      "$build/build.ninja"
  done | sort -u
}

step_build() {
  local targets
  mapfile -t targets < <(gpu_test_targets)
  if ((${#targets[@]} == 0)); then
    note="no test target compiles the CUDA-parameterised sources (configure failed?)"
    return 1
  fi
  printf '%s\n' "${targets[@]}" >"$build/gpu_check_test_targets.txt"
  echo "targets: ${targets[*]} ${benches[*]}"
  note="${#targets[@]} test targets + ${#benches[@]} benches"
  # -k 0: a target that fails to compile leaves the others to build, and their steps to run.
  within cmake --build "$build" --parallel "$cores" --target "${targets[@]}" "${benches[@]}" \
    -- -k 0
}

step_tests() {
  local targets missing=() t listed rc=0 skipped summary
  mapfile -t targets <"$build/gpu_check_test_targets.txt" 2>/dev/null
  # ctest lists an unbuilt test binary as <target>_NOT_BUILT, which the regex would not match:
  # its cases would silently not run.
  listed=$(ctest --test-dir "$build" -N 2>&1)
  for t in "${targets[@]}"; do
    grep -q "${t}_NOT_BUILT" <<<"$listed" && missing+=("$t")
  done
  ((${#missing[@]} == 0)) || { echo "not built: ${missing[*]}"; rc=1; }
  echo "cases: $(ctest --test-dir "$build" -N -R "$test_regex" | grep -c 'Test *#')"
  # One intra-op thread per test, as scripts/test.sh: ctest runs several at once.
  OMP_NUM_THREADS=1 within ctest --test-dir "$build" -R "$test_regex" --no-tests=error \
    --output-on-failure --parallel "$((cores < 8 ? cores : 8))" \
    --output-junit "$out/tests.junit.xml" || rc=$?
  summary=$(grep -h -o '[0-9]*% tests passed.*' "$out/tests.log" | tail -n 1)
  skipped=$(grep -c '(Skipped)' "$out/tests.log")
  note="${summary:-no ctest summary}, $skipped skipped${missing[*]:+, not built: ${missing[*]}}"
  # On the GPU a skipped CUDA case means the engine found no usable device: that is a failure.
  if [[ $device == cuda ]] && ((skipped > 0)); then
    echo "CUDA cases skipped on the GPU machine: the CUDA engine did not find a usable device"
    ((rc != 0)) || rc=1
  fi
  return "$rc"
}

# Sets `bin` to the bench's executable; fails where the build did not make it.
bench_bin() {
  bin=$build/bench/$1
  [[ -x $bin ]] && return 0
  echo "$bin was not built"
  note="$1 was not built"
  return 1
}

step_thinker_bench() {
  local jsonl=$out/thinker-bench.jsonl rc=0
  bench_bin thinker-bench || return 1
  : >"$jsonl"
  # Every strategy on the small synthetic thinker (MoE, encoders, media), tokens against none.
  within "$bin" --device "$device" --synthetic small --work-dir "$work/thinker-small" --tokens 8 \
    --strategies none,alternating,sequential,layerwise,layerwise-decoder,experts,experts-layerwise \
    --expert-cache-budgets 25% >>"$jsonl" || rc=$?
  # Real layer shapes (2 layers, 3.8 GB bf16): 9 MiB experts read from disk in place into pinned
  # entries (1 GiB host budget), which the small preset's experts are too small for.
  within "$bin" --device "$device" --synthetic real --synthetic-layers 2 \
    --work-dir "$work/thinker-real2" --tokens 4 --strategies none,experts \
    --expert-cache-budgets 10% --host-memory-budget 1GiB --raw-read-bytes 256MiB --no-warmup \
    --no-media >>"$jsonl" || rc=$?
  check_jsonl "$jsonl" 9 tokens_equal_to_none || rc=$((rc ? rc : 1))
  return "$rc"
}

step_speech_bench() {
  local jsonl=$out/speech-bench.jsonl rc=0
  bench_bin speech-bench || return 1
  : >"$jsonl"
  within "$bin" --device "$device" --synthetic tiny --work-dir "$work/speech" --tokens 6 \
    --frames 8 --repeats 1 \
    --strategies none,thinker-talker,talker-code2wav,talker-layers,layerwise \
    >>"$jsonl" || rc=$?
  check_jsonl "$jsonl" 5 codes_equal_to_none wav_equal_to_none || rc=$((rc ? rc : 1))
  return "$rc"
}

step_offload_bench() {
  local jsonl=$out/offload-bench.jsonl rc=0 s
  local -a wan
  bench_bin offload-bench || return 1
  : >"$jsonl"
  for s in none model layerwise; do
    within "$bin" --device "$device" --pipeline tiny --strategy "$s" >>"$jsonl" || rc=$?
  done
  within "$bin" --device "$device" --pipeline small --strategy layerwise --num-gpu-layers 2 \
    --steps 2 >>"$jsonl" || rc=$?
  # Wan2.1-14B's DiT blocks (700 MB each, bf16): copies of real size overlapping compute; 3
  # blocks, as a window of 1 (and 1 prefetched) holds 2. The one difference of the stand-in:
  # 16 tokens per step instead of the preset's 4096, which would take the CPU many minutes.
  wan=()
  [[ $device == cuda ]] || wan=(--latent-size 8)
  within "$bin" --device "$device" --pipeline wan14b --blocks 3 --steps 2 "${wan[@]}" \
    --strategy layerwise >>"$jsonl" || rc=$?
  check_jsonl "$jsonl" 5 outputs_equal_to_resident || rc=$((rc ? rc : 1))
  return "$rc"
}

# The bundle (GoogleTest, CLI11, the runner's libraries) where it was carried; sourced here,
# not in a step, since its LD_LIBRARY_PATH must reach the tests and benches.
if [[ -d $root/.gpu-deps ]]; then
  # gpu_env.sh is checked on its own.
  # shellcheck source=/dev/null
  . "$root/scripts/gpu_env.sh" || { echo "gpu_check: scripts/gpu_env.sh failed" >&2; failed=1; }
elif [[ $device == cuda ]]; then
  echo "gpu_check: no .gpu-deps (scripts/gpu_bundle.sh): using the machine's own packages" >&2
fi
echo "gpu_check: device $device, ${cores} cores, budget ${budget}s, output in $out"
run_step environment 30
run_step configure 60
run_step build 270
run_step tests 90
run_step thinker-bench 90
run_step speech-bench 45
run_step offload-bench 75
write_summary

echo
printf '%-14s %-8s %8s  %s\n' step status seconds note
for i in "${!steps[@]}"; do
  printf '%-14s %-8s %8d  %s\n' "${steps[i]}" "${statuses[i]}" "${seconds[i]}" "${notes[i]}"
done
printf '%-14s %-8s %8d\n' total "$([[ $failed == 0 ]] && echo ok || echo FAILED)" $((SECONDS - start))
echo "gpu_check: logs, JSON lines and summary.json in $out"
exit "$failed"
