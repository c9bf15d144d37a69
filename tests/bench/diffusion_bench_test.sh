#!/usr/bin/env bash
# diffusion-bench's smoke run: one preset at its real widths, cut to one transformer block (per
# expert), one text-encoder layer, the template tokenizer's vocabulary, 32x32 pixels and 2
# steps, under every strategy. Checks that each strategy prints its line, with finite output
# equal to the resident run's, and that phase offload streamed weights each step; then phase
# offload again without guidance (--cfg off, the same folder): the same bytes a step, since
# both guidance passes share each block's visit. The figures themselves are the bench's to
# report (bench/RESULTS.md), not a test's.
#   diffusion_bench_test.sh DIFFUSION_BENCH [qwen-image|wan-a14b]   (default qwen-image)
# qwen-image writes 1.5 GB and peaks at 2.9 GB of RSS, about a minute on 2 cores; wan-a14b
# writes 3.1 GB and peaks at 4.8 GB, about 100 s. Exit 77 (skipped) without python3 or
# /proc/meminfo, or where the temp dir or the memory is short (twice the RSS when the temp dir
# is a tmpfs, whose files are memory too).
set -euo pipefail
bench=$1
model=${2:-qwen-image}
skip() {
  echo "SKIP: $*"
  exit 77
}
case $model in
  qwen-image) vocab=448 output=images need_gib=4 ;;  # the tiny fixture's text encoder's
  wan-a14b) vocab=384 output=frames need_gib=6 ;;
  *)
    echo "unknown preset '$model'"
    exit 2
    ;;
esac
command -v python3 >/dev/null || skip "needs python3 to read diffusion-bench's JSON"
[[ -r /proc/meminfo ]] || skip "needs /proc/meminfo to check the available memory"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/omni_diffusion_bench.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
gib=$((1024 * 1024))
free_kb=$(df -Pk "$tmp" | awk 'NR == 2 { print $4 }')
avail_kb=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)
need_kb=$((need_gib * gib))
[[ $(stat -f -c %T "$tmp") == tmpfs ]] && need_kb=$((2 * need_gib * gib))
if ((free_kb < 4 * gib || avail_kb < need_kb)); then
  skip "needs 4 GiB free in $tmp (has $((free_kb / gib))) and $((need_kb / gib)) GiB of" \
    "available memory (has $((avail_kb / gib)))"
fi
strategies=resident,model,layerwise,phase,ratio,disk
run() {
  "$bench" --model "$model" --layers 1 --text-layers 1 --vocab "$vocab" --height 32 --width 32 \
    --steps 2 --work-dir "$tmp/folder" --keep "$@"
}
run --strategies "$strategies" | tee "$tmp/out.jsonl"
run --strategies phase --cfg off | tee "$tmp/no_cfg.jsonl"
python3 - "$tmp/out.jsonl" "$tmp/no_cfg.jsonl" "$model" "$output" "$strategies" <<'PY'
import json, sys

path, no_cfg_path, model, output, strategies = sys.argv[1:]
def read(p):
    with open(p) as f:
        return [json.loads(line) for line in f if line.startswith("{")]
lines = read(path)
runs = {l["strategy"]: l for l in lines if "strategy" in l}
no_cfg = {l["strategy"]: l for l in read(no_cfg_path) if "strategy" in l}
failures = []
if not any("synthetic_folder" in l for l in lines):
    failures.append("no synthetic_folder line")
for name in strategies.split(","):
    r = runs.get(name)
    if r is None:
        failures.append(f"no {name} line")
        continue
    if r.get("model") != model or r.get("steps") != 2:
        failures.append(f"{name}: model or steps are off: {r}")
    if r.get(f"{output}_finite") is not True:
        failures.append(f"{name}: {output} are not finite")
    if name != "resident" and r.get(f"{output}_equal_to_resident") is not True:
        failures.append(f"{name}: {output} differ from the resident run's")
# One block per transformer: the block windows hold it, but phase offload streams its phases.
if "phase" in runs and runs["phase"].get("h2d_bytes_per_step", 0) <= 0:
    failures.append("phase offload moved nothing per step")
if runs.get("phase", {}).get("cfg") is not True or no_cfg.get("phase", {}).get("cfg") is not False:
    failures.append(f"cfg on / off not reported: {runs.get('phase')} {no_cfg.get('phase')}")
elif runs["phase"]["h2d_bytes_per_step"] != no_cfg["phase"]["h2d_bytes_per_step"]:
    failures.append("phase offload with guidance moved other bytes a step than without: "
                    f"{runs['phase']['h2d_bytes_per_step']} != "
                    f"{no_cfg['phase']['h2d_bytes_per_step']}")
for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
PY
