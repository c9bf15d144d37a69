#!/usr/bin/env bash
# prefill-bench on the tiny checkpoint, small: 3 requests decode while a 400-token prompt
# arrives, in both modes. Checks that each mode prints its line, that chunked prefill ran the
# prompt in chunks of at most --max-num-batched-tokens and the whole mode in one piece. The
# latency figures themselves are the bench's to report (bench/RESULTS.md), not a test's. Seconds.
#   prefill_bench_test.sh PREFILL_BENCH
# Exit 77 (skipped) without python3 to read the bench's JSON.
set -euo pipefail
bench=$1
command -v python3 >/dev/null || { echo "SKIP: needs python3"; exit 77; }
out=$("$bench" --decoders 3 --decode-tokens 12 --arrive-after 2 --prompt-tokens 400 \
  --max-num-batched-tokens 32)
echo "$out"
python3 - "$out" <<'PY'
import json, sys

lines = [json.loads(l) for l in sys.argv[1].splitlines() if l.startswith("{")]
modes = {l["mode"]: l for l in lines}
failures = []
if set(modes) != {"whole", "chunked"}:
    failures.append(f"expected a whole and a chunked line, got {sorted(modes)}")
else:
    whole, chunked = modes["whole"], modes["chunked"]
    for line in lines:
        if line["prompt_tokens"] < 400 or line["gaps"] != 3 * 11:
            failures.append(f"{line['mode']}: prompt or token counts are off: {line}")
    # Warm-up, 3 decoding requests and the long prompt: one piece each without chunks; the long
    # prompt alone takes at least 400 / 32 chunks with them.
    if whole["prefill_chunks"] != 5:
        failures.append(f"whole prefill ran {whole['prefill_chunks']} pieces, not 5")
    if chunked["prefill_chunks"] < 4 + (chunked["prompt_tokens"] + 31) // 32:
        failures.append(f"chunked prefill ran only {chunked['prefill_chunks']} pieces")
for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
PY
