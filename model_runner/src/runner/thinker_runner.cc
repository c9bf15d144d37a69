#include "model_runner/runner/thinker_runner.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <utility>

#include "cpu_offload/check.h"
#include "cpu_offload/load_progress.h"
#include "cpu_offload/logging.h"
#include "model_runner/weights/hf_config.h"
#include "model_runner/weights/load_weights.h"

namespace omni::models {

using qwen3_omni::Thinker;
using qwen3_omni::ThinkerInputs;

std::vector<std::string> thinker_component_paths(const std::vector<std::string>& names) {
  std::vector<std::string> paths;
  for (std::string name : names) {
    OMNI_CHECK(!name.empty(), "cpu_offload_components: an entry is empty");
    if (name.rfind("thinker.", 0) == 0) name = name.substr(8);
    if (name == "language_model" || name.rfind("language_model.", 0) == 0) {
      name = "model" + name.substr(14);
    }
    paths.push_back(name);
  }
  return paths;
}

std::unique_ptr<ThinkerRunner> ThinkerRunner::load(
    const ThinkerRunnerOptions& options, std::shared_ptr<offload::TransferEngine> engine) {
  namespace fs = std::filesystem;
  OMNI_CHECK(engine != nullptr, "ThinkerRunner::load needs a transfer engine");
  OMNI_CHECK(fs::is_directory(options.model_dir), "model directory ", options.model_dir,
             " does not exist or is not a directory");
  std::unique_ptr<ThinkerRunner> r(new ThinkerRunner());
  r->options_ = options;
  r->engine_ = std::move(engine);

  const auto config = HfConfig::load(options.model_dir);
  const auto cfg = qwen3_omni::parse_thinker_config(config);
  const auto checkpoint = SafetensorsCheckpoint::open(options.model_dir);
  r->tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::load(options.model_dir));
  r->preprocessor_ = ChatPreprocessor::load(options.model_dir, cfg);

  r->options_.dtype = resolve_dtype(options.dtype, checkpoint, cfg.weight_prefix);
  r->thinker_ = std::make_shared<Thinker>(cfg, r->options_.dtype);
  const auto report =
      load_weights(*r->thinker_, checkpoint, cfg.weight_prefix, /*defer_conversion=*/true);
  omni::log_info("loaded ", report.tensors, " tensors (", report.bytes, " bytes) from ",
                 options.model_dir, report.converted ? " with dtype conversion" : "");
  for (const auto& child : r->thinker_->named_children()) {
    int64_t bytes = 0;
    for (const auto& p : child.value()->parameters()) {  // in the dtype they are converted to
      bytes += p.numel() * static_cast<int64_t>(c10::elementSize(r->options_.dtype));
    }
    r->module_bytes_[child.key()] = bytes;
  }

  // Offload after the weights are bound: the backend moves them into its stores.
  auto [oc, spec] = offload_setup(options.offload, "", /*talker=*/false, thinker_component_paths);
  defer_conversions(report, "", oc.convert_dtypes);
  if (oc.host_memory_budget_bytes > 0) add_disk_files(report, "", oc.disk_files);
  {
    // The checkpoint is read here, as the weights are placed: for a large one, the long part.
    offload::LoadProgress progress("placing the weights of " + options.model_dir,
                                   offload::module_tensor_bytes(*r->thinker_));
    r->backend_ = offload::apply_offload(*r->thinker_, spec, oc, r->engine_);
    // The experts the plan carved out (cpu_offload_experts) go to a device expert cache.
    r->expert_cache_ =
        offload::make_expert_cache(*r->thinker_, r->backend_->plan(), oc, r->engine_);
  }
  if (r->expert_cache_) {
    r->expert_offload_ =
        std::make_unique<ExpertOffload>(r->thinker_->language_model(), "model.", *r->expert_cache_,
                                        options.offload.expert_prefetch);
  }
  r->thinker_->set_device(r->engine_->compute_device());

  for (const char* name : {"<|im_end|>", "<|endoftext|>"}) {
    if (auto id = r->tokenizer_->find_token(name)) r->stop_tokens_.push_back(*id);
  }
  return r;
}

ThinkerInputs ThinkerRunner::prepare(const ChatRequest& request) const {
  return preprocessor_.prepare(request, *tokenizer_, thinker_->config());
}

GenerationResult ThinkerRunner::generate(const ThinkerInputs& inputs, SamplingParams params,
                                         const OnTokenFn& on_token,
                                         qwen3_omni::ThinkerState* state) {
  if (params.stop_token_ids.empty()) params.stop_token_ids = stop_tokens_;
  params.max_context = thinker_->config().text.max_position_embeddings;
  c10::InferenceMode inference;              // no autograd bookkeeping per op
  auto forward = backend_->forward_scope();  // one request's forwards (recursive: nests)
  std::optional<qwen3_omni::ThinkerState> own;
  if (state == nullptr) state = &own.emplace(thinker_->new_state());
  return generate_tokens(
      [&](int64_t step, const std::vector<int64_t>& generated) -> at::Tensor {
        if (step == 0) return thinker_->prefill(inputs, *state)[0];
        return thinker_->decode(generated.back(), *state);
      },
      params, on_token, inputs.input_ids);
}

at::Tensor ThinkerRunner::prompt_logits(const ThinkerInputs& inputs) {
  c10::InferenceMode inference;  // no autograd bookkeeping per op
  auto forward = backend_->forward_scope();
  auto state = thinker_->new_state();
  return thinker_->prefill(inputs, state, /*all_logits=*/true);
}

int64_t ThinkerRunner::module_bytes(const std::string& path) const {
  auto it = module_bytes_.find(path);
  OMNI_CHECK(it != module_bytes_.end(), "the thinker has no part named ", path);
  return it->second;
}

}  // namespace omni::models
