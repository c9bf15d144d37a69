#include "worker/cli/generate_backend.h"

#include <chrono>
#include <sstream>

#include "worker/cli/sampling_defaults.h"
#include "worker/pipeline/local_pipeline.h"

namespace omni::cli {
namespace {

using Clock = std::chrono::steady_clock;

class PipelineBackend : public GenerateBackend {
 public:
  PipelineBackend(const GenerateOptions& o, config::PipelineConfig config,
                  std::shared_ptr<void> owner, pipeline::Pipeline& pipeline)
      : options_(o), config_(std::move(config)), owner_(std::move(owner)), pipeline_(pipeline) {}

  bool answers_audio() override { return pipeline_.has_speech(); }
  bool answers_video() override { return pipeline_.has_video(); }
  bool answers_images() override { return pipeline_.has_images(); }
  void set_progress(std::function<void(const std::map<std::string, double>&)> fn) override {
    progress_ = std::move(fn);
  }
  pipeline::PipelineResult generate(const pipeline::Request& request,
                                    const std::function<void(const std::string&)>& on_text,
                                    const std::vector<pipeline::MediaFile>* media) override {
    pipeline::PipelineCallbacks callbacks;
    callbacks.on_text = [&](const std::string& text) {
      on_text(text);
      return true;
    };
    if (progress_) {
      callbacks.on_progress = [&](const std::map<std::string, double>& m) {
        progress_(m);
        return true;
      };
    }
    auto deadline = Clock::time_point::max();
    if (options_.request_timeout_s > 0) {
      deadline = Clock::now() +
                 std::chrono::milliseconds(static_cast<int64_t>(options_.request_timeout_s * 1000));
    }
    pipeline::Request with_defaults = request;
    apply_sampling_defaults(with_defaults, config_, sampling_given_by_flags(options_.given));
    try {
      return pipeline_.generate(with_defaults, callbacks, deadline, media);
    } catch (const pipeline::StageError& e) {
      if (e.code() != pipeline::StageError::Code::kDeadlineExceeded) throw;
      std::ostringstream why;
      why << "the request ran past --request-timeout (" << options_.request_timeout_s
          << " s) while " << (e.stage().empty() ? "the pipeline" : e.stage()) << " was at work";
      throw std::runtime_error(why.str());
    }
  }
  std::string offload_json() override { return pipeline_.stats_json(); }

 private:
  GenerateOptions options_;
  config::PipelineConfig config_;
  std::shared_ptr<void> owner_;
  pipeline::Pipeline& pipeline_;
  std::function<void(const std::map<std::string, double>&)> progress_;
};

}  // namespace

std::unique_ptr<GenerateBackend> make_backend(const GenerateOptions& o,
                                              config::PipelineConfig config,
                                              std::shared_ptr<void> owner,
                                              pipeline::Pipeline& pipeline) {
  return std::make_unique<PipelineBackend>(o, std::move(config), std::move(owner), pipeline);
}

config::PipelineConfig model_stage_config(const GenerateOptions& o, const std::string& device) {
  config::PipelineConfig config = pipeline::checkpoint_stage_config(o.model, device, "auto");
  try {
    config::apply_stage_flags(config, o.engine, o.stage_overrides);
  } catch (const config::ConfigError& e) {
    throw BadInput(e.what());
  }
  return config;
}

std::unique_ptr<GenerateBackend> make_model_backend(const GenerateOptions& o,
                                                    const std::string& device) {
  config::PipelineConfig config = model_stage_config(o, device);
  std::shared_ptr<pipeline::Pipeline> local = pipeline::make_local_pipeline(config, device);
  pipeline::Pipeline& p = *local;
  return make_backend(o, std::move(config), std::move(local), p);
}

}  // namespace omni::cli
