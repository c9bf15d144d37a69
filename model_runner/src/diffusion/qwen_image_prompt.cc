#include "model_runner/diffusion/qwen_image_prompt.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cpu_offload/check.h"
#include "model_runner/weights/hf_config.h"

namespace omni::models {
namespace {

// QwenImagePipeline.prompt_template_encode around its "{}".
constexpr const char* kTemplatePrefix =
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, "
    "quantity, text, spatial relationships of the objects and background:<|im_end|>\n"
    "<|im_start|>user\n";
constexpr const char* kTemplateSuffix = "<|im_end|>\n<|im_start|>assistant\n";

// transformers writes a special token either as its string or as an AddedToken object.
std::string token_field(const HfConfig& config, const std::string& field,
                        const std::string& fallback) {
  if (!config.has(field)) return fallback;
  return config.raw().at(field).is_object() ? config.get_string(field + ".content")
                                            : config.get_string(field);
}

}  // namespace

QwenImageTokenizer QwenImageTokenizer::load(const std::string& dir) {
  const std::filesystem::path folder(dir);
  // The released Qwen-Image tokenizer/ holds only the slow tokenizer's files.
  if (!std::filesystem::exists(folder / "tokenizer.json") &&
      std::filesystem::exists(folder / "vocab.json")) {
    OMNI_THROW(dir, " has vocab.json (and merges.txt) but no tokenizer.json, the file this ",
               "tokenizer reads; write it once with transformers: ",
               "AutoTokenizer.from_pretrained(dir).save_pretrained(dir)");
  }
  QwenImageTokenizer t{Tokenizer::load(dir)};
  const auto config_path = folder / "tokenizer_config.json";
  std::string pad = "<|endoftext|>";
  if (std::filesystem::exists(config_path)) {
    const auto config = HfConfig::load(config_path.string());
    pad = token_field(config, "pad_token", pad);
    const std::string side = config.get_string("padding_side", "right");
    OMNI_CHECK(side == "right" || side == "left", config.source(), ": field 'padding_side' is '",
               side, "', expected 'right' or 'left'");
    t.pad_left = side == "left";
    // encode_padded keeps a text's first tokens, as truncation_side "right" does.
    const std::string cut = config.get_string("truncation_side", "right");
    OMNI_CHECK(cut == "right", config.source(), ": field 'truncation_side' is '", cut,
               "', only 'right' is supported");
  }
  t.pad_id = t.tokenizer.token_id(pad);
  return t;
}

QwenImagePromptTokens tokenize_qwen_image_prompts(const QwenImageTokenizer& tokenizer,
                                                  const std::vector<std::string>& prompts) {
  OMNI_CHECK(!prompts.empty(), "Qwen-Image prompt encoding needs at least one prompt");
  const size_t max_length = kQwenImageTokenizerMaxLength + kQwenImageTemplateDropTokens;
  std::vector<std::vector<int32_t>> rows;
  size_t longest = 0;
  for (const auto& prompt : prompts) {
    // Python's str.format replaces only the template's own "{}": braces in the prompt stay.
    const auto padded = tokenizer.tokenizer.encode_padded(
        kTemplatePrefix + prompt + kTemplateSuffix, max_length, tokenizer.pad_id);
    const auto n = static_cast<size_t>(
        std::count(padded.attention_mask.begin(), padded.attention_mask.end(), 1));
    rows.emplace_back(padded.ids.begin(), padded.ids.begin() + static_cast<std::ptrdiff_t>(n));
    longest = std::max(longest, n);
  }
  const auto batch = static_cast<int64_t>(rows.size());
  const auto length = static_cast<int64_t>(longest);
  QwenImagePromptTokens out;
  out.input_ids = at::full({batch, length}, tokenizer.pad_id, at::kLong);
  out.attention_mask = at::zeros({batch, length}, at::kLong);
  for (int64_t b = 0; b < batch; ++b) {
    const auto& row = rows[static_cast<size_t>(b)];
    const auto n = static_cast<int64_t>(row.size());
    const int64_t start = tokenizer.pad_left ? length - n : 0;
    out.input_ids[b]
        .narrow(0, start, n)
        .copy_(at::tensor(std::vector<int64_t>(row.begin(), row.end()), at::kLong));
    out.attention_mask[b].narrow(0, start, n).fill_(1);
  }
  return out;
}

QwenImagePromptEmbeds encode_qwen_image_prompts(const QwenImageTokenizer& tokenizer,
                                                qwen2_5::TextDecoder& text_encoder,
                                                const std::vector<std::string>& prompts,
                                                int64_t max_sequence_length, c10::Device device) {
  OMNI_CHECK(max_sequence_length >= 1, "max_sequence_length must be >= 1, got ",
             max_sequence_length);
  const auto tokens = tokenize_qwen_image_prompts(tokenizer, prompts);
  const auto hidden =
      text_encoder.forward(tokens.input_ids.to(device), tokens.attention_mask.to(device));
  return qwen_image_prompt_rows(hidden, tokens.attention_mask, kQwenImageTemplateDropTokens,
                                max_sequence_length);
}

QwenImagePromptEmbeds qwen_image_prompt_rows(const at::Tensor& hidden,
                                             const at::Tensor& attention_mask, int64_t drop,
                                             int64_t max_sequence_length) {
  OMNI_CHECK(max_sequence_length >= 1, "max_sequence_length must be >= 1, got ",
             max_sequence_length);
  // Each prompt's token rows (wherever the padding is), less the template's first `drop`,
  // zero-padded at the end to the longest, then cut to max_sequence_length.
  const auto device = hidden.device();
  const int64_t batch = hidden.size(0);
  std::vector<at::Tensor> rows;
  int64_t longest = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const auto positions = at::nonzero(attention_mask[b].cpu()).squeeze(1).to(device);
    const auto valid = hidden[b].index_select(0, positions);
    const int64_t cut = std::min(drop, valid.size(0));
    rows.push_back(valid.narrow(0, cut, valid.size(0) - cut));
    longest = std::max(longest, rows.back().size(0));
  }
  const int64_t length = std::min(longest, max_sequence_length);
  QwenImagePromptEmbeds out;
  out.embeds = at::zeros({batch, length, hidden.size(2)}, hidden.options());
  out.mask = at::zeros({batch, length}, at::TensorOptions(at::kLong).device(device));
  for (int64_t b = 0; b < batch; ++b) {
    const auto& row = rows[static_cast<size_t>(b)];
    const int64_t n = std::min(row.size(0), length);
    out.embeds[b].narrow(0, 0, n).copy_(row.narrow(0, 0, n));
    out.mask[b].narrow(0, 0, n).fill_(1);
  }
  return out;
}

QwenImagePromptEmbeds repeat_qwen_image_prompt_embeds(QwenImagePromptEmbeds prompt,
                                                      int64_t num_images_per_prompt) {
  OMNI_CHECK(num_images_per_prompt >= 1, "num_images_per_prompt must be >= 1, got ",
             num_images_per_prompt);
  OMNI_CHECK(
      prompt.embeds.defined() && prompt.mask.defined(),
      "repeat_qwen_image_prompt_embeds takes encode_qwen_image_prompts' embeddings and mask");
  if (num_images_per_prompt > 1) {
    prompt.embeds = prompt.embeds.repeat_interleave(num_images_per_prompt, 0);
    prompt.mask = prompt.mask.repeat_interleave(num_images_per_prompt, 0);
  }
  if (prompt.mask.all().item<bool>()) prompt.mask = at::Tensor();
  return prompt;
}

}  // namespace omni::models
