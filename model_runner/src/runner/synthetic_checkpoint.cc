#include "model_runner/runner/synthetic_checkpoint.h"

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cpu_offload/check.h"
#include "model_runner/qwen3_omni/omni_model.h"
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
  if (t.max_position_embeddings > 0) text["max_position_embeddings"] = t.max_position_embeddings;
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

nlohmann::json rope_json(const qwen3_omni::TextConfig& t) {
  return {{"rope_type", "default"},
          {"rope_theta", t.rope_theta},
          {"mrope_section", t.mrope_section},
          {"interleaved", true}};
}

// The speech half of config.json, in the layout of the released checkpoint.
void add_speech_json(nlohmann::json& root, const SyntheticSpeech& s) {
  const auto& t = s.talker.text;
  const auto& p = s.talker.code_predictor;
  const auto& c = s.code2wav;
  nlohmann::json speakers = nlohmann::json::object();
  for (const auto& [name, id] : s.talker.speakers) speakers[name] = id;
  nlohmann::json text = {{"vocab_size", t.vocab_size},
                         {"hidden_size", t.hidden_size},
                         {"intermediate_size", t.intermediate_size},
                         {"num_hidden_layers", t.num_hidden_layers},
                         {"num_attention_heads", t.num_attention_heads},
                         {"num_key_value_heads", t.num_key_value_heads},
                         {"head_dim", t.head_dim},
                         {"hidden_act", "silu"},
                         {"rms_norm_eps", t.rms_norm_eps},
                         {"rope_parameters", rope_json(t)},
                         {"num_local_experts", t.num_experts},
                         {"num_experts_per_tok", t.num_experts_per_tok},
                         {"moe_intermediate_size", t.moe_intermediate_size},
                         {"shared_expert_intermediate_size", t.shared_expert_intermediate_size},
                         {"norm_topk_prob", t.norm_topk_prob},
                         {"decoder_sparse_step", 1},
                         {"mlp_only_layers", nlohmann::json::array()}};
  nlohmann::json predictor = {
      {"vocab_size", p.vocab_size},
      {"hidden_size", p.hidden_size},
      {"intermediate_size", p.intermediate_size},
      {"num_hidden_layers", p.num_hidden_layers},
      {"num_attention_heads", p.num_attention_heads},
      {"num_key_value_heads", p.num_key_value_heads},
      {"head_dim", p.head_dim},
      {"hidden_act", "silu"},
      {"rms_norm_eps", p.rms_norm_eps},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", p.rope_theta}}},
      {"num_code_groups", p.num_code_groups}};
  const auto& tk = s.talker;
  root["talker_config"] = {{"text_config", text},
                           {"code_predictor_config", predictor},
                           {"num_code_groups", tk.num_code_groups},
                           {"thinker_hidden_size", tk.thinker_hidden_size},
                           {"accept_hidden_layer", tk.accept_hidden_layer},
                           {"codec_eos_token_id", tk.codec_eos_token_id},
                           {"codec_nothink_id", tk.codec_nothink_id},
                           {"codec_think_bos_id", tk.codec_think_bos_id},
                           {"codec_think_eos_id", tk.codec_think_eos_id},
                           {"codec_pad_id", tk.codec_pad_id},
                           {"codec_bos_id", tk.codec_bos_id},
                           {"image_token_id", tk.rope.image_token_id},
                           {"video_token_id", tk.rope.video_token_id},
                           {"spatial_merge_size", tk.rope.spatial_merge_size},
                           {"position_id_per_seconds", tk.rope.position_id_per_seconds},
                           {"speaker_id", speakers}};
  root["code2wav_config"] = {
      {"codebook_size", c.codebook_size},
      {"hidden_size", c.hidden_size},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_quantizers", c.num_quantizers},
      {"sliding_window", c.sliding_window},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", c.rope_theta}}},
      {"upsample_rates", c.upsample_rates},
      {"upsampling_ratios", c.upsampling_ratios},
      {"decoder_dim", c.decoder_dim},
      {"hidden_act", "silu"}};
  root["enable_audio_output"] = true;
  root["im_start_token_id"] = s.ids.im_start;
  root["im_end_token_id"] = s.ids.im_end;
  root["tts_pad_token_id"] = s.ids.tts_pad;
  root["tts_bos_token_id"] = s.ids.tts_bos;
  root["tts_eos_token_id"] = s.ids.tts_eos;
  root["system_token_id"] = s.ids.system;
  root["user_token_id"] = s.ids.user;
  root["assistant_token_id"] = s.ids.assistant;
}

}  // namespace

ThinkerConfig synthetic_thinker_config(const std::string& preset) {
  if (preset == "tiny") return tiny_preset();
  if (preset == "small") return scaled_preset(512, 8, 16, 256, 4);
  if (preset == "medium") return scaled_preset(768, 12, 32, 512, 8);
  if (preset == "speech-real") {
    // A cheap thinker (2 layers, small encoders) of the real hidden size.
    auto c = scaled_preset(2048, 2, 8, 256, 2);
    c.vision.deepstack_visual_indexes = {0, 1};
    return c;
  }
  if (preset == "real") {
    // Qwen3-Omni-30B-A3B's text model, layer for layer (its encoders stay small: this preset
    // measures the decoder, 1.2 GB per layer in bf16, 58 GB of the 60 in its experts).
    auto c = scaled_preset(2048, 48, 128, 256, 2);
    auto& t = c.text;
    t.vocab_size = 152064;
    t.num_attention_heads = 32;
    t.num_key_value_heads = 4;
    t.head_dim = 128;
    t.mrope_section = {24, 20, 20};
    t.intermediate_size = 768;
    t.num_experts = 128;
    t.num_experts_per_tok = 8;
    t.moe_intermediate_size = 768;
    t.max_position_embeddings = 65536;
    c.vision.deepstack_visual_indexes = {0, 1};
    return c;
  }
  OMNI_THROW("unknown synthetic thinker preset '", preset,
             "' (tiny, small, medium, speech-real, real)");
}

SyntheticSpeech synthetic_speech_config(const std::string& preset, const ThinkerConfig& thinker,
                                        int64_t talker_layers) {
  SyntheticSpeech s;
  auto& tk = s.talker;
  auto& t = tk.text;
  auto& p = tk.code_predictor;
  auto& c = s.code2wav;
  // Token ids of the fixture tokenizer (its vocabulary is what every preset uses).
  s.ids.im_start = 1;
  s.ids.im_end = 2;
  s.ids.tts_pad = 811;
  s.ids.tts_bos = 812;
  s.ids.tts_eos = 813;
  s.ids.system = 85;
  s.ids.user = 339;
  s.ids.assistant = 327;
  tk.thinker_hidden_size = thinker.text.hidden_size;
  tk.rope.image_token_id = thinker.image_token_id;
  tk.rope.video_token_id = thinker.video_token_id;
  tk.rope.spatial_merge_size = thinker.vision.spatial_merge_size;
  tk.accept_hidden_layer = std::min<int64_t>(thinker.text.num_hidden_layers, 24);
  if (preset == "tiny") {
    const int64_t codebook = 128;
    t.vocab_size = codebook + 1024;
    t.hidden_size = 32;
    t.intermediate_size = 48;
    t.num_hidden_layers = 2;
    t.num_attention_heads = 4;
    t.num_key_value_heads = 2;
    t.head_dim = 16;
    t.mrope_section = {2, 3, 3};
    t.num_experts = 4;
    t.num_experts_per_tok = 2;
    t.moe_intermediate_size = 16;
    t.shared_expert_intermediate_size = 24;
    p.vocab_size = codebook;
    p.hidden_size = 32;
    p.intermediate_size = 48;
    p.num_hidden_layers = 2;
    p.num_attention_heads = 4;
    p.num_key_value_heads = 2;
    p.head_dim = 8;
    c.codebook_size = codebook;
    c.hidden_size = 32;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 4;
    c.head_dim = 8;
    c.intermediate_size = 64;
    c.num_hidden_layers = 2;
    c.sliding_window = 8;
    c.decoder_dim = 64;
    tk.codec_pad_id = codebook + 100;
    tk.codec_bos_id = codebook + 101;
    tk.codec_eos_token_id = codebook + 102;
    tk.codec_nothink_id = codebook + 107;
    tk.codec_think_bos_id = codebook + 108;
    tk.codec_think_eos_id = codebook + 109;
    tk.speakers = {
        {"aiden", codebook + 255}, {"chelsie", codebook + 253}, {"ethan", codebook + 254}};
  } else if (preset == "real") {
    // Qwen3-Omni-30B-A3B-Instruct config.json (talker_config, code2wav_config).
    t.vocab_size = 3072;
    t.hidden_size = 1024;
    t.intermediate_size = 2048;
    t.num_hidden_layers = 20;
    t.num_attention_heads = 16;
    t.num_key_value_heads = 2;
    t.head_dim = 128;
    t.mrope_section = {24, 20, 20};
    t.num_experts = 128;
    t.num_experts_per_tok = 6;
    t.moe_intermediate_size = 384;
    t.shared_expert_intermediate_size = 768;
    p.vocab_size = 2048;
    p.hidden_size = 1024;
    p.intermediate_size = 3072;
    p.num_hidden_layers = 5;
    p.num_attention_heads = 16;
    p.num_key_value_heads = 8;
    p.head_dim = 128;
    c.codebook_size = 2048;
    c.hidden_size = 1024;
    c.num_attention_heads = 16;
    c.num_key_value_heads = 16;
    c.head_dim = 64;
    c.intermediate_size = 3072;
    c.num_hidden_layers = 8;
    c.sliding_window = 72;
    c.decoder_dim = 1536;
    tk.codec_pad_id = 2148;
    tk.codec_bos_id = 2149;
    tk.codec_eos_token_id = 2150;
    tk.codec_nothink_id = 2155;
    tk.codec_think_bos_id = 2156;
    tk.codec_think_eos_id = 2157;
    tk.speakers = {{"aiden", 2303}, {"chelsie", 2301}, {"ethan", 2302}};
    OMNI_CHECK(thinker.text.hidden_size == 2048, "synthetic speech preset 'real' reads a thinker ",
               "of hidden size 2048 (use the thinker preset speech-real), got ",
               thinker.text.hidden_size);
  } else {
    OMNI_THROW("unknown synthetic speech preset '", preset, "' (tiny, real)");
  }
  if (talker_layers > 0) t.num_hidden_layers = talker_layers;
  tk.num_code_groups = p.num_code_groups = c.num_quantizers = 16;
  return s;
}

int64_t write_synthetic_checkpoint(const std::string& dir, const ThinkerConfig& cfg,
                                   const std::string& assets_dir, at::ScalarType dtype,
                                   uint64_t seed, const SyntheticSpeech* speech) {
  namespace fs = std::filesystem;
  // What was asked, kept beside the files once they are complete: the same request finds it
  // and reuses the checkpoint (the real-shape presets take minutes to write).
  auto json = config_json(cfg);
  if (speech) add_speech_json(json, *speech);
  const nlohmann::json stamp = {
      {"config", json}, {"dtype", std::string(c10::toString(dtype))}, {"seed", seed}};
  const fs::path stamp_path = fs::path(dir) / "synthetic.json";
  if (fs::exists(stamp_path) && fs::exists(fs::path(dir) / "model.safetensors")) {
    try {
      std::ifstream in(stamp_path);
      const auto old = nlohmann::json::parse(in);
      const auto file_bytes = fs::file_size(fs::path(dir) / "model.safetensors");
      if (old.value("request", nlohmann::json()) == stamp &&
          old.value("file_bytes", uint64_t{0}) == file_bytes) {
        return old.at("bytes").get<int64_t>();
      }
    } catch (const std::exception&) {
      // unreadable: written again below
    }
  }
  fs::remove(stamp_path);
  fs::create_directories(dir);
  for (const char* asset : {"tokenizer.json", "preprocessor_config.json"}) {
    const fs::path from = fs::path(assets_dir) / asset;
    OMNI_CHECK(fs::exists(from), "synthetic checkpoint: ", from.string(), " does not exist");
    fs::copy_file(from, fs::path(dir) / asset, fs::copy_options::overwrite_existing);
  }
  {
    const std::string tmp = dir + "/config.json.tmp";
    std::ofstream(tmp, std::ios::trunc) << json.dump(2) << "\n";
    fs::rename(tmp, dir + "/config.json");
  }
  // The module tree decides the tensor names and shapes: what we write is what load expects.
  // Built in the storage dtype: its parameters are never touched, so they cost no memory.
  qwen3_omni::Qwen3Omni model(cfg, speech ? &speech->talker : nullptr,
                              speech ? &speech->code2wav : nullptr, dtype);
  auto gen = at::detail::createCPUGenerator(seed);
  // Each tensor is made when it is written: one in memory at a time, so a checkpoint larger
  // than RAM can be written (the skeleton's parameters are never touched, hence never paged in).
  std::vector<TensorSpec> specs;
  int64_t bytes = 0;
  for (const auto& p : model.named_parameters()) {
    specs.push_back({p.key(), p.value().sizes().vec(), dtype});
    bytes += p.value().numel() * static_cast<int64_t>(c10::elementSize(dtype));
  }
  write_safetensors(dir + "/model.safetensors", specs,
                    [&](size_t i) {
                      const auto& name = specs[i].name;
                      const bool is_norm_weight = specs[i].shape.size() == 1 && name.size() > 7 &&
                                                  name.compare(name.size() - 7, 7, ".weight") == 0;
                      const at::Tensor value = is_norm_weight
                                                   ? at::ones(specs[i].shape)
                                                   : at::normal(0.0, 0.02, specs[i].shape, gen,
                                                                at::TensorOptions(at::kFloat));
                      return value.to(dtype);
                    },
                    {{"format", "pt"}});
  {
    const std::string tmp = stamp_path.string() + ".tmp";
    const nlohmann::json done = {
        {"request", stamp},
        {"bytes", bytes},
        {"file_bytes", fs::file_size(fs::path(dir) / "model.safetensors")}};
    std::ofstream(tmp, std::ios::trunc) << done.dump(2) << "\n";
    fs::rename(tmp, stamp_path);
  }
  return bytes;
}

}  // namespace omni::models
