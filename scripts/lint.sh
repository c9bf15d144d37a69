#!/usr/bin/env bash
# Format, shell and C++ lint checks; exits non-zero on the first kind that has findings.
#   scripts/lint.sh [BUILD_DIR]      BUILD_DIR (default: build) holds compile_commands.json
# Environment:
#   OMNI_LINT_BASE   clang-tidy checks the C++ files that differ from this commit (default:
#                    HEAD~5, about one submission; the working tree's changes count too)
#   OMNI_LINT_ALL=1  clang-tidy checks every C++ source of the tree (about 15 min on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
failed=0

# Tracked and new (untracked, not ignored) files alike.
cxx_files() { git ls-files -co --exclude-standard "$@" -- '*.cc' '*.h'; }

echo "[lint] clang-format --dry-run --Werror over $(cxx_files | wc -l) files"
if ! cxx_files -z | xargs -0 clang-format --dry-run --Werror; then
  echo "[lint] format findings: run clang-format -i on the files above" >&2
  failed=1
fi

mapfile -t shell_scripts < <(git ls-files -co --exclude-standard -- '*.sh' .ci/run)
echo "[lint] shellcheck over ${#shell_scripts[@]} scripts"
if ! shellcheck -x "${shell_scripts[@]}"; then
  failed=1
fi

# clang-tidy reads the build's compile commands, less the precompiled header: the build's PCH
# is GCC's and clang refuses it; without it each file parses its own includes, as it must.
if [ ! -f "$BUILD_DIR/compile_commands.json" ]; then
  echo "[lint] $BUILD_DIR/compile_commands.json missing: configure first (scripts/build.sh)" >&2
  exit 1
fi
lint_db="$BUILD_DIR/lint"
mkdir -p "$lint_db"
python3 - "$BUILD_DIR/compile_commands.json" "$lint_db/compile_commands.json" <<'PY'
import json, re, sys
entries = json.load(open(sys.argv[1]))
for entry in entries:
    entry["command"] = re.sub(r" -Winvalid-pch -include \S+cmake_pch\.hxx", "", entry["command"])
json.dump(entries, open(sys.argv[2], "w"))
PY

# The sources to check: those in the compile database (a header is checked through the
# sources that include it, see HeaderFilterRegex in .clang-tidy).
if [ "${OMNI_LINT_ALL:-0}" = 1 ]; then
  mapfile -t changed < <(cxx_files | grep '\.cc$')
else
  base=${OMNI_LINT_BASE:-HEAD~5}
  git rev-parse -q --verify "$base^{commit}" >/dev/null || base=$(git rev-list --max-parents=0 HEAD)
  mapfile -t changed < <({ git diff --name-only "$base" -- '*.cc'; git ls-files -o \
    --exclude-standard -- '*.cc'; } | sort -u)
fi
mapfile -t sources < <(python3 - "$lint_db/compile_commands.json" "${changed[@]}" <<'PY'
import json, os, sys
known = {os.path.realpath(e["file"]) for e in json.load(open(sys.argv[1]))}
for path in sys.argv[2:]:
    if os.path.exists(path) and os.path.realpath(path) in known:
        print(path)
PY
)
echo "[lint] clang-tidy over ${#sources[@]} changed sources"
if [ ${#sources[@]} -gt 0 ]; then
  tidy_log=$(mktemp)
  trap 'rm -f "$tidy_log"' EXIT
  # One file per process, one process per core. .clang-tidy makes every finding an error, so
  # a finding is a non-zero exit; the "N warnings generated" lines count suppressed ones.
  if ! printf '%s\0' "${sources[@]}" |
       xargs -0 -n 1 -P "$(nproc)" clang-tidy -p "$lint_db" --quiet >"$tidy_log" 2>&1; then
    grep -vE "^[0-9]+ warnings?( and [0-9]+ errors?)? generated\.$" "$tidy_log" >&2 || true
    echo "[lint] clang-tidy findings above" >&2
    failed=1
  fi
fi

if [ "$failed" = 0 ]; then
  echo "[lint] clean"
fi
exit "$failed"
