#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine needs to build and test omni-offload:
# the compiler toolchain and Debian -dev packages (gRPC, protobuf, yaml-cpp, GoogleTest, ...),
# ccache, and LibTorch from the torch==2.11.0 wheel on PyPI. Safe to run again: it only
# installs what is missing.
set -euo pipefail

TORCH_VERSION=2.11.0
PYTHON=${PYTHON:-python3}
APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libgtest-dev libgmock-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libyaml-cpp-dev nlohmann-json3-dev libabsl-dev libpcre2-dev
  libsndfile1-dev libpng-dev libjpeg62-turbo-dev libsoxr-dev libcli11-dev
  libavcodec-dev libavformat-dev libavutil-dev libswscale-dev ffmpeg
  iproute2 libcpp-httplib-dev chromium chromium-driver openssl
)

log() { echo "[setup] $*"; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  as_root apt-get update -q
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

torch_dir() {
  "$PYTHON" -c "import importlib.util as u; s = u.find_spec('torch'); print(s.submodule_search_locations[0] if s else '')"
}
installed_torch() {
  "$PYTHON" -m pip show torch 2>/dev/null | sed -n 's/^Version: //p'
}

if [ "$(installed_torch)" != "$TORCH_VERSION" ]; then
  # --no-deps: LibTorch is all we need. The wheel's Python dependencies and the ~3 GB of
  # nvidia-* CUDA libraries are not needed to build, nor to run on the CPU.
  log "installing torch==$TORCH_VERSION (LibTorch) from PyPI"
  "$PYTHON" -m pip install -q --no-deps "torch==$TORCH_VERSION"
fi
TORCH_DIR=$(torch_dir)
[ -f "$TORCH_DIR/lib/libtorch_cpu.so" ] || { echo "[setup] LibTorch missing in '$TORCH_DIR'" >&2; exit 1; }

# libtorch_cpu links the CUDA runtime and CUPTI (for the profiler). Machines with the CUDA 13
# toolkit have them; elsewhere take them from PyPI, where the wheel's RPATH finds them.
if ldd "$TORCH_DIR/lib/libtorch_cpu.so" | grep -q "not found"; then
  log "CUDA runtime libraries for libtorch_cpu not found; installing them from PyPI"
  "$PYTHON" -m pip install -q "cuda-toolkit[cudart,cupti]==13.0.2"
  if ldd "$TORCH_DIR/lib/libtorch_cpu.so" | grep "not found"; then
    echo "[setup] libtorch_cpu.so still misses the libraries above" >&2
    exit 1
  fi
fi
# libtorch_cuda.so needs three CUDA libraries that the cuda-toolkit[cudart,cupti] runtime above
# does not bring: cuFile, cuSPARSELt and NVSHMEM. Without them CMake cannot link the CUDA engine
# and prints "CUDA transfer engine: off". Install each missing one at the version the torch
# wheel itself pins (its METADATA), and no more of the ~3 GB of nvidia-* wheels.
torch_pin() {  # torch_pin NAME: the version torch's METADATA pins NAME to (empty if none)
  "$PYTHON" - "$1" <<'PY'
import importlib.metadata as m, re, sys
for r in m.requires("torch") or []:
    found = re.match(re.escape(sys.argv[1]) + r"(\[[^\]]*\])?==([\w.]+)", r)
    if found:
        print(found.group(2))
        break
PY
}
cuda_requirements=()
missing_cuda=$(ldd "$TORCH_DIR/lib/libtorch_cuda.so" 2>/dev/null | grep "not found" || true)
for entry in libcufile:cuda-toolkit:cufile libcusparseLt:nvidia-cusparselt-cu13: \
             libnvshmem_host:nvidia-nvshmem-cu13:; do
  IFS=: read -r lib package extra <<<"$entry"
  grep -q "$lib\.so" <<<"$missing_cuda" || continue
  version=$(torch_pin "$package")
  [ -n "$version" ] || { echo "[setup] the torch wheel pins no version of $package" >&2; exit 1; }
  cuda_requirements+=("$package${extra:+[$extra]}==$version")
done
if [ ${#cuda_requirements[@]} -gt 0 ]; then
  log "libraries libtorch_cuda.so needs; installing from PyPI: ${cuda_requirements[*]}"
  "$PYTHON" -m pip install -q "${cuda_requirements[@]}"
fi
if ldd "$TORCH_DIR/lib/libtorch_cuda.so" | grep "not found"; then
  echo "[setup] libtorch_cuda.so still misses the libraries above" >&2
  exit 1
fi

# Test-time only: the openai client and selenium the serving tests drive `vllm-omni serve` with.
API_REQUIREMENTS="$(dirname "$0")/../tests/requirements-api.txt"
api_missing=0
while IFS='=' read -r name _ version; do
  case "$name" in ''|\#*) continue ;; esac
  [ "$("$PYTHON" -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')" = "$version" ] ||
    api_missing=1
done < "$API_REQUIREMENTS"
if [ "$api_missing" = 1 ]; then
  log "installing the serving tests' Python packages ($API_REQUIREMENTS)"
  "$PYTHON" -m pip install -q -r "$API_REQUIREMENTS"
fi
log "ready: LibTorch $TORCH_VERSION at $TORCH_DIR"
