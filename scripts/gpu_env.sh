# shellcheck shell=bash
# Sourced on the GPU machine (`. scripts/gpu_env.sh`, from the repository root) after
# scripts/gpu_bundle.sh's .gpu-deps/ was carried there. Unpacks its Debian packages into
# .gpu-deps/root (once) and points CMake, pkg-config and the loader at them:
#   PKG_CONFIG_LIBDIR, PKG_CONFIG_SYSROOT_DIR  the bundle's .pc files only, paths into the root
#   CMAKE_PREFIX_PATH                           nlohmann-json's CMake package
#   PATH                                        pkgconf, where the machine has no pkg-config
#   LD_LIBRARY_PATH                             the libraries and what they need (libFLAC, ...)
#   OMNI_GPU_CMAKE_ARGS                         GoogleTest's sources and CLI11's headers
# Then: scripts/build.sh build-gpu -DOMNI_WITH_CUDA=ON -DOMNI_BUILD_SERVER=OFF $OMNI_GPU_CMAKE_ARGS
omni_deps="$PWD/.gpu-deps"
if [[ ! -d $omni_deps/debs ]]; then
  echo "gpu_env: no $omni_deps/debs: run scripts/gpu_bundle.sh on the Debian machine and carry .gpu-deps" >&2
  return 1
fi
if [[ ! -d $omni_deps/root ]]; then
  mkdir -p "$omni_deps/root.part"
  for deb in "$omni_deps"/debs/*.deb; do dpkg -x "$deb" "$omni_deps/root.part" || return 1; done
  mv "$omni_deps/root.part" "$omni_deps/root"
fi
omni_lib="$omni_deps/root/usr/lib/x86_64-linux-gnu"
export PKG_CONFIG_LIBDIR="$omni_lib/pkgconfig:$omni_deps/root/usr/share/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$omni_deps/root"
export CMAKE_PREFIX_PATH="$omni_deps/root/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
command -v pkg-config >/dev/null || export PATH="$omni_deps/root/usr/bin:$PATH"
export LD_LIBRARY_PATH="$omni_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMNI_GPU_CMAKE_ARGS="-DOMNI_GTEST_SOURCE_DIR=$omni_deps/googletest -DOMNI_CLI11_INCLUDE_DIR=$omni_deps/cli11"
unset omni_deps omni_lib
