// Tokenizer on a SentencePiece Unigram tokenizer.json (T5TokenizerFast, as Wan2.x's UMT5 text
// encoder uses): tests/fixtures/umt5_tokenizer_tiny/ must give exactly the ids, padded ids,
// attention masks and decoded text Hugging Face produced in reference.json
// (make_umt5_tokenizer_fixture.py), and unsupported parts must be refused by name.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model_runner/tokenizer/tokenizer.h"
#include "weights_test_util.h"

namespace omni::models {
namespace {

using Json = nlohmann::json;
using testing::error_of;

const std::string kFixtureDir = std::string(OMNI_FIXTURES_DIR) + "/umt5_tokenizer_tiny";

Json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return Json::parse(in);
}

const Tokenizer& tokenizer() {
  static const Tokenizer tok = Tokenizer::load(kFixtureDir);
  return tok;
}

TEST(Umt5Tokenizer, EveryReferenceStringGivesHuggingFacesIds) {
  const Json reference = read_json(kFixtureDir + "/reference.json");
  const size_t max_length = reference.at("max_length").get<size_t>();
  const int32_t pad_id = tokenizer().token_id("<pad>");
  ASSERT_EQ(pad_id, 0);
  ASSERT_EQ(tokenizer().token_id("</s>"), 1);
  size_t equal = 0;
  size_t total = 0;
  for (const Json& c : reference.at("cases")) {
    const std::string text = c.at("text").get<std::string>();
    const auto ids = tokenizer().encode_with_template(text);
    const auto expected = c.at("ids").get<std::vector<int32_t>>();
    EXPECT_EQ(ids, expected) << "text: '" << text << "'";
    const auto padded = tokenizer().encode_padded(text, max_length, pad_id);
    EXPECT_EQ(padded.ids, c.at("padded_ids").get<std::vector<int32_t>>())
        << "text: '" << text << "'";
    EXPECT_EQ(padded.attention_mask, c.at("attention_mask").get<std::vector<int32_t>>())
        << "text: '" << text << "'";
    EXPECT_EQ(tokenizer().decode(expected, /*skip_special=*/true),
              c.at("decoded").get<std::string>())
        << "text: '" << text << "'";
    ++total;
    if (ids == expected && padded.ids == c.at("padded_ids").get<std::vector<int32_t>>()) ++equal;
  }
  const size_t hand_written = reference.at("hand_written").get<size_t>();
  std::cout << equal << " of " << total << " reference strings (" << hand_written
            << " hand-written, the rest random) give Hugging Face's ids and padded ids\n";
  EXPECT_EQ(equal, total);
  EXPECT_GE(hand_written, 30u);
  EXPECT_GE(total, hand_written + 100);
}

TEST(Umt5Tokenizer, ConverterVariantGivesItsIds) {
  // Normalizer Sequence[Precompiled, Strip, Replace], a lone Metaspace: how transformers 4.4x
  // wrote T5 tokenizer.json files.
  const Tokenizer variant = Tokenizer::load(kFixtureDir + "/converter_variant.json");
  const Json reference = read_json(kFixtureDir + "/reference.json");
  size_t checked = 0;
  for (const Json& c : reference.at("cases")) {
    const std::string text = c.at("text").get<std::string>();
    const auto expected = c.at("converter_variant_ids").get<std::vector<int32_t>>();
    EXPECT_EQ(variant.encode_with_template(text), expected) << "text: '" << text << "'";
    ++checked;
  }
  // Hugging Face gives both files the same ids on every case (the charsmap turns other
  // whitespace into spaces, and Replace + a lone Metaspace then cut where WhitespaceSplit does),
  // but the variant runs the Strip, Replace and lone-Metaspace code.
  EXPECT_GE(checked, 100u);
}

TEST(Umt5Tokenizer, EncodeHasNoTemplate) {
  // encode() is add_special_tokens=False: no </s>.
  const auto with = tokenizer().encode_with_template("hello");
  auto without = tokenizer().encode("hello");
  without.push_back(1);
  EXPECT_EQ(with, without);
  EXPECT_TRUE(tokenizer().encode("").empty());
}

// A SentencePiece tokenizer can drop text (Strip, WhitespaceSplit) and fuses unknown
// characters, so no length refuses a text up front; the count still stops it.
TEST(Umt5Tokenizer, ALimitStopsTheEncodingAndChangesNoIds) {
  const Json reference = read_json(kFixtureDir + "/reference.json");
  for (const Tokenizer& tok :
       {tokenizer(), Tokenizer::load(kFixtureDir + "/converter_variant.json")}) {
    for (const Json& c : reference.at("cases")) {
      const std::string text = c.at("text").get<std::string>();
      const auto ids = tok.encode(text);
      EXPECT_EQ(tok.encode(text, true, ids.size()), ids) << "text: '" << text << "'";
      if (ids.empty()) continue;
      EXPECT_THROW(tok.encode(text, true, ids.size() - 1), TokenLimitError)
          << "text: '" << text << "'";
    }
  }
  std::string text;
  for (int i = 0; i < 100000; ++i) text += "hello ";
  const size_t word = tokenizer().encode("hello").size();
  try {
    tokenizer().encode(text, true, 1000);
    FAIL() << "no error";
  } catch (const TokenLimitError& e) {
    EXPECT_GT(e.encoded(), 1000u);
    EXPECT_LE(e.encoded(), 1000u + word);
  }
  // Whitespace is dropped: a megabyte of it makes no token.
  EXPECT_TRUE(tokenizer().encode(std::string(1 << 20, ' '), true, 0).empty());
}

std::string edit_error(const std::function<void(Json&)>& edit) {
  Json json = read_json(kFixtureDir + "/tokenizer.json");
  edit(json);
  return error_of([&] { Tokenizer::parse(json.dump(), "edited tokenizer.json"); });
}

TEST(Umt5Tokenizer, RefusesUnsupportedComponentsByName) {
  EXPECT_CONTAINS(edit_error([](Json& json) {
                    json["normalizer"] = {{"type", "NFKD"}};
                  }),
                  "edited tokenizer.json: field 'normalizer.type': unsupported normalizer 'NFKD'");
  EXPECT_CONTAINS(
      edit_error([](Json& json) {
        json["normalizer"] = {
            {"type", "Sequence"},
            {"normalizers", Json::array({json["normalizer"], {{"type", "Lowercase"}}})}};
      }),
      "field 'normalizer.normalizers[1].type': unsupported normalizer 'Lowercase'");
  EXPECT_CONTAINS(
      edit_error([](Json& json) { json["normalizer"]["precompiled_charsmap"] = "not base64!"; }),
      "field 'normalizer.precompiled_charsmap': is not base64");
  EXPECT_CONTAINS(edit_error([](Json& json) {
                    json["pre_tokenizer"]["pretokenizers"][1]["prepend_scheme"] = "sometimes";
                  }),
                  "unsupported prepend_scheme 'sometimes'");
  EXPECT_CONTAINS(edit_error([](Json& json) {
                    json["pre_tokenizer"]["pretokenizers"][0]["type"] = "Punctuation";
                  }),
                  "field 'pre_tokenizer.pretokenizers': unsupported SentencePiece pre-tokenizer "
                  "sequence (supported: [Metaspace], [WhitespaceSplit, Metaspace])");
  EXPECT_CONTAINS(edit_error([](Json& json) {
                    json["decoder"] = {{"type", "ByteLevel"}};
                  }),
                  "field 'decoder.type': unsupported decoder 'ByteLevel'");
  EXPECT_CONTAINS(edit_error([](Json& json) { json["model"]["unk_id"] = 100000; }),
                  "field 'model.unk_id': id 100000 is outside model.vocab");
  EXPECT_CONTAINS(edit_error([](Json& json) { json["model"]["type"] = "WordLevel"; }),
                  "unsupported model type 'WordLevel'");
  // An unsupported post-processor only fails what needs it.
  Json json = read_json(kFixtureDir + "/tokenizer.json");
  json["post_processor"] = {{"type", "RobertaProcessing"}};
  const Tokenizer tok = Tokenizer::parse(json.dump(), "edited tokenizer.json");
  EXPECT_FALSE(tok.encode("hello").empty());
  EXPECT_CONTAINS(error_of([&] { tok.encode_with_template("hello"); }),
                  "field 'post_processor.type': unsupported post_processor 'RobertaProcessing'");
}

}  // namespace
}  // namespace omni::models
