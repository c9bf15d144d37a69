#!/usr/bin/env bash
# Sourced by the build scripts: one ccache for every build directory of this checkout (paths
# relative to it, so a clone elsewhere hits too), with the settings that let it cache
# precompiled-header builds.
CCACHE_BASEDIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export CCACHE_BASEDIR
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-5G}
