#!/usr/bin/env bash
# thinker-bench's KV figures on the tiny checkpoint: a batch of 4 rows with 40-token prompts
# decoding 40 tokens copies KV history as its growable caches grow, and none in a block pool
# (--kv-block-size). Seconds.
#   kv_pool_bench_test.sh THINKER_BENCH FIXTURE_DIR
# Exit 77 (skipped) without python3 to read thinker-bench's JSON.
set -euo pipefail
bench=$1
fixture=$2
command -v python3 >/dev/null || { echo "SKIP: needs python3"; exit 77; }
common=(--model "$fixture" --strategies none --tokens 40 --batch-sizes 4 --batch-context 40
  --no-warmup --no-media --raw-read-bytes 0)
growable=$("$bench" "${common[@]}" | grep '"batch"')
pooled=$("$bench" "${common[@]}" --kv-block-size 4 | grep '"batch"')
echo "growable: $growable"
echo "pooled:   $pooled"
python3 - "$growable" "$pooled" <<'PY'
import json, sys

growable, pooled = (json.loads(line) for line in sys.argv[1:3])
failures = []
if growable["context"] < 40 or pooled["context"] < 40:
    failures.append("the prompts are shorter than --batch-context 40")
if growable["kv_reallocations"] <= 0 or growable["kv_bytes_copied_per_token"] <= 0:
    failures.append("growable caches copied nothing: the counters cannot tell the two apart")
if pooled["kv_block_size"] != 4:
    failures.append("the pooled run did not use the block pool")
if pooled["kv_reallocations"] != 0 or pooled["kv_bytes_copied_per_token"] != 0:
    failures.append("caches in the block pool were reallocated or copied history")
for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
PY
