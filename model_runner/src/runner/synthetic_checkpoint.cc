#include "model_runner/runner/synthetic_checkpoint.h"

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cpu_offload/check.h"
#include "model_runner/qwen3_omni/thinker.h"
#include "model_runner/weights/safetensors.h"

namespace omni::models {

using qwen3_omni::ThinkerConfig;

namespace {

ThinkerConfig tiny_preset() {
  ThinkerConfig c;
  auto& t = c.text;
  t.vocab_size = 1024;
  t.hidden_size = 64;
  t.intermediate_size = 96;
  t.num_hidden_layers = 3;
  t.num_attention_heads = 4;
  t.num_key_value_heads = 2;
  t.head_dim = 16;
  t.mrope_section = {2, 3, 3};
  t.num_experts = 8;
  t.num_experts_per_tok = 2;
  t.moe_intermediate_size = 32;
  t.mlp_only_layers = {1};
  auto& a = c.audio;
  a.d_model = 32;
  a.encoder_layers = 2;
  a.encoder_attention_heads = 4;
  a.encoder_ffn_dim = 64;
  a.n_window_infer = 200;
  a.downsample_hidden_size = 16;
  a.output_dim = 64;
  auto& v = c.vision;
  v.depth = 4;
  v.hidden_size = 32;
  v.intermediate_size = 64;
  v.num_heads = 2;
  v.out_hidden_size = 64;
  v.num_position_embeddings = 16;
  v.deepstack_visual_indexes = {0, 2, 3};
  // The fixture tokenizer's special-token ids.
  c.audio_start_token_id = 800;
  c.audio_end_token_id = 801;
  c.vision_start_token_id = 802;
  c.vision_end_token_id = 803;
  c.image_token_id = 804;
  c.audio_token_id = 805;
  c.video_token_id = 806;
  return c;
}

ThinkerConfig scaled_preset(int64_t hidden, int64_t layers, int64_t experts, int64_t enc_dim,
                            int64_t enc_layers) {
  ThinkerConfig c = tiny_preset();
  auto& t = c.text;
  t.hidden_size = hidden;
  t.num_attention_heads = hidden / 64;
  t.num_key_value_heads = std::max<int64_t>(1, hidden / 128);
  t.head_dim = 64;
  t.mrope_section = {8, 12, 12};
  t.num_hidden_layers = layers;
  t.intermediate_size = 2 * hidden;
  t.num_experts = experts;
  t.num_experts_per_tok = 4;
  t.moe_intermediate_size = hidden / 2;
  t.mlp_only_layers = {};
  auto& a = c.audio;
  a.d_model = enc_dim;
  a.encoder_layers = enc_layers;
  a.encoder_attention_heads = enc_dim / 64;
  a.encoder_ffn_dim = 4 * enc_dim;
  a.downsample_hidden_size = enc_dim / 4;
  a.output_dim = hidden;
  auto& v = c.vision;
  v.depth = enc_layers;
  v.hidden_size = enc_dim;
  v.intermediate_size = 4 * enc_dim;
  v.num_heads = enc_dim / 64;
  v.out_hidden_size = hidden;
  v.num_position_embeddings = 64;
  v.deepstack_visual_indexes = {0, 1, 2};
  return c;
}

nlohmann::json config_json(const ThinkerConfig& c) {
  const auto& t = c.text;
  const auto& a = c.audio;
  const auto& v = c.vision;
  nlohmann::json text = {{"vocab_size", t.vocab_size},
                         {"hidden_size", t.hidden_size},
                         {"intermediate_size", t.intermediate_size},
                         {"num_hidden_layers", t.num_hidden_layers},
                         {"num_attention_heads", t.num_attention_heads},
                         {"num_key_value_heads", t.num_key_value_heads},
                         {"head_dim", t.head_dim},
                         {"hidden_act", t.hidden_act},
                         {"rms_norm_eps", t.rms_norm_eps},
                         {"attention_bias", t.attention_bias},
                         {"rope_parameters",
                          {{"rope_type", "default"},
                           {"rope_theta", t.rope_theta},
                           {"mrope_section", t.mrope_section},
                           {"interleaved", true}}},
                         {"num_experts", t.num_experts},
                         {"num_experts_per_tok", t.num_experts_per_tok},
                         {"moe_intermediate_size", t.moe_intermediate_size},
                         {"decoder_sparse_step", t.decoder_sparse_step},
                         {"norm_topk_prob", t.norm_topk_prob},
                         {"mlp_only_layers", t.mlp_only_layers}};
  nlohmann::json audio = {{"num_mel_bins", a.num_mel_bins},
                          {"d_model", a.d_model},
                          {"encoder_layers", a.encoder_layers},
                          {"encoder_attention_heads", a.encoder_attention_heads},
                          {"encoder_ffn_dim", a.encoder_ffn_dim},
                          {"max_source_positions", a.max_source_positions},
                          {"n_window", a.n_window},
                          {"n_window_infer", a.n_window_infer},
                          {"conv_chunksize", a.conv_chunksize},
                          {"downsample_hidden_size", a.downsample_hidden_size},
                          {"output_dim", a.output_dim},
                          {"activation_function", a.activation_function}};
  nlohmann::json vision = {
      {"depth", v.depth},
      {"hidden_size", v.hidden_size},
      {"intermediate_size", v.intermediate_size},
      {"num_heads", v.num_heads},
      {"in_channels", v.in_channels},
      {"patch_size", v.patch_size},
      {"spatial_merge_size", v.spatial_merge_size},
      {"temporal_patch_size", v.temporal_patch_size},
      {"out_hidden_size", v.out_hidden_size},
      {"num_position_embeddings", v.num_position_embeddings},
      {"deepstack_visual_indexes", v.deepstack_visual_indexes},
      {"hidden_act", v.hidden_act},
      {"rope_parameters", {{"rope_type", "axial"}, {"rope_theta", v.rope_theta}}}};
  nlohmann::json thinker = {{"text_config", text},
                            {"audio_config", audio},
                            {"vision_config", vision},
                            {"audio_token_id", c.audio_token_id},
                            {"image_token_id", c.image_token_id},
                            {"video_token_id", c.video_token_id},
                            {"audio_start_token_id", c.audio_start_token_id},
                            {"audio_end_token_id", c.audio_end_token_id},
                            {"vision_start_token_id", c.vision_start_token_id},
                            {"vision_end_token_id", c.vision_end_token_id},
                            {"position_id_per_seconds", c.position_id_per_seconds},
                            {"tie_word_embeddings", false}};
  return {{"architectures", {"Qwen3OmniMoeForConditionalGeneration"}},
          {"model_type", "qwen3_omni_moe"},
          {"enable_audio_output", false},
          {"thinker_config", thinker}};
}

}  // namespace

ThinkerConfig synthetic_thinker_config(const std::string& preset) {
  if (preset == "tiny") return tiny_preset();
  if (preset == "small") return scaled_preset(512, 8, 16, 256, 4);
  if (preset == "medium") return scaled_preset(768, 12, 32, 512, 8);
  OMNI_THROW("unknown synthetic thinker preset '", preset, "' (tiny, small, medium)");
}

int64_t write_synthetic_checkpoint(const std::string& dir, const ThinkerConfig& cfg,
                                   const std::string& assets_dir, at::ScalarType dtype,
                                   uint64_t seed) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  for (const char* asset : {"tokenizer.json", "preprocessor_config.json"}) {
    const fs::path from = fs::path(assets_dir) / asset;
    OMNI_CHECK(fs::exists(from), "synthetic checkpoint: ", from.string(), " does not exist");
    fs::copy_file(from, fs::path(dir) / asset, fs::copy_options::overwrite_existing);
  }
  {
    const std::string tmp = dir + "/config.json.tmp";
    std::ofstream(tmp, std::ios::trunc) << config_json(cfg).dump(2) << "\n";
    fs::rename(tmp, dir + "/config.json");
  }
  // The module tree decides the tensor names and shapes: what we write is what load expects.
  qwen3_omni::Thinker model(cfg, at::kFloat);
  auto gen = at::detail::createCPUGenerator(seed);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  int64_t bytes = 0;
  for (const auto& p : model.named_parameters()) {
    const auto& name = p.key();
    const bool is_norm_weight =
        p.value().dim() == 1 && name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
    at::Tensor value = is_norm_weight ? at::ones(p.value().sizes())
                                      : at::normal(0.0, 0.02, p.value().sizes(), gen,
                                                   at::TensorOptions(at::kFloat));
    value = value.to(dtype);
    bytes += static_cast<int64_t>(value.nbytes());
    tensors.emplace_back("thinker." + name, value);
  }
  write_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
  return bytes;
}

}  // namespace omni::models
