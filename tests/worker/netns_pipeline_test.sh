#!/usr/bin/env bash
# The talker and code2wav workers on other "hosts": each in its own network namespace, joined to
# this one by a veth pair, listening on its namespace's address with a shared token. The
# orchestrator (vllm-omni generate) reaches them through runtime.address; the thinker is started
# locally as usual. The answer must equal the in-process one byte for byte; a wrong token fails
# the request naming the stage, and the workers keep serving.
#   netns_pipeline_test.sh VLLM_OMNI SOURCE_DIR
# Exit 77 (skipped) where network namespaces cannot be made (not root, no iproute2).
set -euo pipefail
exe=$1
src=$2
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces"
command -v ip >/dev/null || skip "needs iproute2 (ip)"

tag=o$$
ns1=${tag}t ns2=${tag}c
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip netns del "$ns1" 2>/dev/null || true
  ip netns del "$ns2" 2>/dev/null || true
  ip link del "${tag}a" 2>/dev/null || true
  ip link del "${tag}b" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
ip netns add "$ns1" 2>/dev/null || skip "cannot create network namespaces here"
ip netns add "$ns2"
ip link add "${tag}x" type veth peer name "${tag}y" 2>/dev/null ||
  skip "cannot create veth pairs here"
ip link del "${tag}x"

# host side 10.201.N.1, namespace side 10.201.N.2
link() {  # link NS N
  local ns=$1 n=$2 host=${tag}$3 peer=${tag}$3p
  ip link add "$host" type veth peer name "$peer"
  ip link set "$peer" netns "$ns"
  ip addr add "10.201.$n.1/24" dev "$host"
  ip link set "$host" up
  ip netns exec "$ns" ip addr add "10.201.$n.2/24" dev "$peer"
  ip netns exec "$ns" ip link set "$peer" up
  ip netns exec "$ns" ip link set lo up
}
link "$ns1" 1 a
link "$ns2" 2 b

model="$src/tests/fixtures/qwen3_omni_tiny"
echo "netns-shared-token" > "$tmp/token"
echo "a-wrong-token" > "$tmp/wrong"
# The flat `stages:` layout of the newer vLLM-Omni deploy files.
cat > "$tmp/stages.yaml" <<YAML
stages:
  - stage_id: 0
    model_stage: thinker
    model: $model
    runtime: {devices: cpu}
    final_output: true
    final_output_type: text
  - stage_id: 1
    model_stage: talker
    model: $model
    runtime: {devices: cpu, address: "10.201.1.2:50061"}
    engine_input_source: [0]
  - stage_id: 2
    stage_type: generation
    model_stage: code2wav
    model: $model
    runtime: {devices: cpu, address: "10.201.2.2:50062"}
    engine_input_source: [1]
    final_output: true
    final_output_type: audio
YAML

ip netns exec "$ns1" "$exe" worker --stage-configs-path "$tmp/stages.yaml" --stage-id 1 \
    --listen 10.201.1.2:50061 --auth-token-file "$tmp/token" 2> "$tmp/talker.log" &
pids+=($!)
ip netns exec "$ns2" "$exe" worker --stage-configs-path "$tmp/stages.yaml" --stage-id 2 \
    --listen 10.201.2.2:50062 --auth-token-file "$tmp/token" 2> "$tmp/code2wav.log" &
pids+=($!)

args=(--prompt "Describe the sound." --audio "$model/audio.wav" --greedy --max-tokens 12
      --max-audio-frames 10 --json)
"$exe" generate --model "$model" "${args[@]}" --output-wav "$tmp/local.wav" > "$tmp/local.json"
"$exe" generate --stage-configs-path "$tmp/stages.yaml" --auth-token-file "$tmp/token" \
    --stage-init-timeout 60 "${args[@]}" --output-wav "$tmp/remote.wav" > "$tmp/remote.json"
cmp "$tmp/local.wav" "$tmp/remote.wav"
python3 - "$tmp/local.json" "$tmp/remote.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
for key in ("text", "token_ids", "codes", "finish_reason", "audio_finish_reason", "speaker"):
    assert a[key] == b[key], f"{key} differs: {a[key]!r} != {b[key]!r}"
assert len(b["codes"]) > 0
PY

# A wrong token: the request fails naming a remote stage; the workers log the refusal and serve on.
set +e
"$exe" generate --stage-configs-path "$tmp/stages.yaml" --auth-token-file "$tmp/wrong" \
    --stage-init-timeout 60 "${args[@]}" > /dev/null 2> "$tmp/wrong.err"
status=$?
set -e
[ "$status" = 1 ] || { echo "wrong token: exit $status"; cat "$tmp/wrong.err"; exit 1; }
grep -Eq "stage (1 \(talker\)|2 \(code2wav\))" "$tmp/wrong.err" || { cat "$tmp/wrong.err"; exit 1; }
grep -q "token" "$tmp/wrong.err" || { cat "$tmp/wrong.err"; exit 1; }
grep -q "refused" "$tmp/talker.log" || { cat "$tmp/talker.log"; exit 1; }
"$exe" generate --stage-configs-path "$tmp/stages.yaml" --auth-token-file "$tmp/token" \
    "${args[@]}" --output-wav "$tmp/again.wav" > /dev/null
cmp "$tmp/local.wav" "$tmp/again.wav"
echo "netns pipeline: same answer through two network namespaces; wrong token refused"
