// Qwen-Image's prompt encoding, as diffusers' QwenImagePipeline.encode_prompt does it: each
// prompt goes into a fixed chat template, the Qwen2.5-VL text encoder (qwen2_5::TextDecoder)
// runs over the padded batch, and the hidden states of each prompt's tokens, less the
// template's first 34 (its system part), become the transformer's text embeddings, zero-padded
// to the longest prompt with a mask (tests/fixtures/qwen_image_text_encoder_tiny).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model_runner/qwen2_5/decoder.h"
#include "model_runner/tokenizer/tokenizer.h"

namespace omni::models {

// QwenImagePipeline's constants: tokenizer_max_length and prompt_template_encode_start_idx.
inline constexpr int64_t kQwenImageTokenizerMaxLength = 1024;
inline constexpr int64_t kQwenImageTemplateDropTokens = 34;

// A pipeline's tokenizer/ folder: tokenizer.json, and from tokenizer_config.json (when there is
// one) the pad token and the padding side (transformers' defaults: Qwen2Tokenizer's
// <|endoftext|>, right). A folder without tokenizer.json (vocab.json + merges.txt only, as the
// released Qwen-Image tokenizer/) is refused with the one-line transformers call that writes it.
struct QwenImageTokenizer {
  Tokenizer tokenizer;
  int32_t pad_id = 0;
  bool pad_left = false;  // padding_side "left"

  static QwenImageTokenizer load(const std::string& dir);
};

// What the text encoder gets: [B, L] int64 each, L the longest templated prompt.
struct QwenImagePromptTokens {
  at::Tensor input_ids;
  at::Tensor attention_mask;  // 1 on tokens, 0 on padding
};

// `tokenizer([template.format(p) for p in prompts], max_length=1024 + 34, padding=True,
// truncation=True)`: the templated prompts cut to 1058 tokens, padded to the longest.
QwenImagePromptTokens tokenize_qwen_image_prompts(const QwenImageTokenizer& tokenizer,
                                                  const std::vector<std::string>& prompts);

struct QwenImagePromptEmbeds {
  at::Tensor embeds;  // [N, S, hidden], the encoder's dtype
  // [N, S] int64, 1 on a prompt's tokens, 0 on the zero padding after them. Undefined only
  // where repeat_qwen_image_prompt_embeds found every position a token (diffusers' None: the
  // transformer then attends to all).
  at::Tensor mask;
};

// _get_qwen_prompt_embeds and encode_prompt's max_sequence_length cut, on `device` (where the
// encoder runs: its weights' device, or where the offload engine brings them): [B, S, hidden]
// and its mask (defined), S the longest prompt's token count after the template's first 34, at
// most max_sequence_length (>= 1). diffusers' encode_prompt(prompts, num_images_per_prompt,
// max_sequence_length) is repeat_qwen_image_prompt_embeds of this.
QwenImagePromptEmbeds encode_qwen_image_prompts(const QwenImageTokenizer& tokenizer,
                                                qwen2_5::TextDecoder& text_encoder,
                                                const std::vector<std::string>& prompts,
                                                int64_t max_sequence_length = 1024,
                                                c10::Device device = c10::kCPU);

// _extract_masked_hidden and what follows it, for a last hidden state [B, L, hidden] and its
// attention_mask [B, L]: each row's tokens (mask 1) less the first `drop`, zero-padded at the end
// to the longest, cut to max_sequence_length (>= 1), with the mask of the kept tokens.
QwenImagePromptEmbeds qwen_image_prompt_rows(const at::Tensor& hidden,
                                             const at::Tensor& attention_mask, int64_t drop,
                                             int64_t max_sequence_length);

// The rest of encode_prompt: num_images_per_prompt (>= 1) copies of each prompt's rows, one
// after the other ([p1, p1, p2, p2]), each mask row with its embeddings; the mask undefined when
// every position is a token. (diffusers 0.42.1 tiles the mask instead, [p1, p2, p1, p2], which
// pairs a prompt's embeddings with another prompt's mask when there are several prompts.)
QwenImagePromptEmbeds repeat_qwen_image_prompt_embeds(QwenImagePromptEmbeds prompt,
                                                      int64_t num_images_per_prompt);

}  // namespace omni::models
