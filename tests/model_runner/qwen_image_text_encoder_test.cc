// Qwen-Image's text encoder part against transformers 5.24.0 and diffusers 0.42.1
// (tests/fixtures/qwen_image_text_encoder_tiny, written by
// make_qwen_image_text_encoder_fixture.py): the pipeline's tokenization, the Qwen2.5 decoder's
// last hidden state over a right- and a left-padded batch, encode_prompt's embeddings and mask
// (several prompts, one, max_sequence_length, num_images_per_prompt), bfloat16; then the
// hookable layers, both checkpoint layouts, and the errors for bad config fields, a missing
// weight and a tokenizer folder without tokenizer.json.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cpu_offload/check.h"
#include "cpu_offload/hooks.h"
#include "model_runner/diffusion/qwen_image_prompt.h"
#include "model_runner/qwen2_5/decoder.h"
#include "model_runner/qwen2_5/mrope.h"
#include "model_runner/weights/hf_config.h"
#include "model_runner/weights/safetensors.h"
#include "weights_test_util.h"

namespace omni::models {
namespace {

using testing::error_of;

const std::string kDir = std::string(OMNI_FIXTURES_DIR) + "/qwen_image_text_encoder_tiny";
const std::string kEncoderDir = kDir + "/text_encoder";
const std::string kTokenizerDir = kDir + "/tokenizer";

// The fixture's prompts (make_qwen_image_text_encoder_fixture.py).
const std::string kPrompt = "A red fox sitting by a caf\u00e9, golden hour light.";
const std::string kPrompt2 = "a cat";

std::string long_prompt() {
  std::string text;
  for (int i = 0; i < 700; ++i) text += "red fox ";
  return text;
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// Rows of `hidden` [B, L, H] where `mask` [B, L] is 1, concatenated: [tokens, H].
at::Tensor valid_rows(const at::Tensor& hidden, const at::Tensor& mask) {
  return hidden.reshape({-1, hidden.size(2)})
      .index_select(0, at::nonzero(mask.reshape(-1)).squeeze(1));
}

class QwenImageTextEncoder : public ::testing::Test {
 protected:
  static at::Tensor ref(const std::string& name) {
    static const SafetensorsFile file = SafetensorsFile::open(kDir + "/reference.safetensors");
    return file.tensor(name);
  }
};

TEST_F(QwenImageTextEncoder, TokenizesLikeThePipeline) {
  auto tokenizer = QwenImageTokenizer::load(kTokenizerDir);
  EXPECT_EQ(tokenizer.pad_id, tokenizer.tokenizer.token_id("<|endoftext|>"));
  EXPECT_FALSE(tokenizer.pad_left);

  const auto tokens = tokenize_qwen_image_prompts(tokenizer, {kPrompt, kPrompt2});
  EXPECT_TRUE(at::equal(tokens.input_ids, ref("input_ids")));
  EXPECT_TRUE(at::equal(tokens.attention_mask, ref("attention_mask")));

  // Cut to tokenizer_max_length + 34 = 1058 tokens.
  const auto long_tokens = tokenize_qwen_image_prompts(tokenizer, {long_prompt()});
  ASSERT_EQ(long_tokens.input_ids.size(1), 1058);
  EXPECT_TRUE(at::equal(long_tokens.input_ids, ref("long_input_ids")));

  tokenizer.pad_left = true;
  const auto left = tokenize_qwen_image_prompts(tokenizer, {kPrompt, kPrompt2});
  EXPECT_TRUE(at::equal(left.input_ids, ref("left_input_ids")));
  EXPECT_TRUE(at::equal(left.attention_mask, ref("left_attention_mask")));
}

TEST_F(QwenImageTextEncoder, DecoderMatchesTransformers) {
  c10::InferenceMode guard;
  const auto encoder = qwen2_5::load_text_decoder(kEncoderDir, at::kFloat);
  EXPECT_EQ(encoder->config().hidden_size, 32);
  EXPECT_EQ(encoder->config().head_dim, 8);
  EXPECT_EQ(encoder->config().num_key_value_heads, 2);
  EXPECT_EQ(encoder->config().mrope_section, (std::vector<int64_t>{1, 1, 2}));

  // Right padding: every position, the padded ones too, is what transformers computes.
  const auto ids = ref("input_ids");
  const auto mask = ref("attention_mask");
  const auto out = encoder->forward(ids, mask);
  ASSERT_EQ(out.scalar_type(), at::kFloat);
  ASSERT_EQ(out.sizes(), ref("last_hidden_state").sizes());
  const double diff = max_abs_diff(out, ref("last_hidden_state"));
  std::cout << "qwen2.5 decoder max abs diff vs transformers: " << diff << "\n";
  EXPECT_LE(diff, 1e-4);

  // Alone and unpadded, a prompt gives the same hidden states.
  const int64_t n = mask[1].sum().item<int64_t>();
  const auto alone = encoder->forward(ids[1].narrow(0, 0, n).unsqueeze(0));
  EXPECT_LE(max_abs_diff(alone[0], ref("last_hidden_state")[1].narrow(0, 0, n)), 1e-4);

  // Left padding: transformers 5 still numbers the positions 0 .. L - 1, so the shorter prompt's
  // tokens sit at shifted positions; compared where the tokens are.
  const auto left_mask = ref("left_attention_mask");
  const auto left = encoder->forward(ref("left_input_ids"), left_mask);
  const double left_diff = max_abs_diff(valid_rows(left, left_mask),
                                        valid_rows(ref("left_last_hidden_state"), left_mask));
  std::cout << "qwen2.5 decoder (left padding) max abs diff: " << left_diff << "\n";
  EXPECT_LE(left_diff, 1e-4);
  EXPECT_TRUE(at::isfinite(left).all().item<bool>());
}

// diffusers' encode_prompt(prompts, num_images_per_prompt, max_sequence_length).
QwenImagePromptEmbeds encode_prompt(const QwenImageTokenizer& tokenizer,
                                    qwen2_5::TextDecoder& encoder,
                                    const std::vector<std::string>& prompts,
                                    int64_t num_images_per_prompt = 1,
                                    int64_t max_sequence_length = 1024) {
  return repeat_qwen_image_prompt_embeds(
      encode_qwen_image_prompts(tokenizer, encoder, prompts, max_sequence_length),
      num_images_per_prompt);
}

TEST_F(QwenImageTextEncoder, PromptEmbedsMatchDiffusers) {
  c10::InferenceMode guard;
  const auto tokenizer = QwenImageTokenizer::load(kTokenizerDir);
  const auto encoder = qwen2_5::load_text_decoder(kEncoderDir, at::kFloat);

  const auto both = encode_prompt(tokenizer, *encoder, {kPrompt, kPrompt2});
  ASSERT_EQ(both.embeds.sizes(), ref("prompt_embeds").sizes());
  const double diff = max_abs_diff(both.embeds, ref("prompt_embeds"));
  std::cout << "qwen-image prompt_embeds max abs diff vs diffusers: " << diff << "\n";
  EXPECT_LE(diff, 1e-4);
  ASSERT_TRUE(both.mask.defined());
  EXPECT_EQ(both.mask.scalar_type(), at::kLong);
  EXPECT_TRUE(at::equal(both.mask, ref("prompt_embeds_mask")));

  // One prompt: every position is a token, so no mask (diffusers' None); before the repeat step
  // the mask is there, all ones.
  const auto single = encode_prompt(tokenizer, *encoder, {kPrompt});
  EXPECT_LE(max_abs_diff(single.embeds, ref("single_prompt_embeds")), 1e-4);
  EXPECT_FALSE(single.mask.defined());
  const auto single_raw = encode_qwen_image_prompts(tokenizer, *encoder, {kPrompt});
  ASSERT_TRUE(single_raw.mask.defined());
  EXPECT_TRUE(single_raw.mask.all().item<bool>());

  const auto cut = encode_prompt(tokenizer, *encoder, {kPrompt, kPrompt2}, 1, 10);
  EXPECT_LE(max_abs_diff(cut.embeds, ref("truncated_prompt_embeds")), 1e-4);
  ASSERT_TRUE(cut.mask.defined());
  EXPECT_TRUE(at::equal(cut.mask, ref("truncated_prompt_embeds_mask")));

  // Two images per prompt: the embeddings as diffusers repeats them ([p1, p1, p2, p2]), each
  // mask row with its embeddings; diffusers tiles its mask ([p1, p2, p1, p2]) instead.
  const auto repeated = encode_prompt(tokenizer, *encoder, {kPrompt, kPrompt2}, 2);
  EXPECT_LE(max_abs_diff(repeated.embeds, ref("repeated_prompt_embeds")), 1e-4);
  ASSERT_TRUE(repeated.mask.defined());
  EXPECT_TRUE(at::equal(repeated.mask, ref("prompt_embeds_mask").repeat_interleave(2, 0)));
  EXPECT_TRUE(
      at::equal(ref("repeated_prompt_embeds_mask"), ref("prompt_embeds_mask").repeat({2, 1})));

  auto left_tokenizer = tokenizer;
  left_tokenizer.pad_left = true;
  const auto left = encode_prompt(left_tokenizer, *encoder, {kPrompt, kPrompt2});
  EXPECT_LE(max_abs_diff(left.embeds, ref("left_prompt_embeds")), 1e-4);
}

TEST_F(QwenImageTextEncoder, Bfloat16StaysClose) {
  c10::InferenceMode guard;
  const auto tokenizer = QwenImageTokenizer::load(kTokenizerDir);
  // The checkpoint is bfloat16: the default dtype keeps it.
  const auto encoder = qwen2_5::load_text_decoder(kEncoderDir);
  ASSERT_EQ(encoder->dtype(), at::kBFloat16);
  const auto out = encode_prompt(tokenizer, *encoder, {kPrompt, kPrompt2});
  EXPECT_EQ(out.embeds.scalar_type(), at::kBFloat16);
  const auto expected = ref("prompt_embeds");
  // bf16 keeps ~3 significant digits; a wrong op would be off by the output's own scale.
  const double rel = max_abs_diff(out.embeds, expected) / expected.abs().max().item<double>();
  std::cout << "qwen-image prompt_embeds bf16 max abs diff / max |ref|: " << rel << "\n";
  EXPECT_LE(rel, 0.03);
  EXPECT_TRUE(at::equal(out.mask, ref("prompt_embeds_mask")));
}

class CountingHook : public offload::ModelHook {
 public:
  void pre_forward(torch::nn::Module&, const std::string&, offload::HookArgs&) override { ++calls; }
  int calls = 0;
};

TEST_F(QwenImageTextEncoder, LayersAreHookableUnits) {
  const auto encoder = qwen2_5::load_text_decoder(kEncoderDir, at::kFloat);
  ASSERT_EQ(encoder->num_layers(), 2);
  std::vector<std::shared_ptr<CountingHook>> hooks;
  for (int64_t i = 0; i < encoder->num_layers(); ++i) {
    const std::string path = "layers." + std::to_string(i);
    offload::HookableModule& layer = offload::find_hookable(*encoder, path);
    EXPECT_EQ(&layer, &encoder->layer(i)) << path;
    hooks.push_back(std::make_shared<CountingHook>());
    layer.hooks().attach("forward", "count", hooks.back());
  }
  auto whole = std::make_shared<CountingHook>();
  encoder->hooks().attach("forward", "count", whole);

  c10::InferenceMode guard;
  const auto out = encoder->forward(ref("input_ids"), ref("attention_mask"));
  for (const auto& hook : hooks) EXPECT_EQ(hook->calls, 1);
  EXPECT_EQ(whole->calls, 1);
  EXPECT_LE(max_abs_diff(out, ref("last_hidden_state")), 1e-4);

  const auto params = encoder->named_parameters();
  EXPECT_TRUE(params.contains("embed_tokens.weight"));
  EXPECT_TRUE(params.contains("layers.1.self_attn.q_proj.bias"));
  EXPECT_FALSE(params.contains("layers.1.self_attn.o_proj.bias"));
  EXPECT_TRUE(params.contains("layers.1.mlp.gate_proj.weight"));
  EXPECT_TRUE(params.contains("norm.weight"));
}

TEST_F(QwenImageTextEncoder, TextPositionsAndPlainRope) {
  const auto positions = qwen2_5::text_position_ids(2, 5, at::kCPU);
  ASSERT_EQ(positions.sizes(), (std::vector<int64_t>{3, 2, 5}));
  EXPECT_TRUE(at::equal(positions[2][1], at::arange(5, at::kLong)));
  // With equal positions on the three axes, multimodal rope is plain rope.
  qwen2_5::TextConfig multimodal;
  multimodal.head_dim = 8;
  multimodal.mrope_section = {1, 1, 2};
  qwen2_5::TextConfig plain = multimodal;
  plain.mrope_section.clear();
  const auto [cos_m, sin_m] = qwen2_5::mrope_cos_sin(multimodal, positions, at::kFloat);
  const auto [cos_p, sin_p] = qwen2_5::mrope_cos_sin(plain, positions, at::kFloat);
  EXPECT_TRUE(at::equal(cos_m, cos_p));
  EXPECT_TRUE(at::equal(sin_m, sin_p));
}

class QwenImageTextEncoderFiles : public testing::TempDirTest {
 protected:
  // The fixture's text_encoder/ with `edit` applied to config.json and each tensor name passed
  // through `rename` ("" drops it).
  void copy_encoder(
      const std::function<void(nlohmann::json&)>& edit,
      const std::function<std::string(const std::string&)>& rename = [](const std::string& name) {
        return name;
      }) {
    auto config = nlohmann::json::parse(testing::read_bytes(kEncoderDir + "/config.json"));
    edit(config);
    testing::write_bytes(path("config.json"), config.dump(2));
    const auto weights = SafetensorsFile::open(kEncoderDir + "/model.safetensors");
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const auto& name : weights.names()) {
      const std::string to = rename(name);
      if (!to.empty()) tensors.emplace_back(to, weights.tensor(name));
    }
    write_safetensors(path("model.safetensors"), tensors);
  }
};

TEST_F(QwenImageTextEncoderFiles, LoadsTheLanguageModelLayout) {
  // transformers 4.52+'s in-memory names: model.language_model.*, model.visual.*.
  copy_encoder([](nlohmann::json&) {},
               [](const std::string& name) {
                 if (name.rfind("model.", 0) == 0) return "model.language_model." + name.substr(6);
                 if (name.rfind("visual.", 0) == 0) return "model." + name;
                 return name;
               });
  c10::InferenceMode guard;
  const auto encoder = qwen2_5::load_text_decoder(dir(), at::kFloat);
  const auto ref = SafetensorsFile::open(kDir + "/reference.safetensors");
  const auto out = encoder->forward(ref.tensor("input_ids"), ref.tensor("attention_mask"));
  EXPECT_LE(max_abs_diff(out, ref.tensor("last_hidden_state")), 1e-4);
}

TEST_F(QwenImageTextEncoderFiles, ReadsAFlatLegacyConfig) {
  // The first Qwen2.5-VL releases: text fields at the top, rope in rope_theta + rope_scaling.
  copy_encoder([](nlohmann::json& c) {
    const auto text = c["text_config"];
    c.erase("text_config");
    for (const auto& [key, value] : text.items()) {
      if (key != "rope_parameters") c[key] = value;
    }
    c["rope_theta"] = text["rope_parameters"]["rope_theta"];
    c["rope_scaling"] = {{"type", "mrope"}, {"mrope_section", {1, 1, 2}}};
  });
  const auto config = qwen2_5::TextConfig::parse(HfConfig::load(dir()));
  EXPECT_EQ(config.hidden_size, 32);
  EXPECT_EQ(config.rope_theta, 1000000.0);
  EXPECT_EQ(config.mrope_section, (std::vector<int64_t>{1, 1, 2}));
}

TEST_F(QwenImageTextEncoderFiles, BadConfigFieldsAreNamed) {
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[](nlohmann::json& c) { c["text_config"]["hidden_act"] = "gelu"; },
       "text_config.hidden_act"},
      {[](nlohmann::json& c) { c["text_config"]["rope_parameters"]["rope_type"] = "yarn"; },
       "text_config.rope_parameters.rope_type"},
      {[](nlohmann::json& c) {
         c["text_config"]["rope_parameters"]["mrope_section"] = {1, 1, 1};
       },
       "text_config.rope_parameters.mrope_section"},
      {[](nlohmann::json& c) { c["text_config"]["num_key_value_heads"] = 3; },
       "text_config.num_key_value_heads"},
      {[](nlohmann::json& c) { c["text_config"]["use_sliding_window"] = true; },
       "text_config.use_sliding_window"},
      {[](nlohmann::json& c) { c["text_config"].erase("vocab_size"); }, "text_config.vocab_size"},
  };
  for (const auto& [edit, field] : cases) {
    copy_encoder(edit);
    const std::string error = error_of([&] { qwen2_5::load_text_decoder(dir()); });
    EXPECT_CONTAINS(error, field);
    EXPECT_CONTAINS(error, path("config.json"));
  }
}

TEST_F(QwenImageTextEncoderFiles, MissingWeightIsNamed) {
  const std::string missing = "model.layers.1.self_attn.k_proj.bias";
  copy_encoder([](nlohmann::json&) {},
               [&](const std::string& name) { return name == missing ? "" : name; });
  EXPECT_CONTAINS(error_of([&] { qwen2_5::load_text_decoder(dir()); }), missing);
}

TEST_F(QwenImageTextEncoderFiles, TokenizerWithoutTokenizerJsonIsRefused) {
  // The released Qwen-Image tokenizer/ layout: vocab.json + merges.txt + tokenizer_config.json.
  testing::write_bytes(path("vocab.json"), "{}");
  testing::write_bytes(path("merges.txt"), "#version: 0.2\n");
  testing::write_bytes(path("tokenizer_config.json"),
                       testing::read_bytes(kTokenizerDir + "/tokenizer_config.json"));
  const std::string error = error_of([&] { QwenImageTokenizer::load(dir()); });
  EXPECT_CONTAINS(error, "tokenizer.json");
  EXPECT_CONTAINS(error, "save_pretrained");
}

TEST_F(QwenImageTextEncoder, MatchesDiffusersOnCuda) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  c10::InferenceMode guard;
  const auto tokenizer = QwenImageTokenizer::load(kTokenizerDir);
  const auto encoder = qwen2_5::load_text_decoder(kEncoderDir, at::kFloat);
  encoder->to(at::Device(at::kCUDA));
  const auto out = encode_qwen_image_prompts(tokenizer, *encoder, {kPrompt, kPrompt2}, 1024,
                                             at::Device(at::kCUDA));
  ASSERT_TRUE(out.embeds.is_cuda());
  const double diff = max_abs_diff(out.embeds.cpu(), ref("prompt_embeds"));
  std::cout << "qwen-image prompt_embeds (CUDA) max abs diff: " << diff << "\n";
  // TF32 is off by default in LibTorch; allow for the GPU kernels' summation order.
  EXPECT_LE(diff, 1e-3);
  EXPECT_TRUE(at::equal(out.mask.cpu(), ref("prompt_embeds_mask")));
}

}  // namespace
}  // namespace omni::models
