// The Qwen3-Omni thinker's audio tower ("thinker.audio_tower.*" on disk), as Hugging Face's
// Qwen3OmniMoeAudioEncoder: log-mel features cut into chunks of 2 * n_window frames, three
// stride-2 convolutions (GELU) per chunk, a linear to d_model, sinusoidal positions that restart
// in every chunk, pre-norm transformer layers whose attention stays inside windows of
// n_window_infer mel frames, then LayerNorm, proj1, activation, proj2 to the text hidden size.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cpu_offload/hooks.h"
#include "model_runner/layers.h"
#include "model_runner/qwen3_omni/config.h"

namespace omni::models::qwen3_omni {

// Audio tokens the tower makes from `mel_frames` mel frames (Hugging Face
// _get_feat_extract_output_lengths): 13 per full chunk of 2 * n_window frames plus what the
// three stride-2 convolutions leave of the tail. The reference formula hardcodes 13, which is
// right only for n_window = 50 (the released checkpoints); it is reproduced as is.
int64_t audio_output_length(int64_t mel_frames, int64_t n_window);

// One pre-norm encoder layer; hookable so that the offload engine can stream layers.
class AudioEncoderLayer : public offload::HookableModule {
 public:
  AudioEncoderLayer(const AudioEncoderConfig& cfg, at::ScalarType dtype);
  // hidden [L, d_model]; attention runs separately inside each [cu_seqlens[i], cu_seqlens[i+1]).
  at::Tensor forward(const at::Tensor& hidden, const std::vector<int64_t>& cu_seqlens);

 private:
  at::Tensor attention(const at::Tensor& x, const std::vector<int64_t>& cu_seqlens) const;

  int64_t heads_;
  std::string activation_;
  std::shared_ptr<torch::nn::Module> self_attn_;
  std::shared_ptr<Linear> q_proj_, k_proj_, v_proj_, out_proj_, fc1_, fc2_;
  std::shared_ptr<LayerNorm> self_attn_layer_norm_, final_layer_norm_;
};

class AudioEncoder : public offload::HookableModule {
 public:
  AudioEncoder(const AudioEncoderConfig& cfg, at::ScalarType dtype);

  // features [num_mel_bins, sum(lengths)] (any float dtype, any device: they go to the device
  // and dtype of the weights), lengths = mel frames of each clip (each > 0), clips concatenated
  // along time. Returns [sum(audio_output_length(len)), output_dim] in the model dtype.
  //
  // As in the reference, all chunks of one call are zero-padded to the longest chunk before the
  // convolutions; a clip shorter than 2 * n_window frames therefore gives slightly different
  // features alone than batched with a longer clip (the convolutions see the bias-only
  // activations of the padding). Clips of at least 2 * n_window frames are independent.
  at::Tensor forward(const at::Tensor& features, const std::vector<int64_t>& lengths);

  const AudioEncoderConfig& config() const { return cfg_; }

 private:
  at::Tensor forward_impl(const at::Tensor& features, const std::vector<int64_t>& lengths);

  AudioEncoderConfig cfg_;
  // [max_source_positions, d_model] float32 on the CPU: computed, not a checkpoint tensor, so
  // deliberately neither a parameter nor a buffer (load_weights binds exactly those).
  at::Tensor positional_embedding_;
  std::shared_ptr<torch::nn::Module> conv2d1_, conv2d2_, conv2d3_;
  at::Tensor conv_weight_[3], conv_bias_[3];
  std::shared_ptr<Linear> conv_out_, proj1_, proj2_;
  std::shared_ptr<LayerNorm> ln_post_;
  std::shared_ptr<torch::nn::Module> layers_holder_;
  std::vector<std::shared_ptr<AudioEncoderLayer>> layers_;
};

// Activation functions by their Hugging Face ACT2FN names ("gelu" exact erf GELU,
// "gelu_pytorch_tanh" / "gelu_new" tanh approximation, "quick_gelu", "silu" / "swish",
// "relu"). Throws omni::Error naming `name` when it is not one of them.
at::Tensor hf_activation(const std::string& name, const at::Tensor& x);
void check_hf_activation(const std::string& name, const char* field);

using models::segment_attention;  // model_runner/layers.h

}  // namespace omni::models::qwen3_omni
