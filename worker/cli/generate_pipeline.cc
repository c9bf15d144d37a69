#include "worker/cli/generate_pipeline.h"

#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <set>

#include "cpu_offload/check.h"
#include "worker/cli/process_control.h"
#include "worker/cli/sampling_defaults.h"
#include "worker/config/stage_config.h"
#include "worker/config/stage_overrides.h"
#include "worker/pipeline/stage_launcher.h"
#include "worker/pipeline/worker_process.h"
#include "worker/rpc/auth.h"

namespace omni::cli {
namespace {

using Clock = std::chrono::steady_clock;

// The global flags the user gave (only those: the YAML keeps the rest).
config::GlobalStageFlags stage_flags(const GenerateOptions& o) {
  config::GlobalStageFlags f;
  const auto given = [&](const char* name) { return o.given.count(name) > 0; };
  if (given("--cpu-offload-enabled")) f.cpu_offload_enabled = o.cpu_offload_enabled;
  if (given("--cpu-offload-components")) f.cpu_offload_components = o.cpu_offload_components;
  if (given("--cpu-offload-strategy")) f.cpu_offload_strategy = o.cpu_offload_strategy;
  if (given("--no-pin-memory")) f.cpu_offload_pin_memory = false;
  if (given("--cpu-offload-pin-memory")) f.cpu_offload_pin_memory = true;
  if (given("--enable-cpu-offload")) f.enable_cpu_offload = o.enable_cpu_offload;
  if (given("--enable-layerwise-offload")) f.enable_layerwise_offload = o.enable_layerwise_offload;
  if (given("--layerwise-num-gpu-layers")) {
    f.layerwise_num_gpu_layers = o.layerwise_num_gpu_layers;
  }
  if (given("--cpu-offload-budget")) f.gpu_memory_budget = o.cpu_offload_budget;
  if (given("--dtype")) f.dtype = o.dtype;
  if (given("--cpu-offload-experts")) f.cpu_offload_experts = o.cpu_offload_experts;
  if (given("--expert-cache-budget")) f.expert_cache_budget = o.expert_cache_budget;
  if (given("--no-expert-prefetch")) f.expert_prefetch = false;
  if (given("--expert-miss-policy")) f.expert_miss_policy = o.expert_miss_policy;
  if (given("--expert-eviction")) f.expert_eviction = o.expert_eviction;
  if (given("--host-memory-budget")) f.host_memory_budget = o.host_memory_budget;
  if (given("--disk-read")) f.disk_read = o.disk_read;
  return f;
}

class PipelineBackend : public GenerateBackend {
 public:
  PipelineBackend(const GenerateOptions& o, pipeline::LauncherOptions options)
      : options_(o), config_(options.config), launcher_(std::move(options)) {}

  bool has_talker() override { return launcher_.pipeline().has_speech(); }
  std::string default_speaker() override { return launcher_.pipeline().default_speaker(); }
  Answer generate(const models::OmniRequest& request,
                  const std::function<void(const std::string&)>& on_text) override {
    pipeline::PipelineCallbacks callbacks;
    callbacks.on_text = [&](const std::string& text) {
      on_text(text);
      return true;
    };
    auto deadline = Clock::time_point::max();
    if (options_.request_timeout_s > 0) {
      deadline = Clock::now() +
                 std::chrono::milliseconds(static_cast<int64_t>(options_.request_timeout_s * 1000));
    }
    models::OmniRequest with_defaults = request;
    apply_sampling_defaults(with_defaults, config_, sampling_given_by_flags(options_.given));
    auto result = launcher_.pipeline().generate(with_defaults, callbacks, deadline);
    Answer answer;
    answer.result = std::move(result.omni);
    answer.text = std::move(result.text);
    return answer;
  }
  std::string offload_json() override { return launcher_.stats_json(); }

 private:
  GenerateOptions options_;
  config::PipelineConfig config_;
  pipeline::StageLauncher launcher_;
};

}  // namespace

std::unique_ptr<GenerateBackend> make_pipeline_backend(const GenerateOptions& o) {
  pipeline::LauncherOptions options;
  try {
    options.config = config::load_pipeline_config(o.stage_configs_path);
    config::apply_stage_flags(options.config, stage_flags(o), o.stage_overrides);
  } catch (const config::ConfigError& e) {
    throw BadInput(e.what());
  }
  options.worker_executable = self_executable();
  if (!o.auth_token_file.empty()) options.token = rpc::read_token_file(o.auth_token_file);
  options.tls_ca_file = o.tls_ca_file;
  options.init_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(o.stage_init_timeout_s * 1000));
  // Ctrl-C / SIGTERM stop the workers this process starts.
  pipeline::install_shutdown_handler();
  return std::make_unique<PipelineBackend>(o, std::move(options));
}

}  // namespace omni::cli
