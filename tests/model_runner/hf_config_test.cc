// HfConfig: typed getters by dotted path, defaults, sub-configs, and error texts that name
// the file, the full field path and the expected vs actual type.
#include <gtest/gtest.h>

#include <optional>

#include "model_runner/weights/hf_config.h"
#include "weights_test_util.h"

namespace omni::models {
namespace {

using testing::error_of;
using testing::write_bytes;

// Shaped like Qwen3-Omni's config.json, with a few deliberately wrong fields.
constexpr const char* kConfig = R"({
  "architectures": ["Qwen3OmniMoeForConditionalGeneration"],
  "model_type": "qwen3_omni_moe",
  "enable_audio_output": true,
  "rope_scaling": null,
  "thinker_config": {
    "text_config": {
      "hidden_size": 2048,
      "rms_norm_eps": 1e-06,
      "rope_theta": 1000000,
      "mrope_section": [24, 20, 20],
      "hidden_act": "silu",
      "use_qk_norm": true,
      "sliding_window": null,
      "intermediate_size": 768.0,
      "bad_list": [1, "two", 3],
      "huge": 18446744073709551615,
      "negative": -3
    }
  }
})";

class HfConfigTest : public testing::TempDirTest {
 protected:
  HfConfig load() {
    write_bytes(path("config.json"), kConfig);
    return HfConfig::load(dir());
  }
};

TEST_F(HfConfigTest, TypedGettersByDottedPath) {
  const HfConfig cfg = load();
  EXPECT_EQ(cfg.source(), path("config.json"));
  EXPECT_EQ(cfg.get_int("thinker_config.text_config.hidden_size"), 2048);
  EXPECT_EQ(cfg.get_int("thinker_config.text_config.negative"), -3);
  EXPECT_DOUBLE_EQ(cfg.get_double("thinker_config.text_config.rms_norm_eps"), 1e-6);
  EXPECT_DOUBLE_EQ(cfg.get_double("thinker_config.text_config.rope_theta"), 1e6);  // an integer
  EXPECT_TRUE(cfg.get_bool("enable_audio_output"));
  EXPECT_EQ(cfg.get_string("model_type"), "qwen3_omni_moe");
  EXPECT_EQ(cfg.get_int_list("thinker_config.text_config.mrope_section"),
            (std::vector<int64_t>{24, 20, 20}));
  EXPECT_EQ(cfg.architectures(), std::vector<std::string>{"Qwen3OmniMoeForConditionalGeneration"});
  // A file path works as well as its directory.
  EXPECT_EQ(HfConfig::load(path("config.json")).get_string("model_type"), "qwen3_omni_moe");
}

TEST_F(HfConfigTest, DefaultsApplyToAbsentAndNullFieldsOnly) {
  const HfConfig cfg = load();
  EXPECT_EQ(cfg.get_int("thinker_config.text_config.hidden_size", 7), 2048);
  EXPECT_EQ(cfg.get_int("thinker_config.text_config.num_experts", 7), 7);
  EXPECT_EQ(cfg.get_int("thinker_config.text_config.sliding_window", 4096), 4096);  // null
  EXPECT_DOUBLE_EQ(cfg.get_double("rope_scaling.factor", 1.5), 1.5);  // null on the way
  EXPECT_EQ(cfg.get_string("talker_config.model_type", "none"), "none");
  EXPECT_FALSE(cfg.get_bool("tie_word_embeddings", false));
  EXPECT_EQ(cfg.get_int_list("nope", std::vector<int64_t>{1, 2}), (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(cfg.has("thinker_config.text_config.hidden_size"));
  EXPECT_TRUE(cfg.has("thinker_config"));
  EXPECT_FALSE(cfg.has("rope_scaling"));
  EXPECT_FALSE(cfg.has("thinker_config.text_config.sliding_window"));
  EXPECT_FALSE(cfg.has("thinker_config.audio_config.d_model"));
  EXPECT_TRUE(HfConfig::parse(R"({"x": 1})", "inline").architectures().empty());
}

TEST_F(HfConfigTest, SubConfigReadsRelativeAndReportsFullPaths) {
  std::optional<HfConfig> text;
  {
    const HfConfig cfg = load();
    text = cfg.sub("thinker_config").sub("text_config");
  }  // the sub-config keeps the parsed file alive on its own
  EXPECT_EQ(text->prefix(), "thinker_config.text_config");
  EXPECT_EQ(text->get_int("hidden_size"), 2048);
  EXPECT_EQ(text->get_string("hidden_act"), "silu");
  EXPECT_FALSE(text->has("model_type"));  // relative to the sub-object, not the root
  EXPECT_CONTAINS(error_of([&] { text->get_int("hidden_act"); }),
                  "config.json: field 'thinker_config.text_config.hidden_act' must be an "
                  "integer, got string");
  EXPECT_CONTAINS(error_of([&] { text->sub("hidden_size"); }),
                  "field 'thinker_config.text_config.hidden_size' must be an object, got integer");
  EXPECT_CONTAINS(error_of([&] { text->sub("audio"); }),
                  "field 'thinker_config.text_config.audio' is missing");
}

TEST_F(HfConfigTest, TypeMismatchErrorsNameFileFieldAndTypes) {
  write_bytes(path("config.json"),
              R"({"thinker_config": {"text_config": {"hidden_size": "2048"}}})");
  const std::string msg =
      error_of([&] { HfConfig::load(dir()).get_int("thinker_config.text_config.hidden_size"); });
  EXPECT_CONTAINS(msg, path("config.json") +
                           ": field 'thinker_config.text_config.hidden_size' must be an "
                           "integer, got string");

  const HfConfig cfg = load();
  const std::string t = "thinker_config.text_config.";
  EXPECT_CONTAINS(error_of([&] { cfg.get_int(t + "intermediate_size"); }),
                  "field '" + t + "intermediate_size' must be an integer, got float");
  EXPECT_CONTAINS(error_of([&] { cfg.get_bool(t + "hidden_size"); }),
                  "must be a boolean, got integer");
  EXPECT_CONTAINS(error_of([&] { cfg.get_string(t + "use_qk_norm"); }),
                  "must be a string, got boolean");
  EXPECT_CONTAINS(error_of([&] { cfg.get_double(t + "hidden_act"); }),
                  "must be a number, got string");
  EXPECT_CONTAINS(error_of([&] { cfg.get_int_list(t + "hidden_size"); }),
                  "must be an array of integers, got integer");
  EXPECT_CONTAINS(error_of([&] { cfg.get_int_list(t + "bad_list"); }),
                  "field '" + t + "bad_list[1]' must be an integer, got string");
  EXPECT_CONTAINS(error_of([&] { cfg.get_int(t + "sliding_window"); }),
                  "field '" + t + "sliding_window' must be an integer, got null");
  EXPECT_CONTAINS(error_of([&] { cfg.get_int(t + "huge"); }),
                  "field '" + t + "huge' = 18446744073709551615 does not fit in int64");
  EXPECT_CONTAINS(error_of([&] { cfg.get_int("model_type.size"); }),
                  "field 'model_type' must be an object, got string");
  // A default does not hide a wrong type.
  EXPECT_CONTAINS(error_of([&] { cfg.get_int(t + "hidden_act", 1); }), "got string");
}

TEST_F(HfConfigTest, MissingFieldErrorSuggestsSimilarFields) {
  const HfConfig cfg = load();
  const std::string msg = error_of([&] { cfg.get_int("thinker_config.text_config.hidden_sise"); });
  EXPECT_CONTAINS(
      msg, path("config.json") + ": field 'thinker_config.text_config.hidden_sise' is missing");
  EXPECT_CONTAINS(msg, "similar: 'thinker_config.text_config.hidden_size'");
  EXPECT_CONTAINS(error_of([&] { cfg.get_int("rope_scaling.factor"); }),
                  "field 'rope_scaling.factor' is missing ('rope_scaling' is null)");
}

TEST_F(HfConfigTest, InvalidJsonErrorNamesFileAndBytePosition) {
  write_bytes(path("config.json"), "{\"a\": 1,,}");
  const std::string msg = error_of([&] { HfConfig::load(dir()); });
  EXPECT_CONTAINS(msg, path("config.json") + ": invalid JSON at byte 9");
  EXPECT_CONTAINS(msg, "parse error");
  EXPECT_CONTAINS(error_of([&] { HfConfig::parse("[1, 2]", "cfg.json"); }),
                  "cfg.json: the top level must be an object, got array");
  EXPECT_CONTAINS(error_of([&] { HfConfig::load(path("missing")); }),
                  "cannot read config '" + path("missing") + "'");
}

}  // namespace
}  // namespace omni::models
