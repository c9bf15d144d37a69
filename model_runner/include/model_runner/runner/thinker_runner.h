// Loads a Qwen3-Omni checkpoint directory (config.json, *.safetensors, tokenizer.json,
// preprocessor_config.json), applies offload after the weights are bound, turns a chat request
// (text, audio files, image files) into the thinker's inputs, and generates with streaming.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cpu_offload/expert_cache.h"
#include "cpu_offload/offload_backend.h"
#include "cpu_offload/transfer_engine.h"
#include "model_runner/generation/generate.h"
#include "model_runner/generation/sampler.h"
#include "model_runner/qwen3_omni/thinker.h"
#include "model_runner/runner/chat_inputs.h"
#include "model_runner/runner/expert_offload.h"
#include "model_runner/runner/offload_options.h"
#include "model_runner/tokenizer/tokenizer.h"
#include "model_runner/weights/safetensors.h"

namespace omni::models {

// Offload of the thinker; component names: see thinker_component_paths.
using ThinkerOffloadOptions = RunnerOffloadOptions;

struct ThinkerRunnerOptions {
  std::string model_dir;
  // Compute dtype; weights of another dtype are converted at load. Undefined ("auto"): the
  // checkpoint's own (resolve_dtype).
  at::ScalarType dtype = at::ScalarType::Undefined;
  ThinkerOffloadOptions offload;
};

class ThinkerRunner {
 public:
  // Throws omni::Error naming the file / field / tensor on any problem with the checkpoint.
  static std::unique_ptr<ThinkerRunner> load(const ThinkerRunnerOptions& options,
                                             std::shared_ptr<offload::TransferEngine> engine);

  // The chat-template prompt with audio / image placeholders expanded, plus the inputs.
  qwen3_omni::ThinkerInputs prepare(const ChatRequest& request) const;
  // One request decoded alone, for tests, thinker-bench and parity checks (a served request
  // decodes in the thinker stage's engine loop, batched): generates from `inputs`; `on_token`
  // sees each token as it is sampled, when `state` holds the rows of the forward that gave its
  // logits. Stop tokens default to the checkpoint's <|im_end|> / eos when
  // params.stop_token_ids is empty. `state`: the caller's, to read the hidden rows a talker needs
  // (model().new_state(capture_layer)); null: a fresh one.
  GenerationResult generate(const qwen3_omni::ThinkerInputs& inputs, SamplingParams params,
                            const OnTokenFn& on_token = nullptr,
                            qwen3_omni::ThinkerState* state = nullptr);
  // Logits [L, vocab] for every prompt position (float32): for parity checks.
  at::Tensor prompt_logits(const qwen3_omni::ThinkerInputs& inputs);

  qwen3_omni::Thinker& model() { return *thinker_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // The compute dtype (the checkpoint's when the options said auto).
  at::ScalarType dtype() const { return options_.dtype; }
  offload::OffloadBackend& offload() { return *backend_; }
  offload::TransferEngine& engine() { return *engine_; }
  // The device expert cache with cpu_offload_experts; null without. Its stats() give hits,
  // misses, prefetches, host-computed experts, bytes moved and stall time.
  offload::ExpertCache* expert_cache() { return expert_cache_.get(); }
  // The thinker's parameter bytes under each top-level part (audio_tower, visual, model, lm_head).
  int64_t module_bytes(const std::string& path) const;
  const std::vector<int64_t>& default_stop_tokens() const { return stop_tokens_; }

 private:
  ThinkerRunner() = default;

  ThinkerRunnerOptions options_;
  std::shared_ptr<offload::TransferEngine> engine_;
  std::shared_ptr<qwen3_omni::Thinker> thinker_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ChatPreprocessor preprocessor_;
  std::unique_ptr<offload::OffloadBackend> backend_;
  std::vector<int64_t> stop_tokens_;
  std::map<std::string, int64_t> module_bytes_;
  // Expert offload (declared after backend_ and thinker_: gone before them).
  std::unique_ptr<offload::ExpertCache> expert_cache_;
  std::unique_ptr<ExpertOffload> expert_offload_;
};

// Maps the stage-config component names onto the thinker's module paths: "visual",
// "audio_tower", "lm_head", "language_model" (the text decoder, "model" on disk, and
// "language_model.layers.*"), "thinker.*" (every part); a leading "thinker." is optional.
std::vector<std::string> thinker_component_paths(const std::vector<std::string>& names);

}  // namespace omni::models
