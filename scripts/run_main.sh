#!/usr/bin/env bash
# The main job: set up, build, answer a prompt in text and speech with `vllm-omni generate` on
# the tiny embedded Qwen3-Omni checkpoint through three stage workers (writes
# build/tiny_answer.wav), make a video with the tiny Wan2.2-A14B-style diffusers folder (writes
# build/tiny_video.mp4), then run offload-bench
# on the tiny embedded diffusion pipeline under each strategy (simulated device on the CPU; pass
# --device cuda on a GPU machine), thinker-bench and speech-bench on the tiny Qwen3-Omni
# checkpoint. Each bench line printed is one JSON object; outputs_equal_to_resident /
# tokens_equal_to_none / codes_equal_to_none / wav_equal_to_none must be true everywhere.
#   scripts/run_main.sh [extra offload-bench options...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
OMNI_BUILD_TARGETS="vllm-omni offload-bench thinker-bench speech-bench pipeline-bench" scripts/build.sh build

status=0
# The answer, through the stage pipeline of stage_configs/qwen3_omni_tiny.yaml: three
# `vllm-omni worker` processes (thinker, talker, code2wav) on loopback, connected by gRPC. Its
# text streams to stdout, its speech goes to build/tiny_answer.wav.
tiny=tests/fixtures/qwen3_omni_tiny
build/worker/vllm-omni generate --stage-configs-path stage_configs/qwen3_omni_tiny.yaml \
    --prompt "Say something nice." --audio "$tiny/audio.wav" --greedy --max-tokens 16 \
    --max-audio-frames 24 --output-wav build/tiny_answer.wav || status=1
echo "wrote build/tiny_answer.wav"

# A video: the tiny random diffusers folder (two experts, UniPC) as one diffusion stage, its
# frames as H.264 at the folder's frame rate.
build/worker/vllm-omni generate --model tests/fixtures/wan22_a14b_pipeline_tiny \
    --prompt "a red fox jumps over the lazy dog" --height 16 --width 16 --num-frames 9 \
    --num-inference-steps 2 --seed 42 --max-sequence-length 16 --output build/tiny_video.mp4 \
    || status=1
echo "wrote build/tiny_video.mp4"

bench=build/bench/offload-bench
for args in "--strategy none" "--strategy model" "--strategy model --strict-vae" \
            "--strategy layerwise" "--strategy layerwise --num-gpu-layers 2" \
            "--strategy layerwise --granularity phase" "--strategy layerwise --offload-ratio 0.5"; do
  # shellcheck disable=SC2086
  line=$($bench $args "$@")
  echo "$line"
  case "$line" in *'"outputs_equal_to_resident": true'*) ;; *) status=1 ;; esac
done

# The Qwen3-Omni thinker (tiny Hugging Face checkpoint of the test fixtures: text + audio +
# image prompt) with no offload, component offload of visual + audio_tower (alternating,
# sequential) and layerwise decoder layers; the tokens must equal the no-offload run.
thinker=build/bench/thinker-bench
while IFS= read -r line; do
  echo "$line"
  case "$line" in *'"tokens_equal_to_none": false'*) status=1 ;; esac
done < <($thinker --model tests/fixtures/qwen3_omni_tiny --tokens 32 || echo '{"error": true, "tokens_equal_to_none": false}')

# Speech: talker frames/s, code predictor, code2wav real-time factor and time to first audio
# without offload and under each strategy; codes and waveform must equal the no-offload run.
while IFS= read -r line; do
  echo "$line"
  case "$line" in *'_equal_to_none": false'*) status=1 ;; esac
done < <(build/bench/speech-bench --model "$tiny" || echo '{"error": true, "codes_equal_to_none": false}')

# The stage pipeline: in-process stages versus gRPC worker processes (per-stage latency, time to
# first audio, bytes between stages, gRPC overhead); the outputs must be equal.
while IFS= read -r line; do
  echo "$line"
  case "$line" in *'"outputs_equal_to_in_process": false'*) status=1 ;; esac
done < <(build/bench/pipeline-bench || echo '{"error": true, "outputs_equal_to_in_process": false}')
exit $status
