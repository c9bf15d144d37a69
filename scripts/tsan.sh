#!/usr/bin/env bash
# The suites whose code runs threads of ours, built with -fsanitize=thread and run: the engine
# (the simulated copy stream, the disk tier's readers), the worker-process supervisor, the
# serving runtime's engine loop and streamed sequences, and the HTTP server's connection loop
# (worker_bounded_http_server_test: clients at once, faults, deadlines).
# LibTorch is not instrumented, so its OpenMP threads are turned off: TSan cannot see their
# synchronisation.
# Left out: the suites that need the models (the in-process pipeline, batching, the diffusion
# stage on the engine loop, the chat server with its stages): building the models a third time
# took CI's run on a clean clone past 90 minutes; their threads are the engine loop's and the
# connection loop's, run here on their own. The gRPC suites (worker_rpc_test, PipelineWorkers):
# Debian's gRPC and Abseil are not instrumented, and TSan reports races inside them (the
# poller's epoll fd, channel arguments, string copies, Status refcounts) on every call;
# suppressing them library by library never converged. They need a gRPC built with TSan.
set -euo pipefail
cd "$(dirname "$0")/.."
# -O1 -g1: line tables are all a report needs.
OMNI_BUILD_TARGETS="cpu_offload_tests pipeline_tests http_tests worker_engine_loop_test \
worker_streamed_sequence_test worker_bounded_http_server_test" \
  CMAKE_BUILD_TYPE=RelWithDebInfo scripts/build.sh build-tsan -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DOMNI_SANITIZE=thread -DOMNI_BUILD_BENCH=OFF -DOMNI_WITH_CUDA=OFF -DOMNI_CUDA_COMPILE_CHECK=OFF
jobs=$(nproc)  # before OMP_NUM_THREADS, which nproc obeys
export OMP_NUM_THREADS=1
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
# Suites not built here register a failing <target>_NOT_BUILT test: left out, as are the API
# suites that run vllm-omni.
(cd build-tsan && ctest --output-on-failure --parallel "$jobs" -L 'cpu_offload|pipeline|http|worker' \
  -E '_NOT_BUILT$|^PipelineWorkers[.]|^worker_(openai_api|serve_load|serve_attacks|serve_resource_attacks|serve_admission|playground|serve_tls|netns_pipeline|videos_api|images_api|playground_video|playground_image)$')
