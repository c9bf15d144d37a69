// The prompt encoding of diffusers' QwenImageEditPipeline and QwenImageEditPlusPipeline: the
// prompt goes into the Edit chat template with a placeholder per condition image (Edit-Plus names
// them "Picture 1: ", ...), each placeholder becomes one <|image_pad|> per merged patch, the
// vision tower's embeddings take those tokens' places, the decoder runs with Qwen2.5-VL's 3-D
// image positions (the fix of diffusers PR #14189), and the hidden states less the template's
// first 64 tokens become the transformer's text embeddings
// (tests/fixtures/qwen_image_edit_pipeline_tiny).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "model_runner/diffusion/qwen_image_edit_inputs.h"
#include "model_runner/diffusion/qwen_image_prompt.h"
#include "model_runner/preprocess/image.h"
#include "model_runner/qwen2_5/vision_config.h"
#include "model_runner/qwen2_5/vision_tower.h"

namespace omni::models {

// The Edit pipelines' prompt_template_encode_start_idx.
inline constexpr int64_t kQwenImageEditTemplateDropTokens = 64;

// What the text encoder needs besides its decoder: the tower, the image token ids of its
// config.json and the processor's options (processor/preprocessor_config.json).
struct QwenImageVisionEncoder {
  qwen2_5::VisionTower* tower = nullptr;
  qwen2_5::ImageTokenIds tokens;
  VisionPatchOptions options;
};

// The templated prompt with `image_tokens[i]` <|image_pad|> tokens for image i: the text the
// processor tokenizes. Throws when the prompt holds vision tokens itself.
std::string qwen_image_edit_prompt_text(QwenImageVariant variant, const std::string& prompt,
                                        const std::vector<int64_t>& image_tokens);

// The condition images through the processor and the vision tower: the merged embeddings
// that take the <|image_pad|> tokens' places, for the prompt and the negative prompt alike.
struct QwenImageEditVision {
  at::Tensor embeds;                          // [sum of tokens, hidden], on the device
  std::vector<std::array<int64_t, 3>> grids;  // (t, h, w) patches per image
  std::vector<int64_t> tokens;                // <|image_pad|> tokens per image
};

// `condition` are prepare_qwen_image_edit_images' condition images.
QwenImageEditVision encode_qwen_image_edit_images(const QwenImageVisionEncoder& vision,
                                                  const std::vector<RgbImage>& condition,
                                                  c10::Device device);

// encode_prompt(prompt, image=condition images) for one prompt, the images' embeddings given:
// [1, S, hidden] with its mask (all ones), S the prompt's token count less 64 (the Edit
// pipelines do not cut it to max_sequence_length). `input_ids`, when given, receives the
// processor's ids [1, L].
QwenImagePromptEmbeds encode_qwen_image_edit_prompt(
    const QwenImageTokenizer& tokenizer, qwen2_5::TextDecoder& text_encoder,
    const QwenImageVisionEncoder& vision, QwenImageVariant variant, const std::string& prompt,
    const QwenImageEditVision& images, c10::Device device, at::Tensor* input_ids = nullptr);

}  // namespace omni::models
