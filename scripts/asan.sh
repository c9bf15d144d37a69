#!/usr/bin/env bash
# The suites whose code owns memory, built with AddressSanitizer and UndefinedBehaviorSanitizer
# and run: a use-after-free, an overflow, a leak or undefined behaviour there fails its test.
# That is the engine (weight store, transfer engines, backends, expert cache, disk tier, hooks),
# the parsers and writers that read and write bytes (safetensors, config.json, the tokenizers,
# the text stream, WAV, video frames (MP4 / PNG / NPY)), the sampler and the KV cache, the
# hand-written loops (code2wav's SnakeBeta and few-channel conv, the decode attention), the Wan
# schedulers, the OpenAI protocol parser, the gRPC wire, the worker-process supervisor and the
# serving runtime's engine loop.
# Left out, to keep CI's whole run under 60 minutes on 2 cores (a clean clone's run went past 90
# with the model suites here too): every suite that needs the models (omni_runner: the Qwen3-Omni,
# Wan and Qwen-Image parity and offload suites, the in-process pipeline, batching and KV manager,
# the stage YAML and command-line suites, and those that drive `vllm-omni` as a process). Their
# memory-owning code is the engine and the parsers above; the rest is tensor arithmetic in LibTorch,
# which is not instrumented. The HTTP front end has its own ASan fuzz test in the main build
# (worker_serve_fuzz_test). The CUDA engine is left out (no device here; its host-side rules run on
# the simulated device).
set -euo pipefail
cd "$(dirname "$0")/.."
# -O1 -g1: line tables are all a report needs, and full debug info of LibTorch's templates
# would double the build.
OMNI_BUILD_TARGETS="cpu_offload_tests model_runner_weights_test model_runner_tokenizer_test \
model_runner_umt5_tokenizer_test model_runner_text_stream_test model_runner_wav_writer_test \
model_runner_frames_writer_test model_runner_sampler_test model_runner_kv_cache_test \
model_runner_snake_beta_test model_runner_few_channel_conv_test model_runner_decode_attention_test \
model_runner_wan_scheduler_test http_tests rpc_tests pipeline_tests worker_engine_loop_test \
worker_streamed_sequence_test" \
  CMAKE_BUILD_TYPE=RelWithDebInfo scripts/build.sh build-asan -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DOMNI_SANITIZE=address,undefined -DOMNI_BUILD_BENCH=OFF -DOMNI_WITH_CUDA=OFF \
  -DOMNI_CUDA_COMPILE_CHECK=OFF
jobs=$(nproc)  # before OMP_NUM_THREADS, which nproc obeys
export OMP_NUM_THREADS=1
export ASAN_OPTIONS="detect_leaks=1 abort_on_error=1 strict_init_order=1"
export UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1"
# Suites not built here register a failing <target>_NOT_BUILT test; the build above fails if a
# listed one does not build, so excluding those names hides nothing that was meant to run.
(cd build-asan && ctest --output-on-failure --parallel "$jobs" --no-tests=error \
  -L 'cpu_offload|model_runner|rpc|http|pipeline|worker' -LE '^(bench|build)$' \
  -E '_NOT_BUILT$|^worker_(openai_api|serve_load|serve_attacks|serve_resource_attacks|serve_admission|playground|serve_tls|netns_pipeline|videos_api|images_api|playground_video|playground_image)$')
