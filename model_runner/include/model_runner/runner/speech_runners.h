// The talker and code2wav of a Qwen3-Omni checkpoint, each loaded alone: what a talker or a
// code2wav stage worker holds (the thinker's 60 GB stay with the thinker stage). Each loads only
// its own tensors ("talker.*", "code2wav.*") and reads the whole config.json (the talker needs the
// thinker's token ids for the hand-off).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cpu_offload/offload_backend.h"
#include "cpu_offload/transfer_engine.h"
#include "model_runner/generation/sampler.h"
#include "model_runner/qwen3_omni/code2wav.h"
#include "model_runner/qwen3_omni/config.h"
#include "model_runner/qwen3_omni/talker.h"
#include "model_runner/qwen3_omni/talker_generate.h"
#include "model_runner/qwen3_omni/talker_handoff.h"
#include "model_runner/runner/offload_options.h"

namespace omni::models {

struct SpeechRunnerOptions {
  std::string model_dir;
  // Compute dtype; weights of another dtype are converted at load. Undefined ("auto"): the
  // checkpoint's own (resolve_dtype).
  at::ScalarType dtype = at::ScalarType::Undefined;
  // Component names as the talker stage sees them: talker.* / code_predictor /
  // talker.model.layers.* (a leading "talker." is optional); names of other parts are ignored,
  // since a pipeline-wide list names modules of every stage. Layerwise streams the talker's
  // decoder layers. For code2wav the one component is "code2wav" (all of it).
  RunnerOffloadOptions offload;
};

class TalkerRunner {
 public:
  // Throws omni::Error naming the file / field / tensor; also when the checkpoint has no talker.
  static std::unique_ptr<TalkerRunner> load(const SpeechRunnerOptions& options,
                                            std::shared_ptr<offload::TransferEngine> engine);
  ~TalkerRunner();

  struct Request {
    std::string speaker;  // any case; empty = the default
    SamplingParams talker, code_predictor;
    int64_t max_frames = 4096;
  };
  // The thinker's answer as it streams in: the talker starts as soon as its prefill is known
  // (the prompt, the first generated token's row and a second token) and reads each step's text
  // row when the thinker has produced it, instead of waiting for the whole answer (Session).
  struct StreamingHandoff {
    qwen3_omni::ThinkerHandoff handoff;  // grows: use append_rows for embeds / hidden
    std::vector<int64_t> thinker_stop_tokens;
    std::vector<std::array<int64_t, 3>> image_grids;
    bool finished = false;      // every token and row is in
    std::string finish_reason;  // the thinker's, once finished
    // Appends rows ([k, H] each) to handoff.embeds / hidden, growing their storage geometrically
    // (a long answer is not copied again at every token).
    void append_rows(const at::Tensor& embeds, const at::Tensor& hidden);

   private:
    at::Tensor embeds_storage_, hidden_storage_;
    int64_t rows_ = 0;
  };
  // One request's talker run over a hand-off still streaming in. Whoever owns the model drives
  // it (the talker stage's engine loop, stepping every ready session in one batch): advance()
  // before each step, then the step with decode().code(), state() and
  // decode().code_predictor_sampler(), then decode().stepped(frame, logits).
  class Session {
   public:
    enum class Next {
      kInput,  // needs more of the thinker's answer in `h`
      kStep,   // ready for its next step
      kDone,   // run() is final
    };
    // Reads what `h` holds now: prefills once it can, then adds the next step's text row. Makes
    // model calls (the caller holds the model). Throws on an unknown speaker (listing the known
    // ones) and on a malformed hand-off.
    Next advance();
    qwen3_omni::TalkerDecode& decode() { return *decode_; }
    qwen3_omni::TalkerState& state() { return *state_; }
    // Frames and finish reason; "none" when the thinker said fewer than 2 tokens (no frames),
    // "cancelled" when the thinker was cancelled before the talker could start.
    qwen3_omni::TalkerRun run() const;

    StreamingHandoff h;  // the caller adds the thinker's packets
    // Called with the new state just before the prefill (its `prompt_tokens` positions): the
    // caller sets up the state's KV cache (a pool's) and admits it; false: not yet (advance()
    // answers kInput and asks again next time). Unset: always.
    std::function<bool(qwen3_omni::TalkerState& state, int64_t prompt_tokens)> before_prefill;

   private:
    friend class TalkerRunner;
    Session(TalkerRunner& runner, Request request);
    Next end_without_frames(const char* reason);

    TalkerRunner& runner_;
    Request request_;
    std::optional<qwen3_omni::HandoffIds> ids_;
    std::optional<qwen3_omni::TrailingText> text_;
    std::optional<qwen3_omni::TalkerState> state_;
    std::optional<qwen3_omni::TalkerDecode> decode_;
    int64_t next_ = 0;  // the next trailing text entry to add
    std::string none_reason_;
  };
  std::unique_ptr<Session> start_session(const Request& request);

  // The thinker's token ids the hand-off needs from the thinker stage: tts_bos, tts_eos, tts_pad.
  std::vector<int64_t> tts_token_ids() const;
  int64_t accept_hidden_layer() const { return cfg_.accept_hidden_layer; }
  int64_t num_code_groups() const { return cfg_.num_code_groups; }
  std::vector<std::string> speakers() const;  // lower case, sorted
  std::string default_speaker() const;
  offload::OffloadBackend& offload() { return *backend_; }
  qwen3_omni::Talker& model() { return *talker_; }

 private:
  TalkerRunner() = default;
  qwen3_omni::ThinkerConfig thinker_cfg_;
  qwen3_omni::TalkerConfig cfg_;
  qwen3_omni::OmniTokenIds ids_;
  std::shared_ptr<offload::TransferEngine> engine_;
  std::shared_ptr<qwen3_omni::Talker> talker_;
  std::unique_ptr<offload::OffloadBackend> backend_;
};

class Code2WavRunner {
 public:
  static std::unique_ptr<Code2WavRunner> load(const SpeechRunnerOptions& options,
                                              std::shared_ptr<offload::TransferEngine> engine);
  ~Code2WavRunner();
  qwen3_omni::Code2Wav& model() { return *code2wav_; }
  int64_t num_quantizers() const { return cfg_.num_quantizers; }
  int64_t sample_rate() const { return 24000; }
  offload::OffloadBackend& offload() { return *backend_; }

 private:
  Code2WavRunner() = default;
  qwen3_omni::Code2WavConfig cfg_;
  std::shared_ptr<offload::TransferEngine> engine_;
  // The offload root: a module holding code2wav as its child "code2wav", so that the whole of
  // code2wav can be one offload component (a root cannot be a component of itself).
  std::shared_ptr<torch::nn::Module> root_;
  std::shared_ptr<qwen3_omni::Code2Wav> code2wav_;
  std::unique_ptr<offload::OffloadBackend> backend_;
};

// Names as a pipeline-wide --cpu-offload-components writes them -> module paths under the
// talker (names that are not the talker's are dropped).
std::vector<std::string> talker_stage_component_paths(const std::vector<std::string>& names);
// The thinker stage's share of the same list (thinker parts only, "thinker." optional).
std::vector<std::string> thinker_stage_component_names(const std::vector<std::string>& names);
// Throws omni::Error naming the first of `names` that no stage of Qwen3-Omni claims (a typo in
// --cpu-offload-components would otherwise offload nothing, silently).
void check_component_names(const std::vector<std::string>& names);

}  // namespace omni::models
