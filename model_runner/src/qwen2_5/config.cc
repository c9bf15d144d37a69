#include "model_runner/qwen2_5/config.h"

#include <nlohmann/json.hpp>
#include <numeric>
#include <string>

#include "model_runner/weights/hf_config.h"
#include "weights/config_checks.h"

namespace omni::models::qwen2_5 {
namespace {

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// transformers 4.x writes {"type": "mrope"} for multimodal rope (it means default rope with
// sections); both spellings name the rope kind.
void check_rope_kind(const HfConfig& c, const std::string& object) {
  for (const char* key : {"rope_type", "type"}) {
    const std::string field = object + "." + key;
    const std::string kind = c.get_string(field, "default");
    require(kind == "default" || kind == "mrope", c, field,
            "only default (or multimodal \"mrope\") rope is supported, got \"" + kind + "\"");
  }
}

void parse_rope(const HfConfig& c, bool multimodal, TextConfig& t) {
  const std::string object = c.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  t.rope_theta = object == "rope_parameters" ? c.get_double("rope_parameters.rope_theta")
                                             : c.get_double("rope_theta");
  if (c.has(object)) check_rope_kind(c, object);
  // Qwen2_5_VLRotaryEmbedding's default sections when the config names none.
  const std::vector<int64_t> fallback =
      multimodal ? std::vector<int64_t>{16, 24, 24} : std::vector<int64_t>{};
  t.mrope_section = c.get_int_list(object + ".mrope_section", fallback);
  if (t.mrope_section.empty()) return;
  int64_t sum = 0;
  for (int64_t s : t.mrope_section) {
    require(s >= 0, c, object + ".mrope_section", "sections must be >= 0");
    sum += s;
  }
  require(t.mrope_section.size() == 3 && sum == t.head_dim / 2, c, object + ".mrope_section",
          "must have 3 entries (temporal, height, width) summing to head_dim / 2 = " +
              std::to_string(t.head_dim / 2) + ", got a sum of " + std::to_string(sum));
}

void check_full_attention(const HfConfig& c) {
  require(!c.get_bool("use_sliding_window", false), c, "use_sliding_window",
          "sliding-window attention is not supported");
  if (!c.has("layer_types")) return;
  const auto& types = c.raw().at("layer_types");
  require(types.is_array(), c, "layer_types", "must be a list");
  for (size_t i = 0; i < types.size(); ++i) {
    const bool full = types[i].is_string() && types[i].get<std::string>() == "full_attention";
    require(full, c, "layer_types",
            "entry " + std::to_string(i) + " is " + types[i].dump() +
                ", only \"full_attention\" is supported");
  }
}

}  // namespace

TextConfig TextConfig::parse(const HfConfig& json) {
  // Qwen2.5-VL nests the decoder under text_config; the first releases (and Qwen2) are flat.
  const bool nested = json.has("text_config");
  const HfConfig c = nested ? json.sub("text_config") : json;
  const std::string type = c.get_string("model_type", json.get_string("model_type", ""));
  const bool multimodal =
      nested || starts_with(type, "qwen2_5_vl") || starts_with(type, "qwen2_vl");

  TextConfig t;
  t.vocab_size = positive(c, "vocab_size");
  t.hidden_size = positive(c, "hidden_size");
  t.intermediate_size = positive(c, "intermediate_size");
  t.num_hidden_layers = positive(c, "num_hidden_layers");
  t.num_attention_heads = positive(c, "num_attention_heads");
  t.num_key_value_heads = positive(c, "num_key_value_heads", t.num_attention_heads);
  t.rms_norm_eps = c.get_double("rms_norm_eps", 1e-6);
  t.tie_word_embeddings = json.get_bool("tie_word_embeddings", false);

  require(t.hidden_size % t.num_attention_heads == 0, c, "num_attention_heads",
          "must divide hidden_size (" + std::to_string(t.hidden_size) + ")");
  require(t.num_attention_heads % t.num_key_value_heads == 0, c, "num_key_value_heads",
          "must divide num_attention_heads (" + std::to_string(t.num_attention_heads) + ")");
  // Qwen2_5_VLAttention sizes its heads as hidden_size / num_attention_heads whatever the
  // config says; a different head_dim would give the rope another width than the heads.
  t.head_dim = t.hidden_size / t.num_attention_heads;
  require(c.get_int("head_dim", t.head_dim) == t.head_dim, c, "head_dim",
          "must be hidden_size / num_attention_heads = " + std::to_string(t.head_dim));
  require(t.head_dim % 2 == 0, c, "head_dim", "must be even");
  const std::string act = c.get_string("hidden_act", "silu");
  require(act == "silu", c, "hidden_act", "only silu is supported, got \"" + act + "\"");
  check_full_attention(c);

  // Rope settings sit in text_config, or at the top level of configs that nest only some fields.
  const bool rope_here = c.has("rope_parameters") || c.has("rope_scaling") || c.has("rope_theta");
  parse_rope(rope_here || !nested ? c : json, multimodal, t);
  return t;
}

TextConfig TextConfig::load(const std::string& dir) { return parse(HfConfig::load(dir)); }

}  // namespace omni::models::qwen2_5
