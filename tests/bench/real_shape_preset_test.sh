#!/usr/bin/env bash
# The real-shape preset in CI (issue: "CI uses a 2-4-layer variant"): Qwen3-Omni-30B-A3B's
# text-layer shapes (hidden 2048, 32/4 heads, 128 experts top-8 of 9 MiB, vocab 152064) cut to
# 3 decoder layers, bf16 with the real tensor names (5.0 GB), written by thinker-bench. Expert
# offload and the disk tier must give the resident run's greedy tokens, and expert offload
# must move at most a tenth of layerwise offload's bytes per decode token.
#   real_shape_preset_test.sh THINKER_BENCH
# Exit 77 (skipped) without python3 or /proc/meminfo, or where the temp dir has under 10 GiB
# free or the machine under 10 GiB of available memory (15 GiB when the temp dir is a tmpfs,
# whose files are memory too): the checkpoint takes 5 GB, and the runs peak at 7.8 GB of RSS.
# About a minute on 2 cores (55 s measured); ctest runs it alone (RUN_SERIAL).
set -euo pipefail
bench=$1
skip() {
  echo "SKIP: $*"
  exit 77
}
command -v python3 >/dev/null || skip "needs python3 to read thinker-bench's JSON"
[[ -r /proc/meminfo ]] || skip "needs /proc/meminfo to check the available memory"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/omni_real_shape.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
gib=$((1024 * 1024))
free_kb=$(df -Pk "$tmp" | awk 'NR == 2 { print $4 }')
avail_kb=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)
need_kb=$((10 * gib))
[[ $(stat -f -c %T "$tmp") == tmpfs ]] && need_kb=$((15 * gib))
if ((free_kb < 10 * gib || avail_kb < need_kb)); then
  skip "needs 10 GiB free in $tmp (has $((free_kb / gib))) and $((need_kb / gib)) GiB of" \
    "available memory (has $((avail_kb / gib)))"
fi
# ctest runs this test alone (RUN_SERIAL): LibTorch may take every core, not the one thread a
# test gets when tests run side by side (scripts/test.sh exports OMP_NUM_THREADS=1).
unset OMP_NUM_THREADS
common=(--expert-cache-budgets 10% --tokens 6 --no-warmup --no-media --raw-read-bytes 0)
"$bench" --synthetic real --synthetic-layers 3 --work-dir "$tmp/ckpt" \
  --strategies none,layerwise-decoder,experts "${common[@]}" | tee "$tmp/device.jsonl"
"$bench" --model "$tmp/ckpt" --strategies none,experts,experts-layerwise \
  --host-memory-budget 1GiB "${common[@]}" | tee "$tmp/disk.jsonl"
python3 - "$tmp/device.jsonl" "$tmp/disk.jsonl" <<'PY'
import json, sys

def runs(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.startswith("{")]

device, disk = runs(sys.argv[1]), runs(sys.argv[2])
failures = []
by = {r["strategy"]: r for r in device}
for where, rs, names in (("device", device, ("none", "layerwise-decoder", "experts")),
                         ("disk tier", disk, ("none", "experts", "experts-layerwise"))):
    for name in names:
        if name not in {r["strategy"] for r in rs}:
            failures.append(f"no {name} run among the {where} runs")
for where, rs in (("on the device", device), ("with the disk tier", disk)):
    for r in rs:
        if r["strategy"] != "none" and r.get("tokens_equal_to_none") is not True:
            failures.append(f"{r['strategy']} {where}: tokens differ from the resident run's")
if not failures:
    layerwise = by["layerwise-decoder"]["bytes_h2d_per_decode_token"]
    experts = by["experts"]["bytes_h2d_per_decode_token"]
    if layerwise <= 0:
        print("FAIL: layerwise moved nothing per decode token (its window holds every layer)")
        sys.exit(1)
    print(f"bytes per decode token: layerwise {layerwise / 1e6:.1f} MB, experts (10%) "
          f"{experts / 1e6:.1f} MB ({experts / layerwise:.2%})")
    if not 0 < experts <= layerwise / 10:
        failures.append("expert offload moves more than a tenth of layerwise's bytes per token")
for r in disk:
    if r["strategy"] == "none":
        continue
    reads = r.get("expert_disk", {}).get("reads", 0)
    print(f"{r['strategy']} from disk: {reads} expert reads, tokens equal: "
          f"{r.get('tokens_equal_to_none')}")
    if reads == 0:
        failures.append(f"{r['strategy']}: no expert was read from disk under the host budget")
for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
PY
