#include "model_runner/diffusion/qwen_image_edit_prompt.h"

#include <ATen/ATen.h>

#include "cpu_offload/check.h"
#include "model_runner/qwen2_5/image_inputs.h"
#include "model_runner/qwen2_5/rope_index.h"

namespace omni::models {
namespace {

// Both pipelines' prompt_template_encode around the user turn.
constexpr const char* kSystem =
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, "
    "texture, objects, background), then explain how the user's text instruction should alter "
    "or modify the image. Generate a new image that meets the user's requirements while "
    "maintaining consistency with the original input where appropriate.<|im_end|>\n"
    "<|im_start|>user\n";
constexpr const char* kSuffix = "<|im_end|>\n<|im_start|>assistant\n";

std::string image_placeholder(int64_t tokens) {
  std::string s = "<|vision_start|>";
  for (int64_t i = 0; i < tokens; ++i) s += "<|image_pad|>";
  return s + "<|vision_end|>";
}

}  // namespace

std::string qwen_image_edit_prompt_text(QwenImageVariant variant, const std::string& prompt,
                                        const std::vector<int64_t>& image_tokens) {
  OMNI_CHECK(variant != QwenImageVariant::kTextToImage,
             "qwen_image_edit_prompt_text is for the Edit pipelines");
  OMNI_CHECK(variant == QwenImageVariant::kEditPlus || image_tokens.size() == 1,
             "QwenImageEditPipeline's prompt holds one image, got ", image_tokens.size());
  // The processor expands every <|image_pad|> of the text: one in the prompt would take an
  // image's place.
  for (const char* token : {"<|image_pad|>", "<|vision_start|>", "<|vision_end|>"}) {
    OMNI_CHECK(prompt.find(token) == std::string::npos, "the prompt holds ", token,
               ", which marks the images to edit; leave it out");
  }
  std::string text = kSystem;
  for (size_t i = 0; i < image_tokens.size(); ++i) {
    if (variant == QwenImageVariant::kEditPlus) text += "Picture " + std::to_string(i + 1) + ": ";
    text += image_placeholder(image_tokens[i]);
  }
  return text + prompt + kSuffix;
}

QwenImageEditVision encode_qwen_image_edit_images(const QwenImageVisionEncoder& vision,
                                                  const std::vector<RgbImage>& condition,
                                                  c10::Device device) {
  OMNI_CHECK(vision.tower != nullptr, "an edit prompt needs the text encoder's vision tower");
  QwenImageEditVision out;
  std::vector<at::Tensor> pixels;
  const int64_t merge = vision.options.merge_size;
  for (const auto& image : condition) {
    auto patches = image_to_patches(image, vision.options);
    const auto& g = patches.grid_thw;
    out.tokens.push_back(g[0] * g[1] * g[2] / (merge * merge));
    out.grids.push_back(g);
    pixels.push_back(std::move(patches.pixel_values));
  }
  out.embeds = vision.tower->forward(at::cat(pixels).to(device), out.grids);
  return out;
}

QwenImagePromptEmbeds encode_qwen_image_edit_prompt(
    const QwenImageTokenizer& tokenizer, qwen2_5::TextDecoder& text_encoder,
    const QwenImageVisionEncoder& vision, QwenImageVariant variant, const std::string& prompt,
    const QwenImageEditVision& images, c10::Device device, at::Tensor* input_ids) {
  const auto text = qwen_image_edit_prompt_text(variant, prompt, images.tokens);
  const auto ids32 = tokenizer.tokenizer.encode(text);
  const auto length = static_cast<int64_t>(ids32.size());
  const auto ids =
      at::tensor(std::vector<int64_t>(ids32.begin(), ids32.end()), at::kLong).view({1, length});
  if (input_ids) *input_ids = ids;
  const auto mask = at::ones({1, length}, at::kLong);

  const auto embeds =
      qwen2_5::splice_image_embeds(text_encoder.embed(ids.to(device)), ids.to(device),
                                   images.embeds, vision.tokens.image_token_id);
  const auto positions =
      qwen2_5::rope_index(ids, mask, images.grids, vision.tokens, vision.options.merge_size)
          .position_ids;
  const auto hidden = text_encoder.forward_embeds(embeds, mask.to(device), positions.to(device));
  return qwen_image_prompt_rows(hidden, mask, kQwenImageEditTemplateDropTokens, length);
}

}  // namespace omni::models
