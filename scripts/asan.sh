#!/usr/bin/env bash
# The suites that run in this process built with AddressSanitizer and UndefinedBehaviorSanitizer
# and run: a use-after-free, an overflow, a leak or undefined behaviour in our code fails its
# test. That is every suite of the engine, the model runner (loading, tokenizers, sampling, the
# models), the stage YAML, gRPC wire, HTTP protocol, worker-process supervisor, in-process
# pipeline, server metrics and command-line options.
# Left out, to keep CI's whole run under 60 minutes on 2 cores (the full ASan suite took CI's
# run to 74 minutes): the suites that drive `vllm-omni` as a process (PipelineWorkers, the
# generate end-to-end and CLI-process tests, the OpenAI API, TLS, playground, load and
# network-namespace tests). They take 16 of the ASan suite's 34 test-minutes and need
# the ASan-built vllm-omni and benches; the code they reach in other processes is the code the
# in-process suites above run, and the HTTP front end has its own ASan fuzz test in the main
# build (worker_serve_fuzz_test). Also left out: the real-shape bench test (a 5 GB checkpoint)
# and the configure-only build test.
# The CUDA engine is left out (no device here; its host-side rules run on the simulated device).
set -euo pipefail
cd "$(dirname "$0")/.."
# -O1 -g1: line tables are all a report needs, and full debug info of LibTorch's templates
# would double the build.
OMNI_BUILD_TARGETS="cpu_offload_tests model_runner_tests config_tests rpc_tests http_tests \
pipeline_tests worker_pipeline_local_test worker_server_metrics_test worker_cli_options_test" \
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
  -L 'cpu_offload|model_runner|config|rpc|http|pipeline|worker' -LE '^(bench|build)$' \
  -E '_NOT_BUILT$|^(PipelineWorkers|GenerateE2E|VllmOmniProcess|.*/VllmOmniBadCommandLine)[.]|^worker_(openai_api|serve_load|playground|serve_tls|netns_pipeline)$')
