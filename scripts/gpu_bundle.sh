#!/usr/bin/env bash
# Gathers, on this (Debian) machine, what the GPU machine's build needs and cannot fetch: it has
# no network and no GoogleTest, CLI11, nlohmann-json, PCRE2, libsndfile, libpng, libjpeg or
# libsoxr development package that we can count on. Writes .gpu-deps/ (ignored by git, about
# 10 MB, within a device call's 64 MiB `carry`):
#   debs/        the Debian packages (headers, .pc files, shared libraries, pkgconf)
#   googletest/  GoogleTest's sources (OMNI_GTEST_SOURCE_DIR)
#   cli11/CLI/   CLI11's headers (OMNI_CLI11_INCLUDE_DIR)
# On the GPU machine, `. scripts/gpu_env.sh` unpacks and points the build at them.
#   scripts/gpu_bundle.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu-deps
packages=(
  nlohmann-json3-dev
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  libsndfile1-dev libsndfile1 libflac12 libmp3lame0 libmpg123-0 libogg0 libopus0 libvorbis0a
  libvorbisenc2
  # sndfile.pc requires these .pc files (Requires.private): pkg-config refuses it without them
  libflac-dev libogg-dev libvorbis-dev libopus-dev libmpg123-dev
  libpng-dev libpng16-16 zlib1g-dev zlib1g
  libjpeg62-turbo-dev libjpeg62-turbo
  libsoxr-dev libsoxr0
  pkgconf pkgconf-bin libpkgconf3
)
for dir in /usr/src/googletest /usr/include/CLI; do
  [[ -e $dir ]] || { echo "gpu_bundle: $dir is missing: run scripts/setup.sh first" >&2; exit 1; }
done
# Built in a scratch folder and moved into place at the end, so that a failed download leaves
# the previous bundle (or none) rather than a partial one.
tmp=$(mktemp -d "$PWD/.gpu-deps.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/debs" "$tmp/cli11"
(cd "$tmp/debs" && apt-get download "${packages[@]}" >/dev/null)
cp -r /usr/src/googletest "$tmp/googletest"
cp -r /usr/include/CLI "$tmp/cli11/"
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "gpu_bundle: $out ($(du -sh "$out" | cut -f1)): ${#packages[@]} packages, GoogleTest, CLI11"
