#include "model_runner/qwen3_omni/config.h"

#include <algorithm>
#include <cctype>
#include <numeric>
#include <sstream>

#include <nlohmann/json.hpp>
#include "config_checks.h"
#include "cpu_offload/check.h"

#include "model_runner/weights/hf_config.h"

namespace omni::models::qwen3_omni {
namespace {

std::string join(const std::vector<std::string>& items) {
  std::ostringstream out;
  for (size_t i = 0; i < items.size(); ++i) out << (i ? ", " : "") << items[i];
  return out.str();
}

// Rope settings live in "rope_parameters" (transformers >= 5) or in "rope_theta" +
// "rope_scaling" (the released Qwen3-Omni checkpoints, written by 4.x).
void parse_text_rope(const HfConfig& c, TextConfig& t) {
  if (c.has("rope_parameters")) {
    t.rope_theta = c.get_double("rope_parameters.rope_theta", t.rope_theta);
    t.mrope_section = c.get_int_list("rope_parameters.mrope_section", t.mrope_section);
    t.mrope_interleaved = c.get_bool("rope_parameters.interleaved", t.mrope_interleaved);
  } else {
    t.rope_theta = c.get_double("rope_theta", t.rope_theta);
    t.mrope_section = c.get_int_list("rope_scaling.mrope_section", t.mrope_section);
    t.mrope_interleaved = c.get_bool("rope_scaling.interleaved", t.mrope_interleaved);
  }
  const std::string type = c.has("rope_parameters")
                               ? c.get_string("rope_parameters.rope_type", "default")
                               : c.get_string("rope_scaling.rope_type", "default");
  require(type == "default", c, "rope_parameters.rope_type",
          "only \"default\" rope is supported, got \"" + type + "\"");
  require(t.mrope_interleaved, c, "rope_parameters.interleaved",
          "only interleaved multimodal rope (Qwen3-Omni) is supported");
}

TextConfig parse_text(const HfConfig& c) {
  TextConfig t;
  t.vocab_size = positive(c, "vocab_size");
  t.hidden_size = positive(c, "hidden_size");
  t.intermediate_size = c.get_int("intermediate_size", 0);
  t.num_hidden_layers = positive(c, "num_hidden_layers");
  t.num_attention_heads = positive(c, "num_attention_heads");
  t.num_key_value_heads = positive(c, "num_key_value_heads");
  // The config class's default head_dim is hidden / heads, the real checkpoints set it.
  t.head_dim = c.get_int("head_dim", t.hidden_size / t.num_attention_heads);
  t.hidden_act = c.get_string("hidden_act", t.hidden_act);
  t.rms_norm_eps = c.get_double("rms_norm_eps", t.rms_norm_eps);
  t.attention_bias = c.get_bool("attention_bias", false);
  t.max_position_embeddings = c.get_int("max_position_embeddings", 0);
  require(t.max_position_embeddings >= 0, c, "max_position_embeddings", "must be >= 0");
  parse_text_rope(c, t);
  // The talker's text config names it num_local_experts (transformers' attribute_map).
  t.num_experts = c.get_int("num_experts", c.get_int("num_local_experts", 0));
  t.num_experts_per_tok = c.get_int("num_experts_per_tok", 0);
  t.moe_intermediate_size = c.get_int("moe_intermediate_size", 0);
  t.decoder_sparse_step = c.get_int("decoder_sparse_step", 1);
  t.norm_topk_prob = c.get_bool("norm_topk_prob", true);
  t.mlp_only_layers = c.get_int_list("mlp_only_layers", std::vector<int64_t>{});
  t.shared_expert_intermediate_size = c.get_int("shared_expert_intermediate_size", 0);

  require(t.num_attention_heads % t.num_key_value_heads == 0, c, "num_key_value_heads",
          "must divide num_attention_heads (" + std::to_string(t.num_attention_heads) + ")");
  require(t.head_dim % 2 == 0, c, "head_dim", "must be even");
  const int64_t section_sum =
      std::accumulate(t.mrope_section.begin(), t.mrope_section.end(), int64_t{0});
  require(t.mrope_section.size() == 3 && section_sum == t.head_dim / 2, c,
          "rope_parameters.mrope_section",
          "must have 3 entries summing to head_dim / 2 = " + std::to_string(t.head_dim / 2));
  require(t.hidden_act == "silu", c, "hidden_act", "only silu is supported, got " + t.hidden_act);
  if (t.num_experts > 0) {
    require(t.num_experts_per_tok > 0 && t.num_experts_per_tok <= t.num_experts, c,
            "num_experts_per_tok", "must be in [1, num_experts]");
    require(t.moe_intermediate_size > 0, c, "moe_intermediate_size", "must be > 0");
    require(t.decoder_sparse_step > 0, c, "decoder_sparse_step", "must be > 0");
  }
  bool any_dense = false;
  for (int64_t i = 0; i < t.num_hidden_layers; ++i) any_dense |= !t.is_sparse_layer(i);
  if (any_dense) {
    require(t.intermediate_size > 0, c, "intermediate_size", "must be > 0 (dense layers exist)");
  }
  return t;
}

AudioEncoderConfig parse_audio(const HfConfig& c) {
  AudioEncoderConfig a;
  a.num_mel_bins = positive(c, "num_mel_bins");
  a.d_model = positive(c, "d_model");
  a.encoder_layers = positive(c, "encoder_layers");
  a.encoder_attention_heads = positive(c, "encoder_attention_heads");
  a.encoder_ffn_dim = positive(c, "encoder_ffn_dim");
  a.max_source_positions = c.get_int("max_source_positions", a.max_source_positions);
  a.n_window = c.get_int("n_window", a.n_window);
  a.n_window_infer = c.get_int("n_window_infer", a.n_window_infer);
  a.conv_chunksize = c.get_int("conv_chunksize", a.conv_chunksize);
  a.downsample_hidden_size = positive(c, "downsample_hidden_size");
  a.output_dim = positive(c, "output_dim");
  a.activation_function = c.get_string("activation_function", a.activation_function);
  a.scale_embedding = c.get_bool("scale_embedding", false);
  require(a.d_model % a.encoder_attention_heads == 0, c, "encoder_attention_heads",
          "must divide d_model (" + std::to_string(a.d_model) + ")");
  require(a.n_window > 0 && a.n_window_infer >= 2 * a.n_window, c, "n_window_infer",
          "must be >= 2 * n_window > 0");
  require(a.activation_function == "gelu", c, "activation_function",
          "only gelu is supported, got " + a.activation_function);
  return a;
}

VisionEncoderConfig parse_vision(const HfConfig& c) {
  VisionEncoderConfig v;
  v.depth = positive(c, "depth");
  v.hidden_size = positive(c, "hidden_size");
  v.intermediate_size = positive(c, "intermediate_size");
  v.num_heads = positive(c, "num_heads");
  v.in_channels = c.get_int("in_channels", v.in_channels);
  v.patch_size = positive(c, "patch_size");
  v.spatial_merge_size = c.get_int("spatial_merge_size", v.spatial_merge_size);
  v.temporal_patch_size = c.get_int("temporal_patch_size", v.temporal_patch_size);
  v.out_hidden_size = positive(c, "out_hidden_size");
  v.num_position_embeddings = positive(c, "num_position_embeddings");
  v.deepstack_visual_indexes =
      c.get_int_list("deepstack_visual_indexes", v.deepstack_visual_indexes);
  v.hidden_act = c.get_string("hidden_act", v.hidden_act);
  v.rope_theta = c.get_double("rope_parameters.rope_theta", v.rope_theta);
  require(v.hidden_size % v.num_heads == 0 && (v.hidden_size / v.num_heads) % 4 == 0, c,
          "num_heads", "hidden_size / num_heads must be a multiple of 4");
  int64_t side = 0;
  while ((side + 1) * (side + 1) <= v.num_position_embeddings) ++side;
  require(side * side == v.num_position_embeddings, c, "num_position_embeddings",
          "must be a perfect square");
  for (int64_t idx : v.deepstack_visual_indexes) {
    require(idx >= 0 && idx < v.depth, c, "deepstack_visual_indexes",
            "entry " + std::to_string(idx) + " is not a block index (depth " +
                std::to_string(v.depth) + ")");
  }
  require(v.hidden_act == "gelu_pytorch_tanh" || v.hidden_act == "gelu", c, "hidden_act",
          "only gelu / gelu_pytorch_tanh are supported, got " + v.hidden_act);
  return v;
}

CodePredictorConfig parse_code_predictor(const HfConfig& c) {
  CodePredictorConfig p;
  p.vocab_size = positive(c, "vocab_size");
  p.hidden_size = positive(c, "hidden_size");
  p.intermediate_size = positive(c, "intermediate_size");
  p.num_hidden_layers = positive(c, "num_hidden_layers");
  p.num_attention_heads = positive(c, "num_attention_heads");
  p.num_key_value_heads = positive(c, "num_key_value_heads");
  p.head_dim = c.get_int("head_dim", p.hidden_size / p.num_attention_heads);
  p.rms_norm_eps = c.get_double("rms_norm_eps", p.rms_norm_eps);
  p.attention_bias = c.get_bool("attention_bias", false);
  p.rope_theta = c.has("rope_parameters") ? c.get_double("rope_parameters.rope_theta", p.rope_theta)
                                          : c.get_double("rope_theta", p.rope_theta);
  p.num_code_groups = positive(c, "num_code_groups");
  const std::string act = c.get_string("hidden_act", "silu");
  require(act == "silu", c, "hidden_act", "only silu is supported, got " + act);
  require(p.num_attention_heads % p.num_key_value_heads == 0, c, "num_key_value_heads",
          "must divide num_attention_heads (" + std::to_string(p.num_attention_heads) + ")");
  require(p.head_dim % 2 == 0, c, "head_dim", "must be even");
  // The reference masks sliding layers to a window; the released checkpoint has none.
  if (c.has("layer_types")) {
    for (const auto& type : c.raw().at("layer_types")) {
      require(type == "full_attention", c, "layer_types",
              "only full_attention layers are supported, got " + type.dump());
    }
  }
  return p;
}

}  // namespace

bool TextConfig::is_sparse_layer(int64_t layer) const {
  for (int64_t l : mlp_only_layers) {
    if (l == layer) return false;
  }
  return num_experts > 0 && (layer + 1) % decoder_sparse_step == 0;
}

const std::vector<std::string>& supported_architectures() {
  static const std::vector<std::string> kArchitectures = {
      "Qwen3OmniMoeForConditionalGeneration", "Qwen3OmniMoeThinkerForConditionalGeneration"};
  return kArchitectures;
}

ThinkerConfig parse_thinker_config(const HfConfig& root) {
  const auto archs = root.architectures();
  std::string arch;
  for (const auto& a : archs) {
    for (const auto& s : supported_architectures()) {
      if (a == s) arch = a;
    }
  }
  if (arch.empty()) {
    OMNI_THROW(root.source(), ": architectures: ",
               (archs.empty() ? std::string("missing") : "[" + join(archs) + "] is not supported"),
               "; this runner implements ", join(supported_architectures()));
  }
  const bool full = arch == "Qwen3OmniMoeForConditionalGeneration";
  const HfConfig t = full ? root.sub("thinker_config") : root;

  ThinkerConfig cfg;
  cfg.weight_prefix = full ? "thinker." : "";
  cfg.text = parse_text(t.sub("text_config"));
  cfg.audio = parse_audio(t.sub("audio_config"));
  cfg.vision = parse_vision(t.sub("vision_config"));
  cfg.audio_token_id = t.get_int("audio_token_id", cfg.audio_token_id);
  cfg.image_token_id = t.get_int("image_token_id", cfg.image_token_id);
  cfg.video_token_id = t.get_int("video_token_id", cfg.video_token_id);
  cfg.audio_start_token_id = t.get_int("audio_start_token_id", cfg.audio_start_token_id);
  cfg.audio_end_token_id = t.get_int("audio_end_token_id", cfg.audio_end_token_id);
  cfg.vision_start_token_id = t.get_int("vision_start_token_id", cfg.vision_start_token_id);
  cfg.vision_end_token_id = t.get_int("vision_end_token_id", cfg.vision_end_token_id);
  cfg.position_id_per_seconds = t.get_int("position_id_per_seconds", 25);
  cfg.tie_word_embeddings = t.get_bool("tie_word_embeddings", false);

  const HfConfig text = t.sub("text_config");
  for (auto [name, id] : {std::pair<const char*, int64_t>{"audio_token_id", cfg.audio_token_id},
                          {"image_token_id", cfg.image_token_id},
                          {"audio_start_token_id", cfg.audio_start_token_id},
                          {"vision_start_token_id", cfg.vision_start_token_id}}) {
    require(id >= 0 && id < cfg.text.vocab_size, t, name,
            std::to_string(id) + " is not below text_config.vocab_size " +
                std::to_string(cfg.text.vocab_size));
  }
  require(cfg.audio.output_dim == cfg.text.hidden_size, t, "audio_config.output_dim",
          "must equal text_config.hidden_size " + std::to_string(cfg.text.hidden_size));
  require(cfg.vision.out_hidden_size == cfg.text.hidden_size, t, "vision_config.out_hidden_size",
          "must equal text_config.hidden_size " + std::to_string(cfg.text.hidden_size));
  require(static_cast<int64_t>(cfg.vision.deepstack_visual_indexes.size()) <=
              cfg.text.num_hidden_layers,
          t, "vision_config.deepstack_visual_indexes",
          "has more entries than the decoder has layers");
  return cfg;
}

}  // namespace omni::models::qwen3_omni

namespace omni::models::qwen3_omni {

RopeIndexIds rope_index_ids(const ThinkerConfig& cfg) {
  RopeIndexIds ids;
  ids.image_token_id = cfg.image_token_id;
  ids.video_token_id = cfg.video_token_id;
  ids.spatial_merge_size = cfg.vision.spatial_merge_size;
  ids.position_id_per_seconds = cfg.position_id_per_seconds;
  return ids;
}

bool has_speech_output(const HfConfig& config) {
  const auto archs = config.architectures();
  const bool full =
      std::find(archs.begin(), archs.end(), "Qwen3OmniMoeForConditionalGeneration") != archs.end();
  return full && config.get_bool("enable_audio_output", true) && config.has("talker_config");
}

TalkerConfig parse_talker_config(const HfConfig& root, const ThinkerConfig& thinker) {
  const HfConfig c = root.sub("talker_config");
  TalkerConfig t;
  t.text = parse_text(c.sub("text_config"));
  // The reference builds every talker layer as a sparse MoE block with a shared expert
  // (Qwen3OmniMoeTalkerDecoderLayer replaces the MLP unconditionally).
  t.text.mlp_only_layers.clear();
  t.text.decoder_sparse_step = 1;
  const HfConfig text = c.sub("text_config");
  require(t.text.num_experts > 0, text, "num_experts",
          "the talker needs experts (num_experts / num_local_experts > 0)");
  require(t.text.shared_expert_intermediate_size > 0, text, "shared_expert_intermediate_size",
          "must be > 0");
  t.code_predictor = parse_code_predictor(c.sub("code_predictor_config"));
  t.num_code_groups = positive(c, "num_code_groups");
  t.thinker_hidden_size = positive(c, "thinker_hidden_size");
  t.accept_hidden_layer = c.get_int("accept_hidden_layer", t.accept_hidden_layer);
  t.codec_eos_token_id = c.get_int("codec_eos_token_id", t.codec_eos_token_id);
  t.codec_nothink_id = c.get_int("codec_nothink_id", t.codec_nothink_id);
  t.codec_think_bos_id = c.get_int("codec_think_bos_id", t.codec_think_bos_id);
  t.codec_think_eos_id = c.get_int("codec_think_eos_id", t.codec_think_eos_id);
  t.codec_pad_id = c.get_int("codec_pad_id", t.codec_pad_id);
  t.codec_bos_id = c.get_int("codec_bos_id", t.codec_bos_id);
  t.rope.image_token_id = c.get_int("image_token_id", thinker.image_token_id);
  t.rope.video_token_id = c.get_int("video_token_id", thinker.video_token_id);
  t.rope.spatial_merge_size = c.get_int("spatial_merge_size", thinker.vision.spatial_merge_size);
  t.rope.position_id_per_seconds = c.get_int("position_id_per_seconds", 25);

  require(c.has("speaker_id") && c.raw().at("speaker_id").is_object() &&
              !c.raw().at("speaker_id").empty(),
          c, "speaker_id", "must be a non-empty object of speaker name -> codec id");
  for (const auto& [name, id] : c.raw().at("speaker_id").items()) {
    require(id.is_number_integer(), c, "speaker_id." + name, "must be an integer");
    std::string lower = name;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    t.speakers.emplace_back(lower, id.get<int64_t>());
  }
  std::sort(t.speakers.begin(), t.speakers.end());

  const int64_t vocab = t.text.vocab_size;
  for (auto [name, id] :
       {std::pair<const char*, int64_t>{"codec_eos_token_id", t.codec_eos_token_id},
        {"codec_nothink_id", t.codec_nothink_id},
        {"codec_think_bos_id", t.codec_think_bos_id},
        {"codec_think_eos_id", t.codec_think_eos_id},
        {"codec_pad_id", t.codec_pad_id},
        {"codec_bos_id", t.codec_bos_id}}) {
    require(id >= 0 && id < vocab, c, name,
            std::to_string(id) + " is not below text_config.vocab_size " + std::to_string(vocab));
  }
  for (const auto& [name, id] : t.speakers) {
    require(id >= 0 && id < vocab, c, "speaker_id." + name,
            std::to_string(id) + " is not below text_config.vocab_size " + std::to_string(vocab));
  }
  require(t.num_code_groups == t.code_predictor.num_code_groups, c,
          "code_predictor_config.num_code_groups",
          "must equal num_code_groups " + std::to_string(t.num_code_groups));
  require(t.code_predictor.hidden_size == t.text.hidden_size, c,
          "code_predictor_config.hidden_size",
          "must equal text_config.hidden_size " + std::to_string(t.text.hidden_size));
  require(t.thinker_hidden_size == thinker.text.hidden_size, c, "thinker_hidden_size",
          "must equal thinker_config.text_config.hidden_size " +
              std::to_string(thinker.text.hidden_size));
  require(
      t.accept_hidden_layer >= 0 && t.accept_hidden_layer <= thinker.text.num_hidden_layers, c,
      "accept_hidden_layer",
      "must be in [0, thinker layers = " + std::to_string(thinker.text.num_hidden_layers) + "]");
  // Codes 0..codebook-1 are sampled; the reference suppresses the top 1024 ids except EOS.
  require(vocab > 1024, text, "vocab_size",
          "must exceed the 1024 special codec ids (got " + std::to_string(vocab) + ")");
  return t;
}

OmniTokenIds parse_omni_token_ids(const HfConfig& root, const ThinkerConfig& thinker) {
  OmniTokenIds ids;
  ids.im_start = root.get_int("im_start_token_id", ids.im_start);
  ids.im_end = root.get_int("im_end_token_id", ids.im_end);
  ids.tts_pad = root.get_int("tts_pad_token_id", ids.tts_pad);
  ids.tts_bos = root.get_int("tts_bos_token_id", ids.tts_bos);
  ids.tts_eos = root.get_int("tts_eos_token_id", ids.tts_eos);
  ids.system = root.get_int("system_token_id", ids.system);
  ids.user = root.get_int("user_token_id", ids.user);
  ids.assistant = root.get_int("assistant_token_id", ids.assistant);
  for (auto [name, id] : {std::pair<const char*, int64_t>{"im_start_token_id", ids.im_start},
                          {"tts_pad_token_id", ids.tts_pad},
                          {"tts_bos_token_id", ids.tts_bos},
                          {"tts_eos_token_id", ids.tts_eos},
                          {"user_token_id", ids.user},
                          {"assistant_token_id", ids.assistant}}) {
    require(id >= 0 && id < thinker.text.vocab_size, root, name,
            std::to_string(id) + " is not below thinker_config.text_config.vocab_size " +
                std::to_string(thinker.text.vocab_size));
  }
  return ids;
}

}  // namespace omni::models::qwen3_omni
