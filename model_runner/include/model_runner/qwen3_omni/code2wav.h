// Qwen3-Omni's code2wav ("code2wav.*" on disk): the codec decoder that turns the talker's
// 16-group codes into a 24 kHz waveform. Codes of all quantizers are embedded (one table, offset
// q * codebook_size) and averaged, run through a causal sliding-window transformer with layer
// scale and standard rope, upsampled twice (causal transposed conv + ConvNeXt block), then
// decoded by a BigVGAN-like stack (SnakeBeta, causal transposed convs at rates 8, 5, 4, 3,
// dilated residual units) into one channel clamped to [-1, 1]: 1920 samples per frame.
//
// Exactly Hugging Face's Qwen3OmniMoeCode2Wav (transformers 5.23). Every forward loses
// 555 samples at its end (each causal transposed conv of the decoder trims one input step), so
// T frames give T * 1920 - 555 samples.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cpu_offload/hooks.h"
#include "model_runner/layers.h"

namespace omni::models {
class HfConfig;
}

namespace omni::models::qwen3_omni {

// The "code2wav_config" of a Qwen3OmniMoeForConditionalGeneration config.json. Defaults are
// those of transformers' Qwen3OmniMoeCode2WavConfig (the released checkpoint's values).
struct Code2WavConfig {
  int64_t codebook_size = 2048;  // codes per quantizer
  int64_t hidden_size = 1024;
  int64_t num_attention_heads = 16;
  int64_t num_key_value_heads = 16;
  int64_t head_dim = 64;  // hidden_size / num_attention_heads unless config.json sets it
  int64_t intermediate_size = 3072;
  int64_t num_hidden_layers = 8;
  int64_t num_quantizers = 16;
  int64_t sliding_window = 72;  // a query at frame q sees keys q - window < k <= q
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  bool attention_bias = false;
  std::vector<int64_t> upsample_rates = {8, 5, 4, 3};  // decoder blocks
  std::vector<int64_t> upsampling_ratios = {2, 2};     // before the decoder
  int64_t decoder_dim = 1536;
  std::string hidden_act = "silu";

  // Product of upsampling_ratios and upsample_rates (1920 for the released checkpoint).
  int64_t samples_per_frame() const;
};

// Reads and validates root["code2wav_config"]. Throws omni::Error naming config.json and the
// dotted field (e.g. "code2wav_config.hidden_act") on a missing or inconsistent value.
Code2WavConfig parse_code2wav_config(const HfConfig& root);

// The fields that tie a speaking checkpoint's talker to its code2wav (code groups against
// quantizers, sampleable codes against the codebook): every loader of a talker or code2wav runs
// it, so that each command refuses a mixed checkpoint with the same message naming both fields.
void check_speech_configs(const HfConfig& root);

// Throws omni::Error unless `codes` is an integer [num_quantizers, T] tensor with every code in
// [0, codebook_size). `first_frame` is added to the frame index in the message (streaming).
void validate_codes(const Code2WavConfig& cfg, const at::Tensor& codes, int64_t first_frame = 0);

class Code2WavTransformerLayer;
class CausalConv;
class CausalTransConv;
class ConvNeXtBlock;
class SnakeBeta;
class Code2WavDecoderBlock;

// Parameters are uninitialized at construction: bind them with
// load_weights(code2wav, checkpoint, "code2wav."). The code offsets (q * codebook_size) are
// computed, as in the reference where they are a non-persistent buffer.
class Code2Wav : public offload::HookableModule {
 public:
  Code2Wav(const Code2WavConfig& cfg, at::ScalarType dtype);

  // codes [num_quantizers, T] (integer, any device, T >= 1, every code in [0, codebook_size))
  // -> waveform [1, 1, T * samples_per_frame() - 555] (555 for rates 8, 5, 4, 3) in the
  // parameters' dtype, on their device, clamped to [-1, 1]. Runs through invoke("forward") so the
  // offload engine can hook it; throws omni::Error on a wrong group count or an out-of-range code.
  at::Tensor forward(const at::Tensor& codes);
  // forward() for codes already checked with validate_codes (the streamer and chunked_decode
  // check each input once, not each chunk again). Also takes a batch, codes [B, num_quantizers,
  // T] -> [B, 1, T * samples_per_frame() - 555]: every layer is causal, so a row padded on the
  // right keeps the samples of its own frames (decode_windows relies on it).
  at::Tensor forward_validated(const at::Tensor& codes);

  int64_t samples_per_frame() const { return cfg_.samples_per_frame(); }
  const Code2WavConfig& config() const { return cfg_; }

 private:
  at::Tensor forward_impl(const at::Tensor& codes);

  Code2WavConfig cfg_;
  std::shared_ptr<torch::nn::Module> pre_transformer_;
  std::vector<std::shared_ptr<Code2WavTransformerLayer>> layers_;
  std::shared_ptr<RMSNorm> norm_;
  std::shared_ptr<Embedding> code_embedding_;
  std::vector<std::shared_ptr<CausalTransConv>> upsample_convs_;
  std::vector<std::shared_ptr<ConvNeXtBlock>> upsample_blocks_;
  std::shared_ptr<CausalConv> decoder_in_;
  std::vector<std::shared_ptr<Code2WavDecoderBlock>> decoder_blocks_;
  std::shared_ptr<SnakeBeta> decoder_act_;
  std::shared_ptr<CausalConv> decoder_out_;
};

// The reference's Qwen3OmniMoeCode2Wav.chunked_decode: codes [num_quantizers, T] decoded in
// chunks of `chunk_size` frames, each with up to `left_context` previous frames in front whose
// samples are dropped. Returns the waveform [samples] as float32 on the CPU (empty for T = 0).
at::Tensor chunked_decode(Code2Wav& model, const at::Tensor& codes, int64_t chunk_size = 300,
                          int64_t left_context = 25);

}  // namespace omni::models::qwen3_omni
