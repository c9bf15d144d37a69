// Loads a Qwen3-Omni checkpoint directory (config.json, *.safetensors, tokenizer.json,
// preprocessor_config.json), applies offload after the weights are bound, turns a chat request
// (text, audio files, image files) into the thinker's inputs, and generates with streaming.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cpu_offload/offload_backend.h"
#include "cpu_offload/transfer_engine.h"
#include "model_runner/generation/generate.h"
#include "model_runner/generation/sampler.h"
#include "model_runner/preprocess/audio.h"
#include "model_runner/preprocess/image.h"
#include "model_runner/qwen3_omni/thinker.h"
#include "model_runner/tokenizer/tokenizer.h"
#include "model_runner/weights/safetensors.h"

namespace omni::models {

// Offload of the thinker, with the names of the stage config (vLLM-Omni's seed 001 keys).
struct ThinkerOffloadOptions {
  // cpu_offload_enabled: component offload of `components`.
  bool cpu_offload_enabled = false;
  // cpu_offload_components: module names or globs, as the checkpoint names them: "visual",
  // "audio_tower", "language_model" (the text decoder, "model" on disk), "lm_head",
  // "thinker.*" (every part); a leading "thinker." is optional.
  std::vector<std::string> components = {"visual", "audio_tower"};
  // cpu_offload_strategy: "alternating" (the component about to run comes on, others leave as
  // the budget requires) or "sequential" (each leaves right after its forward).
  std::string strategy = "alternating";
  // cpu_offload_pin_memory.
  bool pin_memory = true;
  // Device bytes the offloaded components may hold together (alternating); 0 = no budget
  // (a component leaves when another comes on). Or a fraction of device memory.
  size_t device_budget_bytes = 0;
  double device_budget_fraction = 0;
  // Layerwise streaming of the decoder layers ("model.layers"), for a language model that does
  // not fit; window of num_gpu_layers layers ahead. Replaces component offload when set.
  bool layerwise = false;
  int num_gpu_layers = 1;
  // With layerwise: the audio tower's layers and the vision encoder's blocks stream through the
  // same slots (their convolutions, position tables and mergers stay resident), so the encoders
  // leave the device too. They run once per request, so this costs one copy of each.
  bool layerwise_encoders = true;
};

struct ThinkerRunnerOptions {
  std::string model_dir;
  // Compute dtype; weights of another dtype are converted at load.
  at::ScalarType dtype = at::kFloat;
  ThinkerOffloadOptions offload;
};

// One user turn of a chat.
struct ChatRequest {
  std::string text;
  std::vector<std::string> audio_files;  // WAV / FLAC / OGG, 16 kHz
  std::vector<std::string> image_files;  // PNG / JPEG
  std::string system_prompt;             // empty: no system turn
};

class ThinkerRunner {
 public:
  // Throws omni::Error naming the file / field / tensor on any problem with the checkpoint.
  static std::unique_ptr<ThinkerRunner> load(const ThinkerRunnerOptions& options,
                                             std::shared_ptr<offload::TransferEngine> engine);

  // The chat-template prompt with audio / image placeholders expanded, plus the inputs.
  qwen3_omni::ThinkerInputs prepare(const ChatRequest& request) const;
  // Generates from `inputs`; `on_token` sees each token as it is sampled. Stop tokens default
  // to the checkpoint's <|im_end|> / eos when params.stop_token_ids is empty.
  GenerationResult generate(const qwen3_omni::ThinkerInputs& inputs, SamplingParams params,
                            const OnTokenFn& on_token = nullptr);
  // Logits [L, vocab] for every prompt position (float32): for parity checks.
  at::Tensor prompt_logits(const qwen3_omni::ThinkerInputs& inputs);

  qwen3_omni::Thinker& model() { return *thinker_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  offload::OffloadBackend& offload() { return *backend_; }
  offload::TransferEngine& engine() { return *engine_; }
  // The thinker's parameter bytes under each top-level part (audio_tower, visual, model, lm_head).
  int64_t module_bytes(const std::string& path) const;
  const std::vector<int64_t>& default_stop_tokens() const { return stop_tokens_; }

 private:
  ThinkerRunner() = default;

  ThinkerRunnerOptions options_;
  std::shared_ptr<offload::TransferEngine> engine_;
  std::shared_ptr<qwen3_omni::Thinker> thinker_;
  std::unique_ptr<Tokenizer> tokenizer_;
  WhisperFeatureOptions audio_options_;
  VisionPatchOptions vision_options_;
  std::unique_ptr<offload::OffloadBackend> backend_;
  std::vector<int64_t> stop_tokens_;
  std::map<std::string, int64_t> module_bytes_;
};

// Maps the stage-config component names onto the thinker's module paths ("language_model" ->
// "model", "thinker.visual" -> "visual", "thinker.*" -> "*").
std::vector<std::string> thinker_component_paths(const std::vector<std::string>& names);

}  // namespace omni::models
